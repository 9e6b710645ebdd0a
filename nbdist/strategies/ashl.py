"""`ashl`: adaptive multi-stage training for heterogeneous clusters (DESIGN.md section 6).

Each worker first profiles itself (compute at b0 and 2*b0, five push-sized round trips to
the PS; workers sharing a host take turns) and posts the profile to the PS; the kernel
allocates batches that equalise step time (`nbdist.ashl.allocation`) and every worker
then trains on its share: per global batch of B samples, worker i takes its b_i. AHL runs
the `ddc-asgd` rule with pushes scaled by b_i/mean(b); when the switch rule says so the
shards turn synchronous (SHL: one batch-weighted mean per round, the cell's optimizer).
About once a second workers report their measured step times and take the allocation
then in force; each worker compresses its pushes (fp16, top-k) when communication
dominates its step. The decisions are the kernel's (`nbdist.ashl.coordinator`).
"""

from __future__ import annotations

import socket
import time

import numpy as np

from ..ashl.coordinator import Coordinator
from ..ashl.profiling import profile_compute
from ..ashl.report import decisions, profile_table
from ..errors import OptionError
from ..hetero import Profile
from ..keras_bridge import is_dataset, short
from ..ps.compression import PushCompressor
from ..sharding import is_generator, is_py_dataset, shard_validation, split_validation
from .asgd import DdcAsgdStrategy
from .nfdt import NfdtWorker, PushPull

PROBES = 5
REPORT_EVERY_S = 1.0


class ProportionalBatches:
    """The worker's batches: of each global batch of B = sum(b) samples, the b_rank after the others' share.

    One permutation per epoch, the same on every worker (seeded by the epoch), so the
    workers' batches of an epoch cover the data once between them whatever the allocation.
    """

    def __init__(self, x, y, rank: int, batches: list[int], seed: int, sample_weight=None):
        import keras

        class _Dataset(keras.utils.PyDataset):
            def __len__(inner):
                return self.steps

            def __getitem__(inner, k):
                return self.batch(k)

            def on_epoch_end(inner):
                self.new_epoch()

        self.x, self.y, self.rank, self.seed, self.sample_weight = x, y, rank, seed, sample_weight
        self.epoch = 0
        self.order = np.arange(len(x))
        self.set_batches(batches)
        self.dataset = _Dataset()

    def set_batches(self, batches: list[int]) -> None:
        if len(self.x) < sum(batches):
            raise OptionError(f"{len(self.x)} training samples are fewer than one global batch of {sum(batches)}; "
                              "use a smaller batch_size or fewer workers.")
        self.batches = list(batches)
        self.steps = len(self.x) // sum(batches)

    @property
    def size(self) -> int:
        return self.batches[self.rank]

    def batch(self, k: int):
        sizes, order = self.batches, self.order  # one read of each: another thread may replace them
        start = k * sum(sizes) + sum(sizes[:self.rank])
        index = np.sort(order[start:start + sizes[self.rank]])
        if self.sample_weight is None:
            return self.x[index], self.y[index]
        return self.x[index], self.y[index], self.sample_weight[index]

    def new_epoch(self) -> None:
        self.epoch += 1
        self.order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.x))


class AshlWorker(NfdtWorker):
    """Profiles, waits for its allocation, trains its share through the PS, reports its step times."""

    def fit_data(self, request) -> dict:
        if is_dataset(request.x) or is_py_dataset(request.x) or is_generator(request.x):
            raise OptionError("--strategy ashl re-batches the training data by each worker's speed and needs numpy "
                              f"arrays for x and y. Received: x={short(request.x)}. Pass arrays, or use "
                              "--strategy ddc-asgd, which takes a tf.data.Dataset, a PyDataset or a generator.")
        if request.steps_per_epoch:
            raise OptionError("--strategy ashl sets the steps of an epoch itself (samples / global batch). Received: "
                              f"steps_per_epoch={request.steps_per_epoch}. Remove it.")
        x, y, weights, validation = request.x, request.y, request.sample_weight, request.validation_data
        if request.validation_split:
            train, validation = split_validation(x, y, request.validation_split, weights)
            x, y, weights = (*train, None)[:3]
        if validation is not None:
            validation = shard_validation(validation, self.rank, self.size)
        return {"x": x, "y": y, "sample_weight": weights, "validation_data": validation, "validation_split": 0.0,
                "steps_per_epoch": None}

    def train(self, request, step: PushPull, data: dict, callbacks: list):
        x, y = np.asarray(data["x"]), np.asarray(data["y"])
        b0 = request.samples_per_step
        allocation = self._profile_and_wait(step, request.model, x, y, b0)
        weights = None if data["sample_weight"] is None else np.asarray(data["sample_weight"])
        batches = ProportionalBatches(x, y, self.rank, allocation["batches"], seed=self.spec.get("seed") or 0,
                                      sample_weight=weights)
        _follow(step, batches, allocation, self.rank)
        step.compressor = PushCompressor()
        step.phase = "ahl"
        step.after_exchange = Reports(step, batches, allocation)
        reporter = self.make_reporter(lambda: batches.size, extra=step.metrics)
        return request.run_plain(x=batches.dataset, y=None, batch_size=None, sample_weight=None,
                                 callbacks=[*callbacks, reporter], verbose=0,
                                 **{k: v for k, v in data.items() if k not in ("x", "y", "sample_weight")})

    def _profile_and_wait(self, step: PushPull, model, x, y, b0: int) -> dict:
        simulated = Profile(**self.simulated) if self.simulated else None
        # workers on one host time their steps one after another (tracing, before, needs no turn)
        compute = profile_compute(model, x, y, b0, simulated, before_timing=lambda: step.client.request("turn"))
        probes = [step.probe() for _ in range(PROBES)]
        comm_s = float(np.median([s for s, _ in probes]))
        profile = {"fixed_s": compute.fixed_s, "per_sample_s": compute.per_sample_s, "comm_s": comm_s,
                   "bandwidth_bps": 8 * probes[-1][1] / comm_s if comm_s > 0 else None, "b0": b0,
                   "host": socket.gethostname()}
        reply = step.client.request("profile", profile=profile)  # held until the kernel has allocated
        step._exchange_ended = time.perf_counter()  # the waiting was not compute
        return reply[0].header["allocation"]


def _follow(step: PushPull, batches: ProportionalBatches, allocation: dict, rank: int) -> None:
    """Train on the allocation: this worker's batch, steps per epoch and push period."""
    batches.set_batches(allocation["batches"])
    step.batch_size, step.steps_per_epoch = batches.size, batches.steps
    step.period = (allocation.get("periods") or [1] * len(allocation["batches"]))[rank]


class Reports:
    """About once a second, after an exchange (the thread that talks to the PS): this worker's step
    times to the kernel, and the allocation now in force back, taken at once."""

    def __init__(self, step: PushPull, batches: ProportionalBatches, allocation: dict):
        self.step, self.batches, self.current = step, batches, allocation["id"]
        self.next_t = time.perf_counter() + REPORT_EVERY_S

    def __call__(self) -> None:
        now = time.perf_counter()
        if now < self.next_t:
            return
        self.next_t = now + REPORT_EVERY_S
        step = self.step
        report = {"compute_s": step.compute_s, "exchange_s": step.exchange_s, "timed_steps": step.timed_steps,
                  "batch": self.batches.size, "allocation": self.current}
        allocation = step.client.request("report", report=report)[0].header.get("allocation") or {}
        if allocation.get("id", self.current) != self.current:
            self.current = allocation["id"]
            _follow(step, self.batches, allocation, self.batches.rank)
            step.reset_timing()  # measured afresh at the new batch size


class AshlStrategy(DdcAsgdStrategy):
    name = "ashl"
    preset = "ddc-asgd"
    summary = ("heterogeneous clusters: profile, batches sized to each worker's speed, async (ddc-asgd) then "
               "sync phase, compression when communication dominates")
    options = tuple(o for o in DdcAsgdStrategy.options if o != "max_staleness")
    worker_class = AshlWorker
    min_workers = 2

    def __init__(self, options):
        super().__init__(options)
        self.coordinator: Coordinator | None = None
        self._buffer: dict = {}

    def prepare(self, run, cluster) -> dict:
        self.run = run
        self.coordinator = Coordinator(len(run.workers), super().control)
        self._hosts = [cluster.info(eid).host for eid in run.workers]
        return super().prepare(run, cluster)

    def shard_settings(self, workers: int) -> dict:
        hosts = getattr(self, "_hosts", [None] * workers)
        groups = [[r for r in range(workers) if hosts[r] == host] for host in dict.fromkeys(hosts)]
        return {**super().shard_settings(workers), "max_staleness": None, "ashl": {"profile_groups": groups}}

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
        run.notes.append("\n".join([profile_table(run), *decisions(run)]))
