"""Starting and stopping shard processes, on the notebook host or on an engine's host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from ..errors import ClusterError
from ..limits import LIMITS
from ..host.netroute import local_ip_towards
from . import same_host, started

_started_here: dict[int, subprocess.Popen] = {}  # pid -> process, in whichever process called start_shard


def start_shard(config: dict, key: bytes, log_path: str | None = None) -> dict:
    """Start one shard process on this host; return {"pid", "port", "host"} once it listens.

    Also the function an engine runs for ``--ps-on engines``: the shard is then a child of
    the engine and exits when the engine does. A shard exits by itself within a second of its
    parent's death (it watches its parent pid); in the kernel, the cluster's lifeline also kills it.
    """
    import socket

    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen([sys.executable, "-m", "nbdist.ps.server"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    process.stdin.write((json.dumps({**config, "key": key.hex()}) + "\n").encode())
    process.stdin.close()
    line = _read_line(process, LIMITS.shard_start_s)
    if not line.startswith("READY "):
        process.kill()
        raise ClusterError(f"parameter-server shard {config.get('shard')} did not start on {socket.gethostname()} "
                           f"(said {line!r}; log: {log_path or 'none'})")
    _started_here[process.pid] = process
    started.started(process.pid)  # the cluster's lifeline, if any, kills it should this process die
    return {"pid": process.pid, "port": int(line.split()[1]), "host": socket.gethostname()}


def _read_line(process, timeout: float) -> str:
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0].decode().strip() if result else f"nothing within {timeout:.0f} s"


def exit_code(pid: int) -> int | None:
    """The exit code of a shard this process started, None while it runs (or if unknown)."""
    process = _started_here.get(pid)
    return process.poll() if process is not None else None


def stop_shard(pid: int, timeout: float = 5.0) -> None:
    """Wait for a shard told to stop, then kill it if it did not; reap it, and remove what it left on this host."""
    process = _started_here.pop(pid, None)
    if process is None:
        return
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)
    same_host.remove_leftovers(pid)
    started.stopped(pid)


def start_shard_towards(config: dict, key: bytes, towards: str) -> dict:
    """`start_shard` on an engine: bind to the interface that routes to the kernel at `towards`."""
    ip = local_ip_towards(towards)
    return {**start_shard({**config, "bind": ip}, key), "ip": ip}
