"""How fast a run recovers from a dead parameter-server shard or a dead hfdt rank: kill, recover, next step.

Each trial starts a real PS (`PsService`, one shard process, `--ps-restarts 1`) holding a
model of `--values` float32 values, pushes from a worker's client until the first
checkpoint exists, SIGKILLs the shard, and times the worker's next push-pull from the kill
to its answer: the kernel noticing the death (its monitor, once a second), a new shard
process on the old port, the checkpoint handed to it, the worker resending on a fresh
socket. The anchor, in the same run, is a push-pull to a live shard.

For hfdt, each trial runs the benchmark CNN under `%%distribute --strategy hfdt --background` on
3 real engines, SIGKILLs the third once every rank has reported steps, and takes the seconds from
the kill to the survivors' next completed step (the new rank 0's account, on the `recovered`
event): Gloo's timeout on the dead peer (5 s for elastic runs), the new rendezvous, Horovod
re-initialised, rank 0's weights broadcast, the train step traced again. Beside it, rank 0's throughput after
the recovery, on the 2 survivors.
The accuracy part runs one seeded cell (`--accuracy-epochs`, 3 engines) three ways per trial:
undisturbed, its third rank killed once every rank trains (with batches on demand, the default, the
survivors split the rest of each epoch between them; `--data static` in `--accuracy-options` for the
survivors keeping their own shards), and killed with `--restart-engines on` (the replacement joins at an
epoch's end after it registers), and evaluates each on 2000 test images.
Prints a table per part, then:
    RESULT ps_recovery_s=<median seconds from the kill to the next completed push>
    RESULT hfdt_recovery_s=<median seconds from the kill to the next completed step>
    RESULT hfdt_accuracy_gap_killed=<median undisturbed - killed test accuracy>
    RESULT hfdt_accuracy_gap_replaced=<median undisturbed - killed-and-replaced test accuracy>

    .venv/bin/python benchmarks/elastic.py [--trials 5 --values 225000 --hfdt-trials 3 --accuracy-trials 3]
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

from common import DEFINITION, SGD_MOMENTUM, TRAIN, notebook_shell, print_table
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
        restart, = service.restarts
        return {"live_s": live_s, "recovery_s": recovery_s, "restart_s": restart["recovery_s"]}
    finally:
        service.stop()


def three_engine_run(ip, session, epochs: int, options: str, kill: bool):
    """The benchmark cell under hfdt on 3 engines (two of the cluster's and one started now), the third
    SIGKILLed once every rank has reported steps when `kill`; (the run, the kill's time)."""
    cluster = session.cluster
    victim = cluster.add(1)[0]
    targets = ",".join(map(str, sorted(set(cluster.ids()) - {victim})[:2] + [victim]))
    ip.run_cell_magic("distribute", f"--strategy hfdt --background --targets {targets} {options}",
                      TRAIN.format(epochs=epochs, optimizer=SGD_MOMENTUM))
    run = session.last_run
    deadline = time.time() + START_WAIT_S
    while not all(run.progress.get(e) for e in run.workers) and time.time() < deadline:
        time.sleep(0.05)  # every rank has published steps: it trains
    killed = None
    if kill:
        cluster.refresh([victim])
        os.kill(cluster.info(victim).pid, signal.SIGKILL)
        killed = time.time()
    ip.run_line_magic("dist", "wait")
    return run, killed


def hfdt_trial(ip, session) -> dict:
    """One hfdt run on 3 engines whose third is killed mid-run; seconds from the kill to the next step."""
    run, killed = three_engine_run(ip, session, EPOCHS, "--restart-engines off", kill=True)
    recovered, = run.events_of("recovered")
    return {"samples_per_s": _samples_per_s(run, recovered["t"]), "recovery_s": recovered["t"] - killed,
            "size": recovered["size"], "step": recovered["step"]}


def accuracy_trial(ip, session, epochs: int, more: str = "") -> dict:
    """Test accuracy of one seeded cell: undisturbed, its third rank killed early, and killed with the
    replacement (--restart-engines) taking the dead rank's shard from an epoch's end on."""
    accuracy = {}
    for name, options, kill in (("undisturbed", "", False), ("killed", "--restart-engines off", True),
                                ("restarted", "--restart-engines on", True)):
        run, _ = three_engine_run(ip, session, epochs, f"--seed 3 {more} {options}", kill)
        ip.run_cell("_accuracy = model.evaluate(xt, yt, verbose=0)[1]")
        accuracy[name] = float(ip.user_ns["_accuracy"])
        if name == "restarted":
            grown = run.events_of("grown")
            accuracy["joined_epoch"] = grown[0]["epoch"] if grown else None
    return accuracy


def accuracy_part(ip, session, trials: int, epochs: int, options: str = "") -> tuple[float, float]:
    ip.run_cell_magic("distribute", "define", TEST_DATA)
    results = [accuracy_trial(ip, session, epochs, options) for _ in range(trials)]
    rows = [[i, f"{r['undisturbed']:.4f}", f"{r['killed']:.4f}", f"{r['restarted']:.4f}",
             r["joined_epoch"] if r["joined_epoch"] is not None else "never"] for i, r in enumerate(results)]
    print_table(["trial", "undisturbed accuracy", "killed", "killed, replaced", "replacement's first epoch"], rows)
    return (statistics.median(r["undisturbed"] - r["killed"] for r in results),
            statistics.median(r["undisturbed"] - r["restarted"] for r in results))


TEST_DATA = """
from nbdist.datasets import fashion_mnist
_, (xt, yt) = fashion_mnist(limit=2000)
xt = xt.astype("float32")[..., None] / 255
"""


def _samples_per_s(run, after: float) -> float:
    """Rank 0's throughput in its records after `after` (the run's pace on the survivors)."""
    rates = [r["samples_per_s"] for r in run.metrics
             if r.get("worker") == 0 and r["t"] > after and r.get("samples_per_s")]
    return statistics.median(rates) if rates else float("nan")


EPOCHS = 4
START_WAIT_S = 180


def hfdt_part(trials: int, samples: int, accuracy_trials: int, epochs: int, options: str = "") -> dict:
    ip, session = notebook_shell()
    ip.run_line_magic("dist", "start -n 2")
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=samples))
        results = [hfdt_trial(ip, session) for _ in range(trials)]
        rows = [[i, f"{r['samples_per_s']:.0f}", r["step"], r["size"], f"{r['recovery_s']:.2f}"]
                for i, r in enumerate(results)]
        print_table(["trial", "samples/s of rank 0 after", "resumed at step", "ranks after", "kill -> next step s"],
                    rows)
        killed, restarted = (accuracy_part(ip, session, accuracy_trials, epochs, options) if accuracy_trials
                             else (None, None))
    finally:
        ip.run_line_magic("dist", "stop")
    return {"recovery_s": statistics.median(r["recovery_s"] for r in results), "killed": killed,
            "restarted": restarted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--values", type=int, default=225_000)
    parser.add_argument("--hfdt-trials", type=int, default=3)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--accuracy-trials", type=int, default=3)
    parser.add_argument("--accuracy-epochs", type=int, default=8)
    parser.add_argument("--accuracy-options", default="", help="more %%%%distribute options for the accuracy runs")
    args = parser.parse_args()
    results = [trial(args.values) for _ in range(args.trials)]
    rows = [[i, f"{r['live_s'] * 1000:.2f}", f"{r['restart_s']:.3f}", f"{r['recovery_s']:.3f}"]
            for i, r in enumerate(results)]
    print_table(["trial", "live push-pull ms", "restart (new process + checkpoint) s", "kill -> next push s"], rows)
    hfdt = hfdt_part(args.hfdt_trials, args.samples, args.accuracy_trials, args.accuracy_epochs, args.accuracy_options)
    print(f"RESULT ps_recovery_s={statistics.median(r['recovery_s'] for r in results):.3f}")
    print(f"RESULT hfdt_recovery_s={hfdt['recovery_s']:.2f}")
    if hfdt["killed"] is not None:
        print(f"RESULT hfdt_accuracy_gap_killed={hfdt['killed']:.4f}")
        print(f"RESULT hfdt_accuracy_gap_replaced={hfdt['restarted']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
