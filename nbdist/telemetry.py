"""Metric records (DESIGN.md section 8): one schema for the dashboard, the History, the tables and the sidebar."""

from __future__ import annotations

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


def keras_reporter(run_id, worker: int, batch_size, publish=None, interval_s: float = 0.5, phase: str = "train",
                   extra=None, clock=None):
    """The engine-side Keras callback that produces these records (`nbdist.reporter.ProgressReporter`)."""
    from .reporter import ProgressReporter  # imports Keras: engines only

    return ProgressReporter(run_id, worker, batch_size, publish, interval_s, phase, extra, clock)
