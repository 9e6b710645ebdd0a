"""`--strategy auto`: measure the cluster on the cell's model, plan every strategy, and pick the first.

The measuring is a `profile` run (`strategies.profile`): each engine times the cell's step at its
batch and twice it. On the virtual clock (`--simulate "...; clock=virtual"`) the speeds and links
are the ones given; on the real clock each engine's speed is its measured step time against the
fastest engine's, and short real runs measure what a step adds to it: Keras' loop, Horovod's
allreduce, a push-pull over nbdist's wire (`calibrate`). The PS's cost per message, which bounds
the asynchronous strategies at scale, is taken as measured on loopback, and the plan's notes say so.
"""

from __future__ import annotations

from ..errors import ClusterError, OptionError
from ..host.hetero import Profile, StepCost, parse_clock, parse_simulate
from .calibrate import steady_epoch_s
from .costs import ClusterCosts, ServerCosts
from .own_runs import auto_defaults, planner_run
from .plan import Plan, make_plan
from .short_runs import first_worker_simulate

PS_MESSAGE_S = 1e-3  # one push-pull's fixed cost on this machine's loopback (docs/benchmarks.md, ps_vs_raw_zmq_225k)
VARIANTS = {"hfdt": ({}, {"balance": "auto"})}  # strategies planned with more than their defaults


def candidates() -> list[tuple[str, dict]]:
    """Every registered strategy (and its planned variants), as (name, options)."""
    from ..strategies import strategy_names

    return [(name, options) for name in strategy_names() for options in VARIANTS.get(name, ({},))]


def measure(session, cell: str, options: dict) -> ClusterCosts:
    """The cluster's costs for `cell`: a profile run on the engines `options` choose (all idle ones by default)."""
    from ..strategies.profile import ProfileStrategy

    workers = options.get("workers")
    if not workers and not options.get("targets"):  # as many engines as --simulate describes
        workers = _simulated_workers(options.get("simulate"))
    run = planner_run(session, cell, options, ProfileStrategy, strategy="profile", workers=workers)
    measured = [run.results[eid][0].timings["plan_profile"] for eid in run.workers if run.results.get(eid)]
    if not measured:
        raise OptionError(f"the planner's profile run {run.id} measured no engine (see %dist runs); run it again.")
    costs = costs_from(measured, options.get("simulate"))
    if parse_clock(options.get("simulate"))[0] == "virtual":
        return costs
    from .calibrate import measured as measured_in_place

    return measured_in_place(session, cell, options, costs, [eid for eid in run.workers if run.results.get(eid)])


def costs_from(measured: list[dict], simulate: str | None) -> ClusterCosts:
    """ClusterCosts from each engine's profile record and the cell's `--simulate` text."""
    clock, given_step = parse_clock(simulate)
    first = measured[0]
    steps = [StepCost(**m["step"]) for m in measured]
    simulated = parse_simulate(simulate, len(measured))
    notes = []
    if clock == "virtual":
        step, speeds, server = (given_step or steps[0]).at(first["batch"]), [p.speed for p in simulated], ServerCosts()
        notes.append("virtual clock: speeds and links as --simulate gives them; the PS's own time is not charged")
    else:
        batch = first["batch"]
        fastest = min(steps, key=lambda s: s.seconds(batch))
        step = fastest
        speeds = [fastest.seconds(batch) / s.seconds(batch) * p.speed for s, p in zip(steps, simulated)]
        server = ServerCosts(message_s=PS_MESSAGE_S)
        notes.append(f"the PS's cost per message is taken as {PS_MESSAGE_S * 1e3:g} ms (measured on loopback, "
                     "docs/benchmarks.md), not measured on this cluster")
    profiles = tuple(Profile(speed=s, bandwidth_bps=p.bandwidth_bps, latency_s=p.latency_s)
                     for s, p in zip(speeds, simulated))
    if first["samples"] is None:
        raise OptionError("--strategy auto needs the number of samples an epoch holds; this cell's tf.data pipeline "
                          "does not say (its cardinality is unknown). Give fit numpy arrays, or choose a strategy.")
    return ClusterCosts(profiles, step, first["samples"], first["batch"], first["model_bytes"],
                        optimizer=first["optimizer"], arrays=first["arrays"], server=server, notes=tuple(notes))


def plan(session, cell: str, options: dict) -> Plan:
    """Measure, predict every strategy, and run each a short while on the virtual clock for its accuracy."""
    from . import short_runs

    target = options.get("target_accuracy")
    if target is not None and not 0 < target <= 1:
        raise OptionError(f"--target-accuracy is a fraction between 0 and 1, like 0.85. Received: {target}")
    made = make_plan(measure(session, cell, options), candidates())
    made.cell, made.options = cell, dict(options)
    made.add_curves(short_runs.curves(session, cell, options, made), target=target)
    return made


def chosen_options(plan: Plan, options: dict) -> tuple[dict, list[str]]:
    """The cell's options for the plan's first choice, and the flags given that it does not read (dropped)."""
    from ..strategies import COMMON_OPTIONS, REGISTRY, strategy_options

    choice = plan.choice
    reads = {o.name for o in REGISTRY[choice.strategy].reads} | {o.name for o in COMMON_OPTIONS}
    own = strategy_options()
    dropped = [own[k].flag for k, v in options.items() if k in own and k not in reads and v != own[k].default]
    chosen = {k: v for k, v in options.items() if k not in own or k in reads}
    chosen.update(strategy=choice.strategy, planned_epoch_s=choice.epoch_s, **choice.options)
    chosen.update(auto_defaults())
    if not options.get("targets"):
        chosen["workers"] = choice.workers  # the engines it was planned on
    if choice.workers == 1:  # local: one engine, the first of those given, as the first worker simulated
        targets = str(options.get("targets") or "").split(",")[0] or None
        chosen.update(workers=None if targets else 1, targets=targets,
                      simulate=first_worker_simulate(options.get("simulate")))
    return chosen, dropped


def _simulated_workers(simulate: str | None) -> int | None:
    """The number of workers a `--simulate` text lists values for (None: one value for all, or no text)."""
    counts = [len(part.split(",")) for part in (simulate or "").split(";") if "=" in part]
    return max(counts) if counts and max(counts) > 1 else None


def against_plan(run) -> str | None:
    """For a run `--strategy auto` chose: its measured seconds an epoch (after the first, which includes start-up
    and tracing; virtual seconds on the virtual clock) beside the plan's prediction."""
    planned, measured = run.options.get("planned_epoch_s"), steady_epoch_s(run)
    if not planned or measured is None:
        return None
    return (f"the plan predicted {planned:.3g} s an epoch for {run.strategy}; it took {measured:.3g} s an epoch "
            f"after the first ({measured / planned - 1:+.0%})")


def announce(plan: Plan, options: dict) -> dict | None:
    """Print the plan; with `--plan-only` stop there (None), else print the choice and return its options."""
    print(plan.table())
    if options.get("plan_only"):
        return None
    chosen, dropped = chosen_options(plan, options)
    print(f"nbdist: {plan.choice_line()}" + (f"; {', '.join(dropped)} not read by it, left out" if dropped else "")
          + ".")
    return chosen


def plan_table(plan: Plan | None, workers: str | None = None, session=None) -> str:
    """`%dist plan`: the plan's table; with `workers` ("8,32,128") its predictions at those worker counts (their
    accuracy from short runs of that many virtual workers, on `session`'s cluster)."""
    from .plan import scaling_table
    from .short_runs import scaled_curves

    if plan is None:
        raise OptionError("no plan yet: run the training cell under %%distribute --strategy auto --plan-only "
                          "(or --strategy auto) first.")
    if not workers:
        return plan.table()
    try:
        counts = sorted({int(n) for n in workers.replace(" ", "").split(",") if n})
    except ValueError:
        raise OptionError(f"%dist plan --workers takes worker counts separated by commas, like 8,32,128. "
                          f"Received: {workers}") from None
    if not counts or counts[0] < 1:
        raise OptionError(f"%dist plan --workers takes positive worker counts. Received: {workers}")
    curves = None
    if session is not None and plan.cell:
        try:
            session.require_cluster()
        except ClusterError:
            raise OptionError("%dist plan --workers predicts the accuracy at those counts from short runs of virtual "
                              "workers on an engine, and no cluster is running: %dist start -n 1 first, or add "
                              "--no-accuracy for the epoch times alone.") from None
        curves = scaled_curves(session, plan.cell, plan.options, plan, counts)
    return scaling_table(plan, counts, curves=curves)
