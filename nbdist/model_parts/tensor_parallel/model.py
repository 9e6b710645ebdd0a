"""The engine's share of a tensor-parallel model, made from the cell's model in place, and the whole model back in
the kernel.

`split_in_place` turns the engine's copy of the cell's model (any model: Sequential, functional, subclassed,
nested) into this engine's share: each split layer, where it sits, computes on this engine's slices of its
variables (`layers.split_class`), given their values (fetched from the kernel, see `nbdist.model_parts.desk`, so the
model here may have had no values); its compile, with the cell's own functions, is the cell's. `whole` joins
every engine's slices of the weights and of the optimizer's slots, in the kernel, into what a local `fit` leaves.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ...keras_semantics import optimizer_state
from ...keras_semantics.empty_weights import fill, finalize_states
from ..desk import join
from .plan import einsum_split, leaf_layers, split_axes


TAG_PREFIX = "nbdist_tp_"  # the names of the split layers' collectives


def split_in_place(model, plan: list[dict], rank: int, size: int, values: list):
    """Make `model` this engine's share, where each layer sits: every split layer computes on this engine's slices
    (`layers.split_class`), its variables replaced by slices holding `values` (this engine's slice of each of
    `model.weights`, in their order, which stays); every other variable takes its whole value. The model keeps
    its graph or `call`, its compile (the cell's own losses and metrics) and its optimizer, not yet built.
    Returns what makes it whole-shaped again after the fit (`undo()`: its own classes and its earlier variables,
    released), so the cell's code after `fit` on the engine sees the model's shapes."""
    from .layers import split_class  # defines Keras layers: imported here, so nbdist never imports TensorFlow early

    axes = weight_axes(plan, model)
    replacement = {}
    for i, (variable, axis) in enumerate(zip(model.weights, axes)):
        if axis is None:
            fill(variable, values[i])
        else:
            replacement[id(variable)] = _variable_like(variable, values[i])
        values[i] = None
    originals = {id(new): old for old in model.weights if id(old) in replacement
                 for new in [replacement[id(old)]]}
    for owner in model._flatten_layers(include_self=True, recursive=True):
        _replace_variables(owner, replacement)
    for i, ((_, layer, _), entry) in enumerate(zip(leaf_layers(model), plan)):
        kind = entry["kind"]
        if kind == "replicated":
            continue
        tag = f"{TAG_PREFIX}{i}"
        _mark(layer, {"kind": kind, "tag": tag, "size": size, "gathers": entry["gathers"]})
        if kind == "heads":
            for name, sub in (("query", "head_projection"), ("key", "head_projection"),
                              ("value", "head_projection"), ("output", "summed_projection")):
                part = getattr(layer, f"_{name}_dense")
                _mark(part, {"kind": sub, "tag": f"{tag}_{name}", "size": size})
                object.__setattr__(part, "__class__", split_class(type(part), sub))
            continue
        if kind == "einsum":
            layer._nbdist_split.update(einsum_split(layer.get_config()))
        if kind == "row":
            layer.input_spec = None  # (its input is the previous layer's slice)
        object.__setattr__(layer, "__class__", split_class(type(layer), kind))
    finalize_states(model)  # (an adapted Normalization's statistics)
    model.jit_compile = False  # XLA cannot compile Horovod's ops
    _fresh_functions(model)

    def undo() -> None:
        for owner in model._flatten_layers(include_self=True, recursive=True):
            _replace_variables(owner, originals)
            original = getattr(type(owner), "_nbdist_original_class", None)
            if original is not None:
                object.__setattr__(owner, "__class__", original)
        _fresh_functions(model)  # (the earlier variables were released before the split: no values come back)

    return undo


def _fresh_functions(model) -> None:
    """Forget what a fit traced over, and an optimizer built for, other variables (another strategy's fit on this
    engine before, or this share's slices after)."""
    model.train_function = model.test_function = model.predict_function = None
    if model.optimizer is not None and model.optimizer.built:
        model.optimizer = model.optimizer.__class__.from_config(model.optimizer.get_config())


def _mark(layer, split: dict) -> None:
    object.__setattr__(layer, "_nbdist_split", split)  # (past Keras' tracking of attributes)
    object.__setattr__(layer, "_nbdist_calls", 0)  # (its calls counted from this split on, alike on every engine)


def _variable_like(variable, value):
    """A variable standing for `variable` (its name, dtype, trainability) holding `value`, a slice of it."""
    import keras

    return keras.Variable(initializer=np.asarray(value), dtype=variable.dtype, trainable=variable.trainable,
                          name=variable.name)


def _replace_variables(layer, replacement: dict) -> None:
    """Swap the variables `layer` holds itself for their replacements (by id), in its lists (keeping their order)
    and in its attributes (`kernel`, `_kernel`, `bias`, `embeddings`...)."""
    for listed in ("_trainable_variables", "_non_trainable_variables"):
        variables = getattr(layer, listed, None)
        if variables:
            variables[:] = [replacement.get(id(v), v) for v in variables]
    for name, value in list(vars(layer).items()):
        if id(value) in replacement:
            object.__setattr__(layer, name, replacement[id(value)])


@contextlib.contextmanager
def as_written(model):
    """Within: every split layer of `model` is of its own class again (for Keras' serialization of its config,
    which names the class)."""
    swapped = [(layer, layer.__class__) for layer in model._flatten_layers(include_self=False, recursive=True)
               if hasattr(type(layer), "_nbdist_original_class")]
    for layer, cls in swapped:
        object.__setattr__(layer, "__class__", cls._nbdist_original_class)
    try:
        yield
    finally:
        for layer, cls in swapped:
            object.__setattr__(layer, "__class__", cls)


def draw_alike(model, seed: int, rank: int) -> None:
    """Restart every random-number generator of this engine's model from `seed` (the same on every engine) and its
    place in the model: a replicated layer (a Dropout on gathered activations, an augmentation layer) then draws
    on every engine what one model would draw once, so the engines compute the same values; a split layer's
    generators are offset by the rank (its slice's randomness is its own, as Megatron-LM's model-parallel RNG)."""
    split = {id(inner) for layer in model._flatten_layers(include_self=False, recursive=True)
             if hasattr(layer, "_nbdist_split") for inner in layer._flatten_layers(include_self=True, recursive=True)}
    k = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for generator in layer._seed_generators:
            value = (seed * 1000003 + k * 7919 + (rank * 104729 if id(layer) in split else 0)) % 2 ** 31
            generator.state.assign(np.array([value, 0]).astype(generator.state.dtype))
            k += 1


def weight_axes(plan: list[dict], model) -> list[int | None]:
    """The split axis of each of `model.weights` (None: replicated), in their order."""
    axis_of = {}
    for (_, layer, _), entry in zip(leaf_layers(model), plan):
        axis_of.update({id(w): axis for w, axis in zip(layer.weights, split_axes(entry["kind"], layer))})
    return [axis_of.get(id(w)) for w in model.weights]


def trainable_axes(model, axes: list[int | None]) -> list[int | None]:
    """The split axis of each of `model.trainable_variables` (`axes`: of each of `model.weights`): the axes of
    the optimizer's slots, which follow the trainable variables."""
    trainable = {id(v) for v in model.trainable_variables}
    return [axis for v, axis in zip(model.weights, axes) if id(v) in trainable]


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
