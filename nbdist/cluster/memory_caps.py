"""`%dist cap --memory SIZE`: engines as hosts with SIZE of memory, to try what fits before a real cluster.

Each capped engine is put in a cgroup of its own under the Linux cgroup v1 memory controller (as root), its
`memory.limit_in_bytes` set to SIZE: what the engine allocates from then on counts against SIZE (what it held
before, TensorFlow's libraries included, does not). An engine past its cap is killed by the out-of-memory
killer, and the cell that was running names it. Only engines on the notebook's machine can be capped; the
cgroups are removed when the cluster stops or the cap is lifted.

A capped engine's numpy arrays take small pages from then on (`small_pages`): numpy advises transparent huge pages for arrays
of 4 MB and more, which the kernel fills 2 MB at a time as it sees fit, so one run's peak under a cap moved by
70 MB between runs of the same cell (a pipeline stage killed at 778 MB where it had peaked at 676).
"""

from __future__ import annotations

import os
import re
import uuid

from ..errors import OptionError

MEMORY = "/sys/fs/cgroup/memory"
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def why_unavailable() -> str | None:
    """Why this machine cannot cap engines' memory, or None."""
    if not os.path.isdir(MEMORY):
        return f"there is no cgroup v1 memory controller at {MEMORY}"
    if not os.access(MEMORY, os.W_OK):
        return f"{MEMORY} is not writable by this kernel's user (capping takes root)"
    return None


def small_pages() -> None:
    """Runs on an engine: numpy's advice of transparent huge pages off (see the module's docstring)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    multiarray._set_madvise_hugepage(False)


def parse_size(text: str) -> int | None:
    """Bytes of a size such as 760M, 2G or 1500000000; None for `none` (the cap lifted)."""
    if text.strip().lower() == "none":
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)i?b?\s*", text.lower())
    if not match:
        raise OptionError(f"--memory takes a size such as 760M, 2G or 1500000000 (bytes), or none to lift the cap. "
                          f"Received: {text}")
    return int(float(match.group(1)) * UNITS[match.group(2)])


class MemoryCaps:
    """The cgroups of one cluster's capped engines: {engine id: (cgroup path, pid)}."""

    def __init__(self):
        self.groups: dict[int, tuple[str, int]] = {}

    def cap(self, eid: int, pid: int, nbytes: int) -> None:
        """Cap engine `eid` (process `pid`) at `nbytes` from now on."""
        if eid not in self.groups:
            path = os.path.join(MEMORY, f"nbdist-engine-{eid}-{uuid.uuid4().hex[:8]}")
            os.mkdir(path)
            self.groups[eid] = (path, pid)
            _write(path, "cgroup.procs", pid)
        _write(self.groups[eid][0], "memory.limit_in_bytes", nbytes)

    def peak(self, eid: int) -> int:
        """The most engine `eid` has held since it was capped, in bytes."""
        return int(_read(self.groups[eid][0], "memory.max_usage_in_bytes"))

    def lift(self, eid: int) -> None:
        """Engine `eid` uncapped again (back in the controller's root) and its cgroup removed."""
        path, pid = self.groups.pop(eid)
        if os.path.exists(f"/proc/{pid}"):
            _write(MEMORY, "cgroup.procs", pid)
        os.rmdir(path)

    def release(self) -> None:
        for eid in list(self.groups):
            self.lift(eid)


def _write(path: str, name: str, value) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


def _read(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as f:
        return f.read().strip()
