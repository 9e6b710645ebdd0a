"""README.md's options reference is the magics' own help, regenerated."""

from __future__ import annotations

from pathlib import Path

from tests.support import script

options_reference = script("options_reference")

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_options_match_the_magics_parsers():
    text = README.read_text()
    assert options_reference.updated(text) == text, (
        "README.md's options table is stale: run `python scripts/options_reference.py --write README.md`")


def test_every_strategy_option_is_listed_with_its_readers():
    table = options_reference.markdown()
    assert "`--simulate" in table and "`--lam0" in table and "`--engines LAUNCHER`" in table
    row = next(line for line in table.splitlines() if line.startswith("| `--max-staleness"))
    assert "nfdt" in row and "ashl" not in row and "hfdt" not in row
