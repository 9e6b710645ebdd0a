"""The house's import rules, checked from the source (every import, lazy ones inside functions too):
no cycle among nbdist's modules, and `ps/` and `strategies/` import nothing from the floors above them.

    python scripts/import_graph.py          # prints what breaks a rule; exit status 1 if anything does
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nbdist"
# what drives a run from the notebook: nothing in ps/ or strategies/ may import these
UPPER = ("nbdist", "nbdist.magics", "nbdist.session", "nbdist.run", "nbdist.widgets", "nbdist.lab_comm",
         "nbdist.lab_state", "nbdist.cluster", "nbdist.lifeline", "nbdist.engine", "nbdist.experiments",
         "nbdist.bring")
LOWER = {"nbdist.ps": UPPER + ("nbdist.strategies",), "nbdist.strategies": UPPER}


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


def _within(name: str, floor: str) -> bool:
    return name == floor or name.startswith(floor + ".")


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where a module of ps/ or strategies/ imports a floor above it."""
    return sorted((m, t) for m, targets in edges.items() for floor, above in LOWER.items() if _within(m, floor)
                  for t in targets if not _within(t, floor) and any(_within(t, u) if u != "nbdist" else t == u
                                                                    for u in above))


def problems(package: Path = PACKAGE) -> list[str]:
    edges = graph(package)
    return ([f"cycle: {' -> '.join(c)}" for c in cycles(edges)]
            + [f"upward: {m} imports {t}" for m, t in upward(edges)])


if __name__ == "__main__":
    found = problems()
    print("\n".join(found) or f"no cycle and no upward import among {len(modules())} modules")
    sys.exit(1 if found else 0)
