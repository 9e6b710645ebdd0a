"""The planner on the real clock: `--strategy auto --plan-only` on this machine's engines, then local, hfdt and
nfdt run for real, their measured epoch times beside the plan's predictions, in one run.

The plan measures each engine's step on the cell's model (the profile run); links are not measured on a
local cluster (loopback, taken as free) and the PS's cost per message is the 1 ms of docs/benchmarks.md.
Measured: the median epoch after the first, on rank 0 (the EpochTimer callback), over `--rounds` runs of each.
Prints the table, then:
    RESULT plan_real_error_<strategy>=<|predicted - measured| / measured>
    RESULT plan_real_epoch_error_max=<the worst of the three>

    .venv/bin/python benchmarks/plan_real_clock.py [--samples 8000 --epochs 3 --rounds 2 --engines 2]
"""

from __future__ import annotations

import argparse
import statistics

from common import SGD_MOMENTUM, TRAIN, benchmark_cluster, print_table

STRATEGIES = ("local", "hfdt", "nfdt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", type=int, default=2)
    args = parser.parse_args()
    cell = TRAIN.format(epochs=args.epochs, optimizer=SGD_MOMENTUM)
    measured: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    with benchmark_cluster(args.samples, args.epochs, engines=args.engines) as (ip, session):
        ip.run_cell_magic("distribute", "--strategy auto --plan-only --progress none", cell)
        plan = session.last_plan
        for _ in range(args.rounds):  # alternating, so drift in the machine's speed hits all alike
            for strategy in STRATEGIES:
                ip.run_cell_magic("distribute", f"--strategy {strategy} --progress none", cell)
                run = session.last_run
                seconds = session.cluster.client[run.workers[0]].pull("timer.seconds", block=True)
                measured[strategy].append(statistics.median(seconds[1:] or seconds))
    predicted = {p.strategy: p.epoch_s for p in plan.predictions if not p.options}
    errors = {s: abs(predicted[s] - statistics.median(measured[s])) / statistics.median(measured[s])
              for s in STRATEGIES}
    print()
    print_table(["strategy", "predicted epoch s", "measured epoch s (median)", "rounds", "error"],
                [[s, f"{predicted[s]:.3f}", f"{statistics.median(measured[s]):.3f}",
                  ", ".join(f"{m:.3f}" for m in measured[s]), f"{errors[s]:.1%}"] for s in STRATEGIES])
    print()
    print(plan.table())
    for s in STRATEGIES:
        print(f"RESULT plan_real_error_{s}={errors[s]:.3f}")
    print(f"RESULT plan_real_epoch_error_max={max(errors.values()):.3f}")


if __name__ == "__main__":
    main()
