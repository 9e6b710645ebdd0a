"""A run's results in the notebook's model: everything the fit's model reaches, installed by the state walk's
addresses (`keras_semantics.state_walk`: weights, every optimizer it holds, metrics, seed generators; or, where the
weights stayed on the engines, the model as their skeleton), the History, and rank 0's callback state."""

from __future__ import annotations

import numpy as np

from ..errors import OptionError
from ..keras_semantics.keras_bridge import FitResult, build_from_sample


def install_result(model, result: FitResult, request=None, callbacks=None, client=None) -> tuple:
    """Give `model` the trained state (or, where the weights stayed on the engines, make it their skeleton:
    `kept_weights.hold`; `client` reaches the engines), and `callbacks` (the notebook's callback objects of this
    fit) rank 0's callback state; `request`: the notebook's fit call (its data builds what the engines built).
    Returns the run's History and what could not be installed (one line each)."""
    import keras

    from ..keras_semantics import callbacks as worker_callbacks

    sample_input = request.x if request is not None else None
    if not model.built:
        build_from_sample(model, sample_input)
    problems: list[str] = []
    if result.kept is not None:
        from ..model_parts.kept_weights import hold

        hold(model, result.kept, client)
    elif result.state is not None:
        from ..model_parts.kept_weights import release_hold

        release_hold(model)  # (a skeleton whose weights were on the engines holds them here again)
        _refuse_another_architecture(model, result)
        problems = install(result.state, {"model": model}, request)
    else:
        _install_weights(model, result)
        metrics = (result.parts or {}).get("metrics")  # (a pipeline's last stage's compiled loss and metrics)
        problems = install(metrics, {"model": model}, request) if metrics is not None else []
        problems += _left_with_the_parts(model, metrics)
    history = keras.callbacks.History()
    history.set_model(model)
    history.history = {k: list(v) for k, v in result.history.items()}
    history.params = dict(result.params)
    history.epoch = list(result.epoch)
    model.history = history
    worker_callbacks.restore(callbacks, result.callbacks, model, result.params)
    return history, problems


def install(state, roots: dict, request=None) -> list[str]:
    """`state_walk.install` of `state` into `roots`; a model's compiled metrics the engines built are built here
    from the first batch of `request`'s data, as Keras' own `fit` builds them."""
    from ..keras_semantics import state_walk

    def build_metrics(address, metric):
        owner = roots.get(address.split(".", 1)[0])
        if request is None or address.split(".", 1)[-1] != "_compile_metrics" or owner is None:
            raise ValueError("Keras builds a model's compiled metrics from a batch of its data, which this fit "
                             "does not give here")
        owner._symbolic_build(data_batch=_data_batch(request))

    return state_walk.install(state, roots, build_metrics)


def _data_batch(request) -> tuple:
    """(x, y, sample_weight) of one sample of the fit's data, as the notebook holds it."""
    from ..datasets import structures
    from ..datasets.sharding import first_batch, is_dataset, is_py_dataset, spec_batch

    x = request.args.get("x")
    if is_dataset(x):  # (not iterated where its elements say their shapes: a shuffle's order stays a local run's)
        return spec_batch(x) or first_batch(x)
    if is_py_dataset(x):
        return first_batch(x)
    one = slice(0, 1)
    return (structures.take(x, one), structures.take(request.args.get("y"), one),
            structures.take(request.args.get("sample_weight"), one))

def _left_with_the_parts(model, returned=None) -> list[str]:
    """What a model-parallel run that returned only the joined weights and the model's optimizer (and the
    `returned` capture) left on the engines: the model's other metrics and its seed generators (named, never
    silent)."""
    from ..keras_semantics.state_walk import Walk

    walk = Walk({"model": model})
    given = returned.objects if returned is not None else {}
    left = [a for a, kind in walk.kinds.items() if kind in ("metric", "seed") and a not in given and any(
        v.startswith(a + "/") for v in walk.variables)]
    if not left:
        return []
    return [f"{', '.join(left[:4])}{' and more' if len(left) > 4 else ''}: their state stayed on the engines (this "
            "strategy returns the model's weights and its optimizer's state)"]


def _refuse_another_architecture(model, result: FitResult) -> None:
    """The notebook's model must have the weights the engines trained, at the same addresses and shapes."""
    from ..keras_semantics.state_walk import Walk

    walk = Walk({"model": model})
    here = {walk.address_of(w): tuple(w.shape) for w in model.weights}
    trained = {a: tuple(np.shape(result.state.values[a])) for a in here if a in result.state.values}
    if here != trained or len(result.weights) != len(here):
        _mismatch(list(here.values()), [tuple(np.shape(w)) for w in result.weights])


def _mismatch(expected, received):
    raise OptionError(
        "The model built in this notebook does not match the one trained on the engines "
        f"(weight shapes here {expected[:4]}..., trained {received[:4]}...). "
        "Make sure the definition cells are the same here and on the engines (re-run them)."
    )


def _install_weights(model, result: FitResult) -> None:
    """A model-parallel run's joined weights and optimizer variables, in the engines' `model.weights` order."""
    from ..model_parts.kept_weights import release_hold

    release_hold(model)  # (a skeleton whose weights were on the engines holds them here again)
    expected = [tuple(w.shape) for w in model.get_weights()]
    received = [tuple(w.shape) for w in result.weights]
    if expected != received:
        _mismatch(expected, received)
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
