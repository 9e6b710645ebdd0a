"""Batches a pipeline reads from a `tf.data.Dataset`, a `keras.utils.PyDataset` or a generator.

Arrays are indexed alike on every stage (`stage.index_batches`). A stream is read once: the first stage
takes each batch from it (`Stream.next_batch`), computes on its inputs, and sends the batch's size, targets and
sample weights down the pipeline before its first activation (`stage.StageSteps`), where the last stage reads
them. Every stage runs the same number of steps, which each counts from its own copy of the cell's
source (`steps`): a dataset's cardinality, a PyDataset's length, or the cell's `steps_per_epoch` /
`validation_steps`.
"""

from __future__ import annotations

import numpy as np

from ...datasets import structures
from ...datasets.dynamic_data import single_target
from ...errors import OptionError
from ...datasets.sharding import first_batch, is_dataset, is_generator, is_py_dataset


def is_stream(data) -> bool:
    return is_dataset(data) or is_py_dataset(data) or is_generator(data)


def steps(source, given: int | None, what: str) -> int:
    """How many batches a pass over `source` takes: `given` (steps_per_epoch, validation_steps) when the cell
    gave it, else the source's own count; refused where neither is known (an endless or filtered dataset, a
    generator), saying what to pass."""
    if given:
        return int(given)
    count = None
    if is_dataset(source):
        cardinality = int(source.cardinality())
        count = cardinality if cardinality >= 0 else None
    elif is_py_dataset(source):
        count = source.num_batches
    if count is None:
        name = "validation_steps" if what == "validation" else "steps_per_epoch"
        raise OptionError(f"--strategy pipeline runs the same number of steps on every stage and cannot count the "
                          f"batches of this {what} {type(source).__name__} (endless, or of unknown length): pass "
                          f"{name}=N to fit.")
    return int(count)


class Stream:
    """The cell's source, read batch by batch on the first stage: each `next_batch` is {"x", "y",
    "sample_weight"} as numpy arrays (nests of them), the pass restarted when the source is used up (a new
    epoch's iterator, as Keras' own)."""

    def __init__(self, source, class_weight=None):
        self.source, self.class_weight = source, class_weight
        self._iterator = None

    def _fresh(self):
        if is_py_dataset(self.source):
            return (self.source[i] for i in range(self.source.num_batches or len(self.source)))
        return iter(self.source)

    def next_batch(self) -> dict:
        import keras

        if self._iterator is None:
            self._iterator = self._fresh()
        try:
            element = next(self._iterator)
        except StopIteration:
            self._iterator = self._fresh()
            element = next(self._iterator)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(element)  # (y None: a loss the model adds)
        batch = {k: structures.map_leaves(np.asarray, v) for k, v in
                 (("x", x), ("y", y), ("sample_weight", sample_weight))}
        if self.class_weight:
            from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

            batch["sample_weight"] = np.asarray(class_weight_to_sample_weights(
                structures.rows(single_target(batch["y"])), self.class_weight))
        return batch

    def sample_x(self):
        """One batch's inputs, read apart from the pass (to build or time the model), or None for a generator."""
        return None if is_generator(self.source) else first_batch(self.source)[0]


def skeleton(value):
    """`value`'s nest with each leaf replaced by its number in `structures.flatten(value)` (JSON: tuples become
    lists)."""
    counter = iter(range(1 << 30))

    def walk(v):
        if v is None:
            return None
        if isinstance(v, dict):
            return {k: walk(v[k]) for k in sorted(v)}
        if isinstance(v, (list, tuple)):
            return [walk(item) for item in v]
        return next(counter)

    return walk(value)


def packed(shape, arrays: list):
    """The nest `skeleton` described, its leaves taken from `arrays`."""
    if shape is None:
        return None
    if isinstance(shape, dict):
        return {k: packed(v, arrays) for k, v in shape.items()}
    if isinstance(shape, list):
        return [packed(v, arrays) for v in shape]
    return arrays[shape]
