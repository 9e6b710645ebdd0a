"""Engines share a host's cores (nbdist.host.threads): the split rule, how an engine process applies it, and
the TensorFlow settings read back from the engines of a real cluster (`--threads` parsing: test_magics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nbdist.host import threads
from nbdist.host.threads import Threads
from tests.kernel_driver import KernelDriver
from tests.support import own_cluster


def test_each_engine_gets_its_share_of_its_hosts_cores_at_least_one():
    assert threads.share(2, 2) == Threads(1, 1)
    assert threads.share(2, 4) == Threads(1, 1)  # more engines than cores: one thread each, not zero
    assert threads.share(64, 8) == Threads(8, 8)
    assert threads.share(6, 4) == Threads(1, 1)  # rounded down: 4 engines x 1 thread fit in 6 cores
    assert threads.share(4, 1) == Threads(4, 4)
    assert threads.share(4, 0) == Threads(4, 4)  # an engine not yet counted on its host has the host alone


def test_override_sets_both_pools_and_off_leaves_tensorflows_default():
    assert threads.share(64, 8, override=3) == Threads(3, 3)
    assert threads.share(2, 4, override=6) == Threads(6, 6)  # the user's number, even above the share
    assert threads.share(2, 4, override="off") == Threads() and Threads().environment() == {}
    assert Threads().label() == "default" and Threads(2, 2).label() == "2/2"
    assert Threads(1, 1).environment() == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    with pytest.raises(ValueError, match="override=0"):
        threads.share(2, 2, override=0)


def test_threads_option_values():
    assert [threads.parse(v) for v in (None, "auto", "off", "OFF", "1", "12")] == [None, None, "off", "off", 1, 12]
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(ValueError, match=f"--threads takes a number .* Received: --threads {bad}"):
            threads.parse(bad)


def test_cores_are_the_affinity_within_a_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    assert threads.engine_cores(str(tmp_path / "absent")) == affinity
    quota.write_text("max 100000\n")
    assert threads.engine_cores(str(quota)) == affinity
    quota.write_text("50000 100000\n")  # half a core: still one thread
    assert threads.engine_cores(str(quota)) == 1
    quota.write_text(f"{100000 * affinity + 1} 100000\n")  # a quota above the affinity does not add cores
    assert threads.engine_cores(str(quota)) == affinity


# What an engine does, in a fresh process each: pin before TensorFlow is imported, after it is imported,
# after its context started; then an op runs and the inter-op pool's threads are counted.
PIN = """
import json, os, sys
from nbdist.host import threads
when = sys.argv[1]
if when != "before":
    import tensorflow as tf
if when == "late":
    tf.constant(1.0) + 1.0  # TensorFlow's context starts here
threads.pin(engines=int(sys.argv[2]), override=json.loads(sys.argv[3]))
import tensorflow as tf
tf.function(lambda a: tf.matmul(a, a))(tf.ones((64, 64)))
from pathlib import Path
compute = [t for t in Path("/proc/self/task").iterdir() if (t / "comm").read_text().strip() == "tf_Compute"]
print(json.dumps({"applied": threads.applied(), "env": os.environ.get("TF_NUM_INTRAOP_THREADS"),
                  "tf": [tf.config.threading.get_intra_op_parallelism_threads(),
                         tf.config.threading.get_inter_op_parallelism_threads()], "inter_pool": len(compute)}))
"""


def _pinned_process(when: str, engines: int, override=None) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for name in (threads.INTRA_ENV, threads.INTER_ENV):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", PIN, when, str(engines), json.dumps(override)], env=env, check=False,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.cluster  # starts processes
def test_engine_pinned_before_tensorflow_starts_gets_its_threads_by_environment():
    share = threads.share(threads.engine_cores(), 2)
    seen = _pinned_process("before", engines=2)
    assert seen["applied"] == {"threads": share.label(), "how": "environment"}
    assert seen["env"] == str(share.intra) and seen["tf"] == [0, 0]  # TensorFlow read the variables
    assert seen["inter_pool"] == share.inter  # ... and started that many inter-op threads


@pytest.mark.cluster  # starts processes
def test_engine_that_imported_tensorflow_first_gets_them_through_tf_config():
    seen = _pinned_process("after-import", engines=1, override=3)
    assert seen["applied"] == {"threads": "3/3", "how": "tf.config"}
    assert seen["tf"] == [3, 3] and seen["inter_pool"] == 3 and seen["env"] is None


@pytest.mark.cluster  # starts processes
def test_engine_whose_tensorflow_already_started_records_why_not():
    seen = _pinned_process("late", engines=1, override=3)
    assert seen["applied"]["threads"] == "default"
    assert seen["applied"]["how"] == "not applied: Intra op parallelism cannot be modified after initialization."
    assert seen["inter_pool"] == len(os.sched_getaffinity(0))  # TensorFlow's default: one per core


# -- on a real cluster -----------------------------------------------------------------------
def _engine_threads():
    """Runs on an engine: its TensorFlow thread settings after one op, and its inter-op pool's size."""
    import os
    from pathlib import Path

    import tensorflow as tf

    tf.function(lambda a: tf.matmul(a, a))(tf.ones((64, 64)))
    pool = [t for t in Path("/proc/self/task").iterdir() if (t / "comm").read_text().strip() == "tf_Compute"]
    return {"env": [os.environ.get("TF_NUM_INTRAOP_THREADS"), os.environ.get("TF_NUM_INTEROP_THREADS")],
            "tf": [tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads()],
            "inter_pool": len(pool)}


cluster = own_cluster(engines=2)  # its engines' TensorFlow starts after nbdist pins them


@pytest.fixture(scope="module")
def threads_kernel(cluster):
    """A kernel with nbdist loaded and connected to this module's cluster."""
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.connected = driver.run(f"%dist connect --cluster-id {cluster.cluster_id}", timeout=180).check().stdout
        yield driver
    finally:
        driver.stop()


def _threads_column(status: str) -> list[str]:
    lines = status.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["id", "host"])
    column = lines[header].split().index("threads")
    return [line.split()[column] for line in lines[header + 2:] if line[:1].isdigit()]


@pytest.mark.timeout(400)
def test_connected_engines_share_this_hosts_cores(cluster, threads_kernel):
    client = cluster.client
    share = threads.share(len(os.sched_getaffinity(0)), 2)  # 2 engines on this host
    assert _threads_column(threads_kernel.connected) == [share.label()] * 2, threads_kernel.connected
    seen = client[:].apply_sync(_engine_threads)
    assert seen == [{"env": [str(share.intra), str(share.inter)], "tf": [0, 0], "inter_pool": share.inter}] * 2
    status = threads_kernel.run("%dist status", timeout=120).check().stdout
    assert _threads_column(status) == [share.label()] * 2, status


@pytest.mark.timeout(400)
def test_threads_override_holds_for_engines_added_later(threads_kernel):
    try:
        started = threads_kernel.run("%dist start -n 1 --threads 3", timeout=240).check().stdout
        assert _threads_column(started) == ["3/3"], started
        added = threads_kernel.run("%dist add -n 1", timeout=240).check().stdout
        assert _threads_column(added) == ["3/3", "3/3"], added
        seen = threads_kernel.value("nbdist.get_session().cluster.client[:].apply_sync(lambda: [__import__('os')"
                                    ".environ.get(v) for v in ('TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS')])")
        assert seen == [["3", "3"], ["3", "3"]]
    finally:
        threads_kernel.run("%dist stop", timeout=120)
