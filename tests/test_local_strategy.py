"""`--strategy local` through a real kernel and a real cluster: the notebook gets plain-Keras results."""

from __future__ import annotations

import pytest

from tests.conftest import TRAIN
from tests.support import idle_engines

pytestmark = pytest.mark.cluster


def test_local_run_matches_plain_fit_and_model_comes_back(kernel):
    kernel.run("%%distribute --strategy local --seed 7\n" + TRAIN.format(epochs=1), timeout=180).check()
    distributed = kernel.value("{'keys': sorted(history.history), 'history': history.history, "
                               "'eval': model.evaluate(xt, yt, verbose=0, return_dict=True)}")
    kernel.run("w_dist = [w.copy() for w in model.get_weights()]").check()

    # The same cell without the magic, same seed, in the notebook process itself.
    kernel.run("keras.utils.set_random_seed(7)\n" + TRAIN.format(epochs=1).replace("batch_size=64", "batch_size=64, verbose=0"),
               timeout=180).check()
    plain = kernel.value("{'keys': sorted(history.history), 'history': history.history}")
    max_diff = kernel.value("max(float(np.abs(a - b).max()) for a, b in zip(w_dist, model.get_weights()))")

    assert distributed["keys"] == plain["keys"] == ["accuracy", "loss", "val_accuracy", "val_loss"]
    # the same steps on the same batches; the engine's TensorFlow uses its share of the host's cores and the
    # notebook's all of them, so sums split over threads differently round differently (float32: 1e-6 here)
    assert max_diff <= 1e-5
    for key in plain["keys"]:
        assert distributed["history"][key] == pytest.approx(plain["history"][key], abs=1e-5)
    # The next cell's evaluate sees the trained weights: it reproduces the run's own validation numbers.
    assert distributed["eval"]["accuracy"] == pytest.approx(distributed["history"]["val_accuracy"][-1], abs=1e-6)
    assert distributed["eval"]["loss"] == pytest.approx(distributed["history"]["val_loss"][-1], rel=1e-5)


def test_run_is_recorded_with_metrics_and_listed(kernel):
    kernel.run("%%distribute --seed 1\n" + TRAIN.format(epochs=2), timeout=180).check()
    run = kernel.value("(lambda r: {'status': r.status, 'workers': r.workers, "
                       "'epochs': sorted({m['epoch'] for m in r.metrics}), 'fields': sorted(r.metrics[-1]), "
                       "'samples': r.metrics[-1]['samples']})(__import__('nbdist').last_run)")
    assert run["status"] == "done" and len(run["workers"]) == 1
    assert run["epochs"] == [0, 1]
    assert {"run", "worker", "host", "step", "epoch", "t", "loss", "samples_per_s", "staleness"} <= set(run["fields"])
    assert run["samples"] == 2 * 32 * 64  # 2 epochs of ceil(2000/64) = 32 steps of 64
    table = kernel.run("%dist runs").check().stdout
    assert "local" in table and "done" in table


def test_definition_cells_resent_only_when_changed(kernel, cluster):
    _, client = cluster
    target = idle_engines(cluster, 2)[1]
    kernel.run("%%distribute define --name counter\nimport os\nDEF_RUNS = globals().get('DEF_RUNS', 0) + 1").check()
    kernel.run(f"%%distribute --targets {target}\n" + TRAIN.format(epochs=1), timeout=180).check()
    kernel.run(f"%%distribute --targets {target}\n" + TRAIN.format(epochs=1), timeout=180).check()
    assert client[target].pull("DEF_RUNS", block=True) == 1  # unchanged text: not re-sent
    kernel.run("%%distribute define --name counter\nDEF_RUNS = globals().get('DEF_RUNS', 0) + 10").check()
    kernel.run(f"%%distribute --targets {target}\n" + TRAIN.format(epochs=1), timeout=180).check()
    assert client[target].pull("DEF_RUNS", block=True) == 11  # changed text: replayed once, in its slot


def test_subclassed_model_and_tf_data(kernel):
    code = '''%%distribute --seed 3
import tensorflow as tf
class Tiny(keras.Model):
    def __init__(self):
        super().__init__()
        self.flat = keras.layers.Flatten()
        self.out = keras.layers.Dense(10, activation="softmax")
    def call(self, inputs):
        return self.out(self.flat(inputs))
model = Tiny()
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(100)
history = model.fit(data, epochs=2, steps_per_epoch=10)
'''
    kernel.run(code, timeout=180).check()
    result = kernel.value("{'epochs': history.epoch, 'acc': model.evaluate(xt, yt, verbose=0)[1]}")
    assert result["epochs"] == [0, 1]
    assert result["acc"] > 0.5  # trained weights installed into a model that was never built here
