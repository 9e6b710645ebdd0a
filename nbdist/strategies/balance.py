"""Balanced synchronous batches (`hfdt --balance auto`): each rank a batch in proportion to its speed.

Every rank profiles itself as ASHL does (`nbdist.strategies.ashl.profiling`; on the virtual clock the
run's step cost over its speed, exactly), the profiles are gathered on every rank, and each
rank computes the same allocation (`nbdist.strategies.ashl.allocation.allocate`: equal compute time per
step, the global batch N x the cell's batch kept). A rank's share of the data follows its
batch, so every rank makes the same steps (unequal step counts deadlock an allreduce), and
its gradient is weighted by its batch share in the average, so one synchronous step is the
gradient of the whole global batch, as with equal batches.
"""

from __future__ import annotations

import math

import numpy as np

from ..datasets import structures
from .ashl.allocation import CostModel, allocate
from .ashl.profiling import profile_compute
from ..errors import OptionError
from ..host.hetero import Profile, StepCost

MIN_SHARE = 1 / 8  # no rank gets less than this part of an equal share of the global batch


def own_cost(data: dict, model, batch: int, profile: Profile, step: StepCost | None) -> CostModel:
    """This rank's step-time line: exact on the virtual clock (`step` given), else timed on its data."""
    x, y = data["x"], data.get("y")
    leaves = structures.flatten(x) + structures.flatten(y)
    if y is None or not all(isinstance(a, np.ndarray) for a in leaves):
        raise OptionError("hfdt --balance auto times each rank's steps on numpy arrays and re-shards them by "
                          "speed; pass x and y as arrays, or use --balance none with this input (lists, tuples "
                          "and dicts of arrays are arrays too).")
    if step is not None:
        return CostModel(step.fixed_s / profile.speed, step.per_sample_s / profile.speed)
    return profile_compute(model, x, y, batch, profile if profile.speed != 1 else None)


def balanced_batches(costs: list[CostModel], batch: int) -> list[int]:
    """Every rank's batch: equal compute time per step, summing to len(costs) x `batch`."""
    total = len(costs) * batch
    return allocate(costs, total, b_min=max(1, math.floor(MIN_SHARE * batch)))


def gradient_weight(batches: list[int], rank: int) -> float:
    """What this rank's gradient is multiplied by before the allreduce's average: N b_rank / B, so the
    average is the batch-weighted mean sum_k b_k g_k / B."""
    return len(batches) * batches[rank] / sum(batches)


def steps_per_epoch(shard_samples: int, batch: int) -> int:
    """The steps this rank's share makes (every rank then makes the fewest of all: an allreduce needs
    the same count; shares in proportion to the batches differ from it by one step at most)."""
    if shard_samples < batch:
        raise OptionError(f"this rank's share of {shard_samples} samples is less than its balanced batch of {batch}; "
                          "use a smaller batch_size, more data or fewer workers.")
    return shard_samples // batch


def whole_batches(data: dict, samples: int) -> dict:
    """The training arrays of `data` (x, y, sample_weight; nested structures too) cut to their first
    `samples`, so an epoch is exactly samples / batch steps."""
    return {key: structures.take(data[key], slice(0, samples))
            for key in ("x", "y", "sample_weight") if data.get(key) is not None}
