"""Facts about the host a process runs on, the same in the notebook kernel and in an engine: versions,
machine, network namespace. Imports nothing of nbdist's."""

from __future__ import annotations

import os
import socket


def versions() -> dict:
    """The versions `%dist status` compares between the notebook and its engines, and this Python."""
    import sys
    from importlib import metadata

    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {"tensorflow": version("tensorflow") or version("tensorflow-cpu"), "keras": version("keras"),
            "horovod": version("horovod"), "nbdist": version("nbdist"), "python": sys.executable}


def machine() -> str:
    """What engines of one machine share (its GPUs): the boot id, else the host name."""
    return boot_id() or socket.gethostname()


def network_namespace() -> int | None:
    """The inode of this process's network namespace (Linux), None where there is none to read."""
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None


def boot_id() -> str | None:
    """This machine's boot id (Linux): engines with the kernel's run on the kernel's machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None
