"""Reading notebook code: the names a cell needs, what a definition refers to, where a name was bound.

All of it works on Python source (IPython syntax already transformed) through `ast` and
`symtable`, so a name used only as a local inside a function is never mistaken for one the
notebook must provide.
"""

from __future__ import annotations

import ast
import builtins
import functools
import symtable

NOT_BROUGHT = set(dir(builtins)) | {"In", "Out", "get_ipython", "exit", "quit"}


def needed_names(python: str) -> list[str]:
    """The names a cell reads before it binds them, in order of first use (its top-level statements
    one after another; names its functions and classes read from the module included)."""
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return []
    bound: set[str] = set()
    needed: list[str] = []
    for statement in tree.body:
        if isinstance(statement, (ast.For, ast.AsyncFor)):  # the loop binds its target before the body reads it
            bound |= {n.id for n in ast.walk(statement.target) if isinstance(n, ast.Name)}
        table = symtable.symtable(ast.unparse(statement), "<cell>", "exec")
        for name in _referenced_globals(table, include_assigned=True):
            if name not in bound and name not in needed:
                needed.append(name)
        bound |= {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    return [n for n in needed if n not in NOT_BROUGHT and not n.startswith("_")]


def referenced_globals(source: str) -> list[str]:
    """The module names a definition (def / class source) reads: decorators, bases, defaults, bodies."""
    return [n for n in _referenced_globals(symtable.symtable(source, "<definition>", "exec"), include_assigned=False)
            if n not in NOT_BROUGHT and not n.startswith("_")]


def _referenced_globals(table, include_assigned: bool, top: bool = True) -> list[str]:
    names = []
    for symbol in table.get_symbols():
        if not symbol.is_referenced():
            continue
        if top and (include_assigned or not (symbol.is_assigned() or symbol.is_imported())):
            names.append(symbol.get_name())
        elif not top and symbol.is_global():
            names.append(symbol.get_name())
    for child in table.get_children():
        names += [n for n in _referenced_globals(child, include_assigned, top=False) if n not in names]
    return names


@functools.lru_cache(maxsize=1024)
def bindings(python: str) -> dict[str, tuple[str, str | None]]:
    """What a cell's top level binds: name -> ("import", the import line) | ("code", the def/class source
    with its decorators) | ("value", None). The last binding of a name in the cell wins."""
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return {}
    lines = python.splitlines(True)
    found: dict[str, tuple[str, str | None]] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            for alias in statement.names:
                found.update(_import_binding(statement, alias))
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([statement.lineno, *(d.lineno for d in statement.decorator_list)])
            found[statement.name] = ("code", "".join(lines[first - 1:statement.end_lineno]))
        else:
            for node in ast.walk(statement):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    found[node.id] = ("value", None)
    return found


def _import_binding(statement, alias) -> dict[str, tuple[str, str]]:
    if alias.name == "*":
        return {}
    if isinstance(statement, ast.Import):
        name = alias.asname or alias.name.split(".")[0]
        line = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
    else:
        name = alias.asname or alias.name
        line = (f"from {'.' * statement.level}{statement.module or ''} import {alias.name}"
                + (f" as {alias.asname}" if alias.asname else ""))
    return {name: ("import", line)}


def last_binding(name: str, cells: list[tuple[int, str]]) -> tuple[int, str, str | None, str] | None:
    """The last of `cells` ((index, python), oldest first) that binds `name`: (index, kind, source, the
    cell's python)."""
    for index, python in reversed(cells):
        found = bindings(python).get(name)
        if found is not None:
            return index, *found, python
    return None


def making(name: str, cells: list[tuple[int, str]], sendable=lambda name: True) -> tuple[str, list[str]] | None:
    """The notebook's top-level statements that make `name`, as source to replay elsewhere: a backward slice
    over `cells` ((index, python), oldest first) from the last statement that binds or changes it
    (`layer.adapt(...)` in a later cell counts), through what those statements read that cannot be sent
    (`sendable(name)` False: it is made by the slice too, `ds = ds.batch(32)` included), stopping at what can
    be sent (those names are returned, in the order the slice reads them, to be brought as values first).
    None when no cell binds `name`."""
    statements = []
    for _, python in cells:
        try:
            tree = ast.parse(python)
        except SyntaxError:
            continue
        statements += [(python, statement) for statement in tree.body]
    wanted, chosen = {name}, []
    for python, statement in reversed(statements):
        if not (_binds(statement) | _changes(statement)) & wanted:
            continue
        chosen.append((python, statement))
        wanted = (wanted - _binds(statement)) | {n for n in _reads(statement) if not sendable(n)}
    if not any(name in _binds(s) for _, s in chosen):
        return None
    chosen.reverse()
    chosen = _with_seeding(statements, chosen)
    source = "".join("".join(python.splitlines(True)[s.lineno - 1:s.end_lineno]).rstrip("\n") + "\n"
                     for python, s in chosen)
    made = {n for _, s in chosen for n in _binds(s)}
    outside = [n for _, s in chosen for n in _reads(s) if n not in made or sendable(n)]
    outside = [n for n in dict.fromkeys(outside) if n != name and not _bound_before_read(n, chosen)]
    return source, [n for n in outside if n not in NOT_BROUGHT and not n.startswith("_")]


SEEDING_CALLS = {"set_random_seed", "set_seed", "seed"}  # keras.utils / tf.random / np.random / random


def _with_seeding(statements: list, chosen: list) -> list:
    """`chosen` (in order) with the calls that seed a generator (`keras.utils.set_random_seed(3)`) that come before a
    chosen statement in its cell: the replay then draws what the cell drew after them."""
    last_in_cell = {}
    for position, (python, statement) in enumerate(statements):
        if any(statement is s for _, s in chosen):
            last_in_cell[id(python)] = position
    kept = []
    for position, (python, statement) in enumerate(statements):
        if any(statement is s for _, s in chosen):
            kept.append((python, statement))
        elif position < last_in_cell.get(id(python), -1) and _seeds(statement):
            kept.append((python, statement))
    return kept


def _seeds(statement) -> bool:
    call = statement.value if isinstance(statement, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in SEEDING_CALLS


def _bound_before_read(name: str, chosen) -> bool:
    """Whether the slice binds `name` before any of its statements reads it (then it is the slice's own)."""
    for _, statement in chosen:
        if name in _reads(statement):
            return False
        if name in _binds(statement):
            return True
    return False


def _binds(statement) -> set[str]:
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in statement.names if a.name != "*"}
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    targets = {ast.Assign: lambda s: s.targets, ast.AnnAssign: lambda s: [s.target],
               ast.AugAssign: lambda s: [s.target], ast.For: lambda s: [s.target],
               ast.With: lambda s: [i.optional_vars for i in s.items if i.optional_vars]}
    for kind, of in targets.items():
        if isinstance(statement, kind):
            return {n.id for t in of(statement) for n in ast.walk(t) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)}
    return set()


USES = ("fit", "evaluate", "predict", "summary", "save", "save_weights", "export", "plot_model")  # not changes


def _changes(statement) -> set[str]:
    """Names a statement changes in place: `ds.method(...)` alone on its line (not a use such as `model.fit`),
    `obj.attr = ...`, `a[i] = ...`, and an object it calls (`feature_space(x)`: a Keras layer's first call
    builds it)."""
    roots = []
    called = {node.func.id for node in ast.walk(statement)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) and not (
            isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr in USES):
        roots.append(statement.value.func)
    elif isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        roots += statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    found = set()
    for node in roots:
        if not isinstance(node, (ast.Attribute, ast.Subscript)):
            continue
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        if isinstance(node, ast.Name):
            found.add(node.id)
    return found | called


def _reads(statement) -> list[str]:
    return _referenced_globals(symtable.symtable(ast.unparse(statement), "<statement>", "exec"), include_assigned=True)


FIT_ARRAYS = ("x", "y", "sample_weight")


def _leaf_names(node: ast.AST):
    """The names a fit argument is made of: `a`, or each name in a literal nest of them (`[a, b]`, `{"k": a}`)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.List, ast.Tuple)):
        for item in node.elts:
            yield from _leaf_names(item)
    elif isinstance(node, ast.Dict):
        for item in node.values:
            yield from _leaf_names(item)


def fit_array_names(python: str) -> set[str]:
    """Names the cell reads only as `fit`'s x, y, sample_weight or validation_data=(a, b[, w]) (each may be a
    literal list, tuple or dict of them), with no validation_split: a worker of a strided-sharding strategy may hold just its shard of them."""
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return set()
    as_fit_array: dict[str, int] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fit"):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if "validation_split" in keywords:
            continue
        arrays = [*node.args[:2], *(keywords[k] for k in FIT_ARRAYS if k in keywords)]
        validation = keywords.get("validation_data")
        if isinstance(validation, ast.Tuple):
            arrays += validation.elts
        for name in (n for array in arrays for n in _leaf_names(array)):
            as_fit_array[name] = as_fit_array.get(name, 0) + 1
    loads: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            loads[node.id] = loads.get(node.id, 0) + (1 if isinstance(node.ctx, ast.Load) else 1000)
    return {name for name, uses in as_fit_array.items() if loads.get(name) == uses}
