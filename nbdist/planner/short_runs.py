"""The plan's accuracy part: each strategy's accuracy curve from a short run of the cell on the virtual clock.

Every planned strategy runs the cell on the engines with the plan's speeds and links simulated
(`--simulate "...; clock=virtual; step=..."`), on the first samples of the fit's arrays only (a few
hundred steps in all; `limit_request` on each engine), and reports its validation accuracy (or its
training accuracy) after each epoch. The target is the best accuracy of the short local run less
one point; a strategy's time to it is the samples it took, at the plan's predicted speed. Curves are
cached by the cell's digest and the plan's costs. Past the cluster (`scaled_curves`), each count of
workers is emulated on one engine (`strategies.virtual_workers`).
"""

from __future__ import annotations

import hashlib

from ..datasets import structures

STEPS = 400  # steps of the cell's batch a short run trains in all, over every worker and epoch
POINTS = 4  # accuracy measured at least this many times in a short run (its epochs over the first samples)
VALIDATION = 10000  # validation samples a short run evaluates each epoch (a part only: its accuracy is biased)
BELOW_BEST = 0.01  # the default target: the best short local accuracy less this
_cache: dict[tuple, dict] = {}


def short_epochs(costs) -> int:
    return max(costs.epochs, POINTS)


def short_samples(costs, workers: int, steps: int = STEPS) -> int:
    """Samples of the fit's arrays a short run trains on in each of its epochs: `steps` batches in all, and no
    more samples than the cell's own epochs train."""
    points = short_epochs(costs)
    per_epoch = min(steps * costs.batch, costs.samples * max(costs.epochs, 1)) // points
    return max(costs.batch * workers, min(costs.samples, per_epoch))


def limit_request(request, samples: int, epochs: int | None = None, validation: int = VALIDATION,
                  whole: int | None = None) -> None:
    """On an engine: the fit's numpy arrays cut to their first `samples` (validation arrays to `validation`;
    0: no validation), or its tf.data pipeline or PyDataset to the batches of the run's `whole` samples (each
    rank takes its share of those), trained for `epochs` (accuracy is then known after each `samples`)."""
    import numpy as np

    from ..datasets.sharding import dataset_batch, is_dataset, is_py_dataset, py_dataset_of

    def arrays(value) -> bool:  # an array, or any nest of them (`structures`)
        leaves = structures.flatten(value)
        return bool(leaves) and all(isinstance(v, np.ndarray) for v in leaves)

    def cut(value, n):  # a pipeline is cut below
        return structures.take(value, slice(0, n)) if arrays(value) else value

    args = request.args
    for name in ("x", "y", "sample_weight"):
        if args.get(name) is not None:
            args[name] = cut(args[name], samples)
    x = args.get("x")
    if arrays(x) or ((is_dataset(x) or is_py_dataset(x)) and whole):
        args["steps_per_epoch"] = None  # an epoch is the cut data, whatever the cell's own steps
    if is_dataset(x) and whole:
        args["x"] = x.take(max(1, -(-whole // dataset_batch(x))))
    elif is_py_dataset(x) and whole:
        args["x"] = py_dataset_of(x, list(range(min(len(x), max(1, -(-whole // dataset_batch(x)))))))  # len: batches
    if validation == 0:
        args.update(validation_data=None, validation_split=0.0)
    elif isinstance(args.get("validation_data"), tuple):
        args["validation_data"] = tuple(cut(v, validation) for v in args["validation_data"])
    if epochs:
        args["epochs"] = epochs + (args.get("initial_epoch") or 0)


def simulate_text(costs, workers: int) -> str:
    """The `--simulate` text that gives a short run the plan's speeds, links and step cost on the virtual clock."""
    profiles = costs.profiles[:workers]
    parts = [f"speed={','.join(f'{p.speed:.6g}' for p in profiles)}"]
    if any(p.bandwidth_bps for p in profiles):  # a free link, among slower ones: a thousand times the fastest
        free = 1000 * max(p.bandwidth_bps or 0 for p in profiles)
        parts.append(f"bandwidth={','.join(f'{(p.bandwidth_bps or free) / 1e6:.6g}m' for p in profiles)}")
    if any(p.latency_s for p in profiles):
        parts.append(f"latency={','.join(f'{p.latency_s * 1e3:.6g}ms' for p in profiles)}")
    return "; ".join([*parts, "clock=virtual", f"step={costs.step.text()}"])


def first_worker_simulate(simulate: str | None) -> str | None:
    """A `--simulate` text for one engine: each per-worker list cut to its first value."""
    if not simulate:
        return simulate
    parts = [p.strip() for p in simulate.split(";") if p.strip()]
    return "; ".join(p if p.split("=")[0].strip() in ("clock", "step") else p.split(",")[0] for p in parts)


def curves(session, cell: str, options: dict, plan) -> dict[str, dict]:
    """{label: {"accuracy": [per epoch, the seeds' mean], "runs": [each seed's], "samples": short run's samples}
    or {"error": why}} for every planned strategy, from `--plan-seeds` short virtual runs each (cached)."""
    digest = hashlib.sha256(f"{cell}\0{plan.costs}".encode()).hexdigest()
    first = options.get("seed") or 0
    found = {}
    for p in plan.predictions:
        if p.refused is None:
            runs = []
            for seed in range(first, first + (options.get("plan_seeds") or 1)):
                key = (digest, p.label, seed)
                if key not in _cache:
                    _cache[key] = _short_run(session, cell, options, plan.costs, p, seed)
                runs.append(_cache[key])
            found[p.label] = combined(runs)
    return found


def combined(runs: list[dict]) -> dict:
    """One curve of several seeds' short runs: each epoch's mean accuracy, and every seed's curve; the first
    error if any seed failed."""
    failed = next((run for run in runs if "error" in run), None)
    if failed is not None:
        return failed
    curves = [run["accuracy"] for run in runs]
    length = min(len(c) for c in curves)
    mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
    return {**runs[0], "accuracy": mean, "runs": [c[:length] for c in curves]}


def _short_run(session, cell: str, options: dict, costs, prediction, seed: int) -> dict:
    from .own_runs import planner_run

    samples = short_samples(costs, prediction.workers)
    targets = None if prediction.workers == 1 else options.get("targets")
    return _curve_of(lambda: planner_run(
        session, cell, options, strategy=prediction.strategy, workers=prediction.workers, targets=targets,
        seed=seed, simulate=simulate_text(costs, prediction.workers), plan_samples=samples,
        plan_epochs=short_epochs(costs), **prediction.options), samples)


def _curve_of(make_run, samples: int) -> dict:
    """A short run's curve: its accuracy after each epoch (validation's if it has one), or {"error": why}."""
    try:
        run = make_run()
    except Exception as exc:  # a strategy that fails on this cell is a finding of the plan, not its end
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    history = run.history
    metric = "val_accuracy" if history.get("val_accuracy") else "accuracy"
    timings = next((fits[0].timings for fits in run.results.values() if fits), {})
    staleness = (timings.get("virtual_workers") or {}).get("staleness_mean")
    return {"accuracy": [float(a) for a in history.get(metric, [])], "metric": metric, "samples": samples,
            **({"staleness": staleness} if staleness is not None else {})}


EMULATED = ("hfdt", "ssgd", "nfdt", "asgd", "dc-asgd", "dc-asgd-a", "dc-asgdk", "ddc-asgd")  # past the cluster


def emulation(prediction, costs, samples: int) -> dict:
    """What the `virtual-workers` engine needs to emulate `prediction`'s strategy on `costs`' workers, in a short
    run of `samples` an epoch: each one's seconds from push to push, whether its steps are synchronous, the PS's
    rule, the learning rate's factor and its warm-up (in the short run's epochs)."""
    from ..errors import OptionError
    from ..strategies import make_strategy

    strategy = make_strategy({"strategy": prediction.strategy, **prediction.options})
    n = costs.workers
    seconds = [costs.compute_s(k) + costs.exchange_s(k) for k in range(n)]
    if prediction.strategy == "hfdt":
        return {"workers": n, "seconds": seconds, "synchronous": True, "rule": None,
                "lr_scale": n if strategy.value("scale_lr") == "linear" else 1,
                "warmup_epochs": (strategy.value("warmup_epochs") or 0) * costs.samples / samples}
    settings = strategy.shard_settings(n)
    if settings.get("max_staleness") is not None:
        raise OptionError("--max-staleness is not emulated past the cluster")
    return {"workers": n, "seconds": seconds, "synchronous": bool(settings.get("synchronous")),
            "rule": settings.get("rule"), "momentum": settings.get("momentum")}


def scaled_curves(session, cell: str, options: dict, plan, counts: list[int], link=None) -> dict[tuple, dict]:
    """{(label, workers): a short run's curve as `curves` gives it, or {"error": why}} of every planned
    data-parallel strategy at each of `counts` workers (the plan's cluster grown), each emulated on one engine
    (`strategies.virtual_workers`); cached like `curves`."""
    digest = hashlib.sha256(f"{cell}\0{plan.costs}\0{link}".encode()).hexdigest()
    seed = options.get("seed") or 0
    found = {}
    for p in plan.predictions:
        if p.refused is not None or p.strategy == "local":
            continue
        for n in counts:
            if p.strategy not in EMULATED:
                found[(p.label, n)] = {"error": f"{p.strategy}'s accuracy is not emulated past the cluster"}
                continue
            key = (digest, p.label, n, seed)
            if key not in _cache:
                _cache[key] = _virtual_workers_run(session, cell, options, plan.costs.grown(n, link), p, seed)
            found[(p.label, n)] = _cache[key]
    return found


def _virtual_workers_run(session, cell: str, options: dict, costs, prediction, seed: int) -> dict:
    from ..strategies.virtual_workers import VirtualWorkersStrategy
    from .own_runs import planner_run

    samples = short_samples(costs, costs.workers)
    targets = str(options.get("targets") or "").split(",")[0] or None
    return _curve_of(lambda: planner_run(
        session, cell, options, VirtualWorkersStrategy, strategy="virtual-workers",
        workers=None if targets else 1, targets=targets, seed=seed, simulate=None, plan_samples=samples,
        plan_epochs=short_epochs(costs), emulate=emulation(prediction, costs, samples)), samples)
