"""The Strategy contract: a controller half (in the notebook kernel) and a worker half (on engines).

A strategy is one class with a controller half (`Strategy`: engines, services, controls,
the result) and a worker half (`Worker`: one `fit` on one engine). It declares the
`%%distribute` options it reads (`Option` objects; the magic's parser, README's table and
the sidebar's list are generated from them) and what its runs report (`Reports`: the
dashboard's panels, the live controls, the phases). See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ..errors import ClusterError, OptionError


@dataclass(frozen=True)
class Option:
    """One `%%distribute` option: its flag, help, type and default, declared once, read by name.

    `minimum` refuses smaller values by name; `flag_only` is a switch (no value).
    """

    flag: str
    help: str
    type: Callable | None = None
    default: Any = None
    choices: tuple | None = None
    metavar: str | None = None
    minimum: float | None = None
    flag_only: bool = False
    optional_value: Any = None  # a value the flag alone means (`--resume` = "latest")

    @property
    def name(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def argparse(self) -> dict:
        """The keyword arguments of `argparse.add_argument` for this option."""
        if self.flag_only:
            return {"action": "store_true", "default": bool(self.default), "help": self.help}
        kwargs = {"default": self.default, "help": self.help, "metavar": self.metavar, "type": self.type,
                  "choices": self.choices}
        if self.optional_value is not None:
            kwargs |= {"nargs": "?", "const": self.optional_value}
        return {k: v for k, v in kwargs.items() if v is not None or k == "default"}

    def check(self, value) -> None:
        """Refuse a value below `minimum`, naming the flag and echoing the value."""
        if self.minimum is not None and value is not None and value < self.minimum:
            raise OptionError(f"{self.flag} takes a number of at least {self.minimum:g}. Received: {self.flag} {value}")


Sentence = Callable[[dict, Any], str]  # (event, run) -> what the cell prints


@dataclass(frozen=True)
class Reports:
    """What a strategy's runs report, read by the dashboard, the sidebar and the experiments.

    `panels`: the dashboard's figures (names in `nbdist.notebook.widgets.panels`); `controls`: the live
    controls `Strategy.control` honours; `phases`: the training phases it goes through; `events`: the
    kinds of event its runs record (`Run.record`) beyond `COMMON_EVENTS`, each with the sentence it prints
    under the cell, in the dashboard and the sidebar (None: recorded, not told).
    """

    panels: tuple[str, ...] = ("loss", "throughput")
    controls: tuple[str, ...] = ("pause", "resume", "stop")
    phases: tuple[str, ...] = ()
    events: Mapping[str, Sentence | None] = field(default_factory=dict)


def table(header: list[str], rows: list[list]) -> str:
    """Left-aligned columns separated by two spaces: the plain-text form of every report (`%dist status`, ASHL's
    profile, the runs)."""
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _first_epoch(event) -> str:
    return "" if event.get("first_epoch") is None else f", training from epoch {event['first_epoch'] + 1}"


# what every run may record (controls are recorded as control:<action>, never told)
COMMON_EVENTS: dict[str, Sentence | None] = {
    "worker_died": lambda e, run: (f"worker rank {e['rank']} (engine {e['engine']}, host {e['host']}) died "
                                   f"{e['after_s']:.1f} s into run {run.id}"),
    "lost_peer": None,  # a survivor's broken collective, kept as the consequence of a death (in the error)
    "engine_restarted": lambda e, run: (f"engine {e['engine']} died and a new engine was started in its place "
                                        "(--restart-engines)"),
    "restart_failed": lambda e, run: f"engine {e['engine']} died and could not be replaced: {e['reason']}",
    "worker_joined": lambda e, run: (f"engine {e['engine']} (host {e['host']}) joined run {run.id} as rank "
                                     f"{e['rank']} {e['after_s']:.1f} s in{_first_epoch(e)}"),
    "join_refused": lambda e, run: (f"engine {e['engine']} registered during run {run.id} and was not taken in: "
                                    f"{e['reason']}"),
}


class Worker:
    """The worker half: runs on an engine and trains one `fit` call of the training cell.

    Args:
        spec: the run's JSON-able description (strategy, option values, rank, size, config
            from `Strategy.prepare`).
        reporter_factory: makes the metrics callback for this worker given a batch size.
    """

    def __init__(self, spec: dict, reporter_factory):
        self.spec = spec
        self.rank: int = spec["rank"]
        self.size: int = spec["size"]
        self.values: dict = spec["options"]
        self.config: dict = spec.get("config", {})
        self.make_reporter = reporter_factory
        self.callback_changes: list[dict] = []
        self.files_written: list[dict] = []
        self.virtual_step = None  # the run's StepCost on the virtual clock, once known
        self.fit_timings: dict = {}  # what the last fit measured of itself, added to the FitResult's timings

    def fit(self, request):
        """Train `request.model` as the strategy says; return the Keras `History`."""
        raise NotImplementedError

    @property
    def keeps_callbacks(self) -> bool:
        """Whether this worker's callbacks hold the state the notebook's callbacks receive (rank 0's)."""
        return self.rank == 0

    def result(self, request, history, records, timings, states):
        """What this worker sends back for one `fit`: the trained model, History, records (a `FitResult`)."""
        from ..keras_semantics.keras_bridge import FitResult

        return FitResult.collect(request.model, history, records, timings, states, self.files_written)

    def cell_context(self):
        """A context the whole training cell runs in (device placement, say); none by default."""
        return contextlib.nullcontext()

    def control_point(self):
        """The run's live controls as this worker sees them (`nbdist.strategies.control_bus.ControlPoint`); close it."""
        from .control_bus import ControlPoint

        return ControlPoint(self.spec["control"])

    def refuse_other_optimizers(self, request) -> None:
        """This strategy updates the model through `model.optimizer` alone: a model whose own `train_step`
        applies optimizers of its own (a GAN's two) is refused by name, before it trains, with what to use."""
        from ..keras_semantics.keras_bridge import other_optimizers

        others = sorted(other_optimizers(request.model))
        if others:
            raise OptionError(f"--strategy {self.spec['strategy']} updates the model through model.optimizer "
                              f"alone; this model's train_step also applies {', '.join(others)} (optimizers of "
                              "its own), which it cannot. Train it with --strategy hfdt (every optimizer's "
                              "gradients averaged across ranks) or local.")

    # -- the cell's own optimizer steps (a hand-written loop; DESIGN.md section 13) --------------------------
    synchronous = False  # every rank must make the same steps (its loop's data is checked for a known length)

    @contextlib.contextmanager
    def loop_context(self):
        """Around a cell that steps its optimizers itself: what its steps need (the run's controls here; Horovod's
        job, the parameter server's client in the strategies that extend it)."""
        import threading

        self.loop_control = self.control_point()
        self.control_lock = threading.Lock()  # the loop's monitor thread and its steps share the control point
        try:
            yield
        finally:
            self.loop_control.close()

    def routes_in_fit(self, optimizer) -> bool:
        """Whether a step of `optimizer` made inside `fit` goes through `step` (else `fit`'s own path has it)."""
        return False

    def step(self, index: int, optimizer, grads: list, variables: list, apply):
        """One step of the cell's optimizer number `index` (the order of first steps): by default `apply(grads,
        variables)`, the step as it is. Returns the control flags the ranks agreed in it (a tensor), or None."""
        apply(grads, variables)
        return None

    def poll_controls(self):
        """The run's controls as this worker sees them now, [paused, stop] (read by the loop's monitor thread; the
        next step acts on them), or None where the step agrees them itself."""
        if not self.control_lock.acquire(blocking=False):  # a pause waits on it: nothing new to read
            return None
        try:
            return self.loop_control.flags()
        finally:
            self.control_lock.release()

    def act_on_controls(self, flags) -> None:
        """In a step of the cell's loop while a control is on (`flags`: [paused, stop], what the ranks agreed or
        this worker saw): a pause waits here, a stop ends the loop (`LoopStopped`)."""
        from ..keras_semantics.step_seam import LoopStopped

        with self.control_lock:
            self.loop_control.act(flags)
        if self.loop_control.stopped:
            raise LoopStopped("the run was stopped")

    def statement_ended(self) -> None:
        """A top-level statement of the cell that stepped has ended (the parameter server's workers wait for the
        others' last pushes here and take the final weights)."""

    def loop_extra(self) -> dict:
        """This worker's own fields of a loop's metric records (staleness, bytes sent)."""
        return {}

    def user_callbacks(self, request) -> list:
        """The cell's callbacks this rank runs: all on rank 0, the file writers nowhere else
        (see `nbdist.keras_semantics.callbacks`); what changed for this rank is undone when their state is collected."""
        from ..keras_semantics import callbacks

        kept, self.callback_changes = callbacks.for_rank(request.callbacks, self.rank, self.size)
        self.files_written = callbacks.files_written(kept) if self.rank == 0 else []
        return kept


class Strategy:
    """The controller half: picks engines, prepares services, acts on the running job, gathers the result.

    Subclasses set `name`, `summary`, `reads` (the `Option`s they read), `reports` and
    `worker_class`, and override the hooks they need. An instance holds the run's option
    values in `values` (every option it reads, defaults filled in).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    reads: ClassVar[tuple[Option, ...]] = ()
    reports: ClassVar[Reports] = Reports()
    worker_class: ClassVar[type[Worker]] = Worker
    min_workers: ClassVar[int] = 1
    max_workers: ClassVar[int | None] = None
    default_workers: ClassVar[int | None] = None  # None: every available engine
    survives_worker_loss: ClassVar[bool] = False  # True: a dead worker is reported, the others finish
    uses_control_bus: ClassVar[bool] = True  # False: the strategy carries its controls itself (the PS)
    fills_own_part: ClassVar[bool] = False  # True: engines build models empty and fill only their part (`empty_weights`)
    # why a cell that steps its optimizers itself (a hand-written loop) is refused; None: this strategy runs one
    loop_refusal: ClassVar[str | None] = "it distributes a model's fit(...), not a loop's own optimizer steps"

    def __init__(self, values: dict):
        self.values = values
        self.bus = None  # the run's control bus (`nbdist.strategies.control_bus`), set by `Run` while it runs
        self.notebook_models: dict = {}  # fills_own_part: {name: the notebook's `ModelState`}, set before prepare
        self.training: dict | None = None  # how the cell trains, as the kernel read it (`training_code.Training`)
        self.loop_states = None  # a loop cell's optimizers and metrics as the notebook holds them (`loop_state.carried`)

    @property
    def loop(self) -> bool:
        """The run's cell steps its optimizers itself (a hand-written loop)."""
        return bool(self.training and self.training["fit"] is False and self.training["steps"])

    def orders_loop_pushes(self) -> bool:
        """Whether `--simulate` as given applies to a loop of the cell's own (the virtual clock's order of pushes,
        on the parameter server); no by default."""
        return False

    def refuse_loop(self) -> None:
        """Refuse a hand-written loop by name, before any engine is touched, where this strategy cannot run one."""
        if self.values.get("simulate") and not self.orders_loop_pushes():
            raise OptionError("--simulate slows or times the steps of fit(...); a training loop of the cell's own "
                              "runs at its engines' own speed, except under a parameter-server strategy with "
                              "--simulate 'clock=virtual; step=...' (its pushes then arrive in virtual time, so an "
                              "asynchronous loop is reproducible). Leave --simulate out for the loop, or give that.")
        if self.loop_refusal is not None:
            raise OptionError(f"--strategy {self.name} cannot run a training loop of the cell's own: "
                              f"{self.loop_refusal}. Run the loop under --strategy local, hfdt, or a "
                              "parameter-server strategy (nfdt, asgd, ddc-asgd and the other delay rules, ssgd), "
                              "or train with model.fit(...).")

    @classmethod
    def decision_lines(cls, run) -> list[str]:
        """One line per decision the run made of itself (ASHL's allocations and phase switch), for the
        dashboard's "decisions" panel; none by default."""
        return []

    @classmethod
    def event_sentences(cls) -> dict[str, Sentence | None]:
        """Every kind of event this strategy's runs record, with its sentence (None: not told)."""
        return {**COMMON_EVENTS, **cls.reports.events}

    def value(self, name: str):
        """The run's value of option `name` (its default when not given)."""
        return self.values.get(name)

    @property
    def clock(self) -> str:
        """real, or virtual (`--simulate "...; clock=virtual"`: DESIGN.md section 7)."""
        from ..host.hetero import parse_clock

        return parse_clock(self.values.get("simulate"))[0]

    def clock_config(self, workers: int) -> dict:
        """What every worker needs of `--simulate`: each rank's profile, and the virtual clock's step (None:
        the real clock)."""
        from ..host.hetero import parse_clock, parse_simulate

        clock, step = parse_clock(self.value("simulate"))
        return {"simulate": [p.to_json() for p in parse_simulate(self.value("simulate"), workers)],
                "virtual": {"step": step.to_json() if step else None} if clock == "virtual" else None}

    def array_shards(self) -> bool:
        """Whether every worker trains on the equal strided shard of the cell's arrays
        (`sharding.shard_arrays`), so the notebook may send each worker only its shard."""
        return False

    def choose_workers(self, available: list[int], workers: int | None, targets: list[int] | None) -> list[int]:
        """The engine ids this run trains on, from the idle engines `available` (sorted)."""
        if targets and workers is not None:
            raise OptionError(f"give --workers or --targets, not both. Received: --workers {workers} "
                              f"--targets {','.join(map(str, targets))}")
        if targets:
            chosen = list(dict.fromkeys(targets))
            missing = [t for t in chosen if t not in available]
            if missing:
                raise ClusterError(
                    f"--targets names engine(s) {missing} that are not idle and alive; "
                    f"idle engines: {available or 'none'} (see %dist status)."
                )
        else:
            count = workers if workers is not None else (self.default_workers or len(available))
            if count > len(available):
                raise ClusterError(
                    f"--workers {count} needs {count} idle engines but {len(available)} are idle "
                    f"({available or 'none'}); start more with %dist start -n {count}, or see %dist status."
                )
            chosen = available[:count]
        if len(chosen) < self.min_workers or (self.max_workers and len(chosen) > self.max_workers):
            most = f"at most {self.max_workers}" if self.max_workers else "any number of"
            raise OptionError(
                f"--strategy {self.name} runs on at least {self.min_workers} and {most} engine(s). "
                f"Received: {len(chosen)} engine(s) {chosen}."
            )
        return chosen

    def role(self, rank: int) -> str:
        """What the worker of this rank is to the run, for messages ("rank 1", "pipeline stage 1")."""
        return f"rank {rank}"

    def prepare(self, run, cluster) -> dict:
        """Start what the controller side needs (PS, rendezvous); return config for the workers.

        May reorder `run.workers`: their order is the rank order.
        """
        return {}

    def control(self, action: str, value=None) -> list[dict]:
        """Act on the running job; returns the acknowledgements. By default the run's control bus
        carries pause, resume and stop to every worker (they act at the same step)."""
        if action not in self.reports.controls or self.bus is None:
            raise OptionError(f"--strategy {self.name} has no live control {action!r}; it has "
                              f"{', '.join(self.reports.controls) or 'none'}.")
        return [self.bus.send(action, value)]

    def telemetry(self) -> dict:
        """What the controller side measured since the last call (the PS's push log), for the dashboard."""
        return {}

    def continues_without(self, run, cluster, dead: int, survivors: list[int]) -> bool:
        """Engine `dead` of the run died: whether the run goes on with `survivors` (the strategy arranges
        that). By default: a strategy that survives a worker's loss does, while any worker is left."""
        return self.survives_worker_loss and bool(survivors)

    @property
    def takes_newcomers(self) -> bool:
        """Whether engines that register while a run trains may join it (`admit`); none by default."""
        return False

    def newcomer_shard(self, run, rank: int) -> tuple[int, int]:
        """(shard, of how many) of the data the newcomer that joins as rank `rank` trains on: by default
        the strided 1/(rank + 1)."""
        return rank, rank + 1

    def admit(self, run, eid: int, rank: int, config: dict) -> dict:
        """Take engine `eid` (prepared: definitions, models and its share of the data are there) into the
        running job as rank `rank`; returns its worker's config (`config`: what `prepare` gave the others).
        Raises `nbdist.strategies.newcomers.Refused` with the reason when it cannot join now."""
        from .newcomers import Refused

        raise Refused(f"--strategy {self.name} does not take engines that join a running run")

    def check(self, run) -> None:
        """Called while the run waits: raise an `NbdistError` when a service the run needs has failed."""

    @classmethod
    def gather_result(cls, run) -> list:
        """The `FitResult`s (one per `fit` call) the notebook's model receives: by default those of the
        first worker, in rank order, that finished and was not evicted. (A class method: the run's
        result is read after its strategy object is gone.)"""
        evicted = {run.workers[r] for r in run.evicted_ranks() if r < len(run.workers)}
        order = [eid for eid in run.workers if eid not in evicted] + [eid for eid in run.workers if eid in evicted]
        return next((run.results[eid] for eid in order if run.results.get(eid)), [])

    def finish(self, run) -> None:
        """Stop what `prepare` started; called once whatever the run's outcome."""
