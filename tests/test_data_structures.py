"""Every structure of data Keras' `fit` takes, under every strategy of the registry, from every source: a matrix
generated from the registry (a strategy added to it is covered without editing this test).

Structures: one array; a list of two arrays (a model of two inputs); a tuple of them; a dict `x` keyed by input
name; a dict `y` of two outputs with a loss dict and `loss_weights`; a nest (a dict holding a list); a
`sample_weight` per output. Sources: numpy arrays (with `validation_data` arrays of the same structure), a
`tf.data` pipeline of that structure, a `PyDataset` of it (each with its validation data in the same form).

Each strategy runs one cell that fits the 21 cases in turn: every History holds each output's loss as a local fit's
does, and every model changed. Where the cell is refused, each source's cases run in a cell of their own, and where
that is refused each case alone: each must train or be refused by name before any engine trains, with a refusal
this test expects and README's refusal table lists. Any other error (raw TensorFlow or Keras from nbdist's own
frames included) fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nbdist.strategies import strategy_names
from tests.support import idle_engines, strategy_line

pytestmark = pytest.mark.cluster

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()

DEFINITION = '''
import keras, numpy as np, tensorflow as tf

SAMPLES = 192
_rng = np.random.default_rng(0)
_a = _rng.normal(size=(SAMPLES, 4)).astype("float32")
_b = _rng.normal(size=(SAMPLES, 3)).astype("float32")
_c = _rng.normal(size=(SAMPLES, 2)).astype("float32")
_label = (_a[:, 0] + _b[:, 0] > 0).astype("int32")
_score = (_a[:, 1] - _c[:, 0]).astype("float32")[:, None]
_weight = np.where(_label > 0, 2.0, 1.0).astype("float32")
TRAIN, VAL = slice(0, 128), slice(128, None)


def _heads(trunk):
    hidden = keras.layers.Dense(8, activation="relu")(trunk)
    return (keras.layers.Dense(2, activation="softmax", name="label")(hidden),
            keras.layers.Dense(1, name="score")(hidden))


def case(structure):
    """A compiled model and its (x, y, sample_weight) for one structure of fit's data."""
    ia, ib, ic = keras.Input((4,), name="a"), keras.Input((3,), name="b"), keras.Input((2,), name="c")
    one = {"loss": "sparse_categorical_crossentropy"}
    two = {"loss": {"label": "sparse_categorical_crossentropy", "score": "mse"},
           "loss_weights": {"label": 1.0, "score": 0.5}}
    w = None
    if structure == "array":
        model, x, y, losses = keras.Model(ia, _heads(ia)[0]), _a, _label, one
    elif structure in ("list", "tuple"):
        pair = [ia, ib] if structure == "list" else (ia, ib)
        model = keras.Model(pair, _heads(keras.layers.Concatenate()([ia, ib]))[0])
        x, y, losses = ([_a, _b] if structure == "list" else (_a, _b)), _label, one
    elif structure == "dict_x":
        model = keras.Model({"a": ia, "b": ib}, _heads(keras.layers.Concatenate()([ia, ib]))[0])
        x, y, losses = {"a": _a, "b": _b}, _label, one
    elif structure in ("dict_y", "weights_per_output"):
        label, score = _heads(ia)
        model = keras.Model(ia, {"label": label, "score": score})
        x, y, losses = _a, {"label": _label, "score": _score}, two
        if structure == "weights_per_output":
            w = {"label": _weight, "score": np.ones(SAMPLES, "float32")}
    else:  # nest
        label, score = _heads(keras.layers.Concatenate()([ia, ib, ic]))
        model = keras.Model({"a": ia, "pair": [ib, ic]}, {"label": label, "score": score})
        x, y, losses = {"a": _a, "pair": [_b, _c]}, {"label": _label, "score": _score}, two
    model.compile(optimizer=keras.optimizers.SGD(0.1), **losses)
    return model, x, y, w


def cut(data, rows):
    return None if data is None else keras.tree.map_structure(lambda v: v[rows], data)


def arrays(x, y, w, rows):
    return tuple(part for part in (cut(x, rows), cut(y, rows), cut(w, rows)) if part is not None)


def dataset(x, y, w, rows):  # to tf.data a list is one tensor: the cell writes tuples, as Keras asks
    return tf.data.Dataset.from_tensor_slices(keras.tree.lists_to_tuples(arrays(x, y, w, rows))).batch(32)


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, w, rows):
        super().__init__()
        self.parts = arrays(x, y, w, rows)

    def __len__(self):
        return -(-keras.tree.flatten(self.parts)[0].shape[0] // 32)

    def __getitem__(self, i):
        return keras.tree.lists_to_tuples(cut(self.parts, slice(32 * i, 32 * (i + 1))))
'''

STRUCTURES = ("array", "list", "tuple", "dict_x", "dict_y", "nest", "weights_per_output")

FITS = {
    "numpy": "model.fit(*arrays(x, y, w, TRAIN)[:2], sample_weight=cut(w, TRAIN), batch_size=32, epochs=1, "
             "validation_data=arrays(x, y, w, VAL))",
    "tf.data": "model.fit(dataset(x, y, w, TRAIN), epochs=1, validation_data=dataset(x, y, None, VAL))",
    "PyDataset": "model.fit(Batches(x, y, w, TRAIN), epochs=1, validation_data=Batches(x, y, None, VAL))",
}

STEP = '''
model, x, y, w = case({structure!r})
starts[{key!r}] = [v.copy() for v in model.get_weights()]
histories[{key!r}] = {fit}.history
changed[{key!r}] = any(bool((a != b).any()) for a, b in zip(starts[{key!r}], model.get_weights()))
'''

TWO_OUTPUTS = ("dict_y", "nest", "weights_per_output")

# what a strategy refuses, by (strategy, source), and the words of README's refusal table that list it
REFUSED = {
    ("ashl", "PyDataset"): "`PyDataset` and generator inputs",
}


def cell(cases) -> str:
    """One cell that fits each (structure, source) of `cases` in turn, each a fresh model."""
    return "starts, histories, changed = {}, {}, {}\n" + "".join(
        STEP.format(structure=structure, key=f"{structure} {source}", fit=FITS[source]) for structure, source in cases)


def expected_keys(structure: str) -> set[str]:
    losses = {"loss", "label_loss", "score_loss"} if structure in TWO_OUTPUTS else {"loss"}
    return losses | {f"val_{k}" for k in losses}


def outcome(kernel, name: str, cases) -> tuple[str, str]:
    """("trains", "") when every case trained, or ("refused", the refusal); fails on any other error."""
    reply = kernel.run(strategy_line(name) + cell(cases), timeout=300)
    if reply.status == "error":
        assert reply.ename == "OptionError" and name in reply.evalue, (
            f"{name} x {cases}: not trained and not refused by name:\n{reply.error_text}")
        assert kernel.value("nbdist.last_run is None or nbdist.last_run.status != 'done'")
        return "refused", reply.evalue
    found = kernel.value("{k: [sorted(h), changed[k]] for k, h in histories.items()}")
    for structure, source in cases:
        keys, moved = found[f"{structure} {source}"]
        assert set(keys) == expected_keys(structure) and moved, (name, structure, source, keys, moved)
    return "trains", ""


def matrix(kernel, name: str) -> dict:
    """{(structure, source): (outcome, refusal)}: every case in one cell; where that is refused, each source's
    cases in one cell; where that is refused, each case alone."""
    everything = [(structure, source) for source in FITS for structure in STRUCTURES]
    kind, why = outcome(kernel, name, everything)
    if kind == "trains":
        return {case: (kind, why) for case in everything}
    rows = {}
    for source in FITS:
        cases = [(structure, source) for structure in STRUCTURES]
        kind, why = outcome(kernel, name, cases)
        rows |= {case: (kind, why) for case in cases} if kind == "trains" else \
            {case: outcome(kernel, name, [case]) for case in cases}
    return rows


@pytest.fixture(scope="module")
def structures_kernel(kernel):
    kernel.run("%%distribute define --name structures\n" + DEFINITION, timeout=120).check()
    return kernel


@pytest.mark.parametrize("name", strategy_names())
def test_every_structure_from_every_source_trains_or_is_refused_by_name(structures_kernel, cluster, name):
    idle_engines(cluster, 2)
    rows = matrix(structures_kernel, name)
    for (structure, source), (kind, why) in rows.items():
        print(f"MATRIX | {name} | {structure} | {source} | {kind} | {why.splitlines()[0] if why else ''}")
        expected = "refused" if (name, source) in REFUSED else "trains"
        assert kind == expected, f"{name}: {structure} from {source} {kind} ({why or 'no refusal'}), not {expected}"
        if kind == "refused":
            assert REFUSED[name, source] in README, f"README's refusal table does not list: {REFUSED[name, source]}"
