"""A worker's share of what a hand-written training loop iterates (DESIGN.md section 13): the value the loop
reads under the notebook's name, cut to this worker's shard where the loop begins (`training_code` wraps the
names a data loop iterates in `LoopData.__call__`).

Every worker's shard has the same length: a tf.data pipeline's first floor(batches / N) batches of its
`Dataset.shard`, a PyDataset's batches rank, rank + N, ... up to floor(len / N) N, an array's or list's strided
samples of the first floor(n / N) N. So under a synchronous strategy every rank makes the same number of steps
in a loop over its shard (a rank that ran short would leave the others waiting in the next allreduce); what a
loop does besides (a `break` on its own condition) must be the same on every rank too.
"""

from __future__ import annotations

from ..errors import OptionError
from ..datasets.sharding import is_dataset, is_generator, is_py_dataset, shard_py_dataset, strided


class LoopData:
    """The engine's `__nbdist_loop_data__(value, name)`: this worker's shard of `value`; anything that is not
    training data (a range, a number) as it is. `shards` says what was cut, for the run's notes."""

    def __init__(self, rank: int, size: int, synchronous: bool):
        self.rank, self.size, self.synchronous = rank, size, synchronous
        self.shards: dict[str, str] = {}  # name -> what each worker iterates of it
        self._made: dict[tuple[int, str], tuple[object, object]] = {}  # (id(value), name) -> (value, its shard)
        self.batch: int | None = None  # the samples of a batch of the first pipeline a loop iterates

    def __call__(self, value, name: str):
        key = (id(value), name)
        made = self._made.get(key)
        if made is not None and made[0] is value:
            return made[1]
        if self.batch is None and (is_dataset(value) or is_py_dataset(value)):
            self.batch = _batch_of(value)
        shard = self._shard(value, name) if self.size > 1 else value
        self._made[key] = (value, shard)
        return shard

    def batch_size(self) -> int | None:
        return self.batch

    def _shard(self, value, name: str):
        rank, size = self.rank, self.size
        if is_dataset(value):
            return self._dataset(value, name)
        if is_py_dataset(value):
            shard = shard_py_dataset(value, rank, size)
            self.shards[name] = f"{len(shard)} of its {len(value)} batches"
            return shard
        if is_generator(value):
            raise OptionError(_generator_refusal(name))
        if _is_sequence(value):
            if len(value) < size:  # the items the loop iterates (a loop over a dict or nest iterates its keys)
                raise OptionError(f"the training loop iterates `{name}`, of {len(value)} items: fewer than the "
                                  f"{size} workers. Use fewer --workers.")
            shard = value[strided(len(value), rank, size)]
            self.shards[name] = f"{len(shard)} of its {len(value)} items"
            return shard
        return value

    def _dataset(self, dataset, name: str):
        import tensorflow as tf

        cardinality = int(dataset.cardinality())
        if cardinality == tf.data.UNKNOWN_CARDINALITY and self.synchronous:
            raise OptionError(f"the training loop iterates `{name}`, a tf.data pipeline of unknown length, under a "
                              "synchronous strategy: every rank must make the same number of steps. Give it its "
                              f"length ({name} = {name}.apply(tf.data.experimental.assert_cardinality(n))), or use "
                              "an asynchronous strategy (nfdt, ddc-asgd).")
        shard = dataset.shard(self.size, self.rank)
        if cardinality >= 0:
            per_rank = cardinality // self.size
            if per_rank == 0:
                raise OptionError(f"the training loop iterates `{name}`, of {cardinality} batches: fewer than the "
                                  f"{self.size} workers. Use fewer --workers or smaller batches.")
            shard = shard.take(per_rank)
            self.shards[name] = f"{per_rank} of its {cardinality} batches"
        else:
            self.shards[name] = f"1/{self.size} of its batches"
        return shard


def _batch_of(dataset) -> int | None:
    """The samples of the pipeline's batch, without iterating it (None where it does not say: its records then
    count steps only); a PyDataset's first batch."""
    from ..datasets.sharding import batch_size_of, dataset_batch, is_py_dataset

    try:
        return dataset_batch(dataset) if is_py_dataset(dataset) else batch_size_of(dataset)
    except Exception:  # noqa: BLE001 - a PyDataset whose first batch cannot be read ahead
        return None


def _is_sequence(value) -> bool:
    """Arrays (numpy, pandas) and lists or tuples of items: what a loop indexes or iterates sample by sample."""
    if isinstance(value, (list, tuple)):
        return True
    module = type(value).__module__.split(".")[0]
    return module in ("numpy", "pandas") and getattr(value, "ndim", 0) >= 1


def refuse_unshareable(names, namespace: dict) -> None:
    """Before any engine runs: a loop over a Python generator of the notebook's is refused, naming it."""
    for name in names:
        if is_generator(namespace.get(name)):
            raise OptionError(_generator_refusal(name))


def _generator_refusal(name: str) -> str:
    return (f"the training loop iterates `{name}`, a Python generator: nbdist cannot give each worker a share of it "
            "(nor know that all make the same steps). Iterate arrays, a tf.data pipeline (tf.data.Dataset."
            "from_generator with its length asserted) or a keras.utils.PyDataset instead, or run the cell under "
            "--strategy local.")
