"""A dead kernel or script takes the cluster it started with it; a cluster started outside survives.

Real processes throughout: kernels started by jupyter_client, scripts, `ipcluster start`. Every
process a test sees is recorded (pid and start time, as psutil.Process) before anything is
killed, killed again by that record in the fixture's teardown if still alive, and checked by it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid

import ipyparallel as ipp
import psutil
import pytest

from nbdist.host import namespace
from tests.conftest import DEFINITION, TRAIN
from tests.kernel_driver import KernelDriver
from tests.support import eventually, scaled, wait_for

pytestmark = pytest.mark.cluster

GONE_DEADLINE_S = 30  # how long a test waits for what a dead kernel started to be gone (scaled; generous)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import json, signal, sys
from nbdist.cluster.cluster import ClusterHandle
handle = ClusterHandle.start(1)
print(json.dumps({"watcher": handle.lifeline.pid, "record": handle.lifeline.record}), flush=True)
signal.pause()  # until the test's signal
"""


def as_from_a_shell() -> None:
    """In the child before exec: SIGINT's default action, unblocked. A child inherits an ignored or blocked
    SIGINT from this pytest process (whatever earlier tests left), and Python then never raises
    KeyboardInterrupt: the SIGINT case failed in full suite runs and passed alone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def alive(process: psutil.Process) -> bool:
    """Running and still the process recorded (a reused pid is not it); a zombie has exited."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def left_after(processes: list[psutil.Process], seconds: float = GONE_DEADLINE_S) -> list[psutil.Process]:
    """Those of `processes` still alive once all have exited or `seconds` (scaled) passed."""
    try:
        wait_for(lambda: not any(alive(p) for p in processes), "the processes to exit", seconds, every=0.1)
    except AssertionError:
        pass
    return [p for p in processes if alive(p)]


def describe(processes) -> str:
    rows = []
    for p in processes:
        try:
            rows.append(f"{p.pid} {' '.join(p.cmdline()[1:4])}")
        except psutil.Error:
            rows.append(f"{p.pid} (gone)")
    return "; ".join(rows)


def read_line(process: subprocess.Popen, timeout: float) -> str:
    """One line of the process's stdout, or an AssertionError naming what it wrote to stderr."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if select.select([process.stdout], [], [], 0.2)[0]:
            line = process.stdout.readline()
            if line:
                return line
        if process.poll() is not None:
            break
    raise AssertionError(f"no line from pid {process.pid} within {timeout} s (exit {process.poll()})")


@pytest.fixture
def reaper():
    """Records processes; at teardown kills, by the record, any still alive, and stops kernels."""
    recorded: list[psutil.Process] = []
    kernels: list[KernelDriver] = []

    class Reaper:
        def record(self, processes):
            recorded.extend(processes)
            return list(processes)

        def tree(self, pid: int) -> list[psutil.Process]:
            root = psutil.Process(pid)
            return self.record([root, *root.children(recursive=True)])

        def kernel(self) -> KernelDriver:
            driver = KernelDriver(cwd=REPO)
            kernels.append(driver)
            return driver

    try:
        yield Reaper()
    finally:
        for driver in kernels:
            try:
                driver.stop()
            except Exception:  # a kernel the test killed has nothing left to shut down
                pass
        for process in recorded:
            if alive(process):
                process.kill()


def kernel_pid(driver: KernelDriver) -> int:
    return driver.value("__import__('os').getpid()")


def test_kernel_killed_hard_takes_its_cluster_and_shards_with_it(reaper):
    kernel = reaper.kernel()
    kernel.run("%load_ext nbdist\nimport nbdist").check()
    kernel.run("%dist start -n 2", timeout=180).check()
    kernel.run("%%distribute define --name data\n" + DEFINITION, timeout=180).check()
    kernel.run("%%distribute --strategy nfdt --workers 2 --background --progress none\n" + TRAIN.format(epochs=500),
               timeout=120).check()
    eventually(kernel, "bool(nbdist.last_run.progress) or nbdist.last_run.status not in ('pending', 'running')",
               timeout=120)
    assert kernel.value("nbdist.last_run.status") == "running"
    shards = kernel.value("[s.pid for s in nbdist.last_run.controller.service.shards]")
    watcher = kernel.value("nbdist.get_session().cluster.lifeline.pid")
    pid = kernel_pid(kernel)
    processes = reaper.tree(pid)[1:]
    pids = {p.pid for p in processes}
    assert set(shards) <= pids and watcher in pids
    assert len(processes) >= 15  # controller (9), 2 engines and their nannies, the shard, the watcher
    # the workers and the shard speak through shared memory and a Unix socket (the same-host path)
    wait_for(lambda: len(same_host_files(shards)) >= 4, "the workers' and the shard's segments", 60)
    files = same_host_files(shards)
    assert any(os.path.isdir(f) and oct(os.stat(f).st_mode & 0o777) == "0o700" for f in files), files
    assert any(f.startswith("/dev/shm/") and "-w0-" in f for f in files), files

    os.kill(pid, signal.SIGKILL)  # what the OOM killer or restart_kernel(now=True) does
    left = left_after(processes)
    assert not left, f"still alive {GONE_DEADLINE_S} s after the kernel was killed: {describe(left)}"
    assert same_host_files(shards) == [], "a segment or socket directory outlived the killed kernel's run"


def same_host_files(shard_pids) -> list[str]:
    """The shared-memory segments and socket directories of these shards (and their workers')."""
    from nbdist.ps.same_host import leftovers

    return [path for pid in shard_pids for path in leftovers(pid)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_script_stops_its_cluster_on_a_signal(reaper, sig):
    script = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_shell)
    reaper.record([psutil.Process(script.pid)])
    try:
        started = json.loads(read_line(script, 120))
        processes = reaper.tree(script.pid)[1:]
        assert started["watcher"] in {p.pid for p in processes} and os.path.exists(started["record"])
        script.send_signal(sig)
        assert script.wait(scaled(GONE_DEADLINE_S)) == -sig  # it stopped its cluster, then died of the signal
        left = left_after(processes)
        assert not left, f"still alive {GONE_DEADLINE_S} s after {sig.name}: {describe(left)}"
        assert not os.path.exists(started["record"])
    finally:
        if script.poll() is None:
            script.kill()
        script.wait(10)
        script.stdout.close()
        script.stderr.close()


def test_next_kernel_reports_a_stale_cluster_and_stops_it(reaper):
    first = reaper.kernel()
    first.run("%load_ext nbdist\nimport nbdist").check()
    first.run("%dist start -n 1", timeout=180).check()
    cluster_id = first.value("nbdist.get_session().cluster.cluster.cluster_id")
    watcher = psutil.Process(first.value("nbdist.get_session().cluster.lifeline.pid"))
    first_kernel, *processes = reaper.tree(kernel_pid(first))
    cluster = [p for p in processes if p.pid != watcher.pid]
    watcher.kill()  # a watcher killed along with its kernel leaves the cluster behind: stale
    first_kernel.kill()
    assert not left_after([watcher, first_kernel])
    assert all(alive(p) for p in cluster)

    second = reaper.kernel()
    second.run("%load_ext nbdist").check()
    status = second.run("%dist status", timeout=60).check().stdout
    assert f"cluster id {cluster_id}" in status and "previous kernel" in status, status
    assert "%dist connect --file" in status and "%dist stop --stale" in status
    stopped = second.run("%dist stop --stale", timeout=60).check().stdout
    assert cluster_id in stopped and "stopped 1 cluster" in stopped, stopped
    left = left_after(cluster)
    assert not left, f"still alive after %dist stop --stale: {describe(left)}"
    assert second.run("%dist status").ename == "ClusterError"  # nothing stale left, no cluster here


@pytest.fixture
def outside_cluster(tmp_path, reaper):
    """A cluster started with `ipcluster start` (as on real hosts), stopped by its own SIGINT at the end."""
    cluster_id = f"outside-{uuid.uuid4().hex[:6]}"
    ipcluster = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ipcluster"), "start", "-n", "1",
                                  f"--profile-dir={tmp_path}", f"--cluster-id={cluster_id}", "--log-level=WARN"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    reaper.record([psutil.Process(ipcluster.pid)])
    client_file = tmp_path / "security" / f"ipcontroller-{cluster_id}-client.json"
    try:
        wait_for(lambda: client_file.exists() or ipcluster.poll() is not None, "ipcluster start to come up", 120)
        assert ipcluster.poll() is None, "ipcluster start exited"
        client = ipp.Client(str(client_file), timeout=60)
        client.wait_for_engines(1, timeout=120)
        yield str(client_file), client, reaper.tree(ipcluster.pid)[1:]
        client.close()
    finally:
        ipcluster.send_signal(signal.SIGINT)
        try:
            ipcluster.wait(30)
        except subprocess.TimeoutExpired:
            ipcluster.kill()
            ipcluster.wait(10)


def test_cluster_started_outside_survives_the_kernel_and_is_released(reaper, outside_cluster):
    client_file, client, processes = outside_cluster
    kernel = reaper.kernel()
    kernel.run("%load_ext nbdist\nimport nbdist").check()
    kernel.run(f"%dist connect --file {client_file}", timeout=120).check()
    kernel.run("%%distribute define --name marker\nnbdist_marker = 42").check()
    kernel.run("nbdist.get_session().sync_definitions([0])", timeout=60).check()
    assert client[0].pull("nbdist_marker", block=True) == 42 and client[0].apply_sync(namespace.definition_digests)
    watcher = psutil.Process(kernel.value("nbdist.get_session().cluster.lifeline.pid"))
    log = kernel.value("nbdist.get_session().cluster.lifeline.log")
    reaper.record([watcher])
    kernel.run("%%distribute define --name data\n" + DEFINITION, timeout=180).check()
    kernel.run("%%distribute --strategy local --background --progress none\n" + TRAIN.format(epochs=500),
               timeout=120).check()
    eventually(kernel, "bool(nbdist.last_run.progress)", timeout=120)
    assert kernel.value("nbdist.last_run.status") == "running"

    os.kill(kernel_pid(kernel), signal.SIGKILL)
    assert not left_after([watcher]), "the watcher of a connected cluster did not exit"
    # the dead kernel's training was interrupted: the engine is free for the next client (the hub counts the
    # interrupted task done a moment after the watcher saw its release answered)
    wait_for(lambda: not (lambda s: s["queue"] or s["tasks"])(client.queue_status(targets=[0])[0]),
             "the engine to be free for the next client", 30, explain=lambda: why_busy(client, processes, log))
    assert all(alive(p) for p in processes), "a process of the cluster started outside died with the kernel"
    assert client.ids == [0] and client[0].apply_sync(os.getpid) in {p.pid for p in processes}
    assert client[0].apply_sync(namespace.definition_digests) == {}  # released: the dead kernel's objects are gone
    with pytest.raises(ipp.error.RemoteError, match="nbdist_marker"):
        client[0].pull("nbdist_marker", block=True)


def why_busy(client, processes, log: str) -> str:
    """What a still-busy engine of the outside cluster was doing: the hub's queue, the watcher's log (kept when the
    release went wrong) and each process's Python stacks (py-spy, where installed)."""
    parts = [f"the hub's queue: {client.queue_status(targets=[0], verbose=True)}"]
    parts.append(f"the watcher's log {log}: " + (open(log).read() if os.path.exists(log) else "(removed: no warning)"))
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    for process in processes if os.path.exists(spy) else ():
        dump = subprocess.run([spy, "dump", "--pid", str(process.pid)], capture_output=True, text=True, timeout=60)
        parts.append(f"{process.pid} {' '.join(process.cmdline()[:3])}:\n{dump.stdout[-4000:]}{dump.stderr[-500:]}")
    return "\n".join(parts)


def test_engines_stop_by_themselves_when_their_controller_is_gone(reaper):
    """What makes engines on other hosts go: nbdist's engines give up after 5 missed heartbeats."""
    from nbdist.cluster.cluster import ClusterHandle

    handle = ClusterHandle.start(1)
    try:
        controller = reaper.tree(handle.cluster.controller.process.pid)
        engines = [p for launcher in handle.cluster.engine_set.launchers.values()
                   for p in reaper.tree(launcher.process.pid)]  # each engine and its nanny
        for process in controller:
            process.kill()
        heartbeats_s = 5 * 1.5  # max_heartbeat_misses x (HeartMonitor.period + 0.5 s)
        left = left_after(engines, heartbeats_s + GONE_DEADLINE_S)
        assert not left, f"still alive {heartbeats_s + GONE_DEADLINE_S} s after their controller: {describe(left)}"
    finally:
        handle.stop()


def test_stale_means_this_notebook_a_dead_kernel_and_a_cluster_still_running(tmp_path, monkeypatch):
    """The record logic alone: this process stands in for live processes, a wrong start time for a dead one."""
    from nbdist.cluster import lifeline

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    security = tmp_path / "profile_x" / "security"
    security.mkdir(parents=True)
    running = security / "cluster-running.json"
    running.write_text(json.dumps({"controller": {"class": "local", "state": {"pid": os.getpid()}}}))
    me, dead = {"kernel_pid": os.getpid(), "kernel_started": psutil.Process().create_time()}, {
        "kernel_pid": os.getpid(), "kernel_started": 0.0}  # same pid, another start: the pid was reused
    records = {
        "stale": {**dead, "notebook": lifeline.notebook_id(), "cluster_file": str(running)},
        "other-notebook": {**dead, "notebook": "elsewhere.ipynb", "cluster_file": str(running)},
        "stopped": {**dead, "notebook": lifeline.notebook_id(), "cluster_file": str(security / "gone.json")},
        "live-kernel": {**me, "notebook": lifeline.notebook_id(), "cluster_file": str(running)},
    }
    for cluster_id, record in records.items():
        (security / f"nbdist-{cluster_id}.json").write_text(json.dumps(
            {**record, "cluster_id": cluster_id, "client_file": f"/c/{cluster_id}.json", "n": 2, "engines": "local"}))

    stale = lifeline.stale_clusters()
    assert [r["cluster_id"] for r in stale] == ["stale"]
    assert not (security / "nbdist-stopped.json").exists()  # a record of a cluster that is gone is dropped
    assert (security / "nbdist-other-notebook.json").exists() and (security / "nbdist-live-kernel.json").exists()
    notice = lifeline.describe_stale(stale)
    assert "cluster id stale (2 local engine(s)" in notice and "%dist connect --file /c/stale.json" in notice
    assert lifeline.adoptable(stale, "/c/stale.json")["cluster_id"] == "stale"
    assert lifeline.adoptable(stale, "/c/other.json") is None


def test_a_watcher_whose_hub_is_gone_still_says_so_and_ends(monkeypatch):
    """The watcher's report of what the hub holds (written when a release went wrong) is bounded: ipyparallel's
    `queue_status` waits for ever for a hub that stopped, and watchers of the suite's module kernels waited there
    for good once their cluster had gone."""
    from dataclasses import replace

    from nbdist.cluster import lifeline

    cluster = ipp.Cluster(n=0, cluster_id=f"gone-hub-{uuid.uuid4().hex[:6]}", log_level=30)
    cluster.start_controller_sync()
    try:
        client = cluster.connect_client_sync()
        assert "'unassigned'" in lifeline._queues(client)  # a hub that answers (within the limit): what it holds
    finally:
        cluster.stop_controller_sync()
    monkeypatch.setattr(lifeline, "LIMITS", replace(lifeline.LIMITS, watcher_release_s=1.0))
    try:  # (a call that waited for ever would end in pytest-timeout's failure, not here)
        assert lifeline._queues(client) == "the hub did not say what it holds within 1 s"
    finally:
        client.close()
