"""`profile`: measure each engine on the cell's own model and data, train nothing (what `--strategy auto` plans from).

Every worker times gradient steps of the cell's model at its batch and twice it (the fastest of
each: compute and fixed cost apart, as ASHL's profile) and reports that line with the cell's
samples, batch, model bytes and optimizer; the model's weights are left as they were.
"""

from __future__ import annotations

import numpy as np

from .base import Strategy, Worker


class ProfileWorker(Worker):
    """Times the cell's step on this engine and returns an empty History."""

    def fit(self, request):
        import keras

        from ..keras_bridge import build_for_training
        from ..sharding import dataset_batch, is_dataset
        from ..virtual_clock import measure_step_cost

        x, y = request.x, request.y
        batch = dataset_batch(x) if is_dataset(x) else request.samples_per_step or 32
        build_for_training(request.model, x if not is_dataset(x) else next(iter(x))[0])
        step = measure_step_cost(request.model, {"x": x, "y": y}, batch)
        arrays = isinstance(x, np.ndarray)
        samples = len(x) if arrays else _dataset_samples(x, batch)
        self.fit_timings["plan_profile"] = {
            "step": step.to_json(), "batch": batch, "samples": samples, "arrays": arrays,
            "model_bytes": int(sum(np.asarray(v).nbytes for v in request.model.trainable_variables)),
            "optimizer": type(request.model.optimizer).__name__}
        history = keras.callbacks.History()
        history.set_model(request.model)
        history.history, history.epoch = {}, []
        return history


def _dataset_samples(dataset, batch: int) -> int | None:
    """Samples an epoch of a batched tf.data pipeline holds, when its length is known."""
    cardinality = int(dataset.cardinality())
    return cardinality * batch if cardinality > 0 else None


class ProfileStrategy(Strategy):
    """Measure every engine's step on the cell's model; train nothing. Not in the registry: the planner runs
    it (`nbdist.planner.measure`), and its result never reaches the notebook's model."""

    name = "profile"
    summary = "measure each engine's step time on the cell's model and data, train nothing (what --strategy auto plans from)"
    worker_class = ProfileWorker
