"""The PS under load and under fuzzing: the benchmarks' own scripts, shortened, against real shard processes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # the benchmarks' scripts against shard processes

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def results(script: str, *args: str, timeout: int = 300) -> dict[str, float]:
    done = subprocess.run([sys.executable, script, *args], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=timeout)
    found = {m[0]: float(m[1]) for m in re.findall(r"^RESULT (\w+)=(\S+)$", done.stdout, re.M)}
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return found


def test_many_clients_lose_no_push_and_every_acknowledged_push_is_applied():
    found = results("ps_load.py", "--clients", "8", "--pushes", "100", "--values", "5000")
    assert found["ps_load_lost"] == 0  # and the script's own exit status: every acknowledged push applied


def test_mutated_messages_are_never_applied_and_the_shard_keeps_serving():
    found = results("ps_fuzz.py", "--messages", "1500", "--seed", "1")
    assert found["ps_fuzz_applied"] == 0 and found["ps_fuzz_crashes"] == 0
    assert found["ps_fuzz_unanswered"] == 0 and found["ps_fuzz_good_failed"] == 0
