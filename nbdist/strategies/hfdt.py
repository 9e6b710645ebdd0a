"""`hfdt`: synchronous data parallel training with Horovod ring-allreduce (Keras 3 safe core ops).

Keras' own `fit` loop runs on every worker; only the optimizer's `apply_gradients` is
wrapped so gradients are averaged across ranks first (Horovod's DistributedOptimizer idea,
done with `grouped_allreduce` because `horovod.keras` does not work with Keras 3).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time

from .. import balance
from ..errors import ClusterError, CollectiveStalled, EngineDied
from ..fused_steps import fused_steps
from ..hetero import Slowdown, parse_clock, parse_simulate
from ..keras_bridge import apply_gradients_restored, build_for_training
from ..limits import LIMITS
from ..netroute import address_towards_cluster, interface_towards
from ..rendezvous import Rendezvous, host_plan, require_horovod
from ..sharding import shard_fit_data
from ..step_timer import StepTimer
from . import horovod_ops as ops
from .base import Option, Reports, Strategy, Worker
from .control_step import stop_when_stopped
from .hfdt_elastic import LEFT_KEY, Survivor, elastic, is_collective_failure, join_grown_job
from .options import ELASTIC, SIMULATE
from .stall_watch import StallWatch, missing_ranks, stalled

COMPRESSION = Option("--compression", "gradient compression on the allreduce: none or fp16", default="none",
                     choices=("none", "fp16"))
SCALE_LR = Option("--scale-lr", "multiply the learning rate by the number of workers (linear, the default) or "
                  "leave it (none)", default="linear", choices=("linear", "none"))
BALANCE = Option("--balance", "none (every rank the cell's batch) or auto: profile every rank and give it a "
                 "batch and a share of the data in proportion to its speed, so a slow GPU does not set everyone's "
                 "pace", default="none", choices=("none", "auto"))
ON_FAILURE = Option("--on-failure", "what a dead engine does to the run: continue (the survivors re-form the Horovod "
                    "job and train on, down to --min-workers; the default) or fail (the run stops with an error "
                    "naming the engine)", default="continue", choices=("continue", "fail"))
STALL_TIMEOUT = Option("--stall-timeout", "seconds a step may wait for ranks that have not submitted their "
                       "gradients before the run fails naming them (default 30)", type=float, default=30.0,
                       metavar="S", minimum=1)
MIN_WORKERS = Option("--min-workers", "the fewest ranks a run continues with after engines die (default 1); one "
                     "death more and the run fails, the weights of its last completed step in nbdist.last_run.weights",
                     type=int, default=1, metavar="W", minimum=1)
WARMUP_EPOCHS = Option("--warmup-epochs", "ramp the scaled learning rate up over this many epochs (default 0: "
                       "scaled from the first step)", type=float, default=0.0, metavar="E", minimum=0)


class HfdtWorker(Worker):
    """One Horovod rank: shards the data, averages gradients and epoch metrics across ranks."""

    @property
    def slot(self) -> dict:
        return self.config["slots"][self.rank]

    def cell_context(self):
        """Each engine computes on the GPU nbdist pinned it to when the cluster probed it (`nbdist.gpus`):
        the first it sees (Horovod's local rank can differ from the pin)."""
        import tensorflow as tf

        visible = tf.config.get_visible_devices("GPU")
        return tf.device("/GPU:0") if visible else contextlib.nullcontext()

    def fit(self, request):
        model, optimizer = request.model, request.model.optimizer
        control = self.control_point()
        hvd = None
        try:
            data = shard_fit_data(request, *(self.config.get("shard") or (self.rank, self.size)), synchronous=True)
            build_for_training(model, data["x"])
            hvd, joined = self._enter_job(model, control)
            if hvd is None:  # a newcomer the run ended (or re-formed after a death) before it could take it in
                return request.run_plain(callbacks=[], verbose=0, **{**data, "epochs": 0})
            if joined is not None:
                data["initial_epoch"] = joined["initial_epoch"]
            self.size = hvd.size()
            batch = request.samples_per_step or 32
            step = self._virtual_step_cost(hvd, model, data, batch)
            batches = [batch] * self.size
            if self.values["balance"] == "auto":
                batches = self._balance(hvd, model, data, batch, step)
                data = self._balanced_data(hvd, request, batches)
            weight = balance.gradient_weight(batches, hvd.rank())
            with apply_gradients_restored(model):
                optimizer.apply_gradients = ops.allreduced(hvd, optimizer.apply_gradients, self.values["compression"],
                                                           control, weight)
                model.jit_compile = False  # XLA cannot compile Horovod's ops
                user = self.user_callbacks(request)
                restored = [ops.rank0_restore(hvd, model)] if joined is None and any(
                    type(c).__name__ == "BackupAndRestore" for c in user) else []  # a newcomer took rank 0's state
                reporter, per_step = self._reporter(hvd, model, step, batches)
                scaling = self._lr_callbacks(optimizer)
                averager = ops.epoch_log_averager(hvd, weight)
                survivor = self._survivor(hvd, model, control, scaling, joined)
                grows = elastic(survivor)
                survivor.guard(averager, "on_epoch_end")
                survivor.guard(grows, "on_epoch_end")
                callbacks = [averager, *scaling, grows, *self._simulation(per_step), *user, *restored,
                             stop_when_stopped(control), reporter]
                # every rank must decide alike: Horovod matches the allreduce by its op's name, which the
                # loop of fused steps changes; so the cell's callbacks count on every rank, as does --simulate
                deciding = [*callbacks, *(request.callbacks or [])]
                with fused_steps(model, deciding, data.get("steps_per_epoch"), request.args.get("validation_steps"),
                                 allowed=not self._simulated_anywhere()):
                    history = request.run_plain(callbacks=callbacks, verbose=0, **data)
                _files_closed(hvd, survivor)
                if survivor.recoveries:
                    self.fit_timings["recoveries"] = survivor.recoveries
                return history
        finally:
            control.close()
            if hvd is not None:
                hvd.shutdown()

    def _reporter(self, hvd, model, step, batches: list[int]):
        """The metrics callback at this rank's batch (its time, on the virtual clock, the run's start plus the
        virtual steps made), and the bytes one step's allreduce sends."""
        reporter = self.make_reporter(batches[hvd.rank()])
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
        ops.broadcast_from_rank0(hvd, list(model.variables) + list(model.optimizer.variables))
        return hvd, None

    def _survivor(self, hvd, model, control, scaling: list, joined: dict | None) -> Survivor:
        """This rank's side of elastic runs and of the stall watch (a newcomer carries on the job's count)."""
        survivor = Survivor(hvd, model, control, self._join_job, lambda size: [s.rescale(size) for s in scaling],
                            _left, StallWatch(_publish, float(self.values.get("stall_timeout") or 30)),
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
        from ..hetero import StepCost
        from ..virtual_clock import measure_step_cost

        step = virtual.get("step") or (measure_step_cost(model, data, batch).to_json() if self.rank == 0 else None)
        self.virtual_step = StepCost(**hvd.broadcast_object(step, root_rank=0, name="nbdist_step_cost")).at(batch)
        return self.virtual_step

    def _virtual_step_s(self, model, step, batches: list[int]) -> float:
        """A synchronous step's virtual seconds: the slowest rank's compute at its batch, then a ring allreduce."""
        from ..virtual_clock import ring_allreduce_s

        profiles = self._profiles()
        return ring_allreduce_s(profiles, [step.seconds(b) / p.speed for b, p in zip(batches, profiles)],
                                _gradient_bytes(model))

    def _profiles(self) -> list:
        from ..hetero import Profile

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
            own = balance.steps_per_epoch(len(data["x"]), batches[self.rank])
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
    import numpy as np

    return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.trainable_variables)


def require_resolvable(hostname: str) -> None:
    """Horovod's Gloo looks this host's name up and crashes the process when it cannot: say so first."""
    import socket

    try:
        socket.gethostbyname(hostname)
    except OSError:
        raise ClusterError(f"this engine's host name {hostname!r} does not resolve here, and Horovod (hfdt) needs "
                           "every host's name to resolve: add it to DNS or /etc/hosts on every host, or use a "
                           "parameter-server strategy (nfdt, ddc-asgd), which does not.") from None


class HfdtStrategy(Strategy):
    """Synchronous data parallel training over Horovod's ring-allreduce (Gloo), one rank per engine.

    Elastic by default: when an engine dies, the survivors re-form the job (`hfdt_elastic`) over a new
    rendezvous this side opens once every survivor has left the broken one."""

    name = "hfdt"
    summary = "synchronous data parallel, Horovod ring-allreduce over Gloo"
    reads = (COMPRESSION, SCALE_LR, WARMUP_EPOCHS, BALANCE, ON_FAILURE, MIN_WORKERS, *ELASTIC, STALL_TIMEOUT,
             SIMULATE)
    reports = Reports(panels=("loss", "throughput"), controls=("pause", "resume", "stop"))
    worker_class = HfdtWorker

    def __init__(self, values):
        super().__init__(values)
        self.rendezvous: Rendezvous | None = None
        self.address: str | None = None
        self.generation = 0
        self.reforming: dict | None = None  # the job announced once every survivor has left the broken one
        self.ranks: list[int] = []  # the engines in rank order of the current job
        self.abandoned: dict | None = None  # below --min-workers: the survivors end their fit, then the run fails
        self.growing: dict | None = None  # the larger job a newcomer waits for, until the ranks leave for it
        self.shards: dict[int, int] = {}  # engine -> the shard of the data it trains on (of the first job's N)
        self.first_size = 0
        self.cluster = None
        self.killed: set[int] = set()  # engines of stalled ranks this run killed (treated as dead)
        self.reformed_after: dict[int, int] = {}  # job generation -> the dead engine it was re-formed after

    def array_shards(self) -> bool:
        return self.value("balance") != "auto"

    @property
    def elastic(self) -> bool:
        """Whether survivors re-form the job (--balance auto sized every rank's batch for the first job)."""
        return self.value("on_failure") == "continue" and self.value("balance") != "auto"

    def prepare(self, run, cluster) -> dict:
        require_horovod()
        self.cluster = cluster
        order, slots = host_plan([cluster.info(eid).host for eid in run.workers])
        run.workers[:] = [run.workers[i] for i in order]  # rank order
        self.address = address_towards_cluster(cluster.client, all(cluster.shares_network(e) for e in run.workers))
        self.rendezvous = Rendezvous(self.address)
        port = self.rendezvous.start(slots)
        self.ranks = list(run.workers)
        self.shards = {eid: rank for rank, eid in enumerate(run.workers)}
        self.first_size = len(run.workers)
        profiles = parse_simulate(self.value("simulate"), len(run.workers))
        clock, step = parse_clock(self.value("simulate"))
        return {"address": self.address, "port": port, "simulate": [p.to_json() for p in profiles],
                "virtual": {"step": step.to_json() if step else None} if clock == "virtual" else None,
                "slots": [_slot(s) for s in slots], "elastic": self.elastic}

    @property
    def takes_newcomers(self) -> bool:
        return self.elastic and not self.value("simulate")

    def newcomer_shard(self, run, rank: int) -> tuple[int, int]:
        """A shard as large as every rank's, so all make the same steps: a dead rank's that no live engine
        took over, else rank (rank mod N)'s of the first job's N (then trained on twice per epoch)."""
        size = self.first_size
        dead = {run.workers[r] for r in run.dead_ranks()}
        held = {k for eid, k in self.shards.items() if eid not in dead}
        free = sorted({self.shards[eid] for eid in dead if eid in self.shards} - held)
        return (free[0] if free else rank % size), size

    def admit(self, run, eid: int, rank: int, config: dict) -> dict:
        """A larger job over the current ranks and engine `eid`, opened now; the ranks leave for it at an
        epoch's end once the newcomer waits for it (`check`). Not in the run's last epoch."""
        from ..newcomers import Refused

        if self.reforming or self.abandoned or self.growing:
            raise Refused("the Horovod job is changing", retry=True)
        latest = [p for p in run.progress.values() if p.get("epochs")]
        if not latest:
            raise Refused("the run has not reported its first step yet", retry=True)
        epochs, epoch = latest[0]["epochs"], max((p.get("record") or {}).get("epoch") or 0 for p in latest)
        if epoch + 1 >= epochs:
            raise Refused("the run is in its last epoch; a Horovod job grows at an epoch's end")
        members = list(self.ranks)
        hosts = [run.hosts.get(e, {}).get("host") or "localhost" for e in members]
        order, slots = host_plan([*hosts, run.hosts[eid]["host"]])
        rendezvous = Rendezvous(self.address)
        port = rendezvous.start(slots)
        self.generation += 1
        engines = [*members, eid]
        ranked = [engines[order[r]] for r in range(len(slots))]
        index = {e: (rank if e == eid else run.workers.index(e)) for e in engines}
        job = {"generation": self.generation, "port": port, "grow": True,
               "slots": {str(index[e]): _slot(slot) for e, slot in zip(ranked, slots)}}
        self.growing = {"job": job, "members": members, "newcomer": eid, "ranks": ranked, "rendezvous": rendezvous,
                        "announced": False}
        self.shards[eid] = self.newcomer_shard(run, rank)[0]
        return {**config, "joining": job, "shard": [self.shards[eid], self.first_size], "simulate": None,
                "virtual": None}

    def continues_without(self, run, cluster, dead: int, survivors: list[int]) -> bool:
        """Re-form the job over the survivors, when elastic and at least --min-workers are left (a newcomer
        not yet in the job is given up: the run goes on without it)."""
        if not self.elastic or self.bus is None:
            return False
        if self.growing is not None:
            newcomer = self.growing["newcomer"]
            self._give_up_growth()
            if dead == newcomer:
                return True
        survivors = [e for e in survivors if e in self.ranks]  # not a newcomer that never got into the job
        if not survivors:
            return False
        self.generation += 1
        self.reformed_after[self.generation] = dead
        if len(survivors) < self.value("min_workers"):  # the survivors end their fit and send its weights
            self.abandoned = {"survivors": survivors, "since": time.time(), "dead": cluster.info(dead).label()}
            self.bus.send("reform", {"generation": self.generation, "abandon": True})
            return True
        order, slots = host_plan([cluster.info(eid).host for eid in survivors])
        self.rendezvous.stop()
        self.rendezvous = Rendezvous(self.address)
        port = self.rendezvous.start(slots)
        self.ranks = [survivors[order[r]] for r in range(len(slots))]
        ranks = {str(run.workers.index(eid)): _slot(slot) for eid, slot in zip(self.ranks, slots)}
        self.reforming = {"job": {"generation": self.generation, "port": port, "slots": ranks},
                          "survivors": survivors, "since": time.time()}
        return True

    def check(self, run) -> None:
        """Name a stalled step's missing ranks; announce a re-formed job once every survivor has left the
        broken one (bounded)."""
        if self.abandoned is not None:
            gone = self.abandoned
            left = all(e in run.results for e in gone["survivors"])
            if left or time.time() - gone["since"] > LIMITS.reform_s:
                raise EngineDied(f"{gone['dead']} died during run {run.id}, leaving fewer ranks than --min-workers "
                                 f"{self.value('min_workers')}; the run was stopped. nbdist.last_run.weights holds "
                                 "the weights of its last completed step (model.set_weights(nbdist.last_run.weights) "
                                 "keeps them); a lower --min-workers lets a run go on with fewer.")
        if self.reforming is None and self.growing is None:
            self._check_stall(run)
        self._grow(run)
        pending = self.reforming
        if pending is None:
            return
        waiting = [e for e in pending["survivors"]
                   if (run.progress.get(e) or {}).get(LEFT_KEY, 0) < pending["job"]["generation"]]
        if not waiting:
            self.bus.send("reform", pending["job"])
            self.reforming = None
        elif time.time() - pending["since"] > LIMITS.reform_s:
            raise EngineDied(f"engine(s) {waiting} did not leave the broken Horovod job within {LIMITS.reform_s} s "
                             "of a rank's death (stuck in the cell's own code?); the run was stopped. See %dist "
                             "status; --on-failure fail stops a run at the first death instead.")

    def _check_stall(self, run) -> None:
        """A rank the others waited for past --stall-timeout: treated as dead when elastic and enough ranks
        are left without it (its engine is killed, the others re-form), else the run fails naming it."""
        missing = [self.ranks[r] for r in missing_ranks(run, self.ranks, self.value("stall_timeout"))]
        if not missing or set(missing) <= self.killed:
            return
        if not self.elastic or len(self.ranks) - len(missing) < self.value("min_workers") or self.cluster is None:
            raise CollectiveStalled(stalled(run, self.ranks, self.value("stall_timeout")))
        for eid in missing:
            if eid not in self.killed:
                run.events.append({"t": time.time(), "event": "stalled_rank_killed", "engine": eid,
                                   "rank": run.workers.index(eid), "host": self.cluster.info(eid).host,
                                   "stall_timeout": self.value("stall_timeout")})
        self.killed |= set(missing)
        self.cluster.signal(missing, signal.SIGKILL)  # the others' collective then fails: they re-form

    def _grow(self, run) -> None:
        """Announce the larger job once its newcomer waits for it; say go to the newcomer once every rank
        left for it; give it up when the ranks ended their fit first."""
        growing = self.growing
        if growing is None:
            return
        job, generation = growing["job"], growing["job"]["generation"]

        def left(eid):
            return (run.progress.get(eid) or {}).get(LEFT_KEY, 0) >= generation

        if not growing["announced"] and left(growing["newcomer"]):
            self.bus.send("reform", job)
            growing["announced"] = True
        elif growing["announced"] and all(left(e) for e in growing["members"]):
            self.bus.send("reform", {**job, "go": True})
            self.rendezvous.stop()
            self.rendezvous, self.ranks, self.growing = growing["rendezvous"], growing["ranks"], None
        elif all(e in run.results for e in growing["members"]):
            self._give_up_growth()

    def _give_up_growth(self) -> None:
        growing, self.growing = self.growing, None
        growing["rendezvous"].stop()
        self.bus.send("reform", {**growing["job"], "abandon": True})

    def finish(self, run) -> None:
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None
        if self.growing is not None:
            self.growing["rendezvous"].stop()
            self.growing = None
        run.events += recovered_events(run, self.reformed_after)


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

SLOT_FIELDS = ("hostname", "rank", "local_rank", "cross_rank", "size", "local_size", "cross_size")


def _slot(slot) -> dict:
    return {k: getattr(slot, k) for k in SLOT_FIELDS}


def recovered_events(run, reformed_after: dict[int, int]) -> list[dict]:
    """From the account of each new job's rank 0: one `recovered` event per job re-formed after a death (the
    step it resumed at, the new size, the seconds from the kernel seeing the engine die to the next
    completed step) and one `grown` event per job grown by engines that joined (its size, step, epoch)."""
    deaths = {e["engine"]: e for e in run.events_of("worker_died")}
    entries = {entry["generation"]: entry for results in run.results.values() for fit in results or ()
               for entry in (fit.timings or {}).get("recoveries") or [] if entry["rank"] == 0}
    events = []
    for generation, entry in sorted(entries.items()):
        t = entry.get("resumed_at") or entry["joined_at"]
        if entry.get("grown"):
            events.append({"t": t, "event": "grown", "size": entry["size"], "step": entry["step"],
                           "epoch": entry["epoch"]})
            continue
        death = deaths.get(reformed_after.get(generation))
        if death is not None:
            events.append({"t": t, "event": "recovered", "engine": death["engine"], "rank": death["rank"],
                           "size": entry["size"], "step": entry["step"], "recovery_s": round(t - death["t"], 2)})
    return sorted(events, key=lambda e: e["t"])
