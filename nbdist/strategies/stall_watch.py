"""A stalled `hfdt` step, named: the ranks the others wait for in a collective, and what each last did.

Every rank marks when it enters and leaves a unit of collectives (a train call, the epoch-end
averaging). A rank that has waited inside one for `--stall-timeout` seconds says so once, from a
watchdog thread (its main thread is blocked in the collective), in its task's published data. The
kernel then names the ranks that are not waiting: they never reached the collective (stuck in a
callback or a data generator, or an engine that hangs without dying). The first unit of a job is not
timed: every rank traces its train step there, which takes as long as the engine's load makes it.
"""

from __future__ import annotations

import threading
import time

WAITING_KEY = "nbdist_waiting"  # in a worker's published data: {"since", "unit"} while stalled, else None
CHECK_S = 0.5


class StallWatch:
    """A rank's side: `entering()` / `left()` around each unit; `stop()` at the fit's end."""

    def __init__(self, publish, timeout_s: float):
        self.publish, self.timeout_s = publish, timeout_s
        self.entered: float | None = None
        self.unit = 0
        self.said = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="nbdist-stall-watch", daemon=True)
        self._thread.start()

    def entering(self, unit: int, timed: bool = True) -> None:
        """This rank enters unit `unit`; `timed` False: its wait is not watched (a job's first unit)."""
        self.unit, self.entered = unit, time.time() if timed else None

    def left(self) -> None:
        self.entered = None
        if self.said:  # it said it waited: the kernel learns the wait is over
            self.said = False
            self.publish({WAITING_KEY: None})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_S):
            entered = self.entered
            if entered is not None and not self.said and time.time() - entered > self.timeout_s:
                self.said = True
                self.publish({WAITING_KEY: {"since": entered, "unit": self.unit}})


def missing_ranks(run, ranks: list[int], timeout_s: float) -> list[int]:
    """The ranks (of the job's engines `ranks`, in rank order) that never reached a collective others
    have waited in past the timeout; [] while no rank waits, or all do."""
    waiting = {e: (run.progress.get(e) or {}).get(WAITING_KEY) for e in ranks}
    missing = [rank for rank, eid in enumerate(ranks) if not waiting[eid]]
    # a rank that entered the collective up to `timeout_s` after the first waiter says so itself by
    # 2 x timeout_s; one still silent then never arrived (not merely later than the others)
    settled = [w for w in waiting.values() if w and time.time() - w["since"] > 2 * timeout_s + 2 * CHECK_S]
    return missing if settled and len(missing) < len(ranks) else []


def stalled(run, ranks: list[int], timeout_s: float) -> str | None:
    """What the cell says when some of the job's ranks (engines `ranks`, in rank order) have waited past
    the timeout in a collective the others never reached; None while no rank waits, or all do."""
    missing = missing_ranks(run, ranks, timeout_s)
    if not missing:
        return None
    parts = []
    for rank in missing:
        eid = ranks[rank]
        record = (run.progress.get(eid) or {}).get("record") or {}
        last = (f"its last progress: epoch {record.get('epoch')}, step {record.get('step')}, "
                f"{time.time() - record['t']:.0f} s ago" if record.get("t") else "no progress reported")
        parts.append(f"rank {rank} (engine {eid}, host {(run.hosts.get(eid) or {}).get('host', '?')}; {last})")
    return (f"the synchronous step waited more than {timeout_s:g} s (--stall-timeout) for rank(s) that never "
            f"reached it: {'; '.join(parts)}. Such a rank is stuck in the cell's own code (a callback, a data "
            "generator) or its engine hangs; the run was stopped. Fix that code (or check the engine), or give a step "
            "that is slow on purpose more time with --stall-timeout.")
