"""The parameter-server family's halves: what every strategy that trains through nbdist's PS shares.

Worker half (`PsWorker`): Keras' own `fit` on the worker's data, with the optimizer's
`apply_gradients` replaced by one push-pull with the shards (a `tf.numpy_function` in the
compiled step). Its hooks, for the strategies built on it:

- `fit_data(request)`: the `fit` arguments of this worker's data (default: an equal strided shard);
- `connect(exchange, model, variables)`: route training through the PS; returns callbacks it needs;
- `train(request, exchange, data, callbacks)`: run `fit` (default: Keras' own, once);
- `optimizer_spec(optimizer)`: what the PS needs of the optimizer, refusing what it cannot apply;
- `exchange_class`: the `PushPull` kind it exchanges with.

Controller half (`PsStrategy`): starts the shards (`PsService`), hands them their settings
(`shard_settings(workers)`: the update rule and the release policy), relays live controls
and telemetry, checks the shards' health, collects their logs and checkpoints at the end.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, replace

import numpy as np

from ..datasets import dynamic_data, structures
from ..host import interrupt_guard
from ..keras_semantics import optimizer_state
from ..errors import NbdistError, OptionError, ParameterServerFailed, RunStalled
from ..host.hetero import Profile, Slowdown, StepCost, parse_simulate
from ..keras_semantics.keras_bridge import apply_gradients_restored, build_for_training, keras_train_step
from ..limits import LIMITS
from ..ps import checkpoint, delay, rules
from ..ps.client import PsClient, merged
from ..ps.exchange import PushPull
from ..ps.flat_layout import layout_digest
from ..ps.partition import partition
from ..ps.service import PsService
from ..datasets.sharding import shard_fit_data
from .virtual_clock import VirtualClock, measure_step_cost
from . import options as opt
from .base import Reports, Strategy, Worker
from .ps_tables import OptimizerTables, optimizer_label
from .ps_callbacks import (epoch_agreement, follow_learning_rate, restore_best_weights, shared_statistics,
                           silence_marks, statistics_variables, stop_when_asked)
from .stall_watch import Silence, publish, silent_workers, stall_timeout

# what every parameter-server run may record, beyond the common kinds
PS_EVENTS = {
    "shard_restarted": lambda e, run: (f"parameter-server shard {e['shard']} died and was restarted from its "
                                       f"checkpoint (version {e['version']}) in {e['recovery_s']:.1f} s; "
                                       f"{e['restarts_left']} restart(s) left"),
    "resumed": None,  # from a checkpoint (--resume): the run's first line says so
    "worker_dropped": None,  # a worker the shards stopped waiting for (its death is told)
}


class PsWorker(Worker):
    """One worker of a parameter-server strategy; see the module docstring for its hooks."""

    exchange_class = PushPull
    uses_ps_optimizer = True  # the PS applies the cell's optimizer (ADSP's workers apply their own)
    routes_other_optimizers = True  # a train_step's optimizers besides the model's get tables of their own

    def fit(self, request):
        model, optimizer = request.model, request.model.optimizer
        if not self.routes_other_optimizers:
            self.refuse_other_optimizers(request)
        spec = self.optimizer_spec(optimizer)  # refuse an optimizer the PS cannot apply, before any work
        self.fit_timings, self.dealt = {}, None  # fit_data deals this worker's batches, where it can
        self.fits_begun = getattr(self, "fits_begun", 0) + 1  # a pull waits for rank 0's init of the same fit
        data = self.fit_data(request)
        build_for_training(model, self.arrays[0] if self.dealt is not None else data["x"])
        variables = list(model.trainable_variables)
        names = variable_names(model)["trainable"]
        plan = partition({n: int(np.prod(v.shape)) for n, v in zip(names, variables)}, len(self.config["shards"]))
        client = self._client()
        self.silence.tables[0] = f"the model's optimizer, {optimizer_label(optimizer)}"
        exchange = self.exchange_class(client, plan, names, request.samples_per_step, Slowdown(self.simulated))
        if self.dealt is not None:  # --data dynamic: pushes report the batches taken, their answers bring the next
            self.dealt.client, exchange.on_answer, exchange.report = client, self.dealt.answered, self.dealt.report
        self.fit_optimizer = optimizer  # the other optimizers a train_step steps: tables 1, 2, ...
        self.optimizer_tables = OptimizerTables(self, client, first=1, batch=request.samples_per_step)
        user = self.user_callbacks(request)
        # the wait for a shard's reply sits inside a TensorFlow op, out of reach of Python's signal handler:
        # an interrupt (the kernel's, or a dead kernel's watcher) makes that wait give up at once
        with interrupt_guard.on_interrupt(client.abort):
            try:
                if self.rank == 0:
                    timed = {"x": self.arrays[0], "y": self.arrays[1]} if self.dealt is not None else data
                    _init_shards(client, model, spec, plan, names, self._step_cost(model, timed, request),
                                 fit=self.fits_begun)
                shapes = dict(zip(names, (tuple(v.shape) for v in variables)))
                layouts = [layout_digest({n: shapes[n] for n in shard}) for shard in plan]
                assign(variables, exchange.pull(layouts, fit=self.fits_begun))
                self._tune(exchange, request, spec)
                with apply_gradients_restored(model):
                    own = self.connect(exchange, model, variables)
                    callbacks = self._callbacks(client, exchange, model, user, own)
                    with dynamic_data.epochs_of_any_length():
                        history = self.train(request, exchange, data, callbacks)
                    for callback in own:
                        getattr(callback, "finish", lambda: None)()
                    getattr(exchange, "flush", lambda: None)()
                    exchange.close()  # the exchange still in flight is applied before the end barrier
                    self.fit_timings.update(exchange.overlap_timings())
                assign(variables, exchange.done())  # waits for the other workers; the final PS weights
                if self.uses_ps_optimizer:
                    _take_statistics(client, model)
                self.optimizer_tables.end()  # (a GAN's two optimizers: their variables' final weights over those)
                if self.uses_ps_optimizer and exchange.steps:  # (a GAN's train_step may never step the model's own)
                    _take_optimizer_state(client, rules.inner_of(optimizer), variables, names)
                restore_best_weights(user, model)
                if self.dealt is not None:
                    self.fit_timings["batches"] = {str(e): b for e, b in self.dealt.trained.items()}
                return history
            finally:
                exchange.abandon()  # after a failure or an interrupt (a finished fit closed it already)
                self.optimizer_tables.abandon()
                self.silence.stop()
                client.close()

    # -- the optimizer steps the step seam routes here (a loop's; a train_step's other optimizers) ----------
    def routes_in_fit(self, optimizer) -> bool:
        return self.routes_other_optimizers and optimizer is not getattr(self, "fit_optimizer", None)

    @contextlib.contextmanager
    def loop_context(self):
        """A loop cell's connection to the shards: a table for each optimizer it steps (`ps_tables`)."""
        client = self._client()
        self.optimizer_tables = OptimizerTables(self, client)
        virtual = self.config.get("virtual")
        if virtual is not None:  # the step cost --simulate gives (`orders_loop_pushes`)
            self.virtual_step = StepCost(**virtual["step"])
        with interrupt_guard.on_interrupt(client.abort):
            try:
                yield
            finally:
                self.optimizer_tables.abandon()
                self.silence.stop()
                client.close()

    def step(self, index, optimizer, grads, variables, apply):
        self.optimizer_tables.step(index, optimizer, grads, variables)
        return None

    def poll_controls(self):
        """A pause holds the pushes on the shards; a stop is in their answers."""
        return np.array([0.0, float(self.optimizer_tables.stop_asked())], np.float32)

    def act_on_controls(self, flags) -> None:
        from ..keras_semantics.step_seam import LoopStopped

        raise LoopStopped("the run was stopped")

    def statement_ended(self) -> None:
        self.optimizer_tables.end()

    def loop_extra(self) -> dict:
        return self.optimizer_tables.metrics()

    def _client(self) -> PsClient:
        """This worker's connection to the shards, watched for silence (`--stall-timeout`) until `silence.stop()`."""
        client = PsClient(self.config["shards"], bytes.fromhex(self.config["key"]), self.rank,
                          ps_timeout_s=LIMITS.ps_restart_wait_s if self.config.get("ps_restarts")
                          else LIMITS.ps_reply_s)
        self.silence = client.watch = Silence(publish, stall_timeout(self.values, LIMITS.ps_silence_s))
        return client

    def _tune(self, exchange, request, spec) -> None:
        """The exchange as the shards and the options say: the virtual clock's step cost, overlapped exchanges."""
        if self.virtual_step is not None or exchange.pulled.get("step"):
            self.virtual_step = StepCost(**(exchange.pulled.get("step") or self.virtual_step.to_json()))
            exchange.virtual = VirtualClock(self.simulated or Profile(), self.virtual_step,
                                            request.samples_per_step or 32)
        if self.config.get("momentum") is not None:  # --momentum: the shards' momentum, not the cell's
            spec = replace(spec, momentum=float(self.config["momentum"]))
        self.fit_timings.update(overlap=overlap_decision(self.config.get("overlap") or "off", spec,
                                                         self.config.get("rule")))
        if self.fit_timings["overlap"] == "on":
            exchange.overlap()
            if self.dealt is not None:
                self.dealt.depth = 2  # the next step's batch is taken before this step's answer came

    def _callbacks(self, client, exchange, model, user: list, own: list) -> list:
        """The fit's callbacks around the user's: batches dealt, the running statistics kept on the shards (when
        the PS applies the optimizer), epochs agreed (rank 0 then holding the job's model for the cell's epoch-end
        callbacks), the stall watch's marks (before the user's: a user callback
        that hangs is silence), the PS's learning rate followed (rank 0, then), this strategy's own, a graceful
        stop."""
        leads = self.rank == 0 and self.uses_ps_optimizer
        follow = [follow_learning_rate(client, model.optimizer)] if leads else []
        dealt = [dynamic_data.epoch_follower(self.dealt)] if self.dealt is not None else []
        statistics = statistics_variables(model, variable_names(model)["non_trainable"])
        shared = [shared_statistics(client, statistics)] if statistics and self.uses_ps_optimizer else []
        variables, names = list(model.trainable_variables), variable_names(model)["trainable"]

        def take_state():  # (only an optimizer the fit steps: a GAN's unused own one stays unbuilt)
            if exchange.steps:
                _take_optimizer_state(client, rules.inner_of(model.optimizer), variables, names)

        agreement = epoch_agreement(client, exchange, self.share, variables if leads else None,
                                    take_state if leads else None)
        return [*dealt, *shared, agreement, silence_marks(self.silence), *user,
                *follow, *own, stop_when_asked(exchange, self.dealt)]

    def optimizer_spec(self, optimizer) -> rules.OptimizerSpec:
        """What the PS needs of the cell's optimizer; the delay rules refuse all but SGD."""
        spec = rules.spec_from_keras(optimizer)
        if self.config.get("rule") in delay.PRESETS and spec.kind != "SGD":
            raise OptionError(f"--strategy {self.spec['strategy']} is an SGD rule (learning rate and momentum from "
                              f"the cell's optimizer); the cell compiled {spec.kind}. Compile with "
                              "keras.optimizers.SGD(lr, momentum=...), or use --strategy asgd to keep your optimizer.")
        return spec

    @property
    def simulated(self) -> dict | None:
        """This worker's `--simulate` profile, if any."""
        return (self.config.get("simulate") or [None] * self.size)[self.rank]

    def _step_cost(self, model, data: dict, request) -> dict | None:
        """Rank 0, on the virtual clock: the run's step cost, given or measured here once (then fixed)."""
        virtual = self.config.get("virtual")
        if virtual is None:
            return None
        step = StepCost(**virtual["step"]) if virtual.get("step") else measure_step_cost(
            model, data, request.samples_per_step or 32)
        self.virtual_step = step
        return step.to_json()

    def fit_data(self, request) -> dict:
        """The `fit` arguments of this worker's data: batches dealt by shard 0 (`--data dynamic`, where the
        cell fits on arrays), else an equal strided shard (or its `--shards speed` share); a worker that joined
        the running run starts its first fit at the epoch the PS gave it."""
        mode = self.config.get("data") or {}
        why = dynamic_data.applies(request) if mode.get("mode") == "dynamic" else None
        if mode.get("mode") == "dynamic" and why is None:
            data = self._dealt_data(request, mode["seed"])
        else:
            data = shard_fit_data(request, self.rank, self.size, fractions=self.config.get("fractions"))
            if why is not None:
                self.fit_timings["data"] = f"static shards: {why}"
        first = self.config.pop("first_epoch", None)
        if first is not None:
            data["initial_epoch"] = max(first, request.args.get("initial_epoch") or 0)
        return data

    def _dealt_data(self, request, seed: int) -> dict:
        """`fit`'s arguments under `--data dynamic`: a pipeline of the batches shard 0 deals this worker from the
        whole arrays (`self.arrays`: x, y for building the model and timing a step); validation stays sharded."""
        x, y, weights = dynamic_data.training_arrays(request)
        self.arrays = (x, y)
        self.dealt = dynamic_data.DealtBatches(None, structures.length(x), seed,
                                               int(request.batch_size or 32), shuffle=request.shuffle is not False)
        return dynamic_data.fit_arguments((x, y, weights), self.dealt, request, self.rank, self.size)

    def share(self, epoch: int) -> float:
        """This worker's weight in the epoch's averaged logs: the samples it trained (dealt), or its shard."""
        if self.dealt is not None:
            return max(self.dealt.samples(epoch), 1)
        return (self.config.get("fractions") or [1.0] * self.size)[self.rank]

    def reporter_clock(self, exchange: PushPull):
        """What the worker's records call the time: wall time, or the run's start plus virtual seconds."""
        if exchange.virtual is None:
            return None
        start = self.spec.get("cell_start") or 0.0
        return lambda: start + exchange.virtual.now

    def train(self, request, exchange: PushPull, data: dict, callbacks: list):
        """Keras' `fit` over this worker's data, every step through the PS."""
        reporter = self.make_reporter(request.samples_per_step, extra=exchange.metrics,
                                      clock=self.reporter_clock(exchange))
        if self.dealt is not None:
            reporter.expected_steps = self.dealt.expected_steps(self.size)
        return request.run_plain(callbacks=[*callbacks, reporter], verbose=0, **data)

    def connect(self, exchange: PushPull, model, variables) -> list:
        """Route training through the PS; returns the callbacks that need. Default: every step's gradient
        goes to the PS instead of the local optimizer."""
        optimizer = model.optimizer
        scaled = rules.inner_of(optimizer) is not optimizer  # (a LossScaleOptimizer's scale is one of its variables)
        if not optimizer.built and (scaled or keras_train_step(model)):  # (one no step uses stays unbuilt)
            optimizer.build(variables)
        optimizer.apply_gradients = pushed(exchange, variables, optimizer)
        exchange.tolerate_non_finite(scaled)
        model.jit_compile = False  # XLA cannot compile a numpy_function
        return []


OVERLAP_MOMENTUM_LIMIT = 0.45  # the cell's SGD momentum above which a one-version delay risks divergence


def overlap_decision(choice: str, spec: rules.OptimizerSpec, rule: str | None) -> str:
    """on or off, with the reason when `auto` said off: the cell's own SGD momentum plus the implicit
    momentum of a one-step delay (1/2, Mitliagkas et al. 2016) above 0.95 diverges; the delay rules set
    their own momentum from the measured delay."""
    if choice != "auto":
        return choice
    if rule is None and spec.kind == "SGD" and (spec.momentum or 0.0) > OVERLAP_MOMENTUM_LIMIT:
        return (f"off: the SGD momentum {spec.momentum:g} plus the one-step delay of an overlapped "
                "exchange would exceed 0.95 (use --overlap on to force it, or --strategy ddc-asgd)")
    return "on"


def data_fractions(shards: str, simulate: str | None, profiles: list[Profile]) -> list[float] | None:
    """Each worker's share of the data for `--shards` (None: equal strided shards)."""
    if shards != "speed":
        return None
    if not simulate or all(p.speed == profiles[0].speed for p in profiles):
        raise OptionError("--shards speed splits the data by the --simulate speeds, and this run gives none that "
                          "differ; add --simulate 'speed=1,0.5,...', or use --strategy ashl, which measures "
                          "each worker's real speed and sizes its batches by it.")
    return [p.speed for p in profiles]


def _init_shards(client, model, spec, plan, names, step: dict | None = None, fit: int = 1) -> None:
    """Rank 0 hands each shard its variables (shard 0 also the non-trainable ones, for checkpoints) and
    the optimizer's state for them, so training continues from the notebook's optimizer. A later fit of the same
    model (`model`: which one, on rank 0) keeps the shards' state; another model's replaces it."""
    named = variable_names(model)
    trainable = dict(zip(names, (v.numpy() for v in model.trainable_variables)))
    frozen = dict(zip(named["non_trainable"], (v.numpy() for v in model.non_trainable_variables)))
    slots, iterations = optimizer_state.export(rules.inner_of(model.optimizer), model.trainable_variables, names)
    per_shard = [{n: trainable[n] for n in shard} | {k: a for k, a in slots.items() if k.rsplit(":", 1)[0] in shard}
                 | (frozen if i == 0 else {}) for i, shard in enumerate(plan)]
    client.request("init", per_shard, optimizer=asdict(spec), trainable=names, layout=named["layout"],
                   iterations=iterations, step=step, fit=fit, model=model_token(model))


def model_token(model) -> str:
    """Which model this is, for the shards (a later fit of another model replaces their table): a mark kept on the
    model itself, as an object id may be reused once the last model is gone."""
    import uuid

    if getattr(model, "_nbdist_ps_token", None) is None:
        model._nbdist_ps_token = uuid.uuid4().hex
    return model._nbdist_ps_token


def _take_statistics(client, model) -> None:
    """The running statistics every worker's steps left on the shards, into this worker's model."""
    variables = statistics_variables(model, variable_names(model)["non_trainable"])
    if variables:
        reply = client.request("statistics", [{}], only=0, names=[n for n, _ in variables])[0]
        for name, variable in variables:
            variable.assign(reply.arrays[name])


def _take_optimizer_state(client, optimizer, variables, names) -> None:
    """The PS's optimizer slots and step count into this worker's optimizer, as a local fit leaves them."""
    state = merged(client.request("state"))
    step = state.get(optimizer_state.ITERATIONS)
    optimizer_state.load(optimizer, variables, names, state, None if step is None else int(step))


def variable_names(model) -> dict[str, list[str]]:
    """Names of the model's variables that are the same on every engine and in every run.

    Keras' own paths (``sequential_3/dense_7/kernel``) count the models an engine built
    before, so they differ between engines; the position among the trainable (``t0003``)
    or non-trainable (``n0000``) variables does not. `layout` is `model.weights` order.
    """
    trainable = [f"t{i:04d}:{v.name}" for i, v in enumerate(model.trainable_variables)]
    non_trainable = [f"n{i:04d}:{v.name}" for i, v in enumerate(model.non_trainable_variables)]
    by_id = {id(v): n for v, n in zip(model.trainable_variables, trainable)}
    by_id |= {id(v): n for v, n in zip(model.non_trainable_variables, non_trainable)}
    return {"trainable": trainable, "non_trainable": non_trainable, "layout": [by_id[id(w)] for w in model.weights]}


def assign(variables, values) -> None:
    for variable, value in zip(variables, values):
        variable.assign(value)


def pushed(exchange: PushPull, variables, optimizer=None):
    """An `apply_gradients` that sends the gradients to the PS and installs the weights it returns. For a
    `LossScaleOptimizer` (`optimizer`) it sends them unscaled and keeps the loss scale as that optimizer keeps it
    locally (`loss_scaled`)."""
    import keras
    import tensorflow as tf

    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def apply(grads_and_vars):
        pairs = list(grads_and_vars)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in pairs]
        if scaled:
            finite = optimizer.check_finite(grads)
            grads = [g / tf.cast(optimizer.dynamic_scale, g.dtype) for g in grads]
        new = tf.numpy_function(exchange.push, grads, [v.dtype for v in variables], stateful=True,
                                name="nbdist_push_pull")
        for variable, value in zip(variables, new):
            variable.assign(tf.ensure_shape(value, variable.shape))
        if scaled:
            loss_scaled(optimizer, finite)

    return apply


def loss_scaled(optimizer, finite) -> None:
    """A `LossScaleOptimizer`'s own bookkeeping after a step, as Keras' does it: an overflowing step (the shards
    refused its non-finite gradients, applying nothing) halves the scale; `dynamic_growth_steps` finite ones in a
    row double it."""
    import tensorflow as tf

    def grow():
        optimizer.step_counter.assign(0)
        optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 2.0)

    def count():
        optimizer.step_counter.assign_add(1)

    def shrink():
        optimizer.step_counter.assign(0)
        optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 0.5)

    tf.cond(finite, lambda: tf.cond(tf.equal(optimizer.step_counter, optimizer.dynamic_growth_steps - 1),
                                    grow, count), shrink)


class PsStrategy(Strategy):
    """The controller half of every parameter-server strategy: shards, controls, health, result."""

    reads = (*opt.PARAMETER_SERVER, opt.MOMENTUM)
    reports = Reports(panels=("loss", "throughput", "staleness", "staleness distribution"),
                      controls=("pause", "resume", "stop", "lr_scale", "max_staleness", "evict"), events=PS_EVENTS)
    worker_class = PsWorker
    loop_refusal = None
    survives_worker_loss = True
    uses_control_bus = False  # the shards carry the controls (they hold pushes, tell workers to stop)

    def __init__(self, values):
        super().__init__(values)
        if not self.value("simulate"):
            data_fractions(self.value("shards"), None, [])  # refuses --shards speed before the cell is read
        self.service: PsService | None = None
        self.cluster = None

    def prepare(self, run, cluster) -> dict:
        profiles = parse_simulate(self.value("simulate"), len(run.workers))
        fractions = data_fractions(self.value("shards"), self.value("simulate"), profiles)
        resume = self._checkpoint_to_resume()
        self.cluster = cluster
        settings = self.shard_settings(len(run.workers))
        data = opt.data_config(self, run, self.deals_batches())
        if data is not None:
            settings["data"] = data  # shard 0 deals the batches
        self.service = PsService(run.id, self.value("ps_shards"), len(run.workers), settings,
                                 self.value("checkpoint_dir"), self.value("checkpoint_every"),
                                 restarts=self.shard_restarts(settings))
        towards = cluster.address_towards(run.workers)
        on_engines = self.value("ps_on") == "engines"
        self.service.start(towards, cluster if on_engines else None, run.workers if on_engines else None)
        run.services = [{"kind": "shard", "index": s.index, "pid": s.pid, "host": s.host, "address": s.address,
                         "engine": s.engine} for s in self.service.shards]
        if resume is not None:
            self.service.restore(resume)
            run.record("resumed", path=resume["path"], version=resume.get("version"))
        return {"fractions": fractions, "shards": self.service.addresses, "key": self.service.key.hex(),
                "ps_restarts": self.service.restarts_left,
                "overlap": self.overlaps(), "momentum": settings.get("momentum"),
                "rule": (settings["rule"] or {}).get("preset"), "data": data,
                **self.clock_config(len(run.workers))}

    def orders_loop_pushes(self) -> bool:
        from ..host.hetero import parse_clock

        clock, step = parse_clock(self.value("simulate"))
        return clock == "virtual" and step is not None

    @property
    def takes_newcomers(self) -> bool:
        """Real-clock runs over equal shards of the rules that read --max-workers (not ASHL's allocation,
        ADSP's commits or synchronous rounds: they plan for the workers they started with)."""
        return any(o is opt.MAX_WORKERS for o in self.reads) and not self.value("simulate") and self.equal_data()

    def admit(self, run, eid: int, rank: int, config: dict) -> dict:
        """Every shard takes worker `rank` into the running fit; it pulls the current weights and trains batches
        shard 0 deals it from the open epoch on (`--data dynamic`), or its strided share 1/(rank + 1) of the data
        from the epoch after the last one any worker finished."""
        from .newcomers import Refused

        epochs = max((p.get("epochs") or 0 for p in run.progress.values()), default=0)
        if not epochs:
            raise Refused("the run has not reported its first step yet", retry=True)
        answer = self.service.admit(rank, epochs)
        if not answer.get("admitted"):
            raise Refused(answer.get("reason") or "refused by the parameter server")
        return {**config, "first_epoch": answer["first_epoch"], "simulate": None, "fractions": None}

    def continues_without(self, run, cluster, dead: int, survivors: list[int]) -> bool:
        if self.service is not None and not self.service.failure and dead in run.workers:
            try:
                self.service.drop(run.workers.index(dead))
            except NbdistError:  # the shards' own heartbeat check drops it in seconds
                pass
        return super().continues_without(run, cluster, dead, survivors)

    def shard_restarts(self, settings: dict) -> int:
        """--ps-restarts as the shards apply it: none on the virtual clock (a restarted shard would not know
        the workers' simulated times), with a shard extension (ASHL's allocation and phase live there) or with
        batches on demand (shard 0's dealing is not in its checkpoint: a restarted dealer left the workers
        waiting; the run fails with its checkpoint instead, and `--resume` continues from it)."""
        if self.clock == "virtual" or settings.get("extension") or settings.get("data"):
            return 0
        return self.value("ps_restarts")

    def overlaps(self) -> str:
        """--overlap as the workers apply it: off where the strategy does not read it, under --max-staleness
        (a bound asks for fresh weights) and on the virtual clock (which charges each exchange in full)."""
        if not any(o is opt.OVERLAP for o in self.reads) or self.clock == "virtual" or \
                self.value("max_staleness") is not None:
            return "off"
        return self.value("overlap")

    def equal_data(self) -> bool:
        """Whether the workers share the data equally: batches dealt on demand, or equal strided shards (not
        `--shards speed`, nor a strategy that sizes each worker's data itself)."""
        return self.value("shards") != "speed" and self.worker_class.fit_data is PsWorker.fit_data

    def deals_batches(self) -> bool:
        """Whether shard 0 deals the batches (`--data dynamic`, where the strategy reads it and shares equally)."""
        return self.equal_data() and any(o is opt.DATA for o in self.reads) and self.value("data") == "dynamic"

    def array_shards(self) -> bool:
        return self.equal_data() and not self.deals_batches()  # dealt batches come from the whole arrays

    def shard_settings(self, workers: int) -> dict:
        """How the shards treat pushes: the update rule (None: the cell's optimizer) and the release policy."""
        return {"max_staleness": self.value("max_staleness"), "rule": None, "synchronous": False,
                "momentum": self.value("momentum"), "start_barrier": True, "clock": self.clock}

    def _checkpoint_to_resume(self) -> dict | None:
        choice = self.value("resume")
        if not choice:
            return None
        directory = self.value("checkpoint_dir")
        path = checkpoint.latest(directory) if choice == "latest" else choice
        if path is None or not os.path.exists(path):
            raise OptionError(f"--resume found no checkpoint ({path or 'none in ' + os.path.abspath(directory)}); "
                              "run once without --resume, or give --resume PATH to a run-N.npz file.")
        return checkpoint.load(path)

    def control(self, action: str, value=None) -> list[dict]:
        if self.service is None:
            raise OptionError("the run has ended; there is nothing to control.")
        return self.service.control(action, value)

    def telemetry(self) -> dict:
        if self.service is None or self.service.failure:
            return {}
        try:
            return self.service.recent()
        except NbdistError:  # a shard that does not answer is the monitor's to report
            return {}

    def check(self, run) -> None:
        self._take_service_events(run)
        if self.service is not None and self.service.failure:
            run.checkpoint = {**(self.service.last_checkpoint or {}), "weights": self.service.checkpoint_weights()}
            saved = self.service.last_checkpoint
            where = (f"The last checkpoint (PS version {saved['version']}, {time.time() - saved['saved_at']:.0f} s "
                     f"old) is {saved['path']}; its weights are in nbdist.last_run.weights "
                     "(model.set_weights(nbdist.last_run.weights)), or re-run the cell with --resume."
                     if saved else "No checkpoint had been saved yet.")
            raise ParameterServerFailed(f"the parameter server failed during run {run.id}: "
                                        f"{self.service.failure} {where}")
        self._check_silence(run)

    def _check_silence(self, run) -> None:
        """Every live worker silent past --stall-timeout (not while the run is paused, nor counting the pause): the
        run fails, naming what each one waits for."""
        controls = [e for e in run.events if e["event"] in ("control:pause", "control:resume", "control:stop")]
        if controls and controls[-1]["event"] == "control:pause":
            return
        gone = run.dead_ranks() | run.evicted_ranks()
        live = {rank: eid for rank, eid in enumerate(run.workers) if rank not in gone and eid not in run.results}
        resumed = max((e["t"] for e in controls if e["event"] == "control:resume"), default=0.0)
        said = silent_workers(run, live, stall_timeout(self.values, LIMITS.ps_silence_s), resumed)
        if said is not None:
            raise RunStalled(f"run {run.id}: {said}")

    def _take_service_events(self, run) -> None:
        """The kernel's own PS events (shard restarts) onto the run, as they happen."""
        if self.service is not None and self.service.restarts:
            for event in self.service.restarts:
                run.record(event.pop("event"), **event)
            self.service.restarts = []

    def finish(self, run) -> None:
        if self.service is None:
            return
        self._take_service_events(run)
        outcome = self.service.stop(self.cluster)
        if outcome["checkpoint"] and not run.checkpoint:
            run.checkpoint = {**outcome["checkpoint"], "weights": self.service.checkpoint_weights()}
        run.ps = outcome["shards"]
        for event in (e for shard in outcome["shards"] for e in shard.get("events", [])):
            if event["event"] == "worker_dropped":
                run.record("worker_dropped", **{k: v for k, v in event.items() if k != "event"})
        self.service = None
