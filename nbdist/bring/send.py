"""Sending a bring plan to the engines: only what each lacks, identified by content digest.

Code and imports are replayed as definition cells are (`engine.run_definition`, keyed
``bring:<name>``); values are sent once and kept, so an unchanged re-run sends nothing.
Where the strategy shards arrays by stride (`Strategy.array_shards`), an array the cell
reads only as `fit`'s data reaches each worker as its own shard.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .. import engine
from ..errors import DefinitionFailed
from ..limits import LIMITS
from .plan import Item


def digest_of(value) -> tuple[str, bytes | None]:
    """A content digest, and the pickled bytes for what is not an array (sent as they are)."""
    if isinstance(value, np.ndarray):
        h = hashlib.sha256(f"{value.dtype}{value.shape}".encode())
        h.update(memoryview(np.ascontiguousarray(value)).cast("B"))
        return h.hexdigest()[:24], None
    import cloudpickle

    blob = cloudpickle.dumps(value)
    return hashlib.sha256(blob).hexdigest()[:24], blob


def send(items: list[Item], cluster, workers: list[int], shard_names: set[str] = frozenset(),
         positions: dict[int, tuple[int, int]] | None = None) -> dict:
    """Bring `items` to `workers` (in rank order); `shard_names`: arrays each rank gets only its shard of;
    `positions`: engine -> (rank, size) where not its place in `workers` (an engine joining a running run).
    Returns {"names": [...], "data_bytes": n, "sharded": [...]}, what was actually sent."""
    positions = positions or {eid: (rank, len(workers)) for rank, eid in enumerate(workers)}
    client = cluster.client
    sent = {"names": [], "data_bytes": 0, "sharded": []}
    code = [i for i in items if i.kind != "value"]
    if code:
        have = _gather(cluster, {eid: client[eid].apply_async(engine.definition_digests) for eid in workers})
        for item in code:
            key, digest = f"bring:{item.name}", hashlib.sha256(item.source.encode()).hexdigest()[:16]
            calls = {eid: client[eid].apply_async(engine.run_definition, key, digest, item.source,
                                                  f"brought {item.name}")
                     for eid in workers if have[eid].get(key) != digest}
            _gather(cluster, calls, item)
            if calls:
                sent["names"].append(item.name)
    values = [i for i in items if i.kind == "value"]
    if values:
        have = _gather(cluster, {eid: client[eid].apply_async(engine.value_digests) for eid in workers})
        for item in values:
            _send_value(item, cluster, positions, have, item.name in shard_names, sent)
    return sent


def _send_value(item: Item, cluster, positions: dict[int, tuple[int, int]], have: dict, by_shard: bool,
                sent: dict) -> None:
    value = item.value
    digest, blob = digest_of(value)
    most = max(size for _, size in positions.values())
    by_shard = by_shard and most > 1 and blob is None and value.ndim >= 1 and len(value) >= most
    calls = {}
    for eid, (rank, size) in positions.items():
        if by_shard:
            from ..sharding import strided

            mine = f"{digest}:{rank}/{size}"
            if have[eid].get(item.name) != mine:
                part = np.ascontiguousarray(value[strided(len(value), rank, size)])
                calls[eid] = cluster.client[eid].apply_async(engine.receive_value, item.name, mine, part, False,
                                                             (rank, size, len(value)))
                sent["data_bytes"] += part.nbytes
        elif have[eid].get(item.name) != digest:
            payload = value if blob is None else blob
            calls[eid] = cluster.client[eid].apply_async(engine.receive_value, item.name, digest, payload,
                                                         blob is not None)
            sent["data_bytes"] += value.nbytes if blob is None else len(blob)
    _gather(cluster, calls, item)
    if calls:
        sent["names"].append(item.name)
        if by_shard:
            sent["sharded"].append(item.name)


def _gather(cluster, calls: dict, item: Item | None = None) -> dict:
    import ipyparallel as ipp

    out = {}
    for eid, call in calls.items():
        try:
            out[eid] = call.get(timeout=LIMITS.bring_s)
        except ipp.error.RemoteError as exc:
            what = f"`{item.name}` (from cell [{item.cell}])" if item is not None else "nbdist's state"
            raise DefinitionFailed(f"bringing {what} to {cluster.info(eid).label()} failed: {exc.ename}: "
                                   f"{exc.evalue}. Put the cell that defines it under %%distribute define, or "
                                   "install what it imports on that host.") from None
        except TimeoutError:
            raise DefinitionFailed(f"bringing data to {cluster.info(eid).label()} took more than "
                                   f"{LIMITS.bring_s} s.") from None
    return out
