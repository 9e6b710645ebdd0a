"""`profile`: measure each engine on the cell's own model and data, train nothing (what `--strategy auto` plans from).

Every worker times gradient steps of the cell's model at its batch and twice it (the fastest of
each: compute and fixed cost apart, as ASHL's profile) and reports that line with the cell's
samples, batch, model bytes and optimizer; the model's weights are left as they were.
"""

from __future__ import annotations

import numpy as np

from ..datasets import structures
from .base import Strategy, Worker


class ProfileWorker(Worker):
    """Times the cell's step on this engine and returns an empty History."""

    def fit(self, request):
        import keras

        from ..keras_semantics.keras_bridge import build_for_training
        from .virtual_clock import measure_step_cost

        x, y = request.x, request.y
        samples, batch = epoch_of(x, request.samples_per_step)
        build_for_training(request.model, x)
        step = measure_step_cost(request.model, {"x": x, "y": y}, batch)
        arrays = all(isinstance(a, np.ndarray) for a in structures.flatten(x))  # an array, or a nest of them
        self.fit_timings["plan_profile"] = {
            "step": step.to_json(), "batch": batch, "samples": samples, "arrays": arrays,
            "model_bytes": int(sum(np.asarray(v).nbytes for v in request.model.trainable_variables)),
            "optimizer": type(request.model.optimizer).__name__}
        history = keras.callbacks.History()
        history.set_model(request.model)
        history.history, history.epoch = {}, []
        return history


def epoch_of(x, batch: int | None) -> tuple[int | None, int]:
    """(samples an epoch holds, or None where unknown; the batch) of the fit's `x`: numpy arrays at the cell's
    batch, a batched tf.data pipeline or a PyDataset at their first element's."""
    from ..errors import OptionError
    from ..datasets.sharding import dataset_batch, is_dataset, is_generator, is_py_dataset

    if is_dataset(x):
        batch, batches = dataset_batch(x), int(x.cardinality())
        return (batches * batch if batches > 0 else None), batch
    if is_py_dataset(x):
        batch = dataset_batch(x)
        return len(x) * batch, batch  # a PyDataset's length is its batches
    if is_generator(x):
        raise OptionError("--strategy auto measures the cell's step on numpy arrays, a tf.data pipeline or a "
                          "PyDataset; this cell fits a generator. Give fit one of those, or choose a strategy "
                          "(README's table).")
    return structures.length(x), batch or 32


class ProfileStrategy(Strategy):
    """Measure every engine's step on the cell's model; train nothing. Not in the registry: the planner runs
    it (`nbdist.planner.auto`), and its result never reaches the notebook's model."""

    name = "profile"
    summary = ("measure each engine's step time on the cell's model and data, train nothing (what --strategy auto "
               "plans from)")
    worker_class = ProfileWorker
