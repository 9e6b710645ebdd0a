"""A checkpoint of a model no engine holds whole, in Keras' own sharded format: each owner of a part of the model
writes its values to its own file (`<name>_<owner>.weights.h5`) and one owner writes the index
(`<name>.weights.json`) that maps each layer's and the optimizer's variables to the files holding them.
Keras' `model.load_weights("<name>.weights.json")` reads it on any host that holds the whole model (the
notebook's).

Every owner walks the whole model (its layer graph exists on every engine, the variables of other owners'
parts without values) with Keras' own saving walk, so the paths are Keras'; each value is written by its owner
only. The optimizer's variables are numbered as the whole model's optimizer numbers them (its iterations and
learning rate, then each trainable variable's slots in turn); each owner writes its slots under those numbers.
"""

from __future__ import annotations

import json
import pathlib

from .errors import OptionError

INDEX_SUFFIX = ".weights.json"


def index_path(filepath) -> pathlib.Path:
    """The index of the sharded checkpoint a save to `filepath` (`x.weights.h5` or `x.weights.json`) writes."""
    path = pathlib.Path(filepath)
    name = path.name
    for suffix in (".weights.h5", INDEX_SUFFIX):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)] + INDEX_SUFFIX)
    raise OptionError(f"a sharded checkpoint is written to a path ending in .weights.h5 or {INDEX_SUFFIX} (Keras' "
                      f"save_weights names); received {str(filepath)!r}")


def shard_path(index: pathlib.Path, owner: int) -> pathlib.Path:
    return index.with_name(f"{index.name[: -len(INDEX_SUFFIX)]}_{owner:05d}.weights.h5")


class Ownership:
    """Who owns what of the whole model: `owner_of` maps each variable (by id) to its owner; `slots` maps this
    owner's optimizer variables to their numbers in the whole model's optimizer; `keeper` writes the index and
    the optimizer's own counters (iterations, learning rate)."""

    def __init__(self, owner_of: dict[int, int], owners: int, me: int, keeper: int, slots: dict[int, object],
                 per: int):
        self.owner_of, self.owners, self.me, self.keeper, self.slots = owner_of, owners, me, keeper, slots
        self.per = per  # slots per trainable variable (Adam 2, SGD with momentum 1, plain SGD 0)

    def slot_owners(self, trainable) -> set[int]:
        """The owners whose shard holds some of the optimizer's variables (`trainable`: the whole model's)."""
        return {self.keeper} | ({self.owner_of[id(v)] for v in trainable if id(v) in self.owner_of} if self.per else set())

    @classmethod
    def of_parts(cls, parts: list[list], me: int, keeper: int, optimizer, own_trainable_index: list[int]):
        """Owner k holds the layers `parts[k]`; this owner's `optimizer` trains its trainable variables, which
        are `own_trainable_index` among the whole model's."""
        owner_of = {id(v): k for k, layers in enumerate(parts) for layer in layers for v in layer.weights}
        variables = list(optimizer.variables)
        prefix = optimizer_prefix(optimizer)
        per = (len(variables) - prefix) // len(own_trainable_index) if own_trainable_index else 0
        slots = {prefix + whole * per + t: variables[prefix + j * per + t]
                 for j, whole in enumerate(own_trainable_index) for t in range(per)}
        if me == keeper:
            slots.update(enumerate(variables[:prefix]))
        return cls(owner_of, len(parts), me, keeper, slots, per)


def optimizer_prefix(optimizer) -> int:
    from .model_parts import optimizer_prefix as prefix

    return prefix(optimizer)


def write_part(model, filepath, ownership: Ownership) -> pathlib.Path:
    """This owner's part of `model` (and of its optimizer) to its shard of the checkpoint at `filepath`; the
    keeper also writes the index. The index's path."""
    from keras.src.saving import saving_lib

    index = index_path(filepath)
    index.parent.mkdir(parents=True, exist_ok=True)
    shard = shard_path(index, ownership.me)
    store = _OwnValues(shard, ownership)
    try:
        skip = {id(model.optimizer)} if getattr(model, "optimizer", None) is not None else set()
        saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=skip)
        if getattr(model, "optimizer", None) is not None:
            store.optimizer(model.optimizer.name, ownership.slot_owners(model.trainable_variables))
    finally:
        store.close()
    if ownership.me == ownership.keeper:
        config = {"metadata": {"total_size": 0, "nbdist": {"owners": ownership.owners}},
                  "weight_map": {group: [shard_path(index, k).name for k in sorted(owners)]
                                 for group, owners in store.weight_map.items()}}
        partial = index.with_name(index.name + ".partial")
        partial.write_text(json.dumps(config, indent=1))
        partial.replace(index)
    return index


def _own_values_store():
    from keras.src.saving.saving_lib import H5IOStore

    class OwnValues(H5IOStore):
        """Keras' H5 store that writes only the values this owner owns, and maps every group of the whole model to
        the owners of its values (what the index says)."""

        def __init__(self, path, ownership: Ownership):
            super().__init__(path, mode="w")
            self.ownership = ownership
            self.weight_map: dict[str, set[int]] = {}
            self._metadata = None

        def make(self, path, metadata=None):
            self._metadata = metadata  # a group is made only where this owner writes a value
            return super().make(path, None)

        def __setitem__(self, key, value):
            owner = self.ownership.owner_of.get(id(value), self.ownership.keeper)
            self._note(owner)
            if owner == self.ownership.me:
                if not self._h5_entry_initialized:
                    self._create_h5_group(self._h5_entry_path, metadata=self._metadata)
                super().__setitem__(key, value)

        def optimizer(self, name: str, owners: set[int]) -> None:
            """The whole optimizer's variables this owner holds, under their numbers in the whole optimizer
            (`owners`: every owner that holds some)."""
            self.make("optimizer", {"name": name})
            self.weight_map["/optimizer/vars"] = set(owners)
            for number, variable in sorted(self.ownership.slots.items()):
                if not self._h5_entry_initialized:
                    self._create_h5_group(self._h5_entry_path, metadata=self._metadata)
                H5IOStore.__setitem__(self, str(number), variable.numpy())

        def _note(self, owner: int) -> None:
            group = f"/{self._h5_entry_path}/vars" if self._h5_entry_path else "/vars"
            self.weight_map.setdefault(group, set()).add(owner)

    return OwnValues


def _OwnValues(path, ownership):  # noqa: N802 - the class is made on demand, so this module imports without Keras
    return _own_values_store()(path, ownership)
