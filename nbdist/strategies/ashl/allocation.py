"""Allocation: per-worker batch sizes that equalise step time on a heterogeneous cluster.

Worker i takes a_i + c_i*b_i seconds to compute a batch of b_i (a_i fixed overhead, c_i
seconds per sample, fitted by profiling) plus T_comm_i to exchange it. With a global batch
B, every worker should take the same time T:

    a_i + c_i*b_i + T_comm_i = T  for all i,   sum_i b_i = B
    =>  T = (B + sum_i (a_i + T_comm_i)/c_i) / sum_i 1/c_i,   b_i = (T - a_i - T_comm_i)/c_i

Bounds [b_min, b_max] are enforced by water-filling: a worker pushed past a bound is
fixed there and T is solved again for the others. Rounding keeps the sum exactly B.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

DRIFT = 0.15  # re-allocate when a worker's EMA step time leaves its predicted time by more than this
COMM_SHARE = 0.5  # a worker whose exchange would take more than this part of the common step time ...
MAX_PERIOD = 16  # ... pushes every k steps instead (k local gradients summed), k at most this


@dataclass(frozen=True)
class CostModel:
    """One worker's fitted cost model: step seconds = fixed + per_sample * b, plus comm_s per exchange."""

    fixed_s: float
    per_sample_s: float
    comm_s: float = 0.0

    def step_s(self, batch: float) -> float:
        return self.fixed_s + self.per_sample_s * batch + self.comm_s


def fit_profile(batches: list[float], seconds: list[float], comm_s: float = 0.0) -> CostModel:
    """Least-squares line through (batch, step seconds) measurements: fixed overhead and seconds per sample."""
    n = len(batches)
    if n < 2 or len(set(batches)) < 2:
        raise ValueError("profiling needs step times at two or more batch sizes")
    mean_b, mean_t = sum(batches) / n, sum(seconds) / n
    slope = sum((b - mean_b) * (t - mean_t) for b, t in zip(batches, seconds)) / sum((b - mean_b) ** 2
                                                                                      for b in batches)
    slope = max(slope, 1e-12)  # a worker cannot get faster with more samples; noise can say so
    return CostModel(fixed_s=max(0.0, mean_t - slope * mean_b), per_sample_s=slope, comm_s=comm_s)


def allocate(profiles: list[CostModel], global_batch: int, b_min: int = 1, b_max: int | None = None) -> list[int]:
    """Integer batches b_i, within [b_min, b_max], summing to `global_batch`, equalising step time."""
    n = len(profiles)
    # no worker can take more than what leaves every other its b_min (a worker whose profile says a sample
    # costs nothing, timer noise on a tiny model, would otherwise take all of B and leave the others none)
    b_max = min(global_batch if b_max is None else b_max, global_batch - (n - 1) * b_min)
    if not n * b_min <= global_batch <= n * b_max:
        raise ValueError(f"a global batch of {global_batch} cannot be split over {n} workers within "
                         f"[{b_min}, {b_max}] each")
    fixed: dict[int, float] = {}
    while True:
        free = [i for i in range(n) if i not in fixed]
        remaining = global_batch - sum(fixed.values())
        if len(free) == 1:  # the last one takes what is left (within its bounds, by the cap above)
            ideal = {free[0]: float(remaining)}
            break
        inverse = sum(1 / profiles[i].per_sample_s for i in free)
        t = (remaining + sum((profiles[i].fixed_s + profiles[i].comm_s) / profiles[i].per_sample_s
                             for i in free)) / inverse
        ideal = {i: (t - profiles[i].fixed_s - profiles[i].comm_s) / profiles[i].per_sample_s for i in free}
        out = {i: (b_min if b < b_min else b_max) for i, b in ideal.items() if not b_min <= b <= b_max}
        if not out:
            break
        worst = max(out, key=lambda i: max(b_min - ideal[i], ideal[i] - b_max))  # fix the furthest first
        fixed[worst] = out[worst]
    real = [fixed.get(i, ideal.get(i)) for i in range(n)]
    return _round_keeping_sum(real, global_batch)


def allocate_with_periods(profiles: list[CostModel], global_batch: int, b_min: int = 1,
                          b_max: int | None = None) -> tuple[list[int], list[int]]:
    """Batches and push periods: communication allocated as well as computation.

    A worker on a slow link cannot match the others' step time T if its exchange alone
    takes longer; it then pushes every k_i steps (the gradients of k_i batches, computed on
    the same weights, summed into one push of k_i*b_i samples), so it spends
    comm_i/k_i <= COMM_SHARE*T per step and is given the batch its compute allows (a worker
    held at b_min gets the period that fits its exchange into what its compute leaves of T).
    Solved by a few rounds of: allocate with comm_i/k_i, then k_i from the time left.
    """
    periods = [1] * len(profiles)
    for _ in range(5):
        effective = [replace(p, comm_s=p.comm_s / k) for p, k in zip(profiles, periods)]
        batches = allocate(effective, global_batch, b_min, b_max)
        step = statistics.median(p.step_s(b) for p, b in zip(effective, batches))
        # the time this worker's compute leaves for its exchange within the common step (a floored worker: little)
        room = [max(COMM_SHARE * step, step - p.fixed_s - p.per_sample_s * b) if b > b_min else
                max(step - p.fixed_s - p.per_sample_s * b, p.comm_s / MAX_PERIOD) for p, b in zip(profiles, batches)]
        # a worker with no exchange cost (a free link, on the virtual clock) needs no period, whatever its room
        wanted = [1 if p.comm_s <= 0 else min(MAX_PERIOD, max(1, math.ceil(p.comm_s / max(r, 1e-12) - 1e-9)))
                  for p, r in zip(profiles, room)]
        if wanted == periods:
            break
        periods = wanted
    return batches, periods


def allocate_commits(profiles: list[CostModel], global_batch: int, b_min: int = 1,
                     b_max: int | None = None) -> tuple[list[int], list[int], list[int]]:
    """Batches, local steps between commits, and how many common intervals each worker's commits take:
    every worker's commits arrive at one cadence, or at a whole multiple of it.

    Workers that step with their own optimizer and commit the update (`--commits local-steps`) all
    make k local steps between commits, with batches allocated against comm_i / k: then
    k * (a_i + c_i * b_i) + comm_i = k * T for every worker, one commit interval for all (ADSP's
    common commit rate, inside the allocation). k is the smallest (at most MAX_PERIOD) for which
    every exchange takes at most COMM_SHARE of that interval. A link too slow for that even at
    k = MAX_PERIOD commits every m-th interval instead (the smallest m for which its exchange fits
    COMM_SHARE of m intervals); a worker held at b_min, slower than T even so, makes the number of
    steps nearest to its interval, at least one.
    """
    for k in range(1, MAX_PERIOD + 1):
        effective = [replace(p, comm_s=p.comm_s / k) for p in profiles]
        batches = allocate(effective, global_batch, b_min, b_max)
        steps = [p.step_s(b) for p, b in zip(effective, batches)]
        free = [s for s, b in zip(steps, batches) if b > b_min] or steps
        interval = k * statistics.median(free)
        if all(p.comm_s <= COMM_SHARE * interval for p in profiles):
            break
    every = [max(1, math.ceil(p.comm_s / (COMM_SHARE * interval) - 1e-9)) for p in profiles]
    counts = [max(1, round((m * interval - p.comm_s) / (p.fixed_s + p.per_sample_s * b)))
              for p, b, m in zip(profiles, batches, every)]
    return batches, counts, every


def _round_keeping_sum(values: list[float], total: int) -> list[int]:
    """Largest-remainder rounding: floors, then +1 to the largest fractional parts until the sum is `total`."""
    floors = [math.floor(v) for v in values]
    order = sorted(range(len(values)), key=lambda i: values[i] - floors[i], reverse=True)
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return floors


def shard_fractions(batches: list[int]) -> list[float]:
    """Each worker's share of the training data: proportional to its batch, so all finish an epoch together."""
    total = sum(batches)
    return [b / total for b in batches]


def drifted(predicted_s: list[float], observed_ema_s: list[float], tolerance: float = DRIFT) -> list[int]:
    """Workers whose EMA step time left the allocation's prediction by more than `tolerance` (relative)."""
    return [i for i, (p, o) in enumerate(zip(predicted_s, observed_ema_s)) if abs(o - p) > tolerance * p]
