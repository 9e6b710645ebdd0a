"""Plain-text tables for `%dist status` and `%dist runs`."""

from __future__ import annotations

import time

from ..strategies.base import table


def engine_table(rows) -> str:
    """One row per engine: id, host, pid, CPUs, GPUs it sees, TF/Keras/Horovod versions, its TensorFlow
    intra/inter-op threads (nbdist.host.threads, read back there), state, and (on GPU hosts) the host GPU
    it was pinned to (nbdist.host.gpus; * when memory growth is on: a shared GPU)."""
    if not rows:
        return "no engines (start some with %dist start -n 2)"
    pinned = any(i.gpu for i, _ in rows)
    text = table(
        ["id", "host", "pid", "cpus", "gpus", "tensorflow", "keras", "horovod", "threads", "state",
         *(["gpu"] if pinned else [])],
        [[i.id, i.host, i.pid, i.cpus, len(i.gpus) if i.gpus is not None else "?", i.tensorflow or "-",
          i.keras or "-", i.horovod or "-", i.threads or "-", state, *([i.gpu or "-"] if pinned else [])]
         for i, state in rows],
    )
    if any((i.gpu or "").endswith("*") for i, _ in rows):
        text += "\n* shared GPU (with other engines or the notebook): TensorFlow's memory growth is on"
    for i, _ in rows:
        if (i.threads_how or "").startswith("not applied"):
            text += f"\nengine {i.id}: threads {i.threads_how} (TensorFlow started there before nbdist could set them)"
    return text


def cache_lines(holdings: dict[str, dict]) -> str:
    """What the cluster's data cache holds on each host (one copy of each array a cell sent, per host)."""
    return "\n".join(f"data placed on {host}: {held['files']} array(s), {held['bytes'] / 1e6:.1f} MB (one copy for "
                     "every engine of the host)" for host, held in sorted(holdings.items()) if held["files"])


def compatibility_notice(cluster, rows) -> str:
    """Warnings about engines that differ from the notebook (nbdist.cluster.compat), each shown once per connection."""
    from ..cluster import compat
    from ..host import facts as host

    fresh = [p for p in compat.problems(host.versions(), [info for info, _ in rows]) if p.key not in cluster.warned]
    cluster.warned.update(p.key for p in fresh)
    return "\n".join(p.text() for p in fresh)


def run_table(runs) -> str:
    if not runs:
        return "no runs yet"
    rows = []
    for run in runs:
        final = run.final_metrics
        summary = ", ".join(f"{k} {v:.4f}" for k, v in list(final.items())[:3]) or (run.error or "")[:60]
        started = time.strftime("%H:%M:%S", time.localtime(run.started_at)) if run.started_at else "-"
        duration = f"{run.duration_s:.1f}" if run.duration_s is not None else "-"
        rows.append([run.id, run.strategy, ",".join(map(str, run.workers)), run.status, started, duration, summary])
    return table(["run", "strategy", "engines", "status", "started", "seconds", "result"], rows)


def worker_table(run) -> str:
    """The final per-worker summary of a multi-worker run: steps, last loss, samples/s, staleness."""
    rows = []
    pushes = run.push_records
    for rank, eid in enumerate(run.workers):
        records = [r for fit in run.results.get(eid, []) for r in fit.records]
        last = records[-1] if records else {}
        taus = [p["staleness"] for p in pushes if p["worker"] == rank and p["staleness"] is not None]
        state = run.worker_state(rank)
        rows.append([rank, eid, run.hosts.get(eid, {}).get("host", "-"), last.get("step", "-"),
                     f"{last['loss']:.4f}" if last.get("loss") is not None else "-",
                     f"{last['samples_per_s']:,.0f}" if last.get("samples_per_s") else "-",
                     f"{sum(taus) / len(taus):.2f}" if taus else "-", state])
    return table(["rank", "engine", "host", "steps", "loss", "samples/s", "mean staleness", "state"], rows)
