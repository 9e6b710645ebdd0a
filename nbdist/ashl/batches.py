"""ASHL's data: every worker's batches sized by its allocation, the global batch shared between them."""

from __future__ import annotations

import numpy as np

from ..errors import OptionError


class ProportionalBatches:
    """The worker's batches: of each global batch of B = sum(b) samples, the b_rank after the others' share.

    One permutation per epoch, the same on every worker (seeded by the epoch), so the
    workers' batches of an epoch cover the data once between them whatever the allocation.
    """

    def __init__(self, x, y, rank: int, batches: list[int], seed: int, sample_weight=None):
        import keras

        class _Dataset(keras.utils.PyDataset):
            def __len__(inner):
                return self.steps

            def __getitem__(inner, k):
                return self.batch(k)

            def on_epoch_end(inner):
                self.new_epoch()

        self.x, self.y, self.rank, self.seed, self.sample_weight = x, y, rank, seed, sample_weight
        self.epoch = 0
        self.order = np.arange(len(x))
        self.set_batches(batches)
        self.dataset = _Dataset()

    def set_batches(self, batches: list[int]) -> None:
        if len(self.x) < sum(batches):
            raise OptionError(f"{len(self.x)} training samples are fewer than one global batch of {sum(batches)}; "
                              "use a smaller batch_size or fewer workers.")
        self.batches = list(batches)
        self.steps = len(self.x) // sum(batches)

    @property
    def size(self) -> int:
        return self.batches[self.rank]

    def batch(self, k: int):
        sizes, order = self.batches, self.order  # one read of each: another thread may replace them
        start = k * sum(sizes) + sum(sizes[:self.rank])
        index = np.sort(order[start:start + sizes[self.rank]])
        if self.sample_weight is None:
            return self.x[index], self.y[index]
        return self.x[index], self.y[index], self.sample_weight[index]

    def new_epoch(self) -> None:
        self.epoch += 1
        self.order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.x))
