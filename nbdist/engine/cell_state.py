"""What a training cell that fits changed besides the models it fitted, on rank 0: the Keras objects its names hold
(a metric it made or read, an optimizer a custom `train_step` steps through a module name, a model it only
evaluated). Their state before the cell is digested, and after it the state walk's capture of what differs, leaving
out the variables the fits' own results carry; the notebook installs it after its replay of the cell."""

from __future__ import annotations

import ast

from ..keras_semantics import state_walk
from ..keras_semantics.training_code import bound_names, read_names


def cell_names(tree: ast.Module, namespace: dict) -> list[str]:
    """The module names the cell's statements read (itself or through the notebook's functions) or bind."""
    names: list[str] = []
    for statement in tree.body:
        names += read_names(statement, namespace) + bound_names(statement)
    return list(dict.fromkeys(n for n in names if not n.startswith("_")))


def before_cell(tree: ast.Module, namespace: dict) -> tuple[list[str], dict[str, str]]:
    """The cell's names and the digests of what they hold before it runs."""
    names = cell_names(tree, namespace)
    return names, state_walk.digests(state_walk.keras_roots(names, namespace))


def after_cell(tree: ast.Module, namespace: dict, names: list[str], before: dict[str, str], fitted: list):
    """The capture of what the cell's names hold that changed in the cell (None: nothing), without the fitted
    models' variables (their own results hold them)."""
    roots = state_walk.keras_roots([*names, *cell_names(tree, namespace)], namespace)
    covered = {id(v) for model in fitted for v in state_walk.Walk({"model": model}).variables.values()}
    state = state_walk.capture(roots, only_changed=before, skip=covered)
    return state if state.values or state.left else None
