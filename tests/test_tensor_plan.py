"""Which layers `tensor` splits and how, without engines (a pure function of the model)."""

from __future__ import annotations

import keras
import pytest

from nbdist.errors import OptionError
from nbdist.tensor_parallel.plan import plan_splits


def mlp(hidden=128, last_activation="relu"):
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu", name="big_1"),
                             keras.layers.Dense(hidden, activation=last_activation, name="big_2"),
                             keras.layers.Dense(10, activation="softmax", name="head")])


def kinds(plan):
    return {entry["name"]: entry["kind"] for entry in plan}


def test_two_large_dense_layers_pair_column_then_row_and_the_small_head_is_replicated():
    plan = plan_splits(mlp(), 2)
    assert kinds(plan) == {"big_1": "column", "big_2": "row", "head": "replicated"}
    big_1, big_2, head = plan
    assert big_1["gathers"] is False  # its slice goes straight to big_2's rows
    assert big_1["bytes"] == (64 * 128 + 128) * 4 and big_1["bytes_per_engine"] == big_1["bytes"] // 2
    assert big_2["bytes_per_engine"] == (128 * 128 // 2 + 128) * 4  # rows split, bias replicated
    assert head["bytes_per_engine"] == head["bytes"] and head["reason"] == "small"


def test_a_split_layer_whose_activation_is_not_elementwise_gathers_and_the_next_starts_a_column_again():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="softmax", name="a"),
                              keras.layers.Dense(128, name="b")])
    plan = plan_splits(model, 2)
    assert kinds(plan) == {"a": "column", "b": "column"} and plan[0]["gathers"] and plan[1]["gathers"]


def test_embedding_split_by_output_dimension_and_units_that_do_not_divide_are_replicated_with_the_reason():
    model = keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(1000, 32, name="emb"),
                              keras.layers.Flatten(), keras.layers.Dense(10, name="out")])
    assert kinds(plan_splits(model, 2)) == {"emb": "embedding", "flatten": "replicated", "out": "replicated"}
    odd = plan_splits(mlp(hidden=127), 2)
    assert odd[0]["kind"] == "replicated" and "127" in odd[0]["reason"] and "not a multiple of 2" in odd[0]["reason"]


def test_a_layer_type_that_cannot_be_split_is_replicated_and_says_so():
    model = keras.Sequential([keras.Input((16, 64)), keras.layers.EinsumDense("abc,cd->abd", (16, 256), name="e"),
                              keras.layers.Dense(4, name="out")])
    entry = plan_splits(model, 2)[0]
    assert entry["kind"] == "replicated" and "EinsumDense cannot be split" in entry["reason"]


def test_named_layers_are_split_and_unknown_names_or_functional_models_are_refused():
    assert kinds(plan_splits(mlp(), 2, "head,big_2")) == {"big_1": "replicated", "big_2": "column", "head": "row"}
    with pytest.raises(OptionError, match="--split-layers names nope"):
        plan_splits(mlp(), 2, "nope")
    inputs = keras.Input((4,))
    with pytest.raises(OptionError, match="keras.Sequential"):
        plan_splits(keras.Model(inputs, keras.layers.Dense(2)(inputs)), 2)
