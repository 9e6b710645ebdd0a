"""A worker's side of batches on demand (`--data dynamic`, DESIGN.md section 11).

`fit` gets a `tf.data` pipeline whose batches are the positions of the epoch's order (`batches.epoch_order`)
this worker is handed, read from the whole arrays the engine holds (one copy per host: `host_cache`):

- `DealtBatches`: a parameter-server worker's, dealt by shard 0 (`ps.dealer`): the first of an epoch asked
  for, the next ones in the answers to its pushes of the model's optimizer, more asked for whenever it holds none
  (whatever optimizers its steps step), until the epoch is spent;
- `ScheduledBatches`: a synchronous rank's (`hfdt`), its slice of each step of `batches.SyncSchedule`.

Each epoch may give a worker a different number of batches, which Keras' own loop does not expect of a
pipeline of unknown length: `epochs_of_any_length` lets every epoch run until its batches end.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import deque

import numpy as np

from . import structures
from .batches import SyncSchedule, epoch_order
from ..errors import OptionError
from .sharding import is_dataset, is_generator, is_py_dataset


class DealtBatches:
    """The positions a parameter-server worker trains on, dealt by shard 0; see the module docstring.

    Shard 0 learns what this worker trained from how many batches of the epoch it has taken (`report`: in every push
    of the model's optimizer, whose answer brings its next batches, and in every batch request). Its pipeline's
    reader takes what arrived and, holding none, asks for more itself (`open` asks for an epoch's first), waiting
    for one or the epoch's end: so whatever the cell's step does (it steps the model's optimizer once, several
    times, or never: a GAN's train_step steps optimizers of its own) the next batch comes. Keras reads a batch as
    its step begins, never ahead, so the reader and the step's pushes never use the shards' connection at once."""

    def __init__(self, client, n: int, seed: int, size: int, shuffle: bool = True, depth: int = 1):
        self.client, self.n, self.seed, self.size, self.shuffle, self.depth = client, n, seed, size, shuffle, depth
        self.queue: deque = deque()
        self.lock = threading.Lock()  # the queue is filled by whichever thread has an answer (an overlapped push)
        self.spent = True
        self.stopped = False  # the shards said: end the fit (a graceful stop)
        self.epoch = 0
        self.taken = 0  # batches of this epoch handed to training
        self.trained: dict[int, list[list[int]]] = {}  # epoch -> [start, count] of each batch it trained

    def open(self, epoch: int) -> None:
        """`epoch` begins: its first batches (the answer waits until every worker asked for them)."""
        with self.lock:
            self.queue.clear()  # what an interrupted epoch left is dealt to others
            self.spent, self.epoch, self.taken = False, epoch, 0
        self._ask()

    def report(self) -> dict:
        """What a message to shard 0 tells its dealer: the batches of the epoch taken so far (all trained, the last
        one once the step that took it pushes)."""
        return {"taken": [int(self.epoch), self.taken]}

    def answered(self, header: dict) -> None:
        """An answer to a push: it may bring the next batches."""
        self._take(header)

    def positions(self, epoch: int):
        """The sample indices of each batch this worker trains in `epoch`, as they arrive."""
        order = epoch_order(self.n, self.seed, epoch, self.shuffle)
        while (batch := self._next()) is not None:
            dealt, start, count = batch
            if dealt == epoch:
                self.taken += 1
                self.trained.setdefault(epoch, []).append([start, count])
                yield order[start:start + count]

    def _next(self):
        """The next batch it was dealt, asked for when it holds none; None at the epoch's end or a stop."""
        while True:
            with self.lock:
                if self.queue:
                    return self.queue.popleft()
                if self.spent or self.stopped:  # stopped: evicted, or a stop
                    return None
            self._ask()

    def samples(self, epoch: int) -> int:
        return sum(count for _, count in self.trained.get(epoch, ()))

    def held(self) -> int:
        """Batches dealt to it and not yet trained."""
        return len(self.queue)

    def expected_steps(self, workers: int) -> int:
        """The steps an epoch takes a worker of `workers` of equal speed (a progress line's estimate)."""
        return -(-self.n // (self.size * workers))

    def _ask(self) -> None:
        """Report what it took and wait for batches, the epoch's end or a stop (an answer with none while it still
        has batches coming in a push's answer)."""
        reply = self.client.request("batch", only=0, epoch=int(self.epoch), size=self.size, n=self.n,
                                    depth=self.depth, **self.report())[0]
        self._take(reply.header)

    def _take(self, header: dict) -> None:
        with self.lock:
            self.queue.extend(header.get("batches") or ())
            self.spent = self.spent or bool(header.get("spent"))
            self.stopped = self.stopped or bool(header.get("stop"))


class ScheduledBatches:
    """A synchronous rank's slice of each step of the epoch's order; `where()` says which rank of how many it is
    now (it changes when the job re-forms)."""

    def __init__(self, n: int, batch: int, seed: int, where, shuffle: bool = True):
        self.schedule = SyncSchedule(n, batch, seed, shuffle)
        self.where = where
        self.epoch = 0
        self.trained: dict[int, list[list[int]]] = {}  # epoch -> [start, count] of every step's global batch
        self._marked = 0

    def positions(self, epoch: int):
        schedule = self.schedule
        schedule.open(epoch)
        while True:
            rank, size = self.where()
            start = schedule.position
            mine = schedule.step(rank, size)
            if mine is None:
                return
            self.trained.setdefault(epoch, []).append([start, schedule.position - start])
            yield mine

    def samples(self, epoch: int) -> int:
        return sum(count for _, count in self.trained.get(epoch, ()))

    def expected_steps(self, size: int) -> int:
        """The steps of an epoch over `size` ranks (every rank makes them all)."""
        schedule = SyncSchedule(self.schedule.n, self.schedule.batch, 0, shuffle=False)
        return schedule.steps_left(size)

    def mark(self) -> None:
        """A unit of steps begins (see `SyncSchedule.mark`)."""
        self.schedule.mark()
        self._marked = len(self.trained.get(self.schedule.epoch, ()))

    def rewind(self) -> None:
        """The unit runs again: its steps are drawn again, and counted once."""
        self.schedule.rewind()
        del self.trained.get(self.schedule.epoch, [])[self._marked:]


def applies(request) -> str | None:
    """Why the cell's `fit` keeps static shards under `--data dynamic` (None: batches on demand apply)."""
    x = request.x
    if is_dataset(x):
        return "a tf.data.Dataset is sharded per worker (its order is the pipeline's)"
    if is_generator(x):
        return "a Python generator is sharded per worker by item"
    if is_py_dataset(x):
        return "a keras.utils.PyDataset is sharded per worker by batch index"
    if request.steps_per_epoch:
        return "steps_per_epoch fixes each worker's steps"
    return None


def training_arrays(request) -> tuple:
    """(x, y, sample_weight) the worker trains on: the cell's, less Keras' own validation_split."""
    from .sharding import split_validation

    x, y, weights = request.x, request.y, request.sample_weight
    if request.validation_split:
        train, _ = split_validation(x, y, request.validation_split, weights)
        x, y, weights = (*train, None)[:3]
    return x, y, weights


def fit_arguments(arrays: tuple, source, request, rank: int, size: int) -> dict:
    """`fit`'s arguments for batches on demand: a pipeline of the batches `source` names from the whole
    `arrays`; the validation data (the cell's, or Keras' own validation_split) stays rank `rank`'s shard."""
    from .sharding import shard_validation, split_validation

    validation = request.validation_data
    if request.validation_split:
        validation = split_validation(request.x, request.y, request.validation_split, request.sample_weight)[1]
    if request.class_weight:  # as weights of the samples, as Keras' own array adapter does (its pipeline would
        # read ahead)
        from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

        if arrays[2] is not None:
            raise OptionError("fit takes class_weight or sample_weight, not both (Keras refuses it too); fold the "
                              "class weights into sample_weight.")
        arrays = (arrays[0], arrays[1], class_weight_to_sample_weights(single_target(arrays[1]), request.class_weight))
    return {"x": pipeline(arrays, source), "y": None, "sample_weight": None, "batch_size": None, "shuffle": False,
            "steps_per_epoch": None, "validation_split": 0.0, "class_weight": None,
            "validation_data": None if validation is None else shard_validation(validation, rank, size)}


def pipeline(arrays: tuple, source):
    """A tf.data pipeline over `arrays` ((x, y, sample_weight); y and sample_weight may be None, each an array or a
    nest of them, `structures`) whose epoch e yields the batches `source.positions(source.epoch)` names, in the
    cell's structure (lists as tuples, as Keras' own adapters give them to tf.data); floats cast to floatx as Keras'
    own array adapter casts them."""
    import keras
    import tensorflow as tf

    floatx = keras.backend.floatx()
    present = structures.for_tf_data(tuple(structures.map_leaves(structures.rows, a) for a in arrays if a is not None))

    def dtype(a):
        return floatx if np.issubdtype(a.dtype, np.floating) else a.dtype

    signature = structures.map_leaves(lambda a: tf.TensorSpec((None, *a.shape[1:]), dtype(a)), present)

    def batches():
        for indices in source.positions(source.epoch):
            parts = structures.map_leaves(lambda a: np.asarray(a[indices], dtype=dtype(a)), present)
            yield parts if len(parts) > 1 else parts[0]

    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature if len(present) > 1 else signature[0])
    # a batch is drawn when its step asks for it, not ahead: a synchronous rank that runs a step again after a
    # death draws its samples again, split over the new size; a dealt worker reads only what it was dealt
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def single_target(y):
    """The one array of `y` that `class_weight` weighs; Keras takes class_weight for a model of one output only."""
    leaves = structures.flatten(y)
    if len(leaves) != 1:
        raise OptionError(f"class_weight weighs the classes of one output, and y is {structures.describe(y)}: give "
                          "each output's weights as sample_weight (a dict or list like y), as Keras asks too.")
    return leaves[0]


def epoch_follower(source):
    """A callback that tells `source` which epoch Keras begins (before its pipeline is read): it opens it.

    It also takes back the optimizer step Keras counts when a pipeline of unknown length runs out: the call that
    finds no batch has already incremented `optimizer.iterations` (nothing orders that update after the read
    that fails), which a local `fit` on arrays never does, and Adam's bias correction reads it."""
    import keras

    class FollowEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if hasattr(source, "open"):
                source.open(epoch)
            source.epoch = epoch
            self.counted = self._iterations()  # plus one a step (counted here: no read of the variable a step)

        def on_train_batch_end(self, batch, logs=None):
            if self.counted is not None:
                self.counted += 1

        def on_epoch_end(self, epoch, logs=None):
            if self.counted is not None and self._iterations() == self.counted + 1:
                self.model.optimizer.iterations.assign(self.counted)

        def _iterations(self):
            iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
            return None if iterations is None else int(iterations.numpy())

    return FollowEpoch()


@contextlib.contextmanager
def epochs_of_any_length():
    """Within, Keras runs each epoch of a pipeline of unknown length until its batches end, as the first:
    Keras would otherwise cap every later epoch at the first one's count, and warn that the data ran out."""
    from keras.src.trainers import epoch_iterator as module

    original = module.EpochIterator.catch_stop_iteration

    @contextlib.contextmanager
    def catch(self):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            with original(self):
                yield
        if self.steps_per_epoch is None and self.data_adapter.num_batches is None:
            self._num_batches = None

    module.EpochIterator.catch_stop_iteration = catch
    try:
        yield
    finally:
        module.EpochIterator.catch_stop_iteration = original
