"""Virtual workers (the planner's accuracy past the cluster): the order of arrivals, the staleness it gives and
the updates applied, against hand-computed values, on a tiny Keras model in this process."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from nbdist.ps.rules import spec_from_keras  # noqa: E402
from nbdist.strategies.virtual_workers import Emulator  # noqa: E402

BATCH = 4


def tiny(lr: float = 0.1):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def data(n: int):
    rng = np.random.default_rng(1)
    return rng.normal(size=(n, 3)).astype("float32"), rng.integers(0, 2, n)


def emulator(model, workers: int, seconds: list[float], **emulate) -> Emulator:
    return Emulator(model, spec_from_keras(model.optimizer), {"workers": workers, "seconds": seconds, **emulate},
                    BATCH, seed=0)


def gradient(model, weights: list[np.ndarray], x, y) -> list[np.ndarray]:
    import tensorflow as tf

    for variable, value in zip(model.trainable_variables, weights):
        variable.assign(value)
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
    return [np.asarray(g) for g in tape.gradient(loss, model.trainable_variables)]


def batches(n: int, per_step: int):
    order = np.random.default_rng(0).permutation(n)  # the emulator's first epoch, seed 0
    return [np.sort(order[i:i + per_step]) for i in range(0, n - per_step + 1, per_step)]


def test_equal_workers_each_compute_on_weights_as_many_updates_old_as_there_are_other_workers():
    model = tiny()
    trainer = emulator(model, 3, [1.0, 1.0, 1.0])
    trainer.epoch(*data(40))  # 10 pushes
    assert trainer.taus == [0, 1, 2, 2, 2, 2, 2, 2, 2, 2]  # the reference models' mean staleness K-1


def test_a_slower_worker_arrives_as_its_speed_says_and_pushes_on_older_weights():
    model = tiny()
    trainer = emulator(model, 2, [1.0, 3.0])  # worker 1 a third as fast
    trainer.epoch(*data(32))  # 8 pushes
    # arrivals: 0@1 0@2 0@3 1@3 (a tie: the lower rank first) 0@4 0@5 0@6 1@6; worker 1 computed on version 0,
    # then on version 4
    assert trainer.taus == [0, 0, 0, 3, 1, 0, 0, 3]


def test_an_asynchronous_push_is_the_rule_applied_to_the_gradient_of_the_weights_its_worker_received():
    model = tiny(lr=0.1)
    w0 = [np.array(v.numpy()) for v in model.trainable_variables]
    x, y = data(8)
    trainer = emulator(model, 2, [1.0, 1.0])
    trainer.epoch(x, y)  # two pushes, both computed on w0
    first, second = batches(8, BATCH)
    g1, g2 = gradient(model, w0, x[first], y[first]), gradient(model, w0, x[second], y[second])
    for got, w, a, b in zip(trainer.weights.values(), w0, g1, g2):
        np.testing.assert_allclose(got, w - 0.1 * a - 0.1 * b, rtol=1e-5, atol=1e-6)


def test_a_synchronous_step_applies_the_mean_of_the_workers_gradients_at_the_scaled_learning_rate():
    model = tiny(lr=0.1)
    w0 = [np.array(v.numpy()) for v in model.trainable_variables]
    x, y = data(8)
    trainer = emulator(model, 2, [1.0, 1.0], synchronous=True, lr_scale=2)
    trainer.epoch(x, y)  # one step of 2 x 4 samples
    (both,) = batches(8, 2 * BATCH)
    g1 = gradient(model, w0, x[both[:BATCH]], y[both[:BATCH]])
    g2 = gradient(model, w0, x[both[BATCH:]], y[both[BATCH:]])
    for got, w, a, b in zip(trainer.weights.values(), w0, g1, g2):
        np.testing.assert_allclose(got, w - 0.1 * 2 * (a + b) / 2, rtol=1e-5, atol=1e-6)
    assert trainer.taus == []


def test_too_many_virtual_workers_for_one_engines_memory_are_refused_with_what_to_do(monkeypatch):
    from nbdist.errors import OptionError
    from nbdist.strategies import virtual_workers

    monkeypatch.setattr(virtual_workers, "MEMORY_BYTES", 100)
    with pytest.raises(OptionError, match="virtual workers' weights need .* plan fewer workers"):
        emulator(tiny(), 8, [1.0] * 8)


def test_a_warm_up_ramps_the_scaled_learning_rate_from_the_users_over_its_epochs_by_hand():
    model = tiny()
    trainer = emulator(model, 4, [1.0] * 4, synchronous=True, lr_scale=4, warmup_epochs=2)
    assert trainer._scale(0.0) == 1.0 and trainer._scale(0.5) == pytest.approx(1 + 3 * 0.25)
    trainer.epochs_done = 1
    assert trainer._scale(0.5) == pytest.approx(1 + 3 * 0.75)
    trainer.epochs_done = 2
    assert trainer._scale(0.0) == 4.0


def test_the_worker_trains_the_cells_epochs_without_its_validation_split_and_reports_the_accuracy_of_each():
    from nbdist.keras_semantics.keras_bridge import FitRequest
    from nbdist.strategies.virtual_workers import VirtualWorkersWorker

    x, y = data(40)
    request = FitRequest(tiny(), {"x": x, "y": y, "batch_size": BATCH, "epochs": 2, "initial_epoch": 0,
                                  "validation_split": 0.25, "validation_data": None}, original_fit=None)
    emulate = {"workers": 2, "seconds": [1.0, 1.0]}
    worker = VirtualWorkersWorker({"rank": 0, "size": 1, "options": {"emulate": emulate}, "seed": 0}, None)
    history = worker.fit(request)
    assert list(history.history) == ["val_accuracy"] and len(history.history["val_accuracy"]) == 2
    assert worker.fit_timings["virtual_workers"]["pushes"] == 2 * (30 // BATCH)  # 30 of the 40 samples train


def test_a_cell_that_fits_a_pipeline_is_told_what_the_emulation_needs():
    import tensorflow as tf

    from nbdist.errors import OptionError
    from nbdist.keras_semantics.keras_bridge import FitRequest
    from nbdist.strategies.virtual_workers import VirtualWorkersWorker

    x, y = data(8)
    request = FitRequest(tiny(), {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(4), "y": None,
                                  "epochs": 1}, original_fit=None)
    worker = VirtualWorkersWorker({"rank": 0, "size": 1, "options": {"emulate": {}}}, None)
    with pytest.raises(OptionError, match="one numpy array of inputs"):
        worker.fit(request)
