"""`virtual-workers`: N workers of a data-parallel strategy emulated on one engine (the planner's accuracy past
the cluster, `%dist plan --workers`).

One engine computes every virtual worker's gradients in turn with the cell's model, and the
parameter server's own update rules (`ps.updaters`: the cell's optimizer, or a delay-compensated
preset) apply them in the order the virtual clock gives: an asynchronous push arrives after its
worker's step and exchange, each worker computing on the weights it last received (so staleness is
what N workers of those speeds produce); a synchronous step averages N batches' gradients at the same
weights. Batches are dealt to whoever is free, one seeded permutation an epoch. Nothing travels:
no wire, no PS process; the accuracy after each epoch is what the History reports.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..datasets import structures
from ..errors import OptionError
from ..datasets.structures import take
from .base import Strategy, Worker

MEMORY_BYTES = 4 << 30  # the most the virtual workers' received weights may hold on the engine


class VirtualWorkersWorker(Worker):
    """Emulates `values["emulate"]` on this engine and returns a History of the accuracy after each epoch."""

    def fit(self, request):
        import keras

        from ..keras_semantics.keras_bridge import build_for_training
        from ..ps import rules

        emulate = self.values["emulate"]
        if not all(isinstance(a, np.ndarray) for a in structures.flatten(request.x)):
            raise OptionError("the planner's accuracy past the cluster needs the cell to fit one numpy array of inputs "
                              "or a list or dict of them (not a tf.data pipeline, a PyDataset or a generator)")
        validation = _validation(request)  # a validation_split's samples leave the training arrays
        x, y, model = request.x, request.y, request.model
        build_for_training(model, x)
        spec = rules.spec_from_keras(model.optimizer)
        if emulate.get("momentum") is not None:
            from dataclasses import replace

            spec = replace(spec, momentum=float(emulate["momentum"]))
        trainer = Emulator(model, spec, emulate, int(request.batch_size or 32), self.spec.get("seed") or 0)
        accuracy = []
        for _ in range(int(request.epochs) - int(request.initial_epoch or 0)):
            trainer.epoch(x, y)
            accuracy.append(trainer.accuracy(*(validation or (x, y))))
        self.fit_timings["virtual_workers"] = {"staleness_mean": trainer.staleness_mean(),
                                               "pushes": len(trainer.taus), "dropped": trainer.dropped}
        history = keras.callbacks.History()
        history.set_model(model)
        history.history = {"val_accuracy" if validation else "accuracy": accuracy}
        history.epoch = list(range(len(accuracy)))
        return history


def _validation(request):
    data = request.args.get("validation_data")
    if isinstance(data, (tuple, list)) and len(data) >= 2:  # Keras' (x, y[, w]), each part any nest
        return data[0], data[1]
    if request.args.get("validation_split"):
        from ..datasets.sharding import split_validation

        (x, y), validation = split_validation(request.x, request.y, request.validation_split)
        request.args.update(x=x, y=y)
        return validation
    return None


class Emulator:
    """The weights of a run of `emulate["workers"]` workers, trained an epoch at a time.

    `emulate`: {"workers": N, "seconds": each worker's seconds from one push to the next (step and exchange),
    "synchronous": bool, "rule": the PS's rule (None: the cell's optimizer), "lr_scale": the learning rate's
    factor (hfdt's linear scaling), "warmup_epochs": over which that factor ramps up from 1}.
    """

    def __init__(self, model, spec, emulate: dict, batch: int, seed: int):
        from ..ps.updaters import make_updater

        self.model, self.batch = model, batch
        self.variables = list(model.trainable_variables)
        self.names = [v.path for v in self.variables]
        self.weights = {n: np.array(v.numpy()) for n, v in zip(self.names, self.variables)}
        self.workers, self.seconds = int(emulate["workers"]), [float(s) for s in emulate["seconds"]]
        self.synchronous, self.lr_scale = bool(emulate.get("synchronous")), float(emulate.get("lr_scale") or 1.0)
        self.warmup_epochs, self.epochs_done = float(emulate.get("warmup_epochs") or 0.0), 0
        iterations = int(model.optimizer.iterations.numpy())
        self.updater = make_updater(emulate.get("rule"), spec, self.weights, {}, iterations)
        self.rng = np.random.default_rng(seed)
        self.version, self.dropped, self.taus = 0, 0, []
        if not self.synchronous:
            held = self.workers * sum(w.nbytes for w in self.weights.values())
            if held > MEMORY_BYTES:
                raise OptionError(f"{self.workers} virtual workers' weights need {held / 2**30:.1f} GiB on one "
                                  f"engine (at most {MEMORY_BYTES / 2**30:.0f}); plan fewer workers")
            self.received = [{n: w.copy() for n, w in self.weights.items()} for _ in range(self.workers)]
            self.received_version = [0] * self.workers
            for k, weights in enumerate(self.received):
                self.updater.sent(k, weights)
            self.arrivals = [(self.seconds[k], k) for k in range(self.workers)]
            heapq.heapify(self.arrivals)
        self._gradients = self._gradient_function()

    def _gradient_function(self):
        import tensorflow as tf

        model = self.model

        @tf.function
        def gradients(xb, yb):
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x=xb, y=yb, y_pred=model(xb, training=True))
            return tape.gradient(loss, model.trainable_variables)

        return gradients

    def gradient(self, weights: dict, x, y) -> dict[str, np.ndarray]:
        """The cell's loss gradient at `weights` on one batch."""
        for name, variable in zip(self.names, self.variables):
            variable.assign(weights[name])
        return {n: np.asarray(g) for n, g in zip(self.names, self._gradients(x, y))}

    def epoch(self, x, y) -> None:
        """One pass over the samples in a seeded order, a batch to each worker as it becomes free."""
        order = self.rng.permutation(structures.length(x))
        per_step = min(self.batch * (self.workers if self.synchronous else 1), len(order))
        starts = range(0, len(order) - per_step + 1, per_step)
        for step, start in enumerate(starts):
            index = np.sort(order[start:start + per_step])
            if self.synchronous:
                self._synchronous_step(take(x, index), take(y, index), self._scale(step / len(starts)))
            else:
                self._push(take(x, index), take(y, index))
        self.epochs_done += 1

    def _scale(self, into_epoch: float) -> float:
        """The learning rate's factor now: hfdt's linear scaling, ramped over its warm-up epochs (as
        `horovod_ops.lr_scaler`)."""
        if self.warmup_epochs <= 0:
            return self.lr_scale
        progress = min(1.0, (self.epochs_done + into_epoch) / self.warmup_epochs)
        return 1 + (self.lr_scale - 1) * progress

    def _synchronous_step(self, x, y, lr_scale: float) -> None:
        parts = [self.gradient(self.weights, take(x, slice(i, i + self.batch)), take(y, slice(i, i + self.batch)))
                 for i in range(0, structures.length(x), self.batch)]
        mean = {n: sum(p[n] for p in parts) / len(parts) for n in self.names}
        self.updater.apply(self.weights, mean, 0, 0, self.version, lr_scale)
        self.version += 1

    def _push(self, x, y) -> None:
        """The earliest arrival: its gradient on the weights it received, applied at once, answered with the
        weights now."""
        arrival, k = heapq.heappop(self.arrivals)
        grads = self.gradient(self.received[k], x, y)
        tau = self.version - self.received_version[k]
        self.taus.append(tau)
        outcome = self.updater.apply(self.weights, grads, k, tau, self.version, self.lr_scale)["outcome"]
        if outcome == "applied":
            self.version += 1
        else:
            self.dropped += 1
        for name, value in self.weights.items():
            np.copyto(self.received[k][name], value)
        self.received_version[k] = self.version
        self.updater.sent(k, self.received[k])
        heapq.heappush(self.arrivals, (arrival + self.seconds[k], k))

    def accuracy(self, x, y) -> float:
        """The cell's compiled accuracy of the current weights on (x, y)."""
        for name, variable in zip(self.names, self.variables):
            variable.assign(self.weights[name])
        scores = self.model.evaluate(x, y, batch_size=max(self.batch, 256), verbose=0, return_dict=True)
        found = next((v for k, v in scores.items() if k.endswith("accuracy")), None)
        if found is None:
            raise OptionError("the planner compares strategies by accuracy: compile the cell's model with "
                              "metrics=['accuracy']")
        return float(found)

    def staleness_mean(self) -> float | None:
        return float(np.mean(self.taus)) if self.taus else None


class VirtualWorkersStrategy(Strategy):
    """N workers of a strategy emulated on one engine. Not in the registry: the planner runs it
    (`planner.short_runs.scaled_curves`), and its result never reaches the notebook's model."""

    name = "virtual-workers"
    summary = "N workers of a data-parallel strategy emulated on one engine (the planner's accuracy past the cluster)"
    worker_class = VirtualWorkersWorker
    max_workers = 1
    default_workers = 1
