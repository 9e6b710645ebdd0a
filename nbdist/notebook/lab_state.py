"""The state the JupyterLab sidebar shows: one JSON-able snapshot of a Session (cluster, definitions, runs).

Read-only and network-free (cached engine inventory, `client.ids`, the runs' latest records), so it
can be taken from any thread, also while a run trains. Per-node records use DESIGN.md section 8.
"""

from __future__ import annotations

import math
import time
from collections import deque

from ..strategies import strategy_names

SCHEMA_VERSION = 1
SPARK_POINTS = 40  # losses kept per node for the sidebar's mini chart


class Sparklines:
    """The recent losses of every (run, rank), collected from the records as they arrive."""

    def __init__(self, points: int = SPARK_POINTS):
        self.points = points
        self._series: dict[tuple[int, int], deque] = {}
        self._last_t: dict[tuple[int, int], float] = {}

    def add(self, run_id: int, rank: int, record: dict) -> None:
        key, t, loss = (run_id, rank), record.get("t"), record.get("loss")
        if t is None or loss is None or t <= self._last_t.get(key, 0):
            return
        self._last_t[key] = t
        self._series.setdefault(key, deque(maxlen=self.points)).append(round(float(loss), 5))

    def get(self, run_id: int, rank: int) -> list[float]:
        return list(self._series.get((run_id, rank), ()))


def snapshot(session, sparklines: Sparklines | None = None) -> dict:
    """The whole sidebar state of `session`, without the time it was taken (see `stamp`)."""
    sparklines = sparklines or Sparklines()
    run_list = list(session.runs)
    busy = {eid for run in run_list if run.status in ("pending", "running") for eid in run.workers}
    return _finite({
        "type": "state",
        "schema": SCHEMA_VERSION,
        "strategies": strategy_names(),
        "cluster": _cluster(session.cluster, busy),
        "definitions": [_definition(d) for d in sorted(session.definitions.values(), key=lambda d: d.index)],
        "runs": [_run(run, sparklines) for run in run_list],
    })


def stamp(state: dict) -> dict:
    """`state` with the kernel's clock, so the front end can show elapsed times of running runs."""
    return {**state, "kernel_time": time.time()}


def _cluster(cluster, busy: set[int]) -> dict | None:
    client = getattr(cluster, "client", None)
    if cluster is None or client is None:
        return None
    alive = set(client.ids)  # a copy kept by ipyparallel's client: no round trip
    engines = []
    for eid in cluster.known_ids():
        info = cluster.info(eid)
        state = "dead" if not cluster.is_alive(eid, alive) else "busy" if eid in busy else "idle"
        engines.append({"id": eid, "host": info.host, "pid": info.pid, "cpus": info.cpus,
                        "gpus": list(info.gpus or []), "state": state})
    return {"owned": cluster.owned, "engines": engines}


def _definition(definition) -> dict:
    lines = definition.source.strip().splitlines()
    return {"key": definition.key, "index": definition.index, "digest": definition.digest,
            "first_line": lines[0] if lines else "", "lines": len(lines)}


def _run(run, sparklines: Sparklines) -> dict:
    nodes = []
    for rank, eid in enumerate(run.workers):
        latest = dict(run.progress.get(eid) or {})
        record = dict(latest.get("record") or {})
        sparklines.add(run.id, rank, record)
        info = run.hosts.get(eid, {})
        nodes.append({"rank": rank, "engine": eid, "host": info.get("host"), "gpus": info.get("gpus") or [],
                      "record": record or None, "losses": sparklines.get(run.id, rank)})
    return {
        "id": run.id, "strategy": run.strategy, "status": run.status, "workers": list(run.workers),
        "cell_id": run.cell_id, "started_at": run.started_at, "ended_at": run.ended_at,
        "progress": run.progress_fraction, "error": run.error, "nodes": nodes,
        "stoppable": run.status == "running",
        "final": run.final_metrics if run.status == "done" else {},
        "events": run.event_lines(),
    }


def _finite(value):
    """NaN and infinities (a diverged loss) become None: Jupyter's JSON refuses them."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()  # a numpy scalar: its Python number
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
