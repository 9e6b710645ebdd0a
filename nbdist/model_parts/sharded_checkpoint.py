"""Checkpoints of a model no engine holds whole, in Keras' own formats, so that the notebook's `load_weights` (or
any host's) reads them:

- `pipeline` with its weights kept on the engines (`write_part`): each stage writes its layers' values and its
  optimizer slots to its own file,
  `<name>_<stage>.weights.h5`, and the last stage the index `<name>.weights.json` that maps every group of the
  whole model to the files holding it (Keras' sharded format: `model.load_weights("<name>.weights.json")`);
- `tensor` (`write_gathered`): every layer is split across all ranks, so the ranks gather one variable at a
  time (no engine ever holds more than one whole variable) and rank 0 writes the plain `<name>.weights.h5`, or
  the whole model's `<name>.keras` (its configuration and its weights, as `model.save` writes it);
- `pipeline`'s other saves (a ModelCheckpoint's `.keras` or `.weights.h5`): the stages relay their parts to the
  last stage, which writes the file with `write_gathered`, holding the whole model while it writes.

Every engine walks the whole model (its layer graph exists on every engine, the variables without values where
another engine owns them) with Keras' own saving walk, so the paths are Keras'. The optimizer's variables are
numbered as the whole model's optimizer numbers them: its counters (iterations, learning rate), then each
trainable variable's slots in turn.
"""

from __future__ import annotations

import io
import json
import pathlib
from typing import Callable

from ..errors import OptionError

INDEX_SUFFIX = ".weights.json"


def index_path(filepath) -> pathlib.Path:
    """The index of the sharded checkpoint a save to `filepath` (`x.weights.h5` or `x.weights.json`) writes."""
    path = pathlib.Path(filepath)
    for suffix in (".weights.h5", INDEX_SUFFIX):
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)] + INDEX_SUFFIX)
    raise OptionError(f"a sharded checkpoint is written to a path ending in .weights.h5 or {INDEX_SUFFIX} (Keras' "
                      f"save_weights names); received {str(filepath)!r}")


def refuse_unservable_savers(callbacks, strategy: str) -> None:
    """Before training, under a model-parallel `strategy`: a saver no engine can serve (none holds the whole
    model), with what to do instead."""
    for callback in callbacks or []:
        name = type(callback).__name__
        if name == "BackupAndRestore":
            raise OptionError(f"--strategy {strategy} cannot run BackupAndRestore yet: no engine holds the whole "
                              "model to back up. Use ModelCheckpoint(save_weights_only=True), which the engines write "
                              "together, or a data-parallel strategy.")


def with_checkpoints(callbacks, kept: list) -> list:
    """The cell's `callbacks` this engine runs: those `kept` for its rank and every ModelCheckpoint, in the
    cell's order (each engine writes its part of the checkpoint, on the same logs, so they save together)."""
    return [c for c in callbacks or [] if c in kept or type(c).__name__ == "ModelCheckpoint"]


def shard_path(index: pathlib.Path, owner: int) -> pathlib.Path:
    return index.with_name(f"{index.name[: -len(INDEX_SUFFIX)]}_{owner:05d}.weights.h5")


class Ownership:
    """Who owns what of the whole model under `pipeline`: `owner_of` maps each variable (by id) to its owner;
    `slots` maps this owner's optimizer variables to their numbers in the whole model's optimizer; `keeper`
    writes the index and the optimizer's counters."""

    def __init__(self, owner_of: dict[int, int], me: int, keeper: int, slots: dict[int, object], per: int):
        self.owner_of, self.me, self.keeper, self.slots = owner_of, me, keeper, slots
        self.per = per  # slots per trainable variable (Adam 2, SGD with momentum 1, plain SGD 0)

    @classmethod
    def of_parts(cls, parts: list[list], me: int, keeper: int, optimizer, own_trainable_index: list[int]):
        """Owner k holds the layers `parts[k]`; this owner's `optimizer` trains its trainable variables, which
        are `own_trainable_index` among the whole model's."""
        from .desk import optimizer_prefix, slot_indices, slots_per_variable

        owner_of = {id(v): k for k, layers in enumerate(parts) for layer in layers
                    for v in getattr(layer, "weights", [])}
        variables, prefix = list(optimizer.variables), optimizer_prefix(optimizer)
        per = slots_per_variable(len(variables), prefix, len(own_trainable_index))
        slots = {at: variables[k] for j, whole in enumerate(own_trainable_index)
                 for at, k in zip(slot_indices(prefix, per, whole), slot_indices(prefix, per, j))}
        if me == keeper:
            slots.update(enumerate(variables[:prefix]))
        return cls(owner_of, me, keeper, slots, per)

    def owner(self, variable) -> int:
        return self.owner_of.get(id(variable), self.keeper)

    def slot_owners(self, trainable) -> set[int]:
        """The owners whose file holds some of the optimizer's variables (`trainable`: the whole model's)."""
        return {self.keeper} | ({self.owner(v) for v in trainable} if self.per else set())


def write_part(model, filepath, ownership: Ownership) -> pathlib.Path:
    """`pipeline`: this owner's part of `model` and of its optimizer to its file of the sharded checkpoint at
    `filepath`; the keeper also writes the index. The index's path."""
    index = index_path(filepath)
    index.parent.mkdir(parents=True, exist_ok=True)
    me = ownership.me
    store = _value_store(shard_path(index, me), lambda v: v if ownership.owner(v) == me else None, ownership.owner)
    slots = {number: (lambda v=v: v.numpy()) for number, v in sorted(ownership.slots.items())}
    _walk(model, store, slots, ownership.slot_owners(model.trainable_variables))
    if me == ownership.keeper:
        config = {"metadata": {"total_size": 0},
                  "weight_map": {group: [shard_path(index, k).name for k in sorted(owners)]
                                 for group, owners in store.weight_map.items()}}
        partial = index.with_name(index.name + ".partial")  # a reader never sees half an index
        partial.write_text(json.dumps(config, indent=1))
        partial.replace(index)
    return index


def write_gathered(model, filepath, gather: Callable, slots: dict[int, Callable], writer: bool) -> pathlib.Path:
    """`tensor`: the whole `model` to the plain Keras file `filepath`, one variable at a time: `gather(variable)`
    (a collective every rank calls in the same order) gives its whole value, which the `writer` rank writes;
    `slots` gives each optimizer variable's number and its gathering."""
    path = pathlib.Path(filepath)
    whole_model = path.name.endswith(".keras")
    if not whole_model and not path.name.endswith(".weights.h5"):
        raise OptionError(f"Keras writes a model to a path ending in .keras and weights to one ending in .weights.h5; "
                          f"received {str(filepath)!r}")
    if writer:
        path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")

    def kept(whole):
        return whole if writer else None

    def walk(target, archive=None):
        store = _value_store(target, lambda variable: kept(gather(variable)), archive=archive)
        _walk(model, store, {number: (lambda g=g: kept(g())) for number, g in sorted(slots.items())}, set())

    if not writer:
        walk(io.BytesIO())  # (every rank takes part in each gather; the others write nothing)
    elif whole_model:
        _write_model_archive(model, partial, walk)
    else:
        walk(partial)
    if writer:
        partial.replace(path)
    return path


def _write_model_archive(model, path: pathlib.Path, walk: Callable) -> None:
    """A `.keras` archive of `model` as Keras' `model.save` writes one: its configuration and metadata, and the
    weights `walk` writes into it."""
    import zipfile

    from keras.src.saving import saving_lib

    config_json, metadata_json = saving_lib._serialize_model_as_json(model)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(saving_lib._METADATA_FILENAME, metadata_json)
        archive.writestr(saving_lib._CONFIG_FILENAME, config_json)
        walk(saving_lib._VARS_FNAME_H5, archive)


def _walk(model, store, slots: dict[int, Callable], slot_owners: set[int]) -> None:
    """Keras' saving walk over `model` into `store`, the optimizer's variables from `slots` (its own variables
    are not the engine's: a stage or slice trains with its own optimizer)."""
    from keras.src.saving import saving_lib

    optimizer = getattr(model, "optimizer", None)
    try:
        saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables={id(optimizer)} if optimizer is not None else set())
        if optimizer is not None:
            store.optimizer(optimizer.name, slots, slot_owners)
    finally:
        store.close()


def _value_store(path_or_io, value_of: Callable, owner_of: Callable | None = None, archive=None):
    """Keras' H5 store that writes `value_of(variable)` for each variable the walk hands it (nothing where it is
    None) and maps every group of the whole model to the owners of its values (what an index says)."""
    from keras.src.saving.saving_lib import H5IOStore

    class ValueStore(H5IOStore):
        def __init__(self):
            super().__init__(path_or_io, archive=archive, mode="w")
            self.weight_map: dict[str, set[int]] = {}
            self._metadata = None

        def make(self, path, metadata=None):
            self._metadata = metadata  # a group is made only where this engine writes a value
            return super().make(path, None)

        def __setitem__(self, key, variable):
            if owner_of is not None:
                group = f"/{self._h5_entry_path}/vars" if self._h5_entry_path else "/vars"
                self.weight_map.setdefault(group, set()).add(owner_of(variable))
            self._write(key, value_of(variable))

        def optimizer(self, name: str, slots: dict[int, Callable], owners: set[int]) -> None:
            """The whole optimizer's variables this engine writes, under their numbers (`owners`: the engines
            whose files hold some)."""
            self.make("optimizer", {"name": name})
            self.weight_map["/optimizer/vars"] = set(owners)
            for number, value in slots.items():
                self._write(str(number), value())

        def _write(self, key, value) -> None:
            if value is None:
                return
            if not self._h5_entry_initialized:
                self._create_h5_group(self._h5_entry_path, metadata=self._metadata)
            H5IOStore.__setitem__(self, key, value)

    return ValueStore()
