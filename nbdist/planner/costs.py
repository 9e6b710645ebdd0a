"""What a plan is computed from: each worker's speed and link, the step's cost, the model and the data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..host.hetero import Profile, StepCost


@dataclass(frozen=True)
class ServerCosts:
    """The parameter server's own costs, which the virtual clock does not charge (all 0 there): per message
    (header, signature, Python; docs/benchmarks.md: about 1 ms a push-pull on this machine), per byte
    applied, and the PS host's link that every worker's exchange crosses (None: not a limit)."""

    message_s: float = 0.0
    apply_bytes_per_s: float | None = None
    host_bandwidth_bps: float | None = None

    def service_s(self, nbytes: int) -> float:
        """The PS's time for one push of `nbytes` (applied) and its reply."""
        return self.message_s + (nbytes / self.apply_bytes_per_s if self.apply_bytes_per_s else 0.0)


@dataclass(frozen=True)
class MeasuredSteps:
    """On the real clock, what short real runs measured beyond the profiled gradient step, in seconds a step
    (`planner.calibrate`): `step_extra_s` Keras' own step around it (the optimizer's apply, the loop),
    `ring_s` a synchronous step's Horovod allreduce of the model's gradients, `exchange_s` an asynchronous
    step's push-pull of the model's size over nbdist's wire (the PS's service and the host's other work
    included). Each holds at `workers` workers; None: not measured."""

    workers: int
    step_extra_s: float = 0.0
    ring_s: float | None = None
    exchange_s: float | None = None


@dataclass(frozen=True)
class ClusterCosts:
    """A cluster as the planner sees it: one `Profile` per worker (speed, link), the step cost t(b) at
    speed 1, and the cell's samples, batch, model size and optimizer."""

    profiles: tuple[Profile, ...]
    step: StepCost
    samples: int
    batch: int
    model_bytes: int
    epochs: int = 1
    optimizer: str = "SGD"
    arrays: bool = True  # the cell fits numpy arrays (not a tf.data pipeline)
    server: ServerCosts = field(default_factory=ServerCosts)
    notes: tuple[str, ...] = ()  # what was not measured, and what was assumed instead
    measured: MeasuredSteps | None = None  # the real clock's steps and exchanges, measured in place

    @property
    def workers(self) -> int:
        return len(self.profiles)

    def compute_s(self, worker: int, batch: int | None = None) -> float:
        """Seconds of one step of `batch` samples (the cell's by default) on `worker`."""
        extra = self.measured.step_extra_s if self.measured else 0.0
        return self.step.seconds(self.batch if batch is None else batch) / self.profiles[worker].speed + extra

    def link_s(self, worker: int, nbytes: int | None = None) -> float:
        """One way over `worker`'s link (the model's bytes by default): latency plus transfer."""
        profile = self.profiles[worker]
        nbytes = self.model_bytes if nbytes is None else nbytes
        return profile.latency_s + (nbytes * 8 / profile.bandwidth_bps if profile.bandwidth_bps else 0.0)

    def exchange_s(self, worker: int) -> float:
        """One push of the gradient and its reply of the weights, over `worker`'s link (as measured, if it was)."""
        if self.measured and self.measured.exchange_s is not None:
            return self.measured.exchange_s
        return 2 * self.link_s(worker)

    def grown(self, workers: int, link: Profile | None = None) -> "ClusterCosts":
        """This cluster at `workers` workers: the measured workers' speeds repeated in order (the same mix),
        each worker's link replaced by `link` when given (a model of the links of a cluster not measured). The
        exchanges measured at this cluster's size do not hold at another: they are left to the link model."""
        profiles = [self.profiles[k % self.workers] for k in range(workers)]
        if link is not None:
            profiles = [replace(p, bandwidth_bps=link.bandwidth_bps, latency_s=link.latency_s) for p in profiles]
        measured = self.measured
        if measured is not None and workers != measured.workers:
            measured = MeasuredSteps(workers, measured.step_extra_s)
        return replace(self, profiles=tuple(profiles), measured=measured)
