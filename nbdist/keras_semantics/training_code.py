"""What a training cell's text says about how it trains: whether it calls `fit`, whether it steps an optimizer
itself (a hand-written loop, DESIGN.md section 13), and which of its loops iterate the batches it trains on.

Pure `ast` over the cell's Python (IPython syntax already transformed), reading the notebook's namespace only to
follow the functions and methods the cell calls into their source: a loop that calls `train_step(x, y)` steps if
`train_step`'s source does. Read in the kernel (refusals before any engine runs) and on the engines (which loops'
data each worker gets its shard of).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

# calls that step an optimizer (or compute what one applies); `fit` trains through the strategy's own path
STEP_CALLS = frozenset({"apply", "apply_gradients", "gradient", "train_on_batch", "minimize"})
FIT_CALLS = frozenset({"fit"})
DATA_WRAPPER = "__nbdist_loop_data__"  # the engines' name for `loop_data.shard_for_loop`, bound while a cell runs
FOLLOW_DEPTH = 4  # how deep calls are followed into the notebook's functions


@dataclass(frozen=True)
class Training:
    """How a cell trains: `fit` (it calls fit, directly or in a notebook function), `steps` (it steps an optimizer
    itself, outside any fit), and `data_loops` (the names the loops that step iterate)."""

    fit: bool
    steps: bool
    data_loops: tuple[str, ...] = ()
    loops_at: tuple[tuple[int, int], ...] = ()  # where each data loop starts: (line, column)

    @property
    def loop(self) -> bool:
        """A hand-written loop: steps of its own and no `fit`."""
        return self.steps and not self.fit


def training_of(python: str, namespace: dict | None = None) -> Training:
    """How the cell `python` trains; `namespace` (the notebook's or the engine's) resolves the functions it calls."""
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return Training(fit=False, steps=False)
    follow = _Follower(namespace or {}, tree)
    loops = data_loops(tree, follow)
    return Training(fit=follow.calls(tree, FIT_CALLS), steps=follow.calls(tree, STEP_CALLS),
                    data_loops=tuple(dict.fromkeys(n for loop in loops for n in _iter_names(loop))),
                    loops_at=tuple((loop.lineno, loop.col_offset) for loop in loops))


def data_loops(tree: ast.AST, follow: "_Follower | None" = None) -> list[ast.For]:
    """The `for` loops whose own body steps an optimizer (not only through a loop nested in it): the loops over
    the training batches. An epoch loop around one is not one of them, nor a validation loop beside it."""
    follow = follow or _Follower({})
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and any(
                follow.calls(part, STEP_CALLS) for part in _outside_nested_loops(node.body)):
            found.append(node)
    return found


def shard_data_loops(tree: ast.Module, at) -> ast.Module:
    """`tree` with every name a data loop (those starting at `at`, `Training.loops_at`) iterates wrapped in
    `__nbdist_loop_data__(value, "name")` (the engine gives each worker its shard of it there), and the same names
    subscripted in that loop's body (`x[i:i + b]` of a loop over `range(0, len(x), b)`)."""
    at = {tuple(where) for where in at}
    for loop in [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor))
                 and (n.lineno, n.col_offset) in at]:
        names = set(_iter_names(loop))
        loop.iter = _Wrap(names).visit(loop.iter)
        wrap_subscripts = _WrapSubscripts(names)
        loop.body = [wrap_subscripts.visit(statement) for statement in loop.body]
    return ast.fix_missing_locations(tree)


def bound_names(statement: ast.stmt) -> list[str]:
    """The module-level names a top-level statement binds anywhere in it (loop targets, assignments in its
    body), not the locals of functions it defines."""
    names: list[str] = []
    for node in _walk_module_scope(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    return list(dict.fromkeys(names))


def read_names(statement: ast.stmt, namespace: dict) -> list[str]:
    """The names of `namespace` a statement reads, with the module names read by the notebook's functions it
    calls (followed `FOLLOW_DEPTH` deep): where the state it changes lives."""
    follow = _Follower(namespace)
    seen: list[str] = []
    for node in _walk_module_scope(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in namespace:
            seen.append(node.id)
    for name in list(dict.fromkeys(seen)):
        seen += follow.globals_of(namespace.get(name))
    return [n for n in dict.fromkeys(seen) if n in namespace]


def globals_read(names, namespace: dict) -> list[str]:
    """The module names the notebook's functions among `names` read (followed into the functions they call)."""
    follow = _Follower(namespace)
    return list(dict.fromkeys(n for name in names for n in follow.globals_of(namespace.get(name))))


# -- following calls into the notebook's own code -----------------------------------------------------------
class _Follower:
    """Whether code calls one of a set of method names, itself or through the notebook functions, methods and
    `tf.function`s it calls (their source read once)."""

    def __init__(self, namespace: dict, cell: ast.Module | None = None):
        self.namespace = namespace
        self._trees: dict[int, ast.AST | None] = {}
        # the functions and classes the cell itself defines (not in the namespace until it runs)
        self.defined = {node.name: node for node in (cell.body if cell is not None else [])
                        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}

    def calls(self, tree: ast.AST, names: frozenset, depth: int = FOLLOW_DEPTH) -> bool:
        for node in _walk_module_scope(tree) if isinstance(tree, ast.stmt) else ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in names:
                return True
            if depth > 0:
                inner = self._tree(self._callee(node.func))
                if inner is not None and self.calls(inner, names, depth - 1):
                    return True
        return False

    def globals_of(self, value, depth: int = FOLLOW_DEPTH) -> list[str]:
        """The module names the notebook function (or tf.function, or method) `value` reads, and those its own
        calls read."""
        tree = self._tree(value)
        if tree is None or depth <= 0:
            return []
        found = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                 and n.id in self.namespace]
        for name in list(dict.fromkeys(found)):
            if name in self.namespace and self.namespace[name] is not value:
                found += self.globals_of(self.namespace[name], depth - 1)
        return list(dict.fromkeys(found))

    def _callee(self, func: ast.expr):
        """What a call's function refers to in the namespace: `f(...)`, `obj.method(...)`, `Class(...)`."""
        if isinstance(func, ast.Name) and func.id in self.defined:
            node = self.defined[func.id]
            if isinstance(node, ast.ClassDef):
                return next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            return node
        if isinstance(func, ast.Name):
            value = self.namespace.get(func.id)
            return getattr(value, "__init__", None) if isinstance(value, type) else value
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.namespace:
            owner = self.namespace[func.value.id]
            return getattr(type(owner) if not isinstance(owner, type) else owner, func.attr, None)
        return None

    def _tree(self, value) -> ast.AST | None:
        """The parsed source of a function of the notebook's (`__main__`) or a tf.function wrapping one."""
        if isinstance(value, ast.AST):  # defined by the cell itself
            return value
        function = getattr(value, "python_function", value)  # tf.function
        function = getattr(function, "__func__", function)  # a bound method
        if not (inspect.isfunction(function) and getattr(function, "__module__", None) == "__main__"):
            return None
        key = id(function)
        if key not in self._trees:
            try:
                self._trees[key] = ast.parse(textwrap.dedent(inspect.getsource(function)))
            except (OSError, TypeError, SyntaxError):  # no source to read (defined by exec)
                self._trees[key] = None
        return self._trees[key]


def _walk_module_scope(node: ast.AST):
    """`ast.walk` that does not enter function bodies, lambdas or classes (their names are not the module's),
    though it yields their definitions."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                         ast.ClassDef)):
            stack += list(getattr(current, "decorator_list", []))
            continue
        stack += list(ast.iter_child_nodes(current))


def _outside_nested_loops(body: list[ast.stmt]):
    """The parts of a loop's body that are not themselves loops (whose steps belong to the nested loop)."""
    for statement in body:
        if isinstance(statement, (ast.For, ast.AsyncFor, ast.While)):
            yield statement.iter if isinstance(statement, (ast.For, ast.AsyncFor)) else statement.test
            continue
        yield statement


def _iter_names(loop: ast.For) -> list[str]:
    """The names a loop's iterable reads as values (`enumerate(ds)`: ds; not the functions it calls)."""
    called = {id(n.func) for n in ast.walk(loop.iter) if isinstance(n, ast.Call)}
    return [n.id for n in ast.walk(loop.iter)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in called]


class _Wrap(ast.NodeTransformer):
    def __init__(self, names: set[str]):
        self.names = names

    def visit_Name(self, node: ast.Name):
        if node.id not in self.names or not isinstance(node.ctx, ast.Load):
            return node
        return ast.copy_location(ast.Call(func=ast.Name(DATA_WRAPPER, ast.Load()),
                                          args=[node, ast.Constant(node.id)], keywords=[]), node)

    def visit_Call(self, node: ast.Call):
        if not isinstance(node.func, ast.Name):  # `f(...)`: f is called, not iterated
            node.func = self.visit(node.func)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        return node

    def visit_Lambda(self, node):  # a lambda's parameters are not the loop's data
        return node


class _WrapSubscripts(_Wrap):
    """Only `name[...]`: the loop's data read by index in its body."""

    def visit_Subscript(self, node: ast.Subscript):
        node.slice = self.visit(node.slice)
        if isinstance(node.value, ast.Name):
            node.value = super().visit_Name(node.value)
        else:
            node.value = self.visit(node.value)
        return node

    def visit_Name(self, node):
        return node

    def visit_FunctionDef(self, node):
        return node
