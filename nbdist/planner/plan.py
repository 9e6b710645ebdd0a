"""A plan: every strategy's prediction on one cluster, ranked, with the reason for each place."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .costs import ClusterCosts
from .predict import Prediction, predict

# Among strategies predicted equally fast, the one that trains as a local fit does comes first.
PREFERENCE = ("hfdt", "ssgd", "ashl", "adsp", "nfdt", "asgd", "ddc-asgd", "dc-asgdk", "dc-asgd-a", "dc-asgd", "local")
TIE = 0.02  # epoch times within 2 % of each other count as equal
EFFICIENT = 0.5  # a strategy scales while N workers are at least half as fast as N times one


@dataclass
class Plan:
    """Predictions for one cluster, soonest to the target first (fastest epoch without accuracy curves);
    strategies that did not reach it next; refused strategies last, with their reasons."""

    costs: ClusterCosts
    predictions: list[Prediction] = field(default_factory=list)
    curves: dict = field(default_factory=dict)  # label -> a short run's {"accuracy": [...], "samples"} or {"error"}
    target: float | None = None
    target_given: bool = False  # --target-accuracy, not the short local run's best less a point
    cell: str | None = None  # the training cell planned, and its options: what `%dist plan --workers` runs again
    options: dict = field(default_factory=dict)

    def add_curves(self, curves: dict, target: float | None = None, below_best: float = 0.01) -> None:
        """The short runs' accuracy curves; the target by default the best short local accuracy less a point."""
        self.curves, self.target_given = curves, target is not None
        local = next((c for label, c in curves.items() if label == "local" and c.get("accuracy")), None)
        self.target = target if target is not None else (max(local["accuracy"]) - below_best if local else None)

    def time_to_target(self, p: Prediction) -> float | None:
        """Predicted seconds until `p` reaches the target: the samples its short run took (or, past its end,
        would take on its curve's trend, within the cell's own training), at its predicted speed."""
        curve = self.curves.get(p.label) or {}
        return self.time_on(p, curve, curve.get("accuracy") or [])

    def seeds_range(self, p: Prediction) -> list[float | None] | None:
        """With several seeds of short runs: each seed's time to target, soonest first (None: a seed that does
        not reach it, last); None with one seed."""
        runs = (self.curves.get(p.label) or {}).get("runs") or []
        if len(runs) < 2 or self.target is None:
            return None
        times = [self.time_on(p, self.curves[p.label], run) for run in runs]
        return sorted(t for t in times if t is not None) + [None] * times.count(None)

    def time_on(self, p: Prediction, curve: dict, accuracy: list[float]) -> float | None:
        """Predicted seconds until `p`, at its predicted epoch times, reaches the target on `accuracy` (a short
        run's curve, `curve` its record: the samples of each of its epochs)."""
        xs = list(range(1, len(accuracy) + 1))
        reached = crossing(xs, accuracy, self.target)
        if reached is None and xs:
            reached = trend_crossing(xs, accuracy, self.target,
                                     self.costs.samples * max(self.costs.epochs, 1) / curve["samples"])
        if reached is None or p.epoch_s is None:
            return None
        return self.seconds_at(p, reached * curve["samples"])

    def extrapolated(self, p: Prediction) -> bool:
        """Whether `p`'s time to target lies past the end of its short run (on its curve's trend)."""
        curve = self.curves.get(p.label) or {}
        accuracy = curve.get("accuracy") or []
        return self.target is not None and bool(accuracy) and max(accuracy) < self.target \
            and self.time_to_target(p) is not None

    def seconds_at(self, p: Prediction, samples: float) -> float:
        """Predicted seconds until `p` has trained `samples` samples (its epochs' predicted times, in order)."""
        epochs = samples / self.costs.samples
        per = list(p.per_epoch) + [p.per_epoch[-1]] * (int(epochs) + 1)
        return sum(per[:int(epochs)]) + (epochs - int(epochs)) * per[int(epochs)]

    @property
    def ranked(self) -> list[Prediction]:
        planned = [p for p in self.predictions if p.refused is None]
        seconds = {p.label: self.time_to_target(p) if self.target is not None else p.epoch_s for p in planned}
        best = min((s for s in seconds.values() if s is not None), default=0.0)

        def key(p: Prediction):
            mine = seconds[p.label]
            if "error" in self.curves.get(p.label, {}):  # failed on this cell: last of the planned
                return 2, 0, 0, p.epoch_s
            if mine is None:  # not even on its trend: after those that reach it, by epoch time
                return 1, 1, 0, p.epoch_s
            if self.extrapolated(p):  # past its short run, on its trend: after those seen to reach it
                return 1, 0, 0, mine
            bucket = round((mine - best) / (TIE * best)) if best > 0 else 0
            return 0, bucket, _preference(p.strategy), mine

        return sorted(planned, key=key) + [p for p in self.predictions if p.refused is not None]

    @property
    def choice(self) -> Prediction:
        return self.ranked[0]

    def table(self) -> str:
        """The ranked table as text (what `%dist plan` prints)."""
        local = next((p.epoch_s for p in self.predictions if p.strategy == "local" and p.epoch_s), None)
        rows = []
        for place, p in enumerate(self.ranked, 1):
            if p.refused:
                rows.append(("-", p, "-", "-", "-", "-", f"refused: {p.refused}"))
                continue
            reach, accuracy, why = self._accuracy_cells(p)
            rows.append((str(place), p, f"{p.epoch_s:.3f}", f"{local / p.epoch_s:.2f}x" if local else "-", reach,
                         accuracy, why + p.reason))
        target = f"to {self.target:.3f} s" if self.target is not None else "to target"
        width = max([12, len(target), *(len(row[4]) for row in rows)])
        lines = [f"{'':>2} {'strategy':<26} {'workers':>7} {'epoch s':>9} {'vs local':>8} {target:>{width}} "
                 f"{'short acc':>9}  why"]
        lines += [f"{place:>2} {p.label:<26} {p.workers:>7} {epoch:>9} {speedup:>8} {reach:>{width}} {accuracy:>9}  "
                  f"{why}" for place, p, epoch, speedup, reach, accuracy, why in rows]
        notes = list(self.costs.notes)
        if self.curves:
            samples = {c["samples"] for c in self.curves.values() if "samples" in c}
            seeds = max((len(c.get("runs") or [1]) for c in self.curves.values()), default=1)
            notes.append(f"accuracy: short runs on the virtual clock with these speeds, on the first "
                         f"{'/'.join(map(str, sorted(samples)))} of {self.costs.samples} samples, "
                         + (f"{seeds} seeds (their mean; each seed's time to target in brackets)" if seeds > 1
                            else "one seed (--plan-seeds 3: a range)")
                         + ("; the target is the one given" if self.target_given else
                            "; the target is the best short local accuracy less a point")
                         + "; ~: reached past the short run, on its curve's trend")
        return "\n".join([*lines, *(f"note: {note}" for note in notes)])

    def _accuracy_cells(self, p: Prediction) -> tuple[str, str, str]:
        curve = self.curves.get(p.label)
        if not curve:
            return "-", "-", ""
        if "error" in curve:
            return "-", "-", f"its short run failed ({curve['error']}); "
        seconds, accuracy = self.time_to_target(p), max(curve["accuracy"], default=float("nan"))
        spread = self.seeds_range(p)
        between = f" ({'-'.join(f'{t:.3g}' if t is not None else 'never' for t in (spread[0], spread[-1]))})" \
            if spread else ""
        if seconds is None:
            return "not reached" + between, f"{accuracy:.3f}", ""
        return f"{'~' if self.extrapolated(p) else ''}{seconds:.3f}{between}", f"{accuracy:.3f}", ""

    def choice_line(self) -> str:
        p = self.choice
        runner_up = next((q for q in self.ranked[1:] if q.refused is None), None)
        mine = self.time_to_target(p) if self.target is not None else None
        if mine is not None:
            theirs = self.time_to_target(runner_up) if runner_up else None
            than = f", {theirs / mine:.2f}x sooner than {runner_up.label}" if theirs else \
                (f"; {runner_up.label} next, which did not reach it" if runner_up else "")
            return (f"auto chose {p.label} on {p.workers} engine(s): predicted {mine:.2f} s to accuracy "
                    f"{self.target:.3f} ({p.epoch_s:.2f} s an epoch){than} ({p.reason})")
        than = f", {runner_up.epoch_s / p.epoch_s:.2f}x faster than {runner_up.label}" if runner_up else ""
        return f"auto chose {p.label} on {p.workers} engine(s): predicted {p.epoch_s:.2f} s an epoch{than} ({p.reason})"


def crossing(xs: list[float], accuracy: list[float], target: float | None) -> float | None:
    """Where a curve first reaches `target`, linear between its points (at its first point, if it starts there)."""
    if target is None:
        return None
    for i, (x, a) in enumerate(zip(xs, accuracy)):
        if a >= target:
            if i == 0 or accuracy[i - 1] >= a:
                return x
            return xs[i - 1] + (x - xs[i - 1]) * (target - accuracy[i - 1]) / (a - accuracy[i - 1])
    return None


TREND_POINTS = 3  # a short run's last points its trend is fitted through


def trend_crossing(xs: list[float], accuracy: list[float], target: float | None, limit: float) -> float | None:
    """Where a curve that ended under `target` would reach it on its trend (accuracy linear in the log of the
    samples, least squares through its last TREND_POINTS points), if at most `limit`; None if not, or if it
    does not rise."""
    points = list(zip(xs, accuracy))[-TREND_POINTS:]
    if target is None or len(points) < 2:
        return None
    logs = [math.log(x) for x, _ in points]
    mean_x, mean_y = sum(logs) / len(points), sum(a for _, a in points) / len(points)
    spread = sum((u - mean_x) ** 2 for u in logs)
    slope = sum((u - mean_x) * (a - mean_y) for u, (_, a) in zip(logs, points)) / spread
    if slope <= 0:
        return None
    log_at = mean_x + (target - mean_y) / slope  # compared in logs: a flat trend's crossing overflows a float
    return math.exp(log_at) if log_at <= math.log(limit) else None


def make_plan(costs: ClusterCosts, strategies: list[tuple[str, dict]]) -> Plan:
    """Predict every (strategy, options) on `costs`."""
    return Plan(costs, [predict(name, costs, options) for name, options in strategies])


def _preference(name: str) -> int:
    return PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE)


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two orderings of the same items (1: the same order, -1: reversed); a pair tied in both
    (two strategies that never reach the target, in the plan and in the measurement) is agreement, not a penalty."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    signs = [(_sign(a[i] - a[j]), _sign(b[i] - b[j])) for i, j in pairs if a[i] != a[j] or b[i] != b[j]]
    if not signs:
        return 1.0
    untied_a, untied_b = sum(1 for x, _ in signs if x), sum(1 for _, y in signs if y)
    if not untied_a or not untied_b:
        return 0.0
    return sum(x * y for x, y in signs) / (untied_a * untied_b) ** 0.5


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def scaling(plan: Plan, counts: list[int], link=None, curves: dict | None = None) -> list[dict]:
    """Each planned strategy's epoch seconds at `counts` workers (the plan's cluster grown, `ClusterCosts.grown`),
    where it stops scaling (the first count at which its efficiency against the smallest count, speed-up over
    the ratio of workers, falls under EFFICIENT) and why there. With `curves` ({(label, workers): a short run of
    that many virtual workers}, `short_runs.scaled_curves`) also its seconds to the plan's target at each count,
    and a count where the target is not reached, or reached at under EFFICIENT of the smallest count's pace per
    worker, stops the scaling too."""
    rows = []
    for p in plan.predictions:
        if p.refused is not None or p.strategy == "local":
            continue
        at = [predict(p.strategy, plan.costs.grown(n, link), p.options) for n in counts]
        runs = [(curves or {}).get((p.label, n)) or {} for n in counts]
        reach = [_reach(plan, q, run) for q, run in zip(at, runs)] if curves else None
        stops, why = _stop(plan, counts, at, runs, reach)
        rows.append({"label": p.label, "epoch_s": [q.epoch_s for q in at], "to_target": reach, "runs": runs,
                     "stops": stops, "why": why})
    return rows


def _reach(plan: Plan, q: Prediction, run: dict) -> float | None:
    if plan.target is None or q.epoch_s is None or not run.get("accuracy"):
        return None
    return plan.time_on(q, run, run["accuracy"])


def _stop(plan: Plan, counts: list[int], at: list[Prediction], runs: list[dict], reach: list | None):
    """(the count a strategy stops scaling at, or None; why) from its epoch times and, if known, its times to
    target."""
    base = at[0].epoch_s * counts[0] if at[0].epoch_s else None
    first = None  # (count, seconds) of the first count that reaches the target
    for q, n, run, seconds in zip(at, counts, runs, reach or [None] * len(counts)):
        if q.epoch_s is None or base is None or base / (q.epoch_s * n) < EFFICIENT:
            return n, q.reason or q.refused
        if reach is None or not run.get("accuracy"):
            continue
        if seconds is None:
            return n, f"{_accuracy_cause(plan, run, n)}: its short run reaches {max(run['accuracy']):.3f}, under " \
                      f"the target {plan.target:.3f}"
        first = first or (n, seconds)
        if first[1] * first[0] / (seconds * n) < EFFICIENT:
            return n, f"{_accuracy_cause(plan, run, n)}: {seconds:.3g} s to the target, against {first[1]:.3g} s " \
                      f"at {first[0]} workers"
    return None, at[-1].reason or at[-1].refused


def _accuracy_cause(plan: Plan, run: dict, n: int) -> str:
    if run.get("staleness") is not None:
        return f"staleness about {run['staleness']:.0f} updates"
    return f"a step of {n}x{plan.costs.batch} samples"


def scaling_table(plan: Plan, counts: list[int], link=None, curves: dict | None = None) -> str:
    """`scaling` as text: one row per strategy, one column per worker count; with `curves` a second block of
    seconds to the target."""
    rows = scaling(plan, counts, link, curves)
    header = f"{'strategy':<26} " + " ".join(f"{n:>9}" for n in counts)
    lines = [header + "  stops scaling at  (predicted epoch s at each worker count)"]
    for row in rows:
        cells = " ".join(f"{s:>9.3f}" if s is not None else f"{'-':>9}" for s in row["epoch_s"])
        stop = f"{row['stops']} workers: {row['why']}" if row["stops"] else f"past {counts[-1]}: {row['why']}"
        lines.append(f"{row['label']:<26} {cells}  {stop}")
    notes = list(plan.costs.notes)
    if curves and plan.target is not None:
        lines += ["", header + f"  (predicted s to accuracy {plan.target:.3f}; the short run's best accuracy)"]
        for row in rows:
            cells = " ".join(f"{_reach_cell(t, run, plan.target):>9}" for t, run in zip(row["to_target"], row["runs"]))
            ends = " ".join(f"{max(run['accuracy']):.3f}" if run.get("accuracy") else "-" for run in row["runs"])
            failed = next((run["error"] for run in row["runs"] if "error" in run), None)
            lines.append(f"{row['label']:<26} {cells}  {ends}" + (f"  ({failed})" if failed else ""))
        notes.append("accuracy past the cluster: a short run of that many virtual workers on one engine (the PS's "
                     "own rules, in the virtual clock's order of arrival), on the plan's samples; ~: on the curve's "
                     "trend, never: not even there")
    return "\n".join([*lines, *(f"note: {note}" for note in notes)])


def _reach_cell(seconds: float | None, run: dict, target: float) -> str:
    if not run.get("accuracy"):
        return "-"
    if seconds is None:
        return "never"
    return f"{'~' if max(run['accuracy']) < target else ''}{seconds:.3f}"
