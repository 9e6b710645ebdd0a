"""Reproducible comparisons of strategies on the same engines and data: ``python -m nbdist.experiments``.

    python -m nbdist.experiments compare --dataset fashion-mnist --workers 8 \\
        --strategies local,ssgd,asgd,asgd:momentum=0,dc-asgd-a,dc-asgdk,ddc-asgd \\
        --epochs 4 --seeds 3 --simulate "speed=1,1,1,1,0.5,0.5,0.25,0.25"

Each row trains the same cell (a small Keras model, SGD with the given learning rate and
momentum) through ``%%distribute`` on one cluster started for the whole comparison, then
evaluates the returned model on the full test set in this process. Writes a markdown
table (final test accuracy mean +- std, wall time, staleness, dropped pushes), a JSON of
every run and a plotly HTML of accuracy against epoch and against time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import OptionError, RunInterrupted
from .strategies import option_line

QUICK = {"workers": 4, "samples": 8000, "epochs": 2, "seeds": 1, "simulate": "speed=1,1,0.5,0.25"}
DEFAULT_STRATEGIES = "local,ssgd,asgd,asgd:momentum=0,dc-asgd-a,dc-asgdk,ddc-asgd"

DATA = '''
import keras
from nbdist.datasets import fashion_mnist
(x, y), (x_test, y_test) = fashion_mnist(limit={samples})
x, x_test = x.astype("float32") / 255, x_test.astype("float32") / 255
'''
# mlp: 0.4 MB of weights and ~1 ms of compute per step on a CPU (communication-bound);
# cnn: 0.1 MB and tens of ms per step (compute-bound), where unequal compute speeds matter most
MODELS = {
    "mlp": '''
def build():
    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                             keras.layers.Dense({hidden}, activation="relu"), keras.layers.Dense(10, activation="softmax")])
''',
    "cnn": '''
def build():
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                             keras.layers.Dense(10, activation="softmax")])
''',
}

TRAIN = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD({lr}, momentum={momentum}),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size={batch}, epochs={epochs}, validation_data=(x_test, y_test), verbose=0)
'''


@dataclass
class Row:
    """One strategy variant: its label as given, the strategy and its options."""

    label: str
    strategy: str
    options: dict = field(default_factory=dict)


def parse_rows(text: str) -> list[Row]:
    """``asgd:momentum=0,ddc-asgd:p=2`` -> rows; options use the `%%distribute` names (dashes or underscores)."""
    from .strategies import REGISTRY, STRATEGY_OPTIONS

    rows = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, extras = item.partition(":")
        if name not in REGISTRY:
            raise OptionError(f"unknown strategy {name!r} in --strategies; choose from {', '.join(sorted(REGISTRY))}")
        options = {}
        for pair in filter(None, extras.split(":")):
            key, _, value = pair.partition("=")
            key = key.strip().lstrip("-").replace("-", "_")
            if key not in STRATEGY_OPTIONS or key not in REGISTRY[name].options:
                raise OptionError(f"{name} has no option {key!r} (in {item!r}); it reads: "
                                  f"{', '.join(REGISTRY[name].options) or 'none'}")
            cast = dict(STRATEGY_OPTIONS[key].kwargs).get("type", str)
            options[key] = cast(value)
        rows.append(Row(item, name, options))
    return rows


def notebook_shell():
    """An IPython shell with nbdist loaded, as a notebook kernel has; returns (shell, session)."""
    from IPython.core.interactiveshell import InteractiveShell

    from . import get_session

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdist")
    return shell, get_session(shell)


def run_one(shell, session, row: Row, args, seed: int) -> dict:
    """Train one row with one seed; returns what the table and the plots need."""
    options = {"strategy": row.strategy, "seed": seed, **row.options}
    options["workers"] = 1 if row.strategy == "local" else args.workers
    if args.simulate and row.strategy != "local":
        options["simulate"] = args.simulate
    line = option_line(options)
    cell = TRAIN.format(lr=args.lr, momentum=args.momentum, batch=args.batch, epochs=args.epochs)
    started = time.time()
    error = None
    try:
        shell.run_cell_magic("distribute", line, cell)
        run = session.last_run
        accuracy = float(shell.user_ns["model"].evaluate(shell.user_ns["x_test"], shell.user_ns["y_test"],
                                                         verbose=0)[1])
    except RunInterrupted:  # Ctrl-C (SIGINT) ends the comparison; compare's `finally` stops the cluster
        raise
    except Exception as exc:  # a diverging rule is a result, not a crash of the comparison
        run, accuracy, error = session.last_run, float("nan"), f"{type(exc).__name__}: {exc}"
    pushes = run.push_records if run is not None else []
    applied = [p["staleness"] for p in pushes if p["applied"]]
    return {
        "label": row.label, "strategy": row.strategy, "seed": seed, "line": line, "accuracy": accuracy,
        "wall_s": (run.duration_s if run else time.time() - started) or 0.0,
        "staleness_mean": statistics.mean(applied) if applied else 0.0,
        "staleness_max": max(applied) if applied else 0,
        "dropped": sum(1 for p in pushes if p["dropped"]),
        "bytes_sent": _bytes_sent(run, shell.user_ns.get("model")),
        "curve": {"epoch": list(range(1, len(run.history.get("val_accuracy", [])) + 1)) if run else [],
                  "val_accuracy": list(run.history.get("val_accuracy", [])) if run else [],
                  "t": _epoch_times(run, started)},
        "error": error,
    }


def _bytes_sent(run, model) -> float | None:
    """Bytes the workers sent: measured at the PS client; for hfdt, what a ring allreduce sends
    (2(N-1)/N of the gradient per rank and step), counted from the steps made."""
    if run is None or not run.fits:
        return None
    last = {}
    for fit in run.fits:
        for r in fit.records:
            last[r["worker"]] = r
    measured = [r.get("bytes_sent") for r in last.values()]
    if all(b is not None for b in measured) and measured:
        return float(sum(measured))
    if run.strategy == "hfdt" and model is not None:
        n = len(run.workers)
        return float(sum(r["step"] for r in last.values()) * 2 * (n - 1) / n * 4 * model.count_params())
    return None


def time_to_target(result: dict, target: float) -> float | None:
    """Seconds from the run's start to the first epoch end whose validation accuracy reached `target`."""
    curve = result["curve"]
    for t, accuracy in zip(curve["t"], curve["val_accuracy"]):
        if accuracy >= target:
            return t
    return None


def _epoch_times(run, started: float) -> list[float]:
    """Seconds from the run's start to each of the History worker's epoch ends (its last record of each epoch)."""
    if run is None or not run.fits:
        return []
    last_of_epoch = {r["epoch"]: r["t"] for r in run.fits[-1].records}
    return [round(last_of_epoch[e] - (run.started_at or started), 3) for e in sorted(last_of_epoch)]


def summarise(results: list[dict], target: float | None = None) -> list[dict]:
    """Mean +- std over seeds for each row, in the order rows were given."""
    labels = list(dict.fromkeys(r["label"] for r in results))
    summary = []
    for label in labels:
        runs = [r for r in results if r["label"] == label]
        accs = [r["accuracy"] for r in runs]
        times = [t for t in (time_to_target(r, target) for r in runs) if t is not None] if target else []
        sent = [r["bytes_sent"] for r in runs if r.get("bytes_sent") is not None]
        summary.append({
            "time_to_target": statistics.mean(times) if times else None,
            "time_to_target_std": statistics.stdev(times) if len(times) > 1 else 0.0,
            "reached": len(times), "bytes_sent": statistics.mean(sent) if sent else None,
            "label": label, "runs": len(runs), "accuracy_mean": statistics.mean(accs),
            "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "wall_s": statistics.mean(r["wall_s"] for r in runs),
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in runs),
            "staleness_max": max(r["staleness_max"] for r in runs),
            "dropped": statistics.mean(r["dropped"] for r in runs),
            "failed": sum(1 for r in runs if r["error"]),
        })
    return summary


def markdown(summary: list[dict], command: str, args) -> str:
    target = args.target_accuracy
    lines = [f"Command: `{command}`", "",
             f"{args.workers} workers; Fashion-MNIST, {args.samples or 60000} training samples, 10,000 test; "
             f"{_model_text(args)}; SGD lr {args.lr}, momentum {args.momentum}; batch {args.batch} per worker; "
             f"{args.epochs} epochs; seeds {args.seeds}; simulate: {args.simulate or 'none'}.", "",
             "| strategy | final test accuracy | wall s | " + (f"s to {target} (reached) | " if target else "")
             + "MB sent | staleness mean | staleness max | dropped pushes |",
             "|---|---|---|" + ("---|" if target else "") + "---|---|---|---|"]
    for s in summary:
        failed = f" ({s['failed']} failed)" if s["failed"] else ""
        reach = ""
        if target:
            reach = (f"{s['time_to_target']:.1f} +- {s['time_to_target_std']:.1f} ({s['reached']}/{s['runs']}) | "
                     if s["time_to_target"] is not None else f"never (0/{s['runs']}) | ")
        sent = f"{s['bytes_sent'] / 1e6:.1f}" if s["bytes_sent"] is not None else "-"
        lines.append(f"| {s['label']} | {s['accuracy_mean']:.4f} +- {s['accuracy_std']:.4f}{failed} | "
                     f"{s['wall_s']:.1f} | {reach}{sent} | {s['staleness_mean']:.2f} | {s['staleness_max']} | "
                     f"{s['dropped']:.0f} |")
    return "\n".join(lines) + "\n"


def result_lines(summary: list[dict], base: str = "ashl") -> list[str]:
    """`RESULT ashl_vs_<row>_time=<ratio>`: the base row's mean time to the target over each other row's."""
    rows = {s["label"]: s for s in summary}
    if base not in rows:
        return []
    mine = rows[base]["time_to_target"]
    lines = []
    for label, row in rows.items():
        if label == base or row["time_to_target"] is None and mine is None:
            continue
        theirs = row["time_to_target"]
        ratio = "nan" if mine is None else "0" if theirs is None else f"{mine / theirs:.3f}"
        lines.append(f"RESULT {base}_vs_{label.replace(':', '_').replace('=', '')}_time={ratio}")
    return lines


def _model_text(args) -> str:
    return f"MLP 784-{args.hidden}-10" if args.model == "mlp" else "CNN conv16-pool-conv32-pool-dense10"


def write_html(results: list[dict], path: Path) -> None:
    """Accuracy (rank 0's validation on its test shard) against epoch and against seconds, one line per run."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=("accuracy by epoch", "accuracy by time (s)"))
    for r in results:
        name = f"{r['label']} (seed {r['seed']})"
        curve = r["curve"]
        figure.add_trace(go.Scatter(x=curve["epoch"], y=curve["val_accuracy"], name=name, legendgroup=name),
                         row=1, col=1)
        figure.add_trace(go.Scatter(x=curve["t"], y=curve["val_accuracy"][:len(curve["t"])], name=name,
                                    legendgroup=name, showlegend=False), row=1, col=2)
    figure.update_layout(title="nbdist strategy comparison", height=480)
    figure.write_html(str(path), include_plotlyjs="cdn")


def compare(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m nbdist.experiments compare", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist"])
    parser.add_argument("--workers", type=int)
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--samples", type=int, help="training samples (default: all 60,000)")
    parser.add_argument("--simulate", help="as %%%%distribute --simulate, for every multi-worker row")
    parser.add_argument("--target-accuracy", type=float,
                        help="report each row's time to this validation accuracy, and ASHL's ratios to the others")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--hidden", type=int, default=128, help="the MLP's hidden units")
    parser.add_argument("--out", default="build/experiments", help="folder for results.md, results.json, curves.html")
    parser.add_argument("--quick", action="store_true", help=f"small preset (<10 min on 2 cores): {QUICK}")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else {"workers": 8, "samples": None, "epochs": 4, "seeds": 3, "simulate": None}
    if args.workers is None and args.simulate:  # one simulated profile per worker
        args.workers = max(len(part.split(",")) for part in args.simulate.split(";"))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    rows = parse_rows(args.strategies)
    command = "python -m nbdist.experiments compare " + " ".join(_quote(a) for a in (argv or sys.argv[2:]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    shell, session = notebook_shell()
    print(f"Starting {args.workers} engines for {len(rows)} strategies x {args.seeds} seeds", flush=True)
    shell.run_line_magic("dist", f"start -n {args.workers}")
    results = []
    try:
        shell.run_cell_magic("distribute", "define --name experiment-data",
                             DATA.format(samples=args.samples) + MODELS[args.model].format(hidden=args.hidden))
        for seed in range(args.seeds):
            for row in rows:
                result = run_one(shell, session, row, args, seed)
                results.append(result)
                reached = time_to_target(result, args.target_accuracy) if args.target_accuracy else None
                print(f"  seed {seed} {row.label}: accuracy {result['accuracy']:.4f}, {result['wall_s']:.1f} s, "
                      f"staleness mean {result['staleness_mean']:.2f}"
                      + (f", {args.target_accuracy} at {reached:.1f} s" if reached is not None else "")
                      + (f" [{result['error']}]" if result["error"] else ""), flush=True)
    finally:
        shell.run_line_magic("dist", "stop")
    summary = summarise(results, args.target_accuracy)
    table = markdown(summary, command, args)
    results_line = result_lines(summary) if args.target_accuracy else []
    (out / "results.md").write_text(table + "".join(f"\n{line}" for line in results_line) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    write_html(results, out / "curves.html")
    print()
    print(table)
    print(f"Wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'curves.html'}")
    for line in results_line:  # the headline figures end the output
        print(line)
    return summary


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(c in arg for c in " ;") else arg


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "compare":
        print("usage: python -m nbdist.experiments compare [--quick] [options]; see compare --help", file=sys.stderr)
        raise SystemExit(2)
    compare(argv[1:])


if __name__ == "__main__":
    main()
