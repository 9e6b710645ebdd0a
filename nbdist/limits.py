"""nbdist's own time limits in one place: how long each part waits before it calls something dead, stalled
or late. docs/time-limits.md lists them with what each one decides.

Every limit is multiplied by `NBDIST_TIME_SCALE` (default 1), read once when nbdist is imported, so a slow
or loaded machine (a shared CI host, a cluster under heavy I/O) can give every wait longer with one
variable: `NBDIST_TIME_SCALE=3 make test`. Engines, shards and kernels started from a process inherit it.
Polling intervals are not limits and are not scaled. A limit the user sets by option (`--stall-timeout`, whose
default is a limit here) is the user's and is not scaled either.

Imports nothing of nbdist's: every layer may read it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace

SCALE_ENV = "NBDIST_TIME_SCALE"


def time_scale(environ=os.environ) -> float:
    """$NBDIST_TIME_SCALE as a positive number (1 when unset)."""
    text = environ.get(SCALE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{SCALE_ENV} must be a positive number, like 2 for twice as long. Received: {SCALE_ENV}={text!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """Seconds (unless the name says otherwise) each part of nbdist waits; see docs/time-limits.md."""

    # the cluster (ipyparallel's hub and engines, clusters nbdist starts)
    hub_heartbeat_misses: int = 5  # 1 s heartbeats the hub may miss before it unregisters an engine
    engine_heartbeat_misses: int = 5  # hub pings an engine may miss before it shuts itself down
    engine_start_s: float = 120.0  # engines a launcher started have this long to register
    engine_probe_s: float = 60.0  # an idle engine answers the status probe (first TensorFlow import)
    engine_release_s: float = 5.0  # `%dist stop` on a connected cluster waits this long for the release
    hub_settle_s: float = 0.5  # the hub may still count a task whose result this client already has
    registration_grace_s: float = 5.0  # engines a run needs may take this long to register before it starts
    definition_s: float = 300.0  # a definition cell replayed on an engine
    bring_s: float = 300.0  # values a training cell uses, sent to an engine
    # a run (the kernel's side)
    cause_grace_s: float = 10.0  # after a worker fails because a peer did, the others may report the cause
    stop_s: float = 20.0  # engines stop after an interrupt
    late_interrupt_s: float = 5.0  # a Ctrl-C this soon after a cell ended is kept from the next one
    # parameter-server shards
    shard_start_s: float = 60.0  # a shard process starts and says where it listens
    shard_engine_call_s: float = 60.0  # a shard started on an engine answers the kernel
    ps_monitor_s: float = 10.0  # a live shard answers the kernel's monitor
    ps_reply_s: float = 10.0  # a worker waits for a shard's reply
    ps_restart_wait_s: float = 30.0  # ... when the kernel may restart a silent shard
    shard_worker_silence_s: float = 15.0  # a shard drops a worker it has not heard from this long
    start_barrier_s: float = 120.0  # the start barrier waits for a worker's first push
    ps_silence_s: float = 120.0  # every live worker of a PS run silent (no step, push or reply): the run fails
    # Horovod (hfdt, tensor, ASHL's sync phase)
    gloo_peer_s: float = 5.0  # a survivor waits on a dead peer before its collective fails (Gloo's default: 30)
    collective_stall_s: float = 30.0  # a synchronous step waits for ranks that never reached it (--stall-timeout)
    job_start_s: float = 120.0  # every rank reaches a Horovod job's start (a peer may still be ending the last fit)
    reform_s: float = 60.0  # survivors wait for the kernel's new Horovod job
    join_s: float = 1800.0  # a newcomer waits for the ranks to reach an epoch's end
    # pipeline
    stage_silence_s: float = 60.0  # a stage waits for its neighbour's activations or gradients
    # the lifeline (no orphaned clusters)
    lifeline_release_s: float = 5.0  # `stop` waits for the watcher to exit after "release"
    shard_term_grace_s: float = 2.0  # tracked processes get this long after SIGTERM before SIGKILL
    launcher_kill_after_s: float = 2.0  # ipyparallel's stop_seconds_until_kill for nbdist's clusters
    launcher_reap_s: float = 5.0  # ... and its stop_timeout, the wait after SIGKILL
    watcher_release_s: float = 10.0  # a dead kernel's watcher releases a connected cluster's engines

    def scaled(self, factor: float) -> "Limits":
        """Every limit times `factor` (heartbeat misses rounded up)."""
        return replace(self, **{f.name: (math.ceil(getattr(self, f.name) * factor) if f.type == "int"
                                         else getattr(self, f.name) * factor) for f in fields(self)})


LIMITS = Limits().scaled(time_scale())
