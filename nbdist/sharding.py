"""Split training data between workers so every worker makes the same number of steps."""

from __future__ import annotations

import math

from .errors import OptionError


def _length(data) -> int:
    if isinstance(data, dict):
        return len(next(iter(data.values())))
    if isinstance(data, (list, tuple)):
        return len(data[0])
    return len(data)


def _index(data, index):
    if data is None:
        return None
    if isinstance(data, dict):
        return {k: v[index] for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(v[index] for v in data)
    return data[index]


def split_validation(x, y, fraction: float):
    """Keras' own validation_split: the last `fraction` of the samples, taken before any shuffling."""
    split_at = int(math.ceil(_length(x) * (1 - fraction)))
    return (_index(x, slice(0, split_at)), _index(y, slice(0, split_at))), \
           (_index(x, slice(split_at, None)), _index(y, slice(split_at, None)))


def shard_arrays(x, y, rank: int, size: int):
    """Rank `rank`'s strided shard: samples rank, rank+size, ... of the first size*floor(n/size).

    Strided shards keep the global batch of step i equal to samples [i*B, (i+1)*B) of the
    unsharded data (B = size * per-worker batch), so unshuffled synchronous training sees
    exactly the batches a single worker with batch B would. Equal shard lengths give every
    rank the same number of steps; at most size-1 samples per epoch are left out.
    """
    n = _length(x)
    if n < size:
        raise OptionError(f"{n} training samples cannot be shared by {size} workers; use fewer --workers.")
    usable = (n // size) * size
    index = slice(rank, usable, size)
    return _index(x, index), _index(y, index)


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


def shard_fit_data(request, rank: int, size: int) -> dict:
    """The `fit` arguments for one worker: x, y, validation_data and steps_per_epoch of its shard.

    `validation_split` is taken before sharding (Keras' own split); the validation data is
    sharded like the training data.
    """
    from .keras_bridge import is_dataset

    x, y, validation = request.x, request.y, request.validation_data
    steps = request.steps_per_epoch
    if request.validation_split:
        if is_dataset(x):
            raise OptionError("validation_split needs numpy inputs; give validation_data with a tf.data.Dataset.")
        (x, y), validation = split_validation(x, y, request.validation_split)
    if is_dataset(x):
        x, steps = shard_dataset(x, rank, size, steps)
    else:
        x, y = shard_arrays(x, y, rank, size)
    if validation is not None:
        if is_dataset(validation):
            validation, _ = shard_dataset(validation, rank, size, None)
        else:
            validation = shard_arrays(validation[0], validation[1], rank, size)
    return {"x": x, "y": y, "validation_data": validation, "validation_split": 0.0, "steps_per_epoch": steps}
