"""What a training cell needs from the notebook that the engines lack, and how each part travels.

Modules travel as the notebook's own import line; functions and classes defined in the
notebook as their source (the def / class alone, not the rest of its cell, so replaying it
has no side effects), followed through every module name they read; everything else as a
value (cloudpickle, as ipyparallel sends). A value that cannot be copied to another process (a
tf.data pipeline, a generator) travels as the statements of its cell that made it (`names.making`),
replayed on each engine with what they read brought first, and the strategy shards what the engine
made as it shards any dataset; only an open file is refused, naming the cell that opened it.
"""

from __future__ import annotations

import inspect
import io
import os
from dataclasses import dataclass, field
from types import ModuleType

from ...errors import OptionError
from ...datasets.sharding import is_dataset
from ...keras_semantics.own_classes import used_by
from .names import last_binding, making, needed_names, referenced_globals


@dataclass
class Item:
    """One name to bring: kind "import" or "code" (source to run) or "value" (an object to send)."""

    name: str
    kind: str
    source: str | None = None
    value: object = None
    cell: int | None = None  # the notebook cell (In[n]) that bound it
    remade: bool = False  # code: the statements of a cell that made a value which cannot be sent
    fresh: bool = False  # code to run again every time (it makes a generator, used up by one run)
    paths: list[str] = field(default_factory=list)  # files of this host the code reads (engines must see them)
    after_code: bool = False  # a value: sent after the code (Keras objects of the notebook's own classes)
    random_state: dict | None = None  # remade code: the notebook's random state before its cell ran


def plan(python: str, namespace: dict, cells: list[tuple[int, str]], skip: set[str],
         names: list[str] | None = None, also: list[str] = ()) -> list[Item]:
    """The items to bring for a cell (`python`), or for `names` (`%dist push`), in the order to run them:
    imports, values, then code with what it uses first.

    `cells`: the notebook's cells ((index, python), oldest first); `skip`: names the engines get
    otherwise (marked definition cells, models synchronised by `model_sync`); `also`: names to bring besides
    those the cell reads (the classes the notebook's models are made of)."""
    items: dict[str, Item | None] = {}
    code_order: list[str] = []
    sendable = _sendable_in(namespace)

    def visit(name: str) -> None:
        if name in items or name in skip or name not in namespace:
            return
        items[name] = None  # visiting (a definition may refer to itself)
        value = namespace[name]
        found = last_binding(name, cells)
        cell = found[0] if found else None
        if isinstance(value, ModuleType):
            line = found[2] if found and found[1] == "import" else _import_line(name, value)
            items[name] = Item(name, "import", source=line, cell=cell)
        elif _defined_in_notebook(value) and (source := _source_of(name, value, found)) is not None:
            for dependency in referenced_globals(source):
                visit(dependency)
            items[name] = Item(name, "code", source=source, cell=cell)
            code_order.append(name)
        elif (made := _remade(name, value, sendable, cells)) is not None:
            source, reads = made
            for dependency in reads:
                visit(dependency)
            items[name] = Item(name, "code", source=source, cell=cell, remade=True, fresh=inspect.isgenerator(value),
                               paths=local_paths(source))
            code_order.append(name)
        else:
            refuse_unsendable(name, value, cell, cells)
            classes = used_by(value, namespace)  # an optimizer of the notebook's own class unpickles by the
            for dependency in classes:  # class's name: the class is sent first (its code), the value after it
                visit(dependency)
            items[name] = Item(name, "value", value=value, cell=cell, after_code=bool(classes))

    for name in (names if names is not None else [*needed_names(python), *also]):
        visit(name)
    brought = [item for item in items.values() if item is not None]
    return ([i for i in brought if i.kind == "import"] + [i for i in brought if i.kind == "value"]
            + [items[n] for n in code_order])


def _source_of(name: str, value, found) -> str | None:
    """The def / class source of the notebook's function or class `name`: from the cell that bound it, else (a cell
    run without history, as nbval and some runners run them) its own source, decorators included. A function sent
    by value would compute on copies of the globals it reads (cloudpickle's), not on the engine's."""
    if found and found[1] == "code":
        return found[2]
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(getattr(value, "python_function", value)))
    except (OSError, TypeError):
        return None
    return source if f"def {name}(" in source or f"class {name}" in source else None  # (not an alias)


def _remade(name: str, value, sendable, cells: list[tuple[int, str]]) -> tuple[str, list[str]] | None:
    """The statements that made an unsendable value, when the engines can make their own (not an open file)."""
    if isinstance(value, io.IOBase) or sendable(name):
        return None
    return making(name, cells, sendable)


def _sendable_in(namespace: dict):
    """Whether a name of the notebook can be sent as a value (each answer worked out once)."""
    known: dict[str, bool] = {}

    def sendable(name: str) -> bool:
        if name not in known:
            value = namespace.get(name)
            known[name] = name in namespace and (isinstance(value, ModuleType) or _defined_in_notebook(value)
                                                 or _unsendable(value) is None)
        return known[name]

    return sendable


def local_paths(source: str) -> list[str]:
    """The string constants of `source` that name a file or folder on this host (absolute paths)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) < 4096 \
                and "\n" not in node.value and os.path.exists(node.value):
            path = os.path.abspath(node.value)
            if path not in found:
                found.append(path)
    return found


def _defined_in_notebook(value) -> bool:
    value = getattr(value, "python_function", value)  # a tf.function of the notebook's travels as its source
    return (inspect.isfunction(value) or inspect.isclass(value)) and getattr(value, "__module__", None) == "__main__"


def _import_line(name: str, module: ModuleType) -> str:
    return f"import {module.__name__}" + ("" if module.__name__ == name else f" as {name}")


def refuse_unsendable(name: str, value, cell: int | None, cells: list[tuple[int, str]]) -> None:
    """Raise an OptionError naming the cell that made `value` when it cannot be copied to an engine."""
    why = _unsendable(value)
    if why is None:
        return
    where = f"cell [{cell}]" if cell is not None else "a cell of this notebook"
    first = next((p.strip().splitlines()[0] for i, p in cells if i == cell and p.strip()), "")
    raise OptionError(
        f"the training cell uses `{name}`, which cannot be sent to the engines: {why}. It was made in {where}"
        + (f" ({first[:60]!r})" if first else "") + ". Put that cell under %%distribute define so every engine "
        "makes its own, or give the engines data they can read (arrays, or files every host sees).")


def _unsendable(value) -> str | None:
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        return "it is a generator (one cannot be copied half-way through)"
    if isinstance(value, io.IOBase):
        return "it is an open file of this process"
    if is_dataset(value):
        return "it is a tf.data.Dataset (a pipeline cannot be copied to another process)"
    if _is_array_like(value):
        return None
    if _is_keras(value, "KerasTensor"):
        return "it is a symbolic Keras tensor (made again with the layers that make it)"
    if _is_keras(value, "Layer"):  # a model too
        from ...model_parts.model_sync import rebuild_error

        why = rebuild_error(value)
        if why is not None:
            return why
    try:
        import cloudpickle

        blob = cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any reason pickling fails is the reason to give
        return f"it cannot be pickled ({type(exc).__name__}: {str(exc)[:120]})"
    if _is_keras(value, "Layer") and any(getattr(value, state, None) is True for state in LAYER_STATES):
        copy = cloudpickle.loads(blob)
        if any(getattr(value, s, None) is True and getattr(copy, s, None) is not True for s in LAYER_STATES):
            return ("its copy would lose what it was built or adapted to (a Keras layer, such as FeatureSpace, "
                    "that pickles unbuilt or unadapted)")
    return None


LAYER_STATES = ("built", "_is_adapted", "_sublayers_built")  # what a Keras layer's pickled copy may lack


def _is_keras(value, kind: str) -> bool:
    """Whether `value` is a Keras `kind` ("Layer", "KerasTensor"), without importing Keras."""
    return any(c.__name__ == kind and c.__module__.startswith("keras") for c in type(value).__mro__)


def _is_array_like(value) -> bool:
    module = type(value).__module__.split(".")[0]
    return module in ("numpy", "pandas")
