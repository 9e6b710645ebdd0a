"""Metric records (DESIGN.md section 8): one schema for the dashboard, the History, the tables and the sidebar."""

from __future__ import annotations

from collections import deque

RATE_WINDOW_S = 2.0

RECORD_FIELDS = (
    "run", "worker", "host", "step", "epoch", "t", "loss", "samples", "samples_per_s",
    "staleness", "gamma", "lr", "phase", "bytes_sent", "comm_s", "compute_s", "bubble",
)
PS_FIELDS = ("version", "applied", "dropped", "rejected", "momentum", "comp_norm")  # the last two: delay rules


def make_record(**values) -> dict:
    """A metrics record with every schema field present (None where not measured)."""
    unknown = set(values) - set(RECORD_FIELDS) - set(PS_FIELDS)
    if unknown:
        raise ValueError(f"not metric record fields: {sorted(unknown)}")
    return {name: values.get(name) for name in RECORD_FIELDS} | {k: values[k] for k in PS_FIELDS if k in values}


class WindowedRate:
    """Samples per second over the last `window_s` seconds of (time, cumulative samples) points: the one
    throughput estimator of the records, so the dashboard and the progress line show a steady worker as a
    steady rate (a closely spaced epoch-end record no longer makes a jump)."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self.points: deque[tuple[float, float]] = deque()

    def add(self, t: float, samples: float) -> float | None:
        """Take a point; the rate since the oldest point the window keeps (None with one point so far)."""
        self.points.append((t, samples))
        while len(self.points) > 2 and self.points[1][0] <= t - self.window_s:
            self.points.popleft()  # keeps the last point at or before t - window: the rate spans the window
        t0, s0 = self.points[0]
        return (samples - s0) / (t - t0) if t > t0 else None

