"""Data parallelism across pipelines (`--replicas R`): where a worker sits, and what replicas agree on.

R pipelines of K stages run on R x K engines; rank = replica x K + stage. Each replica takes every
R-th sample of each mini-batch; the replicas of a stage sum their gradients before the optimizer
step, and the last stages sum their metric states, so every replica applies the same update and
reports the whole batch's logs. Sums run in replica order, so every replica computes the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RGRAD, METRICS = "rgrad", "metrics"


@dataclass(frozen=True)
class Position:
    """One worker's place: its stage in its pipeline, and its replica among the pipelines."""

    rank: int
    stages: int
    replicas: int = 1

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def up(self) -> int:
        """The rank of the stage before this one, in the same pipeline."""
        return self.rank - 1

    @property
    def down(self) -> int:
        """The rank of the stage after this one, in the same pipeline."""
        return self.rank + 1

    @property
    def peers(self) -> list[int]:
        """The ranks of this stage in the other pipelines."""
        return [self.stage + r * self.stages for r in range(self.replicas) if r != self.replica]

    def neighbours(self) -> list[int]:
        """Every rank this worker sends to."""
        return ([self.up] if not self.first else []) + ([self.down] if not self.last else []) + self.peers

    def share(self, indices: np.ndarray) -> np.ndarray:
        """This replica's samples of a mini-batch: every R-th, from its replica number."""
        return indices[self.replica::self.replicas]

    def role(self) -> str:
        return f"pipeline stage {self.stage}" + (f" of replica {self.replica}" if self.replicas > 1 else "")


def summed(position: Position, links, kind: str, step: int, own: list[np.ndarray]) -> list[np.ndarray]:
    """`own` summed with the same arrays of the other replicas of this stage, in replica order."""
    if position.replicas == 1:
        return own
    arrays = {f"a{i}": a for i, a in enumerate(own)}
    for peer in position.peers:
        links.send(peer, kind, step, position.replica, arrays=arrays)
    parts = {position.replica: own}
    for peer in position.peers:
        replica = peer // position.stages
        message = links.receive(kind, step, replica, peer)
        parts[replica] = [np.array(message.arrays[f"a{i}"]) for i in range(len(own))]
    total = parts[0]
    for r in range(1, position.replicas):
        total = [a + b for a, b in zip(total, parts[r])]
    return total
