"""The run's live controls around a worker's train step (strategies without a parameter server).

Nothing of nbdist's Python runs inside the step: between calls of Keras' train function (one step, or
several fused ones) `acting_on` reads the control bus and acts (pause, stop). Under a synchronous
strategy the ranks must act at the same step, or a rank that stopped alone would leave the others in
the next allreduce: each rank's view goes into a variable the step reads (`StepControls.seen`), the
step's allreduce carries it with the gradients, and the agreement lands in another variable
(`StepControls.agreed`) that every rank reads after the same call.
"""

from __future__ import annotations

import numpy as np

from .control_bus import PAUSED, STOP


class StepControls:
    """A rank's controls as its synchronous step carries them: `seen` (this rank's view of the bus, set between
    calls) in, `agreed` (every rank's views combined by the step's allreduce: > 0 where any rank saw it) out."""

    def __init__(self, control):
        import tensorflow as tf

        self.control = control
        self.seen = tf.Variable(np.zeros(2, np.float32), trainable=False, name="nbdist_controls_seen")
        self.agreed = tf.Variable(np.zeros(2, np.float32), trainable=False, name="nbdist_controls_agreed")
        self._last: np.ndarray | None = None

    def refresh(self) -> None:
        """This rank's view of the bus into `seen` (assigned only when it changed)."""
        flags = self.control.flags()
        if self._last is None or not np.array_equal(flags, self._last):
            self.seen.assign(flags)
            self._last = flags

    def agreement(self) -> np.ndarray:
        """What the last step's allreduce agreed."""
        return self.agreed.numpy()


def acting_on(control, controls: StepControls | None = None):
    """The Keras callback that acts on the run's controls after each call of the train function: on what the
    ranks agreed in the step (`controls`), or, for a single worker, on its own view of the bus. A pause waits
    there until resumed or stopped; a stop ends `fit` after that step, as Keras' own EarlyStopping does."""
    import keras

    class ActOnControls(keras.callbacks.Callback):
        # not async_safe: a pause must hold the next step back
        fused_steps_safe = True  # every rank reads the agreement of the same step: the last of the call

        def on_train_begin(self, logs=None):
            if controls is not None:
                controls.refresh()

        def on_train_batch_end(self, batch, logs=None):
            flags = controls.agreement() if controls is not None else control.flags()
            if flags[PAUSED] > 0 and flags[STOP] <= 0:
                control.wait_while_paused()
                # alone, a stop sent during the pause ends the fit now; ranks agree on it in the next step
                stop = controls is None and control.state["stop"]
            else:
                stop = flags[STOP] > 0
            if stop:
                control.stopped = self.model.stop_training = True
            elif controls is not None:
                controls.refresh()

    return ActOnControls()


def stop_when_stopped(control):
    """Ends `fit` after the step at which the controls said stop (a strategy that acts on them in its own
    step: the pipeline's stages agree on them there)."""
    import keras

    class StopWhenStopped(keras.callbacks.Callback):
        async_safe = True  # reads a flag only
        fused_steps_safe = True  # a stop between calls of fused steps lands a few steps later, on every rank

        def on_train_batch_end(self, batch, logs=None):
            if control.stopped:
                self.model.stop_training = True

    return StopWhenStopped()
