"""Layer weights that exist without values until the engine that owns them fills them.

Under model parallelism no engine should hold the whole model. Inside `weights_without_values()`
every weight a layer adds (`Layer.add_weight`, which every Keras layer builds through) is made
with Keras' deferred initialisation, the mechanism of `keras.StatelessScope`: the variable has
its shape, dtype and initialiser (with the initialiser's own seed) but no value, and nothing is
allocated. The layer graph is whole, so a stage or slice can be cut from it; its owner then
gives each of its weights a value (`fill`: the notebook's, or the initialiser's). Variables
that are not layer weights (optimizer, metrics, seed generators) are made as usual.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def weights_without_values():
    """Within: layer weights are created without values (see the module's docstring)."""
    import keras

    with _without_values(keras.layers.Layer, "add_weight"):
        yield


@contextlib.contextmanager
def slots_without_values():
    """Within: an optimizer's variables (its slots, when it is built) are created without values, for the caller
    to `fill` one at a time (the notebook's slots arrive while the engine holds its part already)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    with _without_values(BaseOptimizer, "add_variable"):
        yield


@contextlib.contextmanager
def _without_values(cls, method: str):
    """Within: every variable `cls.method` makes is made with Keras' deferred initialisation."""
    import keras
    from keras.src.backend.common import global_state

    original = getattr(cls, method)

    def deferred(owner, *args, **kwargs):
        with keras.StatelessScope(initialize_variables=False):
            variable = original(owner, *args, **kwargs)
        # Keras initialises every deferred variable when its next outermost stateless scope ends: not these
        pending = global_state.get_global_attribute("uninitialized_variables") or []
        global_state.set_global_attribute("uninitialized_variables", [v for v in pending if v is not variable])
        return variable

    setattr(cls, method, deferred)
    try:
        yield
    finally:
        setattr(cls, method, original)


def is_empty(variable) -> bool:
    """Whether the variable has no value yet (made inside `weights_without_values`)."""
    return getattr(variable, "_value", 0) is None


def any_empty(variables) -> bool:
    return any(is_empty(v) for v in variables)


def fill(variable, value=None) -> None:
    """Give `variable` the value `value`, or its initialiser's when None; an empty variable is allocated now."""
    import tensorflow as tf

    if not is_empty(variable):
        if value is not None:
            variable.assign(value)
        return
    with tf.init_scope():
        if value is None:
            variable._initialize_with_initializer(variable._initializer)
        else:
            variable._initialize(tf.convert_to_tensor(value, dtype=variable.dtype))
    variable._initializer = None


def finalize_states(model) -> None:
    """Once `model`'s weights hold their values (`fill`), let each of its layers recompute what it derives from them:
    an adapted `Normalization` keeps its mean and variance as tensors computed from its weights, not read through
    them, so a weight assigned later is not seen until then (Keras' own weight loading does the same)."""
    for layer in model._flatten_layers(include_self=True, recursive=True):
        finalize = getattr(layer, "finalize_state", None)
        if finalize is not None and layer.built and not any_empty(layer.weights):
            finalize()


def empty(variable) -> None:
    """Drop the variable's value (its memory freed). It keeps an initialiser (zeros where it had none left), as
    Keras' tracing of a layer reads one from a variable without a value."""
    variable._value = None
    if variable._initializer is None:
        import keras

        variable._initializer = keras.initializers.Zeros()


@contextlib.contextmanager
def materialized(variables):
    """Within: the empty ones among `variables` hold their initialisers' values; empty again after (their
    memory freed). For work that needs values but not the true ones, such as timing a layer."""
    made = [(v, v._initializer) for v in variables if is_empty(v)]
    for variable, _ in made:
        fill(variable)
    try:
        yield
    finally:
        for variable, initializer in made:
            variable._value, variable._initializer = None, initializer


def variable_bytes(variable) -> int:
    """A variable's bytes from its shape and dtype (it may have no value yet)."""
    import numpy as np

    return int(np.prod(variable.shape, dtype=np.int64)) * np.dtype(str(variable.dtype)).itemsize
