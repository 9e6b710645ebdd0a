"""Horovod's core ops as nbdist's synchronous strategies use them (Keras 3 safe: no `horovod.keras`).

Gradients averaged in one fused, fixed-name group; starting weights broadcast from rank 0;
epoch-end logs averaged; the learning rate scaled by the number of ranks; what rank 0's
BackupAndRestore restored handed to every rank.
"""

from __future__ import annotations


def broadcast_from_rank0(hvd, variables) -> None:
    """Every rank starts from rank 0's weights and optimizer state."""
    import tensorflow as tf

    for i, variable in enumerate(variables):
        variable.assign(hvd.broadcast(tf.convert_to_tensor(variable), root_rank=0, name=f"nbdist_init_{i}"))


def broadcast_model(hvd, model, optimizer=None) -> None:
    """Every rank starts from rank 0's model variables and its optimizer's state (`optimizer`, default the model's).
    The ranks agree first on whether the optimizer is built: where it is built on any rank (Keras' unpickling builds
    it, a recompile does not), each rank builds its own and takes rank 0's state; otherwise (fresh, or stepped by
    nothing: a GAN's default RMSprop) none of its variables travel. One rank building it in its first traced step
    while another has it already left their collectives unmatched (both waited for ever)."""
    optimizer = optimizer or model.optimizer
    built = any(hvd.allgather_object(bool(optimizer.built), name="nbdist_optimizer_built"))
    if built and not optimizer.built:
        optimizer.build(model.trainable_variables)
    broadcast_from_rank0(hvd, list(model.variables) + (list(optimizer.variables) if built else []))


def allreduced(hvd, apply_gradients, compression: str | None, controls=None, weight: float = 1.0,
               name: str = "nbdist_gradients"):
    """`optimizer.apply_gradients` that first averages the gradients over all ranks (`averaged`)."""
    import tensorflow as tf

    def apply(grads_and_vars):
        pairs = list(grads_and_vars)
        grads = averaged(hvd, [g for g, _ in pairs], compression, controls, weight, name)
        # nothing of the update, the optimizer's step count included, runs unless the allreduce completed:
        # a step that fails there (a dead rank) leaves this rank exactly at the last completed step
        with tf.control_dependencies([g for g in grads if g is not None]):
            return apply_gradients(zip(grads, [v for _, v in pairs]))

    return apply


def averaged(hvd, grads: list, compression: str | None, controls=None, weight: float = 1.0,
             name: str = "nbdist_gradients") -> list:
    """`grads` averaged over all ranks in one fused group (None stays None); `weight` multiplies this rank's
    gradients first (`hfdt --balance auto`: N b_rank / B).

    With `StepControls`, each rank's view of the run's controls travels in the same group (read from a
    variable: no Python in the step) and the agreement is kept for after the call, so every rank pauses or
    stops at the same step (a rank that stopped alone would leave the others waiting in the next allreduce).
    """
    import tensorflow as tf

    compressor = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in present]  # IndexedSlices -> dense
    if weight != 1.0:
        dense = [g * tf.cast(weight, g.dtype) for g in dense]
    if controls is not None:
        dense.append(controls.seen.read_value())
    # A fixed name: Horovod matches tensors across ranks by name, and the default (from
    # layer names such as dense_3) differs on an engine that built other models before.
    reduced = hvd.grouped_allreduce(dense, op=hvd.Average, compression=compressor, name=name) if dense else []
    if controls is not None:
        controls.agreed.assign(reduced.pop())
    out = list(grads)
    for i, g in zip(present, reduced):
        out[i] = g
    return out


def ring_allreduce_bytes(workers: int, nbytes: int) -> int:
    """Bytes each rank sends in one ring allreduce of `nbytes` (it receives as many): 2(N-1)/N of them."""
    return int(2 * (workers - 1) / workers * nbytes) if workers > 1 else 0


def epoch_log_averager(hvd, weight: float = 1.0):
    """Averages every epoch-end metric (train and validation) over ranks, before History records it;
    each rank's logs count `weight` (its batch, under `--balance auto`).

    Rank 0's metric names are the ones averaged (a rank whose model was compiled at another time may
    log a stale extra metric; it is left out, and a rank missing one does not count for it)."""
    import keras
    import numpy as np
    import tensorflow as tf

    class EpochLogAverager(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            mine = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float, np.floating))}
            keys = hvd.broadcast_object(sorted(mine), root_rank=0, name=f"nbdist_epoch_keys_{epoch}")
            if not keys:
                return
            values = [weight * mine.get(k, 0.0) for k in keys] + [weight * float(k in mine) for k in keys]
            sums = hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum,
                                 name=f"nbdist_epoch_logs_{epoch}").numpy()
            counts = sums[len(keys):]
            logs.update({k: float(sums[i] / counts[i]) for i, k in enumerate(keys) if counts[i] > 0})

    return EpochLogAverager()


def lr_scaler(optimizer, factor: int, warmup_epochs: float):
    """Linear scaling (lr x workers), ramped up over `warmup_epochs` (Goyal et al. 2017); the user's own
    learning rate (a constant or a schedule) is back in place at the end."""
    import keras

    from ..keras_semantics.learning_rate import scaled, schedule_of

    class LearningRateScaler(keras.callbacks.Callback):
        fused_steps_safe = warmup_epochs <= 0  # its batch hook only ramps a warm-up

        def on_train_begin(self, logs=None):
            self.schedule = schedule_of(optimizer)
            self.epoch = 0
            if self.schedule is not None:  # the schedule itself is scaled, its warm-up counted in steps
                steps = (self.params or {}).get("steps") or 1
                self.warmup = int(round(warmup_epochs * steps)), int(optimizer.iterations.numpy())
                optimizer.learning_rate = scaled(self.schedule, factor, *self.warmup)
            else:
                self.base = float(optimizer.learning_rate)
                self._set(0, 0)

        def rescale(self, workers: int) -> None:
            """The job now has `workers` ranks (an elastic hfdt run lost some): scale by that from here on."""
            nonlocal factor
            factor = workers
            if self.schedule is not None:
                optimizer.learning_rate = scaled(self.schedule, factor, *self.warmup)
            else:
                self._set(self.epoch, 0)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            if self.schedule is None:
                self._set(epoch, 0)

        def on_train_batch_begin(self, batch, logs=None):
            if self.schedule is None and warmup_epochs > 0 and self.epoch < warmup_epochs:
                self._set(self.epoch, batch)

        def on_train_end(self, logs=None):
            optimizer.learning_rate = self.schedule if self.schedule is not None else self.base

        def _set(self, epoch, batch):
            steps = (self.params or {}).get("steps") or 1
            progress = 1.0 if warmup_epochs <= 0 else min(1.0, (epoch + batch / steps) / warmup_epochs)
            optimizer.learning_rate = self.base * (1 + (factor - 1) * progress)

    return LearningRateScaler()


def rank0_restore(hvd, model):
    """BackupAndRestore runs on rank 0 only (it writes files): what it restored at the start, the weights,
    optimizer state and the epoch to resume from, goes to every rank, so all ranks make the same steps."""
    import keras
    import tensorflow as tf

    class RankZeroRestore(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            broadcast_model(hvd, model)
            # Keras resumes from the private `_initial_epoch` that BackupAndRestore sets
            epoch = hvd.broadcast(tf.constant(int(model._initial_epoch or 0), tf.int64), root_rank=0,
                                  name="nbdist_initial_epoch")
            model._initial_epoch = int(epoch.numpy()) or None

    return RankZeroRestore()
