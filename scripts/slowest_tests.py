"""The slowest tests of pytest junit files, one per line (seconds, test): `make test` writes build/durations.txt."""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ElementTree


def slowest(junits: list[str], count: int) -> list[tuple[float, str]]:
    cases = [case for junit in junits for case in ElementTree.parse(junit).getroot().iter("testcase")]
    timed = [(float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}") for case in cases]
    return sorted(timed, reverse=True)[:count]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python scripts/slowest_tests.py 25 build/junit.xml [build/junit-alone.xml ...]")
    for seconds, test in slowest([j for j in argv[1:] if os.path.exists(j)], int(argv[0])):
        print(f"{seconds:8.2f} s  {test}")


if __name__ == "__main__":
    main(sys.argv[1:])
