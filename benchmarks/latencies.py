"""How long a user waits to hear that something went wrong, or that a control took: failure, error, interrupt, pause, stall.

Everything goes through a real IPython kernel (jupyter_client, as a notebook front end drives it)
running the magics against a real ipyparallel cluster this script starts (2 engines, nbdist's
1 s heartbeats with 5 misses, `nbdist.cluster.cluster.HEARTBEAT_ARGS`; engines to be killed are added one
at a time). The model is the suite's small CNN on 2000 Fashion-MNIST samples (`tests/conftest.py`).
Each figure is the median of `--reps` repetitions, beside an anchor:

1. failure reported: an engine SIGKILLed once its cell prints steps; seconds from the kill until the
   cell returns `EngineDied` (`--strategy local` on the killed engine; `--strategy hfdt --on-failure
   fail` on a survivor and the killed engine). Anchor: seconds from the same kill until ipyparallel's
   hub drops the engine from `client.ids` (this script's client). The hub hears of a local engine's
   exit at once from the engine's nanny (a child process); to time its heartbeat path (a host or
   network lost), a third kind kills the nanny first, then the engine.
2. user error reported: a cell that raises ZeroDivisionError on the engine after building the model;
   seconds from submission to the `EngineFailure` reply (`local` on 1 engine, `hfdt` on 2). Anchor:
   the same cell executed plainly in the kernel. The first run of each is not counted.
3. interrupt: Ctrl-C (`KernelManager.interrupt_kernel()`) once the cell prints steps; seconds until
   the cell has returned `RunInterrupted` and every engine of the run is idle by the hub's
   `queue_status()` (`local`, and `hfdt` on 2). Anchor: ipyparallel's own interrupt (what `%%px`
   sends on Ctrl-C), `client.send_signal(SIGINT)` to a fresh engine in `time.sleep(60)`, to the
   same two conditions.
4. pause acted on: one nfdt run on 2 engines with `--background`; `reps + 2` times,
   `nbdist.last_run.control('pause')` timed in the kernel (and the cell's round trip from here),
   the shard's version read again `--hold` s later (it must not have moved), resumed until it moves.
   Also counted: controls sent right after the background cell returned that no shard answered.
5. stall named: `--strategy hfdt --on-failure fail --stall-timeout T`, rank 1 hanging in a callback
   (it writes the time first); seconds from the hang to the `CollectiveStalled` reply, minus T. By
   design (docs/strategies/hfdt.md) the kernel names the rank once the first waiter has waited 2 T.

Whatever does not behave as documented is printed as a `NOTE` (and the exit status is 1); a part
whose kernel hangs is abandoned after a bounded wait, the kernel's thread stacks printed to stderr
(faulthandler, SIGUSR1), and the next part runs in a new kernel. Prints a table per part, then:
    RESULT failure_reported_s=<median kill -> EngineDied, local on 1 engine>
    RESULT failure_reported_hfdt_s=<the same, hfdt --on-failure fail on 2>
    RESULT hub_unregistered_s=<median kill -> the hub drops the engine (the nanny tells it)>
    RESULT hub_heartbeat_unregistered_s=<the same with the nanny killed too: missed heartbeats>
    RESULT user_error_reported_s=<median submission -> EngineFailure, local>
    RESULT user_error_reported_hfdt_s=<the same, hfdt on 2>
    RESULT user_error_plain_anchor_s=<the same cell, plain, in the kernel>
    RESULT interrupt_stopped_s=<median Ctrl-C -> RunInterrupted with the engine idle, local>
    RESULT interrupt_stopped_hfdt_s=<the same, hfdt on 2>
    RESULT interrupt_signal_anchor_s=<the same for ipyparallel's SIGINT to a sleeping task>
    RESULT pause_ack_s=<median control('pause') -> acknowledgement, in the kernel>
    RESULT stall_named_overhead_s=<median hang -> CollectiveStalled, minus T>

    .venv/bin/python benchmarks/latencies.py             # --reps 5 --stall-timeout 3 --hold 1.0 [--parts ...]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import ipyparallel as ipp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import print_table

from nbdist.cluster.cluster import HEARTBEAT_ARGS
from tests.conftest import DEFINITION, TRAIN  # the suite's small CNN on 2000 samples
from tests.kernel_driver import KernelDriver  # a real kernel, as a notebook drives it

LONG = TRAIN.format(epochs=200)  # stopped (killed, interrupted, paused) long before its end
ERROR_CELL = "model = build()\nratio = len(x) / (len(x) - 2000)\n" + TRAIN.format(epochs=1)
STALL_CELL = '''
import os, time
class HangOnRank1(keras.callbacks.Callback):
    """Rank 1 writes the time, then hangs in the cell's own code at the third step of its second epoch."""
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 2 and os.environ.get("HOROVOD_RANK") == "1":
            with open({path!r}, "w") as f:
                f.write(repr(time.time()))
            time.sleep(600)
model = build()
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=64, epochs=2, callbacks=[HangOnRank1()])
'''

START_WAIT_S = 180  # a cell until it prints steps (a new engine imports TensorFlow, replays definitions)
REPLY_WAIT_S = 120  # a failing or interrupted cell until its reply
IDLE_WAIT_S = 60  # engines until the hub shows them idle
ENGINE_WAIT_S = 120  # a started engine until it registers
HUB_WAIT_S = 60  # a killed engine until the hub drops it
POLL_S = 0.02


# -- the cluster, seen from this script ----------------------------------------------------

def new_engine(cluster, client) -> tuple[int, int]:
    """One engine started now (to be killed): its id and process id."""
    before = set(client.ids)
    cluster.start_engines_sync(n=1)
    deadline = time.time() + ENGINE_WAIT_S
    while not set(client.ids) - before:
        if time.time() > deadline:
            raise TimeoutError(f"a new engine did not register within {ENGINE_WAIT_S} s")
        time.sleep(0.1)
    eid = max(set(client.ids) - before)
    return eid, client[eid].apply_sync(os.getpid)


def idle_at(client, targets, timeout: float = IDLE_WAIT_S) -> float:
    """The time at which the hub first shows every one of `targets` (still registered) with nothing
    queued or running; raises naming those still busy after `timeout`."""
    deadline = time.time() + timeout
    while True:
        now = time.time()
        ids = set(client.ids)
        status = client.queue_status()
        busy = {e: status[e] for e in targets if e in ids and e in status and (status[e]["queue"] or status[e]["tasks"])}
        if not busy:
            return now
        if now > deadline:
            raise TimeoutError(f"engines still busy {timeout} s on: {busy}")
        time.sleep(POLL_S)


class HubWatch(threading.Thread):
    """From a kill on: when the hub dropped the engine from `client.ids` (this thread alone uses the
    client until `join`)."""

    def __init__(self, client, eid: int, killed: float):
        super().__init__(daemon=True)
        self.client, self.eid, self.killed, self.gone_s = client, eid, killed, None
        self.start()

    def run(self):
        while time.time() < self.killed + HUB_WAIT_S:
            if self.eid not in self.client.ids:
                self.gone_s = time.time() - self.killed
                return
            time.sleep(POLL_S)

    def result(self) -> float | None:
        self.join(HUB_WAIT_S + 5)
        return self.gone_s


# -- the parts ---------------------------------------------------------------------------------

def note(notes: list, text: str) -> None:
    """Something that did not behave as documented: printed now and again at the end."""
    notes.append(text)
    print(f"NOTE {text}", flush=True)


def trace(text: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {text}", flush=True)


def expect(reply, ename: str, what: str, notes: list) -> bool:
    if reply.ename != ename:
        note(notes, f"{what}: expected {ename}, got {reply.status} {reply.ename}: {(reply.evalue or '')[:300]}")
        return False
    return True


def kill_trial(kernel, cluster, client, line: str, survivors: list[int], notes: list, nanny: bool = False) -> dict:
    """A new engine in the cell's targets (`line` names it as {targets}), SIGKILLed once steps show; with
    `nanny`, its nanny first (the child process through which ipyparallel's hub hears of the engine's
    exit at once), so that the hub learns of the death only by missed heartbeats."""
    import psutil

    victim, pid = new_engine(cluster, client)
    targets = ",".join(map(str, survivors + [victim]))
    msg_id = kernel.submit(line.format(targets=targets) + "\n" + LONG)
    kernel.collect(msg_id, timeout=START_WAIT_S, until_output="step")
    if nanny:
        nannies = [p for p in psutil.Process(pid).children() if "nanny" in " ".join(p.cmdline())]
        if not nannies:
            note(notes, f"engine {victim} (pid {pid}) has no nanny process to kill")
        for p in nannies:
            p.kill()
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    hub = HubWatch(client, victim, killed)
    reply = kernel.collect(msg_id, timeout=REPLY_WAIT_S)
    reported_s = time.time() - killed
    hub_s = hub.result()
    ok = expect(reply, "EngineDied", line, notes)
    if ok and f"engine {victim} (host " not in reply.evalue:
        note(notes, f"{line}: EngineDied does not name engine {victim}: {reply.evalue[:300]}")
    freed_s = idle_at(client, survivors) - killed if survivors else None
    trace(f"{line.split(' --targets')[0]}: killed engine {victim}{' and its nanny' if nanny else ''}; EngineDied after {reported_s:.2f} s, "
          f"hub dropped it after {_s(hub_s)} s: {(reply.evalue or '')[:200]}")
    return {"reported_s": reported_s if ok else float("nan"), "hub_s": hub_s, "freed_s": freed_s}


def failure_part(kernel, cluster, client, base: list[int], reps: int, notes: list) -> dict:
    kinds = {"local, 1 engine": ("%%distribute --strategy local --targets {targets}", [], False),
             "local, engine and its nanny": ("%%distribute --strategy local --targets {targets}", [], True),
             "hfdt --on-failure fail, 2": ("%%distribute --strategy hfdt --on-failure fail --targets {targets}",
                                           base[:1], False)}
    results = {k: [kill_trial(kernel, cluster, client, line, survivors, notes, nanny) for _ in range(reps)]
               for k, (line, survivors, nanny) in kinds.items()}
    rows = []
    for kind, trials in results.items():
        for i, t in enumerate(trials):
            rows.append([kind, i, f"{t['reported_s']:.2f}", _s(t["hub_s"]),
                         _s(t["freed_s"]) if t["freed_s"] is not None else "-"])
    print()
    print_table(["failure: engine SIGKILLed", "trial", "kill -> EngineDied s", "kill -> hub drops it s",
                 "kill -> survivor idle s"], rows)
    local, hfdt = results["local, 1 engine"], results["hfdt --on-failure fail, 2"]
    return {"failure_reported_s": _median(t["reported_s"] for t in local),
            "failure_reported_hfdt_s": _median(t["reported_s"] for t in hfdt),
            "hub_unregistered_s": _median(t["hub_s"] for t in local + hfdt),
            "hub_heartbeat_unregistered_s": _median(t["hub_s"] for t in results["local, engine and its nanny"])}


def user_error_part(kernel, base: list[int], reps: int, notes: list) -> dict:
    lines = {"local, 1 engine": f"%%distribute --strategy local --targets {base[0]}\n",
             "hfdt, 2": f"%%distribute --strategy hfdt --targets {base[0]},{base[1]}\n"}
    results = {}
    for kind, line in lines.items():
        seconds = []
        for i in range(reps + 1):  # the first run (definitions replayed, Keras warmed) is not counted
            started = time.time()
            reply = kernel.run(line + ERROR_CELL, timeout=REPLY_WAIT_S)
            elapsed = time.time() - started
            if expect(reply, "EngineFailure", kind, notes) and "ZeroDivisionError" not in reply.evalue:
                note(notes, f"{kind}: EngineFailure without the ZeroDivisionError: {reply.evalue[:300]}")
            trace(f"user error, {kind}: {reply.ename} after {elapsed:.2f} s")
            if i:
                seconds.append(elapsed if reply.ename == "EngineFailure" else float("nan"))
        results[kind] = seconds
    plain = []
    for i in range(reps + 1):
        started = time.time()
        reply = kernel.run(ERROR_CELL, timeout=REPLY_WAIT_S)
        expect(reply, "ZeroDivisionError", "plain cell", notes)
        if i:
            plain.append(time.time() - started)
    results["plain cell in the kernel (anchor)"] = plain
    print()
    print_table(["user error (ZeroDivisionError after build())", *[f"trial {i}" for i in range(reps)], "median"],
                [[kind, *[f"{s:.2f}" for s in v], f"{_median(v):.2f}"] for kind, v in results.items()])
    return {"user_error_reported_s": _median(results["local, 1 engine"]),
            "user_error_reported_hfdt_s": _median(results["hfdt, 2"]),
            "user_error_plain_anchor_s": _median(plain)}


def interrupt_trial(kernel, client, code: str, targets: list[int], until: str, ename: str, notes: list) -> dict:
    msg_id = kernel.submit(code)
    kernel.collect(msg_id, timeout=START_WAIT_S, until_output=until)
    interrupted = time.time()
    kernel.km.interrupt_kernel()
    try:
        reply = kernel.collect(msg_id, timeout=REPLY_WAIT_S)
    except TimeoutError as exc:  # a second Ctrl-C, as a user would press; the first one's figure is lost
        dump_stacks(kernel, "a cell that did not return after Ctrl-C")
        note(notes, f"{code.splitlines()[0]}: the cell had not returned {REPLY_WAIT_S} s after Ctrl-C ({exc}); "
                     f"engines then: {client.queue_status()}")
        kernel.km.interrupt_kernel()
        reply = kernel.collect(msg_id, timeout=REPLY_WAIT_S)
    reply_s = time.time() - interrupted
    expect(reply, ename, code.splitlines()[0], notes)
    idle_s = idle_at(client, targets) - interrupted
    trace(f"{code.splitlines()[0]}: Ctrl-C -> reply {reply.ename} after {reply_s:.2f} s, idle after {idle_s:.2f} s: "
          f"{(reply.evalue or '')[:200]}")
    return {"reply_s": reply_s, "idle_s": idle_s, "stopped_s": max(reply_s, idle_s), "ename": reply.ename}


def signal_trial(client, eid: int) -> dict:
    """ipyparallel's own interrupt (what `%%px` sends on Ctrl-C): SIGINT through `client.send_signal` to an
    engine running `time.sleep(60)`; until the task has ended and the engine is idle."""
    task = client[eid].apply_async(time.sleep, 60)
    deadline = time.time() + IDLE_WAIT_S
    while not client.queue_status()[eid]["queue"]:  # the hub has handed the task to the engine
        if time.time() > deadline:
            raise TimeoutError(f"engine {eid} did not take the sleeping task within {IDLE_WAIT_S} s")
        time.sleep(POLL_S)
    time.sleep(0.5)  # and the engine is inside time.sleep
    interrupted = time.time()
    client.send_signal(signal.SIGINT, targets=[eid], block=True)
    task.wait(REPLY_WAIT_S)
    reply_s = time.time() - interrupted
    try:
        task.get(0)
        ename = "none (slept to the end)"
    except ipp.error.RemoteError as exc:  # the task's KeyboardInterrupt, as ipyparallel reports it
        ename = exc.ename
    idle_s = idle_at(client, [eid]) - interrupted
    trace(f"send_signal(SIGINT) to engine {eid}: task ended ({ename}) after {reply_s:.2f} s, idle after {idle_s:.2f} s")
    return {"reply_s": reply_s, "idle_s": idle_s, "stopped_s": max(reply_s, idle_s), "ename": ename}


def interrupt_part(kernel, cluster, client, base: list[int], reps: int, notes: list) -> dict:
    kinds = {
        "local, 1 engine": (f"%%distribute --strategy local --targets {base[0]}\n" + LONG, base[:1]),
        "hfdt, 2": (f"%%distribute --strategy hfdt --targets {base[0]},{base[1]}\n" + LONG, base[:2]),
    }
    results = {k: [interrupt_trial(kernel, client, code, targets, "step", "RunInterrupted", notes)
                   for _ in range(reps)] for k, (code, targets) in kinds.items()}
    # the anchor on an engine nbdist never trained on (nbdist's interrupt guard is not installed there)
    fresh, _ = new_engine(cluster, client)
    results[ANCHOR] = [signal_trial(client, fresh) for _ in range(reps)]
    rows = [[kind, i, f"{t['reply_s']:.2f}", f"{t['idle_s']:.2f}", f"{t['stopped_s']:.2f}", t["ename"] or "-"]
            for kind, trials in results.items() for i, t in enumerate(trials)]
    print()
    print_table(["interrupt (Ctrl-C while training)", "trial", "-> cell / task returns s", "-> engines idle s",
                 "-> both s", "error"], rows)
    return {"interrupt_stopped_s": _median(t["stopped_s"] for t in results["local, 1 engine"]),
            "interrupt_stopped_hfdt_s": _median(t["stopped_s"] for t in results["hfdt, 2"]),
            "interrupt_signal_anchor_s": _median(t["stopped_s"] for t in results[ANCHOR])}


ANCHOR = "send_signal(SIGINT), time.sleep (anchor)"


def version(kernel, action: str) -> int | None:
    """The first shard's version in its acknowledgement of `action`; None when no shard answered."""
    return kernel.value(f"[a['version'] for a in nbdist.last_run.control({action!r})][:1] or [None]")[0]


def version_above(kernel, floor: int, timeout: float = START_WAIT_S) -> int:
    deadline = time.time() + timeout
    while True:
        v = version(kernel, "resume")
        if v is not None and v > floor:
            return v
        if time.time() > deadline:
            raise TimeoutError(f"the shard's version stayed at {v} (not above {floor}) for {timeout} s")
        time.sleep(0.2)


def stop_background_run(kernel, client, targets: list[int], notes: list) -> None:
    """Stop the kernel's background run (a stop that no shard acknowledged is sent again), wait for it."""
    deadline = time.time() + REPLY_WAIT_S
    while kernel.value("nbdist.last_run.status") == "running" and time.time() < deadline:
        if kernel.value("len(nbdist.last_run.control('stop'))"):
            break
        time.sleep(0.2)
    acked = kernel.value("nbdist.last_run.events[-1]")
    msg_id = kernel.submit("%dist wait")
    try:
        kernel.collect(msg_id, timeout=IDLE_WAIT_S)
    except TimeoutError:
        busy = {e: s for e, s in client.queue_status().items() if e in targets}
        dump_stacks(kernel, "%dist wait after a stop")
        kernel.km.interrupt_kernel()
        reply = kernel.collect(msg_id, timeout=REPLY_WAIT_S)
        state = kernel.value("{'status': nbdist.last_run.status, 'progress': {str(e): {k: v for k, v in p.items() "
                             "if k != 'record'} for e, p in nbdist.last_run.progress.items()}, "
                             "'events': nbdist.last_run.events[-6:]}", timeout=REPLY_WAIT_S)
        note(notes, f"the background nfdt run had not ended {IDLE_WAIT_S} s after a stop (acknowledged: {acked}); "
                    f"engines then {busy}; interrupted: {reply.ename} {(reply.evalue or '')[:300]}; run: {state}")
    idle_at(client, targets)


def pause_part(kernel, client, base: list[int], reps: int, hold: float, notes: list) -> dict:
    """`reps + 2` pauses of one background nfdt run (each is cheap)."""
    submitted = time.time()
    kernel.run(f"%%distribute --strategy nfdt --targets {base[0]},{base[1]} --background\n" + LONG,
               timeout=REPLY_WAIT_S).check()
    returned = time.time()
    trials, unanswered = [], 0
    try:
        # how long after the cell returned a control is still answered by no shard (and so applies nowhere)
        while version(kernel, "resume") is None and time.time() < returned + START_WAIT_S:
            unanswered += 1
            time.sleep(0.05)
        answered = time.time()
        if unanswered:
            note(notes, f"{unanswered} controls sent to the running background nfdt run in its first "
                        f"{answered - returned:.2f} s after the cell returned were acknowledged by no shard "
                        "([]): they applied nowhere, with no error")
        version_above(kernel, 5)  # pushes are being applied
        for _ in range(reps + 2):
            started = time.time()
            kernel.run("import time as _time\n_t0 = _time.perf_counter()\n_ack = nbdist.last_run.control('pause')\n"
                       "_pause_s = _time.perf_counter() - _t0").check()
            round_trip = time.time() - started
            ack = kernel.value("{'s': _pause_s, 'paused': [a['paused'] for a in _ack], "
                               "'version': [a['version'] for a in _ack][:1] or [None]}")
            frozen = version(kernel, "pause")
            time.sleep(hold)  # the engines keep trying to push; the version must stand still meanwhile
            after = version(kernel, "pause")
            if not ack["paused"] or not all(ack["paused"]):
                note(notes, f"pause acknowledged without paused=True by every shard: {ack}")
            trace(f"pause: acknowledged in {ack['s'] * 1000:.1f} ms; version {frozen}, {hold:g} s later {after}")
            trials.append({"ack_s": ack["s"], "round_trip_s": round_trip, "at_ack": ack["version"][0],
                           "frozen": frozen, "after": after})
            version_above(kernel, after)  # resumed: pushes are applied again
    finally:
        stop_background_run(kernel, client, base[:2], notes)
    moved = [t for t in trials if t["after"] != t["frozen"]]
    if moved:
        note(notes, f"the shard's version moved while paused: {moved}")
    print()
    print(f"background cell: {returned - submitted:.2f} s to return; controls answered by a shard "
          f"{answered - returned:.2f} s after that ({unanswered} answered by none before)")
    print_table(["pause (nfdt, 2 workers)", "control('pause') in kernel ms", "cell round trip ms",
                 "version at ack", f"version then / {hold:g} s later"],
                [[i, f"{t['ack_s'] * 1000:.1f}", f"{t['round_trip_s'] * 1000:.0f}", t["at_ack"],
                  f"{t['frozen']} / {t['after']}"] for i, t in enumerate(trials)])
    return {"pause_ack_s": _median(t["ack_s"] for t in trials)}


def stall_part(kernel, client, base: list[int], reps: int, timeout_s: float, notes: list) -> dict:
    trials = []
    for _ in range(reps):
        path = os.path.join(tempfile.mkdtemp(prefix="nbdist-stall-"), "hung_at")
        reply = kernel.run(f"%%distribute --strategy hfdt --on-failure fail --stall-timeout {timeout_s:g} "
                           f"--targets {base[0]},{base[1]}\n" + STALL_CELL.format(path=path), timeout=REPLY_WAIT_S)
        replied = time.time()
        ok = expect(reply, "CollectiveStalled", "stall", notes)
        if ok and f"rank 1 (engine {base[1]}, host " not in reply.evalue:
            note(notes, f"CollectiveStalled does not name rank 1 (engine {base[1]}): {reply.evalue[:300]}")
        hung = float(Path(path).read_text()) if os.path.exists(path) else float("nan")
        idle_s = idle_at(client, base[:2]) - hung
        trials.append({"named_s": (replied - hung) if ok else float("nan"), "idle_s": idle_s})
        trace(f"stall: {reply.ename} {replied - hung:.2f} s after the hang, ranks idle after {idle_s:.2f} s")
    print()
    print_table(["stall (hfdt, rank 1 hangs)", "hang -> CollectiveStalled s", f"minus T={timeout_s:g}",
                 "minus 2T", "hang -> both ranks idle s"],
                [[i, f"{t['named_s']:.2f}", f"{t['named_s'] - timeout_s:.2f}", f"{t['named_s'] - 2 * timeout_s:.2f}",
                  f"{t['idle_s']:.2f}"] for i, t in enumerate(trials)])
    return {"stall_named_overhead_s": _median(t["named_s"] - timeout_s for t in trials)}


def _s(value) -> str:
    return "never" if value is None else f"{value:.2f}"


def _median(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


PARTS = ("failure", "error", "interrupt", "pause", "stall")


def run_part(name: str, kernel, cluster, client, base: list[int], args, notes: list) -> dict:
    if name == "failure":
        return failure_part(kernel, cluster, client, base, args.reps, notes)
    if name == "error":
        return user_error_part(kernel, base, args.reps, notes)
    if name == "interrupt":
        return interrupt_part(kernel, cluster, client, base, args.reps, notes)
    if name == "pause":
        return pause_part(kernel, client, base, args.reps, args.hold, notes)
    if name == "stall":
        return stall_part(kernel, client, base, args.reps, args.stall_timeout, notes)
    raise SystemExit(f"unknown part {name!r}; the parts: {', '.join(PARTS)}")


def start_kernel(cluster) -> KernelDriver:
    """A real kernel with nbdist loaded, connected to `cluster`, the suite's definitions recorded."""
    kernel = KernelDriver(cwd=tempfile.mkdtemp(prefix="nbdist-latencies-"),
                          env={**os.environ, "NBDIST_PROGRESS": "text"})
    try:
        # a kernel that hangs can be asked for its threads' stacks (they go to this script's stderr)
        kernel.run("import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)").check()
        kernel.run("%load_ext nbdist\nimport nbdist").check()
        kernel.run(f"%dist connect --cluster-id {cluster.cluster_id}", timeout=ENGINE_WAIT_S).check()
        kernel.run("%%distribute define --name data\n" + DEFINITION, timeout=START_WAIT_S).check()
    except BaseException:
        kernel.stop()
        raise
    return kernel


def dump_stacks(kernel, why: str) -> None:
    """The hung kernel's Python stacks, every thread, on stderr (faulthandler, registered at its start)."""
    print(f"--- the kernel's stacks ({why}) ---", file=sys.stderr, flush=True)
    try:
        os.kill(kernel.pid, signal.SIGUSR1)
    except ProcessLookupError:
        print("(the kernel process is gone)", file=sys.stderr, flush=True)
        return
    time.sleep(1.0)  # faulthandler writes from the kernel process; let it land before more output


def release(client, base: list[int]) -> None:
    """After a kernel was stopped mid-cell: its engines idle (nbdist's watcher interrupts what the dead
    kernel left running; if that does not come, SIGINT through ipyparallel)."""
    try:
        idle_at(client, base, timeout=IDLE_WAIT_S)
    except TimeoutError:
        client.send_signal(signal.SIGINT, targets=base, block=True)
        idle_at(client, base, timeout=IDLE_WAIT_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--stall-timeout", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=1.0, help="seconds the paused version must stand still")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"a comma-separated subset of {','.join(PARTS)}")
    args = parser.parse_args()
    parts = args.parts.split(",")
    began = time.time()
    notes: list[str] = []
    results: dict[str, float] = {}
    cluster = ipp.Cluster(n=2, cluster_id=f"nbdist-latencies-{uuid.uuid4().hex[:8]}",
                          controller_args=list(HEARTBEAT_ARGS), log_level=30)
    print(f"Starting a 2-engine cluster ({cluster.cluster_id}) and a kernel; {args.reps} repetitions per figure")
    client = cluster.start_and_connect_sync()
    kernel = None
    try:
        client.wait_for_engines(2, timeout=ENGINE_WAIT_S, block=True)
        base = sorted(client.ids)[:2]
        kernel = start_kernel(cluster)
        for name in parts:
            try:
                results.update(run_part(name, kernel, cluster, client, base, args, notes))
            except (TimeoutError, AssertionError) as exc:  # a hung or broken kernel: say so, go on with a new one
                dump_stacks(kernel, f"part {name} did not complete")
                note(notes, f"part {name!r} did not complete: {type(exc).__name__}: {str(exc)[:600]}")
                kernel.stop()
                release(client, base)
                kernel = start_kernel(cluster)
    finally:
        try:
            if kernel is not None:
                kernel.stop()
        finally:
            client.close()
            cluster.stop_cluster_sync()

    print()
    for text in notes:
        print(f"NOTE {text}")
    print(f"({time.time() - began:.0f} s in all)")
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}" if name == "pause_ack_s" else f"RESULT {name}={value:.2f}")
    return 1 if notes else 0


if __name__ == "__main__":
    sys.exit(main())
