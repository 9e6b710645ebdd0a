"""The suite's own guard: a test that leaves an engine of the shared cluster busy fails itself, naming the engine,
and the next test finds the cluster idle again. Run on a throwaway module, in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

TESTS = Path(__file__).resolve().parent
THROWAWAY = '''
import threading

def test_leaves_an_engine_busy(cluster):
    cluster.client[sorted(cluster.client.ids)[0]].apply_async(lambda: threading.Event().wait())

def test_after_it_the_shared_cluster_is_idle(cluster):
    status = cluster.client.queue_status()
    assert not [e for e in cluster.client.ids if status[e]["queue"] or status[e]["tasks"]], status
'''


def test_a_test_that_leaves_an_engine_busy_fails_naming_it_and_the_next_test_finds_it_idle():
    module = TESTS / f"throwaway_{uuid.uuid4().hex[:8]}.py"  # under tests/: the suite's conftest applies
    module.write_text(THROWAWAY)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", str(module), "-p", "no:cacheprovider", "-q", "-rA"],
                              cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "NBDIST_TIME_SCALE": "0.2"})  # the guard waits 6 s, not 30
    finally:
        module.unlink()
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    # the test's own teardown fails (its body passed), the next test passes on an idle cluster
    assert "2 passed, 1 error" in out, out[-3000:]
    name = module.relative_to(TESTS.parent)
    assert f"ERROR {name}::test_leaves_an_engine_busy" in out and f"PASSED {name}::test_after_it" in out, out[-3000:]
    assert (f"EnginesLeftBusy: {name}::test_leaves_an_engine_busy left engine(s) of the shared cluster busy 6 s after "
            "it ended: {0: {'queue': 1, " in out), out[-3000:]
    assert "(they stopped when interrupted)" in out, out[-3000:]
