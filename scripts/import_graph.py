"""The house's import rules, checked from the source (every import, lazy ones inside functions too): no cycle
among nbdist's modules, and none among its packages; and no package imports one on a floor above its own (the
floors of docs/architecture.md: the engine's side imports nothing of the notebook's side, the shared floor neither,
the leaves nothing but leaves). Every package of nbdist sits on a floor.

    python scripts/import_graph.py          # prints what breaks a rule; exit status 1 if anything does
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nbdist"
# top to bottom; a package imports its own floor's packages (without a cycle) and the floors below
FLOORS = (
    ("the doors", ("nbdist", "nbdist.magics", "nbdist.experiments")),
    ("the notebook's side", ("nbdist.notebook", "nbdist.cluster")),
    ("the engine's side", ("nbdist.engine",)),
    ("shared by both sides", ("nbdist.planner", "nbdist.strategies", "nbdist.model_parts", "nbdist.ps")),
    ("the leaves", ("nbdist.host", "nbdist.keras_semantics", "nbdist.datasets", "nbdist.errors", "nbdist.limits",
                    "nbdist.horovod")),
)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports (an imported attribute counts as its module)."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(package)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """The top-level package (or top-level module) of nbdist that `module` belongs to."""
    return ".".join(module.split(".")[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in edges.items():
        out.setdefault(package_of(module), set()).update(package_of(t) for t in targets)
    return {p: targets - {p} for p, targets in out.items()}


def floor_of(package: str) -> int | None:
    return next((i for i, (_, members) in enumerate(FLOORS) if package in members), None)


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) modules where the imported module's package is on a floor above the importer's."""
    found = set()
    for module, targets in edges.items():
        here = floor_of(package_of(module))
        for target in targets:
            there = floor_of(package_of(target))
            if here is not None and there is not None and there < here:
                found.add((module, target))
    return sorted(found)


def problems(package: Path = PACKAGE) -> list[str]:
    edges = graph(package)
    packages = package_graph(edges)
    return ([f"cycle: {' -> '.join(c)}" for c in cycles(edges)]
            + [f"package cycle: {' -> '.join(c)}" for c in cycles(packages)]
            + [f"upward: {m} imports {t}" for m, t in upward(edges)]
            + [f"unplaced: {p} is on no floor (scripts/import_graph.py FLOORS, docs/architecture.md)"
               for p in sorted(packages) if floor_of(p) is None])


if __name__ == "__main__":
    found = problems()
    print("\n".join(found) or f"no cycle and no upward import among {len(modules())} modules "
                               f"in {len(package_graph(graph()))} packages on {len(FLOORS)} floors")
    sys.exit(1 if found else 0)
