"""A distributed fit leaves the notebook as a local fit would: callbacks, schedules, every fit argument,
every optimizer, and the notebook's own model as the starting point of the next fit."""

from __future__ import annotations

import math

import pytest

from tests.support import idle_engines

pytestmark = pytest.mark.cluster

DATA_PARALLEL = ("hfdt", "nfdt", "ddc-asgd", "ssgd", "adsp", "ashl")
ALL = ("local", *DATA_PARALLEL)
WORKERS = {"local": "", **{s: "--workers 2" for s in DATA_PARALLEL}}

DEFINITIONS = '''
import keras, numpy as np
from nbdist.datasets import fashion_mnist
(sx, sy), _ = fashion_mnist(limit=1024)
sx = sx.astype("float32").reshape(-1, 784) / 255
def mlp():
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])
class Counter(keras.callbacks.Callback):
    """Counts epochs and keeps each epoch's loss."""
    def on_train_begin(self, logs=None):
        self.epochs, self.losses = 0, []
    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1
        self.losses.append(float(logs["loss"]))
class RisingValLoss(keras.callbacks.Callback):
    """Makes val_loss rise by one each epoch, so EarlyStopping(patience=0) stops at epoch 1."""
    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = 1.0 + epoch
class FirstLoss(keras.callbacks.Callback):
    """The loss of the first batch: computed on the weights training started from."""
    def on_train_batch_end(self, batch, logs=None):
        if not hasattr(self, "first"):
            self.first = float(logs["loss"])
class Batches(keras.utils.PyDataset):
    """16 batches of 32; records which batch indices were read, per epoch (Keras reads a batch or two to build
    the model and calls on_epoch_end once before training: the training epochs are the last ones counted)."""
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epoch, self.seen = 0, []
    def __len__(self):
        return 16
    def __getitem__(self, i):
        self.seen.append((self.epoch, int(i)))
        return sx[i * 32:(i + 1) * 32], sy[i * 32:(i + 1) * 32]
    def on_epoch_end(self):
        self.epoch += 1
'''

COMPILE = ('model = mlp()\nmodel.compile(optimizer={optimizer}, loss="sparse_categorical_crossentropy", '
           'metrics=["accuracy"])\n')


@pytest.fixture(scope="module")
def kernel(kernel, cluster):
    idle_engines(cluster, 2)
    kernel.run("%%distribute define --name semantics\n" + DEFINITIONS, timeout=120).check()
    return kernel


def distribute(kernel, strategy: str, cell: str, options: str = "", timeout: float = 240):
    return kernel.run(f"%%distribute --strategy {strategy} {WORKERS[strategy]} {options}\n{cell}", timeout=timeout)


CALLBACK_CELL = COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + '''counter = Counter()
stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=0)
history = model.fit(sx, sy, batch_size=32, epochs=4, validation_data=(sx[:256], sy[:256]),
                    callbacks=[RisingValLoss(), counter, stopper])
'''
CALLBACK_STATE = ("{'counter': vars(counter) | {'_model': None}, 'stopped': stopper.stopped_epoch, 'best': stopper.best, "
                  "'wait': stopper.wait, 'model_set': counter.model is model, 'history': history.history['loss']}")


@pytest.mark.parametrize("strategy", ALL)
def test_callbacks_come_back_with_rank_0_state_and_early_stopping_stops_every_worker(kernel, strategy):
    distribute(kernel, strategy, CALLBACK_CELL, "--seed 3").check()
    state = kernel.value(CALLBACK_STATE)
    epochs = kernel.value("[len(f.history['loss']) for fits in nbdist.last_run.results.values() for f in fits]")
    assert epochs == [2] * len(epochs)  # every worker stopped after epoch 1
    assert state["stopped"] == 1 and state["best"] == 1.0 and state["model_set"]
    assert state["counter"]["epochs"] == 2
    assert state["counter"]["losses"] == pytest.approx(state["history"], abs=1e-6)
    if strategy == "local":  # attribute by attribute, what a plain fit in the notebook leaves
        kernel.run("keras.utils.set_random_seed(3)\n" + CALLBACK_CELL.replace("callbacks=", "verbose=0, callbacks=")
                   ).check()
        plain = kernel.value(CALLBACK_STATE)
        assert set(plain["counter"]) == set(state["counter"])
        assert plain["counter"]["losses"] == pytest.approx(state["counter"]["losses"], abs=1e-6)
        assert (plain["stopped"], plain["best"], plain["wait"]) == (state["stopped"], state["best"], state["wait"])


@pytest.mark.parametrize("workers", [2, 4])
def test_model_checkpoint_under_hfdt_is_written_once_and_loads(kernel, cluster, tmp_path, workers):
    idle_engines(cluster, workers)
    path = tmp_path / "best.keras"
    cell = COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + (
        f"history = model.fit(sx, sy, batch_size=32, epochs=2, callbacks=[keras.callbacks.ModelCheckpoint("
        f"{str(path)!r}, monitor='loss', save_best_only=True)])\n")
    reply = kernel.run(f"%%distribute --strategy hfdt --workers {workers}\n{cell}", timeout=240).check()
    assert f"ModelCheckpoint of the cell wrote {path}" in reply.stdout
    loaded = kernel.value(f"(lambda m: [len(m.get_weights()), all(np.array_equal(a, b) for a, b in "
                          f"zip(m.get_weights(), model.get_weights()))])(keras.models.load_model({str(path)!r}))")
    losses = kernel.value("history.history['loss']")
    # save_best_only on the training loss: the file holds the last epoch's weights exactly when it was the best
    assert loaded == [4, losses[1] < losses[0]], (loaded, losses)


def test_a_ps_strategy_leaves_a_checkpoint_the_notebook_loads(kernel, tmp_path):
    path = tmp_path / "last.keras"
    cell = COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + (
        f"history = model.fit(sx, sy, batch_size=32, epochs=1, callbacks=[keras.callbacks.ModelCheckpoint("
        f"{str(path)!r})])\n")
    distribute(kernel, "nfdt", cell).check()
    assert kernel.value(f"len(keras.models.load_model({str(path)!r}).get_weights())") == 4


SCHEDULE = "keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5))"


def test_hfdt_scales_a_schedule_by_default_and_returns_the_users_own(kernel):
    cell = COMPILE.format(optimizer=SCHEDULE) + "history = model.fit(sx, sy, batch_size=32, epochs=1)\n"
    distribute(kernel, "hfdt", cell, "--warmup-epochs 0.5").check()
    schedule = kernel.value("(lambda s: [type(s).__name__, s.get_config()])(model.optimizer._learning_rate)")
    assert schedule[0] == "ExponentialDecay"
    assert schedule[1]["initial_learning_rate"] == pytest.approx(0.1) and schedule[1]["decay_steps"] == 4
    assert kernel.value("model.optimizer.iterations.numpy().item()") == 16  # 1024 / (2 x 32)


def test_the_ps_follows_a_schedule_step_by_step(kernel):
    cell = COMPILE.format(optimizer=SCHEDULE) + "history = model.fit(sx, sy, batch_size=64, epochs=1)\n"
    kernel.run("%%distribute --strategy nfdt --workers 1\n" + cell, timeout=180).check()
    lrs = kernel.value("[dict(zip(s['log_fields'], e))['lr'] for s in nbdist.last_run.ps[:1] for e in s['log']]")
    assert lrs == pytest.approx([0.1 * 0.5 ** (i / 4) for i in range(16)], rel=1e-6)


@pytest.mark.parametrize("optimizer", ["keras.optimizers.RMSprop(0.01)", "keras.optimizers.AdamW(0.01)",
                                       "keras.optimizers.Adagrad(0.1)"])
def test_every_keras_optimizer_on_the_ps_equals_a_local_fit(kernel, optimizer):
    cell = COMPILE.format(optimizer=optimizer) + "history = model.fit(sx, sy, batch_size=64, epochs=1, shuffle=False)\n"
    kernel.run("%%distribute --strategy local --seed 9\n" + cell, timeout=180).check()
    kernel.run("ref, ref_opt = model.get_weights(), [v.numpy() for v in model.optimizer.variables]").check()
    kernel.run("%%distribute --strategy nfdt --workers 1 --overlap off --seed 9\n" + cell, timeout=180).check()
    diffs = kernel.value("[max(float(abs(a - b).max()) for a, b in zip(ref, model.get_weights())), "
                         "max(float(abs(a - b).max()) for a, b in zip(ref_opt, [v.numpy() for v in "
                         "model.optimizer.variables]))]")
    assert diffs[0] <= 1e-6 and diffs[1] <= 1e-6, diffs


@pytest.mark.parametrize("strategy", DATA_PARALLEL)
def test_a_py_dataset_is_shared_by_batch_index(kernel, cluster, strategy):
    cell = COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + "ds = Batches()\nhistory = model.fit(ds, epochs=2)\n"
    reply = distribute(kernel, strategy, cell)
    if strategy == "ashl":
        assert reply.ename == "OptionError" and "needs numpy arrays" in reply.evalue and "PyDataset" in reply.evalue
        return
    reply.check()
    _, client = cluster
    seen = []
    for eid in kernel.value("nbdist.last_run.workers"):
        client[eid].execute("_seen = list(ds.seen)", block=True)
        seen += [tuple(s) for s in client[eid].pull("_seen", block=True)]
    last = max(e for e, _ in seen)
    for epoch in (last - 1, last):
        batches = sorted(i for e, i in seen if e == epoch)
        assert batches == list(range(16)), (epoch, batches)  # every batch once per epoch, across the workers


ZERO_WEIGHTS = "sample_weight=np.zeros(len(sx))"
ZERO_CLASSES = "class_weight={c: 0.0 for c in range(10)}"


@pytest.mark.parametrize("strategy", ALL)
def test_zero_sample_and_class_weights_leave_the_model_untrained(kernel, strategy):
    for weights in (ZERO_WEIGHTS, ZERO_CLASSES):
        cell = (COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + "start = model.get_weights()\n"
                f"history = model.fit(sx, sy, batch_size=32, epochs=1, {weights})\n")
        distribute(kernel, strategy, cell, "--seed 2").check()
        assert kernel.value("max(float(abs(a - b).max()) for a, b in zip(start, model.get_weights()))") == 0.0


def test_class_weight_on_the_ps_equals_it_in_a_local_fit(kernel):
    cell = (COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + "history = model.fit(sx, sy, batch_size=32, "
            "epochs=1, shuffle=False, class_weight={c: 1.0 + c for c in range(10)})\n")
    kernel.run("%%distribute --strategy local --seed 4\n" + cell, timeout=180).check()
    kernel.run("ref = model.get_weights()").check()
    kernel.run("%%distribute --strategy nfdt --workers 1 --overlap off --seed 4\n" + cell, timeout=180).check()
    assert kernel.value("max(float(abs(a - b).max()) for a, b in zip(ref, model.get_weights()))") <= 1e-6


CONTINUE = ("first = FirstLoss()\n"
            "history = model.fit(sx, sy, batch_size=32, epochs=1, shuffle=False, callbacks=[first])\n")
FIRST_BATCH = {"local": "sx[:32], sy[:32]", "hfdt": "sx[:32], sy[:32]"}  # rank 0's: its slice of step 0 (unshuffled)


@pytest.mark.parametrize("strategy", ALL)
def test_a_continuation_starts_from_the_notebook_model(kernel, strategy):
    first = COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + "history = model.fit(sx, sy, batch_size=32, epochs=1)\n"
    distribute(kernel, strategy, first, "--seed 1").check()
    # the last layer zeroed in the notebook: every prediction uniform, the first batch's loss ln(10)
    kernel.run("model.layers[-1].set_weights([np.zeros_like(w) for w in model.layers[-1].get_weights()])").check()
    distribute(kernel, strategy, CONTINUE).check()
    assert kernel.value("first.first") == pytest.approx(math.log(10), abs=1e-5)
    # the notebook's weights and optimizer state went to each worker, nothing more
    sent = kernel.value("(lambda r: [r.sent, __import__('nbdist.model_parts.model_sync', fromlist=['_']).ModelState.of(model)"
                        ".nbytes, r.workers])(nbdist.last_run)")
    assert sent[0] == {"model_bytes": sent[1] * len(sent[2]), "models": {"model": sent[2]}}, sent


@pytest.mark.parametrize("strategy, workers", [("local", 1), ("hfdt", 2)])
def test_an_unchanged_continuation_sends_no_weights(kernel, cluster, strategy, workers):
    targets = ",".join(map(str, idle_engines(cluster, workers)))  # the same engines for both cells
    first = COMPILE.format(optimizer="keras.optimizers.SGD(0.05, momentum=0.9)") + \
        "history = model.fit(sx, sy, batch_size=32, epochs=1)\n"
    kernel.run(f"%%distribute --strategy {strategy} --targets {targets}\n{first}", timeout=240).check()
    kernel.run(f"x0 = float(model.evaluate({FIRST_BATCH[strategy]}, verbose=0)[0])").check()
    kernel.run(f"%%distribute --strategy {strategy} --targets {targets}\n{CONTINUE}", timeout=240).check()
    assert kernel.value("nbdist.last_run.sent") == {"model_bytes": 0, "models": {}}
    assert kernel.value("first.first") == pytest.approx(kernel.value("x0"), abs=1e-5)


@pytest.mark.parametrize("strategy, workers", [("local", 1), ("hfdt", 2)])
def test_a_model_rebuilt_in_the_notebook_trains_with_a_fresh_optimizer_on_the_engines(kernel, cluster, strategy,
                                                                                     workers):
    """A notebook that builds and compiles its model again (an example re-run, say) under the same name: the engines
    that trained the last one must not carry its optimizer's steps and Adam slots into the new one (a KerasHub BERT
    classifier stayed at chance so: its Adam moments were the last model's)."""
    targets = ",".join(map(str, idle_engines(cluster, workers)))  # the same engines for both runs
    fit = "history = model.fit(sx, sy, batch_size=32, epochs=1, steps_per_epoch=5)\n"
    for _ in range(2):
        kernel.run(COMPILE.format(optimizer="keras.optimizers.Adam(1e-3)")).check()  # in the notebook
        kernel.run(f"%%distribute --strategy {strategy} --targets {targets}\n{fit}", timeout=240).check()
        assert kernel.value("int(model.optimizer.iterations.numpy())") == 5


def test_frozen_then_unfrozen_layers_and_load_weights_reach_the_engines(kernel, tmp_path):
    first = COMPILE.format(optimizer="keras.optimizers.SGD(0.05)") + "history = model.fit(sx, sy, batch_size=32, epochs=1)\n"
    distribute(kernel, "nfdt", first).check()
    kernel.run("model.layers[0].trainable = False\nmodel.compile(optimizer=keras.optimizers.Adam(0.01), "
               "loss='sparse_categorical_crossentropy')\nfrozen = [w.copy() for w in model.layers[0].get_weights()]").check()
    distribute(kernel, "nfdt", "history = model.fit(sx, sy, batch_size=32, epochs=1)\n").check()
    assert kernel.value("all(np.array_equal(a, b) for a, b in zip(frozen, model.layers[0].get_weights()))")
    assert kernel.value("type(model.optimizer).__name__") == "Adam"
    kernel.run("model.layers[0].trainable = True\nmodel.compile(optimizer=keras.optimizers.SGD(0.05), "
               "loss='sparse_categorical_crossentropy')").check()
    distribute(kernel, "hfdt", "history = model.fit(sx, sy, batch_size=32, epochs=1)\n").check()
    assert not kernel.value("all(np.array_equal(a, b) for a, b in zip(frozen, model.layers[0].get_weights()))")
    saved = tmp_path / "saved.weights.h5"
    kernel.run(f"model.save_weights({str(saved)!r})\nx0 = float(model.evaluate(sx[:32], sy[:32], verbose=0)[0])").check()
    distribute(kernel, "hfdt", "history = model.fit(sx, sy, batch_size=32, epochs=1)\n").check()
    kernel.run(f"model.load_weights({str(saved)!r})").check()
    distribute(kernel, "local", CONTINUE).check()
    assert kernel.value("first.first") == pytest.approx(kernel.value("x0"), abs=1e-5)


def test_mixed_precision_trains_under_hfdt_and_on_the_ps(kernel):
    """A policy the training cell sets: a LossScaleOptimizer on every engine; the notebook's comes back with its
    inner optimizer stepped (under the PS: the shards' state, every applied push)."""
    cell = ('keras.mixed_precision.set_global_policy("mixed_float16")\ntry:\n    '
            + COMPILE.format(optimizer="keras.optimizers.SGD(0.05)").replace("\n", "\n    ")
            + 'history = model.fit(sx, sy, batch_size=32, epochs=1)\n'
            'finally:\n    keras.mixed_precision.set_global_policy("float32")\n')
    inner_steps = "[type(model.optimizer).__name__, int(model.optimizer.inner_optimizer.iterations.numpy())]"
    distribute(kernel, "hfdt", cell).check()
    kind, steps = kernel.value(inner_steps)
    assert kind == "LossScaleOptimizer" and steps > 0
    distribute(kernel, "nfdt", cell).check()
    kind, steps = kernel.value(inner_steps)
    assert kind == "LossScaleOptimizer" and steps == kernel.value("nbdist.last_run.ps[0]['counts']['applied']") > 0


SEEDED_SETUP = '''
import random
import tensorflow as tf
keras.utils.set_random_seed(3)
ds = tf.data.Dataset.from_tensor_slices((sx[:256], sy[:256])).shuffle(256, seed=5).batch(64)
model = mlp()
optimizer = keras.optimizers.SGD(0.05)
'''
SEEDED_LOOP = '''seen = []
for xb, yb in ds:
    with tf.GradientTape() as tape:
        loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(yb, model(xb)))
    optimizer.apply(tape.gradient(loss, model.trainable_weights), model.trainable_weights)
    seen.append(int(np.sum(yb)))
'''
DRAWS = "[random.random(), float(np.random.rand()), float(keras.random.uniform(())), float(mlp().weights[0][0, 0])]"


def test_local_leaves_the_notebooks_random_state_and_the_loops_batches_as_a_plain_run(kernel):
    """A seeded loop over a shuffled pipeline under `local`: it sees the batches a plain run sees (nbdist does not
    read the pipeline ahead, which moved the shuffle on by an epoch), and the notebook's next draws (Python, NumPy,
    Keras' seed generator, a new layer's initial weights) are a plain run's: the notebook takes rank 0's random
    state after the cell."""
    kernel.run(SEEDED_SETUP).check()
    kernel.run("keras.utils.set_random_seed(7)\n" + SEEDED_LOOP, timeout=120).check()  # (--seed 7's reseed)
    plain = kernel.value(f"[seen, {DRAWS}]")
    kernel.run(SEEDED_SETUP).check()
    distribute(kernel, "local", SEEDED_LOOP, "--seed 7").check()
    assert kernel.value(f"[seen, {DRAWS}]") == plain
