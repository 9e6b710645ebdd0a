"""fit interception, argument checks, results and weight install, on real Keras models."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from nbdist.errors import OptionError
from nbdist.keras_semantics.keras_bridge import FitResult, bind_fit_arguments, intercept_fit
from nbdist.notebook.results import install_result


def tiny_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.dense(inputs)


DATA = (np.random.default_rng(0).normal(size=(40, 4)).astype("float32"), np.arange(40) % 3)


def test_bind_names_positional_arguments():
    model = tiny_model()
    request = bind_fit_arguments(keras.Model.fit, model, DATA + (8, 3), {"shuffle": False})
    assert request.batch_size == 8 and request.epochs == 3 and request.shuffle is False
    assert request.samples_per_step == 8
    assert request.x is DATA[0]


@pytest.mark.parametrize("name, value", [("class_weight", {0: 2.0}), ("initial_epoch", 2),
                                         ("sample_weight", np.ones(40)), ("validation_freq", 2)])
def test_every_fit_argument_is_bound_and_a_chosen_one_is_noted(name, value):
    request = bind_fit_arguments(keras.Model.fit, tiny_model(), DATA, {name: value})
    assert request.args[name] is value and request.given(name)


def test_an_argument_at_its_default_is_not_noted_as_chosen():
    request = bind_fit_arguments(keras.Model.fit, tiny_model(), DATA, {"initial_epoch": 0, "class_weight": None})
    assert request.epochs == 1 and not request.given("initial_epoch") and not request.given("class_weight")


def test_argument_keras_does_not_know_is_refused():
    with pytest.raises(OptionError, match="Keras does not accept"):
        bind_fit_arguments(keras.Model.fit, tiny_model(), DATA, {"epochz": 2})


def test_intercept_fit_routes_and_restores_even_on_error():
    original = keras.Model.fit
    seen = []
    with pytest.raises(RuntimeError):
        with intercept_fit(lambda request: seen.append(request.epochs) or "history"):
            assert tiny_model().fit(*DATA, epochs=4) == "history"
            raise RuntimeError("user code fails after fit")
    assert seen == [4] and keras.Model.fit is original


def test_collect_then_install_gives_same_weights_history_and_optimizer_state():
    trained = tiny_model()
    history = trained.fit(*DATA, epochs=2, verbose=0)
    result = FitResult.collect(trained, history)
    assert result.epoch == [0, 1] and sorted(result.history) == ["accuracy", "loss"]

    fresh = tiny_model()
    installed, left = install_result(fresh, result, _request(fresh))
    assert left == []
    for a, b in zip(trained.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(fresh.optimizer.iterations.numpy()) == 2 * 2  # 2 epochs of ceil(40/32) steps: state came along
    assert installed.history == result.history and installed.model is fresh and fresh.history is installed
    np.testing.assert_allclose(trained.predict(DATA[0], verbose=0), fresh.predict(DATA[0], verbose=0))


def test_install_builds_an_unbuilt_subclassed_model():
    trained = Subclassed()
    trained.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    result = FitResult.collect(trained, trained.fit(*DATA, epochs=1, verbose=0))
    fresh = Subclassed()
    fresh.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    install_result(fresh, result, _request(fresh))
    np.testing.assert_array_equal(fresh.get_weights()[0], trained.get_weights()[0])


def test_install_refuses_a_different_architecture():
    trained = tiny_model()
    result = FitResult.collect(trained, trained.fit(*DATA, epochs=1, verbose=0))
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    with pytest.raises(OptionError, match="does not match the one trained"):
        install_result(other, result, _request(other))


def _request(model):
    return bind_fit_arguments(keras.Model.fit, model, DATA, {})


def test_samples_per_step_of_a_batched_dataset():
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices(DATA).batch(10, drop_remainder=True)
    assert bind_fit_arguments(keras.Model.fit, tiny_model(), (data,), {}).samples_per_step == 10
    ragged = tf.data.Dataset.from_tensor_slices(DATA).batch(10)
    assert bind_fit_arguments(keras.Model.fit, tiny_model(), (ragged,), {}).samples_per_step is None
