"""Release policies on the virtual clock (DESIGN.md section 7): pushes applied in virtual-time order.

Every push says when it reaches the PS on its worker's virtual clock (`vt`) and the least time
from its reply to that worker's next push (`gap`). A push is applied only when no live worker
can still deliver an earlier one (conservative discrete-event ordering, as in a parallel
discrete-event simulator): every other live worker either has a push waiting that comes later
(ties broken by rank), or cannot reach the PS before it (its last reply's time plus its gap is
later), or waits at the epoch's end. Replies carry the virtual instant they leave the PS. A
worker that has not pushed once within `LIMITS.start_barrier_s` real seconds of the first push is
reported and no longer waited for.
"""

from __future__ import annotations

import time

from ..limits import LIMITS
from .release import BoundedStaleness, Immediate, ReleasePolicy, SynchronousRounds


class WorkerTimes:
    """What a shard knows of its workers' virtual clocks."""

    def __init__(self):
        self.answered: dict[int, float] = {}  # worker -> virtual time its last reply left
        self.gap: dict[int, float] = {}  # worker -> least seconds from a reply to its next arrival
        self.now = 0.0  # the virtual instant of the last update applied
        self.first_push: float | None = None  # real time of the first push (the latecomer clock)
        self.latecomers: set[int] = set()

    def note(self, worker: int, message) -> None:
        self.gap[worker] = float(message.header["gap"])
        if self.first_push is None:
            self.first_push = time.time()

    def earliest_possible(self, worker: int) -> float | None:
        """The earliest virtual time `worker` could still deliver a push; None: not known yet."""
        if worker not in self.gap:
            return None
        return self.answered.get(worker, 0.0) + self.gap[worker]

    def may_come_before(self, shard, worker: int, t: float, rank: int) -> bool:
        """Whether `worker` (no push waiting) could still deliver one before (t, rank)."""
        if shard.at_epoch_end(worker) or worker in self.latecomers or shard.awaiting_batch(worker):
            return False  # at an epoch's end (or waiting for a batch): its next push follows, after every pending one
        elsewhere = _waiting_elsewhere(shard, worker)
        if elsewhere is not None and (elsewhere > t or (elsewhere == t and worker > rank)):
            return False  # its push waiting at another optimizer's table comes first (a GAN's steps are in order)
        earliest = self.earliest_possible(worker)
        if earliest is None:
            if self.first_push is not None and time.time() - self.first_push > LIMITS.start_barrier_s:
                self.latecomers.add(worker)
                shard.record("latecomer", worker=worker,
                             reason=f"no push within {LIMITS.start_barrier_s:.0f} s of the first; not waited for")
                return False
            return True
        return earliest < t or (earliest == t and worker < rank)


def _waiting_elsewhere(shard, worker: int) -> float | None:
    """The virtual time of `worker`'s push waiting at another table of the shard process, if any."""
    times = [m.header["vt"] for table in shard.tables.values() if table is not shard
             for _, m in table.waiting if m.kind == "push" and m.header.get("worker") == worker]
    return min(times, default=None)


def _waiting_pushes(shard) -> list[tuple[float, int, bytes, object]]:
    return [(m.header["vt"], m.header["worker"], ident, m) for ident, m in shard.waiting if m.kind == "push"]


class VirtualOrder(BoundedStaleness):
    """Asynchronous pushes applied in virtual-time order, with an optional staleness bound (None: none)."""

    name = "virtual_order"

    def __init__(self, bound: int | None = None):
        super().__init__(bound)
        self.times = WorkerTimes()
        self.unblocked: dict[int, float] = {}  # worker -> virtual time its bound-held push became applicable

    def note_push(self, shard, worker: int, message) -> None:
        self.times.note(worker, message)

    def waits_on_time(self) -> bool:
        return self.times.first_push is not None and len(self.times.latecomers) == 0

    def barrier_released(self, shard, workers, vt) -> None:
        for worker in workers:
            self.times.answered[worker] = max(self.times.answered.get(worker, 0.0), vt)

    def _blocked(self, shard, worker: int) -> bool:
        if self.bound is None:
            return False
        others = [shard.workers[k].pushed for k in shard.pushing() if k != worker]
        return bool(others) and shard.workers[worker].pushed + 1 - min(others) > max(self.bound, 1)

    def _effective(self, shard, vt: float, worker: int) -> float | None:
        """When the push may take effect: its arrival, or when the bound let it go; None while held."""
        if self._blocked(shard, worker):
            self.unblocked.pop(worker, None)
            return None
        if worker not in self.unblocked:
            self.unblocked[worker] = max(vt, self.times.now)
        return max(vt, self.unblocked[worker])

    def try_push(self, shard, ident, worker, message):
        candidates = []
        for vt, k, _, _ in _waiting_pushes(shard):
            effective = self._effective(shard, vt, k)
            if effective is not None:
                candidates.append((effective, k))
        if not candidates or min(candidates) != (self._effective(shard, message.header["vt"], worker), worker):
            return None
        t = min(candidates)[0]
        waiting = {k for _, k, _, _ in _waiting_pushes(shard)}
        if any(self.times.may_come_before(shard, j, t, worker) for j in shard.live() if j != worker and j not in waiting):
            return None
        self.unblocked.pop(worker, None)
        self.times.now = max(self.times.now, t)
        replies = shard.apply_push(ident, worker, message, t=t, vt=t)
        self.times.answered[worker] = t
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
                self.times.answered[worker] = self.times.now  # released by the event that let it go
                replies.append(shard.weights_reply(ident, worker, vt=self.times.now))
        return replies

    def reply_time(self) -> float:
        return self.times.now

    def describe(self) -> dict:
        return {"policy": self.name, "max_staleness": self.bound}


class VirtualRounds(SynchronousRounds):
    """Synchronous rounds on the virtual clock: a round completes at the latest arrival of its pacing workers'
    pushes, once they are in and no other worker's push could still arrive by then; one that arrives later
    waits for the round it reaches."""

    name = "virtual_rounds"

    def __init__(self):
        super().__init__()
        self.times = WorkerTimes()
        self.vts: dict[int, float] = {}  # this round's pushes' arrival times

    def note_push(self, shard, worker: int, message) -> None:
        self.times.note(worker, message)

    def barrier_released(self, shard, workers, vt) -> None:
        for worker in workers:
            self.times.answered[worker] = max(self.times.answered.get(worker, 0.0), vt)

    def complete_round(self, shard, vt=None) -> list:
        if not self.round or any(k not in self.round for k in shard.pacers()):
            return []
        round_time = max(self.vts.values())
        waiting = {w: t for t, w, _, _ in _waiting_pushes(shard)}
        for j in (j for j in shard.live() if j not in self.round):
            # a worker outside the pace (a longer push period) joins this round if its push arrives by the
            # round's time: it is waiting (and joins next), or may still come
            if (waiting[j] <= round_time) if j in waiting else \
                    self.times.may_come_before(shard, j, round_time, len(shard.workers)):
                return []
        self.times.now = max(self.times.now, round_time)
        for worker in self.round:
            self.times.answered[worker] = round_time
        self.vts = {}
        return super().complete_round(shard, vt=round_time)

    def try_push(self, shard, ident, worker, message):
        if worker in self.round or not self._joins(shard, worker, message.header["vt"]):
            return None
        self.vts[worker] = message.header["vt"]
        return super().try_push(shard, ident, worker, message)

    def _joins(self, shard, worker: int, vt: float) -> bool:
        """A pacing worker's push joins the round; another's once the pace's pushes are in and it arrives by
        the latest of them (a push that arrives later, in virtual time, is the next round's)."""
        pacers = shard.pacers()
        if not pacers or worker in pacers:
            return True
        pace = [self.vts[k] for k in pacers if k in self.round]
        return len(pace) == len(pacers) and vt <= max(pace)

    def reply_time(self) -> float:
        return self.times.now


def virtual_policy(max_staleness: int | None, synchronous: bool) -> ReleasePolicy:
    """The virtual-clock policy a shard's settings name."""
    return VirtualRounds() if synchronous else VirtualOrder(max_staleness)


def policy_for(max_staleness: int | None, synchronous: bool, clock: str = "real",
               start_barrier: bool = False) -> ReleasePolicy:
    """The policy a shard's settings name (`clock="virtual"`: this module's, whose order is a start barrier of
    its own). The strategies ask for the start barrier; a bare shard has none."""
    if clock == "virtual":
        return virtual_policy(max_staleness, synchronous)
    if synchronous:
        return SynchronousRounds()
    if max_staleness is None:
        return Immediate(start_barrier)
    return BoundedStaleness(max_staleness, start_barrier)
