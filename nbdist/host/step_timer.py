"""How long a worker's steps compute and exchange: one timer, one meaning of `compute_s` and `comm_s`.

- `compute_s`: moving average of a step's computation, from the end of one exchange to the
  start of the next, simulated slowness included; the first steps (tracing) and pauses
  (validation, an epoch's end) are left out.
- `comm_s`: moving average of an exchange's seconds, simulated link time included, minus what
  the PS held the reply for (waiting for a synchronous round is not communication).
- `comm_total_s`: all exchange seconds so far (same rule).
- `typical_compute_s()`: the median of the last few real computations: what a simulated slow
  worker stretches (a one-off pause between two steps is not stretched too).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

EMA_WEIGHT = 0.1
WARMUP_STEPS = 3
PAUSE_FACTOR = 5.0
WINDOW = 9


def ema(average: float | None, value: float, weight: float = EMA_WEIGHT) -> float:
    return value if average is None else (1 - weight) * average + weight * value


class StepTimer:
    """Times one worker's steps; call the methods in step order from the thread that exchanges."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.compute_s: float | None = None
        self.comm_s: float | None = None
        self.comm_total_s = 0.0
        self.timed_steps = 0
        self._recent: deque[float] = deque(maxlen=WINDOW)
        self._compute_started: float | None = None
        self._exchange_started: float | None = None

    def compute_ended(self) -> float | None:
        """The step's computation is over: its real seconds (None before the first exchange)."""
        if self._compute_started is None:
            return None
        real = self.clock() - self._compute_started
        self._recent.append(real)
        return real

    def typical_compute_s(self) -> float | None:
        return statistics.median(self._recent) if self._recent else None

    def exchange_started(self, compute_s: float | None) -> None:
        """An exchange begins after a computation of `compute_s` seconds (real plus simulated)."""
        self._exchange_started = self.clock()
        if compute_s is None:
            return
        self.timed_steps += 1
        if self.timed_steps <= WARMUP_STEPS:  # tracing and first batches are not the step's cost
            return
        if self.compute_s is not None and compute_s > PAUSE_FACTOR * self.compute_s:
            return  # validation or an epoch's end between two steps: a pause, not compute
        self.compute_s = ema(self.compute_s, compute_s)

    def exchange_ended(self, held_s: float = 0.0) -> None:
        """The exchange is over; `held_s` of it the PS spent holding the reply."""
        now = self.clock()
        if self._exchange_started is not None:
            seconds = max(now - self._exchange_started - held_s, 0.0)
            self.comm_total_s += seconds
            self.comm_s = ema(self.comm_s, seconds)
        self._exchange_started, self._compute_started = None, now

    def local_step_ended(self) -> None:
        """A step that ended without an exchange (a push period): the next computation starts now."""
        self._compute_started = self.clock()

    def restart(self) -> None:
        """Measure compute afresh (a new batch size)."""
        self.compute_s, self.timed_steps = None, 0
        self._recent.clear()
