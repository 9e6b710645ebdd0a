"""The run's live controls inside a worker's train step (strategies without a parameter server)."""

from __future__ import annotations


def controlled(apply_gradients, control):
    """`apply_gradients` that first acts on the run's controls (a single worker: its own view decides)."""
    import tensorflow as tf

    def apply(grads_and_vars):
        tf.numpy_function(control.act_alone, [], tf.float32, stateful=True, name="nbdist_control")
        return apply_gradients(grads_and_vars)

    return apply


def stop_when_stopped(control):
    """Ends `fit` after the step at which the controls said stop, as Keras' own EarlyStopping does."""
    import keras

    class StopWhenStopped(keras.callbacks.Callback):
        async_safe = True  # reads a flag only
        fused_steps_safe = True  # a stop between calls of fused steps lands a few steps later, on every rank

        def on_train_batch_end(self, batch, logs=None):
            if control.stopped:
                self.model.stop_training = True

    return StopWhenStopped()
