"""The processes this process started that must not outlive it (parameter-server shards): the launcher notes
each one; whoever guards this process's death (`nbdist.cluster.lifeline`'s watcher) listens. Imports nothing."""

from __future__ import annotations

_listeners: list[tuple] = []  # (on_start, on_stop), each called with a pid


def listen(on_start, on_stop) -> None:
    """Call `on_start(pid)` for every process started from now on, `on_stop(pid)` when it was stopped."""
    _listeners.append((on_start, on_stop))


def started(pid: int) -> None:
    for on_start, _ in list(_listeners):
        on_start(pid)


def stopped(pid: int) -> None:
    for _, on_stop in list(_listeners):
        on_stop(pid)
