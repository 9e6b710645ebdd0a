"""Reading a training cell's text (`training_code`), sharing out a loop's data (`loop_data`) and the cell as the
notebook replays it after a loop (`loop_state.replay_source`): in this process, no cluster."""

from __future__ import annotations

import ast
import textwrap

import numpy as np
import pytest

from nbdist.errors import OptionError
from nbdist.engine.loop_data import LoopData, refuse_unshareable
from nbdist.engine.loop_state import INSTALL, Snapshot, install, replay_source
from nbdist.keras_semantics.training_code import bound_names, shard_data_loops, training_of

GUIDE = textwrap.dedent('''
    epochs = 2
    for epoch in range(epochs):
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = train_step(x_batch_train, y_batch_train)
        for x_batch_val, y_batch_val in val_dataset:
            test_step(x_batch_val, y_batch_val)
    print("done")
''')
STEPS = textwrap.dedent('''
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss_value = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        return loss_value

    def test_step(x, y):
        val_acc_metric.update_state(y, model(x, training=False))
''')


def _notebook(source: str) -> dict:
    """A namespace whose functions have their source (as the notebook's cells have theirs)."""
    import linecache

    filename = f"<test cell {abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def test_a_loop_steps_through_the_functions_it_calls_and_only_its_training_loop_is_data():
    training = training_of(GUIDE, _notebook(STEPS))
    assert training.loop and not training.fit
    assert training.data_loops == ("train_dataset",)  # not the epochs' range, not the validation loop
    assert training.loops_at == ((4, 4),)


def test_a_step_written_in_the_cell_itself_is_seen_before_the_cell_has_run():
    assert training_of(STEPS + GUIDE, {}).loop


def test_fit_and_neither():
    assert training_of("history = model.fit(x, y, epochs=2)", {}).fit
    nothing = training_of("for x, y in val_dataset:\n    metric.update_state(y, model(x))\n", {})
    assert not nothing.fit and not nothing.steps


def test_a_custom_train_step_reached_through_fit_is_not_a_loop_of_the_cells_own():
    gan = _notebook(textwrap.dedent('''
        class GAN:
            def __init__(self, d):
                self.d = d
            def train_step(self, data):
                grads = tape.gradient(loss, self.d.trainable_weights)
                self.d_optimizer.apply_gradients(zip(grads, self.d.trainable_weights))
    '''))
    training = training_of("gan = GAN(d)\ngan.fit(dataset, epochs=1)\n", gan)
    assert training.fit and not training.steps


def test_data_names_are_wrapped_where_the_loop_reads_them():
    cell = "for i in range(0, len(x), 32):\n    xb = x[i:i + 32]\n    optimizer.apply(tape.gradient(l, v), v)\n"
    tree = shard_data_loops(ast.parse(cell), training_of(cell, {}).loops_at)
    text = ast.unparse(tree)
    assert "len(__nbdist_loop_data__(x, 'x'))" in text and "__nbdist_loop_data__(x, 'x')[i:i + 32]" in text
    assert "__nbdist_loop_data__(range" not in text  # the functions a loop calls are not data


def test_the_names_a_statement_binds_are_those_of_the_module_not_its_functions():
    statement = ast.parse("for epoch in range(2):\n    def f(a):\n        b = a\n    loss = f(epoch)\n").body[0]
    assert sorted(bound_names(statement)) == ["epoch", "f", "loss"]


@pytest.mark.parametrize("size", [2, 3])
def test_every_worker_iterates_a_shard_of_the_same_length(size):
    arrays = np.arange(1000)
    shards = [LoopData(rank, size, synchronous=True)(arrays, "x") for rank in range(size)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == 1000 // size
    assert len(set(np.concatenate(shards))) == size * (1000 // size)  # disjoint
    batches = list(range(7))  # a list of batches: 3 each of 2 workers (the seventh left out)
    assert [len(LoopData(r, 2, True)(batches, "batches")) for r in range(2)] == [3, 3]


def test_a_pipeline_is_cut_to_the_same_number_of_batches_on_every_rank():
    import tensorflow as tf

    dataset = tf.data.Dataset.range(100).batch(8)  # 13 batches
    shards = [LoopData(rank, 2, synchronous=True)(dataset, "ds") for rank in range(2)]
    assert [len(list(s)) for s in shards] == [6, 6]
    unknown = tf.data.Dataset.range(100).filter(lambda v: v % 2 == 0).batch(8)
    with pytest.raises(OptionError, match="unknown length"):
        LoopData(0, 2, synchronous=True)(unknown, "ds")
    assert len(list(LoopData(0, 2, synchronous=False)(unknown, "ds"))) >= 1  # asynchronous: no need


def test_a_generator_is_refused_naming_it():
    stream = (i for i in range(3))
    with pytest.raises(OptionError, match="iterates `stream`, a Python generator"):
        refuse_unshareable(["stream"], {"stream": stream})
    with pytest.raises(OptionError, match="iterates `stream`"):
        LoopData(0, 2, synchronous=False)(stream, "stream")


def test_the_replayed_cell_installs_the_statements_that_stepped_and_keeps_line_numbers():
    python = "a = 1\nfor i in range(3):\n    b = i\n    c = 2\nprint(a)\nd = 4\n"
    replayed = replay_source(python, {1: Snapshot()}, ran=3)
    assert replayed.splitlines() == ["a = 1", f"{INSTALL}(1)", "", "", "print(a)", ""]
    shared = replay_source("a = 1; b = 2\nfor i in x:\n    pass\n", {2: Snapshot()}, ran=3)
    assert f"{INSTALL}(2)" in shared and "a = 1" in shared


def test_what_rank_0_left_is_installed_into_the_notebooks_own_objects():
    import cloudpickle
    import keras

    from nbdist.keras_semantics.state_walk import capture

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    optimizer.iterations.assign(7)
    losses = [1.0]
    snapshot = Snapshot(values={"step": cloudpickle.dumps(41)}, containers={"losses": cloudpickle.dumps([1.0, 0.5])},
                        state=capture({"model": model, "optimizer": optimizer}))
    here_model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    here = {"model": here_model, "optimizer": keras.optimizers.Adam(), "losses": losses}
    assert install(snapshot, here) == []
    assert here["step"] == 41 and here["losses"] is losses and losses == [1.0, 0.5]
    assert all(np.array_equal(a, b) for a, b in zip(here_model.get_weights(), model.get_weights()))
    assert here["optimizer"].built and int(here["optimizer"].iterations.numpy()) == 7
