"""The engine-side Keras callback that turns training into metric records (DESIGN.md section 8)."""

from __future__ import annotations

import socket
import time

import keras

from ..keras_semantics.fused_steps import steps_done
from .telemetry import WindowedRate, make_record


class ProgressReporter(keras.callbacks.Callback):
    """Records progress at most every `interval_s` and publishes the latest.

    `publish(dict)` sends the latest state to the kernel (ipyparallel's datapub on an engine);
    the full list of records stays in `records` for the result. `extra()` returns the
    strategy's own fields (staleness, bytes_sent, comm_s) for each record; it may be set after
    construction. `batch_size` may be a function, for a worker whose batch changes (ASHL).
    """

    # Batch-end hooks then run on Keras' dispatch thread, so training never waits for us to
    # read the loss; the counters are touched from that one thread only.
    async_safe = True
    fused_steps_safe = True  # counts steps by batch index, so several steps per call count right

    def __init__(self, run_id, worker: int, batch_size, publish=None, interval_s: float = 0.5,
                 phase: str = "train", extra=None, clock=None):
        super().__init__()
        self.run_id, self.worker, self.batch_size, self.publish = run_id, worker, batch_size, publish
        self.interval_s, self.phase, self.extra = interval_s, phase, extra
        self.clock = clock or time.time  # on the virtual clock: the run's start plus virtual seconds
        self.wall_last = 0.0
        self.records: list[dict] = []
        self.first_step_t: float | None = None
        self.host = socket.gethostname()
        self.steps = 0
        self.expected_steps = None  # steps an epoch is expected to take where Keras cannot know (batches on demand)
        self._samples = 0
        self._epoch = 0
        self._in_epoch = 0  # steps of this epoch counted
        self._rate = WindowedRate()

    def _batch(self):
        return self.batch_size() if callable(self.batch_size) else self.batch_size

    def on_train_begin(self, logs=None):
        self.wall_last = time.time()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._in_epoch = epoch, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step_t is None:
            self.first_step_t = time.time()

    def on_train_batch_end(self, batch, logs=None):
        done = steps_done(batch, (self.params or {}).get("steps"))
        made, self._in_epoch = max(done - self._in_epoch, 0), done
        first = self.steps == 0
        self.steps += made
        self._samples += (self._batch() or 0) * made
        if first:  # the rate counts from the first step's end, so tracing is not in it
            self._rate.add(self.clock(), self._samples)
        wall = time.time()  # records go out at most every interval_s of wall time, whatever the clock
        if wall - self.wall_last >= self.interval_s:
            self.wall_last = wall
            self._emit(self.clock(), logs, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self._emit(self.clock(), logs, self._in_epoch, epoch_end=True)

    def _emit(self, now, logs, batch_in_epoch, epoch_end=False):
        logs = logs or {}
        measured = self.batch_size is not None
        rate = self._rate.add(now, self._samples) if measured and self.steps > 1 else None
        record = make_record(
            run=self.run_id, worker=self.worker, host=self.host, step=self.steps, epoch=self._epoch, t=now,
            loss=_float(logs.get("loss")), samples=self._samples if measured else None,
            samples_per_s=rate,
            **{"staleness": 0, "lr": _learning_rate(self.model), "phase": self.phase,
               **(self.extra() if self.extra is not None else {})},
        )
        self.records.append(record)
        if self.publish is not None:
            self.publish({"record": record, "batch_size": self._batch(), "epochs": self.params.get("epochs"),
                          "steps": self.params.get("steps") or self.expected_steps, "batch": batch_in_epoch,
                          "epoch_end": epoch_end,
                          "logs": {k: _float(v) for k, v in logs.items()}})


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _learning_rate(model):
    optimizer = getattr(model, "optimizer", None)
    try:
        return float(optimizer.learning_rate)
    except Exception:  # schedules and missing optimizers: not worth a failure
        return None


class LoopReporter:
    """The records of a hand-written loop (DESIGN.md section 13), as `ProgressReporter` makes them for `fit`: the
    loop's monitor thread calls `update(steps, loss)` with the step seam's count of the first optimizer's steps and
    its last loss; a record goes out at most every `interval_s`. The samples of a step are known where the loop
    iterates a batched pipeline (`batch_size()`, else None: the record then has steps, not samples)."""

    def __init__(self, run_id, worker: int, publish=None, interval_s: float = 0.5, batch_size=None, extra=None):
        self.run_id, self.worker, self.publish, self.interval_s = run_id, worker, publish, interval_s
        self.batch_size = batch_size or (lambda: None)
        self.extra = extra  # the strategy's own fields (staleness, bytes sent)
        self.host = socket.gethostname()
        self.records: list[dict] = []
        self.steps = 0
        self.first_step_t: float | None = None
        self._wall_last = 0.0
        self._rate = WindowedRate()
        self._step_rate = WindowedRate()

    def update(self, steps: int, loss: float | None, final: bool = False) -> None:
        now = time.time()
        if steps and self.first_step_t is None:
            self.first_step_t = now  # (within the monitor's interval of the first step)
            self._rate.add(now, steps * (self.batch_size() or 0))
            self._step_rate.add(now, steps)
        if steps == self.steps and not final:
            return
        self.steps = steps
        if final or now - self._wall_last >= self.interval_s:
            self._wall_last = now
            self._emit(now, loss)

    def _emit(self, now: float, loss) -> None:
        batch = self.batch_size()
        samples = self.steps * batch if batch else None
        record = make_record(run=self.run_id, worker=self.worker, host=self.host, step=self.steps, epoch=0, t=now,
                             loss=_float(loss), samples=samples,
                             samples_per_s=self._rate.add(now, samples) if samples else None,
                             **{"staleness": 0, "phase": "loop", **(self.extra() if self.extra is not None else {})})
        self.records.append(record)
        if self.publish is not None:
            self.publish({"record": record, "batch_size": batch, "epochs": None, "steps": None,
                          "batch": self.steps, "epoch_end": False, "logs": {}, "loop": True,
                          "steps_per_s": self._step_rate.add(now, self.steps)})
