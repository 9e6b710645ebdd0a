"""`nfdt`: asynchronous data parallel training through nbdist's parameter server.

Keras' own `fit` runs on every worker over its shard; the optimizer's `apply_gradients`
is replaced by one push-pull with the PS (a `tf.numpy_function` inside the compiled
step): the gradient goes to the shards, which apply the user's optimizer, and the reply
carries the new weights the next step computes on.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

import numpy as np

from ..errors import NbdistError, OptionError, ParameterServerFailed
from ..hetero import Slowdown, parse_simulate
from ..keras_bridge import build_for_training
from .. import optimizer_state
from ..ps import checkpoint, delay, rules
from ..ps.client import PsClient, PsRefused, merged
from ..ps.partition import partition
from ..ps.service import PsService
from ..rendezvous import rendezvous_address
from ..sharding import shard_fit_data
from .base import Strategy, Worker

DEFAULT_CHECKPOINT_DIR = "nbdist-checkpoints"


MAX_NON_FINITE_IN_A_ROW = 10
EMA_WEIGHT = 0.1
WARMUP_STEPS = 3
PAUSE_FACTOR = 5.0
COMPRESSION_REVIEW_STEPS = 20


class PushPull:
    """The worker's side of one step: push this gradient, receive the weights to compute on next."""

    def __init__(self, client: PsClient, plan: list[list[str]], names: list[str], batch_size: int | None = None,
                 slowdown: Slowdown | None = None):
        self.client, self.plan, self.names = client, plan, names
        self.shard_of = {name: i for i, shard in enumerate(plan) for name in shard}
        self.batch_size = batch_size  # weights this worker's gradients in a synchronous (ssgd) average
        self.slowdown = slowdown or Slowdown(None)
        self.versions = [0] * len(plan)
        self.staleness = 0
        self.gamma = None
        self.steps = 0
        self.non_finite = 0  # pushes in a row the PS rejected for NaN / inf
        self.stop_requested = False  # the PS said: end this fit (a graceful stop, or this worker was evicted)
        self.phase: str | None = None  # ASHL: "ahl" or "shl", as the PS answered
        self.compressor = None  # ASHL: a PushCompressor
        self.period = 1  # ASHL: push every `period` steps, the mean gradient of the batches in between
        self.accumulated = 0
        self._sum: dict[str, np.ndarray] = {}
        self._pushed_batches = 1
        self._reviewed_at = 0
        self.after_exchange = None  # ASHL: called after each exchange, in the thread that exchanges
        self.current: list[np.ndarray] = []  # the weights last received
        self.steps_per_epoch = 0
        self.shapes: dict[str, tuple] = {}  # name -> (shape, dtype), for probes
        # exponential moving averages of this worker's step: compute (simulated slowness included) and exchange
        self.compute_s: float | None = None
        self.exchange_s: float | None = None
        self.timed_steps = 0
        self._exchange_ended: float | None = None

    def exchange(self, kind: str) -> list[np.ndarray]:
        """Weights from a `pull` (start of fit) or a `done` (end of fit, after every worker finished)."""
        return self._weights(self.client.request(kind))

    def push(self, *gradients) -> list[np.ndarray]:
        grads = dict(zip(self.names, gradients))
        self.steps += 1
        self.slowdown.before_exchange()
        started = time.perf_counter()
        if self._exchange_ended is not None:  # compute, simulated slowness included
            self._observe_compute(started - self._exchange_ended)
        if self.period > 1:
            self._accumulate(grads)
            if self.accumulated < self.period:  # ASHL: this worker pushes every `period` steps
                self.slowdown.local_step()
                self._exchange_ended = time.perf_counter()
                return self.current
            grads = self._take_accumulated()
        return self._exchange(grads, self.batch_size, started)

    def flush(self) -> None:
        """Push what is still accumulated (the end of a fit), so no computed gradient is lost."""
        if self.accumulated:
            self._exchange(self._take_accumulated(), self.batch_size, time.perf_counter())

    def _accumulate(self, grads: dict) -> None:
        if self.accumulated == 0:
            self._sum = {n: np.array(g, dtype=np.float64) for n, g in grads.items()}
        else:
            for n, g in grads.items():
                self._sum[n] += g
        self.accumulated += 1

    def _take_accumulated(self) -> dict:
        """The mean gradient of the accumulated batches, all computed on the same weights: one batch of k*b."""
        count, self.accumulated = self.accumulated, 0
        self._pushed_batches = count
        return {n: (g / count).astype(np.float32) for n, g in self._sum.items()}

    def _exchange(self, grads: dict, batch: int | None, started: float) -> list[np.ndarray]:
        fields = {"step": self.steps, "batch": batch * self._pushed_batches if batch else batch}
        self._pushed_batches = 1
        if self.compressor is not None:
            grads, fields = self._compress(grads, fields)
        moved = self.client.bytes_sent + self.client.bytes_received
        try:
            replies = self.client.request("push", _split(grads, self.shard_of, len(self.plan)), [{"version": v} for v in self.versions],
                                          **fields)
        except PsRefused as exc:
            if exc.reason != "non_finite":
                raise
            return self._skip_non_finite(exc)
        finally:
            self.slowdown.after_exchange(self.client.bytes_sent + self.client.bytes_received - moved)
            self._exchange_ended = time.perf_counter()
        held_s = max(r.header.get("held_s") or 0.0 for r in replies)  # waiting for a round: not communication
        self.exchange_s = _ema(self.exchange_s, max(self._exchange_ended - started - held_s, 0.0))
        self.non_finite = 0
        self.staleness = max(r.header.get("staleness", 0) for r in replies)
        gammas = [r.header["gamma"] for r in replies if r.header.get("gamma") is not None]
        self.gamma = min(gammas) if gammas else None
        self.phase = replies[0].header.get("phase", self.phase)
        weights = self._weights(replies)
        if self.after_exchange is not None:
            self.after_exchange()
        return weights

    def _observe_compute(self, seconds: float) -> None:
        self.timed_steps += 1
        if self.timed_steps <= WARMUP_STEPS:  # tracing and first batches are not the step's cost
            return
        if self.compute_s is not None and seconds > PAUSE_FACTOR * self.compute_s:
            return  # validation or an epoch's end between two steps: a pause, not compute
        self.compute_s = _ema(self.compute_s, seconds)

    def reset_timing(self) -> None:
        """Measure compute afresh (a new batch size)."""
        self.compute_s, self.timed_steps = None, 0

    def _compress(self, grads: dict, fields: dict) -> tuple[dict, dict]:
        """Encode under this worker's compression mode, reviewed every few steps from its own timings."""
        compressor = self.compressor
        if self.steps - self._reviewed_at >= COMPRESSION_REVIEW_STEPS and self.compute_s is not None \
                and self.exchange_s is not None:
            self._reviewed_at = self.steps
            changed = compressor.review(self.exchange_s, self.compute_s * self.period,
                                        self.steps / max(self.steps_per_epoch, 1))
            if changed:
                fields["compression_reason"] = changed
        fields["compression"] = compressor.mode
        return compressor.encode(grads), fields

    def probe(self) -> tuple[float, int]:
        """One timed round trip of a push's size that changes nothing (ASHL profiling): (seconds, bytes)."""
        zeros = {name: np.zeros(shape, dtype) for name, (shape, dtype) in self.shapes.items()}
        moved = self.client.bytes_sent + self.client.bytes_received
        started = time.perf_counter()
        self.client.request("probe", _split(zeros, self.shard_of, len(self.plan)))
        self.slowdown.after_exchange(self.client.bytes_sent + self.client.bytes_received - moved)
        return time.perf_counter() - started, self.client.bytes_sent + self.client.bytes_received - moved

    def _skip_non_finite(self, refusal) -> list[np.ndarray]:
        """A NaN / inf gradient is not applied; the step continues from the PS's current weights."""
        self.non_finite += 1
        if self.non_finite >= MAX_NON_FINITE_IN_A_ROW:
            raise FloatingPointError(
                f"{self.non_finite} gradients in a row held NaN or inf ({refusal}); the PS applied none of them "
                "and kept its weights. Lower the learning rate, check the inputs for NaN, or add gradient "
                "scaling, then re-run (with --resume to continue from the last checkpoint).")
        return self.exchange("pull")

    def _weights(self, replies) -> list[np.ndarray]:
        self.versions = [r.header["version"] for r in replies]
        self.stop_requested = self.stop_requested or any(r.header.get("stop") for r in replies)
        new = merged(replies)
        self.current = [np.array(new[name]) for name in self.names]  # own copies: the frames are read-only
        return self.current

    def metrics(self) -> dict:
        extra = {"phase": self.phase} if self.phase else {}
        return {"staleness": self.staleness, "gamma": self.gamma, "bytes_sent": self.client.bytes_sent,
                "comm_s": round(self.client.comm_s, 4), "compute_s": _round(self.compute_s), **extra}


def _ema(average: float | None, value: float, weight: float = EMA_WEIGHT) -> float:
    return value if average is None else (1 - weight) * average + weight * value


def _round(value: float | None):
    return None if value is None else round(value, 5)


def _split(arrays: dict, shard_of: dict[str, int], shards: int) -> list[dict]:
    """Arrays per shard; a compressed variable's parts (``name|idx``, ``name|val``) go with it."""
    out: list[dict] = [{} for _ in range(shards)]
    for key, array in arrays.items():
        out[shard_of[key.split("|")[0]]][key] = array
    return out


class NfdtWorker(Worker):
    """One asynchronous worker: trains its shard with Keras' `fit`, the PS applies the updates."""

    uses_ps_optimizer = True  # the PS applies the cell's optimizer (ADSP's workers apply their own)

    def fit(self, request):
        model, optimizer = request.model, request.model.optimizer
        spec = self.optimizer_spec(optimizer)  # refuse an optimizer the PS cannot apply, before any work
        data = self.fit_data(request)
        build_for_training(model, data["x"])
        variables = list(model.trainable_variables)
        names = variable_names(model)["trainable"]
        plan = partition({n: int(np.prod(v.shape)) for n, v in zip(names, variables)}, len(self.config["shards"]))
        client = PsClient(self.config["shards"], bytes.fromhex(self.config["key"]), self.rank)
        step = PushPull(client, plan, names, request.samples_per_step, Slowdown(self.simulated))
        step.shapes = {n: (tuple(v.shape), str(v.dtype)) for n, v in zip(names, variables)}
        original_apply = optimizer.apply_gradients
        user = self.user_callbacks(request)
        try:
            if self.rank == 0:
                self._init(client, model, spec, plan, names)
            _assign(variables, step.exchange("pull"))
            own = self.connect(step, model, variables)
            model.train_function = None
            follow = [_learning_rate_follower(client, optimizer)] if self.rank == 0 and self.uses_ps_optimizer else []
            callbacks = [_epoch_agreement(client), *user, *follow, *own, _stop_when_asked(step)]
            history = self.train(request, step, data, callbacks)
            for callback in own:
                getattr(callback, "finish", lambda: None)()
            step.flush()
            _assign(variables, step.exchange("done"))  # waits for the other workers; the final PS weights
            if self.uses_ps_optimizer:
                self._take_optimizer_state(client, optimizer, variables, names)
            _restore_best_weights(user, model)
            return history
        finally:
            optimizer.apply_gradients = original_apply
            model.train_function = None
            client.close()

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

    def fit_data(self, request) -> dict:
        """The `fit` arguments of this worker's share of the data (NFDT: an equal strided shard)."""
        return shard_fit_data(request, self.rank, self.size)

    def train(self, request, step: PushPull, data: dict, callbacks: list):
        """Keras' `fit` over this worker's data, every step through the PS."""
        reporter = self.make_reporter(request.samples_per_step, extra=step.metrics)
        return request.run_plain(callbacks=[*callbacks, reporter], verbose=0, **data)

    def connect(self, step: PushPull, model, variables) -> list:
        """Route training through the PS; returns the callbacks that need. NFDT: every step's gradient
        goes to the PS instead of the local optimizer."""
        model.optimizer.apply_gradients = _pushed(step, variables)
        model.jit_compile = False  # XLA cannot compile a numpy_function
        return []

    @staticmethod
    def _init(client, model, spec, plan, names):
        """Rank 0 hands each shard its variables (shard 0 also the non-trainable ones, for checkpoints)
        and the optimizer's state for them, so training continues from the notebook's optimizer."""
        named = variable_names(model)
        trainable = dict(zip(names, (v.numpy() for v in model.trainable_variables)))
        frozen = dict(zip(named["non_trainable"], (v.numpy() for v in model.non_trainable_variables)))
        slots, iterations = optimizer_state.export(model.optimizer, model.trainable_variables, names)
        per_shard = [{n: trainable[n] for n in shard} | {k: a for k, a in slots.items() if k.rsplit(":", 1)[0] in shard}
                     | (frozen if i == 0 else {}) for i, shard in enumerate(plan)]
        client.request("init", per_shard, optimizer=asdict(spec), trainable=names, layout=named["layout"],
                       iterations=iterations)

    @staticmethod
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


def _epoch_agreement(client: PsClient):
    """The workers' epoch-end logs averaged on the PS (shard 0 waits for every live worker), so History
    and the cell's callbacks see the same numbers on every worker, as under hfdt, and an EarlyStopping
    or ReduceLROnPlateau decides the same on all of them."""
    import keras

    class EpochAgreement(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs is None:
                return
            numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float, np.floating))}
            reply = client.request("epoch", only=0, epoch=int(epoch), logs=numbers)[0]
            logs.update(reply.header.get("logs") or {})

    return EpochAgreement()


def _learning_rate_follower(client: PsClient, optimizer):
    """A learning rate the cell's callbacks set (ReduceLROnPlateau, LearningRateScheduler) reaches the PS,
    which applies the optimizer: checked after the cell's callbacks at each epoch's start and end."""
    import keras

    from ..learning_rate import schedule_of

    class FollowLearningRate(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.sent = self._current()

        def on_epoch_begin(self, epoch, logs=None):
            self._follow()

        def on_epoch_end(self, epoch, logs=None):
            self._follow()

        def _current(self):
            return None if schedule_of(optimizer) is not None else float(optimizer.learning_rate)

        def _follow(self):
            value = self._current()
            if value is not None and value != self.sent:
                client.request("learning_rate", value=value)
                self.sent = value

    return FollowLearningRate()


def _restore_best_weights(callbacks, model) -> None:
    """An EarlyStopping(restore_best_weights=True) that restored its best weights keeps them, although the
    end-of-fit exchange brought the PS's last weights."""
    for callback in callbacks:
        if getattr(callback, "restore_best_weights", False) and getattr(callback, "best_weights", None) is not None \
                and getattr(callback, "stopped_epoch", 0) > 0:
            model.set_weights(callback.best_weights)


def _stop_when_asked(step: PushPull):
    """Ends `fit` after the batch in which the PS asked for it, as Keras' own EarlyStopping does."""
    import keras

    class StopWhenAsked(keras.callbacks.Callback):
        async_safe = True  # reads a flag only; Keras need not wait for it each step

        def on_train_batch_end(self, batch, logs=None):
            if step.stop_requested:
                self.model.stop_training = True

    return StopWhenAsked()


def _assign(variables, values) -> None:
    for variable, value in zip(variables, values):
        variable.assign(value)


def _pushed(step: PushPull, variables):
    """An `apply_gradients` that sends the gradients to the PS and installs the weights it returns."""
    import tensorflow as tf

    def apply(grads_and_vars):
        pairs = list(grads_and_vars)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in pairs]
        new = tf.numpy_function(step.push, grads, [v.dtype for v in variables], stateful=True,
                                name="nbdist_push_pull")
        for variable, value in zip(variables, new):
            variable.assign(tf.ensure_shape(value, variable.shape))

    return apply


DIVERGENCE_RISK = 0.95


def momentum_note(run) -> str | None:
    """For the cell's own optimizer on several async workers: the effective momentum, explicit plus
    about tau_bar/(tau_bar+1) from asynchrony (Mitliagkas et al., 2016), with a warning above 0.95."""
    if not run.ps or len(run.workers) < 2 or run.ps[0].get("rule"):
        return None
    optimizer = run.ps[0].get("optimizer") or {}
    mu = float(optimizer.get("momentum") or 0.0)
    staleness = [r["staleness"] for r in run.push_records if r["applied"]]
    if optimizer.get("name") != "SGD" or mu <= 0 or not staleness:
        return None
    tau_bar = sum(staleness) / len(staleness)
    effective = mu + tau_bar / (tau_bar + 1)
    note = (f"nbdist: effective momentum ~ {effective:.2f} (momentum {mu:g} of the optimizer plus "
            f"{tau_bar / (tau_bar + 1):.2f} from asynchrony at mean staleness {tau_bar:.1f}).")
    if effective > DIVERGENCE_RISK:
        note += (f" Above {DIVERGENCE_RISK} training may diverge: lower the optimizer's momentum, or use "
                 "--strategy ddc-asgd, which reduces the momentum by the measured delay.")
    return note


class NfdtStrategy(Strategy):
    name = "nfdt"
    summary = "asynchronous data parallel through nbdist's parameter server (the user's optimizer)"
    options = ("ps_shards", "ps_on", "max_staleness", "checkpoint_every", "checkpoint_dir", "resume", "simulate",
               "momentum")
    worker_class = NfdtWorker
    survives_worker_loss = True

    def __init__(self, options):
        super().__init__(options)
        for flag, value, least in (("--ps-shards", options.get("ps_shards"), 1),
                                   ("--max-staleness", options.get("max_staleness"), 0),
                                   ("--checkpoint-every", options.get("checkpoint_every"), 0.1)):
            if value is not None and value < least:
                raise OptionError(f"{flag} takes a number of at least {least}. Received: {flag} {value}")
        self.service: PsService | None = None
        self.cluster = None

    def prepare(self, run, cluster) -> dict:
        options = self.options
        shards = options.get("ps_shards") or 1
        profiles = parse_simulate(options.get("simulate"), len(run.workers))
        resume = self._checkpoint_to_resume()
        self.cluster = cluster
        settings = self.shard_settings(len(run.workers))
        self.service = PsService(run.id, shards, len(run.workers), settings,
                                 options.get("checkpoint_dir") or DEFAULT_CHECKPOINT_DIR,
                                 float(options.get("checkpoint_every") or 30))
        towards = rendezvous_address(cluster.client, all(cluster.shares_network(e) for e in run.workers))
        on_engines = options.get("ps_on") == "engines"
        self.service.start(towards, cluster if on_engines else None, run.workers if on_engines else None)
        if resume is not None:
            self.service.restore(resume)
            run.events.append({"t": time.time(), "event": "resumed", "path": resume["path"],
                               "version": resume.get("version")})
        return {"shards": self.service.addresses, "key": self.service.key.hex(),
                "rule": (settings["rule"] or {}).get("preset"),
                "simulate": [p.to_json() for p in profiles]}

    def shard_settings(self, workers: int) -> dict:
        """How the shards treat pushes: here the cell's optimizer, asynchronously (subclasses change it)."""
        return {"max_staleness": self.options.get("max_staleness"), "rule": None, "synchronous": False,
                "momentum": self.options.get("momentum")}

    def _checkpoint_to_resume(self) -> dict | None:
        choice = self.options.get("resume")
        if not choice:
            return None
        directory = self.options.get("checkpoint_dir") or DEFAULT_CHECKPOINT_DIR
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
        if self.service is not None and self.service.failure:
            run.checkpoint = {**(self.service.last_checkpoint or {}), "weights": self.service.checkpoint_weights()}
            saved = self.service.last_checkpoint
            where = (f"The last checkpoint (PS version {saved['version']}, {time.time() - saved['saved_at']:.0f} s "
                     f"old) is {saved['path']}; its weights are in nbdist.last_run.weights "
                     "(model.set_weights(nbdist.last_run.weights)), or re-run the cell with --resume."
                     if saved else "No checkpoint had been saved yet.")
            raise ParameterServerFailed(f"the parameter server failed during run {run.id}: "
                                        f"{self.service.failure} {where}")

    def finish(self, run) -> None:
        if self.service is None:
            return
        outcome = self.service.stop(self.cluster)
        if outcome["checkpoint"] and not run.checkpoint:
            run.checkpoint = {**outcome["checkpoint"], "weights": self.service.checkpoint_weights()}
        run.ps = outcome["shards"]
        run.events += [e for shard in outcome["shards"] for e in shard.get("events", [])
                       if e["event"] == "worker_dropped"]
        self.service = None
        note = momentum_note(run)
        if note:
            run.notes.append(note)
