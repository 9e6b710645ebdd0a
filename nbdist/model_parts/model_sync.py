"""The notebook's Keras models are the source of truth: before a run, engines get what changed.

A training cell that uses a model the notebook already holds (``model.fit(...)`` after a
first run, after ``model.load_weights``, after freezing layers and recompiling) trains that
model as it is in the notebook: its weights, every layer's `trainable` flag, its compile
configuration (optimizer, loss, metrics) and its optimizer's state. Each engine reports a
digest of its own copy; only engines whose digest differs receive the state, and an engine
that has no copy (or one of another architecture) receives the whole model.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

ENGINE_MODELS = "__nbdist_model_digests__"


def free_names(python: str) -> list[str]:
    """Names the cell reads before it binds them (top-level statements, in order)."""
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return []
    bound: set[str] = set()
    free: list[str] = []
    for statement in tree.body:
        loads = [n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        free += [name for name in loads if name not in bound and name not in free]
        bound |= {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return free


def models_used(python: str, namespace: dict) -> dict:
    """The notebook's Keras models the cell uses before rebinding their names, itself or through the notebook's
    functions it calls (a loop's `train_step`): {name: model}."""
    import keras

    from ..keras_semantics.training_code import globals_read

    free = free_names(python)
    return {name: namespace[name] for name in dict.fromkeys([*free, *globals_read(free, namespace)])
            if isinstance(namespace.get(name), keras.Model)}


def own_classes(models, namespace: dict) -> list[str]:
    """The names of the notebook's own classes (a custom layer, a subclassed model) these models are made of:
    an engine needs them before it can unpickle the models."""
    used = {type(layer) for model in models for layer in _layers(model)}
    return [name for name, value in namespace.items()
            if isinstance(value, type) and value in used and value.__module__ == "__main__"]


def own_functions(model) -> dict:
    """The notebook's own functions the model's saved form names only by name: a `Lambda`'s function, a loss or
    metric the notebook defined (a closure too, as keras.io's `loss(margin)` returns). Keras looks them up by
    name when it rebuilds the model; an engine gets them by value (`functions_blob`)."""
    import types

    import keras

    found = [getattr(layer, "function", None) for layer in _layers(model) if isinstance(layer, keras.layers.Lambda)]
    config = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    for key in ("loss", "metrics", "weighted_metrics"):
        found += keras.tree.flatten(config.get(key)) if config.get(key) is not None else []
    return {f.__name__: f for f in found if isinstance(f, types.FunctionType) and f.__module__ == "__main__"}


def functions_blob(model) -> bytes | None:
    """`own_functions(model)`, pickled by value (cloudpickle), or None when it has none."""
    import cloudpickle

    functions = own_functions(model)
    return cloudpickle.dumps(functions) if functions else None


def rebuild_error(model) -> str | None:
    """Why Keras cannot rebuild `model` from its saved form on another process (a layer class of the notebook's
    whose __init__ does not take what its get_config gives), or None. Such a model travels as the notebook's
    statements that made it, its state installed after (`install`)."""
    for layer in _layers(model):
        cls = type(layer)
        if cls.__module__ != "__main__":
            continue
        try:
            cls.from_config(layer.get_config())
        except Exception as exc:  # noqa: BLE001 - whatever Keras' own rebuild would fail on
            return f"its layer class {cls.__name__} cannot be rebuilt from its config ({type(exc).__name__}: " \
                   f"{str(exc)[:120]})"
    return None


def _layers(model):
    """The model and all its layers, depth first (the same order on every process)."""
    yield model
    for layer in getattr(model, "layers", []):
        yield from _layers(layer)


def architecture(model) -> str:
    """What must match for weights to carry over: layer classes and weight shapes."""
    parts = [type(layer).__name__ for layer in _layers(model)] + [str(tuple(w.shape)) for w in model.weights]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@dataclass
class ModelState:
    """Everything of a model a `fit` depends on, besides its architecture."""

    architecture: str
    weights: list
    trainable: list
    compile: dict = field(default_factory=dict)
    optimizer: list | None = None  # the optimizer's variables, when it has been built
    trainable_count: int = 0  # how many trainable variables the optimizer's slots follow
    kept: dict | None = None  # where the weights stay when not in the notebook (`kept_weights`): no values here
    seeds: dict = field(default_factory=dict)  # its seed generators' states by the state walk's address (a Dropout's:
    # Keras' pickling draws a new one, so an engine's copy would drop other units than the notebook's)

    @classmethod
    def of(cls, model) -> "ModelState":
        optimizer = getattr(model, "optimizer", None)
        built = optimizer is not None and getattr(optimizer, "built", False)
        kept = getattr(model, "_nbdist_kept", None)
        if kept is not None:
            return cls(architecture(model), [], [bool(layer.trainable) for layer in _layers(model)],
                       model.get_compile_config() if model.compiled else {}, None, len(model.trainable_variables),
                       dict(kept))
        return cls(architecture(model), [np.asarray(w) for w in model.get_weights()],
                   [bool(layer.trainable) for layer in _layers(model)],
                   model.get_compile_config() if model.compiled else {},
                   [np.asarray(v.numpy()) for v in optimizer.variables] if built else None,
                   len(model.trainable_variables), seeds=seed_states(model))

    @property
    def compile_text(self) -> str:
        return compile_text(self.compile)

    def settings(self) -> "ModelState":
        """This state without the values: what an engine that fills only its own part of the model gets
        (trainable flags and compile configuration)."""
        return ModelState(self.architecture, None, self.trainable, self.compile, None, self.trainable_count,
                          seeds=self.seeds)

    def part(self, weight_index: list[int], trainable_index: list[int], prefix: int, axes: list | None = None,
             slot_axes: list | None = None, rank: int = 0, size: int = 1) -> tuple[list, list | None]:
        """The values of the weights at `weight_index` and, where the optimizer was built, its first `prefix`
        variables (iterations, learning rate) then the slots of the trainable variables at `trainable_index`
        (Keras keeps each variable's slots together, in the order of the trainable variables). With `axes` (one
        per weight, None for whole) and `slot_axes` (one per trainable variable): rank `rank`'s slice of each of
        `size` (`tensor`)."""
        from .desk import cut, slot_indices, slots_per_variable

        axes = axes or [None] * len(weight_index)
        slot_axes = slot_axes or [None] * len(trainable_index)
        weights = [cut(self.weights[i], axis, rank, size) for i, axis in zip(weight_index, axes)]
        trainable = self.trainable_count
        if self.optimizer is None or not trainable or (len(self.optimizer) - prefix) % trainable:
            return weights, None
        per = slots_per_variable(len(self.optimizer), prefix, trainable)
        slots = [cut(self.optimizer[k], axis, rank, size)
                 for i, axis in zip(trainable_index, slot_axes) for k in slot_indices(prefix, per, i)]
        return weights, list(self.optimizer[:prefix]) + slots

    def digest(self) -> str:  # (of a state with values)
        h = hashlib.sha256(self.architecture.encode())
        for array in self.weights + (self.optimizer or []):
            h.update(np.ascontiguousarray(array).tobytes())
        h.update(json.dumps(self.trainable).encode())
        h.update(self.compile_text.encode())
        h.update(b"built" if self.optimizer is not None else b"fresh")
        h.update(json.dumps(self.kept, sort_keys=True).encode())
        for address in sorted(self.seeds):
            h.update(address.encode() + np.ascontiguousarray(self.seeds[address]).tobytes())
        return h.hexdigest()[:24]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.weights or []) + (self.optimizer or []))


def seed_states(model) -> dict:
    """{address: state} of the seed generators `model` reaches (`state_walk` addresses), and {address: seed} of its
    layers' random initializers made without a seed: Keras draws one when the layer is made (Python's `random`)
    and draws again when it remakes the layer from its config, so a layer built on the engine (a subclassed
    model's, at its first call) would start from other weights than it does in the notebook."""
    from ..keras_semantics.state_walk import Walk

    walk = Walk({"model": model})
    seeds = [a for a, kind in walk.kinds.items() if kind == "seed"]
    states = {a: np.asarray(walk.objects[a].state.numpy()) for a in seeds}
    return states | {address: initializer.seed for address, initializer in _drawn_initializers(walk).items()}


def install_seeds(model, seeds: dict) -> None:
    """Engine side: the notebook's seed generator states and initializer seeds into this engine's copy of `model`."""
    from ..keras_semantics.empty_weights import fill
    from ..keras_semantics.state_walk import Walk

    walk = Walk({"model": model})
    initializers = _drawn_initializers(walk)
    for address, value in seeds.items():
        if address in initializers:
            initializers[address].seed = int(value)
            continue
        generator = walk.objects.get(address)
        if generator is not None and tuple(generator.state.shape) == tuple(np.shape(value)):
            fill(generator.state, value)  # (made empty with the weights, where they were)


def _drawn_initializers(walk) -> dict:
    """{"<layer address>:<attribute>": initializer} of the random initializers made without a seed of the layers
    of `walk` not built yet (`<layer>.kernel_initializer`; a built layer's weights are made already)."""
    import keras
    from keras.src.initializers.random_initializers import RandomInitializer

    found = {}
    for address, layer in walk.objects.items():
        if not isinstance(layer, keras.layers.Layer) or layer.built:
            continue
        for attribute, value in sorted(vars(layer).items()):
            if isinstance(value, RandomInitializer) and value._init_seed is None and isinstance(value.seed, int):
                found[f"{address}:{attribute}"] = value
    return found


def compile_text(config: dict) -> str:
    """A compile configuration as text, without the optimizer's name (Keras numbers names per process, sgd,
    sgd_1, ...: the same optimizer reads differently on two engines)."""
    config = json.loads(json.dumps(config, default=str))
    optimizer = config.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("config"), dict):
        optimizer["config"].pop("name", None)
    return json.dumps(config, sort_keys=True)


def digests(names: list[str]) -> dict:
    """Engine side: {name: (architecture, digest, compiled)} of this engine's models of these names (None if absent);
    the digest is None where the model's weights are not all here (made empty, see `keras_semantics.empty_weights`)."""
    import keras

    from ..keras_semantics.empty_weights import any_empty
    from ..host.namespace import user_namespace

    namespace = user_namespace()
    out = {}
    for name in names:
        model = namespace.get(name)
        usable = isinstance(model, keras.Model) and not getattr(model, "_nbdist_released", False)  # (model_parts)
        whole = usable and not any_empty(model.weights)
        out[name] = (architecture(model), ModelState.of(model).digest() if whole else None,
                     bool(model.compiled)) if usable else None
    return out


def install(name: str, state: ModelState, functions: bytes | None = None) -> None:
    """Engine side: make this engine's model `name` the notebook's (same architecture assumed); a state without
    values (`ModelState.settings`) sets the trainable flags and the compile configuration only; `functions`: the
    notebook's own functions its compile configuration names (`functions_blob`)."""
    import keras

    from ..keras_semantics.empty_weights import fill, finalize_states
    from ..host.namespace import user_namespace

    model = user_namespace()[name]
    for layer, trainable in zip(_layers(model), state.trainable):
        layer.trainable = trainable
    for variable, value in zip(model.weights, state.weights or []):
        fill(variable, value)  # (model.set_weights, for weights made empty too)
    if state.weights:
        finalize_states(model)  # (an adapted Normalization's statistics follow its weights)
    install_seeds(model, state.seeds)
    # a fresh optimizer in the notebook (a model rebuilt and compiled again) is fresh here too, not this engine's
    # optimizer of the last run, its steps and slots
    stale = state.optimizer is None and getattr(model, "optimizer", None) is not None and model.optimizer.built
    if state.compile and (stale or not model.compiled or compile_text(model.get_compile_config()) != state.compile_text):
        with keras.saving.custom_object_scope(_notebook_objects(user_namespace(), functions)):
            compile_as(model, state.compile)
    if state.optimizer is not None:
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        if [tuple(v.shape) for v in optimizer.variables] == [tuple(np.shape(a)) for a in state.optimizer]:
            for variable, value in zip(optimizer.variables, state.optimizer):
                fill(variable, value)  # (emptied by a model-parallel run)
    model.train_function = None  # retraced: the trainable set or the optimizer may have changed


def skeleton(model) -> dict:
    """The model without its values: what Keras saves of it besides the weights (layers, build, compile)."""
    import keras

    return keras.saving.serialize_keras_object(model)


def receive_skeleton(name: str, config: dict, functions: bytes | None = None, seeds: dict | None = None) -> None:
    """Engine side: the model `name` built from its `skeleton`, its layer weights empty
    (`keras_semantics.empty_weights`); `seeds`: its seed generators' states (`seed_states`: building draws new ones)."""
    import keras

    from ..keras_semantics.empty_weights import weights_without_values
    from ..host.namespace import NAMES_VAR, user_namespace

    namespace = user_namespace()
    compiled = config.pop("compile_config", None)  # (compiled below: Keras would build the optimizer's slots)
    with keras.saving.custom_object_scope(_notebook_objects(namespace, functions)), weights_without_values():
        namespace[name] = keras.saving.deserialize_keras_object(config)
        if compiled:
            compile_as(namespace[name], compiled)
    install_seeds(namespace[name], seeds or {})
    namespace.setdefault(NAMES_VAR, set()).add(name)


def compile_as(model, config: dict) -> None:
    """Compile `model` from a compile configuration without building its optimizer (Keras' `compile_from_config`
    builds the slots over the weights, which an engine that fills only its part has no values for)."""
    import keras

    model.compile(**keras.saving.deserialize_keras_object(config))


def receive(name: str, blob: bytes, functions: bytes | None = None, seeds: dict | None = None) -> None:
    """Engine side: the whole model, as Keras pickles it (its own saving format inside); `functions`: the
    notebook's own functions it names (`functions_blob`); `seeds`: its seed generators' states (`seed_states`)."""
    import pickle

    import keras

    from ..host.namespace import NAMES_VAR, user_namespace

    namespace = user_namespace()
    with keras.saving.custom_object_scope(_notebook_objects(namespace, functions)):
        namespace[name] = pickle.loads(blob)
    install_seeds(namespace[name], seeds or {})
    namespace.setdefault(NAMES_VAR, set()).add(name)  # released with the names the cells bound


def _notebook_objects(namespace: dict, functions: bytes | None = None) -> dict:
    """The notebook's own classes (layers, models, losses it defined, brought here before the model) and the
    functions its model names (`functions_blob`), by their names: Keras looks an unregistered one up in its
    module, __main__, which is not where a cell defines it."""
    import cloudpickle

    from ..keras_semantics.own_classes import classes

    return {**classes(namespace), **(cloudpickle.loads(functions) if functions else {})}
