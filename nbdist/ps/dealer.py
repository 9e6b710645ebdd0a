"""Shard 0's dealer of batches (`--data dynamic`, DESIGN.md section 11): the parameter server hands out the
positions each worker trains on next, so a fast worker takes more and a dead worker's batches are trained
by the others.

A worker asks for an epoch's first batches with a held ``batch`` message; the epoch opens once every live
worker that trains it has asked, and each gets its first ones in rank order (the same on every run). Every push
of the model's optimizer and every batch request says how many batches of the epoch the worker has taken
(``taken``: [epoch, count]; each one trained, the last one once its first push was sent): those not counted yet
are trained, and it is dealt its next (`deliver`: in the answer), up to `depth` held at once (two when its
exchange overlaps the next step; ASHL's local steps between commits). A count, not one batch a push: the model's
optimizer may step several times a batch or not at all (a GAN's train_step steps optimizers of its own, on tables
of their own), and a worker whose steps push nothing here asks for its next batch itself. A worker with none left
asks: it gets one that came back from a dead worker, or is told the epoch is spent once every batch was applied.
While it waits, no round, staleness bound or virtual-time order waits for it (`awaiting`), on any table.
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
        self.counted: dict[int, int] = {}  # worker -> batches of the open epoch it reported taken

    # -- requests ----------------------------------------------------------------------------
    def note(self, worker: int, header: dict) -> None:
        """A held ``batch`` request: checked, the batches it reports taken counted, remembered until `answer` can
        answer it."""
        epoch, size, n, depth = (header.get(k) for k in ("epoch", "size", "n", "depth"))
        if not all(_count(v) for v in (epoch, size, n, depth)) or min(size, n, depth) < 1:
            raise wire.Rejected("malformed", "a batch request names its epoch, batch size, samples and depth")
        check_taken(header)
        if self.dispatcher is None:
            self.dispatcher = Dispatcher(n)
        elif n != self.dispatcher.n:
            raise wire.Rejected("malformed", f"worker {worker} trains on {n} samples, the run's first worker on "
                                             f"{self.dispatcher.n}: every engine must hold the same data")
        self.trained(worker, header.get("taken"))
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
        self.counted.clear()
        for worker in sorted(needed):
            self.top_up(worker)
        return True

    # -- pushes and their answers ------------------------------------------------------------------
    def pushed(self, worker: int, taken, deal: bool = True) -> list | None:
        """A push of `worker` was applied (or consumed: dropped, non-finite): the batches it reports `taken` and not
        yet counted are trained, and it is dealt its next (`deal`; a synchronous round deals when it completes, in
        rank order: `top_up`). The trained batches: [epoch, start, count, start, count, ...] (None when none)."""
        if self.dispatcher is None or self.dispatcher.epoch is None:
            return None
        trained = self.trained(worker, taken)
        if deal:
            self.top_up(worker)
        return [self.dispatcher.epoch, *(part for batch in trained for part in batch)] if trained else None

    def trained(self, worker: int, taken) -> list[tuple[int, int]]:
        """`worker` has taken `taken` = [epoch, count] batches of the epoch: those of the open epoch not counted yet
        are trained (its oldest outstanding ones); their (start, count)."""
        dispatcher = self.dispatcher
        if taken is None or dispatcher is None or taken[0] != dispatcher.epoch:
            return []
        new = taken[1] - self.counted.get(worker, 0)
        self.counted[worker] = max(taken[1], self.counted.get(worker, 0))
        batches = [dispatcher.applied(worker) for _ in range(new)]
        return [batch for batch in batches if batch is not None]

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
        self.counted.clear()

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


def check_taken(header: dict) -> None:
    """Refuse a message whose ``taken`` (the batches of an epoch its worker took) is not [epoch, count]."""
    taken = header.get("taken")
    if taken is not None and not (isinstance(taken, list) and len(taken) == 2 and all(_count(v) for v in taken)):
        raise wire.Rejected("malformed", "taken names an epoch and how many of its batches the worker took")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
