"""The PS update rules against Keras' own optimizers, step by step."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from nbdist.ps import rules

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_rule_matches_keras_over_steps(name):
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(6)]

    optimizer = OPTIMIZERS[name]()
    variable = keras.Variable(w0.copy())
    for g in grads:
        optimizer.apply([g], [variable])

    spec = rules.spec_from_keras(OPTIMIZERS[name]())
    w, state = w0.copy(), rules.new_state(spec, w0.shape)
    for step, g in enumerate(grads):
        rules.apply(spec, w, g, state, spec.learning_rate, step)
    np.testing.assert_allclose(w, np.asarray(variable), rtol=1e-5, atol=1e-6)


def test_hand_computed_momentum_step():
    spec = rules.OptimizerSpec("SGD", 0.1, momentum=0.5)
    w, state = np.array([1.0], np.float32), rules.new_state(rules.OptimizerSpec("SGD", 0.1, momentum=0.5), (1,))
    rules.apply(spec, w, np.array([2.0], np.float32), state, 0.1, 0)  # m = -0.2, w = 0.8
    rules.apply(spec, w, np.array([2.0], np.float32), state, 0.1, 1)  # m = 0.5 * -0.2 - 0.2 = -0.3, w = 0.5
    assert w.tolist() == pytest.approx([0.5]) and state["momentum"].tolist() == pytest.approx([-0.3])


@pytest.mark.parametrize("optimizer", [
    lambda: keras.optimizers.RMSprop(0.01), lambda: keras.optimizers.SGD(0.01, clipnorm=1.0),
    lambda: keras.optimizers.Adam(0.01, amsgrad=True), lambda: keras.optimizers.SGD(0.01, weight_decay=0.1),
])
def test_what_the_numpy_rules_do_not_implement_goes_to_keras_with_its_config(optimizer):
    built = optimizer()
    spec = rules.spec_from_keras(built)
    assert spec.name == rules.KERAS and spec.kind == type(built).__name__
    assert keras.optimizers.deserialize(spec.keras).get_config() == built.get_config()


def test_plain_sgd_and_adam_keep_the_numpy_rules():
    assert rules.spec_from_keras(keras.optimizers.SGD(0.1, momentum=0.9)).name == "SGD"
    assert rules.spec_from_keras(keras.optimizers.Adam(0.01)).name == "Adam"


def test_a_loss_scale_optimizer_is_described_by_its_inner_optimizer():
    """The shards apply the unscaled gradients with the inner optimizer; each worker keeps the loss scale."""
    spec = rules.spec_from_keras(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)))
    assert (spec.name, spec.kind, spec.learning_rate, spec.momentum) == ("SGD", "SGD", pytest.approx(0.1), 0.5)


@pytest.mark.parametrize("spec", [rules.OptimizerSpec("SGD", 0.1, momentum=0.9, nesterov=True),
                                  rules.OptimizerSpec("Adam", 0.01)], ids=["nesterov", "adam"])
def test_large_variables_are_updated_in_chunks_with_the_same_result(spec):
    rng = np.random.default_rng(0)
    n = 3 * rules.CHUNK + 17
    w_whole = rng.standard_normal(n).astype(np.float32)
    w_chunks = w_whole.copy().reshape(n, 1)
    s_whole, s_chunks = rules.new_state(spec, (n,)), rules.new_state(spec, (n, 1))
    whole_array_rule = rules._sgd if spec.name == "SGD" else rules._adam
    for step in range(3):
        g = rng.standard_normal(n).astype(np.float32)
        whole_array_rule(spec, w_whole, g, s_whole, 0.1, step)
        rules.apply(spec, w_chunks, g.reshape(n, 1), s_chunks, 0.1, step)
    np.testing.assert_array_equal(w_chunks.reshape(-1), w_whole)


def test_a_learning_rate_schedule_is_followed_by_update_count():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    spec = rules.spec_from_keras(keras.optimizers.SGD(schedule))
    assert spec.schedule is not None
    for step in (0, 10, 25):
        assert rules.learning_rate(spec, step) == pytest.approx(float(schedule(step)), rel=1e-6)
    assert rules.learning_rate(rules.OptimizerSpec("SGD", 0.3), 99) == 0.3
