"""A stalled run, named: who waits, for what, and who holds it back (`--stall-timeout`).

`hfdt`: every rank marks when it enters and leaves a unit of collectives (a train call, the epoch-end
averaging). A rank that has waited inside one for `--stall-timeout` seconds says so once, from a
watchdog thread (its main thread is blocked in the collective), in its task's published data. The
kernel then names the ranks that are not waiting: they never reached the collective (stuck in a
callback or a data generator, or an engine that hangs without dying). The first unit of a job is not
timed: every rank traces its train step there, which takes as long as the engine's load makes it.

The parameter-server strategies: a worker marks its progress (a step ended, a request sent to the shards, a reply)
and the work a run expects to be long (`Silence`); silent past the timeout, it says what it waits for in the same
way, and once every live worker has said so the kernel fails the run naming each one's wait (`silent_workers`).
"""

from __future__ import annotations

import contextlib
import threading
import time

WAITING_KEY = "nbdist_waiting"  # in a worker's published data: {"since", "unit"} while stalled, else None
CHECK_S = 0.5


class StallWatch:
    """A rank's side: `entering()` / `left()` around each unit; `stop()` at the fit's end."""

    def __init__(self, publish, timeout_s: float):
        self.publish, self.timeout_s = publish, timeout_s
        self.entered: float | None = None
        self.unit = 0
        self.said = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="nbdist-stall-watch", daemon=True)
        self._thread.start()

    def entering(self, unit: int | str, timed: bool = True) -> None:
        """This rank enters unit `unit`; `timed` False: its wait is not watched (a job's first unit)."""
        self.unit, self.entered = unit, time.time() if timed else None

    def left(self) -> None:
        self.entered = None
        if self.said:  # it said it waited: the kernel learns the wait is over
            self.said = False
            self.publish({WAITING_KEY: None})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_S):
            entered = self.entered
            if entered is not None and not self.said and time.time() - entered > self.timeout_s:
                self.said = True
                self.publish({WAITING_KEY: {"since": entered, "unit": self.unit}})


def missing_ranks(run, ranks: list[int], timeout_s: float) -> list[int]:
    """The ranks (of the job's engines `ranks`, in rank order) that never reached a collective others
    have waited in past the timeout; [] while no rank waits, or all do."""
    waiting = {e: (run.progress.get(e) or {}).get(WAITING_KEY) for e in ranks}
    missing = [rank for rank, eid in enumerate(ranks) if not waiting[eid]]
    # a rank that entered the collective up to `timeout_s` after the first waiter says so itself by
    # 2 x timeout_s; one still silent then never arrived (not merely later than the others)
    settled = [w for w in waiting.values() if w and time.time() - w["since"] > 2 * timeout_s + 2 * CHECK_S]
    return missing if settled and len(missing) < len(ranks) else []


def stalled(run, ranks: list[int], timeout_s: float) -> str | None:
    """What the cell says when some of the job's ranks (engines `ranks`, in rank order) have waited past
    the timeout in a collective the others never reached; None while no rank waits, or all do."""
    missing = missing_ranks(run, ranks, timeout_s)
    if not missing:
        return None
    parts = []
    for rank in missing:
        eid = ranks[rank]
        record = (run.progress.get(eid) or {}).get("record") or {}
        last = (f"its last progress: epoch {record.get('epoch')}, step {record.get('step')}, "
                f"{time.time() - record['t']:.0f} s ago" if record.get("t") else "no progress reported")
        parts.append(f"rank {rank} (engine {eid}, host {(run.hosts.get(eid) or {}).get('host', '?')}; {last})")
    return (f"the synchronous step waited more than {timeout_s:g} s (--stall-timeout) for rank(s) that never "
            f"reached it: {'; '.join(parts)}. Such a rank is stuck in the cell's own code (a callback, a data "
            "generator) or its engine hangs; the run was stopped. Fix that code (or check the engine), or give a step "
            "that is slow on purpose more time with --stall-timeout.")


def stall_timeout(values: dict, limit: float) -> float:
    """--stall-timeout as a run applies it: the user's seconds, or nbdist's own `limit` (`nbdist.limits`)."""
    given = values.get("stall_timeout")
    return float(limit if given is None else given)


# -- parameter-server runs: every live worker silent --------------------------------------------------------------
class Silence:
    """A parameter-server worker's side: it is silent while it ends no step, sends the shards no request and
    receives no reply. Silent past the timeout, outside the work a run expects to be long (its start, until its
    first push is answered: the model sent to the shards, tracing its first step, the start barrier; a table's first
    push, held at that table's start barrier; validation; an epoch's end, see `long_work`), it says once what it is
    doing (the oldest request it waits for, or the cell's own code since its last progress) in the key a stalled
    hfdt rank uses, and that the wait is over when it progresses. Called from every thread that talks to the shards
    (the training step, an overlapped exchange, the batches' reader)."""

    STARTING = "starting (the model sent to the shards, its first step traced, the start barrier)"

    def __init__(self, publish, timeout_s: float):
        self.watch = StallWatch(publish, timeout_s)
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[str, bool]] = {}  # each request in flight (by order sent): its wait, timed
        self.sent = 0
        self.starting = True  # until its first push is answered
        self.pushed: set[int] = set()  # tables whose first push was answered: their start barrier is behind
        self.long: str | None = None  # the long work it is in, if any
        self.last = "it connected to the parameter server"  # its last progress
        self.tables: dict[int, str] = {}  # table -> the optimizer it holds, for the descriptions
        self._mark()

    @contextlib.contextmanager
    def waiting(self, kind: str, fields: dict, per_shard: list[dict] | None, only: int | None):
        """Within: a request of `kind` (header `fields`, each shard's own `per_shard`) waits for its answer."""
        table = fields.get("table", 0)
        what = self._describe(kind, table, fields, per_shard)
        whom = f"shard {only}'s answer" if only is not None else "the shards' answers"
        timed = kind != "push" or table in self.pushed  # a table's first push may wait at its start barrier
        with self.lock:
            self.sent += 1
            token = self.sent
            self.pending[token] = (f"waiting for {whom} to its {what}", timed)
            self._mark()
        try:
            yield
        finally:
            with self.lock:
                del self.pending[token]
                self.last = f"its {what} was answered"
                if kind == "push":
                    self.pushed.add(table)
                    self.starting = False
                self._mark()

    def stepped(self, what: str) -> None:
        """A step ended (`what`: which)."""
        with self.lock:
            self.last = what
            self._mark()

    def long_work(self, what: str | None) -> None:
        """From now on in work expected to be long (`what`, untimed), or (None) no longer."""
        with self.lock:
            self.long = what
            self._mark()

    def stop(self) -> None:
        """The fit (or the loop) ended: nothing more is watched, and a wait it said it was in is over."""
        self.watch.stop()
        self.watch.left()

    def _mark(self) -> None:
        """Progress now: the timer starts again, on what it does from here on (called holding the lock)."""
        if self.pending:
            what, timed = self.pending[min(self.pending)]
        else:
            what = self.long or (self.STARTING if self.starting else
                                 f"in the cell's own code (a callback, the data pipeline, its train step) since "
                                 f"{self.last}")
            timed = self.long is None
        self.watch.left()
        self.watch.entering(what, timed=timed and not self.starting)

    def _describe(self, kind: str, table: int, fields: dict, per_shard: list[dict] | None) -> str:
        """A request as the error names it: which kind, table, step, version or epoch."""
        name = f"table {table}" + (f" ({self.tables[table]})" if table in self.tables else "")
        versions = sorted({own.get("version") for own in per_shard or [] if own.get("version") is not None})
        if kind == "push":
            on = f", computed on version {versions[0]}" if len(versions) == 1 else (
                f", computed on versions {versions}" if versions else "")
            return f"push of step {fields.get('step')} to {name}{on}"
        if kind == "batch":
            epoch, taken = fields["taken"]
            return f"request for batches (epoch {epoch}, {taken} batches of it taken)"
        if kind == "epoch":
            return f"logs of epoch {fields.get('epoch')} (their mean waits for every live worker's)"
        if kind == "done":
            return f"end of its fit on {name} (the barrier waits until no live worker still trains)"
        return f"{kind} request on {name}"


def publish(data: dict) -> None:
    """To the kernel, in the engine task's published data (merged into what the run's progress shows)."""
    from ipyparallel.datapub import publish_data

    publish_data(data)


def silent_workers(run, workers: dict[int, int], timeout_s: float, since: float = 0.0) -> str | None:
    """What the cell says when every live worker of a parameter-server run (`workers`: rank -> engine) has said it
    was silent past the timeout, counted from no earlier than `since` (a resume); None otherwise."""
    now = time.time()
    said = {rank: (run.progress.get(eid) or {}).get(WAITING_KEY) for rank, eid in workers.items()}
    if not said or not all(said.values()) or any(now - max(s["since"], since) <= timeout_s for s in said.values()):
        return None
    parts = [f"worker {rank} (engine {workers[rank]}, host {(run.hosts.get(workers[rank]) or {}).get('host', '?')}), "
             f"silent {now - s['since']:.0f} s: {s['unit']}" for rank, s in sorted(said.items())]
    return (f"no worker made progress (a step, a request to the parameter server, a reply) for more than {timeout_s:g} s "
            f"(--stall-timeout): {'; '.join(parts)}. A worker held in the cell's own code (a callback, a data "
            "generator, its train_step) holds back the others waiting for it; the run was stopped, the parameter "
            "server's last checkpoint in nbdist.last_run.weights. Fix that code, or give work that is slow on purpose "
            "more time with --stall-timeout.")
