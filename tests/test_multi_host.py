"""Two engine "hosts" on one machine: each engine in its own network namespace (reached over a
bridge, addresses only on those veths), with its own host name and its own /etc/hosts naming
every host (as DNS would), started with the README's multi-host steps verbatim. HFDT and NFDT
must train across them, nothing assuming localhost."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEFINITION
from tests.kernel_driver import KernelDriver
from tests.support import eventually, wait_for

README = Path(__file__).resolve().parent.parent / "README.md"
BRIDGE, SUBNET = "nbd-br0", "10.213.0"
HEAD_IP = f"{SUBNET}.1"
HOSTS = ("node1", "node2")
START_TIMEOUT_S = 120

CELL = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, validation_data=(xt[:500], yt[:500]))
'''


def readme_steps() -> dict[str, str]:
    """The shell commands of README.md's multi-host block, by program (ipcontroller, ipengine)."""
    block = README.read_text().split("<!-- multi-host steps -->", 1)[1]
    commands = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    lines = [line for line in commands.splitlines() if line.strip() and not line.startswith("#")]
    return {line.split()[0]: line for line in lines}


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def _namespaces_allowed() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["ip", "netns", "add", "nbd-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "nbd-probe"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """The README's controller on the bridge address, one README engine per namespace; all removed after."""
    if not _namespaces_allowed():
        pytest.skip("network namespaces need root (ip netns); run as root, or in CI")
    ipython_dir = tmp_path_factory.mktemp("ipython")
    logs = tmp_path_factory.mktemp("logs")
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("NBDIST_RENDEZVOUS_ADDR", None)
    env["PYTHONFAULTHANDLER"] = "1"
    steps = readme_steps()
    processes: list[subprocess.Popen] = []
    try:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{HEAD_IP}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i, _ in enumerate(HOSTS, start=1):
            ns, outside, inside = f"nbd-host{i}", f"nbd-v{i}", f"nbd-p{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh("ip", "link", "set", outside, "master", BRIDGE, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", inside)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        controller = steps["ipcontroller"].replace("$HEAD_IP", HEAD_IP)
        processes.append(subprocess.Popen(shlex.split(controller), env=env, start_new_session=True,
                                          stdout=open(logs / "controller.log", "w"), stderr=subprocess.STDOUT))
        engine_file = ipython_dir / "profile_nbdist" / "security" / "ipcontroller-engine.json"
        wait_for(lambda: engine_file.exists() or processes[0].poll() is not None, "the controller's engine file",
                 START_TIMEOUT_S)
        assert processes[0].poll() is None, (logs / "controller.log").read_text()
        engine = steps["ipengine"].replace("$ENGINE_FILE", str(engine_file))
        hosts_file = logs / "hosts"  # Horovod needs host names that resolve (it crashes on one that does not)
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{10 + i} {name}\n"
                                                             for i, name in enumerate(HOSTS, start=1)))
        for i, name in enumerate(HOSTS, start=1):
            # the host's own network (a netns), name (a UTS namespace) and /etc/hosts (a mount namespace)
            command = ["ip", "netns", "exec", f"nbd-host{i}", "unshare", "--uts", "--mount", "sh", "-c",
                       f"mount --bind {hosts_file} /etc/hosts && hostname {name} && exec {engine}"]
            processes.append(subprocess.Popen(command, env=env, start_new_session=True,
                                              stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT))
        yield {"env": env, "logs": logs}
    finally:
        for process in reversed(processes):
            _stop(process)
        for i, _ in enumerate(HOSTS, start=1):
            subprocess.run(["ip", "netns", "del", f"nbd-host{i}"], capture_output=True)  # takes its veth along
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _stop(process: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
            process.wait(wait_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


@pytest.fixture(scope="module")
def kernel(hosts):
    driver = KernelDriver(env=hosts["env"])
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run("%dist connect --profile nbdist", timeout=START_TIMEOUT_S).check()
        try:
            eventually(driver, f"len(nbdist.get_session().cluster.ids()) >= {len(HOSTS)}", START_TIMEOUT_S)
        except AssertionError:
            raise AssertionError([(hosts["logs"] / f"{h}.log").read_text()[-2000:] for h in HOSTS]) from None
        driver.run("%%distribute define --name data\n" + DEFINITION, timeout=180).check()
        yield driver
    finally:
        driver.run("%dist stop", timeout=60)
        driver.stop()


def test_status_shows_the_two_hosts(kernel):
    status = kernel.run("%dist status", timeout=120).check().stdout
    assert all(name in status for name in HOSTS), status


@pytest.mark.parametrize("strategy", ["hfdt", "nfdt"])
def test_training_crosses_the_hosts(kernel, strategy):
    kernel.run(f"%%distribute --strategy {strategy} --workers 2 --seed 1\n" + CELL, timeout=300).check()
    run = kernel.value("{'hosts': sorted(h['host'] for h in nbdist.last_run.hosts.values()), "
                       "'loss': nbdist.last_run.history['loss'], 'status': nbdist.last_run.status, "
                       "'ps': [s.get('address') for s in nbdist.last_run.ps]}")
    assert run["status"] == "done" and run["hosts"] == list(HOSTS)
    assert run["loss"][-1] < run["loss"][0]
    if strategy == "nfdt":  # the shard listened on the bridge address, not loopback
        assert run["ps"] and all(a.startswith(f"tcp://{HEAD_IP}:") for a in run["ps"]), run["ps"]
