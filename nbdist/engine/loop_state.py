"""What a hand-written training loop leaves behind, moved from rank 0's engine into the notebook (DESIGN.md
section 13): the notebook does not run the loop again; each top-level statement of the cell that stepped an
optimizer is replaced there by installing what it left on rank 0.

`capture` (on rank 0, right after such a statement) takes the names the statement bound (their values,
pickled), the state walk's capture of every Keras object it reads or binds (`keras_semantics.state_walk`: models,
optimizers with the variables they were built over, metrics made anywhere, variables), and the lists, dicts and
sets it changed in place. `install` (in the notebook) puts them in place: values bound, containers updated in
place, then the captured state assigned into the notebook's own objects by address (so every other reference to
them sees the trained state; a metric the loop made, bound here as its empty copy, takes its values; an optimizer
first built on the engine is built here over the notebook's variables).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..keras_semantics import own_classes, state_walk
from ..keras_semantics.training_code import bound_names, read_names

CONTAINERS = (list, dict, set)


@dataclass
class Snapshot:
    """What one top-level statement left on rank 0: `values` (names it bound, pickled), `state` (the state walk's
    capture of the Keras objects it reads or binds), `containers` (lists, dicts and sets it changed, pickled),
    `skipped` (name: why it stays behind) and the statement's printed output."""

    values: dict[str, bytes] = field(default_factory=dict)
    state: state_walk.State | None = None
    containers: dict[str, bytes] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    stdout: str = ""


def fingerprints(statement: ast.stmt, namespace: dict) -> dict[str, tuple]:
    """What tells whether a container the statement reads changed (identity, length, ends): taken before it runs."""
    return {name: _fingerprint(namespace[name]) for name in read_names(statement, namespace)
            if isinstance(namespace.get(name), CONTAINERS)}


def _fingerprint(value) -> tuple:
    items = list(value.items()) if isinstance(value, dict) else list(value) if isinstance(value, list) else None
    ends = (id(items[0]), id(items[-1])) if items else ()
    return id(value), len(value), ends


def capture(statement: ast.stmt, namespace: dict, before: dict[str, tuple]) -> Snapshot:
    """What `statement` left in `namespace` (see the module docstring); `before`: `fingerprints` taken before it."""
    import cloudpickle

    snapshot = Snapshot()
    bound = [n for n in bound_names(statement) if n in namespace]
    for name in bound:
        try:
            snapshot.values[name] = cloudpickle.dumps(namespace[name])
        except Exception as exc:  # noqa: BLE001 - whatever makes it unpicklable is the reason to give
            snapshot.skipped[name] = f"{type(namespace[name]).__name__} cannot be pickled ({type(exc).__name__})"
    read = read_names(statement, namespace)
    for name in read:
        value = namespace[name]
        if name not in bound and isinstance(value, CONTAINERS) and before.get(name) != _fingerprint(value):
            try:
                snapshot.containers[name] = cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001
                snapshot.skipped[name] = f"{type(value).__name__} cannot be pickled ({type(exc).__name__})"
    roots = state_walk.keras_roots([*read, *bound], namespace)
    if roots:
        snapshot.state = state_walk.capture(roots)
    return snapshot


# -- in the notebook ----------------------------------------------------------------------------------------
def install(snapshot: Snapshot, namespace: dict) -> list[str]:
    """Put what rank 0 left in place in the notebook's `namespace`; returns what could not be (one line each)."""
    problems = [f"{name} stays on the engines: {why}" for name, why in snapshot.skipped.items()]
    for name, blob in snapshot.values.items():
        namespace[name] = as_notebook_classes(own_classes.loads(blob, namespace), namespace)
    for name, blob in snapshot.containers.items():
        _update_in_place(namespace, name, own_classes.loads(blob, namespace))
    if snapshot.state is not None:
        problems += install_state(snapshot.state, namespace)
    return problems


def as_notebook_classes(value, namespace: dict):
    """`value` with every Keras object in it of a class the notebook defines made an instance of the notebook's class
    itself: the engines' copy of the class travelled by value (a class of `__main__` pickles so), and came back as
    another class of the same name."""
    for obj in [value, *state_walk.Walk({"value": value}).objects.values()]:
        cls = type(obj)
        own = namespace.get(cls.__name__)
        if cls.__module__ == "__main__" and isinstance(own, type) and own is not cls and \
                own.__qualname__ == cls.__qualname__ and own.__module__ == "__main__":
            obj.__class__ = own
    return value


def install_state(state: state_walk.State, namespace: dict) -> list[str]:
    """`state_walk.install` into the namespace's objects of the capture's names."""
    missing = [name for name in state.roots if name not in namespace]
    problems = [f"{name}: not in this notebook, so what it holds on the engines stayed there" for name in missing]
    return problems + state_walk.install(state, {n: namespace[n] for n in state.roots if n in namespace})


def _update_in_place(namespace: dict, name: str, new) -> None:
    old = namespace.get(name)
    if type(old) is not type(new):
        namespace[name] = new
    elif isinstance(old, list):
        old[:] = new
    else:  # dict, set
        old.clear()
        old.update(new)


INSTALL = "__nbdist_install__"  # the notebook's name, while the cell is replayed, for installing statement k


def replay_source(python: str, snapshots: dict, ran: int) -> str:
    """The cell as the notebook runs it after the engines: each statement that stepped (a key of `snapshots`)
    replaced by `__nbdist_install__(k)` on its first line (the others blank, so line numbers hold), and the
    statements from `ran` on (a stopped run did not reach them) left out."""
    tree = ast.parse(python)
    lines = python.splitlines(True)
    statements = tree.body
    shared = any(a.end_lineno >= b.lineno for a, b in zip(statements, statements[1:]))
    if shared:  # statements that share a line (`a = 1; for ...`): rebuilt from the tree
        body = [_install_call(k) if k in snapshots else s for k, s in enumerate(statements[:ran])]
        return ast.unparse(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])))
    out = list(lines)
    for k, statement in enumerate(statements):
        first, last = statement.lineno - 1, statement.end_lineno
        if k >= ran:
            out[first:last] = ["\n"] * (last - first)
        elif k in snapshots:
            out[first:last] = [f"{INSTALL}({k})\n"] + ["\n"] * (last - first - 1)
    return "".join(out)


def _install_call(k: int) -> ast.stmt:
    return ast.Expr(ast.Call(ast.Name(INSTALL, ast.Load()), [ast.Constant(k)], []))


# -- the loop's optimizers and metrics, carried into a run as the notebook holds them -----------------------
def cell_objects(python: str, namespace: dict) -> dict:
    """The notebook's Keras optimizers and metrics a loop cell reads (itself or through its functions): their state
    goes to the engines before the cell runs there, as the models' does."""
    import keras

    from ..model_parts.model_sync import free_names
    from ..keras_semantics.training_code import globals_read

    free = free_names(python)
    names = dict.fromkeys([*free, *globals_read(free, namespace)])
    return {n: namespace[n] for n in names
            if isinstance(namespace.get(n), (keras.optimizers.Optimizer, keras.metrics.Metric))}


def carried(objects: dict, models: dict) -> tuple[state_walk.State | None, dict]:
    """The capture of the loop's optimizers and metrics (`objects`) to install on the engines before the cell, over
    the notebook's `models` (synced on their own, so only addressed here), and the objects it carries: an unbuilt
    optimizer is not carried (it is sent anew: the engine's may hold an older one's steps)."""
    carried = {name: value for name, value in objects.items()
               if not (state_walk.kind_of(value) == "optimizer" and not value.built)}
    if not carried:
        return None, {}
    state = state_walk.capture({**models, **carried}).without(list(models))
    return state, carried


def config_digest(value) -> str:
    """What must match for an engine's object to take the notebook's state in place: its class and config."""
    import hashlib
    import json

    text = json.dumps([type(value).__qualname__, value.get_config()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def object_digests(names: list[str]) -> dict[str, str | None]:
    """Engine side: `config_digest` of this engine's objects of these names (None where it has none)."""
    from ..host.namespace import user_namespace

    namespace = user_namespace()
    out = {}
    for name in names:
        try:
            out[name] = config_digest(namespace[name]) if name in namespace else None
        except Exception:  # noqa: BLE001 - an object without a config is sent anew
            out[name] = None
    return out
