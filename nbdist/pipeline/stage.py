"""One pipeline stage: its part of the model as a Keras model whose train step runs the schedule.

Keras' own `fit` runs on every stage, over the same batches of sample indices (`IndexBatches`):
the first stage gathers the inputs of a batch, the last its labels. A train step cuts the
batch into micro-batches and runs the stage's schedule: a forward receives the activation from
the stage before (or reads the inputs) and sends its output on; a backward receives the
output's gradient from the stage after (or takes the loss), sends the input's gradient back,
and adds the variables' gradients up. Once per batch the stage's optimizer applies the sum,
so without Dropout and BatchNormalization the result is one engine's step on the whole batch.
The last stage then sends its logs and the run's control flags back up the pipeline, so every
stage's callbacks see the same logs and every stage pauses or stops at the same step.
"""

from __future__ import annotations

import time

import numpy as np

from . import schedule as schedules
from .replicas import METRICS, RGRAD, Position, summed

ACT, GRAD, LOGS = "act", "grad", "logs"


def index_batches(n: int, batch: int, shuffle: bool, seed: int, endless: bool = False):
    """A `keras.utils.PyDataset` of sample-index batches, the same on every stage; with `shuffle` a new
    seeded order for each pass over the data.

    `endless` (the cell gave steps_per_epoch): one stream of passes that epochs take their steps from,
    as Keras' own iterator over arrays does (an epoch does not restart the data).
    """
    import keras

    class IndexBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.passes = 0
            self.order = self._order(0)

        @staticmethod
        def _order(passes: int):
            if not shuffle:
                return np.arange(n, dtype=np.int64)
            return np.random.default_rng([seed, passes]).permutation(n).astype(np.int64)

        @property
        def num_batches(self):
            return None if endless else len(self)

        def __len__(self):
            return -(-n // batch)

        def __getitem__(self, i):
            if endless:  # Keras counts i on across epochs (after peeking at the first batches)
                passes, i = divmod(i, len(self))
                if passes != self.passes:
                    self.passes, self.order = passes, self._order(passes)
            return self.order[i * batch:(i + 1) * batch]

        def on_epoch_end(self):
            if not endless:
                self.passes += 1
                self.order = self._order(self.passes)

    return IndexBatches()


def gather(data, indices):
    """`data` (an array, or a list or dict of arrays) at `indices`, as TensorFlow tensors."""
    import tensorflow as tf

    if data is None:
        return None
    if isinstance(data, dict):
        return {k: tf.convert_to_tensor(v[indices]) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [tf.convert_to_tensor(v[indices]) for v in data]
    return tf.convert_to_tensor(data[indices])


def stage_model(part, position: Position, links, plan: dict, arrays: dict):
    """The Keras model of the stage at `position`: `part` (a callable Keras model or layer chain) with
    the pipeline's train and test steps. `arrays` holds what this stage reads: x (first), y and
    sample weights (last), for "train" and "val"."""
    import keras
    import tensorflow as tf

    stage, stages = position.stage, position.stages
    first, last = position.first, position.last

    class Stage(keras.Model):
        def __init__(self):
            super().__init__(name=f"pipeline_stage_{stage}")
            self.part = part
            self.step_id = 0
            self.latest_logs: dict = {}
            self.busy_s = 0.0
            self.step_s = 0.0
            self.control = None  # the run's control point, set by the worker

        def call(self, inputs, training=False):
            return self.part(inputs, training=training)

        def get_metrics_result(self):  # what every stage and replica agreed for the last step
            return dict(self.latest_logs)

        # --- one train step: the schedule over M micro-batches ------------------------------
        def train_step(self, data):
            started = time.perf_counter()
            indices = _indices(data)
            own = position.share(indices)
            micro = np.array_split(own, min(plan["microbatches"], len(own)))
            weights = [len(m) / len(indices) for m in micro]  # shares of the whole batch: replicas' sums add up
            step, held = self._next_step(), {}
            grads = [tf.zeros_like(v) for v in self.trainable_weights]
            loss = 0.0
            for kind, m in schedules.make(plan["schedule"], stage, stages, len(micro)):
                if kind == schedules.FORWARD:
                    held[m], reported = self._forward(step, m, micro[m], weights[m], arrays["train"], training=True)
                    loss += reported
                else:
                    micro_grads = self._backward(step, m, held.pop(m))
                    t0 = time.perf_counter()
                    grads = [g if mg is None else g + mg for g, mg in zip(grads, micro_grads)]
                    self.busy_s += time.perf_counter() - t0
            if position.replicas > 1:  # every replica applies the sum of all replicas' gradients
                grads = [tf.convert_to_tensor(g) for g in summed(position, links, RGRAD, step,
                                                                   [np.asarray(g) for g in grads])]
            t0 = time.perf_counter()
            if self.trainable_weights:
                self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.busy_s += time.perf_counter() - t0
            self.step_s += time.perf_counter() - started
            return self._finish_step(step, len(own), len(indices), loss)

        def test_step(self, data):
            indices = _indices(data)
            own = position.share(indices)
            micro = np.array_split(own, min(plan["microbatches"], len(own)))
            step, loss = self._next_step(), 0.0
            for m, part_indices in enumerate(micro):
                loss += self._forward(step, m, part_indices, len(part_indices) / len(indices), arrays["val"],
                                      training=False)[1]
            return self._finish_step(step, len(own), len(indices), loss)

        def _next_step(self) -> int:
            self.step_id += 1
            return self.step_id

        def _forward(self, step, m, part_indices, weight, source, training):
            """One micro-batch forward; returns what its backward needs and, on the last stage, the
            micro-batch's share of the loss (the stages before send their regularization losses on)."""
            t0 = time.perf_counter()
            if first:
                x, carried = gather(source["x"], part_indices), 0.0
            else:
                message = links.receive(ACT, step, m, position.up)
                t0 = time.perf_counter()
                x, carried = tf.convert_to_tensor(np.array(message.arrays["t"])), float(message.header["reg"])
            with tf.GradientTape(watch_accessed_variables=training) as tape:
                if not first:
                    tape.watch(x)
                y = self(x, training=training)
                if last:
                    target = self._loss(source, part_indices, y, weight, training)
                else:
                    target = tf.add_n(self.losses) * weight if self.losses else None
            own = float(target) if (target is not None and not last) else 0.0
            if not last:
                links.send(position.down, ACT, step, m, np.asarray(y), reg=carried + own)
            if training:  # the busy fraction is of train steps
                self.busy_s += time.perf_counter() - t0
            return (tape, x, y, target), (float(target) + carried if last else 0.0)

        def _loss(self, source, part_indices, y_pred, weight, training):
            y = gather(source["y"], part_indices)
            sample_weight = gather(source.get("sample_weight"), part_indices)
            if self._compile_metrics is not None:
                self._compile_metrics.update_state(y, y_pred, sample_weight)
            loss = self._compute_loss(x=None, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
            return loss * weight

        def _backward(self, step, m, held):
            tape, x, y, target = held
            if last:
                output_gradient = None
            else:
                message = links.receive(GRAD, step, m, position.down)
                output_gradient = tf.convert_to_tensor(np.array(message.arrays["t"]))
            t0 = time.perf_counter()
            sources = list(self.trainable_weights) + ([] if first else [x])
            if last:
                targets, seeds = [target], None
            elif target is not None:
                targets, seeds = [y, target], [output_gradient, tf.ones_like(target)]
            else:
                targets, seeds = [y], [output_gradient]
            grads = tape.gradient(targets, sources, output_gradients=seeds) if sources else []
            if not first:
                links.send(position.up, GRAD, step, m, np.asarray(grads[-1]))
                grads = grads[:-1]
            self.busy_s += time.perf_counter() - t0
            return grads

        def _finish_step(self, step, own_samples, samples, loss):
            """The last stage's logs and the control flags agreed for this step, on every stage."""
            if last:
                # this replica's mean over its own samples of the whole batch's loss terms
                self._loss_tracker.update_state(loss * samples / own_samples, sample_weight=own_samples)
                flags = self.control.flags() if self.control is not None else np.zeros(2, np.float32)
                logs, flags = self._agreed_logs(step, flags)
            else:
                message = links.receive(LOGS, step, 0, position.down)
                logs, flags = dict(message.header["logs"]), np.asarray(message.header["flags"], np.float32)
            if not first:
                links.send(position.up, LOGS, step, 0, logs=logs, flags=[float(f) for f in flags])
            if self.control is not None:
                self.control.act(flags)
            self.latest_logs = logs
            return logs

        def _agreed_logs(self, step, flags):
            """The whole batch's logs: the last stages' metric states summed over the replicas (every
            replica the same numbers), and the control flags any replica saw."""
            if position.replicas == 1:
                return {k: float(v) for k, v in super().get_metrics_result().items()}, flags
            variables = list(self.metrics_variables)
            own = [np.asarray(v.numpy()) for v in variables]
            total = summed(position, links, METRICS, step, own + [np.asarray(flags, np.float32)])
            for variable, value in zip(variables, total):
                variable.assign(value)
            logs = {k: float(v) for k, v in super().get_metrics_result().items()}
            for variable, value in zip(variables, own):
                variable.assign(value)
            return logs, total[-1]

    return Stage()


def _indices(data) -> np.ndarray:
    while isinstance(data, (tuple, list)):
        data = data[0]
    return np.asarray(data)
