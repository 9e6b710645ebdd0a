"""docs/architecture.md and README's Layout match the tree: every package of nbdist/ is in the architecture's
table on the floor scripts/import_graph.py holds it to, every package the table names exists, and README's
Layout names every top-level one."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import script

ROOT = Path(__file__).resolve().parent.parent
import_graph = script("import_graph")


def _packages() -> set[str]:
    """nbdist's packages (nested ones too) as `notebook/`, `strategies/ashl/`, and its top-level modules."""
    package = ROOT / "nbdist"
    found = {f"{p.parent.relative_to(package)}/" for p in package.rglob("__init__.py") if p.parent != package}
    return found | {p.name for p in package.glob("*.py")}


def _table() -> dict[str, str]:
    """{package: floor} from the architecture's table (a row may name two top-level modules)."""
    rows = re.findall(r"^\| ((?:`[\w/.]+`(?:, )?)+) \| ([^|]+) \|", (ROOT / "docs" / "architecture.md").read_text(),
                      re.M)
    return {name: floor.strip() for names, floor in rows for name in re.findall(r"`([\w/.]+)`", names)}


def _floor(name: str) -> str:
    dotted = "nbdist" if name == "__init__.py" else "nbdist." + name.split("/")[0].removesuffix(".py")
    return next(title for title, members in import_graph.FLOORS if dotted in members)


def test_the_architecture_names_every_package_and_only_packages_that_exist():
    table = _table()
    assert set(table) == _packages(), (
        f"in nbdist/, not in docs/architecture.md: {sorted(_packages() - set(table))}; "
        f"in docs/architecture.md, not in nbdist/: {sorted(set(table) - _packages())}")


def test_each_package_is_on_the_floor_the_import_rules_hold_it_to():
    wrong = {name: (floor, _floor(name)) for name, floor in _table().items() if floor != _floor(name)}
    assert not wrong, f"docs/architecture.md's floor against scripts/import_graph.py's FLOORS: {wrong}"


def test_readme_layout_names_every_top_level_package():
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("\nBeside it")]
    top = {name.split("/")[0] + ("/" if "/" in name else "") for name in _packages()}
    assert not {name for name in top if f"`{name}`" not in layout}, sorted(top)
