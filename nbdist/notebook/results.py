"""A run's results in the notebook's model: the trained weights and optimizer state (or, where they stayed on
the engines, the model as their skeleton), the History, and rank 0's callback state."""

from __future__ import annotations

import numpy as np

from ..errors import OptionError
from ..keras_semantics.keras_bridge import FitResult, build_from_sample


def install_result(model, result: FitResult, sample_input=None, callbacks=None, client=None):
    """Give `model` the trained weights and optimizer state (or, where they stayed on the engines, make it their
    skeleton: `kept_weights.hold`; `client` reaches the engines), and `callbacks` (the notebook's callback objects of
    this fit) rank 0's callback state; return the run's History."""
    import keras

    from ..keras_semantics import callbacks as worker_callbacks

    if not model.built:
        build_from_sample(model, sample_input)
    if result.kept is not None:
        from ..model_parts.kept_weights import hold

        hold(model, result.kept, client)
    else:
        _install_weights(model, result)
    history = keras.callbacks.History()
    history.set_model(model)
    history.history = {k: list(v) for k, v in result.history.items()}
    history.params = dict(result.params)
    history.epoch = list(result.epoch)
    model.history = history
    worker_callbacks.restore(callbacks, result.callbacks, model, result.params)
    return history


def _install_weights(model, result: FitResult) -> None:
    from ..model_parts.kept_weights import release_hold

    release_hold(model)  # (a skeleton whose weights were on the engines holds them here again)
    expected = [tuple(w.shape) for w in model.get_weights()]
    received = [tuple(w.shape) for w in result.weights]
    if expected != received:
        raise OptionError(
            "The model built in this notebook does not match the one trained on the engines "
            f"(weight shapes here {expected[:4]}..., trained {received[:4]}...). "
            "Make sure the definition cells are the same here and on the engines (re-run them)."
        )
    model.set_weights(result.weights)
    _install_optimizer_state(model, result.optimizer_weights)


def _install_optimizer_state(model, values):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not values:
        return
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    variables = optimizer.variables
    if [tuple(v.shape) for v in variables] != [tuple(np.shape(x)) for x in values]:
        return  # a different optimizer layout: the weights alone are still right
    for variable, value in zip(variables, values):
        variable.assign(value)
