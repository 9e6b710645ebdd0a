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

from ...datasets import structures
from ...keras_semantics.empty_weights import variable_bytes
from . import schedule as schedules
from .replicas import METRICS, RGRAD, Position, summed
from .streams import packed, skeleton

ACT, GRAD, LOGS, BATCH, SAVE = "act", "grad", "logs", "batch", "save"
COMPILED_STEP_BYTES = 64 << 20  # a stage's trainable bytes up to which its optimizer step is compiled


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
    """`data` (an array, or a nest of arrays: `structures`) at `indices`, as TensorFlow tensors."""
    import tensorflow as tf

    return structures.map_leaves(lambda leaf: tf.convert_to_tensor(structures.rows(leaf)[indices]), data)


def stage_model(part, position: Position, links, plan: dict, arrays: dict):
    """The Keras model of the stage at `position`: `part` (a callable Keras model or layer chain) with
    the pipeline's train and test steps (`StageSteps`). `arrays` holds what this stage reads: x
    (first), y and sample weights (last), for "train" and "val"."""
    import keras

    class Stage(keras.Model):
        def __init__(self):
            super().__init__(name=f"pipeline_stage_{position.stage}")
            self.part = part
            self.steps = StageSteps(position, links, plan, arrays)
            self.checkpoint = None  # writes this stage's shard of a checkpoint (set by the worker)
            self.whole_checkpoint = None  # takes part in a whole-model save (set by the worker)

        def call(self, inputs, training=False):
            return self.part(inputs, training=training)

        def get_metrics_result(self):  # what every stage and replica agreed for the last step
            return dict(self.steps.latest_logs)

        def own_metrics_result(self):
            return keras.Model.get_metrics_result(self)

        def train_step(self, data):
            return self.steps.train(self, data)

        def test_step(self, data):
            return self.steps.test(self, data)

        def save_weights(self, filepath, overwrite=True, max_shard_size=None):
            """A ModelCheckpoint's save: this stage's shard of the whole model's sharded checkpoint."""
            if self.checkpoint is not None:
                self.checkpoint(filepath)

        def save(self, filepath, overwrite=True, **kwargs):
            """A ModelCheckpoint's whole-model save: every stage's part relayed to the last, which writes it."""
            if self.whole_checkpoint is not None:
                self.whole_checkpoint(filepath)

    return Stage()


class StageSteps:
    """A stage's train and test steps: the schedule over micro-batches, the exchange with its
    neighbours and replicas, and the agreed logs. `busy_s` and `step_s` add up its compute and its
    train steps' time; `control` is the run's control point (set by the worker)."""

    def __init__(self, position: Position, links, plan: dict, arrays: dict):
        self.position, self.links, self.plan, self.arrays = position, links, plan, arrays
        self.step_id = 0
        self.latest_logs: dict = {}
        self.busy_s = self.step_s = 0.0
        self.control = None
        self._functions: dict = {}

    def _micro_batches(self, data, split: str):
        self.step_id += 1
        indices, source = self._batch(data, split)
        own = self.position.share(indices)
        return indices, own, np.array_split(own, min(self.plan["microbatches"], len(own))), source

    def _batch(self, data, split: str):
        """The step's sample indices and what this stage reads of them: from arrays, the same indices on every
        stage; from a stream (`streams`), the batch the first stage read, its size, targets and sample weights
        handed down the pipeline before any activation."""
        arrays = self.arrays[split]
        if arrays is None or not arrays.get("streamed"):
            return _indices(data), arrays
        position = self.position
        if position.first:
            batch = arrays["stream"].next_batch()
            n = structures.length(batch["x"])
            labels = {"y": batch["y"], "sample_weight": batch["sample_weight"]}
        else:
            message = self.links.receive(BATCH, self.step_id, 0, position.up)
            n = int(message.header["n"])
            labels = packed(message.header["shape"], [message.arrays[f"l{j}"] for j in range(len(message.arrays))])
            batch = {"x": None, **labels}
        if not position.last:
            self.links.send(position.down, BATCH, self.step_id, 0, arrays={
                f"l{j}": np.asarray(leaf) for j, leaf in enumerate(structures.flatten(labels))}, n=n, shape=skeleton(labels))
        return np.arange(n), batch

    def train(self, model, data):
        import tensorflow as tf

        started = time.perf_counter()
        indices, own, micro, source = self._micro_batches(data, "train")
        step, held, loss = self.step_id, {}, 0.0
        grads = [None] * len(model.trainable_weights)  # (no zeros held: a stage's memory is its weights' few times)
        for kind, m in schedules.make(self.plan["schedule"], self.position.stage, self.position.stages, len(micro)):
            if kind == schedules.FORWARD:  # a micro-batch's loss weight is its share of the whole batch
                held[m], reported = self._forward(model, step, m, micro[m], len(micro[m]) / len(indices),
                                                  source, training=True)
                loss += reported
            else:
                micro_grads = self._backward(model, step, m, held.pop(m))
                t0 = time.perf_counter()
                for i, mg in enumerate(micro_grads):  # one variable at a time: the sum never held twice
                    if mg is not None:  # (an embedding's IndexedSlices made dense, as a sum of them must be)
                        mg = tf.convert_to_tensor(mg)
                        grads[i] = mg if grads[i] is None else grads[i] + mg
                    micro_grads[i] = None
                self.busy_s += time.perf_counter() - t0
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, model.trainable_weights)]
        if self.position.replicas > 1:  # every replica applies the sum of all replicas' gradients
            grads = [tf.convert_to_tensor(g) for g in summed(self.position, self.links, RGRAD, step,
                                                               [np.asarray(g) for g in grads])]
        t0 = time.perf_counter()
        if model.trainable_weights:
            self._apply(model)(grads)
        self.busy_s += time.perf_counter() - t0
        self.step_s += time.perf_counter() - started
        return self._finish(model, step, len(own), len(indices), loss)

    def _apply(self, model):
        """The optimizer's step: one TensorFlow function (as in Keras' own train function) where the stage's
        variables are small and an eager op per variable and slot costs more than the update; eager, one variable
        after the other, where they are large (`COMPILED_STEP_BYTES`): a compiled step may run several variables'
        updates at once and hold their temporaries together, and memory is what a stage is there to spare."""
        import tensorflow as tf

        if "apply" not in self._functions:
            variables = list(model.trainable_weights)

            def apply(grads):
                return model.optimizer.apply_gradients(zip(grads, variables))

            small = sum(variable_bytes(v) for v in variables) <= COMPILED_STEP_BYTES
            self._functions["apply"] = tf.function(apply) if small else apply
        return self._functions["apply"]

    def test(self, model, data):
        indices, own, micro, source = self._micro_batches(data, "val")
        loss = sum(self._forward(model, self.step_id, m, part, len(part) / len(indices), source,
                                 training=False)[1] for m, part in enumerate(micro))
        return self._finish(model, self.step_id, len(own), len(indices), loss)

    def _forward(self, model, step, m, part_indices, weight, source, training):
        """One micro-batch forward; returns what its backward needs and, on the last stage, the
        micro-batch's share of the loss (the stages before send their regularization losses on)."""
        import tensorflow as tf

        position, t0 = self.position, time.perf_counter()
        if position.first:
            x, carried = gather(source["x"], part_indices), 0.0
        else:
            message = self.links.receive(ACT, step, m, position.up)
            t0 = time.perf_counter()
            x, carried = _tensors(message.arrays, "t"), float(message.header["reg"])
        with tf.GradientTape(watch_accessed_variables=training) as tape:
            if not position.first:
                tape.watch(differentiable(x))
            if position.last:
                labels = (gather(source["y"], part_indices), gather(source.get("sample_weight"), part_indices))
                y, loss = self._compiled(model, training, True)(x, *labels)
                target = loss * weight
            else:
                y, regularization = self._compiled(model, training, False)(x)
                target = regularization * weight if regularization is not None else None
        if not position.last:
            own = float(target) if target is not None else 0.0
            self.links.send(position.down, ACT, step, m, arrays=_arrays(y, "t"), reg=carried + own)
        if training:  # the busy fraction is of train steps
            self.busy_s += time.perf_counter() - t0
        return (tape, x, y, target), (float(target) + carried if position.last else 0.0)

    def _compiled(self, model, training: bool, last: bool):
        """The stage's forward as one TensorFlow function, traced once per micro-batch shape, as Keras' own
        train function holds a whole step: the last stage's returns (output, loss) and updates the compiled
        metrics, the others' (output, the sum of the layers' own losses or None). Under the step's tape the
        backward is one function too: a micro-batch costs two calls, not an eager op per layer and gradient."""
        import tensorflow as tf

        key = (training, last)
        if key not in self._functions:
            def forward(x):
                y = model(x, training=training)
                return y, (tf.add_n(model.losses) if model.losses else None)

            def forward_to_loss(x, y, sample_weight):
                y_pred = model(x, training=training)
                if model._compile_metrics is not None:
                    model._compile_metrics.update_state(y, y_pred, sample_weight)
                return y_pred, model._compute_loss(x=None, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                                   training=training)

            self._functions[key] = tf.function(forward_to_loss if last else forward, reduce_retracing=True)
        return self._functions[key]

    def _backward(self, model, step, m, held):
        import tensorflow as tf

        tape, x, y, target = held
        position = self.position
        if not position.last:
            outputs = differentiable(y)  # (the tensors crossing the next cut that a gradient flows back through)
            message = self.links.receive(GRAD, step, m, position.down)
            output_gradients = _tensors(message.arrays, "g", listed=True)
        t0 = time.perf_counter()
        inputs = [] if position.first else differentiable(x)
        sources = list(model.trainable_weights) + inputs
        if position.last:
            targets, seeds = [target], None
        else:
            targets, seeds = outputs, output_gradients
            if target is not None:
                targets, seeds = targets + [target], seeds + [tf.ones_like(target)]
        grads = tape.gradient(targets, sources, output_gradients=seeds) if sources and targets else [None] * len(sources)
        if not position.first:
            given = grads[len(grads) - len(inputs):]
            self.links.send(position.up, GRAD, step, m, arrays=_arrays(
                [tf.zeros_like(t) if g is None else g for g, t in zip(given, inputs)], "g"))
            grads = grads[:len(grads) - len(inputs)]
        self.busy_s += time.perf_counter() - t0
        return grads

    def _finish(self, model, step, own_samples, samples, loss):
        """The last stage's logs and the control flags agreed for this step, on every stage."""
        position = self.position
        if position.last:
            # this replica's mean over its own samples of the whole batch's loss terms
            model._loss_tracker.update_state(loss * samples / own_samples, sample_weight=own_samples)
            flags = self.control.flags() if self.control is not None else np.zeros(2, np.float32)
            logs, flags = self._agreed_logs(model, step, flags)
        else:
            message = self.links.receive(LOGS, step, 0, position.down)
            logs, flags = dict(message.header["logs"]), np.asarray(message.header["flags"], np.float32)
        if not position.first:
            self.links.send(position.up, LOGS, step, 0, logs=logs, flags=[float(f) for f in flags])
        if self.control is not None:
            self.control.act(flags)
        self.latest_logs = logs
        return logs

    def _agreed_logs(self, model, step, flags):
        """The whole batch's logs: the last stages' metric states summed over the replicas (every
        replica the same numbers), and the control flags any replica saw."""
        if self.position.replicas == 1:
            return {k: float(v) for k, v in model.own_metrics_result().items()}, flags
        variables = list(model.metrics_variables)
        own = [np.asarray(v.numpy()) for v in variables]
        total = summed(self.position, self.links, METRICS, step, own + [np.asarray(flags, np.float32)])
        for variable, value in zip(variables, total):
            variable.assign(value)
        logs = {k: float(v) for k, v in model.own_metrics_result().items()}
        for variable, value in zip(variables, own):
            variable.assign(value)
        return logs, total[-1]


def _arrays(tensors, prefix: str) -> dict:
    """The tensors crossing a cut (one, or a list in the chain's order) as a message's arrays: prefix0, prefix1..."""
    listed = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    return {f"{prefix}{j}": np.asarray(t) for j, t in enumerate(listed)}


def _tensors(arrays: dict, prefix: str, listed: bool = False):
    """A message's arrays back as tensors, in order: one tensor alone (unless `listed`), else a list."""
    import tensorflow as tf

    tensors = [tf.convert_to_tensor(np.array(arrays[f"{prefix}{j}"])) for j in range(len(arrays))]
    return tensors[0] if len(tensors) == 1 and not listed else tensors


def differentiable(tensors) -> list:
    """The floating-point ones among the tensors crossing a cut (an integer mask carries no gradient)."""
    listed = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    return [t for t in listed if t.dtype.is_floating]


def _indices(data) -> np.ndarray:
    while isinstance(data, (tuple, list)):
        data = data[0]
    return np.asarray(data)
