"""How fast a run recovers from a dead parameter-server shard: kill, restart from the checkpoint, next step.

Each trial starts a real PS (`PsService`, one shard process, `--ps-restarts 1`) holding a
model of `--values` float32 values, pushes from a worker's client until the first
checkpoint exists, SIGKILLs the shard, and times the worker's next push-pull from the kill
to its answer: the kernel noticing the death (its monitor, once a second), a new shard
process on the old port, the checkpoint handed to it, the worker resending on a fresh
socket. The anchor, in the same run, is a push-pull to a live shard.
Prints a table, then:
    RESULT ps_recovery_s=<median seconds from the kill to the next completed push>

    .venv/bin/python benchmarks/elastic.py [--trials 5 --values 225000]

HFDT's recovery (a dead rank) is not built yet: there is no `hfdt_recovery_s`.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

import numpy as np

from common import print_table
from nbdist.ps.client import PsClient
from nbdist.ps.service import PsService

SGD = {"name": "SGD", "learning_rate": 1e-6}
SETTINGS = {"max_staleness": None, "rule": None, "synchronous": False, "momentum": None, "start_barrier": False,
            "clock": "real"}
CHECKPOINT_WAIT_S = 60


def trial(values: int) -> dict:
    """One kill and recovery; seconds for a live push-pull and for the one across the restart."""
    model = {"w": np.zeros(values, np.float32)}
    service = PsService(0, 1, 1, SETTINGS, tempfile.mkdtemp(prefix="nbdist-elastic-"), 3600.0, restarts=1)
    service.start("127.0.0.1")
    try:
        with PsClient(service.addresses, service.key, 0, ps_timeout_s=30) as worker:
            worker.request("init", [model], optimizer=SGD, trainable=["w"], layout=["w"])
            version = worker.request("pull")[0].header["version"]
            started = time.perf_counter()
            version = worker.request("push", [model], version=version)[0].header["version"]
            live_s = time.perf_counter() - started
            deadline = time.time() + CHECKPOINT_WAIT_S
            while service.last_checkpoint is None and time.time() < deadline:
                time.sleep(0.05)
            os.kill(service.shards[0].pid, signal.SIGKILL)
            killed = time.perf_counter()
            worker.request("push", [model], version=version)
            recovery_s = time.perf_counter() - killed
        restart, = [e for e in service.events if e["event"] == "shard_restarted"]
        return {"live_s": live_s, "recovery_s": recovery_s, "restart_s": restart["recovery_s"]}
    finally:
        service.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--values", type=int, default=225_000)
    args = parser.parse_args()
    results = [trial(args.values) for _ in range(args.trials)]
    rows = [[i, f"{r['live_s'] * 1000:.2f}", f"{r['restart_s']:.3f}", f"{r['recovery_s']:.3f}"]
            for i, r in enumerate(results)]
    print_table(["trial", "live push-pull ms", "restart (new process + checkpoint) s", "kill -> next push s"], rows)
    print(f"RESULT ps_recovery_s={statistics.median(r['recovery_s'] for r in results):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
