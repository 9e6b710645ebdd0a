"""Batches on demand (DESIGN.md section 11): one order of the samples per epoch, dealt to whichever worker asks.

Every process that needs an epoch's order computes it from the run's seed (`epoch_order`), so a hand-out
is only a range of positions in it: (epoch, start, count). Two dealers use it:

- `Dispatcher`, for the asynchronous strategies (it lives on parameter-server shard 0): each worker asks
  for batches of its own size; a fast worker asks more often, so it trains more; a dead worker's batches
  not yet applied go back to the queue; an epoch is spent when every position was dealt and every dealt
  batch was applied, so each sample is trained once per epoch.
- `SyncSchedule`, for synchronous steps (`hfdt`): step after step the next `size * batch` positions, rank k
  its slice; after a membership change the rest of the epoch is split over the new size.

Pure bookkeeping, no I/O: the shard and the workers call it.
"""

from __future__ import annotations

from collections import deque

import numpy as np


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The positions of the `n` samples in `epoch`'s order: a permutation from (seed, epoch), or 0..n-1."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


class Dispatcher:
    """Deals one epoch's order, a batch at a time, to whichever worker asks (see the module docstring)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError("nothing to deal: the training data has no samples")
        self.n = n
        self.epoch: int | None = None  # the epoch being dealt
        self.next = 0  # the next position never dealt in this epoch
        self.requeued: deque[tuple[int, int]] = deque()  # (start, count) of lost workers, dealt first
        self.outstanding: dict[int, deque[tuple[int, int]]] = {}  # worker -> dealt, not yet applied
        self.trained: dict[int, int] = {}  # worker -> samples of this epoch applied
        self.log: list[tuple[int, int, int, int]] = []  # (epoch, worker, start, count) of every deal

    def open(self, epoch: int) -> None:
        """Start dealing `epoch` (what was outstanding from an earlier one is forgotten)."""
        self.epoch, self.next = epoch, 0
        self.requeued.clear()
        self.outstanding.clear()
        self.trained.clear()

    def deal(self, worker: int, size: int) -> tuple[int, int, int] | None:
        """The next batch of at most `size` samples for `worker`, (epoch, start, count); None when nothing is
        left to deal (what is outstanding may still come back)."""
        if self.epoch is None or size < 1:
            return None
        if self.requeued:
            start, count = self.requeued.popleft()
            if count > size:
                self.requeued.appendleft((start + size, count - size))
                count = size
        elif self.next < self.n:
            start, count = self.next, min(size, self.n - self.next)
            self.next += count
        else:
            return None
        self.outstanding.setdefault(worker, deque()).append((start, count))
        self.log.append((self.epoch, worker, start, count))
        return self.epoch, start, count

    def applied(self, worker: int) -> tuple[int, int] | None:
        """`worker`'s oldest outstanding batch was trained (its push applied, or dropped by the rule); which one
        (start, count), None when it held none."""
        queue = self.outstanding.get(worker)
        if not queue:
            return None
        start, count = queue.popleft()
        self.trained[worker] = self.trained.get(worker, 0) + count
        return start, count

    def lost(self, worker: int) -> int:
        """`worker` died: its outstanding batches go back to the front of the queue; how many samples."""
        queue = self.outstanding.pop(worker, deque())
        self.requeued.extendleft(reversed(queue))
        return sum(count for _, count in queue)

    def spent(self) -> bool:
        """Every sample of the epoch was dealt and applied."""
        return (self.epoch is not None and self.next >= self.n and not self.requeued
                and not any(self.outstanding.values()))

    def holds(self, worker: int) -> int:
        """How many batches `worker` has been dealt and not yet pushed."""
        return len(self.outstanding.get(worker, ()))


class SyncSchedule:
    """Synchronous steps over one epoch's order: each step the next `size * batch` positions, rank k its slice.

    Every rank keeps its own copy and makes the same calls, so all agree without talking. `mark()` at the
    start of a unit of steps and `rewind()` when that unit is run again after a failed collective keep a
    failed step's samples for the step that replaces it."""

    def __init__(self, n: int, batch: int, seed: int, shuffle: bool = True):
        self.n, self.batch, self.seed, self.shuffle = n, batch, seed, shuffle
        self.epoch: int | None = None
        self.position = 0
        self.order: np.ndarray | None = None
        self._mark = 0

    def open(self, epoch: int) -> None:
        self.epoch, self.position, self._mark = epoch, 0, 0
        self.order = epoch_order(self.n, self.seed, epoch, self.shuffle)

    def step(self, rank: int, size: int) -> np.ndarray | None:
        """This rank's sample indices for the next step, None once the epoch is spent. The last step takes
        what is left, split as evenly as the ranks allow; fewer samples than ranks are left untrained (at
        most size - 1 an epoch, as with strided shards)."""
        left = self.n - self.position
        if left < size:
            return None
        take = min(left, size * self.batch)
        bounds = np.linspace(0, take, size + 1).round().astype(int)
        start = self.position
        self.position += take
        return self.order[start + bounds[rank]:start + bounds[rank + 1]]

    def steps_left(self, size: int) -> int:
        left = self.n - self.position
        return 0 if left < size else -(-left // (size * self.batch))

    def mark(self) -> None:
        self._mark = self.position

    def rewind(self) -> None:
        self.position = self._mark
