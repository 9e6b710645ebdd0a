"""The engine's share of a tensor-parallel model, built from the cell's, and the whole model back in the kernel.

`parallel_model` clones the cell's model (Sequential or functional: the clone follows its graph) with each split
layer replaced by its split class (`layers.SPLIT_LAYERS`) holding this engine's slice of the weights (`values`:
fetched from the kernel, see `nbdist.model_parts`, so the cell's model itself may have no values here), and
compiles it as the cell compiled its own. `whole` joins every engine's slices of the weights and of the
optimizer's slots, in the kernel, into what a local `fit` leaves.
"""

from __future__ import annotations

import numpy as np

from .. import optimizer_state
from ..empty_weights import fill, finalize_states, weights_without_values
from ..errors import OptionError
from ..model_parts import join
from ..model_sync import compile_like
from .plan import split_axes


SPLIT_PREFIX = "nbdist_tp_"  # the names of the split layers in an engine's model


def parallel_model(model, plan: list[dict], rank: int, size: int, values: list):
    """This engine's model: the cell's layers, split ones replaced by their slices, given `values` (this engine's
    slice of each of `model.weights`, or the whole of a replicated one); compiled like the cell's."""
    import keras

    from .layers import SPLIT_LAYERS  # defines Keras layers: imported here, so nbdist never imports TensorFlow early

    by_name = {entry["name"]: (i, entry) for i, entry in enumerate(plan)}

    def clone(layer):
        i, entry = by_name.get(layer.name, (None, {"kind": "replicated"}))  # (a functional model's inputs)
        if entry["kind"] == "replicated":
            try:
                return layer.__class__.from_config(layer.get_config())
            except Exception:  # noqa: BLE001 - a notebook's layer whose config does not remake it: the layer itself
                return layer  # (shared with the cell's model: a replicated layer's variables are the same anyway)
        return SPLIT_LAYERS[entry["kind"]](layer.get_config(), rank, size, f"{SPLIT_PREFIX}{i}", gathers=entry["gathers"])

    compiled, model.compiled = model.compiled, False  # (clone_model would compile the clone: compiled below)
    try:
        with weights_without_values():  # each weight allocated as it takes its value, which `values` then lets go of
            parallel = keras.models.clone_model(model, clone_function=clone)
            parallel.build(model.input_shape)
    finally:
        model.compiled = compiled
    for i, twin in enumerate(twins(model, parallel)):
        fill(twin, values[i])
        values[i] = None
    finalize_states(parallel)  # (an adapted Normalization's statistics)
    try:
        compile_like(parallel, model)  # (its optimizer built later, with the notebook's slots)
    except Exception as exc:  # a loss or metric defined in the notebook without registration, say
        raise OptionError(f"--strategy tensor compiles each engine's share of the model as the cell compiled its "
                          f"own and could not ({type(exc).__name__}: {exc}); register the cell's own losses and "
                          "metrics with keras.saving.register_keras_serializable, or pass Keras' by name.") from None
    parallel.jit_compile = False  # XLA cannot compile Horovod's ops
    return parallel


def draw_alike(parallel, seed: int, rank: int) -> None:
    """Restart every random-number generator of this engine's model from `seed` (the same on every engine) and its
    place in the model: a replicated layer (a Dropout on gathered activations, an augmentation layer) then draws
    on every engine what one model would draw once, so the engines compute the same values; a split layer's
    generators are offset by the rank (its slice's randomness is its own, as Megatron-LM's model-parallel RNG)."""
    import numpy as np

    k = 0
    for top in parallel.layers:
        split = top.name.startswith(SPLIT_PREFIX)
        for layer in top._flatten_layers(include_self=True, recursive=True):
            for generator in layer._seed_generators:
                value = (seed * 1000003 + k * 7919 + (rank * 104729 if split else 0)) % 2 ** 31
                generator.state.assign(np.array([value, 0]).astype(generator.state.dtype))
                k += 1


def weight_axes(plan: list[dict], model) -> list[int | None]:
    """The split axis of each of `model.weights` (None: replicated), in their order."""
    axis_of = {}
    for layer, entry in zip(model.layers, plan):
        axis_of.update({id(w): axis for w, axis in zip(layer.weights, split_axes(entry["kind"], layer))})
    return [axis_of.get(id(w)) for w in model.weights]


def trainable_axes(model, axes: list[int | None]) -> list[int | None]:
    """The split axis of each of `model.trainable_variables` (`axes`: of each of `model.weights`): the axes of
    the optimizer's slots, which follow the trainable variables."""
    trainable = {id(v) for v in model.trainable_variables}
    return [axis for v, axis in zip(model.weights, axes) if id(v) in trainable]


def twins(model, parallel) -> list:
    """The variable of `parallel` that stands for each of `model.weights` (its slice, or itself replicated)."""
    twin_of = {}
    for layer, twin in zip(model.layers, parallel.layers):
        twin_of.update({id(w): t for w, t in zip(layer.weights, twin.weights)})
    return [twin_of[id(w)] for w in model.weights]


def whole(parts: list[tuple[list, list, dict]]) -> tuple[list, list]:
    """Kernel side: the whole weights and optimizer variables from every rank's trained part (in rank order:
    weights, optimizer variables, and the header naming each one's split axis and the optimizer's prefix)."""
    header = parts[0][2]
    axes, slot_axes, prefix = header["axes"], header["slot_axes"], int(header["prefix"])
    weights = [join([p[0][j] for p in parts], axis) for j, axis in enumerate(axes)]
    first = parts[0][1]
    per = (len(first) - prefix) // len(slot_axes) if slot_axes else 0
    slots = [join([p[1][k] for p in parts], slot_axes[(k - prefix) // per]) for k in range(prefix, len(first))]
    return weights, list(first[:prefix]) + slots


def engine_bytes(model) -> dict:
    """Bytes of the model's variables and of its optimizer's slots on this engine."""
    variables = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.weights)
    slots = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize
                for per in optimizer_state.slots(model.optimizer, model.trainable_variables) for v in per.values())
    return {"variables": variables, "slots": slots, "total": variables + slots}
