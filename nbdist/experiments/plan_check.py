"""The `plan-check` command: the planner's epoch times against the same strategies run on the virtual clock.

    python -m nbdist.experiments plan-check --setup H1 --step 1.58326ms+37.4714us/sample --samples 8000

The planner plans the set-up's simulated cluster as `--strategy auto` would (its epoch times, and its
short runs for the accuracy part, seed 0); then each strategy trains `--epochs` epochs on the virtual
clock (the set-up's speeds and links, one step cost for all; seed 1, or seeds 1..N with
`--measured-seeds N`, compared on their mean curve). Prints a table of predicted
against measured last-epoch seconds and seconds to the plan's target, then `RESULT
plan_epoch_time_error_max_<setup>` (the worst relative error), `RESULT plan_rank_tau_<setup>`
(Kendall's tau of the orderings by time to target) and `RESULT auto_regret_<setup>` (the measured time
to target of the plan's first choice over the soonest measured, less 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..host.hetero import StepCost, parse_simulate
from ..planner.costs import ClusterCosts
from ..planner.plan import crossing, kendall_tau, make_plan
from .cells import DATA, MODELS, SETUPS, TRAIN
from .grid import notebook_shell, parse_rows, run_one

STRATEGIES = "local,hfdt:scale-lr=none,hfdt:balance=auto:scale-lr=none,ssgd,nfdt,ddc-asgd,adsp,ashl"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m nbdist.experiments plan-check", description=__doc__.split("\n")[0])
    parser.add_argument("--setup", required=True, choices=sorted(SETUPS))
    parser.add_argument("--step", required=True, help="the virtual clock's step cost, e.g. 1.58326ms+37.4714us/sample")
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--below-best", default="0.01,0.05",
                        help="targets: the short local run's best accuracy less each of these (the plan's own is 0.01)")
    parser.add_argument("--plan-seeds", type=int, default=1, help="seeds of each of the plan's short runs (0, 1, ...)")
    parser.add_argument("--measured-seeds", type=int, default=1,
                        help="seeds of each measured run (1, 2, ...): compared on their mean curve")
    parser.add_argument("--out", help="write the plan's curves and the measured runs to this JSON file")
    parser.add_argument("--measured", help="a JSON file --out wrote: predict again against its runs, run nothing")
    parser.add_argument("--scaling", help="only predict, at these worker counts (4,16,64,128): the set-up's speeds "
                                          "repeated, links as --link, the PS as --ps-message; the accuracy from "
                                          "short runs of that many virtual workers on one engine")
    parser.add_argument("--link", default="10g,50us", help="--scaling: every worker's link, bandwidth,latency")
    parser.add_argument("--ps-message", default="1ms", help="--scaling: the PS's cost per push-pull")
    parser.add_argument("--emulated-against", metavar="JSON",
                        help="a JSON file --out wrote: its short runs beside the same strategies emulated as virtual "
                             "workers on one engine, at the set-up's own size (the emulation checked)")
    parser.add_argument("--no-accuracy", action="store_true",
                        help="--scaling: epoch times only (no short runs of virtual workers, no cluster)")
    args = parser.parse_args(argv)
    setup = {"model": "mlp", "lr": 0.05, **SETUPS[args.setup]}
    args.simulate, args.model, args.lr = setup["simulate"], setup["model"], setup["lr"]
    args.workers = max(len(part.split(",")) for part in args.simulate.split(";"))
    args.clock, args.seeds, args.momentum, args.hidden, args.target_accuracy = "virtual", 1, 0.9, 128, None
    return args


def model_bytes(model: str, hidden: int = 128) -> int:
    """The float32 bytes of the comparison's `model` (built here, as the engines build it)."""
    namespace: dict = {}
    exec("import keras\n" + MODELS[model].format(hidden=hidden), namespace)
    return 4 * namespace["build"]().count_params()


def cluster_costs(args, workers: int | None = None) -> ClusterCosts:
    """The set-up's costs as the planner gets them from a `--simulate` text and the step cost."""
    from ..host.hetero import _parse_step

    profiles = parse_simulate(args.simulate, args.workers)
    return ClusterCosts(tuple(profiles), _parse_step(args.step.lower()), args.samples or 60000, args.batch,
                        model_bytes(args.model, args.hidden), epochs=args.epochs)


def last_epoch_s(result: dict) -> float | None:
    ends = [0.0, *result["curve"]["t"]]
    return ends[-1] - ends[-2] if len(ends) >= 3 else None


def scaling_check(args) -> str:
    """The set-up's predictions at `--scaling` worker counts, on a model of the links and of the PS."""
    from dataclasses import replace

    from ..host.hetero import Profile, _parse
    from ..planner.costs import ServerCosts
    from ..planner.plan import make_plan, scaling_table

    bandwidth, latency = args.link.split(",")
    link = Profile(bandwidth_bps=_parse("bandwidth", bandwidth), latency_s=_parse("latency", latency))
    costs = replace(cluster_costs(args), server=ServerCosts(message_s=_parse("latency", args.ps_message),
                                                            host_bandwidth_bps=link.bandwidth_bps),
                    notes=(f"links {args.link} each; the PS {args.ps_message} a push-pull, its host's link "
                           f"{bandwidth}",))
    plan = make_plan(costs, [(row.strategy, row.options) for row in parse_rows(args.strategies)])
    counts = [int(n) for n in args.scaling.split(",")]
    return scaling_table(plan, counts, link, None if args.no_accuracy else scaled_accuracy(args, plan, counts, link))


def scaled_accuracy(args, plan, counts: list[int], link) -> dict:
    """On a one-engine cluster: the short local run (the plan's target), then every strategy's short run of
    each count of virtual workers (`short_runs.scaled_curves`), seed 0."""
    from ..planner import short_runs

    shell, session = notebook_shell()
    shell.run_line_magic("dist", "start -n 1")
    try:
        shell.run_cell_magic("distribute", "define --name experiment-data",
                             DATA.format(samples=args.samples) + MODELS[args.model].format(hidden=args.hidden))
        cell = TRAIN.format(lr=args.lr, momentum=args.momentum, batch=args.batch, epochs=args.epochs)
        local = make_plan(plan.costs, [("local", {})])
        plan.add_curves(short_runs.curves(session, cell, {"seed": 0}, local))
        return short_runs.scaled_curves(session, cell, {"seed": 0}, plan, counts, link)
    finally:
        shell.run_line_magic("dist", "stop")


def emulation_check(args) -> str:
    """The stored short runs (real engines, the real PS, on the virtual clock) beside the same strategies emulated
    as virtual workers on one engine at the set-up's own size and links: accuracy after each short epoch."""
    stored = json.loads(Path(args.emulated_against).read_text())["curves"]
    rows = [row for row in parse_rows(args.strategies) if row.label in stored and row.strategy != "local"]
    plan = make_plan(cluster_costs(args), [(row.strategy, row.options) for row in rows])
    emulated = scaled_accuracy(args, plan, [args.workers], None)
    lines = ["| set-up | strategy | real (engines, PS) | emulated (one engine) |", "|---|---|---|---|"]
    for row, p in zip(rows, plan.predictions):
        curve = emulated.get((p.label, args.workers)) or {}
        lines.append(f"| {args.setup}, {args.workers} | {row.label} | "
                     f"{' '.join(f'{a:.3f}' for a in stored[row.label].get('accuracy', []))} | "
                     f"{' '.join(f'{a:.3f}' for a in curve.get('accuracy', [])) or curve.get('error', '-')} |")
    return "\n".join(lines)


def plan_check(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.emulated_against:
        print(emulation_check(args))
        return []
    if args.scaling:
        print(scaling_check(args))
        return []
    rows = parse_rows(args.strategies)
    plan = make_plan(cluster_costs(args), [(row.strategy, row.options) for row in rows])
    if args.measured:
        stored = json.loads(Path(args.measured).read_text())
        curves, results = stored["curves"], stored["results"]
    else:
        curves, results = run_check(args, rows, plan)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "curves": curves, "results": results}, default=str))
    tables = []
    for i, below in enumerate(float(b) for b in args.below_best.split(",")):
        plan.add_curves(curves, below_best=below)
        table = [_compare(plan, prediction, result) for prediction, result in zip(plan.predictions, results)]
        _print(args, plan, table, suffix="" if i == 0 else f"_less{round(below * 100)}")
        tables.append(table)
    return tables


def run_check(args, rows, plan) -> tuple[dict, list[dict]]:
    """On one cluster: the planner's short runs (seed 0; with several, 100, 101, ...), then every row's full run
    (seed 1) on the virtual clock."""
    from ..planner import short_runs

    shell, session = notebook_shell()
    shell.run_line_magic("dist", f"start -n {args.workers}")
    try:
        shell.run_cell_magic("distribute", "define --name experiment-data",
                             DATA.format(samples=args.samples) + MODELS[args.model].format(hidden=args.hidden))
        cell = TRAIN.format(lr=args.lr, momentum=args.momentum, batch=args.batch, epochs=args.epochs)
        first = 0 if args.plan_seeds == 1 else 100  # apart from the measured runs' seed
        curves = short_runs.curves(session, cell, {"seed": first, "plan_seeds": args.plan_seeds}, plan)
        results = [mean_result([run_one(shell, session, row, args, seed=seed)
                                for seed in range(1, 1 + args.measured_seeds)]) for row in rows]
    finally:
        shell.run_line_magic("dist", "stop")
    return curves, results


def mean_result(results: list[dict]) -> dict:
    """One measured row of several seeds: its curve their mean (epoch ends and accuracy, epoch by epoch, over
    the epochs every seed has), each seed's result kept; the first error if any seed failed."""
    if len(results) == 1:
        return results[0]
    curves = [r["curve"] for r in results]
    length = min(min(len(c["t"]), len(c["val_accuracy"])) for c in curves)
    mean = {key: [sum(c[key][i] for c in curves) / len(curves) for i in range(length)] for key in ("t", "val_accuracy")}
    error = next((r["error"] for r in results if r["error"]), None)
    return {**results[0], "curve": {"epoch": list(range(1, length + 1)), **mean}, "error": error, "seeds": results}


def _compare(plan, predicted, result: dict) -> dict:
    last = predicted.per_epoch[-1] if predicted.per_epoch else None
    measured = last_epoch_s(result)
    curve = result["curve"]
    return {"label": predicted.label, "predicted_s": last, "measured_s": measured,
            "error": abs(last - measured) / measured if last and measured else None,
            "predicted_ttt": plan.time_to_target(predicted),
            "measured_ttt": crossing(curve["t"], curve["val_accuracy"], plan.target),
            "reason": predicted.reason or predicted.refused, "failed": result["error"]}


def _print(args, plan, table: list[dict], suffix: str = "") -> None:
    print(f"\n{args.setup}: {args.workers} workers, {args.samples} samples, batch {args.batch}, step {args.step}, "
          f"{args.epochs} epochs (the last one's time compared); target {plan.target:.4f} (the short local run's "
          "best less a point)\n" if not suffix else f"\n{args.setup}, target {plan.target:.4f}{suffix}:\n")
    print("| strategy | predicted epoch s | measured epoch s (virtual) | error | predicted s to target | "
          "measured s to target | why |\n|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['label']} | {_num(r['predicted_s'])} | {_num(r['measured_s'])} | {_pct(r['error'])} | "
              f"{_num(r['predicted_ttt'])} | {_num(r['measured_ttt'])} | {r['reason']}"
              + (f" [failed: {r['failed']}]" if r["failed"] else "") + " |")
    scored = [r for r in table if r["error"] is not None]
    never = float("inf")
    tau = kendall_tau([r["predicted_ttt"] or never for r in table], [r["measured_ttt"] or never for r in table])
    measured = {r["label"]: r["measured_ttt"] for r in table if r["measured_ttt"] is not None}
    chosen = plan.choice.label
    regret = (measured[chosen] / min(measured.values()) - 1) if chosen in measured else never
    print(f"\nauto's choice: {chosen}; measured soonest: {min(measured, key=measured.get) if measured else '-'}")
    if not suffix:
        print(f"RESULT plan_epoch_time_error_max_{args.setup}={max(r['error'] for r in scored):.3f}")
    print(f"RESULT plan_rank_tau_{args.setup}{suffix}={tau:.3f}")
    both = [abs(r["predicted_ttt"] / r["measured_ttt"] - 1) for r in table if r["predicted_ttt"] and r["measured_ttt"]]
    if both:  # how far the time to target is off where the plan and the measurement both reach it
        print(f"RESULT plan_time_to_target_error_max_{args.setup}{suffix}={max(both):.3f} (of {len(both)} reaching it "
              f"in both; {sum(1 for r in table if bool(r['predicted_ttt']) != bool(r['measured_ttt']))} in one only)")
    print(f"RESULT auto_regret_{args.setup}{suffix}={regret:.3f}")


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    plan_check(sys.argv[1:])
