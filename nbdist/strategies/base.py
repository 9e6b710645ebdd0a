"""The Strategy contract: a controller half (in the notebook kernel) and a worker half (on engines)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ClusterError, OptionError


@dataclass(frozen=True)
class Option:
    """A `%%distribute` option that one or more strategies read.

    `flags`, `help` and the argparse keywords become the magic's own help text; a value
    given to a strategy that does not read the option is refused by name.
    """

    flags: tuple
    help: str
    kwargs: tuple = ()  # argparse keywords as (name, value) pairs, hashable

    @property
    def dest(self) -> str:
        return self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def default(self):
        return dict(self.kwargs).get("default")


class Worker:
    """The worker half: runs on an engine and trains one `fit` call of the training cell.

    Args:
        spec: the run's JSON-able description (strategy, options, rank, size, config
            from `Strategy.prepare`).
        reporter_factory: makes the metrics callback for this worker given a batch size.
    """

    def __init__(self, spec: dict, reporter_factory):
        self.spec = spec
        self.rank: int = spec["rank"]
        self.size: int = spec["size"]
        self.options: dict = spec["options"]
        self.config: dict = spec.get("config", {})
        self.make_reporter = reporter_factory
        self.callback_changes: list[dict] = []
        self.files_written: list[dict] = []

    def fit(self, request):
        """Train `request.model` as the strategy says; return the Keras `History`."""
        raise NotImplementedError

    def user_callbacks(self, request) -> list:
        """The cell's callbacks this rank runs: all on rank 0, the file writers nowhere else
        (see `nbdist.callbacks`); what changed for this rank is undone when their state is collected."""
        from .. import callbacks

        kept, self.callback_changes = callbacks.for_rank(request.callbacks, self.rank, self.size)
        self.files_written = callbacks.files_written(kept) if self.rank == 0 else []
        return kept

    def cell_context(self):
        """A context the whole training cell runs in (device placement, say); none by default."""
        return contextlib.nullcontext()


class Strategy:
    """The controller half: picks engines, prepares services, cleans up.

    Subclasses set `name`, `summary`, `options` (names of the options they read, see
    `strategies.OPTIONS`), and `worker_class`, and override the hooks they need.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    worker_class: ClassVar[type[Worker]] = Worker
    min_workers: ClassVar[int] = 1
    max_workers: ClassVar[int | None] = None
    default_workers: ClassVar[int | None] = None  # None: every available engine
    survives_worker_loss: ClassVar[bool] = False  # True: a dead worker is reported, the others finish

    def __init__(self, options: dict):
        self.options = options

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

    def prepare(self, run, cluster) -> dict:
        """Start what the controller side needs (PS, rendezvous); return config for the workers.

        May reorder `run.workers`: their order is the rank order.
        """
        return {}

    def control(self, action: str, value=None) -> list[dict]:
        """Act on the running job (pause, resume, stop, lr_scale, max_staleness, evict); returns acknowledgements."""
        raise OptionError(f"--strategy {self.name} has no live controls; interrupt the kernel to stop it.")

    def telemetry(self) -> dict:
        """What the controller side measured since the last call (the PS's push log), for the dashboard."""
        return {}

    def check(self, run) -> None:
        """Called while the run waits: raise an `NbdistError` when a service the run needs has failed."""

    def finish(self, run) -> None:
        """Stop what `prepare` started; called once whatever the run's outcome."""
