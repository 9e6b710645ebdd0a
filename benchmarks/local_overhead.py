"""What `--strategy local` costs against plain `model.fit`, measured side by side in one run.

Prints a table, then:
    RESULT local_vs_fit=<nbdist samples/s over plain fit samples/s, steady-state epochs>
    RESULT cell_to_first_step_s=<median seconds from cell start to the first training step, warm engine>

    .venv/bin/python benchmarks/local_overhead.py [--samples 20000 --epochs 4 --rounds 3 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time

from common import DEFINITION, notebook_shell, print_table, steady_samples_per_s

TRAIN = textwrap.dedent('''
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    timer = EpochTimer()
    history = model.fit(x, y, batch_size=64, epochs={epochs}, callbacks=[timer], verbose=0)
''')


def plain_fit(samples: int, epochs: int) -> dict:
    """Plain Keras in a fresh Python process, as an engine is one."""
    script = DEFINITION.format(samples=samples) + "\n_t0 = time.perf_counter()\n" + TRAIN.format(epochs=epochs) + (
        "\nimport json; print('@@' + json.dumps({'epochs': timer.seconds, 'wall': time.perf_counter() - _t0}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith("@@")][-1][2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating nbdist / plain rounds (this machine is noisy: the ratio is their median)")
    parser.add_argument("--repeats", type=int, default=3, help="warm runs for the cell-to-first-step time")
    args = parser.parse_args()

    ip, session = notebook_shell()
    print(f"Starting a 1-engine cluster; {args.samples} Fashion-MNIST samples, {args.epochs} epochs, batch 64")
    ip.run_line_magic("dist", "start -n 1")
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
        cell = TRAIN.format(epochs=args.epochs)
        rounds = []
        for _ in range(args.rounds):  # alternate so drift in machine speed hits both sides alike
            t0 = time.time()
            ip.run_cell_magic("distribute", "--strategy local", cell)
            wall = time.time() - t0
            epochs = session.cluster.client[session.last_run.workers[0]].pull("timer.seconds", block=True)
            plain = plain_fit(args.samples, args.epochs)
            rounds.append({"nbdist": steady_samples_per_s(epochs, args.samples), "nbdist_wall": wall,
                           "plain": steady_samples_per_s(plain["epochs"], args.samples), "plain_wall": plain["wall"]})

        first_steps = []
        for _ in range(args.repeats):  # warm engine: only the first-step latency matters here
            t0 = time.time()
            ip.run_cell_magic("distribute", "--strategy local", TRAIN.format(epochs=1).replace(
                "epochs=1", "epochs=1, steps_per_epoch=5"))
            first_steps.append(session.last_run.fits[0].timings["first_step"] - t0)
    finally:
        ip.run_line_magic("dist", "stop")

    def median(key):
        return statistics.median(r[key] for r in rounds)

    ratio = statistics.median(r["nbdist"] / r["plain"] for r in rounds)
    print()
    print_table(["measure", "nbdist local", "plain fit", "ratio"], [
        ["samples/s (median epoch 2+), median round", f"{median('nbdist'):,.0f}", f"{median('plain'):,.0f}",
         f"{ratio:.3f}"],
        ["wall time of the training cell, s, median", f"{median('nbdist_wall'):.2f}", f"{median('plain_wall'):.2f}",
         f"{median('plain_wall') / median('nbdist_wall'):.3f}"],
        ["cell start -> first step, s (median of warm runs)", f"{statistics.median(first_steps):.2f}", "-", "-"],
    ])
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: nbdist {r['nbdist']:,.0f} samples/s, plain {r['plain']:,.0f} samples/s, "
              f"ratio {r['nbdist'] / r['plain']:.3f}")
    print(f"first-step times of warm runs: {', '.join(f'{s:.2f}' for s in first_steps)}")
    print(f"RESULT local_vs_fit={ratio:.3f}")
    print(f"RESULT cell_to_first_step_s={statistics.median(first_steps):.2f}")


if __name__ == "__main__":
    main()
