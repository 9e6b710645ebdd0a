"""Profiling (DESIGN.md section 6, step 1): how fast one worker computes, measured on its real model.

Times forward+backward steps at batch b0 and 2*b0 (gradients computed, never applied, so
the model is unchanged) and fits t(b) = a + c*b through the fastest step time of each: on a
shared host other processes only ever add time, so the minimum is the step's own cost. A
simulated speed (`--simulate`) multiplies the measured times by 1/speed, so profiles see
simulated and real slowness alike. Profiling is bounded by time, not by steps (`BUDGET_S`,
at least `MIN_STEPS` of each size): every worker waits for the slowest one's profile, so
twenty steps of a worker four times slower would cost everyone a large part of an epoch.
"""

from __future__ import annotations

import math
import time

from ...datasets import structures
from ...host.hetero import Profile as SimulatedProfile
from .allocation import CostModel, fit_profile

STEPS = 20  # at most, of each size
MIN_STEPS = 3
BUDGET_S = 0.25  # seconds of (simulated) profiling compute, once MIN_STEPS of each size are timed


def steps_within_budget(pair_s: float) -> int:
    """How many steps of each size profiling times when one step of each takes `pair_s` seconds."""
    return max(MIN_STEPS, min(STEPS, math.ceil(BUDGET_S / max(pair_s, 1e-9))))


def profile_compute(model, x, y, b0: int, simulated: SimulatedProfile | None = None, steps: int = STEPS,
                    comm_s: float = 0.0, before_timing=None) -> CostModel:
    """Fit this worker's step-time line from `steps` timed gradient computations at b0 and at 2*b0.

    `before_timing()` is called once the computation is traced, just before the timed steps
    (ASHL waits there for its turn among the workers of its host)."""
    import tensorflow as tf

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=xb, y=yb, y_pred=model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    stretch = 1.0 / simulated.speed if simulated is not None else 1.0
    sizes = (b0, 2 * b0)
    inputs = [tuple(structures.map_leaves(lambda a, b=b: tf.constant(structures.rows(a)[:b]), part) for part in (x, y))
              for b in sizes]
    for xb, yb in inputs:  # the first call of each shape traces: not timed
        _wait(gradients(xb, yb))
    if before_timing is not None:
        before_timing()
    times: list[list[float]] = [[], []]
    while len(times[0]) < steps_within_budget(sum(min(t) for t in times) * stretch if times[0] else 0.0) \
            and len(times[0]) < steps:  # the two sizes alternate, so a burst of load on the host slows both alike
        for i, (xb, yb) in enumerate(inputs):
            started = time.perf_counter()
            _wait(gradients(xb, yb))
            times[i].append(time.perf_counter() - started)
    if stretch > 1:
        time.sleep(sum(map(sum, times)) * (stretch - 1))  # profiling takes as long as on the slower host
    return fit_profile(list(sizes), [min(t) * stretch for t in times], comm_s=comm_s)


def _wait(tensors) -> None:
    for t in tensors:
        t.numpy()  # wait for the result, not just the dispatch
