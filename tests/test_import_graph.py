"""The house's import rules hold: no cycle among modules or packages, lazy imports included, no package imports a
floor above its own, every package sits on a floor (scripts/import_graph.py); and the checker finds each kind of
fault where it is."""

from __future__ import annotations

from tests.support import script

import_graph = script("import_graph")


def test_nbdist_has_no_cycle_and_no_upward_import():
    assert import_graph.problems() == []


def test_the_checker_finds_a_lazy_cycle_and_an_upward_import(tmp_path):
    package = tmp_path / "nbdist"
    (package / "ps").mkdir(parents=True)
    (package / "notebook").mkdir()
    (package / "__init__.py").write_text("")
    (package / "notebook" / "__init__.py").write_text("")
    (package / "notebook" / "session.py").write_text("from ..ps import shard\n")
    (package / "ps" / "__init__.py").write_text("")
    (package / "ps" / "shard.py").write_text("def later():\n    from ..notebook import session\n")
    assert import_graph.problems(package) == ["cycle: nbdist.notebook.session -> nbdist.ps.shard",
                                              "package cycle: nbdist.notebook -> nbdist.ps",
                                              "upward: nbdist.ps.shard imports nbdist.notebook.session"]


def test_the_engines_side_may_not_import_the_notebooks_and_every_package_has_a_floor(tmp_path):
    package = tmp_path / "nbdist"
    for name in ("engine", "notebook", "gadgets"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "notebook" / "session.py").write_text("from ..engine import engine\n")
    (package / "engine" / "engine.py").write_text("def later():\n    from ..notebook import report\n")
    (package / "notebook" / "report.py").write_text("")
    assert import_graph.problems(package) == ["package cycle: nbdist.engine -> nbdist.notebook",
                                              "upward: nbdist.engine.engine imports nbdist.notebook.report",
                                              "unplaced: nbdist.gadgets is on no floor (scripts/import_graph.py "
                                              "FLOORS, docs/architecture.md)"]
