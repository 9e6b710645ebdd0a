"""A comparison's results as tables: mean +- std per row, markdown, the headline `RESULT` lines, curves."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .grid import time_to_target

ACCURACY_BASELINES = ("adsp", "ssgd", "hfdt")  # ASHL's final accuracy is measured against the best of these


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and standard deviation over the finite values (a diverged run counts as failed, not as NaN)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return float("nan"), 0.0
    return statistics.mean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def summarise(results: list[dict], target: float | None = None) -> list[dict]:
    """Mean +- std over seeds for each row, in the order rows were given."""
    labels = list(dict.fromkeys(r["label"] for r in results))
    summary = []
    for label in labels:
        runs = [r for r in results if r["label"] == label]
        accuracy, accuracy_std = _mean_std([r["accuracy"] for r in runs])
        times = [t for t in (time_to_target(r, target) for r in runs) if t is not None] if target else []
        sent = [r["bytes_sent"] for r in runs if r.get("bytes_sent") is not None]
        summary.append({
            "time_to_target": statistics.mean(times) if times else None,
            "time_to_target_std": statistics.stdev(times) if len(times) > 1 else 0.0,
            "reached": len(times), "bytes_sent": statistics.mean(sent) if sent else None,
            "label": label, "runs": len(runs), "accuracy_mean": accuracy, "accuracy_std": accuracy_std,
            "wall_s": statistics.mean(r["wall_s"] for r in runs),
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in runs),
            "staleness_max": max(r["staleness_max"] for r in runs),
            "dropped": statistics.mean(r["dropped"] for r in runs),
            "commits": statistics.mean(r.get("commits_per_worker") or 0 for r in runs),
            "failed": sum(1 for r in runs if r["error"] or not math.isfinite(r["accuracy"])),
        })
    return summary


def markdown(summary: list[dict], command: str, args) -> str:
    target, clock = args.target_accuracy, getattr(args, "clock", "real")
    lines = [f"Command: `{command}`", "",
             f"{args.workers} workers; Fashion-MNIST, {args.samples or 60000} training samples, 10,000 test; "
             f"{_model_text(args)}; SGD lr {args.lr}, momentum {args.momentum}; batch {args.batch} per worker; "
             f"{args.epochs} epochs; seeds {args.seeds}; simulate: {args.simulate or 'none'}"
             + (f"; virtual clock, step {args.step} (batch {args.batch}, speed 1)" if clock == "virtual" else "")
             + ".", "",
             "| strategy | final test accuracy | wall s | "
             + (f"{'virtual ' if clock == 'virtual' else ''}s to {target} (reached) | " if target else "")
             + "MB sent | staleness mean | staleness max | dropped pushes | commits per worker |",
             "|---|---|---|" + ("---|" if target else "") + "---|---|---|---|---|"]
    for s in summary:
        failed = f" ({s['failed']} failed)" if s["failed"] else ""
        reach = ""
        if target:
            reach = (f"{s['time_to_target']:.1f} +- {s['time_to_target_std']:.1f} ({s['reached']}/{s['runs']}) | "
                     if s["time_to_target"] is not None else f"never (0/{s['runs']}) | ")
        sent = f"{s['bytes_sent'] / 1e6:.1f}" if s["bytes_sent"] is not None else "-"
        commits = f"{s['commits']:.0f}" if s["commits"] else "-"  # PS pushes; hfdt has none
        lines.append(f"| {s['label']} | {s['accuracy_mean']:.4f} +- {s['accuracy_std']:.4f}{failed} | "
                     f"{s['wall_s']:.1f} | {reach}{sent} | {s['staleness_mean']:.2f} | {s['staleness_max']} | "
                     f"{s['dropped']:.0f} | {commits} |")
    return "\n".join(lines) + "\n"


def result_lines(summary: list[dict], base: str = "ashl", suffix: str = "") -> list[str]:
    """`RESULT ashl_vs_<row>_time<suffix>=<ratio>`: the base row's mean time to the target over each other
    row's."""
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
        lines.append(f"RESULT {base}_vs_{label.replace(':', '_').replace('=', '')}_time{suffix}={ratio}")
    best = [row["accuracy_mean"] for label, row in rows.items()
            if label.split(":")[0] in ACCURACY_BASELINES and math.isfinite(row["accuracy_mean"])]
    if best:  # the seed's claim: at least as accurate as the best synchronous or ADSP baseline
        lines.append(f"RESULT {base}_minus_best_pts{suffix}={100 * (rows[base]['accuracy_mean'] - max(best)):.2f}")
    return lines


def ddc_result_lines(summary: list[dict]) -> list[str]:
    """The DDC-ASGD claim's headline figures, when the rows are there: ddc-asgd against the better ASGD row
    (with or without momentum) and against DC-ASGDK (points), and the share of the best asynchronous
    baseline's gap to `local` that ddc-asgd closes."""
    rows = {s["label"]: s["accuracy_mean"] for s in summary}
    needed = ("ddc-asgd", "asgd:momentum=0", "dc-asgdk", "local")
    if not all(k in rows for k in needed):
        return []
    ddc, local = rows["ddc-asgd"], rows["local"]
    baselines = [rows[k] for k in ("asgd", "asgd:momentum=0", "dc-asgd-a", "dc-asgdk") if k in rows]
    best = max(b for b in baselines if math.isfinite(b))
    gap = local - best
    closed = (ddc - best) / gap if gap > 0 else float("nan")
    better_asgd = max(rows[k] for k in ("asgd", "asgd:momentum=0") if k in rows and math.isfinite(rows[k]))
    return [f"RESULT ddc_minus_asgd_pts={100 * (ddc - better_asgd):.2f}",
            f"RESULT ddc_minus_dcasgdk_pts={100 * (ddc - rows['dc-asgdk']):.2f}",
            f"RESULT ddc_gap_closed={closed:.3f}"]


MODEL_TEXT = {"cnn": "CNN conv16-pool-conv32-pool-dense10 (0.1 MB)",
              "cnn-wide": "CNN conv16-pool-conv32-pool-dense1536-dense10 (5.0 MB)"}


def _model_text(args) -> str:
    return MODEL_TEXT.get(args.model) or f"MLP 784-{args.hidden}-10"


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
