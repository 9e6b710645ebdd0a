"""`adsp` (Hu et al., AAAI 2020), the baseline ASHL is measured against: workers never wait.

Each worker trains locally with the cell's own optimizer and, every `interval` steps,
commits its accumulated update delta = w_local - w_pulled to the parameter server, which
applies w <- w + delta/N; the reply is the new global weights. The commit interval is
found online: every few commits the worker tries a neighbouring interval and keeps the
one whose loss fell faster per second (a hill climb over 1, 2, 4, ..., 64 steps). On the
virtual clock a commit charges the local steps it carries, and "per second" is virtual.
"""

from __future__ import annotations

import time

import numpy as np

from ..ps.exchange import PushPull
from . import options as opt
from .parameter_server import PsStrategy, PsWorker, assign

INTERVALS = (1, 2, 4, 8, 16, 32, 64)
START_INTERVAL = 4
COMMITS_PER_TRIAL = 6


class IntervalSearch:
    """Online hill climb of the commit interval on loss decrease per second."""

    def __init__(self, start: int = START_INTERVAL):
        self.index = INTERVALS.index(start)
        self.best: tuple[int, float] | None = None  # (index, rate)
        self.direction = 1
        self.trials: list[dict] = []  # each interval tried, its rate, the next one

    @property
    def interval(self) -> int:
        return INTERVALS[self.index]

    def report(self, rate: float) -> None:
        """The loss decrease per second measured over the last trial of the current interval."""
        measured = self.interval
        if self.best is None or rate > self.best[1]:
            self.best = (self.index, rate)
        else:  # worse: go back to the best and try the other side next time
            self.index, self.direction = self.best[0], -self.direction
        nxt = min(max(self.index + self.direction, 0), len(INTERVALS) - 1)
        if nxt == self.index:
            self.direction = -self.direction
            nxt = min(max(self.index + self.direction, 0), len(INTERVALS) - 1)
        self.trials.append({"t": time.time(), "from": measured, "to": INTERVALS[nxt], "rate": rate})
        self.index = nxt


class AdspSchedule:
    """ADSP's commit interval: searched online, one trial every COMMITS_PER_TRIAL commits, on loss
    decrease per second (virtual seconds on the virtual clock)."""

    def __init__(self, exchange: PushPull):
        self.exchange = exchange
        self.search = IntervalSearch()
        self.trial_start: tuple[float, float] | None = None  # (time, loss)

    @property
    def interval(self) -> int:
        return self.search.interval

    def _now(self) -> float:
        return self.exchange.virtual.now if self.exchange.virtual is not None else time.time()

    def stepped(self, since: int, loss: float | None) -> None:
        if self.trial_start is None and loss is not None:
            self.trial_start = (self._now(), float(loss))

    def committed(self, commits: int, loss: float | None) -> None:
        if commits % COMMITS_PER_TRIAL == 0 and loss is not None and self.trial_start:
            started, loss0 = self.trial_start
            self.search.report((loss0 - float(loss)) / max(self._now() - started, 1e-9))
            self.trial_start = None


class AdspWorker(PsWorker):
    """A worker that trains locally and commits its accumulated update at the searched interval."""

    routes_other_optimizers = False  # a train_step's own optimizers would step locally, out of sync

    uses_ps_optimizer = False  # each worker applies the cell's optimizer itself

    def connect(self, exchange: PushPull, model, variables) -> list:
        return [local_committer(exchange, variables, AdspSchedule(exchange))]


def local_committer(exchange: PushPull, variables, schedule):
    """A callback for workers that train with the cell's own optimizer: every `schedule.interval` steps it
    commits the accumulated update w_local - w_pulled (one push carrying those local steps) and installs
    the weights the PS returns. `schedule` may also have `stepped(since, loss)` (every step, before the
    commit it may make) and `committed(commits, loss)`."""
    import keras

    class Committer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.pulled = [np.array(v.numpy()) for v in variables]
            self.since, self.commits = 0, 0

        def on_train_batch_end(self, batch, logs=None):
            self.since += 1
            loss = (logs or {}).get("loss")
            getattr(schedule, "stepped", lambda *_: None)(self.since, loss)
            if self.since >= schedule.interval:
                self.commit()
                getattr(schedule, "committed", lambda *_: None)(self.commits, loss)

        def commit(self):
            deltas = [v.numpy() - p for v, p in zip(variables, self.pulled)]
            new = exchange.push(*deltas, steps=self.since)  # the local steps it carries
            assign(variables, new)
            self.pulled, self.since = [np.array(w) for w in new], 0
            self.commits += 1

        def finish(self):
            """The steps since the last commit are not lost: commit them before the end barrier."""
            if self.since:
                self.commit()

    return Committer()


class AdspStrategy(PsStrategy):
    """ADSP: workers train locally and commit their accumulated updates at a searched interval."""

    name = "adsp"
    summary = "ADSP: workers never wait, each commits its local update at a commit interval searched online"
    reads = opt.PARAMETER_SERVER
    worker_class = AdspWorker
    loop_refusal = ("its workers step locally and commit their updates on fit's steps, which a loop of the cell's "
                    "own does not pass through")

    def shard_settings(self, workers: int) -> dict:
        return {**super().shard_settings(workers), "rule": {"preset": "adsp", "workers": workers}}
