"""`ashl`: adaptive multi-stage training for heterogeneous clusters (DESIGN.md section 6).

Each worker first profiles itself (compute at b0 and 2*b0, push-sized round trips to
the PS; workers sharing a host take turns) and posts the profile to the PS; the kernel
allocates batches that equalise step time (`nbdist.strategies.ashl.allocation`) and every worker
then trains on its share: per global batch of B samples, worker i takes its b_i. Each worker
steps with the cell's own optimizer and commits the update of the local steps its allocation
gives it (the same number for every worker, so commits arrive at one cadence); AHL adds each
weighted b_i/B, and when the switch rule says so the shards turn synchronous (SHL: a round's
weighted sum). With `--commits gradients` workers push gradients instead (the mean of their
period's); AHL applies the `ddc-asgd` rule to them, scaled by b_i/mean(b), SHL one
batch-weighted mean per round with the cell's SGD.
About once a second workers report their measured step times and take the allocation
then in force; each worker compresses its pushes (fp16, top-k) when communication
dominates its step. The decisions are the kernel's (`nbdist.strategies.ashl.coordinator`); the
shards' side is `nbdist.strategies.ashl.meeting`.
"""

from __future__ import annotations

import math
import socket
import time

import numpy as np

from ...datasets import dynamic_data
from .allocation import CostModel
from .batches import AllocatedDeals, DatasetBatches, ProportionalBatches, per_sample
from .coordinator import Coordinator
from .exchange import PacedExchange
from .meeting import SPEC as MEETING
from .profiling import BUDGET_S, profile_compute, steps_within_budget
from .report import decisions, profile_table
from ...errors import OptionError
from ...host.hetero import Profile
from ...keras_semantics.keras_bridge import short
from ...ps.compression import PushCompressor
from ...datasets.sharding import (first_batch, is_dataset, is_generator, is_py_dataset, shard_validation,
                                  split_validation)
from .. import options as opt
from ..adsp import local_committer
from ..asgd import DDC_OPTIONS, DELAY_REPORTS, DdcAsgdStrategy
from ..base import Option, Reports
from ..parameter_server import PS_EVENTS, PsWorker

PARTS = ("allocation", "switch", "compression", "local-steps")
WITHOUT = Option("--without", "switch parts of ASHL off, for ablations: allocation (equal batches, every worker "
                 "committing each step), switch (asynchronous to the end), compression, local-steps (as --commits "
                 "gradients); several joined by + or ,", metavar="PARTS")
COMMITS = Option("--commits", "what a worker pushes: local-steps (each worker steps with the cell's own optimizer, "
                 "any optimizer, and commits the update of the local steps its allocation gives it, all at one "
                 "cadence; the shards weight it b_i/B) or gradients (the shards apply ddc-asgd, then in SHL the "
                 "cell's SGD)", default="local-steps", choices=("local-steps", "gradients"))
SWITCH_AT = Option("--switch-at", "switch to the synchronous phase at this share of the epochs instead of by the "
                   "rule (0.25: at the end of the first of 4 epochs; for sweeps of the switch point)", type=float,
                   metavar="FRACTION")
PROBES = 5  # push-sized round trips, at most; at least MIN_PROBES, then while within the budget
MIN_PROBES = 2
REPORT_EVERY_S = 1.0


class AshlWorker(PsWorker):
    """Profiles, waits for its allocation, trains its share through the PS, reports its step times."""

    routes_other_optimizers = False  # a train_step's own optimizers would step locally, out of sync

    exchange_class = PacedExchange

    @property
    def uses_ps_optimizer(self) -> bool:
        """With local steps (the default) each worker steps with the cell's optimizer and commits its update."""
        return not commits_local_steps(self.values)

    def optimizer_spec(self, optimizer):
        try:
            return super().optimizer_spec(optimizer)
        except OptionError as exc:
            raise OptionError(f"{exc} Or leave out --commits gradients (or --without local-steps): by default each "
                              "worker applies the cell's optimizer itself, whichever it is.") from None

    def connect(self, exchange: PacedExchange, model, variables) -> list:
        if self.uses_ps_optimizer:
            return super().connect(exchange, model, variables)
        exchange.commits_local_steps = True
        return [local_committer(exchange, variables, AllocatedPeriod(exchange))]

    def _dealing(self, request) -> bool:
        """Whether shard 0 deals this fit's batches (`--data dynamic` and arrays); why not, in the fit's timings."""
        mode = self.config.get("data") or {}
        why = dynamic_data.applies(request) if mode.get("mode") == "dynamic" else None
        if why is not None:
            self.fit_timings["data"] = f"each worker's share of every global batch: {why}"
        return mode.get("mode") == "dynamic" and why is None

    def fit_data(self, request) -> dict:
        if is_py_dataset(request.x) or is_generator(request.x):
            raise OptionError("--strategy ashl re-batches the training data by each worker's speed and needs numpy "
                              f"arrays or a tf.data.Dataset. Received: x={short(request.x)}. Pass arrays or a "
                              "dataset, or use --strategy ddc-asgd, which takes a PyDataset or a generator.")
        if is_dataset(request.x):
            per_sample(request.x)  # refuses, before any work, a dataset it cannot re-batch
        if request.steps_per_epoch:
            raise OptionError("--strategy ashl sets the steps of an epoch itself (samples / global batch). Received: "
                              f"steps_per_epoch={request.steps_per_epoch}. Remove it.")
        if self._dealing(request):
            return super().fit_data(request)  # dealt from the whole arrays (a newcomer from the open epoch)
        x, y, weights, validation = request.x, request.y, request.sample_weight, request.validation_data
        if request.validation_split:
            train, validation = split_validation(x, y, request.validation_split, weights)
            x, y, weights = (*train, None)[:3]
        if validation is not None:
            validation = shard_validation(validation, self.rank, self.size)
        return {"x": x, "y": y, "sample_weight": weights, "validation_data": validation, "validation_split": 0.0,
                "steps_per_epoch": None}

    def train(self, request, exchange: PacedExchange, data: dict, callbacks: list):
        if self.dealt is not None:
            (x, y), b0 = self.arrays, request.samples_per_step
        elif is_dataset(data["x"]):
            samples, batched = per_sample(data["x"])
            b0 = batched or request.batch_size or 32
            x, y, _ = first_batch(samples.batch(2 * b0))  # what profiling times its steps on
        else:
            x, y, b0 = data["x"], data["y"], request.samples_per_step
        allocation = self._profile_and_wait(exchange, request.model, x, y, b0, request.epochs or 1)
        if self.dealt is not None:
            batches, fit = AllocatedDeals(self.dealt, self.rank, exchange), data
            exchange.held = self.dealt.held
        elif is_dataset(data["x"]):
            batches = DatasetBatches(samples, self.rank, allocation["batches"])
        else:
            batches = ProportionalBatches(x, y, self.rank, allocation["batches"], seed=self.spec.get("seed") or 0,
                                          sample_weight=data["sample_weight"])
        if self.dealt is None:
            fit = {**data, "x": batches.dataset, "y": None, "batch_size": None, "sample_weight": None}
        _follow(exchange, batches, allocation, self.rank)
        exchange.compressor = None if "compression" in parts_off(self.values.get("without")) else PushCompressor()
        exchange.phase = "ahl"
        if exchange.virtual is None:  # on the virtual clock the cost model is exact: nothing to report
            exchange.after_exchange = StepReports(exchange, batches, allocation)
        reporter = self.make_reporter(lambda: batches.size, extra=exchange.metrics,
                                      clock=self.reporter_clock(exchange))
        reporter.expected_steps = batches.steps
        return request.run_plain(callbacks=[*callbacks, reporter], verbose=0, **fit)

    def _profile_and_wait(self, exchange: PacedExchange, model, x, y, b0: int, epochs: int) -> dict:
        exchange.shapes = {n: (tuple(v.shape), str(v.dtype)) for n, v in zip(exchange.names, model.trainable_variables)}
        if exchange.virtual is not None:
            compute, comm_s, moved = virtual_profile(exchange, b0)
        else:
            simulated = Profile(**self.simulated) if self.simulated else None
            # workers on one host time their steps one after another (tracing, before, needs no turn)
            compute = profile_compute(model, x, y, b0, simulated,
                                      before_timing=lambda: exchange.client.request("turn"))
            probes = [exchange.probe() for _ in range(MIN_PROBES)]
            while len(probes) < PROBES and sum(s for s, _ in probes) < BUDGET_S:
                probes.append(exchange.probe())
            comm_s, moved = float(np.median([s for s, _ in probes])), probes[-1][1]
        profile = {"fixed_s": compute.fixed_s, "per_sample_s": compute.per_sample_s, "comm_s": comm_s,
                   "bandwidth_bps": 8 * moved / comm_s if comm_s > 0 else None, "b0": b0, "epochs": epochs,
                   "host": socket.gethostname()}
        # held until the kernel has allocated
        reply = exchange.client.request("profile", profile=profile, **exchange.clock_fields())
        exchange.waited()  # the waiting was not compute
        if exchange.virtual is not None:
            exchange.virtual.now = max(exchange.virtual.now, reply[0].header.get("vt") or 0.0)
        return reply[0].header["allocation"]


def virtual_profile(exchange: PacedExchange, b0: int):
    """The virtual clock's profile, exact: the run's step cost over this worker's speed, a push-sized round
    trip over its link; the worker's clock advances by what profiling on the real clock takes (steps at b0
    and 2 x b0 and round trips, within the time budget). Returns (compute CostModel, comm_s, bytes moved)."""
    virtual = exchange.virtual
    speed = virtual.profile.speed
    compute = CostModel(virtual.step.fixed_s / speed, virtual.step.per_sample_s / speed)
    moved = 2 * sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in exchange.shapes.values())
    comm_s = 2 * virtual.link_s(moved // 2)
    pair_s = virtual.compute_s(1, b0) + virtual.compute_s(1, 2 * b0)
    probes = max(MIN_PROBES, min(PROBES, math.ceil(BUDGET_S / max(comm_s, 1e-9))))
    virtual.now += steps_within_budget(pair_s) * pair_s + probes * comm_s
    return compute, comm_s, moved


def _follow(exchange: PacedExchange, batches: ProportionalBatches, allocation: dict, rank: int) -> None:
    """Train on the allocation: this worker's batch, steps per epoch and push period."""
    exchange.period = (allocation.get("periods") or [1] * len(allocation["batches"]))[rank]
    batches.set_batches(allocation["batches"])
    exchange.batch_size, exchange.steps_per_epoch = batches.size, batches.steps
    if exchange.virtual is not None:
        exchange.virtual.batch = batches.size


class AllocatedPeriod:
    """A worker's local steps between commits: the push period its allocation gives it (fewer when it holds no
    more dealt batches: it commits what it trained, and the answer deals it more)."""

    def __init__(self, exchange: PacedExchange):
        self.exchange = exchange

    @property
    def interval(self) -> int:
        return 1 if self.exchange.out_of_batches() else self.exchange.period

    def stepped(self, since: int, loss) -> None:
        if since < self.interval and self.exchange.virtual is None:
            self.exchange.time_local_step()


def commits_local_steps(values: dict) -> bool:
    """Workers commit the updates of local steps (`--commits local-steps`, unless `--without local-steps`)."""
    return values.get("commits") == "local-steps" and "local-steps" not in parts_off(values.get("without"))


def parts_off(text: str | None) -> set[str]:
    """The parts `--without` names (refusing a name that is not one)."""
    named = {p.strip() for p in (text or "").replace("+", ",").split(",") if p.strip()}
    unknown = named - set(PARTS)
    if unknown:
        raise OptionError(f"--without {text!r}: ASHL's parts are {', '.join(PARTS)}; unknown: {', '.join(sorted(unknown))}.")
    return named


class StepReports:
    """About once a second, after an exchange (the thread that talks to the PS): this worker's step
    times to the kernel, and the allocation now in force back, taken at once."""

    def __init__(self, exchange: PacedExchange, batches: ProportionalBatches, allocation: dict):
        self.exchange, self.batches, self.current = exchange, batches, allocation["id"]
        self.next_t = time.perf_counter() + REPORT_EVERY_S

    def __call__(self) -> None:
        now = time.perf_counter()
        if now < self.next_t:
            return
        self.next_t = now + REPORT_EVERY_S
        exchange, timer = self.exchange, self.exchange.timer
        report = {"compute_s": timer.compute_s, "exchange_s": timer.comm_s, "timed_steps": timer.timed_steps,
                  "batch": self.batches.size, "allocation": self.current}
        allocation = exchange.client.request("report", report=report)[0].header.get("allocation") or {}
        if allocation.get("id", self.current) != self.current:
            self.current = allocation["id"]
            _follow(exchange, self.batches, allocation, self.batches.rank)
            timer.restart()  # measured afresh at the new batch size


class AshlStrategy(DdcAsgdStrategy):
    """Heterogeneous clusters: profiled allocation of batches (and push periods), async then sync phase,
    compression where communication dominates."""

    name = "ashl"
    preset = "ddc-asgd"
    summary = ("heterogeneous clusters: profile, batches and local steps sized to each worker's speed and link, "
               "async then sync phase, compression when communication dominates")
    reads = (*(o for o in (*opt.PARAMETER_SERVER, opt.MOMENTUM, *DDC_OPTIONS)
               if o not in (opt.MAX_STALENESS, opt.DATA_SHARDS)),  # ASHL sizes each share itself
             opt.DATA, *opt.ELASTIC, WITHOUT, COMMITS, SWITCH_AT)
    reports = Reports(panels=(*DELAY_REPORTS.panels, "decisions"), phases=("profile", "ahl", "shl"),
                      controls=("pause", "resume", "stop", "lr_scale", "evict", "switch_phase"),
                      # its decisions are told together, in the profile table and decision lines it notes
                      events={**PS_EVENTS, **dict.fromkeys(("allocated", "reallocated", "switch_phase", "compression",
                                                            "end_laggards", "left_shl"))})
    worker_class = AshlWorker
    loop_refusal = ("it sizes each worker's share of fit's data and batches by its measured speed, which a loop of "
                    "the cell's own chooses itself")
    min_workers = 2

    @classmethod
    def decision_lines(cls, run) -> list[str]:
        return decisions(run)

    def __init__(self, values):
        super().__init__(values)
        at = self.value("switch_at")
        if at is not None and not 0 < at <= 1:
            raise OptionError(f"--switch-at {at:g}: a share of the epochs, above 0 and at most 1 (0.25 switches at "
                              "the end of the first of 4 epochs)")
        self.coordinator: Coordinator | None = None
        self.hosts: list | None = None
        self.run = None
        self._buffer: dict = {}

    def deals_batches(self) -> bool:
        """Under `--data dynamic` shard 0 deals each worker batches of its allocated size."""
        return self.value("data") == "dynamic"

    @property
    def takes_newcomers(self) -> bool:
        """Real-clock runs whose batches are dealt: a newcomer profiles itself and the allocation is solved
        again for one more worker (a static share of every global batch cannot take one in)."""
        return not self.value("simulate") and self.deals_batches()

    def prepare(self, run, cluster) -> dict:
        self.run = run
        self.coordinator = Coordinator(len(run.workers), super().control, virtual=self.clock == "virtual",
                                       without=parts_off(self.value("without")), switch_at=self.value("switch_at"),
                                       local_steps=commits_local_steps(self.values), dealt=self.deals_batches())
        self.hosts = [cluster.info(eid).host for eid in run.workers]
        return super().prepare(run, cluster)

    def shard_settings(self, workers: int) -> dict:
        hosts = self.hosts or [None] * workers
        groups = [[r for r in range(workers) if hosts[r] == host] for host in dict.fromkeys(hosts)]
        settings = super().shard_settings(workers)
        if commits_local_steps(self.values):  # a push is an update: w += (b_i / B) * delta
            settings["rule"] = {"preset": "adsp", "workers": workers}
        return {**settings, "max_staleness": None,
                "extension": {"class": MEETING, "config": {"profile_groups": groups,
                                                           "decide_at_epochs": self.clock == "virtual"}}}

    def check(self, run) -> None:
        super().check(run)
        if self.coordinator is None or self.service is None:
            return
        fresh = super().telemetry()
        if not fresh:
            return
        self._keep_for_dashboard(fresh)
        progress = {run.workers.index(eid): data for eid, data in run.progress.items() if eid in run.workers}
        self.coordinator.update(run, fresh, progress)

    def _keep_for_dashboard(self, fresh: dict) -> None:
        """`check` reads the PS's log first; the dashboard gets what it read, once."""
        log = self._buffer.get("log", []) + fresh.get("log", [])
        self._buffer = {**fresh, "log": log[-5000:]}

    def telemetry(self) -> dict:
        out, self._buffer = self._buffer, {}
        return out

    def control(self, action: str, value=None) -> list[dict]:
        if action == "switch_phase" and self.coordinator is not None and self.service is not None:
            return self.coordinator.switch(self.run, "asked for by hand (dashboard or Run.control)")
        return super().control(action, value)

    def finish(self, run) -> None:
        if self.coordinator is not None and self.service is not None:
            try:  # the last shard events (compression changes) before the shards stop
                self.coordinator.update(run, super().telemetry(), {})
            except Exception:  # noqa: BLE001 - the run's outcome matters more than a late event
                pass
        super().finish(run)
        run.note("\n".join([profile_table(run), *decisions(run)]))
