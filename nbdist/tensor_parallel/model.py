"""The engine's share of a tensor-parallel model, built from the cell's, and the whole model back.

`parallel_model` clones the cell's model (Sequential or functional: the clone follows its graph) with each split layer replaced by its split
class (`layers.SPLIT_LAYERS`) holding this engine's slice of the weights, and compiles it as the
cell compiled its own (a fresh optimizer of the same configuration). `reassemble` gathers every
engine's slices of the weights and of the optimizer's slots into the cell's model and its optimizer,
as a local `fit` leaves them.
"""

from __future__ import annotations

import numpy as np

from .. import optimizer_state
from ..errors import OptionError
from .plan import split_axes


def _slice(array: np.ndarray, axis: int | None, rank: int, size: int) -> np.ndarray:
    if axis is None:
        return array
    return np.array_split(array, size, axis=axis)[rank]


def parallel_model(model, plan: list[dict], rank: int, size: int):
    """This engine's model: the cell's layers, split ones replaced by their slices; compiled like the cell's."""
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
        return SPLIT_LAYERS[entry["kind"]](layer.get_config(), rank, size, f"nbdist_tp_{i}", gathers=entry["gathers"])

    parallel = keras.models.clone_model(model, clone_function=clone)
    parallel.build(model.input_shape)
    for layer, twin, entry in zip(model.layers, parallel.layers, plan):
        axes = split_axes(entry["kind"], layer)
        twin.set_weights([_slice(w, axis, rank, size) for w, axis in zip(layer.get_weights(), axes)])
    try:
        parallel.compile_from_config(model.get_compile_config())
    except Exception as exc:  # a loss or metric defined in the notebook without registration, say
        raise OptionError(f"--strategy tensor compiles each engine's share of the model as the cell compiled its "
                          f"own and could not ({type(exc).__name__}: {exc}); register the cell's own losses and "
                          "metrics with keras.saving.register_keras_serializable, or pass Keras' by name.") from None
    parallel.jit_compile = False  # XLA cannot compile Horovod's ops
    return parallel


def variable_axes(plan: list[dict], model) -> list[int | None]:
    """The split axis of each of `model`'s trainable variables (None: replicated), in their order."""
    axes = []
    for layer, entry in zip(model.layers, plan):
        per = split_axes(entry["kind"], layer)
        trainable = {id(v) for v in layer.trainable_weights}
        axes += [axis for w, axis in zip(layer.weights, per) if id(w) in trainable]
    return axes


def gather(hvd, array: np.ndarray, axis: int | None, name: str) -> np.ndarray:
    """Every engine's slice of `array` along `axis`, concatenated in rank order (None: this engine's own)."""
    if axis is None:
        return array
    import tensorflow as tf

    moved = np.moveaxis(array, axis, 0)
    return np.moveaxis(hvd.allgather(tf.convert_to_tensor(moved), name=name, ignore_name_scope=True).numpy(), 0, axis)


def reassemble(hvd, model, parallel, plan: list[dict]) -> None:
    """The whole weights and optimizer state of `parallel` (every engine's slices) into `model`."""
    for i, (layer, twin, entry) in enumerate(zip(model.layers, parallel.layers, plan)):
        axes = split_axes(entry["kind"], layer)
        layer.set_weights([gather(hvd, w, axis, f"nbdist_tp_weights_{i}_{j}")
                           for j, (w, axis) in enumerate(zip(twin.get_weights(), axes))])
    names = [f"t{i:04d}" for i in range(len(model.trainable_variables))]
    slots, step = optimizer_state.export(parallel.optimizer, parallel.trainable_variables, names)
    axes = dict(zip(names, variable_axes(plan, model)))
    whole = {key: gather(hvd, array, axes[key.split(":", 1)[0]], f"nbdist_tp_slot_{n}")
             for n, (key, array) in enumerate(sorted(slots.items()))}
    optimizer_state.load(model.optimizer, model.trainable_variables, names, whole, step)


def engine_bytes(model) -> dict:
    """Bytes of the model's variables and of its optimizer's slots on this engine."""
    variables = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.weights)
    slots = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize
                for per in optimizer_state.slots(model.optimizer, model.trainable_variables) for v in per.values())
    return {"variables": variables, "slots": slots, "total": variables + slots}
