"""The house's import rules hold: no cycle, lazy imports included, and ps/ and strategies/ import nothing above
them (scripts/import_graph.py); and the checker finds both kinds of fault where they are."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"
spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)


def test_nbdist_has_no_cycle_and_no_upward_import():
    assert import_graph.problems() == []


def test_the_checker_finds_a_lazy_cycle_and_an_upward_import(tmp_path):
    package = tmp_path / "nbdist"
    (package / "ps").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "session.py").write_text("from .ps import shard\n")
    (package / "ps" / "__init__.py").write_text("")
    (package / "ps" / "shard.py").write_text("def later():\n    from .. import session\n")
    assert import_graph.problems(package) == ["cycle: nbdist.ps.shard -> nbdist.session",
                                              "upward: nbdist.ps.shard imports nbdist.session"]
