"""Text progress for a run: one tqdm line while it trains; a summary line (and, for several
workers, a table per worker) when it ends. Used wherever no widget front end is connected."""

from __future__ import annotations

import sys

from . import report


class TextProgress:
    """Shows rank 0's progress (epoch, step, loss, samples/s) from the records workers publish."""

    def __init__(self, run, file=None):
        self.run = run
        self.file = file or sys.stderr
        self._bar = None

    def __call__(self, run) -> None:
        latest = run.progress.get(run.workers[0]) if run.workers else None
        if not latest or not latest.get("steps") or not latest.get("epochs"):
            return
        total = latest["epochs"] * latest["steps"]
        if self._bar is None:
            from tqdm.std import tqdm

            self._bar = tqdm(total=total, desc=f"run {run.id} {run.strategy}", unit="step", file=self.file,
                             mininterval=0.5, dynamic_ncols=False, ncols=100)
        record = latest["record"]
        position = record["epoch"] * latest["steps"] + (latest["batch"] or 0)
        self._bar.update(max(0, min(total, position) - self._bar.n))
        postfix = {"epoch": f"{record['epoch'] + 1}/{latest['epochs']}"}
        if record.get("loss") is not None:
            postfix["loss"] = f"{record['loss']:.4f}"
        if record.get("samples_per_s"):
            postfix["samples/s"] = f"{record['samples_per_s']:,.0f}"
        self._bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        run = self.run
        line = f"nbdist: run {run.id} ({run.strategy} on engine(s) {run.workers}) {run.status}"
        if run.duration_s is not None:
            line += f" in {run.duration_s:.1f} s"
        final = run.final_metrics
        if final:
            line += ": " + ", ".join(f"{k} {v:.4f}" for k, v in final.items())
        print(line, file=sys.stdout)
        if len(run.workers) > 1 and run.results:
            print(report.worker_table(run), file=sys.stdout)
