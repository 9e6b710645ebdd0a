"""One copy of the data per host (DESIGN.md section 11): arrays placed once per host, by content digest.

An array the notebook sends whole to the engines of a host is written once into the host's cache (a file in
shared memory, `/dev/shm`, or the temporary folder where there is none) and every engine of the host maps it
(copy on write: an engine that changes it changes its own pages only), as Ray's object store keeps one copy
per node. The kernel writes it itself when it shares the host, else the host's first engine writes what it
received; the others map the file. A cache is one folder per cluster, removed when the cluster stops, and
bounded: placing past `MAX_FRACTION` of the file system removes the least recently placed files (a file
removed while mapped stays readable until its last mapping goes).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

MAX_FRACTION = 0.5  # of the cache's file system a cluster's cache may hold


def root() -> Path:
    """Where this host's caches live: `NBDIST_HOST_CACHE`, else shared memory, else the temporary folder."""
    chosen = os.environ.get("NBDIST_HOST_CACHE")
    if chosen:
        return Path(chosen)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def folder(cache: str) -> Path:
    """The folder of cluster `cache`'s placed arrays on this host."""
    return root() / f"nbdist-{cache}"


def _path(cache: str, digest: str) -> Path:
    return folder(cache) / f"{digest}.npy"


def place(cache: str, digest: str, array: np.ndarray) -> np.ndarray:
    """`array` written once into this host's cache under `digest` (unless it is there already); its mapping."""
    path = _path(cache, digest)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _make_room(cache, np.asarray(array).nbytes)
        partial = path.with_suffix(f".{os.getpid()}.part")
        with open(partial, "wb") as file:
            np.save(file, np.ascontiguousarray(array), allow_pickle=False)
        os.replace(partial, path)  # whole or absent: a reader never maps a file half written
    return mapped(cache, digest)


def mapped(cache: str, digest: str) -> np.ndarray | None:
    """The array placed under `digest` on this host (copy on write), or None when it is not there."""
    path = _path(cache, digest)
    try:
        array = np.load(str(path), mmap_mode="c", allow_pickle=False)
    except FileNotFoundError:
        return None
    os.utime(path)  # recently used: the last to be removed to make room
    return array


def holds(cache: str) -> dict:
    """What this host's cache of cluster `cache` holds: {"files": n, "bytes": b}."""
    files = list(folder(cache).glob("*.npy"))
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def remove(cache: str) -> None:
    """Remove cluster `cache`'s folder on this host (the cluster stops)."""
    path = folder(cache)
    for entry in path.glob("*"):
        entry.unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:
        pass


def _make_room(cache: str, incoming: int) -> None:
    stats = os.statvfs(root())
    limit = MAX_FRACTION * stats.f_blocks * stats.f_frsize
    files = sorted(folder(cache).glob("*.npy"), key=lambda f: f.stat().st_mtime)
    held = sum(f.stat().st_size for f in files)
    while files and held + incoming > limit:
        oldest = files.pop(0)
        held -= oldest.stat().st_size
        oldest.unlink(missing_ok=True)
