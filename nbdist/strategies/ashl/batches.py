"""ASHL's data: every worker's batches sized by its allocation: dealt on demand by shard 0 (`AllocatedDeals`,
arrays under `--data dynamic`), or each worker's share of every global batch (`ProportionalBatches`,
`DatasetBatches`)."""

from __future__ import annotations

import numpy as np

from ...datasets import structures
from ...errors import OptionError


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
        self.order = np.arange(structures.length(x))
        self.set_batches(batches)
        self.dataset = _Dataset()

    def set_batches(self, batches: list[int]) -> None:
        if structures.length(self.x) < sum(batches):
            raise OptionError(f"{structures.length(self.x)} training samples are fewer than one global batch of {sum(batches)}; "
                              "use a smaller batch_size or fewer workers.")
        self.batches = list(batches)
        self.steps = structures.length(self.x) // sum(batches)

    @property
    def size(self) -> int:
        return self.batches[self.rank]

    def batch(self, k: int):
        sizes, order = self.batches, self.order  # one read of each: another thread may replace them
        start = k * sum(sizes) + sum(sizes[:self.rank])
        index = np.sort(order[start:start + sizes[self.rank]])
        batch = (structures.take(self.x, index), structures.take(self.y, index))
        return batch if self.sample_weight is None else (*batch, structures.take(self.sample_weight, index))

    def new_epoch(self) -> None:
        self.epoch += 1
        self.order = np.random.default_rng([self.seed, self.epoch]).permutation(structures.length(self.x))


class AllocatedDeals:
    """Batches on demand at the allocation's sizes: shard 0 deals this worker batches of its b_rank samples, the
    steps between two of its commits at a time (`dealt`: its `DealtBatches`), so a fast worker trains what a
    slow one does not reach, a dead worker's batches go to the others and each sample trains once an epoch."""

    def __init__(self, dealt, rank: int, exchange):
        self.dealt, self.rank, self.exchange = dealt, rank, exchange

    def set_batches(self, batches: list[int]) -> None:
        """The allocation's batches (the exchange's `period` already its): dealt from the next deal on."""
        self.batches = list(batches)
        self.dealt.size, self.dealt.depth = batches[self.rank], max(1, self.exchange.period)
        self.steps = -(-self.dealt.n // sum(batches))  # about each worker's steps an epoch (step times equalised)

    @property
    def size(self) -> int:
        return self.batches[self.rank]


BATCHING = ("_BatchDataset", "BatchDataset", "_ParallelBatchDataset", "ParallelBatchDataset")
AFTER_BATCHING = ("_PrefetchDataset", "PrefetchDataset")  # may follow the batching: it changes no element


def per_sample(dataset) -> tuple[object, int | None]:
    """The samples of a tf.data.Dataset ASHL can re-batch, and the batch size it had (None: unbatched).

    Works for a dataset of single samples, and for one whose last transformation is `.batch(n)`
    (a `.prefetch` after it is fine); anything else is refused with what to pass instead."""
    import tensorflow as tf

    outer = dataset
    while type(outer).__name__ in AFTER_BATCHING:
        outer = outer._input_dataset
    if type(outer).__name__ in BATCHING:
        samples, batch = outer._input_dataset, int(outer._batch_size)
    else:
        first = tf.nest.flatten(dataset.element_spec)[0]
        if first.shape.rank and first.shape[0] is None:
            raise OptionError("--strategy ashl re-batches a tf.data.Dataset by each worker's speed, so it needs "
                              "the batching last: dataset.batch(n) (optionally then .prefetch), or no batching at "
                              f"all. This dataset's last transformation is {type(outer).__name__.strip('_')}; move "
                              ".batch(n) to the end, or pass numpy arrays.")
        samples, batch = dataset, None
    if int(samples.cardinality()) < 0:
        raise OptionError("--strategy ashl needs a tf.data.Dataset of known, finite length (it splits every global "
                          "batch between the workers); add .apply(tf.data.experimental.assert_cardinality(n)) "
                          "before the batching, or pass numpy arrays.")
    return samples, batch


class DatasetBatches:
    """`ProportionalBatches` for a tf.data.Dataset of samples: every worker reads the same global batches of
    B = sum(b) samples and keeps its b_rank (a shuffle in the pipeline needs its seed, or `--seed`, so every
    worker reads the same order)."""

    def __init__(self, samples, rank: int, batches: list[int]):
        import tensorflow as tf

        self.rank, self.total = rank, sum(batches)
        self.n = int(samples.cardinality())
        self.offset = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.set_batches(batches)

        def mine(*parts):
            kept = tuple(tf.nest.map_structure(lambda t: t[self.offset:self.offset + self.count], p) for p in parts)
            return kept if len(kept) > 1 else kept[0]

        self.dataset = samples.batch(self.total, drop_remainder=True).map(mine)

    def set_batches(self, batches: list[int]) -> None:
        if sum(batches) != self.total or self.n < self.total:
            raise OptionError(f"an allocation of {sum(batches)} samples per global batch for a dataset of {self.n} "
                              f"read in global batches of {self.total}; use a smaller batch_size or fewer workers.")
        self.batches = list(batches)
        self.steps = self.n // self.total
        self.offset.assign(sum(batches[:self.rank]))
        self.count.assign(batches[self.rank])

    @property
    def size(self) -> int:
        return self.batches[self.rank]
