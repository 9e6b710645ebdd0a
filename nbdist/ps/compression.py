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
HEAVY_BELOW = 0.45  # ... until the share falls below this (hysteresis between fp16 and top-k too)
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
            heavy = share > HEAVY_ABOVE or self.mode == "topk" and share >= HEAVY_BELOW
            self.mode = "topk" if heavy else "fp16"
            return self.mode, f"communication is {share:.0%} of step time"
        self.mode = "none"
        return self.mode, f"communication is {share:.0%} of step time (< {ON_ABOVE:.0%} to start, " \
                          f"< {OFF_BELOW:.0%} to stop)"


TOPK_DENSITY = 0.01  # heavy pressure: 1% of each gradient's entries per push, the rest carried over
MODES = ("none", "fp16", "topk")


class PushCompressor:
    """One worker's compression of its PS pushes: the mode the policy chose, and top-k's residuals.

    Leaving top-k sends the residual with the next gradient, so what was held back is not lost.
    """

    def __init__(self, density: float = TOPK_DENSITY):
        self.policy = CompressionPolicy()
        self.density = density
        self.topk: dict[str, TopK] = {}

    @property
    def mode(self) -> str:
        return self.policy.mode

    def review(self, comm_s: float, compute_s: float, epoch: float) -> str | None:
        """Let the policy decide from this worker's step times; the reason when the mode changed."""
        before = self.policy.mode
        mode, reason = self.policy.decide(comm_s, compute_s, epoch)
        return f"{before} -> {mode}: {reason}" if mode != before else None

    def encode(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays to push for these gradients under the current mode (see `decode_push`)."""
        if self.mode != "topk" and self.topk:  # flush what top-k held back
            grads = {n: g + self.topk[n].residual if n in self.topk else g for n, g in grads.items()}
            self.topk = {}
        if self.mode == "fp16":
            return {n: to_fp16(g) for n, g in grads.items()}
        if self.mode == "topk":
            out = {}
            for name, g in grads.items():
                coder = self.topk.setdefault(name, TopK(g.shape, self.density, g.dtype))
                out[f"{name}|idx"], out[f"{name}|val"] = coder.compress(g)
            return out
        return grads


def decode_push(arrays: dict[str, np.ndarray], mode: str, expected: dict[str, tuple[tuple, str]]) -> dict:
    """Dense gradients from a compressed push; ValueError names what does not fit `expected`
    ({name: (shape, dtype)}). Uncompressed pushes pass through (the shard checks them as before)."""
    if mode in (None, "none"):
        return arrays
    if mode == "fp16":
        if set(arrays) != set(expected):
            raise ValueError(f"expected arrays {sorted(expected)}, got {sorted(arrays)}")
        for name, array in arrays.items():
            if array.dtype != np.float16 or tuple(array.shape) != tuple(expected[name][0]):
                raise ValueError(f"{name}: an fp16 push needs float16 {tuple(expected[name][0])}, "
                                 f"got {array.dtype.name} {tuple(array.shape)}")
        return {name: from_fp16(array, expected[name][1]) for name, array in arrays.items()}
    if mode == "topk":
        wanted = {f"{n}|{part}" for n in expected for part in ("idx", "val")}
        if set(arrays) != wanted:
            raise ValueError(f"a top-k push needs NAME|idx and NAME|val for {sorted(expected)}")
        dense = {}
        for name, (shape, dtype) in expected.items():
            idx, val = arrays[f"{name}|idx"], arrays[f"{name}|val"]
            size = int(np.prod(shape))
            if idx.dtype != np.int64 or idx.ndim != 1 or idx.shape != val.shape or val.dtype.name != dtype:
                raise ValueError(f"{name}: top-k needs int64 indices and {dtype} values of one length")
            if idx.size and (idx.min() < 0 or idx.max() >= size):
                raise ValueError(f"{name}: top-k index outside 0..{size - 1}")
            dense[name] = TopK.decompress(idx, val, shape, dtype)
        return dense
    raise ValueError(f"unknown compression {mode!r}; one of {MODES}")
