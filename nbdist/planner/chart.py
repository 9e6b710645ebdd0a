"""The plan as a plotly figure: each planned strategy's predicted epoch time, fastest first, with why."""

from __future__ import annotations

from .plan import Plan


def plan_figure(plan: Plan):
    """A horizontal bar per planned strategy (predicted epoch seconds), its reason on hover; refusals left out."""
    import plotly.graph_objects as go

    planned = [p for p in plan.ranked if p.refused is None][::-1]  # plotly draws the first bar at the bottom
    figure = go.Figure(go.Bar(x=[p.epoch_s for p in planned], y=[f"{p.label} ({p.workers})" for p in planned],
                              orientation="h", hovertext=[p.reason for p in planned], hoverinfo="x+text"))
    figure.update_layout(title="Predicted seconds per epoch (fastest on top)", xaxis_title="seconds per epoch",
                         height=120 + 28 * len(planned), margin=dict(l=10, r=10, t=40, b=40))
    return figure
