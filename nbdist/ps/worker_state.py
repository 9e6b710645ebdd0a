"""What a shard knows of each worker: its pushes, when it was last heard from, and whether it still trains."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerState:
    pushed: int = 0
    last_seen: float | None = None  # None until its first message: importing TensorFlow is not death
    alive: bool = True
    done: bool = False
    evicted: bool = False
    died_at: float | None = None
    first_epoch: int = 0  # a newcomer's first epoch: the epoch barriers before it do not wait for it
    flat: bool = False  # its weights requests ask for flat buffers (`FlatLayout`), not a buffer per variable
    pulled: bool = False  # it began the run's current fit (pulled since the last fit ended)
