"""Keras callbacks every parameter-server worker adds to the cell's own (they talk to the shards)."""

from __future__ import annotations

import numpy as np


def epoch_agreement(client, exchange, share=lambda epoch: 1.0, refresh=None, take_state=None):
    """The workers' epoch-end logs averaged on the PS (shard 0 waits for every live worker; each weighs by
    `share(epoch)`, its part of the epoch's data), so History
    and the cell's callbacks see the same numbers on every worker, as under hfdt, and an EarlyStopping
    or ReduceLROnPlateau decides the same on all of them. With `refresh` (the worker's trainable variables, rank
    0's), the barrier's answer also brings the job's weights at that epoch's end, which replace the worker's own
    before the cell's callbacks see the model: a ModelCheckpoint writes the job's model, and the last epoch's file
    is the model the notebook gets back; `take_state()` then brings the shards' optimizer state too (a Keras 3
    weights file holds the optimizer's variables)."""
    import keras

    class EpochAgreement(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs is None:
                return
            numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float, np.floating))}
            reply = client.request("epoch", only=0, epoch=int(epoch), logs=numbers, share=share(epoch),
                                   weights=refresh is not None, **exchange.clock_fields())[0]
            logs.update(reply.header.get("logs") or {})
            if exchange.virtual is not None and isinstance(reply.header.get("vt"), (int, float)):
                exchange.virtual.now = max(exchange.virtual.now, reply.header["vt"])  # the barrier's release
            if refresh is not None:
                for variable, value in zip(refresh, exchange.at_epoch_end(reply)):
                    variable.assign(value)
            if take_state is not None:
                take_state()

    return EpochAgreement()


def follow_learning_rate(client, optimizer):
    """A learning rate the cell's callbacks set (ReduceLROnPlateau, LearningRateScheduler) reaches the PS,
    which applies the optimizer: checked after the cell's callbacks at each epoch's start and end."""
    import keras

    from ..keras_semantics.learning_rate import schedule_of

    class FollowLearningRate(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.sent = self._current()

        def on_epoch_begin(self, epoch, logs=None):
            self._follow()

        def on_epoch_end(self, epoch, logs=None):
            self._follow()

        def _current(self):
            return None if schedule_of(optimizer) is not None else float(optimizer.learning_rate)

        def _follow(self):
            value = self._current()
            if value is not None and value != self.sent:
                client.request("learning_rate", value=value)
                self.sent = value

    return FollowLearningRate()


def stop_when_asked(exchange, dealt=None):
    """Ends `fit` after the batch in which the PS asked for it, as Keras' own EarlyStopping does (or, for a worker
    the stop reached while it waited for a batch (`dealt`), at the end of that epoch)."""
    import keras

    class StopWhenAsked(keras.callbacks.Callback):
        async_safe = True  # reads a flag only; Keras need not wait for it each step

        def on_train_batch_end(self, batch, logs=None):
            if exchange.stop_asked:
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            if exchange.stop_asked or getattr(dealt, "stopped", False):
                self.model.stop_training = True

    return StopWhenAsked()


def restore_best_weights(callbacks, model) -> None:
    """An EarlyStopping(restore_best_weights=True) that restored its best weights keeps them, although the
    end-of-fit exchange brought the PS's last weights."""
    for callback in callbacks:
        if getattr(callback, "restore_best_weights", False) and getattr(callback, "best_weights", None) is not None \
                and getattr(callback, "stopped_epoch", 0) > 0:
            model.set_weights(callback.best_weights)


def statistics_variables(model, names: list[str]) -> list[tuple[str, object]]:
    """(name, variable) of the model's running statistics: its float non-trainable variables (BatchNormalization's
    moving mean and variance; not a seed generator's integer state); `names`: the shards' names of the model's
    non-trainable variables (`parameter_server.variable_names`)."""
    return [(n, v) for n, v in zip(names, model.non_trainable_variables) if "float" in str(v.dtype)]


def shared_statistics(client, variables: list[tuple[str, object]]):
    """Keeps the model's running statistics on the shards (DESIGN.md section 13): after each step a worker sends
    what its step changed of them and takes the sums of every worker's changes, so the statistics follow every
    worker's batches on the weights the shards hold, and the model that comes back (and each checkpoint) carries
    statistics of those weights, not one worker's own."""
    import keras

    class SharedStatistics(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.last = self.sync({})

        def on_train_batch_end(self, batch, logs=None):
            self.last = self.sync({n: v.numpy() - self.last[n] for n, v in variables})

        def sync(self, deltas: dict) -> dict:
            reply = client.request("statistics", [deltas], only=0, names=[n for n, _ in variables])[0]
            for name, variable in variables:
                variable.assign(reply.arrays[name])
            return {n: np.array(reply.arrays[n]) for n, _ in variables}

    return SharedStatistics()


def silence_marks(silence):
    """A callback that tells the stall watch (`stall_watch.Silence`) each step's end and the work a run expects to
    be long: validation, and an epoch's end (from the end of the epoch's agreement, through the cell's epoch-end
    callbacks, to the next epoch's first step)."""
    import keras

    class SilenceMarks(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if silence.long is not None:
                silence.long_work(None)

        def on_train_batch_end(self, batch, logs=None):
            silence.stepped(f"step {batch + 1} of epoch {self.epoch} ended")

        def on_test_begin(self, logs=None):
            silence.long_work("validating")

        def on_test_end(self, logs=None):
            silence.long_work(None)

        def on_epoch_end(self, epoch, logs=None):
            silence.long_work(f"at the end of epoch {epoch} (the cell's epoch-end callbacks)")

    return SilenceMarks()
