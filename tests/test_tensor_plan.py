"""Which layers `tensor` splits and how, without engines (a pure function of the model)."""

from __future__ import annotations

import keras
import pytest

from nbdist.errors import OptionError
from nbdist.model_parts.tensor_parallel.plan import plan_splits
from tests.support import TRANSFORMER


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
    model = keras.Sequential([keras.Input((16, 64)), keras.layers.Conv1D(256, 3, name="e"),
                              keras.layers.Dense(4, name="out")])
    entry = plan_splits(model, 2)[0]
    assert entry["kind"] == "replicated" and "Conv1D cannot be split" in entry["reason"]


@pytest.mark.parametrize("equation, output_shape, bias_axes, kernel_axes, gather_axis", [
    ("abc,cd->abd", (16, 256), "d", [1, 0], -1),  # a sequence's projection: its bias split too
    ("...c,cd->...d", 256, None, [1], -1),  # elided leading axes
    ("abc,cde->abde", (16, 8, 32), "de", [2, 1], -1),  # heads (d) then width (e): split by the last the kernel
    ("abc,dc->abd", (16, 256), None, [0], -1),  # the kernel's output axis first
])
def test_an_einsum_dense_splits_along_an_output_axis_its_kernel_alone_gives(equation, output_shape, bias_axes,
                                                                          kernel_axes, gather_axis):
    from nbdist.model_parts.tensor_parallel.plan import einsum_split, split_axes

    layer = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, name="e")
    model = keras.Sequential([keras.Input((16, 64)), layer, keras.layers.Flatten(), keras.layers.Dense(4)])
    entry = plan_splits(model, 2)[0]
    assert entry["kind"] == "einsum" and entry["gathers"]
    assert split_axes("einsum", layer) == kernel_axes[:len(layer.weights)]
    split = einsum_split(layer.get_config())
    assert split["output_axis"] == gather_axis
    if equation == "abc,cde->abde":  # (gives, its bias of shape (8, 32) split along its axis 1)
        assert split["letter"] == "e" and split["bias_axis"] == 1 and split["shape_index"] == 2


def test_an_einsum_dense_without_an_output_axis_of_its_own_or_of_odd_width_is_replicated_with_the_reason():
    inputs = keras.Input((16, 64))
    scaled = keras.layers.EinsumDense("abc,c->abc", (16, 64), name="scale")(inputs)  # a per-feature scale
    odd = keras.layers.EinsumDense("abc,cd->abd", (16, 255), name="odd")(scaled)
    plan = plan_splits(keras.Model(inputs, odd), 2, "scale,odd")
    assert plan[1]["kind"] == "replicated" and "no output axis" in plan[1]["reason"]
    assert plan[2]["kind"] == "replicated" and "(255) is not a multiple of 2" in plan[2]["reason"]


def test_named_layers_are_split_and_unknown_names_are_refused():
    assert kinds(plan_splits(mlp(), 2, "head,big_2")) == {"big_1": "replicated", "big_2": "column", "head": "row"}
    with pytest.raises(OptionError, match="--split-layers names nope"):
        plan_splits(mlp(), 2, "nope")


class Tower(keras.Model):  # subclassed: its layers are attributes, its call is not a graph
    def __init__(self):
        super().__init__()
        self.up = keras.layers.Dense(128, activation="relu", name="up")
        self.down = keras.layers.Dense(128, activation="relu", name="down")
        self.out = keras.layers.Dense(10, name="out")

    def call(self, x):
        return self.out(self.down(self.up(x)))


def test_a_subclassed_model_is_planned_where_its_layers_sit_and_each_split_layer_gathers_its_own_output():
    model = Tower()
    model(keras.ops.zeros((1, 64)))  # (built by a call, as fit builds it)
    plan = plan_splits(model, 2)
    assert kinds(plan) == {"up": "column", "down": "column", "out": "replicated"}
    assert all(entry["gathers"] for entry in plan[:2])  # (no graph shows that `down` takes `up`'s output alone)


def test_a_nested_backbone_is_entered_its_layers_named_by_their_path_and_paired_inside_its_graph():
    inputs = keras.Input((64,))
    backbone = keras.Model(inputs, keras.layers.Dense(128, name="b2", activation="relu")(
        keras.layers.Dense(128, activation="relu", name="b1")(inputs)), name="backbone")
    outer_in = keras.Input((64,))
    model = keras.Model(outer_in, keras.layers.Dense(10, name="head")(backbone(outer_in)))
    plan = plan_splits(model, 2, "b1,backbone/b2")
    assert {e["name"]: e["kind"] for e in plan if e["class"] != "InputLayer"} == {
        "backbone/b1": "column", "backbone/b2": "row", "head": "replicated"}


def test_a_tower_called_twice_is_split_inside_and_a_layer_called_twice_in_the_graph_gathers_each_call():
    """keras-io's siamese network calls its embedding tower on both images: the tower's layers split and pair
    inside its own graph (each call's collectives are named apart); a Dense the outer graph calls twice is never
    a row of a pair (its calls' neighbours may differ): it gathers each call's output."""
    tower_in = keras.Input((64,))
    tower = keras.Model(tower_in, keras.layers.Dense(128, name="t2", activation="relu")(
        keras.layers.Dense(128, activation="relu", name="t1")(tower_in)), name="tower")
    shared = keras.layers.Dense(128, activation="relu", name="shared")
    left, right = keras.Input((64,)), keras.Input((64,))
    joined = keras.layers.Concatenate(name="joined")([shared(tower(left)), shared(tower(right))])
    model = keras.Model([left, right], keras.layers.Dense(10, name="head")(joined))
    plan = {e["name"]: e for e in plan_splits(model, 2, "t1,t2,shared") if e["class"] != "InputLayer"}
    assert {name: e["kind"] for name, e in plan.items()} == {
        "tower/t1": "column", "tower/t2": "row", "shared": "column", "joined": "replicated", "head": "replicated"}
    assert plan["shared"]["gathers"] and not plan["tower/t1"]["gathers"]

def test_a_library_subclass_with_its_own_call_or_tied_weights_is_replicated_with_the_reason():
    class Scaled(keras.layers.Dense):  # a library's layer computing something else than Dense's call
        def call(self, x):
            return super().call(x) * 2.0

    class Tied(keras.layers.Layer):  # one embedding matrix read by two layers' weights
        def __init__(self):
            super().__init__()
            self.embed = keras.layers.Embedding(100, 64, name="embed")
            self.again = keras.layers.Embedding(100, 64, name="again")

        def build(self, shape):
            self.embed.build(shape)
            self.again.build(shape)
            self.again._trainable_variables[:] = list(self.embed._trainable_variables)

        def call(self, ids):
            return self.embed(ids) + self.again(ids)

    model = keras.Sequential([keras.Input((8,), dtype="int32"), Tied(), keras.layers.Flatten(),
                              Scaled(64, name="scaled")])
    by_name = {e["name"]: e for e in plan_splits(model, 2)}
    assert "computes its own call" in by_name["scaled"]["reason"]
    assert "tied" in by_name["tied/embed"]["reason"] and "tied" in by_name["tied/again"]["reason"]


exec(TRANSFORMER)  # defines transformer(heads, dropout), the model tests/test_tensor.py trains on engines


def test_a_functional_transformer_splits_attention_by_heads_and_replicates_norms_and_residual_adds():
    plan = plan_splits(transformer(), 2)
    by_name = {entry["name"]: entry for entry in plan}
    assert {n: by_name[n]["kind"] for n in ("mha_0", "mha_1", "mlp1_0", "mlp2_0", "ln1_0", "res1_0", "head")} == {
        "mha_0": "heads", "mha_1": "heads", "mlp1_0": "column", "mlp2_0": "row", "ln1_0": "replicated",
        "res1_0": "replicated", "head": "replicated"}
    assert by_name["mlp1_0"]["gathers"] is False  # the MLP's pair: its slice goes straight to mlp2_0's rows
    # query, key, value: 32 x 4 x 8 kernels and 4 x 8 biases, halved; the output projection's 4 x 8 x 32 kernel
    # halved by heads, its 32 biases whole on every engine
    projections, output_kernel, output_bias = 3 * (32 * 4 * 8 + 4 * 8), 4 * 8 * 32, 32
    assert by_name["mha_0"]["bytes"] == (projections + output_kernel + output_bias) * 4
    assert by_name["mha_0"]["bytes_per_engine"] == ((projections + output_kernel) // 2 + output_bias) * 4


def test_a_functional_dense_whose_output_another_layer_also_takes_is_not_paired():
    inputs = keras.Input((64,))
    first = keras.layers.Dense(128, activation="relu", name="first")(inputs)
    second = keras.layers.Dense(128, name="second")(first)
    model = keras.Model(inputs, keras.layers.Concatenate(name="both")([first, second]))
    split = kinds(plan_splits(model, 2, "first,second"))
    assert (split["first"], split["second"], split["both"]) == ("column", "column", "replicated")


def test_attention_with_dropout_splits_by_heads_and_heads_that_do_not_divide_are_replicated_with_the_reason():
    dropped = {e["name"]: e for e in plan_splits(transformer(dropout=0.1), 2)}["mha_0"]
    assert dropped["kind"] == "heads"  # (each engine draws its heads' masks: its slice's randomness is its own)
    odd = {e["name"]: e for e in plan_splits(transformer(heads=3), 2)}["mha_0"]
    assert odd["kind"] == "replicated" and "num_heads (3) is not a multiple of 2" in odd["reason"]
