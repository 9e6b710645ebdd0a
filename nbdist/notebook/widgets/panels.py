"""The dashboard's figures, by name: what each plots and how its axes read (strategies list theirs in `Reports`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    """One figure of the dashboard: a trace per worker of `field` (from the workers' records or the PS's
    push log) against time, or its distribution."""

    name: str
    title: str
    y_title: str
    field: str
    source: str = "records"  # "records": the workers' metric records; "pushes": the PS's push log
    histogram: bool = False

    def x_title(self, clock: str = "real") -> str:
        if self.histogram:
            return self.y_title
        return "virtual s since start" if clock == "virtual" else "s since start"  # short: two share a row


PANELS = {p.name: p for p in (
    Panel("loss", "training loss", "loss", "loss"),
    Panel("throughput", "throughput", "samples/s", "samples_per_s"),
    Panel("staleness", "staleness of each push", "versions", "staleness", source="pushes"),
    Panel("staleness distribution", "staleness distribution", "staleness (versions)", "staleness", source="pushes",
          histogram=True),
    Panel("gamma", "step scale gamma (delay rule)", "gamma", "gamma", source="pushes"),
    Panel("compensation", "delay compensation norm", "norm of c", "comp_norm", source="pushes"),
    Panel("bubble", "pipeline bubble: each stage's idle share of its steps", "idle fraction", "bubble"),
)}
# names a strategy may list that are not figures: ASHL's decisions box
NOT_FIGURES = ("decisions",)


def figures_of(names) -> list[Panel]:
    """The figure panels among a strategy's `Reports.panels`, in its order (unknown names refused)."""
    unknown = [n for n in names if n not in PANELS and n not in NOT_FIGURES]
    if unknown:
        raise ValueError(f"no dashboard panel {unknown}; known: {sorted(PANELS)}")
    return [PANELS[n] for n in names if n in PANELS]
