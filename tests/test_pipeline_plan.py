"""The pipeline's pure parts: schedules against the bubble theory, cuts of real Keras graphs, balancing."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.errors import OptionError
from nbdist.model_parts.pipeline import schedule
from nbdist.model_parts.pipeline.split import balanced_cuts, chain_of, check_cuts, positions, stage_part


@pytest.mark.parametrize("kind", schedule.KINDS)
@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 4), (2, 8), (3, 4), (4, 8)])
def test_schedules_run_without_deadlock_and_idle_as_theory_says(kind, stages, micro):
    result = schedule.simulate(kind, stages, micro, forward_s=1.0, backward_s=2.0)
    assert result["bubble"] == pytest.approx(schedule.theoretical_bubble(stages, micro))
    for s in range(stages):
        steps = schedule.make(kind, s, stages, micro)
        assert sorted(steps) == sorted([("F", m) for m in range(micro)] + [("B", m) for m in range(micro)])
        assert all(steps.index(("F", m)) < steps.index(("B", m)) for m in range(micro))


def test_1f1b_keeps_at_most_k_minus_s_micro_batches_and_gpipe_keeps_all():
    assert [schedule.most_in_flight(schedule.one_f_one_b(s, 4, 8)) for s in range(4)] == [4, 3, 2, 1]
    assert [schedule.most_in_flight(schedule.gpipe(s, 4, 8)) for s in range(4)] == [8, 8, 8, 8]
    assert schedule.one_f_one_b(0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert schedule.theoretical_bubble(2, 8) == pytest.approx(1 / 9)


def test_balanced_cuts_minimise_the_costliest_stage():
    names = ["a", "b", "c", "d"]
    assert balanced_cuts(names, [0.25, 1, 1, 0.01], names[:3], 2) == ["b"]  # 1.25 | 1.01
    assert balanced_cuts(names, [0.25, 1, 1, 0.01], ["a", "c"], 2) == ["a"]  # 0.25 | 2.01 beats 2.25 | 0.01
    assert balanced_cuts(names, [1, 1, 1, 1], names[:3], 4) == ["a", "b", "c"]
    with pytest.raises(OptionError, match="--stages 3 needs 2 cut"):
        balanced_cuts(names, [1, 1, 1, 1], ["a"], 3)


def _skip_model():
    import keras

    inputs = keras.Input((8,), name="x")
    a = keras.layers.Dense(4, name="a")(inputs)
    b = keras.layers.Dense(4, name="b")(a)
    c = keras.layers.Add(name="c")([a, b])
    d = keras.layers.Dense(3, name="d")(c)
    return keras.Model(inputs, keras.layers.Dense(2, name="e")(d))


def test_a_skip_connection_crosses_a_cut_with_the_activations_and_the_stages_equal_the_model():
    model = _skip_model()
    chain = chain_of(model)
    assert chain.names == ["a", "b", "c", "d", "e"] and chain.cuttable == ["a", "b", "c", "d"]
    assert [t.name for t in chain.crossing["b"]] == [chain.layers[0].output.name, chain.layers[1].output.name]
    x = np.random.default_rng(0).random((5, 8), np.float32)
    for cut in (["b"], ["a", "b", "d"]):  # (two tensors cross the cut after b: a's output and b's)
        h = x
        for s in range(len(cut) + 1):
            h = stage_part(chain, [chain.names.index(n) for n in cut], s)(h)
        np.testing.assert_allclose(h, model(x), atol=1e-6)
    with pytest.raises(OptionError, match="1 name"):
        check_cuts(chain, ["a", "c"], 2)
    with pytest.raises(OptionError, match="not a layer of the model"):
        check_cuts(chain, ["dense_9"], 2)


def test_the_stages_of_a_cut_compute_what_the_whole_model_does():
    import keras

    model = _skip_model()
    x = np.random.default_rng(0).random((5, 8), np.float32)
    h = x
    for s in range(3):
        h = stage_part(chain_of(model), [2, 3], s)(h)
    np.testing.assert_allclose(h, model(x), atol=1e-6)
    sequential = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    chain = chain_of(sequential)
    first, second = (stage_part(chain, [0], s) for s in range(2))
    np.testing.assert_allclose(second(first(x)), sequential(x), atol=1e-6)
    assert len(first.weights) == len(second.weights) == 2


def test_a_layer_called_twice_falls_whole_in_one_stage():
    """A siamese network's tower (a nested model called on both inputs) stands once in the chain (not flattened:
    its calls fall in one stage); a cut right after it is crossed by both calls' outputs; none falls between two
    calls of a shared layer; every cut computes what the whole model does."""
    import keras
    from keras import layers

    from nbdist.model_parts.pipeline.split import positions

    item = layers.Input((4,))
    tower = keras.Model(item, layers.Dense(3)(item), name="tower")
    a, b = layers.Input((4,)), layers.Input((4,))
    merged = layers.Subtract(name="diff")([tower(a), tower(b)])
    siamese = keras.Model([a, b], layers.Dense(1, name="out")(layers.Dense(5, name="d1")(merged)))
    chain = chain_of(siamese)
    assert chain.cuttable == ["tower", "diff", "d1"] and len(chain.crossing["tower"]) == 2
    x = [np.random.default_rng(0).normal(size=(2, 4)), np.zeros((2, 4))]
    for name in chain.cuttable:
        cut = positions(chain, [name])
        assert np.allclose(stage_part(chain, cut, 1)(stage_part(chain, cut, 0)(x)), siamese(x), atol=1e-6)

    shared = layers.Dense(4, name="shared")
    inputs = layers.Input((4,))
    twice = keras.Model(inputs, layers.Dense(1)(shared(layers.Dense(4, name="between")(shared(inputs)))))
    chain = chain_of(twice)  # a cut after the first `shared` would split its calls; after `between`, both precede it
    assert chain.cuttable == ["between"] and "on both sides" in chain.blocked["shared"]


def test_a_nested_backbone_of_several_outputs_is_cut_inside_and_every_cut_equals_the_model():
    """A backbone (a functional model nested in the classifier, as KerasHub's are) whose output is a dict stands as
    its own layers: the pipeline may cut inside it, and every cut's stages compute what the whole model does."""
    import keras
    from keras import layers

    inner = keras.Input((8,))
    hidden = layers.Dense(8, name="inner")(inner)
    backbone = keras.Model(inner, {"pooled": layers.Dense(4, name="pool")(hidden),
                                   "sequence": layers.Dense(6, name="seq")(hidden)}, name="backbone")
    inputs = keras.Input((8,))
    features = layers.Dense(8, name="embed")(inputs)
    outputs = backbone(features)
    merged = layers.Concatenate(name="merge")([outputs["pooled"], outputs["sequence"]])
    classifier = keras.Model(inputs, layers.Dense(2, name="head")(layers.Dense(5, name="hidden")(merged)))
    chain = chain_of(classifier)
    assert "backbone" not in chain.names and {"inner", "pool", "seq"} <= set(chain.names)
    assert chain.cuttable == chain.names[:-1]
    x = np.random.default_rng(0).random((3, 8), np.float32)
    for name in chain.cuttable:
        cut = positions(chain, [name])
        np.testing.assert_allclose(stage_part(chain, cut, 1)(stage_part(chain, cut, 0)(x)), classifier(x), atol=1e-6)


def test_a_subclassed_model_is_refused_with_what_to_do():
    import keras

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(OptionError, match="subclassed model.*functional model"):
        chain_of(Net())


def test_the_stages_results_are_put_together_in_the_whole_models_order():
    from nbdist.keras_semantics.keras_bridge import FitResult
    from nbdist.strategies.pipeline import assemble

    def stage(weight_index, trainable_index, weights, slots, history):
        result = FitResult(weights=weights, optimizer_weights=[np.array(7), np.array(0.1)] + slots,
                           history=history, params={}, epoch=[0])
        result.parts = {"weight_index": weight_index, "trainable_index": trainable_index, "optimizer_prefix": 2}
        return result

    # whole model: w0 (trainable), w1 (not trainable), w2 (trainable); two slots per trainable variable
    first = stage([0, 1], [0], [np.array(0.0), np.array(1.0)], [np.array(10.0), np.array(11.0)], {})
    last = stage([2], [1], [np.array(2.0)], [np.array(20.0), np.array(21.0)], {"loss": [0.5]})
    merged = assemble([first, last])
    assert [float(w) for w in merged.weights] == [0.0, 1.0, 2.0]
    assert [float(v) for v in merged.optimizer_weights] == [7.0, 0.1, 10.0, 11.0, 20.0, 21.0]
    assert merged.history == {"loss": [0.5]} and len(merged.parts["stages"]) == 2


def test_a_workers_position_among_replicated_pipelines():
    from nbdist.model_parts.pipeline.replicas import Position

    # 2 pipelines of 3 stages: ranks 0-2 and 3-5
    middle = Position(rank=4, stages=3, replicas=2)
    assert (middle.stage, middle.replica, middle.up, middle.down, middle.peers) == (1, 1, 3, 5, [1])
    assert middle.neighbours() == [3, 5, 1] and middle.role() == "pipeline stage 1 of replica 1"
    assert Position(0, 3, 2).neighbours() == [1, 3] and Position(5, 3, 2).neighbours() == [4, 2]
    batch = np.arange(10)
    assert Position(0, 3, 2).share(batch).tolist() == [0, 2, 4, 6, 8]
    assert Position(3, 3, 2).share(batch).tolist() == [1, 3, 5, 7, 9]
    assert Position(1, 2).role() == "pipeline stage 1" and Position(1, 2).share(batch).tolist() == batch.tolist()


def test_keep_weights_auto_keeps_on_the_engines_what_the_notebook_host_could_not_take_back():
    """A model's weights and slots over half of this host's available memory stay on the engines; a small one comes
    back; one already kept stays. (A broadcast array has the nbytes of its shape without the memory.)"""
    import psutil

    from nbdist.model_parts.model_sync import ModelState
    from nbdist.strategies import make_strategy

    def decided(**state):
        strategy = make_strategy({"strategy": "pipeline"})
        strategy.notebook_models = {"m": ModelState("arch", trainable=[True], **state)}
        return strategy._where_weights_go(), strategy.keep_reason

    huge = np.broadcast_to(np.zeros(1, np.float32), (psutil.virtual_memory().available // 8 + 1,))
    keep, why = decided(weights=[huge])  # with Adam's slots, 3 x over half of what is available
    assert keep == "engines" and "more than half of the" in why
    assert decided(weights=[np.zeros(10, np.float32)]) == ("notebook", None)
    keep, why = decided(weights=[], kept={"model": "m", "run": 4, "engines": [0, 1]})
    assert keep == "engines" and "after run 4" in why
    assert make_strategy({"strategy": "pipeline", "keep_weights": "notebook"}).value("keep_weights") == "notebook"
