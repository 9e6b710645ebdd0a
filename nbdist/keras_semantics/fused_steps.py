"""Several training steps per call of Keras' compiled train function, where no callback needs each step.

Keras' `fit` pays a Python round trip per step (the data iterator, the callbacks' dispatch,
the logs); `steps_per_execution` runs several steps inside one compiled `tf.while_loop`
with the same arithmetic. nbdist turns it on for a fit only when the cell did not choose it
and no callback has a batch-level hook, bar nbdist's own that declare `fused_steps_safe`
(they read what the last step of the call left: its batch index and logs).
"""

from __future__ import annotations

import contextlib

FUSED_STEPS = 16
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def fusable(callbacks) -> bool:
    """No callback needs every step: each batch-level hook is the base class's, or declared safe."""
    import keras

    base = keras.callbacks.Callback

    def default(callback, hook: str) -> bool:  # a hook set on the instance (LambdaCallback) is not
        return getattr(getattr(callback, hook, None), "__func__", None) is getattr(base, hook)

    return all(getattr(c, "fused_steps_safe", False) or all(default(c, hook) for hook in BATCH_HOOKS)
               for c in callbacks)


def steps_per_call(steps_per_epoch: int | None, most: int = FUSED_STEPS) -> int:
    """Steps per call: `most`, or with a `steps_per_epoch` its largest divisor up to `most` (Keras' loop
    checks only for the data's end within a call, so a call would run past the epoch's last step)."""
    if not steps_per_epoch:
        return most
    return max(d for d in range(1, min(most, steps_per_epoch) + 1) if steps_per_epoch % d == 0)


@contextlib.contextmanager
def fused_steps(model, callbacks, steps_per_epoch: int | None = None, validation_steps: int | None = None,
                allowed: bool = True):
    """Within: `model.fit` runs several steps per call where that changes nothing the cell can see
    (and the caller `allowed` it)."""
    steps = steps_per_call(steps_per_epoch)
    if not allowed or model.steps_per_execution != 1 or model.run_eagerly or steps == 1 or validation_steps \
            or not fusable(callbacks):
        yield 1
        return
    _set(model, steps)
    try:
        yield steps
    finally:
        _set(model, 1)


def _set(model, steps: int) -> None:
    model.steps_per_execution = steps
    model.train_function = model.test_function = model.predict_function = None  # compiled for the old count


def steps_done(batch: int, steps_in_epoch: int | None) -> int:
    """Steps of the epoch done when a batch-end hook reports `batch` (with fused steps, the last index of
    the call, which Keras does not clamp to the epoch's length)."""
    done = batch + 1
    return min(done, steps_in_epoch) if steps_in_epoch else done
