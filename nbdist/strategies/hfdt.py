"""`hfdt`: synchronous data parallel training with Horovod ring-allreduce (Keras 3 safe core ops).

Keras' own `fit` loop runs on every worker; only the optimizer's `apply_gradients` is
wrapped so gradients are averaged across ranks first (Horovod's DistributedOptimizer idea,
done with `grouped_allreduce` because `horovod.keras` does not work with Keras 3).
"""

from __future__ import annotations

import contextlib
import os

from ..errors import ClusterError
from ..hetero import Slowdown, parse_simulate
from ..keras_bridge import build_for_training
from ..rendezvous import Rendezvous, host_plan, rendezvous_address, require_horovod
from ..sharding import shard_fit_data
from .base import Strategy, Worker


class HfdtWorker(Worker):
    """One Horovod rank: shards the data, averages gradients and epoch metrics across ranks."""

    @property
    def slot(self) -> dict:
        return self.config["slots"][self.rank]

    def cell_context(self):
        """Each engine uses only the GPU of its local rank."""
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return contextlib.nullcontext()
        gpu = gpus[self.slot["local_rank"] % len(gpus)]
        try:
            tf.config.set_visible_devices(gpu, "GPU")
            tf.config.experimental.set_memory_growth(gpu, True)
            return contextlib.nullcontext()
        except RuntimeError:  # TensorFlow already initialised on this engine: place ops instead
            return tf.device(f"/GPU:{self.slot['local_rank'] % len(gpus)}")

    def fit(self, request):
        hvd = self._init_horovod()
        model, optimizer = request.model, request.model.optimizer
        original_apply = optimizer.apply_gradients
        try:
            data = shard_fit_data(request, self.rank, self.size, synchronous=True)
            build_for_training(model, data["x"])
            _broadcast_from_rank0(hvd, list(model.variables) + list(optimizer.variables))
            optimizer.apply_gradients = _allreduced(hvd, original_apply, self.options.get("compression"))
            model.jit_compile = False  # XLA cannot compile Horovod's ops
            model.train_function = None  # retrace with the allreduce in the step
            user = self.user_callbacks(request)
            restored = [_rank0_restore(hvd, model)] if any(type(c).__name__ == "BackupAndRestore" for c in user) else []
            callbacks = [_epoch_log_averager(hvd), *self._lr_callbacks(optimizer), *self._simulation(model),
                         *user, *restored, self.make_reporter(request.samples_per_step)]
            return request.run_plain(callbacks=callbacks, verbose=0, **data)
        finally:
            optimizer.apply_gradients = original_apply
            model.train_function = None
            hvd.shutdown()

    def _init_horovod(self):
        try:
            import horovod.tensorflow as hvd
        except ImportError as exc:
            raise ClusterError(f"Horovod is not installed on this engine ({exc}); run `make setup` on its host.")
        if hvd.is_initialized():
            hvd.shutdown()
        slot = self.slot
        require_resolvable(slot["hostname"])
        os.environ.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.config["address"],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.config["port"]),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": interface_towards(self.config["address"], self.config["port"]),
            "HOROVOD_HOSTNAME": slot["hostname"],
            "HOROVOD_RANK": str(slot["rank"]), "HOROVOD_SIZE": str(slot["size"]),
            "HOROVOD_LOCAL_RANK": str(slot["local_rank"]), "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
            "HOROVOD_CROSS_RANK": str(slot["cross_rank"]), "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
        })
        # A rank that waits this long for its peers is stuck, not slow: fail rather than hang.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "60")
        hvd.init()
        if (hvd.rank(), hvd.size()) != (self.rank, self.size):
            raise ClusterError(f"Horovod gave rank {hvd.rank()}/{hvd.size()}, expected {self.rank}/{self.size}")
        return hvd

    def _simulation(self, model) -> list:
        """`--simulate`: this rank's steps stretched by 1/speed, and its link charged for the allreduce's bytes."""
        profile = (self.config.get("simulate") or [None] * self.size)[self.rank]
        if not profile:
            return []
        import keras
        import numpy as np

        slowdown = Slowdown(profile)
        model_bytes = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.trainable_variables)
        # a ring allreduce sends and receives 2(N-1)/N of the gradient on every rank
        moved = int(2 * 2 * (self.size - 1) / self.size * model_bytes)

        class Simulated(keras.callbacks.Callback):  # not async_safe: its sleeps must hold the next step back
            def on_train_batch_end(self, batch, logs=None):
                slowdown.before_exchange()
                slowdown.after_exchange(moved)

        return [Simulated()] if slowdown.active else []

    def _lr_callbacks(self, optimizer) -> list:
        if self.options.get("scale_lr", "linear") == "none" or self.size == 1:
            return []
        return [_lr_scaler(optimizer, self.size, float(self.options.get("warmup_epochs") or 0))]


def require_resolvable(hostname: str) -> None:
    """Horovod's Gloo looks this host's name up and crashes the process when it cannot: say so first."""
    import socket

    try:
        socket.gethostbyname(hostname)
    except OSError:
        raise ClusterError(f"this engine's host name {hostname!r} does not resolve here, and Horovod (hfdt) needs "
                           "every host's name to resolve: add it to DNS or /etc/hosts on every host, or use a "
                           "parameter-server strategy (nfdt, ddc-asgd), which does not.") from None


def interface_towards(address: str, port: int) -> str:
    """The name of this host's network interface that carries traffic to `address`."""
    import socket

    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # a route lookup: sends nothing
        probe.connect((address, port))
        local_ip = probe.getsockname()[0]
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local_ip for a in addresses):
            return name
    if local_ip.startswith("127."):
        return "lo"
    raise ClusterError(f"no network interface holds {local_ip}, the address this engine uses to reach {address}")


def _broadcast_from_rank0(hvd, variables) -> None:
    """Every rank starts from rank 0's weights and optimizer state."""
    import tensorflow as tf

    for i, variable in enumerate(variables):
        variable.assign(hvd.broadcast(tf.convert_to_tensor(variable), root_rank=0, name=f"nbdist_init_{i}"))


def _allreduced(hvd, apply_gradients, compression: str | None):
    """`optimizer.apply_gradients` that first averages the gradients over all ranks (one fused group)."""
    import tensorflow as tf

    compressor = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none

    def apply(grads_and_vars):
        pairs = list(grads_and_vars)
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        dense = [tf.convert_to_tensor(pairs[i][0]) for i in present]  # IndexedSlices -> dense
        # A fixed name: Horovod matches tensors across ranks by name, and the default (from
        # layer names such as dense_3) differs on an engine that built other models before.
        reduced = (hvd.grouped_allreduce(dense, op=hvd.Average, compression=compressor, name="nbdist_gradients")
                   if dense else [])
        grads = [g for g, _ in pairs]
        for i, g in zip(present, reduced):
            grads[i] = g
        return apply_gradients(zip(grads, [v for _, v in pairs]))

    return apply


def _epoch_log_averager(hvd):
    """Averages every epoch-end metric (train and validation) over ranks, before History records it.

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
            values = [mine.get(k, 0.0) for k in keys] + [float(k in mine) for k in keys]
            sums = hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum,
                                 name=f"nbdist_epoch_logs_{epoch}").numpy()
            counts = sums[len(keys):]
            logs.update({k: float(sums[i] / counts[i]) for i, k in enumerate(keys) if counts[i] > 0})

    return EpochLogAverager()


def _lr_scaler(optimizer, factor: int, warmup_epochs: float):
    """Linear scaling (lr x workers), ramped up over `warmup_epochs` (Goyal et al. 2017); the user's own
    learning rate (a constant or a schedule) is back in place at the end."""
    import keras

    from ..learning_rate import scaled, schedule_of

    class LearningRateScaler(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.schedule = schedule_of(optimizer)
            self.epoch = 0
            if self.schedule is not None:  # the schedule itself is scaled, its warm-up counted in steps
                steps = (self.params or {}).get("steps") or 1
                optimizer.learning_rate = scaled(self.schedule, factor, int(round(warmup_epochs * steps)),
                                                 int(optimizer.iterations.numpy()))
            else:
                self.base = float(optimizer.learning_rate)
                self._set(0, 0)

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


def _rank0_restore(hvd, model):
    """BackupAndRestore runs on rank 0 only (it writes files): what it restored at the start, the weights,
    optimizer state and the epoch to resume from, goes to every rank, so all ranks make the same steps."""
    import keras
    import tensorflow as tf

    class RankZeroRestore(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            _broadcast_from_rank0(hvd, list(model.variables) + list(model.optimizer.variables))
            # Keras resumes from the private `_initial_epoch` that BackupAndRestore sets
            epoch = hvd.broadcast(tf.constant(int(model._initial_epoch or 0), tf.int64), root_rank=0,
                                  name="nbdist_initial_epoch")
            model._initial_epoch = int(epoch.numpy()) or None

    return RankZeroRestore()


class HfdtStrategy(Strategy):
    name = "hfdt"
    min_workers = 1
    summary = "synchronous data parallel, Horovod ring-allreduce over Gloo"
    options = ("compression", "scale_lr", "warmup_epochs", "simulate")
    worker_class = HfdtWorker

    def __init__(self, options):
        super().__init__(options)
        self.rendezvous: Rendezvous | None = None

    def prepare(self, run, cluster) -> dict:
        require_horovod()
        order, slots = host_plan([cluster.info(eid).host for eid in run.workers])
        run.workers[:] = [run.workers[i] for i in order]  # rank order
        address = rendezvous_address(cluster.client, all(cluster.shares_network(e) for e in run.workers))
        self.rendezvous = Rendezvous(address)
        port = self.rendezvous.start(slots)
        profiles = parse_simulate(self.options.get("simulate"), len(run.workers))
        return {"address": address, "port": port, "simulate": [p.to_json() for p in profiles],
                "slots": [{k: getattr(s, k) for k in ("hostname", "rank", "local_rank", "cross_rank", "size",
                                                      "local_size", "cross_size")} for s in slots]}

    def finish(self, run) -> None:
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None
