"""The plan as a plotly figure: each strategy's short-run accuracy against its predicted time, with the target."""

from __future__ import annotations

from .plan import Plan


def plan_figure(plan: Plan):
    """One line per planned strategy whose short run gave a curve (accuracy after each of its epochs, at the
    time the plan predicts it would have trained those samples), the target as a dashed line."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for p in plan.ranked:
        curve = plan.curves.get(p.label) or {}
        if p.refused is not None or not curve.get("accuracy"):
            continue
        times = [plan.seconds_at(p, e * curve["samples"]) for e in range(1, len(curve["accuracy"]) + 1)]
        figure.add_trace(go.Scatter(x=times, y=curve["accuracy"], mode="lines+markers", name=p.label,
                                    hovertext=p.reason))
    if plan.target is not None:
        figure.add_hline(y=plan.target, line_dash="dash", annotation_text=f"target {plan.target:.3f}")
    figure.update_layout(title="Predicted accuracy against predicted time (short runs, virtual clock)",
                         xaxis_title="predicted seconds", yaxis_title="accuracy", height=420,
                         margin=dict(l=10, r=10, t=40, b=40))
    return figure
