"""The notebook's whole state, one walk (DESIGN.md section 15): every Keras object reachable from some named roots,
each variable at an address that is the same on every process, whatever order the variables were created in.

The walk follows Keras' own trackers: a functional or sequential model's `layers`, then every object's attributes
in sorted order (public before private, as Keras' saving does), into lists and dicts, breadth first; it stops at
layers and models, optimizers (`wgan.d_optimizer`, a `LossScaleOptimizer`'s `inner_optimizer`), metrics (compiled,
made in the cell or in a loop), losses and seed generators, each found once at its first address. A variable's
address is its owner's address and its key there:

- a layer's own variables by name (`wgan.discriminator.layers[1]/kernel`), a metric's (`acc/total`), a seed
  generator's `state`, a `keras.Variable` held by name at the name itself;
- an optimizer's single variables by attribute (`opt/_iterations`, a loss scale's `opt/dynamic_scale`), and each
  slot list (the lists as long as the variables it was built over: Adam's `_momentums`, EMA's
  `_model_variables_moving_average`) by the address of the model variable the slot follows:
  `opt/_momentums[model.layers[1]/kernel]`.

`capture` takes the values (and what was built: layers' build configs, the variables each optimizer was built
over), `install` puts a capture into other objects of the same structure in place (building there, over their own
variables, what the capture's process built), `differences` compares two captures (the tests' state oracle).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

# attributes that hold no state of their own, only references back into what the walk reaches anyway
SKIPPED = frozenset({"_tracker", "_inbound_nodes", "_outbound_nodes", "_functional", "_operations",
                     "_trainable_variables", "_non_trainable_variables", "_variables", "_layers_by_name",
                     "_convert_input_args", "_call_signature", "_build_shapes_dict", "_parent_path",
                     "_self_unconditional_dependency_names"})
LARGEST_CONTAINER = 10_000  # longer lists and dicts of the notebook's are data, not Keras objects


def _types():
    import keras
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return {"layer": keras.Layer, "optimizer": BaseOptimizer, "metric": keras.metrics.Metric,
            "loss": keras.losses.Loss, "seed": keras.random.SeedGenerator, "variable": keras.Variable}


def kind_of(value, types=None) -> str | None:
    """"layer" (models too), "optimizer", "metric", "loss", "seed", "variable", or None: not a Keras object."""
    for kind, cls in (types or _types()).items():
        if isinstance(value, cls):
            return kind
    return None


def keras_roots(names, namespace: Mapping[str, Any]) -> dict:
    """{name: value} of the names among `names` whose values are Keras objects or lists, tuples and dicts (which may
    hold some): the roots of a walk over a cell's names."""
    roots = {}
    for name in dict.fromkeys(names):
        value = namespace.get(name)
        if name.startswith("_") or value is None:
            continue
        if kind_of(value) is not None or (isinstance(value, (list, tuple, dict)) and _holds_keras(value)):
            roots[name] = value
    return roots


def _holds_keras(container) -> bool:
    types = tuple(_types().values())
    return any(isinstance(item, types) or (isinstance(item, (list, tuple, dict)) and _holds_keras(item))
               for _, item in _items(container))


class Walk:
    """Every Keras object reachable from `roots` ({name: value}) at its address (`objects`), and every variable of
    theirs at its own (`variables`); `address_of(variable)` the other way."""

    def __init__(self, roots: Mapping[str, Any]):
        self.roots = {name: roots[name] for name in sorted(roots)}
        self.objects: dict[str, Any] = {}
        self.kinds: dict[str, str] = {}
        self.variables: dict[str, Any] = {}
        self._object_at: dict[int, str] = {}
        self._variable_at: dict[int, str] = {}
        types = _types()
        queue = [(value, name, False) for name, value in self.roots.items()]
        while queue:  # breadth first: the shortest address is an object's own
            later = []
            for value, address, inside in queue:
                later += self._visit(value, address, inside, types)
            queue = later
        optimizers_last = sorted(self.objects, key=lambda a: self.kinds[a] == "optimizer")
        for address in optimizers_last:  # (an optimizer's slots are addressed by its model variables' addresses)
            for key, variable in own_variables(self.objects[address], self.kinds[address], self.address_of):
                if id(variable) not in self._variable_at:
                    at = f"{address}/{key}" if key else address
                    self.variables[at] = variable
                    self._variable_at[id(variable)] = at

    def _visit(self, value, address: str, inside: bool, types) -> list:
        """Register `value` (`inside` a Keras object, whose variables are its owner's) and return its children."""
        kind = kind_of(value, types)
        if kind == "variable" and inside:
            return []
        if kind is not None:
            if id(value) in self._object_at:
                return []
            self._object_at[id(value)] = address
            self.objects[address] = value
            self.kinds[address] = kind
            return [] if kind == "variable" else [(child, f"{address}{step}", True) for step, child in _children(value)]
        return [(child, f"{address}{step}", inside) for step, child in _items(value)]

    def address_of(self, value) -> str | None:
        """The address of a variable or object of the walk (None: not reached)."""
        return self._variable_at.get(id(value)) or self._object_at.get(id(value))


def _children(obj):
    """(step, value) of what an object holds: a graph model's layers first, then its attributes."""
    if _is_graph_model(obj):
        yield ".layers", list(obj.layers)
    for name in sorted(vars(obj), key=lambda n: (n.startswith("_"), n)):
        if name in SKIPPED or name.startswith("__"):
            continue
        yield f".{name}", vars(obj)[name]


def _is_graph_model(obj) -> bool:
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential

    return isinstance(obj, (Functional, Sequential))


def _items(value):
    """(step, item) of a list, tuple or dict of the notebook's (Keras' tracked ones too); nothing of anything else."""
    if isinstance(value, (list, tuple)) and len(value) <= LARGEST_CONTAINER:
        return [(f"[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, dict) and len(value) <= LARGEST_CONTAINER:
        return [(f"[{key!r}]", item) for key, item in value.items() if isinstance(key, (str, int))]
    return []


def own_variables(obj, kind: str, address_of) -> list[tuple[str, Any]]:
    """(key, variable) of the variables an object holds itself (not its children's); see the module docstring."""
    if kind == "variable":
        return [("", obj)]
    if kind == "seed":
        return [("state", obj.state)]
    if kind == "layer":
        return _by_name([*obj._trainable_variables, *obj._non_trainable_variables])
    if kind == "metric":
        return _by_name(obj._variables)
    if kind == "optimizer":
        return _optimizer_variables(obj, address_of)
    return []


def _by_name(variables) -> list[tuple[str, Any]]:
    out, seen = [], {}
    for variable in variables:
        name = str(variable.name)
        seen[name] = seen.get(name, -1) + 1
        out.append((name if not seen[name] else f"{name}#{seen[name]}", variable))
    return out


def _optimizer_variables(optimizer, address_of) -> list[tuple[str, Any]]:
    """An optimizer's single variables by attribute, its slots by the model variable each follows, anything else of
    its own by name."""
    import keras

    built_over = list(getattr(optimizer, "_trainable_variables", None) or [])
    refs = [address_of(v) or f"#{i}" for i, v in enumerate(built_over)]
    out: list[tuple[str, Any]] = []
    for name in sorted(vars(optimizer)):
        value = vars(optimizer)[name]
        if name in ("_trainable_variables", "_variables"):
            continue
        if isinstance(value, keras.Variable):
            out.append((name, value))
        elif (isinstance(value, (list, tuple)) and built_over and len(value) == len(built_over)
              and any(isinstance(v, keras.Variable) for v in value)
              and all(v is None or isinstance(v, keras.Variable) for v in value)):
            out += [(f"{name}[{ref}]", v) for ref, v in zip(refs, value) if v is not None]
    keyed = {id(v) for _, v in out}
    out += [(f"~{key}", v) for key, v in _by_name([v for v in optimizer._variables if id(v) not in keyed])]
    return out


# -- a capture, and installing it --------------------------------------------------------------------------
@dataclass
class State:
    """What `capture` took: `roots` (the names walked), `objects` ({address: facts}: kind, class, built, and for a
    layer its build config, for an optimizer the addresses of the variables it was built over) and `values`
    ({variable address: array}); `left` ({address: why}: what the capturing process could not give)."""

    roots: list[str] = field(default_factory=list)
    objects: dict[str, dict] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.values.values())

    def without(self, prefixes) -> "State":
        """This capture without the objects and variables under any of these addresses."""
        return self._kept(prefixes, inside=False)

    def only(self, prefixes) -> "State":
        """This capture's objects and variables under any of these addresses, and nothing else."""
        return self._kept(prefixes, inside=True)

    def _kept(self, prefixes, inside: bool) -> "State":
        prefixes = tuple(prefixes)

        def keep(address):
            under = any(address == p or address.startswith((p + ".", p + "/", p + "[")) for p in prefixes)
            return under == inside

        return State(list(self.roots), {a: f for a, f in self.objects.items() if keep(a)},
                     {a: v for a, v in self.values.items() if keep(a)}, {a: w for a, w in self.left.items() if keep(a)})


def capture(roots: Mapping[str, Any], only_changed: Mapping[str, str] | None = None, skip: set[int] = frozenset(),
            walk: Walk | None = None) -> State:
    """The state of everything reachable from `roots` (`walk`: theirs, made already); with `only_changed`
    (`digests` taken earlier), only the variables whose value differs from then (and those not there then);
    variables whose id is in `skip` left out (another capture holds them)."""
    walk = walk or Walk(roots)
    state = State(roots=list(walk.roots))
    for address, obj in walk.objects.items():
        state.objects[address] = _facts(obj, walk.kinds[address], walk)
    for address, variable in walk.variables.items():
        if id(variable) in skip:
            continue
        value = _value(variable)
        if value is None:
            state.left[address] = "it has no value on the engine (a part kept elsewhere)"
            continue
        if only_changed is not None and only_changed.get(address) == _digest(value):
            continue
        state.values[address] = value
    return state


def digests(roots: Mapping[str, Any]) -> dict[str, str]:
    """{variable address: digest of its value}, for `capture(..., only_changed=...)` later."""
    out = {}
    for address, variable in Walk(roots).variables.items():
        value = _value(variable)
        if value is not None:
            out[address] = _digest(value)
    return out


def _value(variable) -> np.ndarray | None:
    try:
        return np.array(variable.numpy())
    except Exception:  # noqa: BLE001 - a variable made without a value (model_parts' empty weights)
        return None


def _digest(value: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(value).tobytes() + str(value.dtype).encode()).hexdigest()


def _facts(obj, kind: str, walk: Walk) -> dict:
    facts = {"kind": kind, "class": type(obj).__qualname__, "built": bool(getattr(obj, "built", True))}
    if kind == "layer" and obj.built:
        try:
            facts["build"] = _plain(obj.get_build_config())
        except Exception:  # noqa: BLE001 - a layer whose build config Keras cannot give: built by a call instead
            facts["build"] = None
    if kind == "optimizer" and obj.built:
        facts["over"] = [walk.address_of(v) for v in obj._trainable_variables]
    return facts


def _plain(value):
    """Keras' tracked lists and dicts (which hold their tracker, unpicklable) as plain ones, all the way down."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value) if type(value) in (list, tuple) else [_plain(v) for v in value]
    return value


def install(state: State, roots: Mapping[str, Any], build_model=None) -> list[str]:
    """Assign `state` into the objects reachable from `roots` (the same names as the capture's), in place, so every
    other reference to them sees it; what the capture's process built and these lack is built first (a layer from
    its build config, an optimizer over these roots' own variables at the addresses the capture's was built over;
    `build_model(model)`, where given, builds a model's compiled metrics). Returns what could not be installed,
    one line each."""
    walk = Walk(roots)
    problems = _build(state, walk, build_model)
    if problems is not None:
        walk = Walk(roots)  # (what was built has variables now)
    problems = list(problems or [])
    missing: dict[str, int] = {}
    for address, value in state.values.items():
        variable = walk.variables.get(address)
        if variable is None:
            owner = address.split("/", 1)[0]
            missing[owner] = missing.get(owner, 0) + 1
            continue
        if tuple(variable.shape) != tuple(np.shape(value)):
            problems.append(f"{address} has shape {tuple(variable.shape)} here and {tuple(np.shape(value))} on the "
                            "engine; re-run the cells that make it")
            continue
        variable.assign(np.asarray(value, dtype=_dtype(variable)))
    for owner, count in missing.items():
        here = "not in this notebook" if owner not in walk.objects else "does not hold them here"
        problems.append(f"{owner}: {count} variable(s) trained on the engines stayed there ({here})")
    problems += [f"{address}: {why}" for address, why in state.left.items()]
    return problems


def _dtype(variable) -> str:
    return str(getattr(variable.dtype, "name", variable.dtype))


def _build(state: State, walk: Walk, build_model) -> list[str] | None:
    """Build here what the capture's process had built (parents before children); None when nothing needed it."""
    problems: list[str] = []
    acted = False
    for address in sorted(state.objects, key=lambda a: (a.count(".") + a.count("["), a)):
        facts, local = state.objects[address], walk.objects.get(address)
        if local is None or not facts.get("built") or getattr(local, "built", True):
            continue
        acted = True
        try:
            if facts["kind"] == "optimizer":
                over = [walk.variables.get(a) for a in facts.get("over") or []]
                if not over or any(v is None for v in over):
                    problems.append(f"{address}: built on the engines over variables this notebook does not hold "
                                    "at the same addresses, so its state stayed there")
                    continue
                local.build(over)
            elif facts["kind"] == "layer" and facts.get("build"):
                local.build_from_config(facts["build"])
            elif facts["kind"] == "metric" and build_model is not None:
                build_model(address, local)
        except Exception as exc:  # noqa: BLE001 - said, the rest still installed
            problems.append(f"{address}: could not be built here as on the engines ({type(exc).__name__}: {exc})")
    # compiled metrics are built by their model (Keras builds them from a batch), after the model itself
    return problems if acted else None


# -- the tests' state oracle -------------------------------------------------------------------------------
def differences(expected: State, actual: State, rtol: float = 0.0, atol: float = 0.0,
                ignore=lambda address: False) -> list[str]:
    """Where two captures differ: objects (kind, class, built), variables (present, shape, value within
    rtol/atol; `ignore(address)` skips a variable's value only), one line each."""
    out = []
    for address in sorted(set(expected.objects) | set(actual.objects)):
        a, b = expected.objects.get(address), actual.objects.get(address)
        if a is None or b is None:
            out.append(f"{address}: {'only in the second' if a is None else 'only in the first'} "
                       f"({(a or b)['class']})")
        elif (a["kind"], a["class"], a["built"]) != (b["kind"], b["class"], b["built"]):
            out.append(f"{address}: {a['class']} built={a['built']} against {b['class']} built={b['built']}")
    for address in sorted(set(expected.values) | set(actual.values)):
        a, b = expected.values.get(address), actual.values.get(address)
        if a is None or b is None:
            out.append(f"{address}: a value {'only in the first' if b is None else 'only in the second'}")
        elif a.shape != b.shape:
            out.append(f"{address}: shape {a.shape} against {b.shape}")
        elif not ignore(address) and not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            gap = relative_gap(a, b)
            out.append(f"{address}: values differ (relative L2 {gap:.3g})")
    return out


def relative_gap(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / max(||a||, tiny): how far apart two values are, as the tests report it."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12))
