"""A worker's virtual clock (``--simulate "...; clock=virtual"``): what its steps and exchanges cost.

Nothing sleeps. A step costs ``t(b) / speed`` (t the run's `StepCost`, fixed for the run); a
push reaches the PS at ``now + step + latency + bytes / bandwidth`` and its reply comes back
``latency + bytes / bandwidth`` after the PS answered it, at the virtual instant the PS sends
with it. The PS applies pushes in virtual-time order (`nbdist.ps.virtual_time`), so arrival
order is a function of the simulated cluster, not of the machine's scheduler.
"""

from __future__ import annotations

from ..host.hetero import Profile, StepCost


class VirtualClock:
    """One worker's virtual time, and the header fields its pushes carry."""

    def __init__(self, profile: Profile | dict, step: StepCost | dict, batch: int):
        self.profile = Profile(**profile) if isinstance(profile, dict) else profile
        self.step = (StepCost(**step) if isinstance(step, dict) else step).at(batch)
        self.batch = batch
        self.now = 0.0  # virtual seconds since the run started
        self.steps_since_exchange = 0

    def compute_s(self, steps: int = 1, batch: int | None = None) -> float:
        """Virtual seconds of `steps` steps of `batch` samples (the cell's batch by default)."""
        return steps * self.step.seconds(self.batch if batch is None else batch) / self.profile.speed

    def link_s(self, nbytes: int) -> float:
        """One way over this worker's link: latency plus transfer."""
        bandwidth = self.profile.bandwidth_bps
        return self.profile.latency_s + (nbytes * 8 / bandwidth if bandwidth else 0.0)

    def push_fields(self, push_bytes: int, steps: int = 1, batch: int | None = None) -> dict:
        """What a push tells the PS: when it arrives, and the least time until this worker's next one
        could arrive after the reply (`gap`: two latencies and the cheapest step; transfers may be 0)."""
        arrive = self.now + self.compute_s(steps, batch) + self.link_s(push_bytes)
        return {"vt": arrive, "gap": 2 * self.profile.latency_s + self.compute_s(1, batch)}

    def replied(self, answered_at: float, reply_bytes: int) -> None:
        """The PS answered at virtual time `answered_at`; the worker resumes when the reply arrives."""
        self.now = max(self.now, answered_at + self.link_s(reply_bytes))

    def local_steps(self, steps: int = 1) -> None:
        """Steps without an exchange (a push period, ADSP's local steps, one engine alone)."""
        self.now += self.compute_s(steps)


def ring_allreduce_s(profiles: list[Profile], compute_s: list[float], nbytes: int) -> float:
    """One synchronous step on the virtual clock: the slowest rank's compute, then a ring allreduce of
    `nbytes` (2(N-1)/N of them over the slowest link, 2(N-1) latencies)."""
    n = len(profiles)
    if n <= 1:
        return max(compute_s)
    slowest = min((p.bandwidth_bps for p in profiles if p.bandwidth_bps), default=None)
    transfer = 2 * (n - 1) / n * nbytes * 8 / slowest if slowest else 0.0
    return max(compute_s) + transfer + 2 * (n - 1) * max(p.latency_s for p in profiles)


def measure_step_cost(model, data: dict, batch: int) -> StepCost:
    """t(b) at speed 1, measured once on this engine: timed gradient steps at `batch` and 2 x `batch`
    (the fastest of each; a shared host only ever adds time), fitted as fixed + per-sample seconds."""
    from ..datasets import structures
    from .ashl.profiling import profile_compute
    from ..errors import OptionError
    from ..datasets.sharding import first_batch, is_dataset, is_py_dataset

    x, y = data["x"], data.get("y")
    if is_dataset(x) or is_py_dataset(x):
        x, y, _ = first_batch(x)
        batch = max(1, structures.length(x) // 2)
    if y is None or not structures.flatten(x) or not all(hasattr(a, "shape") for a in structures.flatten(x)):
        raise OptionError("the virtual clock measures a step on numpy data, a tf.data.Dataset or a PyDataset; "
                          "with this input give the step cost: --simulate '...; clock=virtual; step=12ms'.")
    model_cost = profile_compute(model, x, y, batch, steps=10)
    return StepCost(model_cost.fixed_s, model_cost.per_sample_s)
