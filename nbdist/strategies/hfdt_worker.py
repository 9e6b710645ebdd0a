"""`hfdt`'s worker half, on each engine: one Horovod rank. Keras' own `fit` loop runs on every rank; only the
optimizer's `apply_gradients` is wrapped so gradients are averaged across ranks first (Horovod's
DistributedOptimizer idea, done with `grouped_allreduce` because `horovod.keras` does not work with Keras 3).
It joins the run's Horovod job (and, elastic, re-forms it after a death: `hfdt_elastic`), shards the data,
balances batches (`--balance auto`), and keeps rank 0's files whole before any rank leaves `fit`.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import sys

from . import balance
from ..datasets import dynamic_data, structures
from ..host import gpus
from ..keras_semantics.empty_weights import variable_bytes
from ..errors import ClusterError
from ..keras_semantics.fused_steps import fused_steps
from ..host.hetero import Slowdown
from ..keras_semantics.keras_bridge import apply_gradients_restored, build_for_training, other_optimizers
from ..limits import LIMITS
from ..host.netroute import interface_towards
from ..datasets.sharding import shard_fit_data
from ..host.step_timer import StepTimer
from . import horovod_ops as ops
from .base import Worker
from .control_step import StepControls, acting_on
from .hfdt_loop import HorovodLoop
from .rendezvous import arrive_together
from .hfdt_elastic import LEFT_KEY, Survivor, elastic, is_collective_failure, join_grown_job
from .stall_watch import StallWatch, stall_timeout


class HfdtWorker(Worker):
    """One Horovod rank: shards the data, averages gradients and epoch metrics across ranks."""

    synchronous = True

    @property
    def slot(self) -> dict:
        return self.config["slots"][self.rank]

    def cell_context(self):
        return gpus.device_scope()

    def fit(self, request):
        model, optimizer = request.model, request.model.optimizer
        control = self.control_point()
        hvd = survivor = None
        try:
            data = self._fit_data(request)
            arrays = {"x": self.scheduled.arrays[0], "y": self.scheduled.arrays[1]} if self.scheduled else data
            build_for_training(model, arrays["x"])
            hvd, joined = self._enter_job(model, control)
            if hvd is None:  # a newcomer the run ended (or re-formed after a death) before it could take it in
                return request.run_plain(callbacks=[], verbose=0, **{**data, "epochs": 0})
            if joined is not None:
                data["initial_epoch"] = joined["initial_epoch"]
            self.size = hvd.size()
            batch = request.samples_per_step or 32
            step = self._virtual_step_cost(hvd, model, arrays, batch)
            batches = [batch] * self.size
            if self.values["balance"] == "auto":
                batches = self._balance(hvd, model, data, batch, step)
                data = self._balanced_data(hvd, request, batches)
            weight = balance.gradient_weight(batches, hvd.rank())
            with apply_gradients_restored(model):
                controls = self._allreduce_every_optimizer(hvd, model, control, weight)
                user = self.user_callbacks(request)
                restored = [ops.rank0_restore(hvd, model)] if joined is None and any(
                    type(c).__name__ == "BackupAndRestore" for c in user) else []  # a newcomer took rank 0's state
                reporter, per_step = self._reporter(hvd, model, step, batches)
                scaling = self._lr_callbacks(optimizer)
                averager = ops.epoch_log_averager(hvd, weight)
                survivor = self._survivor(hvd, model, control, scaling, joined)
                survivor.schedule = self.scheduled
                grows = elastic(survivor)
                survivor.guard(averager, "on_epoch_end")
                survivor.guard(grows, "on_epoch_end")
                callbacks = [averager, *scaling, grows, *self._simulation(per_step), *user, *restored,
                             acting_on(control, controls), reporter, *self._scheduling()]
                # every rank must decide alike: Horovod matches the allreduce by its op's name, which the
                # loop of fused steps changes; so the cell's callbacks count on every rank, as does --simulate
                deciding = [*callbacks, *(request.callbacks or [])]
                with fused_steps(model, deciding, data.get("steps_per_epoch"), request.args.get("validation_steps"),
                                 allowed=not self._simulated_anywhere()), dynamic_data.epochs_of_any_length():
                    history = request.run_plain(callbacks=callbacks, verbose=0, **data)
                self._fit_ended(hvd, survivor)
                return history
        finally:
            control.close()
            if survivor is not None and survivor.watch is not None:
                survivor.watch.stop()  # an interrupted fit ends before on_train_end would stop it
            if hvd is not None:
                hvd.shutdown()

    # -- a loop of the cell's own (`hfdt_loop`) ----------------------------------------------------------------
    @contextlib.contextmanager
    def loop_context(self):
        with super().loop_context():
            hvd = self._init_horovod()
            self.size = hvd.size()
            self.loop = HorovodLoop(hvd, self.loop_control, self.values["compression"],
                                    self.values["scale_lr"] == "linear")
            try:
                yield
                hvd.allgather_object(hvd.rank(), name="nbdist_loop_end")  # rank 0's files whole before any leaves
            finally:
                self.loop.restore()
                hvd.shutdown()

    def step(self, index, optimizer, grads, variables, apply):
        return self.loop.step(index, optimizer, grads, variables, apply)

    def statement_ended(self) -> None:
        self.loop.restore()

    def poll_controls(self):
        """This rank's view of the controls into the variable its next step's allreduce carries."""
        flags = super().poll_controls()
        if flags is not None:
            self.loop.controls.seen.assign(flags)
        return None

    def _fit_ended(self, hvd, survivor) -> None:
        """Every rank's files closed; the recoveries and the batches each epoch trained, for the run's record."""
        _files_closed(hvd, survivor)
        if survivor.recoveries:
            self.fit_timings["recoveries"] = survivor.recoveries
        if self.scheduled is not None:
            self.fit_timings["batches"] = {str(e): b for e, b in self.scheduled.trained.items()}

    def _fit_data(self, request) -> dict:
        """`fit`'s arguments: under `--data dynamic` (arrays, no steps_per_epoch) every step's global batch is the
        next of the epoch's order and this rank takes its slice of it (`self.scheduled`); else its shard."""
        mode, self.scheduled = self.config.get("data") or {}, None
        why = dynamic_data.applies(request) if mode.get("mode") == "dynamic" else None
        if mode.get("mode") != "dynamic" or why is not None:
            if why is not None:
                self.fit_timings["data"] = f"static shards: {why}"
            return shard_fit_data(request, *(self.config.get("shard") or (self.rank, self.size)), synchronous=True)
        x, y, weights = dynamic_data.training_arrays(request)

        def where():
            import horovod.tensorflow as hvd

            return hvd.rank(), hvd.size()

        self.scheduled = dynamic_data.ScheduledBatches(structures.length(x), int(request.batch_size or 32),
                                                       mode["seed"], where, shuffle=request.shuffle is not False)
        self.scheduled.arrays = (x, y)
        return dynamic_data.fit_arguments((x, y, weights), self.scheduled, request, self.rank, self.size)

    def _scheduling(self) -> list:
        return [dynamic_data.epoch_follower(self.scheduled)] if self.scheduled is not None else []

    def _allreduce_every_optimizer(self, hvd, model, control, weight: float) -> StepControls:
        """Every optimizer the model applies averages its gradients over the ranks first: `model.optimizer`
        and those a `train_step` of the cell's own applies (a GAN's two), each carrying the run's controls
        (returned, for the callback that acts on them)."""
        compression, controls = self.values["compression"], StepControls(control)
        model.optimizer.apply_gradients = ops.allreduced(hvd, model.optimizer.apply_gradients, compression,
                                                         controls, weight)
        for attr, other in other_optimizers(model).items():
            other.apply_gradients = ops.allreduced(hvd, other.apply_gradients, compression, controls, weight,
                                                   name=f"nbdist_gradients_{attr}")
        model.jit_compile = False  # XLA cannot compile Horovod's ops
        return controls

    def _reporter(self, hvd, model, step, batches: list[int]):
        """The metrics callback at this rank's batch (its time, on the virtual clock, the run's start plus the
        virtual steps made), and the bytes one step's allreduce sends."""
        reporter = self.make_reporter(batches[hvd.rank()])
        if self.scheduled is not None:
            reporter.expected_steps = self.scheduled.expected_steps(hvd.size())
        if step is not None:
            start, step_s = self.spec.get("cell_start") or 0.0, self._virtual_step_s(model, step, batches)
            reporter.clock = lambda: start + reporter.steps * step_s
        per_step = ops.ring_allreduce_bytes(self.size, _gradient_bytes(model))
        reporter.extra = lambda: {"bytes_sent": reporter.steps * per_step}
        return reporter, per_step

    def _enter_job(self, model, control):
        """(Horovod in the run's job with rank 0's weights and optimizer state, None); for an engine that
        joined the running run, the larger job at the ranks' next epoch end and what it joined ({"generation",
        "done", "initial_epoch"}); (None, None) when the kernel gave that join up."""
        if self.config.get("joining"):
            joined = join_grown_job(self._join_job, control, model, self.config.pop("joining"), _left)
            return (None, None) if joined is None else (joined["hvd"], joined)
        hvd = self._init_horovod()
        ops.broadcast_model(hvd, model)
        return hvd, None

    def _survivor(self, hvd, model, control, scaling: list, joined: dict | None) -> Survivor:
        """This rank's side of elastic runs and of the stall watch (a newcomer carries on the job's count)."""
        survivor = Survivor(hvd, model, control, self._join_job, lambda size: [s.rescale(size) for s in scaling],
                            _left, StallWatch(_publish, stall_timeout(self.values, LIMITS.collective_stall_s)),
                            recover=bool(self.config.get("elastic")))
        if joined is not None:
            survivor.generation, survivor.done = joined["generation"], joined["done"]
        return survivor

    def _init_horovod(self, slot: dict | None = None, port: int | None = None):
        """Join the run's Horovod job (or, elastic, the re-formed one at `port` in `slot`)."""
        try:
            import horovod.tensorflow as hvd
        except ImportError as exc:
            raise ClusterError(f"Horovod is not installed on this engine ({exc}); on its host run "
                               f"`{sys.executable} -m nbdist.horovod install` (builds Horovod 0.28.1 once and caches "
                               "the wheel).") from None
        if hvd.is_initialized():
            hvd.shutdown()
        slot, port = slot or self.slot, port or self.config["port"]
        require_resolvable(slot["hostname"])
        os.environ.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.config["address"],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": interface_towards(self.config["address"], port),
            "HOROVOD_HOSTNAME": slot["hostname"],
            "HOROVOD_RANK": str(slot["rank"]), "HOROVOD_SIZE": str(slot["size"]),
            "HOROVOD_LOCAL_RANK": str(slot["local_rank"]), "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
            "HOROVOD_CROSS_RANK": str(slot["cross_rank"]), "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
        })
        # A rank that waits this long for its peers is stuck, not slow: fail rather than hang.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "60")
        # A dead peer is noticed in seconds: the survivors re-form soon, or (--on-failure fail) stop soon
        # (Gloo's own default, 30 s, kept a survivor in its collective long after the death was reported). Set
        # for every run, so one run's setting is not the next's; an engine's own variable (set before its
        # first run) wins.
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = _ENGINE_GLOO_TIMEOUT or str(math.ceil(LIMITS.gloo_peer_s))
        # jobs counted per rendezvous server: the run's own, or a re-formed job's
        jobs = vars(self).setdefault("_jobs_started", collections.Counter())
        arrive_together(self.config["address"], port, slot["rank"], slot["size"], jobs[port])
        jobs[port] += 1
        hvd.init()
        if (hvd.rank(), hvd.size()) != (slot["rank"], slot["size"]):
            raise ClusterError(f"Horovod gave rank {hvd.rank()}/{hvd.size()}, expected {slot['rank']}/{slot['size']}")
        return hvd

    def _join_job(self, job: dict):
        """Leave the current Horovod job for `job`, the one the kernel re-formed over the survivors of a
        dead rank or grew by newcomers; returns Horovod, re-initialised."""
        slot = job["slots"].get(str(self.rank))
        if slot is None:
            raise ClusterError(f"rank {self.rank} was left out of the Horovod job the kernel re-formed")
        return self._init_horovod(slot, job["port"])

    def _simulated_anywhere(self) -> bool:
        """Whether some rank's steps sleep for `--simulate` (each step then needs its own call)."""
        profiles = self.config.get("simulate") or []
        return self.config.get("virtual") is None and any(Slowdown(p).active for p in profiles)

    def _simulation(self, per_step_bytes: int) -> list:
        """`--simulate`: this rank's steps stretched by 1/speed, its link charged for the allreduce's bytes
        (sent and received)."""
        profiles = self.config.get("simulate")  # none for an engine that joined the run (it is not simulated)
        slowdown = Slowdown(profiles[self.rank] if profiles else None)
        if not slowdown.active or self.config.get("virtual") is not None:  # the virtual clock never sleeps
            return []
        import keras

        timer = StepTimer()

        class Simulated(keras.callbacks.Callback):  # not async_safe: its sleeps must hold the next step back
            def on_train_batch_end(self, batch, logs=None):
                timer.compute_ended()
                slowdown.stretch(timer.typical_compute_s())
                slowdown.charge(2 * per_step_bytes)
                timer.local_step_ended()

        return [Simulated()]

    def _virtual_step_cost(self, hvd, model, data, batch: int):
        """On the virtual clock: the step cost given, or measured once on rank 0 and broadcast (a
        `StepCost`); None on the real clock."""
        virtual = self.config.get("virtual")
        if virtual is None:
            return None
        from ..host.hetero import StepCost
        from .virtual_clock import measure_step_cost

        step = virtual.get("step") or (measure_step_cost(model, data, batch).to_json() if self.rank == 0 else None)
        self.virtual_step = StepCost(**hvd.broadcast_object(step, root_rank=0, name="nbdist_step_cost")).at(batch)
        return self.virtual_step

    def _virtual_step_s(self, model, step, batches: list[int]) -> float:
        """A synchronous step's virtual seconds: the slowest rank's compute at its batch, then a ring allreduce."""
        from .virtual_clock import ring_allreduce_s

        profiles = self._profiles()
        return ring_allreduce_s(profiles, [step.seconds(b) / p.speed for b, p in zip(batches, profiles)],
                                _gradient_bytes(model))

    def _profiles(self) -> list:
        from ..host.hetero import Profile

        return [Profile(**p) for p in self.config["simulate"]]

    def _balance(self, hvd, model, data: dict, batch: int, step) -> list[int]:
        """`--balance auto`: every rank's batch, from the profiles of all ranks (the same on each)."""
        cost = balance.own_cost(data, model, batch, self._profiles()[self.rank], step)
        costs = hvd.allgather_object(cost, name="nbdist_balance_profiles")
        return balance.balanced_batches(costs, batch)

    def _balanced_data(self, hvd, request, batches: list[int]) -> dict:
        """This rank's share of the data in proportion to its batch; every rank makes the same steps.

        Arrays are cut to whole batches of the fewest steps of all ranks, rather than passing
        steps_per_epoch: Keras carries an array iterator's remainder into the next epoch then, so every
        other epoch would be the few steps left over."""
        data = shard_fit_data(request, self.rank, self.size, synchronous=True, fractions=[float(b) for b in batches])
        if data["steps_per_epoch"] is None:
            own = balance.steps_per_epoch(structures.length(data["x"]), batches[self.rank])
            steps = min(hvd.allgather_object(own, name="nbdist_balance_steps"))
            data = {**data, **balance.whole_batches(data, steps * batches[self.rank])}
        return {**data, "batch_size": batches[self.rank]}

    def _lr_callbacks(self, optimizer) -> list:
        if self.values["scale_lr"] == "none" or self.size == 1:
            return []
        return [ops.lr_scaler(optimizer, self.size, float(self.values["warmup_epochs"] or 0))]


def _publish(data: dict) -> None:
    """To the kernel, in the task's published data (merged into what the run's progress shows)."""
    from ipyparallel.datapub import publish_data

    publish_data(data)


def _left(generation: int) -> None:
    """Tell the kernel this rank waits for job `generation`."""
    _publish({LEFT_KEY: generation})


def _gradient_bytes(model) -> int:
    return sum(variable_bytes(v) for v in model.trainable_variables)


def require_resolvable(hostname: str) -> None:
    """Horovod's Gloo looks this host's name up and crashes the process when it cannot: say so first."""
    import socket

    try:
        socket.gethostbyname(hostname)
    except OSError:
        raise ClusterError(f"this engine's host name {hostname!r} does not resolve here, and Horovod (hfdt) needs "
                           "every host's name to resolve: add it to DNS or /etc/hosts on every host, or use a "
                           "parameter-server strategy (nfdt, ddc-asgd), which does not.") from None


def _files_closed(hvd, survivor: Survivor) -> None:
    """No rank returns from `fit` before rank 0's file-writing callbacks are done (the last epoch's
    checkpoint, `on_train_end`): code after `fit`, on any rank, then reads whole files."""
    if survivor.abandoned:
        return  # too few ranks left for a collective
    try:
        hvd.allgather_object(hvd.rank(), name="nbdist_fit_end")
    except Exception as exc:
        if not is_collective_failure(exc):  # a rank died at the very end: its files are no one's to wait for
            raise


_ENGINE_GLOO_TIMEOUT = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS")  # as the engine started, before any run
