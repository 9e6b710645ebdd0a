"""The parameter server's same-host path: shared memory and a Unix socket only the run's user can reach.

Real shard processes; a real process of another user (`setpriv` to uid 65534) for the permission checks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zmq

from nbdist.ps import launcher, same_host, wire
from nbdist.ps.client import PsClient
from tests.support import KEY, SGD, W0, grads, wait_for

pytestmark = pytest.mark.cluster  # starts processes


files_of = same_host.leftovers


@pytest.fixture
def shard():
    info = launcher.start_shard({"shard": 0, "workers": 2, "heartbeat_timeout_s": 2.0}, KEY)
    info["address"] = [f"tcp://127.0.0.1:{info['port']}"]
    try:
        yield info
    finally:
        with PsClient(info["address"], KEY, "controller", heartbeat=False, local=False) as controller:
            controller.request("stop")
        launcher.stop_shard(info["pid"])
        assert files_of(info["pid"]) == [], "a stopped shard left a segment or its socket directory"


def route_of(info) -> dict:
    """The route the shard offers a client on this host (asked as a client does, over TCP)."""
    with PsClient(info["address"], KEY, "controller", heartbeat=False, local=False) as client:
        reply = client.request("heartbeat", host=same_host.host_facts())[0]
    return reply.header["route"]


def test_a_client_on_this_host_switches_to_shared_memory_and_gets_the_tcp_paths_numbers_exactly(shard):
    other = launcher.start_shard({"shard": 0, "workers": 2}, KEY)
    tcp_address = [f"tcp://127.0.0.1:{other['port']}"]
    try:
        with PsClient(shard["address"], KEY, 0) as local, PsClient(tcp_address, KEY, 0, local=False) as tcp:
            rng = np.random.default_rng(0)
            init = {"w": rng.normal(size=(300, 70)).astype(np.float32), "b": np.zeros(70, np.float32)}
            for client in (local, tcp):
                client.request("init", [init], optimizer={"name": "SGD", "learning_rate": 0.1, "momentum": 0.9},
                               trainable=list(init))
            assert local.local[0] is not None and tcp.local[0] is None  # the first request went over TCP
            versions = [0, 0]
            for step in range(10):
                gradient = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in init.items()}
                replies = [c.request("push", [gradient], version=v)[0] for c, v in zip((local, tcp), versions)]
                versions = [r.header["version"] for r in replies]
                assert "shm" in replies[0].header and "shm" not in replies[1].header
                for name in init:
                    np.testing.assert_array_equal(replies[0].arrays[name], replies[1].arrays[name])
            assert versions == [10, 10]
            mine = files_of(shard["pid"])
            assert any("-w0-" in f for f in mine) and any("-r-" in f for f in mine)
            assert all(oct(os.stat(f).st_mode & 0o777) == "0o600" for f in mine if f.startswith("/dev/shm/"))
        assert not any("-w0-" in f for f in files_of(shard["pid"]))  # a closed client unlinks its outbox
    finally:
        with PsClient(tcp_address, KEY, "controller", heartbeat=False) as controller:
            controller.request("stop")
        launcher.stop_shard(other["pid"])


def test_clients_that_come_and_go_leave_no_segment_behind(shard):
    """One client per fit (and the kernel's short-lived ones): each one's outbox and the shard's reply outbox
    for it go when it closes, not when the run ends."""
    with PsClient(shard["address"], KEY, 0, heartbeat=False) as first:
        first.request("init", [W0], optimizer=SGD, trainable=list(W0))
    for fit in range(5):
        with PsClient(shard["address"], KEY, 0, heartbeat=False) as client:
            client.request("pull")
            client.request("push", [grads()], version=fit)
            assert len([f for f in files_of(shard["pid"]) if f.startswith("/dev/shm/")]) == 2
        wait_for(lambda: not [f for f in files_of(shard["pid"]) if f.startswith("/dev/shm/")],
                 "the closed client's segments to go", 10)
        with open(f"/proc/{shard['pid']}/maps") as maps:  # and the shard no longer maps them
            assert "nbdist-ps-" not in maps.read()


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_a_process_of_another_user_can_neither_connect_nor_open_a_segment(shard):
    with PsClient(shard["address"], KEY, 0) as client:
        client.request("init", [W0], optimizer=SGD, trainable=list(W0))
        client.request("push", [grads()], version=0)
        route = route_of(shard)
        segments = [f for f in files_of(shard["pid"]) if f.startswith("/dev/shm/")]
        assert segments
        probe = textwrap.dedent(f"""
            import json, os, socket
            out = {{}}
            for path in {segments!r}:
                try:
                    os.open(path, os.O_RDONLY); out[path] = "opened"
                except OSError as exc:
                    out[path] = exc.__class__.__name__
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect({route["ipc"][len("ipc://"):]!r}); out["socket"] = "connected"
            except OSError as exc:
                out["socket"] = exc.__class__.__name__
            print(json.dumps(out))
        """)
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I",
                                 "-c", probe], capture_output=True, text=True, timeout=60, cwd="/")
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout)
        assert set(outcome.values()) == {"PermissionError"}, outcome
        assert client.request("push", [grads()], version=1)[0].header["version"] == 2  # the run goes on


def test_the_same_host_path_refuses_lying_headers_and_applies_none(shard):
    with PsClient(shard["address"], KEY, 0) as client:
        client.request("init", [W0], optimizer=SGD, trainable=list(W0))
    route = route_of(shard)
    outbox = same_host.Outbox(route["prefix"], "w1-test")
    inbox = same_host.Inbox(route["prefix"])
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(route["ipc"])

    def ask(frames) -> wire.Message:
        socket.send_multipart(frames)
        assert socket.poll(5000), "the shard did not answer"
        return wire.decode(KEY, socket.recv_multipart(), inbox=inbox)

    def resigned(arrays, change) -> list:
        header = json.loads(bytes(wire.encode(KEY, "push", arrays, outbox=outbox, worker=1, version=0,
                                              same_host=1)[0]))
        change(header)
        text = json.dumps(header).encode()
        return [text, wire.hmac.new(KEY, text, wire.hashlib.sha256).digest()]

    def push(arrays, **fields) -> list:
        return wire.encode(KEY, "push", arrays, outbox=outbox, **{"worker": 1, "version": 0, **fields}, same_host=1)

    nan = grads()
    nan["dense/bias"] = np.array([0, np.nan, 0], np.float32)
    cases = [  # (reason, the message): each written into the outbox just before it is sent, as a client does
        ("wrong_shape", lambda: resigned(grads(), lambda h: h["arrays"][0].update(shape=[3, 2]))),
        ("malformed", lambda: resigned(grads(), lambda h: h["arrays"][0].update(shape=[4096, 4096]))),  # too long
        ("malformed", lambda: resigned(grads(), lambda h: h["arrays"][1].update(offset=1 << 30))),
        ("malformed", lambda: resigned(grads(), lambda h: h.update(  # a segment of another shard (or run)
            shm=h["shm"].replace(route["prefix"], same_host.new_prefix())))),
        ("malformed", lambda: resigned(grads(), lambda h: h.update(shm="../../etc/passwd"))),
        ("wrong_dtype", lambda: push({k: v.astype(np.float64) for k, v in grads().items()})),
        ("non_finite", lambda: push(nan)),
        ("malformed", lambda: push(grads(), version=-1)),
        ("malformed", lambda: push(grads(), version="7")),
        ("unknown_worker", lambda: push(grads(), worker=7)),
    ]
    try:
        for reason, frames in cases:
            reply = ask(frames())
            assert (reply.kind, reply.header.get("reason")) == ("rejected", reason), (reason, reply.header)
        good = push(grads())
        assert ask(good).header["version"] == 1
        assert (ask(good).header["reason"]) == "replayed"  # the same signed header again
        with pytest.raises(wire.Rejected, match="malformed"):  # a receiver that takes no shared memory
            wire.decode(KEY, good)
    finally:
        socket.close(linger=0)
        context.term()
        outbox.close()
        inbox.close()
    with PsClient(shard["address"], KEY, "controller", heartbeat=False) as controller:
        state = controller.request("state")[0]
    assert state.header["version"] == 1 and state.header["counts"]["applied"] == 1
    assert sum(state.header["rejections"].values()) == len(cases) + 1, state.header["rejections"]  # and the replay
    np.testing.assert_array_equal(state.arrays["dense/kernel"], W0["dense/kernel"] - 0.5)


def test_a_dead_workers_segment_is_reclaimed_and_a_killed_shards_files_removed_by_its_launcher():
    shard = launcher.start_shard({"shard": 0, "workers": 2, "heartbeat_timeout_s": 2.0}, KEY)
    shard["address"] = [f"tcp://127.0.0.1:{shard['port']}"]
    try:
        reclaimed_after_a_kill(shard)
    finally:
        os.kill(shard["pid"], signal.SIGKILL)  # no chance to clean up: its launcher does
        launcher.stop_shard(shard["pid"])
    assert files_of(shard["pid"]) == []


def reclaimed_after_a_kill(shard) -> None:
    with PsClient(shard["address"], KEY, 0) as first:
        first.request("init", [W0], optimizer=SGD, trainable=list(W0))
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, numpy as np
        from nbdist.ps.client import PsClient
        client = PsClient({shard["address"]!r}, bytes.fromhex({KEY.hex()!r}), 1)
        version = 0
        for _ in range(3):
            version = client.request("push", [{{k: np.ones(shape, np.float32) for k, shape in {
                {k: v.shape for k, v in W0.items()}!r}.items()}}], version=version)[0].header["version"]
        print(version, flush=True)
        sys.stdin.read()  # until killed
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "3"
        assert any("-w1-" in f for f in files_of(shard["pid"]))
        worker.send_signal(signal.SIGKILL)  # no chance to unlink its outbox
        worker.wait(10)
        wait_for(lambda: not any("-w1-" in f for f in files_of(shard["pid"])), "the dead worker's segment to go",
                 30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
