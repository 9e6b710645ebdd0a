"""Gradient compression for PS pushes: fp16, and top-k with error feedback, and when to use which.

Top-k keeps the k largest-magnitude entries of (gradient + residual) and carries the rest
into the next step's residual, so nothing is lost: over any number of steps,
sum(sent) + residual == sum(gradients) (error feedback, Stich et al. 2018).
"""

from __future__ import annotations

import numpy as np

ON_ABOVE = 0.30  # comm / (comm + compute) above which a worker compresses
OFF_BELOW = 0.15  # ... and below which it stops (hysteresis)
HEAVY_ABOVE = 0.60  # above this, fp16 is not enough: top-k
FIRST_EPOCHS = 2  # never compress before this many epochs are done
MIN_DENSITY = 0.001


def to_fp16(g: np.ndarray) -> np.ndarray:
    """Half precision for the wire (values beyond fp16's range saturate instead of becoming inf)."""
    limit = np.finfo(np.float16).max
    return np.clip(g, -limit, limit).astype(np.float16)


def from_fp16(h: np.ndarray, dtype=np.float32) -> np.ndarray:
    return h.astype(dtype)


class TopK:
    """Top-k sparsification with error feedback for one variable of one worker."""

    def __init__(self, shape, density: float, dtype=np.float32):
        if not MIN_DENSITY <= density <= 1:
            raise ValueError(f"top-k density must be in [{MIN_DENSITY}, 1]. Received: {density}")
        self.residual = np.zeros(shape, dtype)
        self.density = density

    def compress(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat indices, values) to send; what is not sent stays in the residual."""
        acc = (self.residual + g).reshape(-1)
        k = max(1, int(round(self.density * acc.size)))
        indices = np.argpartition(np.abs(acc), acc.size - k)[acc.size - k:] if k < acc.size else np.arange(acc.size)
        indices = np.sort(indices).astype(np.int64)
        values = acc[indices].copy()
        acc[indices] = 0
        self.residual = acc.reshape(self.residual.shape)
        return indices, values

    @staticmethod
    def decompress(indices: np.ndarray, values: np.ndarray, shape, dtype=np.float32) -> np.ndarray:
        dense = np.zeros(int(np.prod(shape)), dtype)
        dense[indices] = values
        return dense.reshape(shape)


class CompressionPolicy:
    """Per worker: none / fp16 / topk from its share of time spent communicating, with hysteresis."""

    def __init__(self):
        self.mode = "none"

    def decide(self, comm_s: float, compute_s: float, epoch: float) -> tuple[str, str]:
        """(mode, reason) for the next exchanges."""
        share = comm_s / max(comm_s + compute_s, 1e-12)
        if epoch < FIRST_EPOCHS:
            self.mode = "none"
            return self.mode, f"epoch {epoch:.1f} < {FIRST_EPOCHS}: never compress this early"
        if self.mode == "none" and share > ON_ABOVE or self.mode != "none" and share >= OFF_BELOW:
            self.mode = "topk" if share > HEAVY_ABOVE else "fp16"
            return self.mode, f"communication is {share:.0%} of step time"
        self.mode = "none"
        return self.mode, f"communication is {share:.0%} of step time (< {ON_ABOVE:.0%} to start, " \
                          f"< {OFF_BELOW:.0%} to stop)"
