"""What a training cell needs from the notebook, read from source (no cluster): free names, what a
definition refers to, where a name was bound, which arrays only `fit` reads, and the plan's order."""

from __future__ import annotations

import types

import numpy as np
import pytest

from nbdist.notebook.bring import plan
from nbdist.notebook.bring.names import bindings, fit_array_names, needed_names, referenced_globals
from nbdist.errors import OptionError


def test_a_cell_needs_what_it_reads_before_binding_it():
    cell = ("x = x / 255\nmodel = build(HIDDEN)\nfor i in range(3):\n    print(i)\n"
            "def helper(a):\n    local = 1\n    return a + local + G\nmodel.fit(x, y, callbacks=[cb])\n")
    assert needed_names(cell) == ["x", "build", "HIDDEN", "G", "y", "cb"]  # not i, local, model, print


def test_a_definition_refers_to_its_decorators_bases_and_the_globals_of_its_body():
    source = ("@register\nclass Scale(keras.layers.Layer):\n    factor = FACTOR\n"
              "    def call(self, x):\n        y = helper(x)\n        return np.sum(y)\n")
    assert sorted(referenced_globals(source)) == ["FACTOR", "helper", "keras", "np", "register"]


def test_bindings_keep_import_lines_and_definition_sources():
    found = bindings("import numpy as np, keras\nfrom keras import layers as L\nx, (y, z) = 1, (2, 3)\n"
                     "@d\ndef f():\n    pass\n")
    assert found["np"] == ("import", "import numpy as np") and found["keras"] == ("import", "import keras")
    assert found["L"] == ("import", "from keras import layers as L")
    assert found["y"] == ("value", None) and found["f"] == ("code", "@d\ndef f():\n    pass\n")


def test_only_arrays_the_cell_reads_as_fit_data_may_travel_as_shards():
    assert fit_array_names("model.fit(x, y, validation_data=(xt, yt))\nprint(xt.shape)") == {"x", "y", "yt"}
    assert fit_array_names("model.fit(x, y, validation_split=0.1)") == set()  # Keras splits the whole
    assert fit_array_names("x = x / 2\nmodel.fit(x, y)") == {"y"}


def test_the_plan_brings_imports_values_then_code_with_what_it_uses_first():
    cells = [(1, "import numpy as np\nimport os"), (2, "SCALE = 2.0\ndata = np.ones(3)"),
             (3, "def inner(v):\n    return v * SCALE\n"), (4, "def outer(v):\n    return inner(np.asarray(v))\n")]
    namespace = {"np": np, "os": types.ModuleType("os"), "SCALE": 2.0, "data": np.ones(3)}
    for _, source in cells[2:]:
        exec(source, namespace)
        namespace[source.split("(")[0][4:]].__module__ = "__main__"
    items = plan("outer(data)", namespace, cells, skip=set())
    assert [(i.name, i.kind, i.cell) for i in items] == [("np", "import", 1), ("SCALE", "value", 2),
                                                         ("data", "value", 2), ("inner", "code", 3),
                                                         ("outer", "code", 4)]
    assert items[0].source == "import numpy as np"
    assert plan("outer(data)", namespace, cells, skip={"data", "outer"}) == []


def test_a_generator_travels_as_the_statement_that_made_it_made_again_every_run():
    cells = [(7, "n = 3\nstream = (i for i in range(n))\nprint(next(iter([1])))")]
    items = plan("next(stream)", {"stream": (i for i in range(3)), "n": 3}, cells, skip=set())
    # what it reads that can be sent goes as a value, first
    assert [(i.name, i.kind, i.cell, i.source, i.fresh) for i in items] == [
        ("n", "value", 7, None, False), ("stream", "code", 7, "stream = (i for i in range(n))\n", True)]


def test_a_tf_data_pipeline_travels_as_its_cells_statements_with_what_they_read_brought_first(tmp_path):
    import tensorflow as tf

    texts, labels = np.array(["a b", "c d"]), np.array([0, 1])
    raw = tf.data.Dataset.from_tensor_slices((texts, labels))
    train = raw.shuffle(2).batch(2)
    cells = [(2, "import tensorflow as tf"), (3, "texts = load()\nlabels = np.array([0, 1])"),
             (4, "raw = tf.data.Dataset.from_tensor_slices((texts, labels))\nprint(raw)"),
             (5, f"train = raw.shuffle(2)\ntrain = train.batch(2)\nopen({str(tmp_path)!r})")]
    namespace = {"tf": tf, "np": np, "texts": texts, "labels": labels, "raw": raw, "train": train}
    items = plan("model.fit(train, epochs=1)", namespace, cells, skip={"model"})
    # the pipeline is made by the statements of two cells (raw cannot be sent either), after what they read
    assert [(i.name, i.kind, i.cell) for i in items] == [
        ("tf", "import", 2), ("texts", "value", 3), ("labels", "value", 3), ("train", "code", 5)]
    assert items[3].source == ("raw = tf.data.Dataset.from_tensor_slices((texts, labels))\n"
                               "train = raw.shuffle(2)\ntrain = train.batch(2)\n") and not items[3].fresh
    assert items[3].paths == []  # the open() of a folder is not part of what makes `train`


def test_a_pipeline_rebound_from_itself_in_later_cells_and_a_layer_adapted_later_are_made_whole():
    import keras
    import tensorflow as tf

    data = np.arange(8, dtype="float32")[:, None]
    norm = keras.layers.Normalization()
    norm.adapt(data)
    ds = tf.data.Dataset.from_tensor_slices(data).batch(2).map(lambda v: norm(v))
    cells = [(1, "norm = keras.layers.Normalization()"), (2, "ds = tf.data.Dataset.from_tensor_slices(data)"),
             (3, "norm.adapt(data)\nds = ds.batch(2)"), (4, "ds = ds.map(lambda v: norm(v))\nds.take(1)")]
    namespace = {"keras": keras, "tf": tf, "data": data, "norm": norm, "ds": ds}
    items = plan("model.fit(ds)", namespace, cells, skip={"model", "keras", "tf"})
    assert [(i.name, i.kind) for i in items] == [("data", "value"), ("norm", "value"), ("ds", "code")]
    assert items[2].source == ("ds = tf.data.Dataset.from_tensor_slices(data)\nds = ds.batch(2)\n"
                               "ds = ds.map(lambda v: norm(v))\nds.take(1)\n")


def test_the_files_a_remade_pipeline_reads_are_named(tmp_path):
    import tensorflow as tf

    (tmp_path / "a.txt").write_text("x\n")
    lines = tf.data.TextLineDataset(str(tmp_path / "a.txt"))
    cells = [(4, f"lines = tf.data.TextLineDataset({str(tmp_path / 'a.txt')!r})")]
    items = plan("model.fit(lines)", {"tf": tf, "lines": lines}, cells, skip={"model", "tf"})
    assert [(i.name, i.paths) for i in items] == [("lines", [str(tmp_path / "a.txt")])]


def test_an_open_file_is_refused_naming_its_cell(tmp_path):
    cells = [(7, f"log = open({str(tmp_path / 'log.txt')!r}, 'w')")]
    with open(tmp_path / "log.txt", "w") as log:
        with pytest.raises(OptionError, match=r"`log`.*open file.*cell \[7\].*%%distribute define"):
            plan("print(log)", {"log": log}, cells, skip=set())
