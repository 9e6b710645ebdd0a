"""The state walk (nbdist/keras_semantics/state_walk.py) in this process: addresses that do not depend on the order
variables were made in, every optimizer a model reaches (a GAN's own, a loss-scale optimizer's inner one, EMA copies),
installing a capture into fresh objects (building what they lack), and the oracle's comparison."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from nbdist.keras_semantics import state_walk

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Pair(keras.Model):
    """A subclassed model of two sub-models and an optimizer of its own besides `compile`'s."""

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def call(self, x):
        return self.second(self.first(x))


def dense(units: int, name: str | None = None):
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dropout(0.5)], name=name)


def trained_pair(order: str = "first"):
    """A Pair whose sub-models are made in `order`, with its own Adam (EMA on) stepped 3 times on the first."""
    keras.utils.set_random_seed(0)
    made = {name: dense(3) for name in (("first", "second") if order == "first" else ("second", "first"))}
    pair = Pair(made["first"], made["second"])
    pair.own = keras.optimizers.Adam(0.1, use_ema=True)
    pair.own.build(pair.first.trainable_variables)
    for _ in range(3):
        pair.own.apply([np.ones(v.shape, "float32") for v in pair.first.trainable_variables],
                       pair.first.trainable_variables)
    return pair


def test_addresses_follow_attributes_not_the_order_variables_were_made_in():
    one, other = state_walk.Walk({"pair": trained_pair("first")}), state_walk.Walk({"pair": trained_pair("second")})
    assert list(one.variables) == list(other.variables)
    assert "pair.first.layers[0]/kernel" in one.variables
    assert "pair.own/_momentums[pair.first.layers[0]/kernel]" in one.variables  # a slot by its model variable
    assert "pair.own/_model_variables_moving_average[pair.first.layers[0]/bias]" in one.variables  # EMA
    assert "pair.first.layers[1].seed_generator/state" in one.variables  # a Dropout's seed
    assert one.kinds["pair.own"] == "optimizer"


def test_a_capture_installs_into_fresh_objects_building_the_optimizer_over_their_variables():
    trained = trained_pair()
    state = state_walk.capture({"pair": trained})
    fresh = Pair(dense(3), dense(3))
    fresh.own = keras.optimizers.Adam(0.1, use_ema=True)
    assert state_walk.install(state, {"pair": fresh}) == []
    assert fresh.own.built and int(fresh.own.iterations.numpy()) == 3
    assert fresh.own._trainable_variables[0] is fresh.first.trainable_variables[0]  # built over its own variables
    assert state_walk.differences(state, state_walk.capture({"pair": fresh})) == []


def test_a_loss_scale_optimizers_inner_optimizer_and_scale_are_walked():
    model = dense(2)
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.RMSprop(), initial_scale=8.0)
    optimizer.build(model.trainable_variables)
    walk = state_walk.Walk({"model": model, "opt": optimizer})
    assert {"opt/dynamic_scale", "opt/step_counter", "opt.inner_optimizer/_iterations",
            "opt.inner_optimizer/_velocities[model.layers[0]/kernel]"} <= set(walk.variables)


def test_a_metric_made_anew_takes_the_captured_totals():
    metric = keras.metrics.Mean()
    metric.update_state([1.0, 3.0])
    state = state_walk.capture({"loss_avg": metric})
    fresh = keras.metrics.Mean()  # (what unpickling a metric gives: its variables at zero)
    assert state_walk.install(state, {"loss_avg": fresh}) == []
    assert float(fresh.result()) == 2.0


def test_what_cannot_be_installed_is_named():
    state = state_walk.capture({"model": dense(2)})
    problems = state_walk.install(state, {"model": dense(5)})
    assert problems and all("shape" in p for p in problems), problems


def test_differences_name_the_address_and_the_gap():
    model = dense(2)
    before = state_walk.capture({"model": model})
    model.layers[0].kernel.assign(model.layers[0].kernel * 2.0)
    found = state_walk.differences(before, state_walk.capture({"model": model}))
    assert found == ["model.layers[0]/kernel: values differ (relative L2 1)"]
