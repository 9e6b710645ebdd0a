"""Training speed with the live dashboard against without it, side by side in one real kernel.

The same NFDT cell on 2 engines, alternating `--progress dashboard` (widgets updated twice
a second, the PS push log polled, the cell awaited so widget events are handled) and
`--progress none`. Prints a table, then:
    RESULT dashboard_overhead_ratio=<samples/s with the dashboard over samples/s without>

    .venv/bin/python benchmarks/dashboard_overhead.py [--samples 20000 --epochs 4 --rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import DEFINITION, SGD_MOMENTUM, TRAIN, print_table  # noqa: E402
from tests.kernel_driver import KernelDriver  # noqa: E402  (a real kernel, as a notebook has)

# rank 0's median epoch time after the first (which includes tracing), read from its engine
RATE = ("__import__('statistics').median(nbdist.get_session().cluster.client[nbdist.last_run.workers[0]]"
        ".pull('timer.seconds', block=True)[1:])")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kernel = KernelDriver()
    rounds = []
    try:
        kernel.run("%load_ext nbdist\nimport nbdist\n%dist start -n 2", timeout=180).check()
        kernel.run("%%distribute define\n" + DEFINITION.format(samples=args.samples), timeout=300).check()
        cell = TRAIN.format(epochs=args.epochs, optimizer=SGD_MOMENTUM)
        for _ in range(args.rounds):
            result = {}
            for display in ("dashboard", "none"):
                kernel.run(f"%%distribute --strategy nfdt --workers 2 --progress {display}\n" + cell,
                           timeout=900).check()
                epoch_s = kernel.value(RATE)
                result[display] = args.samples / epoch_s  # both workers together: each does half an epoch
            rounds.append(result)
    finally:
        try:
            kernel.run("%dist stop", timeout=120)
        finally:
            kernel.stop()
    ratio = statistics.median(r["dashboard"] / r["none"] for r in rounds)
    print()
    print_table(["measure", "with dashboard", "without", "ratio"], [
        ["samples/s, 2 NFDT workers (median epoch 2+), median round",
         f"{statistics.median(r['dashboard'] for r in rounds):,.0f}",
         f"{statistics.median(r['none'] for r in rounds):,.0f}", f"{ratio:.3f}"]])
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: with {r['dashboard']:,.0f} samples/s, without {r['none']:,.0f}, "
              f"ratio {r['dashboard'] / r['none']:.3f}")
    print(f"RESULT dashboard_overhead_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
