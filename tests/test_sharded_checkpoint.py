"""A checkpoint written by the owners of a model's parts, read back whole by Keras' own `load_weights`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nbdist.errors import OptionError
from nbdist.model_parts.sharded_checkpoint import Ownership, index_path, write_part


def trained_model():
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="a"),
                              keras.layers.BatchNormalization(name="norm"), keras.layers.Dense(4, name="b"),
                              keras.layers.Dense(3, name="c")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(np.random.default_rng(0).random((32, 6)), np.ones((32, 3)), epochs=2, verbose=0)
    return model


def owner_optimizer(model, layers):
    """An optimizer of one owner (as a pipeline stage has): the whole one's counters and its layers' slots."""
    import keras

    own = [v for layer in layers for v in layer.trainable_weights]
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(own)
    whole = {v.path.split("/", 1)[1]: v for v in model.optimizer.variables}
    for variable in optimizer.variables:
        variable.assign(whole[variable.path.split("/", 1)[1]])
    return optimizer


def test_each_owner_writes_its_part_and_keras_reads_the_whole_model_back(tmp_path):
    import keras

    model = trained_model()
    parts = [model.layers[:2], model.layers[2:]]  # a + norm, b + c
    trainable = [id(v) for v in model.trainable_variables]
    for me in (1, 0):
        own = [trainable.index(id(v)) for layer in parts[me] for v in layer.trainable_weights]
        ownership = Ownership.of_parts(parts, me, keeper=1, optimizer=owner_optimizer(model, parts[me]),
                                       own_trainable_index=own)
        index = write_part(model, tmp_path / "best.weights.h5", ownership)
    assert index == tmp_path / "best.weights.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.weights.json", "best_00000.weights.h5",
                                                        "best_00001.weights.h5"]
    weight_map = json.loads(index.read_text())["weight_map"]  # Keras' paths: by class, in order
    assert weight_map["/layers/dense/vars"] == ["best_00000.weights.h5"]
    assert weight_map["/layers/dense_2/vars"] == ["best_00001.weights.h5"]
    assert weight_map["/optimizer/vars"] == ["best_00000.weights.h5", "best_00001.weights.h5"]

    fresh = keras.models.clone_model(model)
    fresh.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(index)
    assert all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))
    assert len(fresh.optimizer.variables) == len(model.optimizer.variables)
    for a, b in zip(fresh.optimizer.variables, model.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), a.path


def test_a_path_keras_cannot_write_weights_to_is_refused():
    with pytest.raises(OptionError, match="ending in .weights.h5 or .weights.json"):
        index_path("model.keras")
