"""A plan: every strategy's prediction on one cluster, ranked, with the reason for each place."""

from __future__ import annotations

from dataclasses import dataclass, field

from .costs import ClusterCosts
from .predict import Prediction, predict

# Among strategies predicted equally fast, the one that trains as a local fit does comes first.
PREFERENCE = ("hfdt", "ssgd", "ashl", "adsp", "nfdt", "asgd", "ddc-asgd", "dc-asgdk", "dc-asgd-a", "dc-asgd", "local")
TIE = 0.02  # epoch times within 2 % of each other count as equal
EFFICIENT = 0.5  # a strategy scales while N workers are at least half as fast as N times one


@dataclass
class Plan:
    """Predictions for one cluster, fastest first; refused strategies last, with their reasons."""

    costs: ClusterCosts
    predictions: list[Prediction] = field(default_factory=list)

    @property
    def ranked(self) -> list[Prediction]:
        planned = [p for p in self.predictions if p.refused is None]
        best = min((p.epoch_s for p in planned), default=0.0)

        def key(p: Prediction):
            bucket = round((p.epoch_s - best) / (TIE * best)) if best > 0 else 0
            return bucket, _preference(p.strategy), p.epoch_s

        return sorted(planned, key=key) + [p for p in self.predictions if p.refused is not None]

    @property
    def choice(self) -> Prediction:
        return self.ranked[0]

    def table(self) -> str:
        """The ranked table as text (what `%dist plan` prints)."""
        local = next((p.epoch_s for p in self.predictions if p.strategy == "local" and p.epoch_s), None)
        lines = [f"{'':>2} {'strategy':<26} {'workers':>7} {'epoch s':>9} {'vs local':>8}  why"]
        for place, p in enumerate(self.ranked, 1):
            if p.refused:
                lines.append(f"{'-':>2} {p.label:<26} {p.workers:>7} {'-':>9} {'-':>8}  refused: {p.refused}")
                continue
            speedup = f"{local / p.epoch_s:.2f}x" if local else "-"
            lines.append(f"{place:>2} {p.label:<26} {p.workers:>7} {p.epoch_s:>9.3f} {speedup:>8}  {p.reason}")
        return "\n".join([*lines, *(f"note: {note}" for note in self.costs.notes)])

    def choice_line(self) -> str:
        p = self.choice
        runner_up = next((q for q in self.ranked[1:] if q.refused is None), None)
        than = f", {runner_up.epoch_s / p.epoch_s:.2f}x faster than {runner_up.label}" if runner_up else ""
        return f"auto chose {p.label} on {p.workers} engine(s): predicted {p.epoch_s:.2f} s an epoch{than} ({p.reason})"


def make_plan(costs: ClusterCosts, strategies: list[tuple[str, dict]]) -> Plan:
    """Predict every (strategy, options) on `costs`."""
    return Plan(costs, [predict(name, costs, options) for name, options in strategies])


def _preference(name: str) -> int:
    return PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE)


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two orderings of the same items (1: the same order, -1: reversed)."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return 1.0
    sign = [((a[i] > a[j]) - (a[i] < a[j])) * ((b[i] > b[j]) - (b[i] < b[j])) for i, j in pairs]
    return sum(sign) / len(pairs)


def scaling(plan: Plan, counts: list[int], link=None) -> list[dict]:
    """Each planned strategy's epoch seconds at `counts` workers (the plan's cluster grown, `ClusterCosts.grown`),
    where it stops scaling (the first count at which its efficiency against the smallest count, speed-up over
    the ratio of workers, falls under EFFICIENT) and why there."""
    rows = []
    for p in plan.predictions:
        if p.refused is not None or p.strategy == "local":
            continue
        at = [predict(p.strategy, plan.costs.grown(n, link), p.options) for n in counts]
        base = at[0].epoch_s * counts[0]
        stops = next((n for q, n in zip(at, counts) if q.epoch_s is None or base / (q.epoch_s * n) < EFFICIENT), None)
        why = next((q.reason or q.refused for q, n in zip(at, counts) if n == stops), at[-1].reason or at[-1].refused)
        rows.append({"label": p.label, "epoch_s": [q.epoch_s for q in at], "stops": stops, "why": why})
    return rows


def scaling_table(plan: Plan, counts: list[int], link=None) -> str:
    """`scaling` as text: one row per strategy, one column per worker count."""
    header = f"{'strategy':<26} " + " ".join(f"{n:>9}" for n in counts) + "  stops scaling at"
    lines = [header + "  (predicted epoch s at each worker count)"]
    for row in scaling(plan, counts, link):
        cells = " ".join(f"{s:>9.3f}" if s is not None else f"{'-':>9}" for s in row["epoch_s"])
        stop = f"{row['stops']} workers: {row['why']}" if row["stops"] else f"past {counts[-1]}: {row['why']}"
        lines.append(f"{row['label']:<26} {cells}  {stop}")
    return "\n".join([*lines, *(f"note: {note}" for note in plan.costs.notes)])
