"""ASHL's worker side of the PS exchange: push periods, compression and its timed probes.

A worker on a slow link pushes every `period` steps (the mean gradient of the batches in
between, all computed on the same weights: one push of period x batch samples; or, where the
worker steps with the cell's optimizer itself, the update those local steps made), compresses
its pushes when communication dominates its step (reviewed from its own timings), and times
probe round trips of a push's size for the allocation.
"""

from __future__ import annotations

import time

import numpy as np

from ...ps.exchange import PushPull, split

COMPRESSION_REVIEW_STEPS = 20


class PacedExchange(PushPull):
    """`PushPull` plus ASHL's push period, compression and probes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.compressor = None  # a PushCompressor, once training starts
        self.period = 1
        self.commits_local_steps = False  # True: pushes are local updates of `period` steps, not gradients
        self.accumulated = 0
        self._sum: dict[str, np.ndarray] = {}
        self._reviewed_at = 0
        self.after_exchange = None  # called after each exchange, in the thread that exchanges
        self.steps_per_epoch = 0
        self.shapes: dict[str, tuple] = {}  # name -> (shape, dtype), for probes
        self.held = None  # batches dealt and not yet trained (--data dynamic): holding none, a worker pushes

    def out_of_batches(self) -> bool:
        """Holds no dealt batch: what it trained goes now (the next batch comes with the answer, or the
        epoch is spent), whatever its period."""
        return self.held is not None and self.held() == 0

    def push(self, *gradients, steps: int = 1) -> list[np.ndarray]:
        if self.commits_local_steps or (self.period <= 1 and not self.accumulated):
            return super().push(*gradients, steps=steps)
        self.steps += 1
        self._accumulate(dict(zip(self.names, gradients)))
        if self.accumulated < self.period and not self.out_of_batches():  # a local step: no exchange
            if self.virtual is not None:
                self.virtual.local_steps(1)
            else:
                self.time_local_step()
            return self.current
        if self.virtual is None:
            real = self.timer.compute_ended()
            slept = self.slowdown.stretch(self.timer.typical_compute_s())
            self.timer.exchange_started(None if real is None else real + slept)
        return self._send(self._take_accumulated())

    def time_local_step(self) -> None:
        """A step that pushes nothing, on the real clock: timed as compute and stretched as simulated (the
        virtual clock charges such steps with the push that follows them)."""
        self.timer.compute_ended()
        self.slowdown.stretch(self.timer.typical_compute_s())
        self.timer.local_step_ended()

    def flush(self) -> None:
        """Push what is still accumulated (the end of a fit), so no computed gradient is lost."""
        if self.accumulated:
            if self.virtual is None:
                self.timer.exchange_started(None)
            self._send(self._take_accumulated(), compute_steps=0)  # its steps were counted as they happened

    def exchange(self, grads: dict, fields: dict, compute_steps: int = 1) -> list[np.ndarray]:
        if self.compressor is not None:
            grads, fields = self._compress(grads, fields)
        weights = super().exchange(grads, fields, compute_steps)
        if self.after_exchange is not None:
            self.after_exchange()
        return weights

    def _send(self, pair, compute_steps: int = 1) -> list[np.ndarray]:
        grads, batches = pair
        fields = {"step": self.steps, "batch": self.batch_size * batches if self.batch_size else None,
                  **self.dealer_fields()}
        return self.exchange(grads, fields, compute_steps)

    def _accumulate(self, grads: dict) -> None:
        if self.accumulated == 0:
            self._sum = {n: np.array(g, dtype=np.float64) for n, g in grads.items()}
        else:
            for n, g in grads.items():
                self._sum[n] += g
        self.accumulated += 1

    def _take_accumulated(self) -> tuple[dict, int]:
        """The mean gradient of the accumulated batches (all computed on the same weights), and their count."""
        count, self.accumulated = self.accumulated, 0
        return {n: (g / count).astype(np.float32) for n, g in self._sum.items()}, count

    def _compress(self, grads: dict, fields: dict) -> tuple[dict, dict]:
        """Encode under this worker's compression mode, reviewed every few steps from its own timings."""
        compressor, timer = self.compressor, self.timer
        if self.steps - self._reviewed_at >= COMPRESSION_REVIEW_STEPS and timer.compute_s is not None \
                and timer.comm_s is not None:
            self._reviewed_at = self.steps
            changed = compressor.review(timer.comm_s, timer.compute_s * self.period,
                                        self.steps / max(self.steps_per_epoch, 1))
            if changed:
                fields = {**fields, "compression_reason": changed}
        return compressor.encode(grads), {**fields, "compression": compressor.mode}

    def probe(self) -> tuple[float, int]:
        """One timed round trip of a push's size that changes nothing (profiling): (seconds, bytes)."""
        zeros = {name: np.zeros(shape, dtype) for name, (shape, dtype) in self.shapes.items()}
        moved = self.client.bytes_sent + self.client.bytes_received
        started = time.perf_counter()
        self.client.request("probe", split(zeros, self.shard_of, len(self.plan)))
        self.slowdown.charge(self.client.bytes_sent + self.client.bytes_received - moved)
        return time.perf_counter() - started, self.client.bytes_sent + self.client.bytes_received - moved

    def waited(self) -> None:
        """The worker waited (for its allocation): that was not compute."""
        self.timer.local_step_ended()
