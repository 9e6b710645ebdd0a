"""The engine's share of a tensor-parallel model, made from the cell's model in place, and the whole model back in
the kernel.

`split_in_place` turns the engine's copy of the cell's model (any model: Sequential, functional, subclassed,
nested) into this engine's share: each split layer, where it sits, computes on this engine's slices of its
variables (`layers.split_class`), given their values (fetched from the kernel, see `nbdist.model_parts.desk`, so the
model here may have had no values); its compile, with the cell's own functions, is the cell's. `whole` joins
every engine's slices of the weights and of the optimizer's slots, in the kernel, into what a local `fit` leaves;
`state_parts` (on the engines) and `whole_state` (in the kernel) do the same for everything else the model reaches
(the optimizers of a `train_step` of its own, a GAN's two), by the state walk's addresses.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ...keras_semantics import optimizer_state
from ...keras_semantics.empty_weights import fill, finalize_states
from ..desk import join, taken
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


def draw_alike(model, rank: int, broadcast) -> None:
    """Every random-number generator of this engine's model (Keras' `SeedGenerator`s: a Dropout's, an augmentation
    layer's) takes rank 0's state (`broadcast`: rank 0's list of arrays, on every engine): a replicated layer (a
    Dropout on gathered activations) then draws on every engine what one model would draw once, so the engines
    compute the same values, and what the one model of `--strategy local` on rank 0's engine would draw (before,
    each engine restarted its generators from the seed and their place, which no one model draws). A split layer's
    generators are offset by the rank (its slice's randomness is its own, as Megatron-LM's model-parallel RNG)."""
    split = {id(inner) for layer in model._flatten_layers(include_self=False, recursive=True)
             if hasattr(layer, "_nbdist_split") for inner in layer._flatten_layers(include_self=True, recursive=True)}
    generators = [(layer, generator) for layer in model._flatten_layers(include_self=True, recursive=True)
                  for generator in layer._seed_generators]
    states = broadcast([np.asarray(generator.state.numpy()) for _, generator in generators])
    for (layer, generator), state in zip(generators, states):
        state = np.array(state)
        if id(layer) in split:
            state[0] = (int(state[0]) + rank * 104729) % 2 ** 31
        generator.state.assign(state.astype(generator.state.dtype))


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


def state_parts(model, axes: list[int | None], rank: int) -> tuple:
    """Engine side, after the fit: what the fit's model reaches besides its weights and `model.optimizer` (the state
    walk, `keras_semantics.state_walk`: the other optimizers a `train_step` of its own applies, a GAN's
    `d_optimizer` and `g_optimizer`, their iterations and slots; metrics; seed generators), for the notebook:
    (rank 0's capture of it without the variables every engine hands in (None on the other ranks), the addresses
    of `model.weights` and of `model.optimizer.variables` (rank 0's), {address: this engine's slice} of the other
    split variables (each slot of a split variable, whatever optimizer holds it), {address: its axis}). A slot
    of another shape than its split variable (a factored one) cannot be joined: the capture says it stayed."""
    from ...keras_semantics.state_walk import Walk, capture

    with as_written(model):  # (the layers' own classes, as the notebook holds them)
        walk = Walk({"model": model})
        axis_of = _split_variables(walk, model, axes)
        handed = {id(v) for v in [*model.weights, *model.optimizer.variables]}
        split = {address: axis_of[id(v)] for address, v in walk.variables.items()
                 if id(v) in axis_of and id(v) not in handed}
        unjoinable = _unjoinable(walk, axis_of)
        skip = handed | unjoinable | {id(walk.variables[a]) for a in split}
        parts = {address: taken(walk.variables[address]) for address in split}  # (each freed as it goes)
        if rank != 0:
            return None, None, parts, split
        state = capture(walk.roots, walk=walk, skip=skip)
        state.left.update({address: "a slot of another shape than its split variable (each engine holds its own): "
                                    "it stayed on the engines"
                           for address, variable in walk.variables.items() if id(variable) in unjoinable})
        addresses = {"weights": [walk.address_of(v) for v in model.weights],
                     "optimizer": [walk.address_of(v) for v in model.optimizer.variables]}
        return state, addresses, parts, split


def _optimizer_slots(walk) -> list[tuple[object, object]]:
    """(slot, the variable it follows) of every built optimizer the walk reached (Keras keeps each slot list, Adam's
    `_momentums` and the like, as long as the variables it was built over, in their order)."""
    import keras

    pairs = []
    for address, kind in walk.kinds.items():
        optimizer = walk.objects[address] if kind == "optimizer" else None
        over = list(getattr(optimizer, "_trainable_variables", None) or [])
        for name, value in (vars(optimizer).items() if over else ()):
            if name in ("_trainable_variables", "_variables") or not isinstance(value, (list, tuple)):
                continue
            if len(value) == len(over) and all(v is None or isinstance(v, keras.Variable) for v in value):
                pairs += [(slot, variable) for slot, variable in zip(value, over) if slot is not None]
    return pairs


def _split_variables(walk, model, axes: list[int | None]) -> dict[int, int]:
    """{id: split axis} of the split variables the walk reached: the model's split weights and every optimizer's
    slots of them (of the same shape)."""
    axis_of = {id(w): axis for w, axis in zip(model.weights, axes) if axis is not None}
    for slot, variable in _optimizer_slots(walk):
        if id(variable) in axis_of and tuple(slot.shape) == tuple(variable.shape):
            axis_of[id(slot)] = axis_of[id(variable)]
    return axis_of


def _unjoinable(walk, axis_of: dict[int, int]) -> set[int]:
    return {id(slot) for slot, variable in _optimizer_slots(walk)
            if id(variable) in axis_of and id(slot) not in axis_of}


def whole_state(state, addresses: dict, weights: list, optimizer: list, parts: list[dict], split: dict):
    """Kernel side: rank 0's capture (`state_parts`) with every variable it left out: the joined weights and
    `model.optimizer` variables (`whole`), and every other split variable joined from each rank's `parts`."""
    import dataclasses

    values = dict(state.values)
    values.update(zip(addresses["weights"], weights))
    values.update(zip(addresses["optimizer"], optimizer))
    values.update({address: join([part[address] for part in parts], axis) for address, axis in split.items()})
    return dataclasses.replace(state, values=values)


def engine_bytes(model) -> dict:
    """Bytes of the model's variables and of its optimizer's slots on this engine."""
    variables = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.weights)
    slots = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize
                for per in optimizer_state.slots(model.optimizer, model.trainable_variables) for v in per.values())
    return {"variables": variables, "slots": slots, "total": variables + slots}
