"""Mixed precision (a `mixed_float16` policy set in a plain cell, a `LossScaleOptimizer`) under the data-parallel
strategies, through a real kernel and a real cluster: the steps whose loss-scaled gradients overflow are skipped by
every rank alike under `hfdt`, and under the parameter server the shards apply only finite, unscaled gradients while
each worker keeps its loss scale as it would locally. (keras-io's acceptance module tests/keras_io/
test_mixed_precision.py holds the whole state of TensorFlow's guide to a plain run.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernel_driver import KernelDriver
from tests.support import idle_engines, scaled

pytestmark = pytest.mark.cluster

SETUP = '''
import numpy as np, tensorflow as tf, keras
from nbdist.datasets import fashion_mnist
keras.mixed_precision.set_global_policy("mixed_float16")
(x, y), _ = fashion_mnist(limit=1024)
x = x.reshape(-1, 784).astype("float32") / 255
y = y.astype("int32")

def get_model():
    inputs = keras.Input(shape=(784,))
    h = keras.layers.Dense(64, activation="relu")(inputs)
    logits = keras.layers.Dense(10)(h)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(logits))
'''
# a loss scale so large that the first steps' float16 gradients overflow: each is skipped and halves it (plain
# Keras, seeds 1-3: 7 skipped steps from 2 ** 24, where 2 ** 40 took 23, more than a worker's 16 pushes of two epochs)
OVERFLOWING = "keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.05), initial_scale=2.0 ** 24)"
LOOP_SETUP = f'''
model = get_model()
optimizer = {OVERFLOWING}
loss_fn = keras.losses.SparseCategoricalCrossentropy()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
        scaled = optimizer.scale_loss(loss)
    optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    return loss
'''
LOOP = '''
losses = []
for xb, yb in dataset:
    losses.append(float(train_step(xb, yb)))
'''
RANK_STATE = '''
import numpy as _np
from nbdist.host.namespace import user_namespace as _ns
_o, _m = _ns()["optimizer"], _ns()["model"]
_nbdist_state = [float(_o.dynamic_scale.numpy()), int(_o.step_counter.numpy()), int(_o.inner_optimizer.iterations.numpy()),
                 float(sum(_np.abs(w).sum() for w in _m.get_weights()))]
'''


@pytest.fixture(scope="module")
def notebook(cluster):
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run(f"%dist connect --cluster-id {cluster.cluster_id}", timeout=scaled(120)).check()
        driver.run(SETUP, timeout=120).check()
        yield driver
    finally:
        driver.stop()


def rank_states(cluster, engines: list[int]) -> list[list]:
    """Each engine's loss scale, step counter, inner step count and a digest of its weights."""
    states = []
    for eid in engines:
        cluster.client[eid].execute(RANK_STATE, block=True)
        states.append(cluster.client[eid].pull("_nbdist_state", block=True))
    return states


def test_hfdt_ranks_skip_the_same_overflowing_steps_of_a_loop(notebook, cluster):
    idle_engines(cluster, 2)
    notebook.run(LOOP_SETUP, timeout=60).check()
    notebook.run("%%distribute --strategy hfdt --workers 2 --seed 1\n" + LOOP, timeout=300).check()
    engines = notebook.value("nbdist.last_run.workers")
    first, second = rank_states(cluster, engines)
    assert first == second, (first, second)  # the same scale, counter, steps made and weights on both ranks
    scale, _, steps, _ = first
    skipped = round(24 - np.log2(scale)) if scale < 2.0 ** 24 else 0
    assert skipped > 0 and steps == 8 - skipped, (scale, steps)  # 8 steps a rank (512 samples, batches of 64)
    ours = notebook.value("[float(optimizer.dynamic_scale.numpy()), int(optimizer.step_counter.numpy()), "
                          "int(optimizer.inner_optimizer.iterations.numpy())]")
    assert ours == first[:3]  # the notebook's optimizer is rank 0's


def test_the_shards_apply_only_finite_unscaled_gradients_and_each_worker_keeps_its_scale(notebook, cluster):
    idle_engines(cluster, 2)
    notebook.run(f"model = get_model()\nmodel.compile(optimizer={OVERFLOWING}, loss='sparse_categorical_crossentropy')"
                 ).check()
    notebook.run("%%distribute --strategy nfdt --workers 2 --seed 1 --simulate 'clock=virtual; step=5ms'\n"
                 "history = model.fit(x, y, batch_size=64, epochs=2, verbose=0)", timeout=300).check()
    counts = notebook.value("nbdist.last_run.ps[0]['counts']")
    steps = 2 * 1024 // 64
    assert counts["rejected"] > 0 and counts["applied"] + counts["rejected"] == steps, counts  # overflows refused
    scale, counter, inner = notebook.value("[float(model.optimizer.dynamic_scale.numpy()), "
                                           "int(model.optimizer.step_counter.numpy()), "
                                           "int(model.optimizer.inner_optimizer.iterations.numpy())]")
    assert inner == counts["applied"], (inner, counts)  # the shards' optimizer stepped once per applied push
    assert 1.0 <= scale < 2.0 ** 24 and counter >= 0  # rank 0's own scale, halved at each of its overflows
    losses = notebook.value("history.history['loss']")
    assert losses[-1] < losses[0], losses
