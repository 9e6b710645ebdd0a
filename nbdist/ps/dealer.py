"""Shard 0's dealer of batches (`--data dynamic`, DESIGN.md section 11): the parameter server hands out the
positions each worker trains on next, so a fast worker takes more and a dead worker's batches are trained
by the others.

A worker asks for an epoch's first batches with a held ``batch`` message; the epoch opens once every live
worker that trains it has asked, and each gets its first ones in rank order (the same on every run). After
that every answer to one of its pushes brings its next batch (`deliver`), up to `depth` held at once (two
when its exchange overlaps the next step; ASHL's local steps between commits, whose push trains them all). A worker with none left asks again: it gets one that came back
from a dead worker, or is told the epoch is spent once every batch was applied. While it waits, no round,
staleness bound or virtual-time order waits for it (`awaiting`).
"""

from __future__ import annotations

from ..datasets.batches import Dispatcher
from . import wire


class Dealer:
    """The batches of shard 0's run; see the module docstring."""

    def __init__(self, config: dict):
        self.seed = int(config.get("seed") or 0)
        self.dispatcher: Dispatcher | None = None
        self.asked: dict[int, dict] = {}  # worker -> the header of its held batch request
        self.depth: dict[int, int] = {}  # worker -> how many undelivered-or-untrained batches it may hold
        self.size: dict[int, int] = {}  # worker -> its batch size
        self.undelivered: dict[int, list] = {}  # worker -> deals not yet sent to it
        self.counts: dict[int, dict[int, list[int]]] = {}  # epoch -> worker -> [batches, samples] dealt

    # -- requests ----------------------------------------------------------------------------
    def note(self, worker: int, header: dict) -> None:
        """A held ``batch`` request: checked, remembered until `answer` can answer it."""
        epoch, size, n, depth = (header.get(k) for k in ("epoch", "size", "n", "depth"))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (epoch, size, n, depth)) or \
                min(size, n, depth) < 1 or epoch < 0:
            raise wire.Rejected("malformed", "a batch request names its epoch, batch size, samples and depth")
        if self.dispatcher is None:
            self.dispatcher = Dispatcher(n)
        elif n != self.dispatcher.n:
            raise wire.Rejected("malformed", f"worker {worker} trains on {n} samples, the run's first worker on "
                                             f"{self.dispatcher.n}: every engine must hold the same data")
        self.asked[worker] = header
        self.size[worker], self.depth[worker] = size, depth

    def answer(self, shard, worker: int) -> dict | None:
        """The reply fields of `worker`'s held request, or None while it must wait."""
        epoch, dispatcher = self.asked[worker]["epoch"], self.dispatcher
        if shard.finishing:  # a graceful stop (or ASHL's laggards): every fit ends after its current batch
            del self.asked[worker]
            return {"batches": [], "spent": True, "stop": True}
        if dispatcher.epoch is None or epoch > dispatcher.epoch:
            if not self._open(shard, epoch):
                return None
        elif epoch < dispatcher.epoch or (dispatcher.spent() and not self.undelivered.get(worker)):
            del self.asked[worker]
            return {"batches": [], "spent": True}
        if not self.undelivered.get(worker):
            self.top_up(worker)
        if not self.undelivered.get(worker):
            if dispatcher.holds(worker):  # it still has batches to push: their answers deal it more
                del self.asked[worker]
                return {"batches": []}
            return None  # what is left is outstanding elsewhere: it may come back, or be applied
        del self.asked[worker]
        return self.deliver(worker)

    def _open(self, shard, epoch: int) -> bool:
        """Open `epoch` once every live worker that trains it has asked for it; its first batches, rank by rank."""
        needed = [k for k in shard.live() if shard.workers[k].first_epoch <= epoch]
        if any(self.asked.get(k, {}).get("epoch") != epoch for k in needed):
            return False
        self.dispatcher.open(epoch)
        self.undelivered.clear()
        for worker in sorted(needed):
            self.top_up(worker)
        return True

    # -- pushes and their answers ------------------------------------------------------------------
    def pushed(self, worker: int, steps=1, deal: bool = True) -> list | None:
        """A push of `worker` was applied (or consumed: dropped, non-finite): its oldest batch is trained (its
        `steps` oldest, for a push of local steps), and it is dealt its next (`deal`; a synchronous round deals
        when it completes, in rank order: `top_up`). The trained batches: [epoch, start, count, start, count, ...]
        (None when it held none)."""
        if self.dispatcher is None or self.dispatcher.epoch is None:
            return None
        steps = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 1 else 1
        trained = [self.dispatcher.applied(worker) for _ in range(steps)]
        if deal:
            self.top_up(worker)
        trained = [part for batch in trained if batch is not None for part in batch]
        return [self.dispatcher.epoch, *trained] if trained else None

    def resize(self, sizes: dict[int, tuple[int, int]]) -> None:
        """New batch sizes and depths (worker -> (size, depth)): ASHL's allocation, in force from the next deal."""
        for worker, (size, depth) in sizes.items():
            if worker in self.size:
                self.size[worker], self.depth[worker] = size, depth

    def deliver(self, worker: int) -> dict:
        """The fields that hand `worker` what it was dealt since its last reply (nothing when nothing was)."""
        dealt = self.undelivered.pop(worker, None)
        return {"batches": dealt} if dealt else {}

    def top_up(self, worker: int) -> None:
        """Deal `worker` batches until it holds its depth (or none are left)."""
        dispatcher = self.dispatcher
        while worker in self.size and dispatcher.holds(worker) < self.depth.get(worker, 1):
            dealt = dispatcher.deal(worker, self.size[worker])
            if dealt is None:
                return
            self.undelivered.setdefault(worker, []).append(list(dealt))
            batches, samples = self.counts.setdefault(dealt[0], {}).setdefault(worker, [0, 0])
            self.counts[dealt[0]][worker] = [batches + 1, samples + dealt[2]]

    def new_fit(self) -> None:
        """A later `fit` of the cell starts: its epochs are opened again."""
        if self.dispatcher is not None:
            self.dispatcher.epoch = None
        self.undelivered.clear()

    # -- workers that go ------------------------------------------------------------------------
    def lost(self, worker: int) -> int:
        """`worker` died or was evicted: what it held is dealt to the others; how many samples."""
        self.asked.pop(worker, None)
        self.undelivered.pop(worker, None)
        self.size.pop(worker, None)
        return 0 if self.dispatcher is None else self.dispatcher.lost(worker)

    def awaiting(self, worker: int) -> bool:
        """Whether `worker` waits for a batch (so pushes nothing until it gets one)."""
        return worker in self.asked

    def first_epoch(self) -> int | None:
        """The epoch a worker joining now trains first: the open one while batches of it are left."""
        dispatcher = self.dispatcher
        if dispatcher is None or dispatcher.epoch is None:
            return None
        return dispatcher.epoch if not dispatcher.spent() else dispatcher.epoch + 1

    def summary(self) -> dict:
        """Batches and samples dealt per epoch and worker (JSON keys are strings)."""
        return {"seed": self.seed, "samples": self.dispatcher.n if self.dispatcher else None,
                "dealt": {str(e): {str(k): v for k, v in by.items()} for e, by in self.counts.items()}}
