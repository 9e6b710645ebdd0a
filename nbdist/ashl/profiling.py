"""Profiling (DESIGN.md section 6, step 1): how fast one worker computes, measured on its real model.

Times forward+backward steps at batch b0 and 2*b0 (gradients computed, never applied, so
the model is unchanged) and fits t(b) = a + c*b through the median step time of each. A
simulated speed (`--simulate`) multiplies the measured times by 1/speed, so profiles see
simulated and real slowness alike.
"""

from __future__ import annotations

import statistics
import time

from ..hetero import Profile as SimulatedProfile
from .allocation import CostModel, fit_profile

STEPS = 20


def profile_compute(model, x, y, b0: int, simulated: SimulatedProfile | None = None, steps: int = STEPS,
                    comm_s: float = 0.0) -> CostModel:
    """Fit this worker's step-time line from `steps` timed gradient computations at b0 and at 2*b0."""
    import tensorflow as tf

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=xb, y=yb, y_pred=model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    stretch = 1.0 / simulated.speed if simulated is not None else 1.0
    batches, seconds = [], []  # one median step time per batch size: a preempted step does not tilt the line
    for b in (b0, 2 * b0):
        xb, yb = tf.constant(x[:b]), tf.constant(y[:b])
        for g in gradients(xb, yb):  # the first call traces: not timed
            g.numpy()
        times = []
        for _ in range(steps):  # back to back: a sleep between steps would slow the next one down too
            started = time.perf_counter()
            for g in gradients(xb, yb):
                g.numpy()  # wait for the result, not just the dispatch
            times.append(time.perf_counter() - started)
        if stretch > 1:
            time.sleep(sum(times) * (stretch - 1))  # profiling takes as long as on the slower host
        batches.append(b)
        seconds.append(statistics.median(times) * stretch)
    return fit_profile(batches, seconds, comm_s=comm_s)
