"""Cores shared on one host: each engine's TensorFlow intra-op and inter-op threads (a pure split), set on
the engine before TensorFlow starts, and read back from it for `%dist status`.

TensorFlow sizes both thread pools to every core the process may use, so N engines of a host start N
times as many threads as it has cores. nbdist gives each engine its share instead: cores / engines of
the host, at least 1 (`%dist start --threads N` for a fixed number, `--threads off` for TensorFlow's
own default). TensorFlow fixes its pools when its context starts: an engine keeps the threads it
started with, and engines added later get the share of the host as it is then.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

INTRA_ENV = "TF_NUM_INTRAOP_THREADS"  # TensorFlow reads these once, when its context starts
INTER_ENV = "TF_NUM_INTEROP_THREADS"
OFF = "off"  # --threads off: TensorFlow's own default (every core of the process, for each engine)
CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2 CPU quota ("max 100000" or "<quota> <period>")


@dataclass(frozen=True)
class Threads:
    """An engine's TensorFlow thread pools; None: TensorFlow's default."""

    intra: int | None = None
    inter: int | None = None

    def environment(self) -> dict[str, str]:
        """The variables that give these pools to a TensorFlow not yet started in the process."""
        return {name: str(n) for name, n in ((INTRA_ENV, self.intra), (INTER_ENV, self.inter)) if n is not None}

    def label(self) -> str:
        """What `%dist status` shows: intra/inter, or "default"."""
        if self.intra is None and self.inter is None:
            return "default"
        return f"{self.intra or 'default'}/{self.inter or 'default'}"


def share(cores: int, engines: int, override: int | str | None = None) -> Threads:
    """The thread pools of one engine among `engines` on a host whose engines may use `cores`.

    Args:
        cores: the CPUs the engine may run on (its affinity, within its cgroup's quota).
        engines: how many engines that host runs (the engine's local size).
        override: None for the share, a number of threads (>= 1) for both pools, or "off" for
            TensorFlow's default.
    """
    if override == OFF:
        return Threads()
    if override is not None:
        if not isinstance(override, int) or override < 1:
            raise ValueError(f"override must be a number of threads >= 1 or 'off'. Received: override={override!r}")
        return Threads(override, override)
    # No floor above 1 for inter-op: nbdist's own blocking ops (the controls' and the PS exchange's
    # tf.numpy_function) wait on ZeroMQ sockets, never on another TensorFlow op of the process, and
    # Horovod's collectives are asynchronous kernels that free the thread while they wait; nfdt (with
    # and without overlap) and hfdt train at 1/1 (tests/test_nfdt.py, tests/test_hfdt.py on 2 cores).
    n = max(1, cores // max(engines, 1))
    return Threads(n, n)


def parse(text: str | None) -> int | str | None:
    """The value of `--threads`: None (not given: the share), "off", or a number >= 1."""
    if text is None or text == "auto":
        return None
    if text.strip().lower() == OFF:
        return OFF
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--threads takes a number of threads per engine (1 or more), `auto` (its share of its "
                         f"host's cores, the default) or `off` (TensorFlow's default). Received: --threads {text}")
    return n


def engine_cores(cpu_max: str = CPU_MAX) -> int:
    """The CPUs this process may use: its affinity, lowered to a cgroup v2 CPU quota (a container's
    `--cpus`), which TensorFlow itself does not read."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


# -- on an engine -----------------------------------------------------------------------
_pinned: tuple[Threads, str] | None = None  # this process's pools and how they were applied


def pin(engines: int, override: int | str | None = None) -> Threads:
    """Give this engine its share of its host's cores: by environment when TensorFlow is not imported
    here, else through `tf.config.threading` while its context has not started.

    The first pools applied stay (TensorFlow cannot change them once its context started): a later
    call returns them and changes nothing.
    """
    global _pinned
    if _pinned is not None and not _pinned[1].startswith("not applied"):
        return _pinned[0]
    chosen = share(engine_cores(), engines, override)
    if chosen == Threads():
        how = "off"
    elif "tensorflow" not in sys.modules:
        os.environ.update(chosen.environment())
        how = "environment"
    else:
        how = _pin_tensorflow(chosen)
    _pinned = (chosen, how)
    return chosen


def _pin_tensorflow(chosen: Threads) -> str:
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(chosen.intra)
        tf.config.threading.set_inter_op_parallelism_threads(chosen.inter)
    except RuntimeError as exc:  # TensorFlow's context already started in this process
        return f"not applied: {exc}"
    return "tf.config"


def applied() -> dict | None:
    """This engine's pools as its TensorFlow uses them, for `%dist status`: {"threads": label, "how"};
    None while TensorFlow is not imported here.

    TensorFlow's setting (`tf.config.threading`), else the environment variable it read when its
    context started (nbdist sets it before TensorFlow is imported), else its default.
    """
    if "tensorflow" not in sys.modules:
        return None
    import tensorflow as tf

    def pool(setting: int, name: str) -> int | None:
        try:
            return setting or max(0, int(os.environ.get(name, ""))) or None
        except ValueError:
            return None

    used = Threads(pool(tf.config.threading.get_intra_op_parallelism_threads(), INTRA_ENV),
                   pool(tf.config.threading.get_inter_op_parallelism_threads(), INTER_ENV))
    return {"threads": used.label(), "how": _pinned[1] if _pinned is not None else "not pinned"}
