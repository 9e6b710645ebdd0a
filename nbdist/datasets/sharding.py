"""Split training data between workers so every worker makes the same number of steps.

Arrays (and `sample_weight` with them; any nest of them, `structures`) are split by sample, strided; a tf.data.Dataset by
batch (`Dataset.shard`); a `keras.utils.PyDataset` by batch index (worker k of N takes
batches k, k+N, ...); a Python generator by item, the same way.
"""

from __future__ import annotations

import itertools
import math
import weakref

from ..errors import OptionError
from .structures import flatten, length, map_leaves, rows, take

_PRESHARDED: dict[int, tuple] = {}  # id(array) -> (weak reference, rank, size, full length)


def strided(n: int, rank: int, size: int) -> slice:
    """The samples of rank `rank`'s strided shard of `n`: rank, rank+size, ... of the first size*floor(n/size)."""
    return slice(rank, (n // size) * size, size)


def mark_presharded(array, rank: int, size: int, total: int) -> None:
    """`array` is already rank's strided shard of `total` samples (the notebook sent only that, `notebook.bring`)."""
    _PRESHARDED[id(array)] = (weakref.ref(array, lambda _, key=id(array): _PRESHARDED.pop(key, None)),
                              rank, size, total)


def presharded(array) -> tuple[int, int, int] | None:
    """(rank, size, full length) when `array` is a shard the notebook sent, else None."""
    entry = _PRESHARDED.get(id(array))
    return entry[1:] if entry is not None and entry[0]() is array else None


def split_validation(x, y, fraction: float, sample_weight=None):
    """Keras' own validation_split: the last `fraction` of the samples, taken before any shuffling.

    Returns ((x, y), (x_val, y_val)), with the sample weights appended to each pair when given.
    """
    split_at = int(math.ceil(length(x) * (1 - fraction)))
    head, tail = slice(0, split_at), slice(split_at, None)
    train, validation = (take(x, head), take(y, head)), (take(x, tail), take(y, tail))
    if sample_weight is not None:
        train, validation = (*train, take(sample_weight, head)), (*validation, take(sample_weight, tail))
    return train, validation


def weighted_owners(n: int, fractions: list[float]) -> "np.ndarray":
    """Which worker each of `n` items goes to, for shares `fractions`: interleaved through the data (as a strided
    shard is), worker k taking its share spread evenly, counts by largest remainder so they sum to `n`."""
    import numpy as np

    exact = [f * n / sum(fractions) for f in fractions]
    counts = [int(c) for c in exact]
    for k in sorted(range(len(exact)), key=lambda k: exact[k] - counts[k], reverse=True)[: n - sum(counts)]:
        counts[k] += 1
    positions = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c])
    workers = np.concatenate([np.full(c, k) for k, c in enumerate(counts) if c])
    return workers[np.argsort(positions, kind="stable")]


def shard_by_fraction(x, y, rank: int, fractions: list[float], sample_weight=None):
    """Rank `rank`'s share `fractions[rank]` of the samples (`weighted_owners`); (x, y[, sample_weight])."""
    import numpy as np

    index = np.flatnonzero(weighted_owners(length(x), fractions) == rank)
    shard = (take(x, index), take(y, index))
    return shard if sample_weight is None else (*shard, take(sample_weight, index))


def shard_arrays(x, y, rank: int, size: int, sample_weight=None):
    """Rank `rank`'s strided shard: samples rank, rank+size, ... of the first size*floor(n/size).

    Strided shards keep the global batch of step i equal to samples [i*B, (i+1)*B) of the
    unsharded data (B = size * per-worker batch), so unshuffled synchronous training sees
    exactly the batches a single worker with batch B would. Equal shard lengths give every
    rank the same number of steps; at most size-1 samples per epoch are left out.
    Returns (x, y), or (x, y, sample_weight) when sample weights are given.
    """
    sent = next(filter(None, map(presharded, flatten(x))), None)
    n = sent[2] if sent else length(x)
    if n < size:
        raise OptionError(f"{n} training samples cannot be shared by {size} workers; use fewer --workers.")
    index = strided(n, rank, size)

    def cut(leaf):  # an array the notebook sent as this rank's shard is that shard already
        shard_of = presharded(leaf)
        if shard_of is not None and shard_of[:2] != (rank, size):
            raise OptionError(f"this engine holds the shard {shard_of[0]}/{shard_of[1]} of the data, not "
                              f"{rank}/{size}; re-run the cell (nbdist sends the right one).")
        return leaf if shard_of is not None else rows(leaf)[index]

    shard = (map_leaves(cut, x), map_leaves(cut, y))
    return shard if sample_weight is None else (*shard, map_leaves(cut, sample_weight))


def shard_dataset(dataset, rank: int, size: int, steps: int | None):
    """Rank `rank`'s share of a (batched) tf.data.Dataset, cut to the same number of batches on every rank.

    Returns (dataset, steps_per_epoch); `steps` is the user's steps_per_epoch, or None.
    """
    import tensorflow as tf

    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        if steps is None:
            raise OptionError("an infinite tf.data.Dataset needs steps_per_epoch so every worker makes the same "
                              "number of steps.")
        return dataset.shard(size, rank), steps
    if cardinality == tf.data.UNKNOWN_CARDINALITY:
        if steps is None:
            raise OptionError("this tf.data.Dataset has an unknown length: give fit a steps_per_epoch so every "
                              "worker makes the same number of steps (or use dataset.apply("
                              "tf.data.experimental.assert_cardinality(n))).")
        return dataset.shard(size, rank).repeat(), steps
    per_rank = cardinality // size
    if per_rank == 0:
        raise OptionError(f"the dataset has {cardinality} batches, fewer than the {size} workers; use fewer --workers.")
    shard = dataset.shard(size, rank).take(per_rank)
    return (shard.repeat() if steps is not None else shard), steps


def is_dataset(value) -> bool:
    """Whether `value` is a tf.data.Dataset (without importing TensorFlow)."""
    return hasattr(value, "element_spec") and hasattr(value, "take")


def dataset_batch(dataset) -> int:
    """The samples of a batched tf.data pipeline's first element, or of a PyDataset's first batch."""
    if is_py_dataset(dataset):
        return length(dataset[0], "the PyDataset's first batch")
    import tensorflow as tf

    return int(tf.shape(tf.nest.flatten(next(iter(dataset)))[0])[0])


def batch_size_of(dataset) -> int | None:
    """The samples of a batched tf.data pipeline's batch, read from its structure without iterating it (None where
    neither its element spec nor a `batch` in it says): an iteration would move a `shuffle`'s order on, and the
    cell's own first epoch would not be a local run's."""
    import tensorflow as tf

    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
    node = dataset
    while node is not None:
        size = getattr(node, "_batch_size", None)
        if size is not None:
            return int(size)
        node = getattr(node, "_input_dataset", None)
    return None


def spec_batch(dataset) -> tuple | None:
    """(x, y, sample_weight) of one sample of zeros shaped as a tf.data pipeline's elements, made without iterating
    it (see `batch_size_of`); None where an element is not a dense tensor of a known shape but its batch."""
    import keras
    import tensorflow as tf

    specs = tf.nest.flatten(dataset.element_spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank and None not in s.shape[1:] for s in specs):
        return None

    def zeros(spec):
        shape = [1, *spec.shape[1:]]
        return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

    return keras.utils.unpack_x_y_sample_weight(tf.nest.map_structure(zeros, dataset.element_spec))


def first_batch(source) -> tuple:
    """(x, y, sample_weight) of the first batch of a tf.data.Dataset or a PyDataset, unpacked as Keras unpacks it
    (y and sample_weight None where the source gives none)."""
    import keras

    first = source[0] if is_py_dataset(source) else next(iter(source))
    return keras.utils.unpack_x_y_sample_weight(first)


def is_py_dataset(value) -> bool:
    """A `keras.utils.PyDataset` (without importing Keras)."""
    return any(cls.__name__ == "PyDataset" for cls in type(value).__mro__)


def is_generator(value) -> bool:
    import inspect

    return inspect.isgenerator(value)


def shard_py_dataset(dataset, rank: int, size: int, fractions: list[float] | None = None):
    """Batches rank, rank+size, ... of `dataset` (or rank's share of `fractions`, interleaved), as a PyDataset
    with the user's workers / multiprocessing settings.

    With equal shares every rank gets floor(len/size) batches, so all make the same number of steps.
    """
    import keras
    import numpy as np

    if fractions is not None:
        owned = [int(i) for i in np.flatnonzero(weighted_owners(len(dataset), fractions) == rank)]
    else:
        owned = list(range(rank, (len(dataset) // size) * size, size))
    if not owned:
        raise OptionError(f"the PyDataset has {len(dataset)} batches, fewer than the {size} workers; use fewer "
                          "--workers or smaller batches.")
    return py_dataset_of(dataset, owned)


def py_dataset_of(dataset, owned: list[int]):
    """The batches `owned` of the PyDataset `dataset`, in that order, as a PyDataset with the user's workers /
    multiprocessing settings (its epoch hooks passed on)."""
    import keras

    class ShardOfPyDataset(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=dataset.workers, use_multiprocessing=dataset.use_multiprocessing,
                             max_queue_size=dataset.max_queue_size)
            self.base = dataset

        def __len__(self):
            return len(owned)

        def __getitem__(self, index):
            return dataset[owned[index]]

        def on_epoch_begin(self):
            dataset.on_epoch_begin()

        def on_epoch_end(self):
            dataset.on_epoch_end()

    return ShardOfPyDataset()


def shard_generator(generator, rank: int, size: int):
    """Items rank, rank+size, ... of a Python generator (each engine runs its own copy of the cell's)."""
    return itertools.islice(generator, rank, None, size)


def shard_fit_data(request, rank: int, size: int, synchronous: bool = False,
                   fractions: list[float] | None = None) -> dict:
    """The `fit` arguments for one worker: x, y, sample_weight, validation_data and steps_per_epoch of its shard.

    `validation_split` is taken before sharding (Keras' own split, sample weights with it);
    the validation data is sharded like the training data. `synchronous`: every rank must
    make the same number of steps (Horovod), so a generator needs steps_per_epoch.
    `fractions`: unequal shares (`--shards speed`), for arrays and PyDatasets.
    """

    x, y, weights, validation = request.x, request.y, request.sample_weight, request.validation_data
    steps = request.steps_per_epoch
    if request.validation_split:
        if is_dataset(x) or is_py_dataset(x) or is_generator(x):
            raise OptionError("validation_split needs numpy inputs; give validation_data with a tf.data.Dataset, "
                              "a PyDataset or a generator.")
        train, validation = split_validation(x, y, request.validation_split, weights)
        x, y, weights = (*train, None)[:3]
    if fractions is not None and (is_dataset(x) or is_generator(x)):
        raise OptionError("--shards speed shares numpy arrays and PyDatasets by speed; a tf.data.Dataset or a "
                          "generator is shared equally: use --shards equal, or pass arrays or a PyDataset.")
    if is_dataset(x):
        x, steps = shard_dataset(x, rank, size, steps)
    elif is_py_dataset(x):
        x = shard_py_dataset(x, rank, size, fractions)
    elif is_generator(x):
        if synchronous and steps is None:
            raise OptionError("a Python generator under a synchronous strategy needs steps_per_epoch, so every "
                              "rank makes the same number of steps; give fit steps_per_epoch=N, or pass a "
                              "keras.utils.PyDataset (it has a length).")
        x = shard_generator(x, rank, size)
    elif fractions is not None:
        x, y, weights = (*shard_by_fraction(x, y, rank, fractions, weights), None)[:3]
    else:
        x, y, weights = (*shard_arrays(x, y, rank, size, weights), None)[:3]
    if validation is not None:
        validation = shard_validation(validation, rank, size, fractions)
    return {"x": x, "y": y, "sample_weight": weights, "validation_data": validation, "validation_split": 0.0,
            "steps_per_epoch": steps}


def shard_validation(validation, rank: int, size: int, fractions: list[float] | None = None):
    """Rank `rank`'s part of `validation_data` (arrays with optional weights, a Dataset or a PyDataset)."""

    if is_dataset(validation):
        return shard_dataset(validation, rank, size, None)[0]
    if is_py_dataset(validation):
        return shard_py_dataset(validation, rank, size, fractions)
    weights = validation[2] if len(validation) > 2 else None  # Keras' (x, y[, w]): each part may be a nest
    if fractions is not None:
        return shard_by_fraction(validation[0], validation[1], rank, fractions, weights)
    return shard_arrays(validation[0], validation[1], rank, size, weights)
