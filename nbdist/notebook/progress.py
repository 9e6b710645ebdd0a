"""Text progress for a run: one tqdm line while it trains; a summary line (and, for several
workers, a table per worker) when it ends. Used wherever no widget front end is connected."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from . import report


@contextlib.contextmanager
def _interrupt_after():
    """Within: a Ctrl-C waits until the block is done. tqdm takes two locks in turn; a KeyboardInterrupt
    between them left the first held, and every later bar drawn from another thread (a --background run's)
    waited for it for ever."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


class TextProgress:
    """Shows rank 0's progress (epoch, step, loss, samples/s) from the records workers publish."""

    def __init__(self, run, file=None):
        self.run = run
        self.file = file or sys.stderr
        self._bar = None

    def __call__(self, run) -> None:
        latest = run.progress.get(run.workers[0]) if run.workers else None
        if latest and latest.get("loop"):
            with _interrupt_after():
                self._draw_loop(run, latest)
            return
        if not latest or not latest.get("steps") or not latest.get("epochs"):
            return
        with _interrupt_after():
            self._draw(run, latest)

    def _draw_loop(self, run, latest: dict) -> None:
        """A loop of the cell's own: its steps so far, its loss and rate (how many steps it makes is its own)."""
        record = latest["record"]
        if self._bar is None:
            from tqdm.std import tqdm

            self._bar = tqdm(total=None, desc=f"run {run.id} {run.strategy}", unit="step", file=self.file,
                             mininterval=0.5, dynamic_ncols=False, ncols=100)
        self._bar.update(max(0, (record.get("step") or 0) - self._bar.n))
        postfix = {}
        if record.get("loss") is not None:
            postfix["loss"] = f"{record['loss']:.4f}"
        if record.get("samples_per_s"):
            postfix["samples/s"] = f"{record['samples_per_s']:,.0f}"
        elif latest.get("steps_per_s"):
            postfix["steps/s"] = f"{latest['steps_per_s']:,.1f}"
        self._bar.set_postfix(postfix, refresh=False)

    def _draw(self, run, latest: dict) -> None:
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
            with _interrupt_after():
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
