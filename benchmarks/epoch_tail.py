"""The tail of an epoch (issue 34): how long fewer than half the workers train, with static shards against batches
on demand, side by side on the virtual clock (S3 of docs/results.md: 4 workers at speeds 1, 1, 0.2, 0.1).

Each run trains `ddc-asgd` for one epoch. From the shard's push records (virtual times): a worker trains from the
epoch's start to its last push of the epoch; the tail is the share of the epoch's virtual time during which fewer
than half of the workers still train. With equal static shards the two slow workers train alone after the fast
ones finished theirs; with batches on demand every worker ends within one step of the others. Prints a table,
then:
    RESULT epoch_tail_fraction_static=<share of the epoch>
    RESULT epoch_tail_fraction=<share of the epoch, batches on demand>

    .venv/bin/python benchmarks/epoch_tail.py [--samples 60000]
"""

from __future__ import annotations

import argparse

from common import notebook_shell, print_table
from nbdist.experiments.cells import DATA, MODELS, SETUPS, TRAIN


def tail_fraction(records: list[dict], workers: int, start: float) -> tuple[float, float]:
    """(the tail's share of the epoch, the epoch's virtual seconds) from one epoch's push records; `start`: when
    the epoch began (the run's start: its virtual clock counts from there)."""
    ends = sorted(max(r["t"] for r in records if r["worker"] == k) for k in range(workers))
    span = ends[-1] - start
    tail_starts = ends[workers - -(-workers // 2)]  # from then on fewer than half the workers still train
    return (ends[-1] - tail_starts) / span, span


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--step", default="1ms+20us/sample", help="the virtual clock's step cost")
    args = parser.parse_args()
    setup = SETUPS["S3"]
    workers = len(setup["simulate"].split("=")[1].split(","))
    ip, session = notebook_shell()
    print(f"Starting {workers} engines; S3 ({setup['simulate']}), {args.samples} samples, one epoch of ddc-asgd")
    ip.run_line_magic("dist", f"start -n {workers}")
    rows, results = [], {}
    try:
        ip.run_cell_magic("distribute", "define", DATA.format(samples=args.samples) + MODELS["mlp"].format(hidden=128))
        for data in ("static", "dynamic"):
            line = (f"--strategy ddc-asgd --workers {workers} --seed 1 --data {data} --progress none "
                    f"--simulate \"{setup['simulate']}; clock=virtual; step={args.step}\"")
            ip.run_cell_magic("distribute", line,
                              TRAIN.format(lr=setup["lr"], momentum=0.9, batch=64, epochs=1))
            records = session.last_run.push_records
            fraction, span = tail_fraction(records, workers, session.last_run.started_at)
            per_worker = [sum(1 for r in records if r["worker"] == k) for k in range(workers)]
            results[data] = fraction
            rows.append([data, f"{span:.3f}", f"{fraction:.3f}", " / ".join(map(str, per_worker))])
    finally:
        ip.run_line_magic("dist", "stop")
    print()
    print_table(["data", "epoch, virtual s", "tail: < half the workers train", "batches per worker"], rows)
    print(f"RESULT epoch_tail_fraction_static={results['static']:.3f}")
    print(f"RESULT epoch_tail_fraction={results['dynamic']:.3f}")


if __name__ == "__main__":
    main()
