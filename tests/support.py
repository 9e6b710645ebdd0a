"""What the tests share: message builders for a shard, and helpers for the shared real cluster."""

from __future__ import annotations

import os
import time

import numpy as np

from nbdist.ps import wire

KEY = wire.new_key()
W0 = {"dense/kernel": np.arange(6, dtype=np.float32).reshape(2, 3), "dense/bias": np.zeros(3, np.float32)}
SGD = {"name": "SGD", "learning_rate": 0.5}

# a training cell of the suite's `build` model (tests/conftest.py's definitions) with plain SGD
SGD_CELL = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD({lr}), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size={batch}, epochs={epochs}, steps_per_epoch={steps}, shuffle={shuffle},
                    validation_data=(xt[:500], yt[:500]))
'''


def message(kind, arrays=None, **fields):
    """A message as a shard receives it: encoded and decoded under the test key."""
    return wire.decode(KEY, wire.encode(KEY, kind, arrays, **fields))


def grads(value=1.0):
    """A gradient of W0's shapes, every entry `value`."""
    return {name: np.full(w.shape, value, np.float32) for name, w in W0.items()}


def idle_engines(cluster, count: int) -> list[int]:
    """`count` live engines of the shared cluster (starting more if needed); returns their ids.

    An engine a test killed stays registered for a few seconds, holding the task it died in: busy."""
    ipp_cluster, client = cluster
    missing = count - len(idle_ids(client))
    if missing > 0:
        ipp_cluster.start_engines_sync(n=missing)
        client.wait_for_engines(len(client.ids) + missing, timeout=120, block=True)
    return idle_ids(client)[:count]


def new_engine(cluster) -> tuple[int, int]:
    """One engine started now on the shared cluster (a test may kill it): its id and process id."""
    ipp_cluster, client = cluster
    before = set(client.ids)
    ipp_cluster.start_engines_sync(n=1)
    client.wait_for_engines(len(before) + 1, timeout=90, block=True)
    eid = (set(client.ids) - before).pop()
    return eid, client[eid].apply_sync(os.getpid)


def busy_ids(client) -> dict[int, dict]:
    """Registered engines with a task queued or running (direct `queue` or load-balanced `tasks`), and
    their status."""
    status = client.queue_status()
    return {eid: status[eid] for eid in sorted(client.ids)
            if eid in status and (status[eid]["queue"] or status[eid]["tasks"])}


def idle_ids(client) -> list[int]:
    """Registered engines with nothing queued or running."""
    busy = busy_ids(client)
    return [eid for eid in sorted(client.ids) if eid not in busy]


def eventually(kernel, expression: str, timeout: float = 60):
    """The value of `expression` once truthy, polled from the kernel (bounded)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = kernel.value(expression)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{expression} still falsy after {timeout} s")


def within(condition, timeout: float = 60):
    """The value of `condition()` once truthy, polled in this process (bounded)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def push_log(kernel) -> list[dict]:
    """The first shard's push log of the kernel's last run, one dict per push."""
    return kernel.value("[dict(zip(s['log_fields'], e)) for s in nbdist.last_run.ps[:1] for e in s['log']]")
