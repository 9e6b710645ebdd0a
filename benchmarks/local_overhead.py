"""What `--strategy local` costs against plain `model.fit`, measured side by side in one run.

Prints a table, then:
    RESULT local_vs_fit=<nbdist samples/s over plain fit samples/s, steady-state epochs>
    RESULT cell_to_first_step_s=<median seconds from cell start to the first training step, warm engine>

    .venv/bin/python benchmarks/local_overhead.py [--samples 20000 --epochs 4 --rounds 3 --repeats 3]
"""

from __future__ import annotations

import statistics
import time

from common import (SGD_MOMENTUM, TRAIN, against_plain_fit_parser, alternate_with_plain_fit, benchmark_cluster,
                    print_rounds)


def main() -> None:
    parser = against_plain_fit_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="warm runs for the cell-to-first-step time")
    args = parser.parse_args()

    with benchmark_cluster(args.samples, args.epochs) as (ip, session):
        rounds = alternate_with_plain_fit(ip, session, "--strategy local", args.samples, args.epochs, args.rounds)

        first_steps = []
        for _ in range(args.repeats):  # warm engine: only the first-step latency matters here
            t0 = time.time()
            ip.run_cell_magic("distribute", "--strategy local", TRAIN.format(epochs=1, optimizer=SGD_MOMENTUM).replace(
                "epochs=1", "epochs=1, steps_per_epoch=5"))
            first_steps.append(session.last_run.fits[0].timings["first_step"] - t0)

    ratio = print_rounds("nbdist local", rounds, extra_rows=[
        ["cell start -> first step, s (median of warm runs)", f"{statistics.median(first_steps):.2f}", "-", "-"]])
    print(f"first-step times of warm runs: {', '.join(f'{s:.2f}' for s in first_steps)}")
    print(f"RESULT local_vs_fit={ratio:.3f}")
    print(f"RESULT cell_to_first_step_s={statistics.median(first_steps):.2f}")


if __name__ == "__main__":
    main()
