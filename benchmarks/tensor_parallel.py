"""What `tensor` saves per engine, and what it costs per step, against local and pipeline on the same model.

One cell, one model: an MLP 784 -> 1024 -> 1024 -> 10 on Fashion-MNIST, whose two large Dense
layers hold 99% of the parameters, SGD with momentum (one slot per variable), batch 64. Per round,
in this order, on a 2-engine cluster: `--strategy local` (one engine), `--strategy tensor` (2
engines, the pair split column then row), `--strategy pipeline --stages 2`. Memory: the bytes of
the variables and optimizer slots the engine trains with (tensor: its share, from the run's plan;
local: the whole model's). Step time: rank 0's median epoch after the first, per step.
Then (`--parts big`) a model with over 1 GB of variables (4 x Dense 8192x8192, SGD) trained for a few
steps on fresh engines: each tensor engine's peak resident memory against a local engine's.
Prints the tables, then:
    RESULT tensor_memory_ratio=<largest engine's bytes under tensor / local's>
    RESULT tensor_step_ratio=<tensor's step time / local's>
    RESULT pipeline_step_ratio=<pipeline's step time / local's>
    RESULT tensor_big_peak_rss_ratio=<larger tensor engine's peak RSS / the local engine's, 1 GB model>

    .venv/bin/python benchmarks/tensor_parallel.py [--samples 12000 --epochs 3 --rounds 2 --parts steps,big]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap

from common import EPOCH_TIMER, big_model_peaks, notebook_shell, print_table

DEFINITION = textwrap.dedent('''
    import time, keras
    import numpy as np
    from nbdist.datasets import fashion_mnist
    (x, y), _ = fashion_mnist(limit={samples})
    x = x.reshape(len(x), -1).astype("float32") / 255
''') + EPOCH_TIMER + textwrap.dedent('''
    def wide():
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu", name="wide_1"),
                                 keras.layers.Dense(1024, activation="relu", name="wide_2"),
                                 keras.layers.Dense(10, activation="softmax", name="head")])
''')
TRAIN = textwrap.dedent('''
    model = wide()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    timer = EpochTimer()
    history = model.fit(x, y, batch_size=64, epochs={epochs}, callbacks=[timer], verbose=0)
''')
LINES = {"local": "--strategy local --seed 1", "tensor": "--strategy tensor --workers 2 --seed 1",
         "pipeline": "--strategy pipeline --stages 2 --seed 1"}


def one_round(ip, session, samples: int, epochs: int) -> dict:
    """Each strategy once: its step time (s) and, for local and tensor, its per-engine bytes."""
    from nbdist.model_parts.tensor_parallel.model import engine_bytes

    out = {}
    for name, line in LINES.items():
        ip.run_cell_magic("distribute", line + " --progress none", TRAIN.format(epochs=epochs))
        run = session.last_run
        stage = run.workers[-1] if name == "pipeline" else run.workers[0]  # pipeline: the last stage's timer
        seconds = session.cluster.client[stage].pull("timer.seconds", block=True)
        steps = -(-samples // 64)
        out[name] = {"step_s": statistics.median(seconds[1:] or seconds) / steps}
        if name == "local":
            out[name]["bytes"] = engine_bytes(ip.user_ns["model"])["total"]
        elif name == "tensor":
            out[name]["bytes"] = max(part["total"] for part in run.plan["engine_bytes"])
            out[name]["plan"] = run.plan["text"]
    return out


def steps(ip, session, args) -> dict:
    """The memory and step-time rounds; prints their tables."""
    rounds = [one_round(ip, session, args.samples, args.epochs) for _ in range(args.rounds)]
    print(rounds[-1]["tensor"]["plan"])
    memory = rounds[-1]["tensor"]["bytes"] / rounds[-1]["local"]["bytes"]
    print_table(["measure", "local (1 engine)", "tensor (2 engines)", "ratio"],
                [["variables + optimizer slots per engine, MB", f"{rounds[-1]['local']['bytes'] / 1e6:.2f}",
                  f"{rounds[-1]['tensor']['bytes'] / 1e6:.2f}", f"{memory:.3f}"]])
    step = {name: statistics.median(r[name]["step_s"] for r in rounds) for name in LINES}
    print_table(["strategy", "step ms (median epoch 2+, median round)", "against local"],
                [[name, f"{step[name] * 1e3:.2f}", f"{step[name] / step['local']:.2f}"] for name in LINES])
    return {"tensor_memory_ratio": memory, "tensor_step_ratio": step["tensor"] / step["local"],
            "pipeline_step_ratio": step["pipeline"] / step["local"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--big-steps", type=int, default=3)
    parser.add_argument("--parts", default="steps,big", help="which measurements, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results = {}
    ip, session = notebook_shell()
    ip.run_line_magic("dist", "start -n 2")
    try:
        if "steps" in parts:
            ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
            results.update(steps(ip, session, args))
        if "big" in parts:
            rows, results["tensor_big_peak_rss_ratio"] = big_model_peaks(
                ip, session, "--strategy tensor", args.big_steps,
                lambda run, eid: run.plan["engine_bytes"][eid]["total"])
            print(f"\n1.07 GB model (4 x Dense 8192x8192, SGD), N=2, {args.big_steps} steps of batch 8, fresh engines")
            print_table(["engine", "RSS before MB", "peak RSS MB", "variables held MB", "cell s"], rows)
    finally:
        ip.run_line_magic("dist", "stop")
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
