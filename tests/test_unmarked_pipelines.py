"""A notebook with no marks that builds its input with tf.data and adapts a TextVectorization in plain cells
trains under local, hfdt and nfdt (the engines replay the cells that made the pipeline); files the cell
writes after `fit` are rank 0's, whole, and written once (issue 32). A real kernel on the suite's cluster."""

from __future__ import annotations

import os

import pytest

from tests.kernel_driver import KernelDriver

pytestmark = pytest.mark.cluster

IMPORTS = "import keras\nimport numpy as np\nimport tensorflow as tf"
DATA = '''
rng = np.random.default_rng(0)
words = np.array(["good", "great", "fine", "bad", "awful", "poor", "the", "a", "movie", "plot"])
picked = rng.integers(0, len(words), (512, 6))
texts = np.array([" ".join(words[row]) for row in picked])
labels = (np.isin(picked, [0, 1, 2]).sum(1) > np.isin(picked, [3, 4, 5]).sum(1)).astype("float32")
'''
VECTORIZE = 'vectorize = keras.layers.TextVectorization(max_tokens=16, output_mode="count", pad_to_max_tokens=True)\nvectorize.adapt(texts)'
PIPELINE = '''
train_ds = tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(512, seed=0).batch(32)
train_ds = train_ds.map(lambda text, label: (vectorize(text), label))
'''
MODEL = '''
def make_text_model():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(1, activation="sigmoid")])
'''
TRAIN = '''
model = make_text_model()
model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(train_ds, epochs=4)
'''
LINES = {"local": "--strategy local --seed 3", "hfdt": "--strategy hfdt --workers 2 --seed 3",
         "nfdt": '--strategy nfdt --workers 2 --seed 3 --simulate "clock=virtual; step=1ms"'}


@pytest.fixture(scope="module")
def plain(cluster):
    """A kernel whose notebook has no %%distribute define cell: its pipeline is made in plain cells."""
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run(f"%dist connect --cluster-id {cluster.cluster_id}", timeout=120).check()
        for cell in (IMPORTS, DATA, VECTORIZE, PIPELINE, MODEL):
            driver.run(cell, timeout=120).check()
        yield driver
    finally:
        driver.stop()


@pytest.mark.parametrize("strategy", ["local", "hfdt", "nfdt"])
def test_a_tf_data_pipeline_made_in_plain_cells_trains(plain, strategy):
    reply = plain.run(f"%%distribute {LINES[strategy]}\n" + TRAIN, timeout=300).check()
    brought = plain.value("nbdist.last_run.sent.get('brought') or {}")
    assert "train_ds" in brought["names"] and "vectorize" in brought["names"], brought
    assert "train_ds" in reply.stdout  # "nbdist: brought ..., train_ds to the engines"
    history = plain.value("history.history")
    assert len(history["loss"]) == 4 and history["loss"][-1] < history["loss"][0], history
    # the notebook's own pipeline (never sent) feeds the trained model: it learnt which words count
    accuracy = plain.value("float(model.evaluate(train_ds, verbose=0)[1])")
    assert accuracy > 0.8, (strategy, accuracy)


EXPERIMENT = '''
def make_small_model():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")])

def run_experiment(model, checkpoint_path):
    """As keras-io's Vision Transformer example: fit with the best checkpoint kept, load it, evaluate."""
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    checkpoint = keras.callbacks.ModelCheckpoint(checkpoint_path, monitor="loss", save_best_only=True,
                                                 save_weights_only=True)
    model.fit(features, labels, batch_size=32, epochs=2, steps_per_epoch=3, callbacks=[checkpoint], verbose=0)
    model.load_weights(checkpoint_path)
    return model.evaluate(features[:64], labels[:64], verbose=0)
'''


def test_code_after_fit_in_the_cells_own_function_loads_rank_zeros_best_checkpoint_every_time(plain, tmp_path):
    plain.run("features = vectorize(texts).numpy()\n" + EXPERIMENT, timeout=120).check()
    path = tmp_path / "best.weights.h5"
    # 20 fits in one cell, each followed on every rank by loading the file rank 0's checkpoint just wrote
    plain.run(f"%%distribute --strategy hfdt --workers 2\n"
              f"scores = [run_experiment(make_small_model(), {str(path)!r}) for _ in range(20)]", timeout=600).check()
    assert plain.value("len(scores)") == 20 and plain.value("len(nbdist.last_run.fits)") == 20
    assert path.exists()


def test_a_model_save_after_fit_in_the_cell_is_written_by_rank_zero_only(plain, tmp_path):
    cell = (f"model = make_small_model()\nmodel.compile(optimizer='adam', loss='binary_crossentropy')\n"
            f"model.fit(features, labels, batch_size=32, epochs=1, steps_per_epoch=2, verbose=0)\n"
            f"import os\nmodel.save({str(tmp_path)!r} + f'/saved-{{os.getpid()}}.keras')\n")
    plain.run("%%distribute --strategy hfdt --workers 2\n" + cell, timeout=300).check()
    rank_zero = plain.value("nbdist.get_session().cluster.info(nbdist.last_run.workers[0]).pid")
    # rank 0's engine wrote its file, the cell's run in the notebook its own; rank 1 wrote none
    assert sorted(os.listdir(tmp_path)) == sorted([f"saved-{rank_zero}.keras", f"saved-{plain.pid}.keras"])
    same = plain.value(f"[bool((a == b).all()) for a, b in zip(model.get_weights(), keras.models.load_model("
                       f"{str(tmp_path)!r} + '/saved-{rank_zero}.keras').get_weights())]")
    assert same and all(same)
