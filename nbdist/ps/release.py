"""When a shard applies a push and releases its reply: one small interface, one class per policy.

`try_push` is offered a push each time the shard's state changes until it takes it; it
returns the replies to send now ([] when the push was applied but its reply is held), or
None to keep the push waiting. `release_held` answers held replies whose condition now
holds. The shard (`nbdist.ps.shard.Shard`) applies updates, logs and replies; a policy only
decides when.

- `Immediate`: every push at once (asynchronous SGD).
- `BoundedStaleness(s)`: a push is applied when, counted with it, its worker's pushed steps
  lead the slowest live worker's by at most max(s, 1); with s = 0 the reply is also held
  until every live worker has pushed as many steps (lock-step).
- `SynchronousRounds`: one batch-weighted mean gradient per round of every pacing worker.
"""

from __future__ import annotations

import time

import numpy as np

from ..limits import LIMITS


class ReleasePolicy:
    """Apply every push at once, after the start barrier; see the module docstring for the contract.

    The start barrier (every asynchronous policy): no push is applied before every live worker has
    pushed once (traced and run its train step), so the order in which engines finish tracing cannot
    make first gradients hundreds of versions stale. A worker that has not pushed within
    `LIMITS.start_barrier_s` of the first push is reported (event `latecomer`) and not waited for.
    """

    name = "immediate"

    def __init__(self, start_barrier: bool = True):
        self.started: set[int] = set()
        self.first_push: float | None = None
        self.barrier_open = not start_barrier

    def note_push(self, shard, worker: int, message) -> None:
        """A push arrived (before any decision on it)."""
        self.started.add(worker)
        if self.first_push is None:
            self.first_push = time.time()

    def start_barrier_holds(self, shard) -> bool:
        if self.barrier_open:
            return False
        missing = [k for k in shard.live() if k not in self.started]
        if missing and time.time() - self.first_push <= LIMITS.start_barrier_s:
            return True
        for worker in missing:
            shard.record("latecomer", worker=worker,
                         reason=f"no push within {LIMITS.start_barrier_s:.0f} s of the first; not waited for")
        self.barrier_open = True
        return False

    def waits_on_time(self) -> bool:
        """Whether only the passing of time can release what is held (the start barrier's deadline)."""
        return not self.barrier_open and self.first_push is not None

    def try_push(self, shard, ident: bytes, worker: int, message) -> list | None:
        if self.start_barrier_holds(shard):
            return None
        return shard.apply_push(ident, worker, message)

    def release_held(self, shard) -> list:
        return []

    def complete_round(self, shard) -> list:
        """Replies of a round that can now complete (synchronous policies); [] for the others."""
        return []

    def barrier_released(self, shard, workers, vt) -> None:
        """Workers left an epoch's end barrier (at virtual time `vt` on the virtual clock)."""

    def describe(self) -> dict:
        return {"policy": self.name}


Immediate = ReleasePolicy


class BoundedStaleness(ReleasePolicy):
    """Stale-synchronous parallel with bound `bound` (0: lock-step; None, set live: unbounded again)."""

    name = "bounded_staleness"

    def __init__(self, bound: int | None, start_barrier: bool = True):
        super().__init__(start_barrier)
        self.bound = bound
        self.held: list[tuple[bytes, int, int]] = []  # (ident, worker, pushed) whose reply waits (bound 0)

    def try_push(self, shard, ident, worker, message):
        if self.start_barrier_holds(shard):
            return None
        if self.bound is None:
            return shard.apply_push(ident, worker, message)
        pushed = shard.workers[worker].pushed
        others = [shard.workers[k].pushed for k in shard.pushing() if k != worker]
        if others and pushed + 1 - min(others) > max(self.bound, 1):
            return None
        replies = shard.apply_push(ident, worker, message)
        slowest = shard.slowest()
        if self.bound == 0 and slowest is not None and shard.workers[worker].pushed > slowest:
            self.held.append((ident, worker, shard.workers[worker].pushed))
            return []
        return replies

    def release_held(self, shard) -> list:
        replies = []
        for held in list(self.held):
            ident, worker, pushed = held
            slowest = shard.slowest()
            if slowest is None or pushed <= slowest or not shard.workers[worker].alive:
                self.held.remove(held)
                replies.append(shard.weights_reply(ident, worker))
        return replies

    def describe(self) -> dict:
        return {"policy": self.name, "max_staleness": self.bound}


class SynchronousRounds(ReleasePolicy):
    """Synchronous SGD: the round waits for one push from every pacing worker, applies their mean
    (weighted by each push's batch) once, and answers all of them."""

    name = "synchronous"

    def __init__(self):
        super().__init__()
        self.barrier_open = True  # a round waits for every worker anyway
        self.round: dict[int, tuple] = {}  # worker -> (ident, step, gradients, batch)
        self.arrived: dict[int, float] = {}  # ... and when each push arrived (its wait is not communication)

    def try_push(self, shard, ident, worker, message):
        if worker in self.round:
            return None  # a worker that pushes more often than the round's pace waits for the next round
        trained = shard.count_push(worker, message.header.get("taken"), deal=False)
        self.round[worker] = (ident, message.header.get("step"), message.arrays, message.header.get("batch") or 1,
                              trained)
        self.arrived[worker] = time.time()
        return self.complete_round(shard)

    def complete_round(self, shard, vt: float | None = None) -> list:
        if not self.round or any(k not in self.round for k in shard.pacers()):
            return []
        entries, self.round = dict(sorted(self.round.items())), {}  # by rank: the same sum and log every run
        total = shard.round_total([batch for _, _, _, batch, _ in entries.values()])
        mean = {key: sum(grads[key].astype(np.float64) * (batch / total) for _, _, grads, batch, _ in entries.values())
                .astype(shard.flat[key].dtype) for key in shard.flat}
        info = shard.update(mean, -1, 0)
        replies, now = [], time.time()
        clock = {} if vt is None else {"vt": vt}
        for worker, (ident, step, _, _, trained) in entries.items():
            shard.deal_next(worker)
            shard.log_push(worker, step, 0, info, t=vt, batch=trained)
            shard.counts["acked"] += 1
            held_s = round(now - self.arrived.pop(worker, now), 6)
            if shard.workers[worker].alive:
                replies.append(shard.weights_reply(ident, worker, staleness=0, held_s=held_s, **clock))
        return replies
