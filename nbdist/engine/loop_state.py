"""What a hand-written training loop leaves behind, moved from rank 0's engine into the notebook (DESIGN.md
section 13): the notebook does not run the loop again; each top-level statement of the cell that stepped an
optimizer is replaced there by installing what it left on rank 0.

`capture` (on rank 0, right after such a statement) takes the names the statement bound (their values,
pickled), the Keras objects it reads (models, layers, optimizers, metrics, variables: their variables' values,
an optimizer with which variables of which named object it updates, so the notebook's optimizer is built over
the notebook's model), and the lists, dicts and sets it changed in place. `install` (in the notebook) puts them
in place: values bound, variables assigned into the notebook's own objects (so every other reference to them
sees the trained state), containers updated in place.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import numpy as np

from ..keras_semantics.training_code import bound_names, read_names

CONTAINERS = (list, dict, set)


@dataclass
class Snapshot:
    """What one top-level statement left on rank 0: `values` (names it bound, pickled), `states` (Keras objects'
    variables), `containers` (lists, dicts and sets it changed, pickled), `skipped` (name: why it stays
    behind) and the statement's printed output."""

    values: dict[str, bytes] = field(default_factory=dict)
    states: dict[str, dict] = field(default_factory=dict)
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
    owners = _variable_owners(namespace)
    for name in read_names(statement, namespace):
        if name in bound:
            continue
        value = namespace[name]
        state = keras_state(value, name, owners)
        if state is not None:
            snapshot.states[name] = state
        elif isinstance(value, CONTAINERS) and before.get(name) != _fingerprint(value):
            try:
                snapshot.containers[name] = cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001
                snapshot.skipped[name] = f"{type(value).__name__} cannot be pickled ({type(exc).__name__})"
    return snapshot


def keras_state(value, name: str, owners: dict[int, tuple[str, int]]) -> dict | None:
    """The state of a Keras object to carry over by its variables (None: not one)."""
    import keras

    if isinstance(value, keras.Layer):  # models too
        state = {"kind": "layer", "variables": _values(value.variables)}
        if value.built:
            state["build"] = value.get_build_config()
        optimizer = getattr(value, "optimizer", None)
        if isinstance(value, keras.Model) and isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
            state["optimizer"] = _optimizer_state(optimizer, {**owners, **_owned_by(value, name)})
        return state
    if isinstance(value, keras.optimizers.Optimizer):
        return _optimizer_state(value, owners) if value.built else None
    if isinstance(value, keras.Variable):
        return {"kind": "variable", "variables": _values([value])}
    variables = getattr(value, "variables", None)
    if isinstance(value, keras.metrics.Metric) and variables:
        return {"kind": "variables", "variables": _values(variables)}
    return None


def _optimizer_state(optimizer, owners: dict[int, tuple[str, int]]) -> dict:
    refs = [owners.get(id(v)) for v in optimizer._trainable_variables]
    return {"kind": "optimizer", "variables": _values(optimizer.variables), "refs": refs}


def _values(variables) -> list[np.ndarray]:
    return [np.array(v.numpy() if hasattr(v, "numpy") else v) for v in variables]


def _variable_owners(namespace: dict) -> dict[int, tuple[str, int]]:
    """id(variable) -> (the name of the notebook's Keras layer or model holding it, its index there)."""
    import keras

    owners: dict[int, tuple[str, int]] = {}
    for name, value in namespace.items():
        if isinstance(value, keras.Layer) and not name.startswith("_"):
            for key, ref in _owned_by(value, name).items():
                owners.setdefault(key, ref)
    return owners


def _owned_by(layer, name: str) -> dict[int, tuple[str, int]]:
    return {id(v): (name, i) for i, v in enumerate(layer.variables)}


# -- in the notebook ----------------------------------------------------------------------------------------
def install(snapshot: Snapshot, namespace: dict) -> list[str]:
    """Put what rank 0 left in place in the notebook's `namespace`; returns what could not be (one line each)."""
    import cloudpickle

    problems = [f"{name} stays on the engines: {why}" for name, why in snapshot.skipped.items()]
    for name, blob in snapshot.values.items():
        namespace[name] = cloudpickle.loads(blob)
    for name, blob in snapshot.containers.items():
        _update_in_place(namespace, name, cloudpickle.loads(blob))
    ordered = sorted(snapshot.states.items(), key=lambda item: item[1]["kind"] == "optimizer")  # models first
    for name, state in ordered:
        problem = _install_state(namespace.get(name), state, namespace)
        if problem:
            problems.append(f"{name}: {problem}")
    return problems


def _update_in_place(namespace: dict, name: str, new) -> None:
    old = namespace.get(name)
    if type(old) is not type(new):
        namespace[name] = new
    elif isinstance(old, list):
        old[:] = new
    else:  # dict, set
        old.clear()
        old.update(new)


def _install_state(local, state: dict, namespace: dict) -> str | None:
    import keras

    if state["kind"] == "optimizer":
        return _install_optimizer(local, state, namespace)
    if state["kind"] == "layer":
        if not isinstance(local, keras.Layer):
            return "not a Keras layer or model in this notebook"
        if not local.built and state.get("build"):
            try:
                local.build_from_config(state["build"])
            except Exception as exc:  # noqa: BLE001 - said, the rest still installed
                return f"could not be built here as on the engine ({type(exc).__name__}: {exc})"
        problem = _assign(local.variables, state["variables"])
        if problem is None and state.get("optimizer") and getattr(local, "optimizer", None) is not None:
            problem = _install_optimizer(local.optimizer, state["optimizer"], namespace)
        return problem
    return _assign(getattr(local, "variables", None) or ([local] if local is not None else []), state["variables"])


def _install_optimizer(local, state: dict, namespace: dict) -> str | None:
    import keras

    if not isinstance(local, keras.optimizers.Optimizer):
        return "not a Keras optimizer in this notebook"
    if not local.built:
        if any(ref is None for ref in state["refs"]):
            return "its variables belong to no model of the notebook, so its state cannot be placed"
        try:
            variables = [namespace[owner].variables[index] for owner, index in state["refs"]]
        except (KeyError, IndexError, AttributeError):
            return "the models whose variables it updates differ here from the engine's"
        local.build(variables)
    return _assign(local.variables, state["variables"])


def _assign(variables, values) -> str | None:
    variables = list(variables)
    shapes = [tuple(v.shape) for v in variables]
    if shapes != [tuple(np.shape(x)) for x in values]:
        return (f"its variables differ here ({len(shapes)} of shapes {shapes[:3]}...) from rank 0's "
                f"({len(values)}); re-run the cells that make it")
    for variable, value in zip(variables, values):
        variable.assign(value)
    return None


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


def config_digest(value) -> str:
    """What must match for an engine's object to take the notebook's state in place: its class and config."""
    import hashlib
    import json

    text = json.dumps([type(value).__qualname__, value.get_config()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def states_of(objects: dict, namespace: dict) -> dict[str, dict]:
    """`keras_state` of each object (an unbuilt optimizer has none)."""
    owners = _variable_owners(namespace)
    states = {name: keras_state(value, name, owners) for name, value in objects.items()}
    return {name: state for name, state in states.items() if state is not None}


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
