"""`--strategy pipeline` against `local` on the same engines: bubble, per-stage memory, throughput.

One MLP on Fashion-MNIST whose two halves cost the same (the theory assumes equal stages), K = 2
stages, M in {1, 2, 4, 8} micro-batches (1F1B): each stage's measured idle fraction (1 - busy / step
time) against the theory (K-1)/(M+K-1); each stage's variable + optimizer-slot bytes against a local
run's; samples/s against `local` (2 cores cannot show a speed-up: this records the cost). Then the
step time against `local` at batch 256 and 64 (M = 4). Then a model with over 1 GB of variables
trained for a few steps, K = 2, on fresh engines: each engine's peak resident memory against a local
run's.

    .venv/bin/python benchmarks/pipeline.py [--samples 8192 --batch 1024 --epochs 3 --big-steps 3]

Ends with:
    RESULT pipeline_bubble_excess=<measured minus theory, at M=8>
    RESULT pipeline_stage_memory_ratio=<largest stage's variable + slot bytes / local's>
    RESULT pipeline_step_ratio=<pipeline step time / local's, batch 256, M = 4>
    RESULT pipeline_step_ratio_b64=<the same at batch 64>
    RESULT pipeline_big_peak_rss_ratio=<largest stage engine's peak RSS / the local engine's, 1 GB model>
"""

from __future__ import annotations

import argparse
import statistics
import textwrap

from common import big_model_peaks, notebook_shell, print_table

DEFINITION = textwrap.dedent('''
    import keras, numpy as np
    from nbdist.datasets import fashion_mnist
    (x, y), _ = fashion_mnist(limit={samples})
    x = x.reshape(len(x), -1).astype("float32") / 255
    def build():  # two halves of equal cost: 784x1024 + 1024x1024 | 1024x1024 + 1024x784 + 784x10
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(784, activation="relu"), keras.layers.Dense(10, activation="softmax")])
''')
CELL = textwrap.dedent('''
    model = build()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size={batch}, epochs={epochs}, shuffle=False, verbose=0)
''')
def variable_bytes(model) -> int:
    return sum(int(v.numpy().nbytes) for v in list(model.weights) + list(model.optimizer.variables))


def steady_rate(run) -> float:
    """Samples/s of the last stage's (or the worker's) records after the first epoch."""
    records = [r for r in run.fits[0].records if r["samples_per_s"] and r["epoch"] and r["epoch"] >= 1]
    return statistics.median(r["samples_per_s"] for r in records) if records else float("nan")


def bubble_rows(ip, session, args) -> tuple[list, float, float]:
    ip.run_cell_magic("distribute", "--strategy local --targets 0 --progress none", CELL.format(
        batch=args.batch, epochs=args.epochs))
    local_rate, local_bytes = steady_rate(session.last_run), variable_bytes(ip.user_ns["model"])
    rows, excess, memory = [], None, None
    for micro in (1, 2, 4, 8):
        ip.run_cell_magic("distribute", f"--strategy pipeline --targets 0,1 --microbatches {micro} --progress none",
                          CELL.format(batch=args.batch, epochs=args.epochs))
        stages = session.last_run.fits[0].parts["stages"]
        measured = statistics.mean(1 - s["busy_s"] / s["step_s"] for s in stages)
        theory = (2 - 1) / (micro + 2 - 1)
        memory = max(s["variable_bytes"] for s in stages) / local_bytes
        rate = steady_rate(session.last_run)
        rows.append([f"M={micro}", f"{measured:.3f}", f"{theory:.3f}", f"{measured - theory:+.3f}",
                     " / ".join(f"{s['variable_bytes'] / 1e6:.1f}" for s in stages), f"{local_bytes / 1e6:.1f}",
                     f"{rate:,.0f}", f"{local_rate:,.0f}"])
        excess = measured - theory
    return rows, excess, memory


def step_ratios(ip, session, args) -> tuple[list, dict]:
    """Pipeline (K = 2, M = 4, 1F1B) against local on the same engines, at batch 256 and 64: the steady step
    time's ratio (local samples/s over pipeline samples/s)."""
    rows, ratios = [], {}
    for batch in (256, 64):
        cell = CELL.format(batch=batch, epochs=args.epochs)
        ip.run_cell_magic("distribute", "--strategy local --targets 0 --progress none", cell)
        local_rate = steady_rate(session.last_run)
        ip.run_cell_magic("distribute", "--strategy pipeline --targets 0,1 --microbatches 4 --progress none", cell)
        rate = steady_rate(session.last_run)
        ratios[batch] = local_rate / rate
        rows.append([batch, f"{1000 * batch / local_rate:.2f}", f"{1000 * batch / rate:.2f}", f"{ratios[batch]:.3f}"])
    return rows, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--big-steps", type=int, default=3)
    parser.add_argument("--parts", default="bubble,steps,big", help="which measurements, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results = {}
    ip, session = notebook_shell()
    ip.run_line_magic("dist", "start -n 2")
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
        if "bubble" in parts:
            rows, results["pipeline_bubble_excess"], results["pipeline_stage_memory_ratio"] = bubble_rows(
                ip, session, args)
            print(f"\nK=2, 1F1B, batch {args.batch}, {args.samples} samples, {args.epochs} epochs (Adam)")
            print_table(["micro-batches", "bubble measured", "theory", "excess", "stage MB (vars+slots)", "local MB",
                         "pipeline samples/s", "local samples/s"], rows)
        if "steps" in parts:
            step_rows, ratios = step_ratios(ip, session, args)
            results["pipeline_step_ratio"], results["pipeline_step_ratio_b64"] = ratios[256], ratios[64]
            print(f"\nK=2, M=4, 1F1B against local on engine 0 ({args.samples} samples, {args.epochs} epochs, Adam)")
            print_table(["batch", "local step ms", "pipeline step ms", "ratio"], step_rows)
        if "big" in parts:
            big_rows, results["pipeline_big_peak_rss_ratio"] = big_model_peaks(
                ip, session, "--strategy pipeline --microbatches 1", args.big_steps,  # (M > 1: one more gradient copy)
                lambda run, eid: run.fits[0].parts["stages"][eid]["variable_bytes"])
            print(f"\n1.07 GB model (4 x Dense 8192x8192, SGD), K=2, M=1, {args.big_steps} steps of batch 8, fresh "
                  "engines")
            print_table(["engine", "RSS before MB", "peak RSS MB", "variables held MB", "cell s"], big_rows)
    finally:
        ip.run_line_magic("dist", "stop")
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}")


if __name__ == "__main__":
    main()
