"""`%dist start / status / stop` and `%dist connect --file` through a real kernel."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.conftest import DEFINITION
from tests.kernel_driver import KernelDriver
from tests.support import SGD_CELL, eventually, paused_in_first_two_epochs

pytestmark = pytest.mark.cluster


@pytest.fixture
def fresh_kernel():
    driver = KernelDriver()
    pids: list[int] = []
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        yield driver, pids
    finally:
        try:
            driver.run("%dist stop", timeout=60)
        finally:
            driver.stop()
            for pid in pids:  # backstop: never leave an engine behind
                if psutil.pid_exists(pid):
                    os.kill(pid, signal.SIGKILL)


def test_start_status_stop(fresh_kernel):
    kernel, pids = fresh_kernel
    started = kernel.run("%dist start -n 1", timeout=180).check().stdout
    head = next(line.split() for line in started.splitlines() if line.split()[:2] == ["id", "host"])
    rows = [dict(zip(head, line.split())) for line in started.splitlines() if line[:1].isdigit()]
    assert len(rows) == 1
    engine_id, pid, gpus, state = (rows[0][k] for k in ("id", "pid", "gpus", "state"))
    tf_version, keras_version, hvd_version = (rows[0][k] for k in ("tensorflow", "keras", "horovod"))
    pids.append(int(pid))
    assert (engine_id, state, gpus) == ("0", "idle", "0")
    assert tf_version.startswith("2.21") and keras_version.startswith("3.") and hvd_version == "0.28.1"
    assert psutil.pid_exists(int(pid))
    added = kernel.run("%dist add -n 1", timeout=180).check().stdout
    assert "started engine(s) [1]" in added, added
    rows = [line.split() for line in added.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[-1]) for row in rows] == [("0", "idle"), ("1", "idle")]
    pids.append(int(rows[1][2]))
    assert "cluster stopped" in kernel.run("%dist stop", timeout=60).check().stdout
    for engine_pid in pids:  # the added engine goes with the cluster too
        assert not psutil.pid_exists(engine_pid) or psutil.Process(engine_pid).status() == psutil.STATUS_ZOMBIE


def test_connect_by_file_then_disconnect_leaves_cluster_running(fresh_kernel, cluster):
    kernel, _ = fresh_kernel
    ipp_cluster, client = cluster
    connection_file = os.path.join(ipp_cluster.profile_dir, "security",
                                   f"ipcontroller-{ipp_cluster.cluster_id}-client.json")
    status = kernel.run(f"%dist connect --file {connection_file}", timeout=120).check().stdout
    assert len([line for line in status.splitlines() if line[:1].isdigit()]) >= 2
    refused = kernel.run("%dist add -n 1")
    assert refused.ename == "ClusterError" and "ipengine --file" in refused.evalue, refused.error_text
    assert "keeps running" in kernel.run("%dist stop").check().stdout
    assert len(client.ids) >= 2


def test_connect_to_nothing_fails_fast_with_advice(fresh_kernel, tmp_path):
    kernel, _ = fresh_kernel
    reply = kernel.run(f"%dist connect --file {tmp_path / 'missing.json'}", timeout=60)
    assert reply.ename == "ClusterError", reply.error_text
    assert "could not connect" in reply.evalue and "%dist start" in reply.evalue


def engine_pids(stdout: str) -> dict[int, int]:
    """Engine id -> pid, from the engine table `%dist start` and `%dist status` print."""
    return {int(row[0]): int(row[2]) for row in (line.split() for line in stdout.splitlines() if line[:1].isdigit())}


def test_a_dead_worker_engine_is_replaced_and_the_new_engine_joins_the_run(fresh_kernel):
    kernel, pids = fresh_kernel
    started = engine_pids(kernel.run("%dist start -n 2", timeout=180).check().stdout)
    pids += started.values()
    kernel.run("%%distribute define --name data\n" + DEFINITION, timeout=120).check()
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=4, steps="None", shuffle=True).replace(
        "validation_data=", "callbacks=[Gate()], validation_data=")
    with paused_in_first_two_epochs(kernel, "--strategy nfdt --workers 2", cell):  # nothing trains until it is in
        os.kill(started[1], signal.SIGKILL)
        joined, = eventually(kernel, "nbdist.last_run.events_of('worker_joined')", timeout=120)
        pids += engine_pids(kernel.run("%dist status", timeout=60).check().stdout).values()
        kernel.run("nbdist.last_run.control('resume')").check()
        reply = kernel.run("%dist wait", timeout=300).check()
    events = kernel.value("[(e['event'], e.get('engine')) for e in nbdist.last_run.events if 'control' not in e['event']]")
    assert events[:3] == [["worker_died", 1], ["engine_restarted", 1], ["worker_joined", 2]], events
    assert (joined["engine"], joined["rank"]) == (2, 2)
    assert "a new engine was started in its place" in reply.stdout
    counts = kernel.value("nbdist.last_run.ps[0]['counts']")
    assert counts["applied"] == counts["acked"] > 0 and counts["rejected"] == 0, counts
    assert kernel.value("len(nbdist.last_run.results[2][0].history['loss'])") == 4 - joined["first_epoch"]
