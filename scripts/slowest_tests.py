"""The slowest tests of a pytest junit file, one per line (seconds, test): `make test` writes build/durations.txt."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree


def slowest(junit: str, count: int) -> list[tuple[float, str]]:
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    timed = [(float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}") for case in cases]
    return sorted(timed, reverse=True)[:count]


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not argv[1].isdigit():
        raise SystemExit("usage: python scripts/slowest_tests.py build/junit.xml 25")
    for seconds, test in slowest(argv[0], int(argv[1])):
        print(f"{seconds:8.2f} s  {test}")


if __name__ == "__main__":
    main(sys.argv[1:])
