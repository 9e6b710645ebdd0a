"""ASHL's decisions as text: the profile table and one line per decision."""

from __future__ import annotations

from ..base import table


def profile_table(run) -> str:
    """Per worker: seconds per sample, fixed overhead, exchange time and bandwidth, allocated batch, shard
    and push period (of the first allocation, or the one that took the last newcomer in)."""
    profiled = [e for e in run.events if e["event"] in ("allocated", "reallocated") and e.get("profile")]
    if not profiled:
        return "ASHL: no allocation was made (the run ended before every worker had profiled)."
    rows = [[r["worker"], r["host"] or "?", f"{r['per_sample_s'] * 1e6:.1f}", f"{r['fixed_s'] * 1e3:.2f}",
             f"{r['comm_s'] * 1e3:.2f}", _bandwidth(r["bandwidth_bps"]), r["batch"], f"{r['shard']:.1%}",
             r.get("period", 1)]
            for r in profiled[-1]["profile"]]  # the latest with every worker's profile (a newcomer's too)
    head = ["rank", "host", "us/sample", "fixed ms", "exchange ms", "bandwidth", "batch", "shard", "push every"]
    return "ASHL profile and allocation:\n" + table(head, rows)


def decisions(run) -> list[str]:
    """One line per allocation, phase switch, compression change and lost worker, in order."""
    lines = []
    start = run.started_at or 0
    for e in run.events:
        at = f"{e['t'] - start:6.1f} s"
        if e["event"] in ("allocated", "reallocated"):
            lines.append(f"{at}  {e['event']} batches {e['batches']}, push every {e.get('periods')} steps"
                         f"{_slow_links(e.get('every') or [])}: {e['reason']}")
        elif e["event"] == "switch_phase":
            lines.append(f"{at}  switched to SHL (synchronous): {e['reason']}")
        elif e["event"] == "compression":
            lines.append(f"{at}  worker {e['worker']} compression {e['reason']}")
        elif e["event"] in ("end_laggards", "left_shl"):
            lines.append(f"{at}  {e['reason']}")
        elif e["event"] in ("worker_died", "worker_dropped"):
            lines.append(f"{at}  worker {e.get('rank', e.get('worker'))} lost ({e['event'].replace('_', ' ')})")
    return lines


def _slow_links(every: list[int]) -> str:
    """The workers whose pushes take several commit intervals (links too slow for the common cadence)."""
    slow = {r: m for r, m in enumerate(every) if m > 1}
    return "".join(f", worker {r} once every {m} commit intervals" for r, m in slow.items())


def _bandwidth(bps) -> str:
    if not bps:
        return "?"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} bit/s"
