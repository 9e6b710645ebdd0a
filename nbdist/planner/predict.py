"""Each strategy's epoch time on a cluster, from its costs and the strategy's schedule.

The formulas are the virtual clock's own (`nbdist.strategies.virtual_clock`): a step costs t(b) / speed, an
exchange two one-way trips of latency + bytes / bandwidth, a synchronous step the slowest rank
then a ring allreduce (`ring_allreduce_s`). So on the virtual clock's set-ups a prediction is
checked against what the same costs produce when the strategy really runs
(`python -m nbdist.experiments plan-check`). The parameter server's own time per message, which
the virtual clock does not charge, bounds the asynchronous strategies from `ServerCosts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..strategies.virtual_clock import ring_allreduce_s
from .costs import ClusterCosts

SGD_RULES = ("dc-asgd", "dc-asgd-a", "dc-asgdk", "ddc-asgd")  # the PS applies SGD itself (`ps.delay.PRESETS`)
ASYNC_PS = ("nfdt", "asgd", *SGD_RULES)
COMPENSATED_STALENESS = 16  # the most workers the delay rules were measured with (docs/results.md, S4)
MODEL_PARALLEL = ("pipeline", "tensor")


@dataclass(frozen=True)
class Prediction:
    """One strategy's predicted epoch on one cluster, or why it is not planned (`refused`)."""

    strategy: str
    workers: int
    epoch_s: float | None = None  # the mean over the cell's epochs
    per_epoch: tuple[float, ...] = ()  # each epoch's seconds (they differ where a schedule changes: ADSP, ASHL)
    reason: str = ""  # what bounds the epoch ("waits for worker 3, 4.0x slower")
    refused: str | None = None
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        extras = "".join(f":{k.replace('_', '-')}={v}" for k, v in self.options.items())
        return f"{self.strategy}{extras}"


def predict(strategy: str, costs: ClusterCosts, options: dict | None = None) -> Prediction:
    """`strategy`'s epoch on `costs` (with its `options`: balance=auto, data=static), or its refusal."""
    options = dict(options or {})
    refused = refusal(strategy, costs, options)
    base = Prediction(strategy, 1 if strategy == "local" else costs.workers, options=options)
    if refused:
        return replace(base, refused=refused)
    seconds, reason = PREDICTORS[strategy](costs, options)
    per_epoch = tuple(seconds) if isinstance(seconds, list) else (seconds,) * max(costs.epochs, 1)
    return replace(base, epoch_s=sum(per_epoch) / len(per_epoch), per_epoch=per_epoch, reason=reason)


def refusal(strategy: str, costs: ClusterCosts, options: dict) -> str | None:
    """Why the cell cannot run `strategy` on this cluster, or why the plan does not predict it; None if it can."""
    if strategy in MODEL_PARALLEL:
        return (f"not planned: {strategy} splits a model too large for one engine; this one "
                f"({costs.model_bytes / 1e6:.1f} MB) fits, and data parallelism trains it faster")
    if strategy not in PREDICTORS:
        return f"not planned: no schedule model of {strategy}"
    if strategy != "local" and costs.workers < 2:
        return f"needs at least 2 engines; the cluster has {costs.workers}"
    if strategy in SGD_RULES and costs.optimizer != "SGD":
        return (f"an SGD rule: the cell compiled {costs.optimizer}; compile with keras.optimizers.SGD, or use "
                "asgd or nfdt, which keep the cell's optimizer")
    if not costs.arrays and (strategy == "ashl" or options.get("balance") == "auto"):
        return f"{strategy} re-batches numpy arrays by speed; the cell fits a tf.data pipeline or a PyDataset"
    return None


def _local(costs: ClusterCosts, options: dict) -> tuple[float, str]:
    steps = math.ceil(costs.samples / costs.batch)
    return steps * costs.compute_s(0), f"{steps} steps on one engine"


def _hfdt(costs: ClusterCosts, options: dict) -> tuple[float, str]:
    n, batches = costs.workers, [costs.batch] * costs.workers
    if options.get("balance") == "auto":
        from ..strategies.balance import balanced_batches
        from ..strategies.ashl.allocation import CostModel

        batches = balanced_batches([CostModel(costs.step.fixed_s / p.speed, costs.step.per_sample_s / p.speed)
                                    for p in costs.profiles], costs.batch)
    # balanced shares are cut to whole batches (`balance.whole_batches`); equal shards end with a short step
    steps = max(1, costs.samples // (n * costs.batch)) if options.get("balance") == "auto" else \
        math.ceil(costs.samples / (n * costs.batch))
    compute = [costs.compute_s(k, b) for k, b in enumerate(batches)]
    ring = costs.measured.ring_s if costs.measured else None
    step_s = max(compute) + ring if ring is not None else ring_allreduce_s(list(costs.profiles), compute,
                                                                            costs.model_bytes)
    return steps * step_s, _sync_reason(costs, compute, step_s - max(compute), "ring allreduce")


def _ssgd(costs: ClusterCosts, options: dict) -> tuple[float, str]:
    n = costs.workers
    compute = [costs.compute_s(k) for k in range(n)]
    server = n * costs.server.service_s(costs.model_bytes)  # the PS answers a round's pushes one by one
    rounds = [c + costs.exchange_s(k) + server for k, c in enumerate(compute)]
    full, rest = divmod(costs.samples, n * costs.batch)
    # the epoch's last batches are dealt in rank order: the last round waits for the slowest that holds one
    partial = max(rounds[:math.ceil(rest / costs.batch)], default=0.0)
    host = costs.server.host_bandwidth_bps  # every push and reply of a round crosses the PS host's link
    step_s = max(max(rounds), n * 2 * costs.model_bytes * 8 / host if host else 0.0)
    return full * step_s + partial, _sync_reason(costs, compute, step_s - max(compute), "PS round")


def _async_ps(costs: ClusterCosts, options: dict) -> tuple[float, str]:
    cycles = [costs.compute_s(k) + costs.exchange_s(k) for k in range(costs.workers)]
    if options.get("data") == "static":  # equal shards: the epoch ends when the slowest has trained its own
        steps = math.ceil(costs.samples / costs.workers / costs.batch)
        slowest = max(range(costs.workers), key=lambda k: cycles[k])
        return _bounded_by_server(costs, steps * cycles[slowest], costs.samples / costs.batch,
                                  f"equal shards: waits for worker {slowest} at the epoch's end")
    rate = sum(costs.batch / max(c, 1e-12) for c in cycles)  # samples per second, every worker drawing batches
    tail = max(cycles) / 2  # the epoch's last batch is, on average, half a slowest cycle behind the others
    reason = f"batches dealt to whoever is free; staleness about {costs.workers - 1} updates"
    if costs.workers > COMPENSATED_STALENESS:
        reason += f" (past the {COMPENSATED_STALENESS} workers the delay rules were measured with)"
    return _bounded_by_server(costs, costs.samples / rate + tail, costs.samples / costs.batch, reason)


def _adsp(costs: ClusterCosts, options: dict) -> tuple[list[float], str]:
    """Equal static shards; each worker commits every `interval` local steps, the interval found by ADSP's own
    hill climb (`strategies.adsp.IntervalSearch`), fed here the samples per second of each trial (its loss
    decrease per second, where loss falls at a steady rate per sample); every epoch waits for the last."""
    from ..strategies.adsp import COMMITS_PER_TRIAL, IntervalSearch

    steps = math.ceil(costs.samples / costs.workers / costs.batch)
    workers = [{"search": IntervalSearch(), "since": 0, "commits": 0, "t": 0.0, "trial": (0.0, 0)}
               for _ in range(costs.workers)]
    ends, start, commits = [], 0.0, []
    for _ in range(max(costs.epochs, 1)):
        before = sum(state["commits"] for state in workers)
        for w, state in enumerate(workers):
            state["t"] = start  # the epoch barrier: every worker resumes when the last one arrived
            for _ in range(steps):
                state["t"] += costs.compute_s(w)
                state["since"] += 1
                if state["since"] >= state["search"].interval:
                    _adsp_commit(costs, w, state, COMMITS_PER_TRIAL)
        commits.append(sum(state["commits"] for state in workers) - before)
        start = max(start, max(state["t"] for state in workers))
        bound, _ = _bounded_by_server(costs, start - (ends[-1] if ends else 0.0), commits[-1], "")
        start = (ends[-1] if ends else 0.0) + bound  # the PS, when it is the slower, sets the epoch
        ends.append(start)
    slowest = max(range(costs.workers), key=lambda w: workers[w]["t"])
    intervals = sorted({state["search"].interval for state in workers})
    epochs = [b - a for a, b in zip([0.0, *ends], ends)]
    reason = (f"equal shards: each epoch waits for worker {slowest}; commit intervals reach "
              f"{'-'.join(map(str, intervals))} steps")
    return epochs, _bounded_by_server(costs, epochs[-1], commits[-1], reason)[1]


def _adsp_commit(costs: ClusterCosts, worker: int, state: dict, per_trial: int) -> None:
    state["t"] += costs.exchange_s(worker)
    state["commits"] += 1
    state["trial"] = (state["trial"][0], state["trial"][1] + state["since"])
    state["done"] = state.get("done", 0) + state["since"]
    state["since"] = 0
    if state["commits"] % per_trial == 0:
        started, trained = state["trial"]
        # the loss falls less per sample as training goes on (as 1 / (1 + epochs done)): a later, longer
        # interval must make up for that as well
        epochs_done = state["done"] * costs.batch * costs.workers / costs.samples
        state["search"].report(trained * costs.batch / max(state["t"] - started, 1e-12) / (1 + epochs_done))
        state["trial"] = (state["t"], 0)


def _ashl(costs: ClusterCosts, options: dict) -> tuple[list[float], str]:
    """Profiling, then the asynchronous phase (AHL): worker i makes counts_i local steps of b_i, then commits
    (`ashl.allocation.allocate_commits`, as the coordinator solves it), batches dealt; from the first epoch end
    at or past 20 % of the epochs (on exact profiles the allocation holds at once: `ashl.switch`) synchronous
    rounds of the workers that commit every interval (SHL; a slower link leaves at the switch)."""
    from ..strategies.ashl.allocation import CostModel, allocate_commits
    from ..strategies.ashl.coordinator import MIN_SHARE
    from ..strategies.ashl.switch import MIN_PROGRESS

    extra = costs.measured.step_extra_s if costs.measured else 0.0
    models = [CostModel(costs.step.fixed_s / p.speed + extra, costs.step.per_sample_s / p.speed, costs.exchange_s(k))
              for k, p in enumerate(costs.profiles)]
    batches, counts, every = allocate_commits(models, costs.workers * costs.batch,
                                              b_min=max(1, math.floor(MIN_SHARE * costs.batch)))
    steps = [m.fixed_s + m.per_sample_s * b for m, b in zip(models, batches)]
    cycles = [c * s + m.comm_s for m, s, c in zip(models, steps, counts)]
    commits = [c * b / t for c, b, t in zip(counts, batches, cycles)]  # samples per second, asynchronous
    # a worker out of batches commits what it trained: the epoch ends about half a step and commit after
    ahl = costs.samples / sum(commits) + max(s + m.comm_s for s, m in zip(steps, models)) / 2
    ahl, why = _bounded_by_server(costs, ahl, costs.samples * sum(1 / t for t in cycles) / sum(commits), "")
    pacers = [k for k, e in enumerate(every) if e == 1]
    rounds = costs.samples / sum(counts[k] * batches[k] for k in pacers)
    shl = _bounded_by_server(costs, rounds * max(cycles[k] for k in pacers), rounds * len(pacers), "")[0]
    epochs = max(costs.epochs, 1)
    at = options.get("switch_at")
    switch = None if "switch" in str(options.get("without") or "") or epochs < 2 else \
        math.ceil((at if at else MIN_PROGRESS) * epochs - 1e-9) or 1
    per_epoch = [ahl if switch is None or e <= switch else shl for e in range(1, epochs + 1)]
    per_epoch[0] += _ashl_profile_s(costs, models)
    slow = [k for k, e in enumerate(every) if e > 1]
    reason = (f"batches {min(batches)}-{max(batches)} by speed, {max(counts)} local steps a commit; "
              f"asynchronous {ahl:.3g} s an epoch" + (f", synchronous {shl:.3g} s from epoch {switch + 1}"
                                                       if switch and switch < epochs else "")
              + (f"; worker(s) {slow} leave at the switch (a link too slow for the rounds)" if slow else "")
              + (f"; {why}" if why else ""))
    return per_epoch, reason


def _ashl_profile_s(costs: ClusterCosts, models: list) -> float:
    """What ASHL's profile costs the first epoch: steps at b and 2b within its budget, push-sized round trips
    (`strategies.ashl.virtual_profile`), the slowest worker's."""
    from ..strategies.ashl.profiling import BUDGET_S, steps_within_budget
    from ..strategies.ashl.strategy import MIN_PROBES, PROBES

    def one(m) -> float:
        pair = 2 * m.fixed_s + 3 * m.per_sample_s * costs.batch
        probes = max(MIN_PROBES, min(PROBES, math.ceil(BUDGET_S / max(m.comm_s, 1e-9))))
        return steps_within_budget(pair) * pair + probes * m.comm_s

    return max(one(m) for m in models)


def _sync_reason(costs: ClusterCosts, compute: list[float], exchange_s: float, exchange: str) -> str:
    slowest = max(range(len(compute)), key=lambda k: compute[k])
    ratio = compute[slowest] / min(compute)
    share = exchange_s / (exchange_s + compute[slowest]) if exchange_s + compute[slowest] > 0 else 0.0
    waits = f"waits for worker {slowest}, {ratio:.1f}x slower" if ratio > 1.05 else "ranks equally fast"
    return f"{waits}; {exchange} {share:.0%} of a step"


def _bounded_by_server(costs: ClusterCosts, epoch_s: float, pushes: float, reason: str) -> tuple[float, str]:
    """An asynchronous epoch, or the parameter server's time for its pushes (service, or bytes over its host's
    link) when that is longer: the PS is then the bottleneck, and the reason says so."""
    server = costs.server
    busy_s = pushes * server.service_s(costs.model_bytes)
    link_s = pushes * 2 * costs.model_bytes * 8 / server.host_bandwidth_bps if server.host_bandwidth_bps else 0.0
    bound = max(busy_s, link_s)
    if bound <= 0:
        return epoch_s, reason
    what = "PS link" if link_s >= busy_s else "PS"
    if bound >= epoch_s:
        return bound, f"{what} saturated (100 % busy)" + (f": {reason}" if reason else "")
    return epoch_s, (f"{reason}; " if reason else "") + f"{what} {bound / epoch_s:.0%} busy"


PREDICTORS = {"local": _local, "hfdt": _hfdt, "ssgd": _ssgd, "adsp": _adsp, "ashl": _ashl,
              **{name: _async_ps for name in ASYNC_PS}}
