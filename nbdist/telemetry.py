"""Metric records (DESIGN.md section 8) and the engine-side reporter that produces them."""

from __future__ import annotations

import socket
import time

RECORD_FIELDS = (
    "run", "worker", "host", "step", "epoch", "t", "loss", "samples", "samples_per_s",
    "staleness", "gamma", "lr", "phase", "bytes_sent", "comm_s", "compute_s",
)
PS_FIELDS = ("version", "applied", "dropped", "rejected", "momentum", "comp_norm")  # the last two: delay rules


def make_record(**values) -> dict:
    """A metrics record with every schema field present (None where not measured)."""
    unknown = set(values) - set(RECORD_FIELDS) - set(PS_FIELDS)
    if unknown:
        raise ValueError(f"not metric record fields: {sorted(unknown)}")
    return {name: values.get(name) for name in RECORD_FIELDS} | {k: values[k] for k in PS_FIELDS if k in values}


def keras_reporter(run_id: str, worker: int, batch_size: int | None, publish=None,
                   interval_s: float = 0.5, phase: str = "train", extra=None):
    """A Keras callback that records progress at most every `interval_s` and publishes the latest.

    `publish(dict)` sends the latest state to the kernel (ipyparallel's datapub on an
    engine); the full list of records stays in `callback.records` for the result.
    `extra()` returns strategy-measured fields (staleness, bytes_sent, comm_s) for each record.
    `batch_size` may be a function, for a worker whose batch changes during the fit (ASHL).
    """
    import keras

    class Reporter(keras.callbacks.Callback):
        # Batch-end hooks then run on Keras' dispatch thread, so training never waits for us to
        # read the loss; the counters are touched from that one thread only.
        async_safe = True

        def __init__(self):
            super().__init__()
            self.records: list[dict] = []
            self.first_step_t: float | None = None
            self.host = socket.gethostname()
            self._step = 0
            self._samples = 0
            self._epoch = 0
            self._last_t = 0.0
            self._last_samples = 0

        def on_train_begin(self, logs=None):
            self._last_t = time.time()

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.first_step_t is None:
                self.first_step_t = time.time()

        def on_train_batch_end(self, batch, logs=None):
            self._step += 1
            self._samples += (batch_size() if callable(batch_size) else batch_size) or 0
            now = time.time()
            if now - self._last_t >= interval_s:
                self._emit(now, logs, batch + 1)

        def on_epoch_end(self, epoch, logs=None):
            self._emit(time.time(), logs, self.params.get("steps"), epoch_end=True)

        def _emit(self, now, logs, batch_in_epoch, epoch_end=False):
            logs = logs or {}
            elapsed = max(now - self._last_t, 1e-9)
            record = make_record(
                run=run_id, worker=worker, host=self.host, step=self._step, epoch=self._epoch, t=now,
                loss=_float(logs.get("loss")), samples=self._samples if batch_size else None,
                samples_per_s=(self._samples - self._last_samples) / elapsed if batch_size else None,
                **{"staleness": 0, "lr": _learning_rate(self.model), "phase": phase,
                   **(extra() if extra is not None else {})},
            )
            self.records.append(record)
            self._last_t, self._last_samples = now, self._samples
            if publish is not None:
                publish({
                    "record": record,
                    "batch_size": batch_size() if callable(batch_size) else batch_size,
                    "epochs": self.params.get("epochs"),
                    "steps": self.params.get("steps"),
                    "batch": batch_in_epoch,
                    "epoch_end": epoch_end,
                    "logs": {k: _float(v) for k, v in logs.items()},
                })

    return Reporter()


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
