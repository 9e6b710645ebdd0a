"""Running a comparison: its rows, one run of a row, the whole grid on one cluster, the virtual step cost."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from ..errors import OptionError, RunInterrupted
from ..strategies import option_line
from .cells import DATA, MODELS, TRAIN


@dataclass
class Row:
    """One strategy variant: its label as given, the strategy and its options."""

    label: str
    strategy: str
    options: dict = field(default_factory=dict)


def parse_rows(text: str) -> list[Row]:
    """``asgd:momentum=0,ddc-asgd:p=2`` -> rows; options use the `%%distribute` names (dashes or underscores)."""
    from ..strategies import REGISTRY

    rows = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, extras = item.partition(":")
        if name not in REGISTRY:
            raise OptionError(f"unknown strategy {name!r} in --strategies; choose from {', '.join(sorted(REGISTRY))}")
        options = {}
        reads = {option.name: option for option in REGISTRY[name].reads}
        for pair in filter(None, extras.split(":")):
            key, _, value = pair.partition("=")
            key = key.strip().lstrip("-").replace("-", "_")
            if key not in reads:
                raise OptionError(f"{name} has no option {key!r} (in {item!r}); it reads: "
                                  f"{', '.join(reads) or 'none'}")
            options[key] = (reads[key].type or str)(value)
        rows.append(Row(item, name, options))
    return rows


def notebook_shell():
    """An IPython shell with nbdist loaded, as a notebook kernel has; returns (shell, session)."""
    from IPython.core.interactiveshell import InteractiveShell

    from .. import get_session

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdist")
    return shell, get_session(shell)


def row_simulate(row: Row, args) -> str | None:
    """The `--simulate` text a row runs with: the comparison's, and on the virtual clock its fixed step
    cost (a one-engine row gets only the clock)."""
    from ..strategies import REGISTRY

    cls = REGISTRY[row.strategy]
    if not any(option.name == "simulate" for option in cls.reads):
        return None
    parts = [] if cls.max_workers == 1 else [args.simulate] if args.simulate else []
    if args.clock == "virtual":
        parts.append(f"clock=virtual; step={args.step}")
    return "; ".join(parts) or None


def run_one(shell, session, row: Row, args, seed: int) -> dict:
    """Train one row with one seed; returns what the table and the plots need."""
    from ..strategies import REGISTRY

    options = {"strategy": row.strategy, "seed": seed, **row.options}
    options["workers"] = 1 if REGISTRY[row.strategy].max_workers == 1 else args.workers
    simulate = row_simulate(row, args)
    if simulate:
        options["simulate"] = simulate
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
    history = run.history if run is not None else {}
    return {
        "label": row.label, "strategy": row.strategy, "seed": seed, "line": line,
        "accuracy": accuracy if math.isfinite(accuracy) else float("nan"),
        "wall_s": (run.duration_s if run else time.time() - started) or 0.0,
        "staleness_mean": statistics.mean(applied) if applied else 0.0,
        "staleness_max": max(applied) if applied else 0,
        "dropped": sum(1 for p in pushes if p["dropped"]),
        "commits_per_worker": len(pushes) / options["workers"],
        "bytes_sent": bytes_sent(run),
        "curve": {"epoch": list(range(1, len(history.get("val_accuracy", [])) + 1)),
                  "val_accuracy": list(history.get("val_accuracy", [])), "t": epoch_times(run, started)},
        "error": error,
    }


def bytes_sent(run) -> float | None:
    """Bytes every worker sent, from each worker's last metrics record of each fit (what its strategy counted:
    the PS client's bytes, or a ring allreduce's 2(N-1)/N of the gradient per step)."""
    if run is None:
        return None
    last = [fit.records[-1] for fits in run.results.values() for fit in fits if fit.records]
    sent = [r.get("bytes_sent") for r in last]
    return float(sum(sent)) if sent and all(b is not None for b in sent) else None


def epoch_times(run, started: float) -> list[float]:
    """Seconds (virtual seconds on the virtual clock) from the run's start to each epoch's end, from the
    History worker's last record of each epoch."""
    if run is None or not run.fits:
        return []
    last_of_epoch = {r["epoch"]: r["t"] for r in run.fits[-1].records}
    return [round(last_of_epoch[e] - (run.started_at or started), 6) for e in sorted(last_of_epoch)]


def time_to_target(result: dict, target: float) -> float | None:
    """Seconds from the run's start to the first epoch end whose validation accuracy reached `target`."""
    curve = result["curve"]
    for t, accuracy in zip(curve["t"], curve["val_accuracy"]):
        if accuracy >= target:
            return t
    return None


def measure_step(shell, session, args) -> str:
    """The virtual clock's step cost, measured once for the whole comparison (on one engine, the cell's
    model and batch), as `--simulate ... step=` writes it: every row and seed then uses this value."""
    cell = TRAIN.format(lr=args.lr, momentum=args.momentum, batch=args.batch, epochs=1).replace(
        "verbose=0)", "verbose=0, steps_per_epoch=2)")
    shell.run_cell_magic("distribute", "--strategy local --simulate 'clock=virtual'", cell)
    return session.last_run.virtual_step


def run_grid(args, rows: list[Row]) -> list[dict]:
    """Every row with every seed on one cluster started for the comparison (stopped however it ends)."""
    shell, session = notebook_shell()
    print(f"Starting {args.workers} engines for {len(rows)} strategies x {args.seeds} seeds", flush=True)
    shell.run_line_magic("dist", f"start -n {args.workers}")
    results = []
    try:
        shell.run_cell_magic("distribute", "define --name experiment-data",
                             DATA.format(samples=args.samples) + MODELS[args.model].format(hidden=args.hidden))
        if args.clock == "virtual" and not args.step:
            args.step = measure_step(shell, session, args)
            print(f"Virtual clock: a step of batch {args.batch} at speed 1 costs {args.step} (measured once; "
                  f"--step {args.step} reproduces this table)", flush=True)
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
    return results
