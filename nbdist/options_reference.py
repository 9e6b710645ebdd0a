"""The options reference of README.md, generated from the magics' own argument parsers.

    python -m nbdist.options_reference --write README.md   # refresh the block between the markers
"""

from __future__ import annotations

import sys
from pathlib import Path

START, END = "<!-- options:start (python -m nbdist.options_reference --write README.md) -->", "<!-- options:end -->"


def markdown() -> str:
    """One table per magic: each option with its help text, and for `%%distribute` which strategies read it."""
    from .magics import NbdistMagics
    from .strategies import COMMON_OPTIONS, REGISTRY

    common = {option.dest for option in COMMON_OPTIONS} | {"mode", "name"}
    blocks = []
    for magic, parser in (("%dist", NbdistMagics.dist.parser), ("%%distribute", NbdistMagics.distribute.parser)):
        rows = ["| option | what it does |" + (" read by |" if magic == "%%distribute" else ""),
                "|---|---|" + ("---|" if magic == "%%distribute" else "")]
        for action in parser._actions:
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
                readers = [n for n, cls in sorted(REGISTRY.items()) if action.dest in cls.options]
                row += " all |" if action.dest in common else f" {', '.join(readers) or '-'} |"
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


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--write":
        path = Path(argv[1])
        path.write_text(updated(path.read_text()))
    else:
        print(markdown())


if __name__ == "__main__":
    main(sys.argv[1:])
