"""A Run: one `%%distribute` training cell on the engines, from submission to results or failure."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from ..engine import engine
from .. import errors
from ..cluster.cluster import ClusterHandle
from ..strategies.control_bus import ControlBus
from ..keras_semantics.keras_bridge import FitResult
from ..limits import LIMITS
from ..strategies.newcomers import Newcomers
from ..engine.telemetry import make_record

POLL_S = 0.25
# A worker that fails because a peer failed (Horovod's ring shut down, a collective's connection to a dead rank
# reset) often reports first, before the hub has seen the death. The kernel then waits up to
# LIMITS.cause_grace_s for the cause: a death (the hub's registration, the process on this host) or another
# worker's own error; the lost peer is kept as a consequence.
LOST_PEER = ("Horovod has been shut down", "that engine stopped or died", "Connection reset by peer",
             "Connection closed by peer", "Connection refused", "Broken pipe", "/gloo/", "gloo::", "MPI_ERR",
             "HorovodInternalError")
_run_ids = itertools.count(1)


@dataclass
class Run:
    """One distributed training run and everything it produced.

    Attributes:
        id: run number in this kernel (1, 2, ...).
        strategy: the strategy's name; `options` holds every `%%distribute` option.
        workers: engine ids, in rank order.
        status: pending, running, done, failed or interrupted.
        results: per-worker list of `FitResult`, one per `fit` call of the cell.
        error: the message of a failed or interrupted run.
        logs: engine id -> captured stdout and stderr.
        events: what happened to the run besides training (a worker died, a checkpoint resumed), with times.
        checkpoint: the last parameter-server checkpoint ({"path", "version", "saved_at", "weights"}).
        ps: each parameter-server shard's counters and push log (PS strategies).
        plan: how a model-parallel run split the model (`pipeline`: the cuts and each stage's layers).
        notes: what the user should know about the run (an effective momentum that risks divergence).
        left: what of the engines' state could not come back into the notebook's objects (told under the cell).
        sent: the bytes of notebook models sent to the engines before training, and to which engines.
        services: the processes the run started for itself (parameter-server shards), with their pids.
    """

    strategy: str
    options: dict
    workers: list[int]
    cell: str
    cell_id: str | None = None  # the notebook cell that started the run (the sidebar scrolls to it)
    id: int = field(default_factory=lambda: next(_run_ids))
    status: str = "pending"
    started_at: float | None = None
    ended_at: float | None = None
    results: dict[int, list[FitResult]] = field(default_factory=dict)
    error: str | None = None
    logs: dict[int, str] = field(default_factory=dict)
    progress: dict[int, dict] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    checkpoint: dict | None = None
    ps: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    plan: dict = field(default_factory=dict)  # how a model-parallel run split the model (pipeline: stages, cuts)
    hosts: dict[int, dict] = field(default_factory=dict)  # engine id -> {"host", "gpus"}
    sent: dict = field(default_factory=dict)  # what the kernel sent before training: {"model_bytes", "models",
    # "brought": {"names", "data_bytes", "sharded", "digests"}}
    services: list[dict] = field(default_factory=list)  # processes started for the run: {"kind", "pid", "host", ...}
    controller: object = field(default=None, repr=False)  # the strategy object while it runs
    thread: object = field(default=None, repr=False)  # the `Background` of a --background run not yet waited for
    display: object = field(default=None, repr=False)  # its dashboard or progress line
    stop_requested: bool = field(default=False, repr=False)  # set from another thread: stop as an interrupt would
    prepared: threading.Event = field(default_factory=threading.Event, repr=False)  # controls reach the job now

    @property
    def fits(self) -> list[FitResult]:
        """What the notebook's model receives, one result per `fit` call: the strategy's `gather_result`
        (by default, the first worker in rank order that finished and was not evicted)."""
        from ..strategies import strategy_class

        return strategy_class(self.strategy).gather_result(self)

    @property
    def history(self) -> dict:
        return self.fits[-1].history if self.fits else {}

    @property
    def weights(self) -> list:
        """The trained weights; for a failed parameter-server run, those of its last checkpoint."""
        if self.fits:
            return self.fits[-1].weights
        return (self.checkpoint or {}).get("weights") or []

    @property
    def push_records(self) -> list[dict]:
        """One metrics record per push the first PS shard saw (DESIGN.md section 8, PS fields set)."""
        if not self.ps:
            return []
        offset = (self.started_at or 0.0) if self.clock == "virtual" else 0.0  # the shards log virtual seconds
        return [push_record(self.id, {**row, "t": row["t"] + offset})
                for row in log_rows(self.ps[0]["log_fields"], whole_log(self.ps[0]))]

    # -- facts every view of the run reads (dashboard, sidebar, progress line, reports) ------------
    def latest(self, rank: int = 0) -> dict:
        """The latest progress data a worker published (record, epochs, steps, batch), {} before any."""
        return dict(self.progress.get(self.workers[rank]) or {}) if rank < len(self.workers) else {}

    @property
    def progress_fraction(self) -> float | None:
        """Rank 0's share of its planned steps (1.0 once done); None before its first record."""
        if self.status == "done":
            return 1.0
        latest = self.latest(0)
        epochs, steps, record = latest.get("epochs"), latest.get("steps"), latest.get("record") or {}
        if not (epochs and steps):
            return None
        position = (record.get("epoch") or 0) * steps + (latest.get("batch") or 0)
        return round(min(1.0, position / (epochs * steps)), 4)

    @property
    def clock(self) -> str:
        """real, or virtual: the time in `metrics`, `push_records` and the History's epoch ends is then the
        run's start plus virtual seconds."""
        from ..host.hetero import parse_clock

        return parse_clock(self.options.get("simulate"))[0]

    @property
    def virtual_step(self) -> str | None:
        """On the virtual clock, the step cost the run used (given, or measured on one engine), as
        `--simulate ... step=` writes it: what reproduces the run."""
        return next((f.timings.get("virtual_step") for f in self.fits if f.timings.get("virtual_step")), None)

    @property
    def final_metrics(self) -> dict:
        """The last value of every History key (the run's final loss and metrics); for a loop of the cell's own,
        the loss of its last step."""
        final = {k: v[-1] for k, v in self.history.items() if v}
        loop = next((f for f in self.fits if f.loop is not None), None)
        if not final and loop is not None and loop.records and loop.records[-1].get("loss") is not None:
            final = {"loss": loop.records[-1]["loss"]}
        return final

    def dead_ranks(self) -> set[int]:
        """Ranks whose engine died or whom the PS dropped as silent."""
        return {e["rank"] for e in self.events_of("worker_died")} | \
            {e["worker"] for e in self.events_of("worker_dropped")}

    def worker_state(self, rank: int) -> str:
        """What became of the worker of `rank`: died, evicted, done, running (or "-": not yet)."""
        if rank in self.dead_ranks():
            return "died"
        if rank in self.evicted_ranks():
            return "evicted"
        if rank < len(self.workers) and self.workers[rank] in self.results:
            return "done"
        return "running" if self.status == "running" else "-"

    def evicted_ranks(self) -> set[int]:
        """Ranks evicted by a control."""
        return {e["value"] for e in self.events_of("control:evict") if isinstance(e["value"], int)}

    def stop(self, interrupt: bool = False) -> str:
        """End the run: gracefully through the strategy's controls when it has a stop (weights kept),
        else (or with `interrupt`) as the kernel's interrupt would. Says which. Every stop comes here."""
        if self.status != "running":
            return f"run {self.id} is {self.status}; nothing to stop"
        if interrupt:
            self.stop_requested = True
            return f"run {self.id}: interrupting its engines"
        try:
            self.control("stop")
            return f"run {self.id}: stopping; the weights trained so far are kept"
        except errors.NbdistError:
            self.stop_requested = True
            return f"run {self.id}: interrupting its engines"

    @property
    def metrics(self) -> list[dict]:
        """Every worker's metric records (DESIGN.md section 8), all fits, in time order."""
        records = [r for fits in self.results.values() for fit in fits for r in fit.records]
        return sorted(records, key=lambda r: r["t"])

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def control(self, action: str, value=None) -> list[dict]:
        """Act on the running job: pause, resume, stop, lr_scale (x), max_staleness (s or None), evict (rank).

        Returns each parameter-server shard's acknowledgement (its control state).
        """
        if self.status == "running" and not self.prepared.wait(LIMITS.shard_start_s):
            raise errors.OptionError(f"run {self.id} is still starting (its parameter server or control bus is not "
                                     "up yet); send the control again in a moment.")
        if self.status != "running" or self.controller is None:
            raise errors.OptionError(f"run {self.id} is {self.status}; only a running run takes controls.")
        acks = self.controller.control(action, value)
        self.record(f"control:{action}", value=value)
        return acks

    def record(self, kind: str, t: float | None = None, **fields) -> dict:
        """Note what happened to the run besides training (a death, a recovery, a control, a decision): the
        one way into `events`. `kind` is one its strategy declares (`Strategy.event_sentences`) or a control."""
        from ..strategies import strategy_class

        if not kind.startswith("control:") and kind not in strategy_class(self.strategy).event_sentences():
            raise ValueError(f"--strategy {self.strategy} declares no event {kind!r}: add it to its Reports.events")
        event = {"t": time.time() if t is None else t, "event": kind, **fields}
        self.events.append(event)
        return event

    def note(self, text: str) -> None:
        """Something the user should know about the run, printed under the cell when it ends."""
        self.notes.append(text)

    def event_lines(self) -> list[str]:
        """What happened to the run besides training, one sentence each in time order, as its strategy tells
        each kind (printed under the cell, shown by the dashboard and the sidebar)."""
        from ..strategies import strategy_class

        sentences = strategy_class(self.strategy).event_sentences()
        return [say(e, self) for e in sorted(self.events, key=lambda e: e["t"])
                if (say := sentences.get(e["event"])) is not None]

    def events_of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def __repr__(self):
        return f"<Run {self.id} {self.strategy} on engines {self.workers}: {self.status}>"


def whole_log(shard: dict) -> list[list]:
    """A shard's whole push log: its file when the final stats' window holds less (a long run)."""
    entries, path = shard.get("log") or [], shard.get("log_file")
    if len(entries) < (shard.get("log_total") or 0) and path and os.path.exists(path):
        from ..ps import push_log

        return push_log.read(path)
    return entries


def log_rows(fields, entries) -> list[dict]:
    """A PS push log (`fields`, and one list per push) as one dict per push."""
    return [dict(zip(fields, entry)) for entry in entries]


def push_record(run_id: int, row: dict) -> dict:
    """A metrics record (DESIGN.md section 8, PS fields set) of one push-log row."""
    return make_record(run=run_id, worker=row["worker"], step=row["step"], t=row["t"], staleness=row["staleness"],
                       gamma=row["gamma"], version=row["version"], phase="push", momentum=row["momentum"],
                       comp_norm=row["comp_norm"], applied=row["outcome"] == "applied",
                       dropped=row["outcome"] == "dropped", rejected=str(row["outcome"]).startswith("rejected"))


def execute(run: Run, cluster: ClusterHandle, strategy, on_progress=None, before_submit=None,
            prepare_newcomer=None) -> Run:
    """Run the training cell on the run's workers and wait for it, bounded and interruptible.
    `before_submit()` runs once the strategy has prepared (the workers in rank order), before the cell;
    `prepare_newcomer(eid, rank, size)` gives an engine that joins mid-run the same (`nbdist.strategies.newcomers`).

    Raises:
        EngineFailure: user code failed on an engine (names it, carries the traceback).
        EngineDied: an engine died; the other workers were stopped.
        RunInterrupted: the user interrupted the kernel; every worker was stopped.
    """
    run.status, run.started_at, run.controller = "running", time.time(), strategy
    run.hosts = {eid: {"host": cluster.info(eid).host, "gpus": list(cluster.info(eid).gpus or [])}
                 for eid in run.workers}
    pending: dict = {}  # engine -> its AsyncResult, filled as the cell is submitted
    try:
        joins = _launch(run, cluster, strategy, pending, before_submit, prepare_newcomer)
        _wait(run, cluster, strategy, pending, on_progress, joins)
        run.status = "done"
    except KeyboardInterrupt:
        if strategy.bus is not None:  # ranks waiting in a loop of nbdist's (a re-forming job) end on it too
            strategy.bus.send("stop")
        run.status, run.error = "interrupted", f"interrupted; {_stop_workers(cluster, pending)}"
        raise errors.RunInterrupted(f"run {run.id} {run.error}; the cluster is ready for the next cell") from None
    except Exception as exc:  # a failure of nbdist's own kernel side too: the engines must not stay busy
        _stop_workers(cluster, pending)
        run.status = "failed"
        run.error = str(exc) if isinstance(exc, errors.NbdistError) else f"{type(exc).__name__}: {exc}"
        raise
    finally:
        run.prepared.set()  # a control still waiting for the start now sees how the run ended
        run.ended_at = time.time()
        if pending:
            cluster.running(run.workers, busy=False)
        strategy.finish(run)
        if strategy.bus is not None:
            strategy.bus.stop()
            strategy.bus = None
        run.controller = None
    return run


def _launch(run: Run, cluster: ClusterHandle, strategy, pending: dict, before_submit, prepare_newcomer):
    """The control bus, the strategy's preparation, then the cell on every worker (into `pending`); returns
    what takes in engines that join while it trains (`Newcomers`, or None)."""
    if strategy.uses_control_bus:
        strategy.bus = ControlBus().start(cluster.address_towards(run.workers))
    config = strategy.prepare(run, cluster)
    run.prepared.set()  # a control sent from now on reaches the job (one sent earlier waited for this)
    if before_submit is not None:
        before_submit()
    control = strategy.bus.spec() if strategy.bus is not None else None
    pending.update({eid: _submit(run, cluster, eid, rank, len(run.workers), config, control)
                    for rank, eid in enumerate(run.workers)})
    cluster.running(run.workers)
    if not (prepare_newcomer and strategy.takes_newcomers):
        return None
    return Newcomers(run, cluster, strategy, config, prepare_newcomer,
                     lambda eid, rank, own: _submit(run, cluster, eid, rank, rank + 1, own, control))


def _submit(run: Run, cluster: ClusterHandle, eid: int, rank: int, size: int, config: dict, control: dict | None):
    """Start the training cell on engine `eid` as rank `rank` of `size`; its AsyncResult."""
    spec = {"run": run.id, "strategy": run.strategy, "options": run.controller.values, "size": size, "rank": rank,
            "seed": run.options.get("seed"), "cell": run.cell, "cell_start": run.started_at, "config": config,
            "control": control, "cwd": os.getcwd(),  # an engine that sees the notebook's folder runs the cell there
            "training": run.controller.training, "states": run.controller.loop_states}
    return cluster.client[eid].apply_async(engine.run_training_cell, spec)


class Background:
    """A run's training in a daemon thread; `reraise` hands its error to whoever waits for it."""

    def __init__(self, target):
        self.error: BaseException | None = None

        def body():
            try:
                target()
            except BaseException as exc:  # kept for the waiter: a thread cannot raise into the notebook
                self.error = exc

        self.thread = threading.Thread(target=body, name="nbdist-background-run", daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self) -> None:
        while self.thread.is_alive():  # short joins, so the kernel's interrupt reaches the waiter
            self.thread.join(POLL_S)

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def _wait(run: Run, cluster: ClusterHandle, strategy, pending: dict, on_progress, joins=None) -> None:
    """Until every worker's cell returned: progress, deaths, newcomers (`joins`, added to `pending`)."""
    waiting = dict(pending)
    collateral: tuple[int, errors.EngineFailure, float] | None = None  # a lost peer, raised if no cause comes
    while waiting:
        if run.stop_requested:
            raise KeyboardInterrupt
        if joins is not None:
            joined = joins.take_in()
            pending.update(joined)
            waiting.update(joined)
        if collateral is not None and time.time() > collateral[2]:
            raise _lost_peer(run, cluster, *collateral[:2])
        next(iter(waiting.values())).wait(POLL_S)
        alive = set(cluster.ids())
        for eid, ar in list(waiting.items()):
            if ar.data:
                run.progress[eid] = dict(ar.data)
            try:
                if ar.ready():
                    del waiting[eid]
                    run.logs[eid] = _logs(ar)
                    run.results[eid] = _result(run, cluster, eid, ar)
                elif not cluster.is_alive(eid, alive):
                    raise errors.EngineDied(f"{_died(run, cluster, eid)}; the run was stopped on the other engines.")
            except errors.EngineDied as exc:
                dead = {e["engine"] for e in run.events_of("worker_died")} | {eid}
                if not strategy.continues_without(run, cluster, eid, [e for e in run.workers if e not in dead]):
                    if collateral is not None:  # the survivor's error was this death's consequence
                        raise errors.EngineDied(f"{exc} {_consequence(run, cluster, *collateral[:2])}") from None
                    raise
                waiting.pop(eid, None)
                run.record("worker_died", engine=eid, rank=run.workers.index(eid), host=cluster.info(eid).host,
                           after_s=round(time.time() - run.started_at, 2))
                if joins is not None:
                    joins.replace(eid)
            except errors.EngineFailure as exc:
                if not any(marker in str(exc) for marker in LOST_PEER):
                    raise _died_meanwhile(run, cluster, eid, exc) from None
                collateral = collateral or (eid, exc, time.time() + LIMITS.cause_grace_s)
        strategy.check(run)
        if on_progress is not None:
            on_progress(run)
    if collateral is not None:
        raise _lost_peer(run, cluster, *collateral[:2])


def _died_meanwhile(run: Run, cluster: ClusterHandle, eid: int, exc: errors.EngineFailure) -> errors.EngineFailure:
    """`exc`, unless another engine of the run is already seen dead (then that death, `exc` its consequence)."""
    alive = set(cluster.ids())
    dead = [e for e in run.workers if e != eid and e not in run.results and not cluster.is_alive(e, alive)]
    if not dead:
        return exc
    return errors.EngineDied(f"{_died(run, cluster, dead[0])}; the run was stopped on the other engines. "
                             f"{_consequence(run, cluster, eid, exc)}")


def _consequence(run: Run, cluster: ClusterHandle, eid: int, exc: errors.EngineFailure) -> str:
    """The sentence that keeps a survivor's error as what the death caused (also an event of the run)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    run.record("lost_peer", engine=eid, error=first[:300])
    return f"(Then {cluster.info(eid).label()} failed for want of it: {first[:200]})"


def _lost_peer(run: Run, cluster: ClusterHandle, eid: int, exc: errors.EngineFailure) -> errors.EngineFailure:
    """A survivor's lost-peer error when no death was seen within the grace: said as such, naming the others."""
    others = [e for e in run.workers if e != eid]
    return type(exc)(f"{_who(run, cluster, eid)} lost its connection to another engine of run {run.id} and no "
                     f"engine of the run was seen dying within {LIMITS.cause_grace_s:g} s: one of engines {others} "
                     f"may have died on another host or been cut off from it (check %dist status and the network). "
                     f"Its error: {exc}", getattr(exc, "remote_traceback", ""))


def _result(run: Run, cluster: ClusterHandle, eid: int, ar) -> list[FitResult]:
    import ipyparallel as ipp

    try:
        return FitResult.unpack(ar.get(0))
    except ipp.error.RemoteError as exc:
        if exc.ename == "EngineError":  # ipyparallel's word for a task stranded by a dead engine
            raise errors.EngineDied(f"{_who(run, cluster, eid)} died during run {run.id}: {exc.evalue}") from None
        raise _engine_error(cluster, eid, exc) from None
    except ipp.error.EngineError:
        raise errors.EngineDied(f"{_who(run, cluster, eid)} died during run {run.id}.") from None


def _died(run: Run, cluster: ClusterHandle, eid: int) -> str:
    """The sentence for an engine whose process ended without an error of its own."""
    return (f"{_who(run, cluster, eid)} died during run {run.id} after {time.time() - run.started_at:.1f} s, "
            f"{errors.KILLED_FROM_OUTSIDE}")


def _who(run: Run, cluster: ClusterHandle, eid: int) -> str:
    """An engine as a failure names it: its label and what it was to the run ("rank 1", "pipeline stage 1")."""
    strategy = run.controller
    role = strategy.role(run.workers.index(eid)) if strategy is not None and eid in run.workers else None
    return cluster.info(eid).label() + (f" ({role})" if role else "")


def _engine_error(cluster: ClusterHandle, eid: int, exc) -> errors.NbdistError:
    """Our own errors raised on an engine come back as themselves; user errors name the engine."""
    ours = getattr(errors, exc.ename, None)
    where = cluster.info(eid).label()
    if isinstance(ours, type) and issubclass(ours, errors.NbdistError) and not issubclass(ours, errors.EngineFailure):
        return ours(f"{exc.evalue} [{where}]")
    hint = (" The engines lack a name the cell uses: define it in this notebook (nbdist brings what the "
            "training cell uses, unless --no-bring), or in a %%distribute define cell." if exc.ename == "NameError" else "")
    return errors.EngineFailure(f"{exc.ename}: {exc.evalue} [on {where}]{hint}", user_frames(exc.traceback or ""))


def user_frames(traceback: str) -> str:
    """The part of a remote traceback from the first frame in the user's cell on (nbdist's own frames cut)."""
    lines = traceback.splitlines()
    for i, line in enumerate(lines):
        if "<nbdist " in line and "File" in line:
            return "\n".join(lines[i:])
    return traceback


def _stop_workers(cluster: ClusterHandle, pending: dict) -> str:
    """Interrupt every live worker still running and wait, bounded, until each has stopped."""
    alive = set(cluster.ids())
    running = [eid for eid, ar in pending.items() if not ar.ready() and cluster.is_alive(eid, alive)]
    if not running:
        return "no engine was still running"
    cluster.signal(running, signal.SIGINT)
    deadline = time.time() + LIMITS.stop_s
    for eid in running:
        try:
            pending[eid].wait(max(0.0, deadline - time.time()))
        except Exception:  # the interrupt surfaces as an error on the engine: expected
            pass
    still = [eid for eid in running if not pending[eid].ready()]
    if still:  # the next cell waits for them before it chooses its engines
        cluster.stopping.update({eid: pending[eid] for eid in still})
        return (f"engine(s) {still} did not stop within {LIMITS.stop_s:g} s of the interrupt (still inside a "
                "collective or the cell's own code); the next cell waits for them, see %dist status")
    return f"stopped on engine(s) {running}"


def _logs(ar) -> str:
    return "".join(part for part in (ar.stdout, ar.stderr) if isinstance(part, str))
