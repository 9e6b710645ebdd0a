"""What is generated from the strategy registry: README.md's options reference (from the magics' own
argument parsers) and the JupyterLab sidebar's offline list of strategies.

    python scripts/options_reference.py --write README.md                       # the block between the markers
    python scripts/options_reference.py --strategies labextension/src/strategies.ts   # scripts/setup.sh runs it
"""

from __future__ import annotations

import sys
from pathlib import Path

START, END = "<!-- options:start (python scripts/options_reference.py --write README.md) -->", "<!-- options:end -->"


def markdown() -> str:
    """One table per magic: each option with its help text, and for `%%distribute` which strategies read it."""
    from nbdist.magics import NbdistMagics, distribute_parser, parser_actions
    from nbdist.strategies import COMMON_OPTIONS, readers

    common = {option.name for option in COMMON_OPTIONS} | {"mode", "name"}
    blocks = []
    for magic, parser in (("%dist", NbdistMagics.dist.parser), ("%%distribute", distribute_parser())):
        rows = ["| option | what it does |" + (" read by |" if magic == "%%distribute" else ""),
                "|---|---|" + ("---|" if magic == "%%distribute" else "")]
        for action in parser_actions(parser):
            if action.dest == "help":
                continue
            flag = ", ".join(action.option_strings) or action.dest
            if action.option_strings and action.nargs != 0:
                flag += " " + (action.metavar or action.dest.upper())
            text = (action.help or "").replace("|", "\\|")
            if action.choices and not all(str(c) in text for c in action.choices):
                text += f" (one of: {', '.join(map(str, action.choices))})"
            row = f"| `{flag}` | {text} |"
            if magic == "%%distribute":
                row += " all |" if action.dest in common else f" {', '.join(sorted(readers(action.dest))) or '-'} |"
            rows.append(row)
        blocks.append(f"`{magic}`\n\n" + "\n".join(rows))
    return "\n\n".join(blocks) + "\n"


def updated(text: str) -> str:
    """`text` (README.md) with the block between the markers replaced by the current reference."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README.md lacks the markers {START!r} ... {END!r}")
    return f"{head}{START}\n{markdown()}{END}{tail}"


def strategies_module() -> str:
    """The TypeScript module of the sidebar's offline strategy list (before a kernel says which it knows)."""
    from nbdist.strategies import REGISTRY

    names = ",\n".join(f"  '{name}'" for name in REGISTRY)
    return ("// Generated from nbdist's strategy registry by `python scripts/options_reference.py --strategies "
            "labextension/src/strategies.ts`; do not edit.\n\n"
            "/** The strategies offered before a kernel has said which it knows. */\n"
            f"export const DEFAULT_STRATEGIES = [\n{names}\n];\n")


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--write":
        path = Path(argv[1])
        path.write_text(updated(path.read_text()))
    elif len(argv) == 2 and argv[0] == "--strategies":
        path = Path(argv[1])
        if not path.exists() or path.read_text() != strategies_module():  # unchanged: the build stays cached
            path.write_text(strategies_module())
    else:
        print(markdown())


if __name__ == "__main__":
    main(sys.argv[1:])
