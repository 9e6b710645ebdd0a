"""The real clock's steps and exchanges, measured in place by short real runs of the cell.

The profile times gradient steps only. A real step also applies the optimizer and runs Keras' loop; a
synchronous one allreduces the model's gradients through Horovod; an asynchronous one pushes the
gradient and pulls the weights, the model's size each way, over nbdist's wire to the PS, whose process
shares the host's cores with the engines. Each is measured as the seconds it adds to a step: a short
run of `local`, `hfdt` and `nfdt` on the plan's engines (a few dozen steps an epoch, the first epoch
not timed), and the value at which that strategy's own predictor gives the epoch the run took
(bisection: every predictor grows with it). On the virtual clock nothing is run: the costs are given.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from .costs import ClusterCosts, MeasuredSteps
from .predict import predict

PROBE_STEPS = 25  # steps of the cell's batch each worker makes in each epoch of a probe
PROBE_EPOCHS = 3  # the first (start-up, tracing) is not timed
PROBES = (("local", "step_extra_s", "Keras' step around the profiled gradients (the optimizer's apply, the loop)"),
          ("hfdt", "ring_s", "Horovod's allreduce of the model's gradients"),
          ("nfdt", "exchange_s", "a push-pull of the model's size over nbdist's wire, the PS's service included"))
_cache: dict[tuple, tuple[MeasuredSteps, tuple[str, ...]]] = {}


def measured(session, cell: str, options: dict, costs: ClusterCosts, engines: list[int]) -> ClusterCosts:
    """`costs` with the steps and exchanges short real runs on `engines` measured, and notes saying what each
    added (or why it could not be measured). Cached by the cell, its engines and its --simulate text."""
    key = (hashlib.sha256(cell.encode()).hexdigest(), tuple(engines), options.get("simulate"), costs.batch)
    if key not in _cache:
        _cache[key] = _measure(session, cell, options, costs, engines)
    steps, notes = _cache[key]
    return replace(costs, measured=steps, notes=costs.notes + notes)


def _measure(session, cell, options, costs, engines) -> tuple[MeasuredSteps, tuple[str, ...]]:
    steps, notes = MeasuredSteps(costs.workers), []
    if not costs.arrays:  # a pipeline's own per-epoch and per-step costs would count as the exchanges'
        return steps, ("what a step adds to the profiled gradients (Keras' loop, the exchanges) is measured on "
                       "numpy arrays only; this cell fits a pipeline (tf.data, PyDataset): links taken from the "
                       "link model (free on loopback)",)
    for strategy, field, what in PROBES:
        if strategy != "local" and costs.workers < 2:
            continue
        workers = 1 if strategy == "local" else costs.workers
        samples = min(costs.samples, PROBE_STEPS * costs.batch * workers)
        try:
            epoch_s = _probe(session, cell, options, strategy, engines[:workers], samples)
        except Exception as exc:  # an exchange the cluster cannot make is a finding of the plan, not its end
            notes.append(f"{what}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                         f"); taken from the link model (free on loopback)")
            continue
        value = solve(strategy, field, replace(costs, samples=samples, epochs=1, measured=steps), epoch_s)
        steps = replace(steps, **{field: value})
        notes.append(f"{what}: {value * 1e3:.3g} ms a step, measured by a short real run of {strategy}")
    return steps, tuple(notes)


def solve(strategy: str, field: str, costs: ClusterCosts, epoch_s: float) -> float:
    """The seconds a step's `field` must add for `strategy`'s predicted epoch on `costs` to be `epoch_s`
    (0 when the epoch is no longer than the prediction without it)."""
    def predicted(value: float) -> float:
        return predict(strategy, replace(costs, measured=replace(costs.measured, **{field: value}))).epoch_s

    low, high = 0.0, epoch_s
    if predicted(low) >= epoch_s:
        return 0.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < epoch_s else (low, middle)
    return (low + high) / 2


def _probe(session, cell: str, options: dict, strategy: str, engines: list[int], samples: int) -> float:
    """Run `cell` under `strategy` on `engines` for PROBE_EPOCHS epochs of `samples` (no validation); the
    seconds of an epoch after the first."""
    from ..errors import NbdistError
    from .own_runs import planner_run
    from .short_runs import first_worker_simulate

    simulate = first_worker_simulate(options.get("simulate")) if strategy == "local" else options.get("simulate")
    run = planner_run(session, cell, options, strategy=strategy, workers=None, targets=",".join(map(str, engines)),
                      simulate=simulate, plan_samples=samples, plan_epochs=PROBE_EPOCHS, plan_validation=0)
    seconds = steady_epoch_s(run)
    if seconds is None:
        raise NbdistError(f"run {run.id} reported fewer than two epochs")
    return seconds


def steady_epoch_s(run) -> float | None:
    """A run's seconds an epoch after the first (which includes start-up and tracing), from its first worker's
    records (virtual seconds on the virtual clock); None with fewer than two epochs."""
    records = run.fits[-1].records if run.fits else []
    return seconds_an_epoch({record["epoch"]: record["t"] for record in records})


def seconds_an_epoch(ends: dict[int, float]) -> float | None:
    """Seconds an epoch after the first, from each epoch's last time {epoch: t}; None with fewer than two."""
    if len(ends) < 2:
        return None
    times = [ends[e] for e in sorted(ends)]
    return (times[-1] - times[0]) / (len(times) - 1)
