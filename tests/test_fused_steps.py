"""Fused steps: when Keras may run several steps per call, and how a batch-end hook counts them."""

from __future__ import annotations

import keras
import numpy as np

from nbdist.keras_semantics.fused_steps import fusable, fused_steps, steps_done
from nbdist.engine.reporter import ProgressReporter


class Counter(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


def test_only_callbacks_without_batch_hooks_or_declared_safe_allow_fused_steps():
    assert fusable([]) and fusable([keras.callbacks.EarlyStopping(), keras.callbacks.History()])
    assert fusable([ProgressReporter(1, 0, 32)])
    assert not fusable([Counter()])
    assert not fusable([keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: None)])
    assert not fusable([keras.callbacks.ModelCheckpoint("/tmp/never.keras", save_freq=5)])


def test_a_batch_index_past_the_epoch_counts_only_the_steps_made():
    assert [steps_done(b, 20) for b in (15, 19, 31)] == [16, 20, 20]  # 20 steps in calls of 16: 15, then 31
    assert steps_done(7, None) == 8


def test_fused_steps_train_as_single_steps_and_the_reporter_counts_every_step():
    x = np.random.default_rng(0).normal(size=(200, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")

    def train(fuse: bool):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        reporter = ProgressReporter(1, 0, 32, interval_s=0.0)
        if fuse:
            with fused_steps(model, [reporter]) as steps:
                assert steps == 16
                model.fit(x, y, batch_size=32, epochs=2, shuffle=False, callbacks=[reporter], verbose=0)
            assert model.steps_per_execution == 1  # the cell's own setting is back
        else:
            model.fit(x, y, batch_size=32, epochs=2, shuffle=False, callbacks=[reporter], verbose=0)
        return model.get_weights(), reporter.steps, reporter._samples

    fused, single = train(True), train(False)
    assert max(float(abs(a - b).max()) for a, b in zip(fused[0], single[0])) <= 1e-6
    assert fused[1:] == single[1:] == (14, 14 * 32)  # 7 steps an epoch (200 / 32, the last one short)


def test_a_set_steps_per_epoch_gets_calls_that_divide_it():
    from nbdist.keras_semantics.fused_steps import steps_per_call

    assert [steps_per_call(n) for n in (None, 10, 48, 13, 17, 1)] == [16, 10, 16, 13, 1, 1]
