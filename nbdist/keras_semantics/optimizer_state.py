"""A Keras optimizer's state per model variable, by name, so it can move between optimizers.

Keras names each slot variable `<model variable path, '/' -> '_'>_<slot>` (momentum,
velocity, accumulator, ...); the slot is what follows the variable's prefix. State is
exchanged as ``{"<name>:<slot>": array}`` for chosen variable names, plus the optimizer's
step count, so a parameter-server shard that holds some of a model's variables can start
from (and hand back) exactly the state the notebook's optimizer has for them.
"""

from __future__ import annotations

import numpy as np

ITERATIONS = "iterations"


def _prefix(variable) -> str:
    path = getattr(variable, "path", None) or str(variable.name)
    return path.replace("/", "_").replace(":", "_") + "_"


def slots(optimizer, variables) -> list[dict]:
    """For each of `variables` (in order), its slot variables in `optimizer`: {slot name: variable}."""
    prefixes = [_prefix(v) for v in variables]
    found: list[dict] = [{} for _ in variables]
    if not getattr(optimizer, "built", False):
        return found
    for slot in optimizer.variables:
        name = str(slot.name)
        matches = [i for i, p in enumerate(prefixes)
                   if name.startswith(p) and tuple(slot.shape) == tuple(variables[i].shape)]
        if matches:
            i = max(matches, key=lambda j: len(prefixes[j]))  # dense_1_kernel_ is not dense_kernel_
            found[i][name[len(prefixes[i]):]] = slot
    return found


def export(optimizer, variables, names: list[str]) -> tuple[dict[str, np.ndarray], int]:
    """The slots of `variables` as {"<name>:<slot>": array} and the optimizer's iteration count."""
    arrays = {}
    for name, per_variable in zip(names, slots(optimizer, variables)):
        for slot, variable in per_variable.items():
            arrays[f"{name}:{slot}"] = np.array(variable.numpy())
    return arrays, iterations(optimizer)


def load(optimizer, variables, names: list[str], arrays: dict, step: int | None = None) -> int:
    """Assign the slots found in `arrays` (same naming as `export`); returns how many were assigned. An unbuilt
    optimizer that made no step stays unbuilt (nothing stepped it, locally either)."""
    if not getattr(optimizer, "built", False):
        if not step:
            return 0
        optimizer.build(list(variables))
    assigned = 0
    for name, per_variable in zip(names, slots(optimizer, variables)):
        for slot, variable in per_variable.items():
            value = arrays.get(f"{name}:{slot}")
            if value is not None and tuple(np.shape(value)) == tuple(variable.shape):
                variable.assign(np.asarray(value, dtype=str(variable.dtype)))
                assigned += 1
    if step is not None:
        optimizer.iterations.assign(int(step))
    return assigned


def iterations(optimizer) -> int:
    return int(optimizer.iterations.numpy()) if getattr(optimizer, "built", False) else 0
