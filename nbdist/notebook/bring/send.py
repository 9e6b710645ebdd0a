"""Sending a bring plan to the engines: only what each lacks, identified by content digest.

Code and imports are replayed as definition cells are (`namespace.run_definition`, keyed
``bring:<name>``); values are sent once and kept, so an unchanged re-run sends nothing.
Where the strategy shards arrays by stride (`Strategy.array_shards`), an array the cell
reads only as `fit`'s data reaches each worker as its own shard.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ...datasets import host_cache
from ...host import namespace
from ...errors import DefinitionFailed, OptionError
from ...limits import LIMITS
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
         positions: dict[int, tuple[int, int]] | None = None, digests: dict | None = None) -> dict:
    """Bring `items` to `workers` (in rank order); `shard_names`: arrays each rank gets only its shard of;
    `positions`: engine -> (rank, size) where not its place in `workers` (an engine joining a running run);
    `digests`: the values an earlier part of the same plan sent (statements that remake a value from them run
    again when they changed). Returns {"names": [...], "data_bytes": n, "sharded": [...], "digests": {...}},
    what was actually sent and the digest of every value of the plan so far."""
    positions = positions or {eid: (rank, len(workers)) for rank, eid in enumerate(workers)}
    client = cluster.client
    sent = {"names": [], "data_bytes": 0, "sharded": [], "digests": dict(digests or {})}
    imports = [i for i in items if i.kind == "import"]
    values = [i for i in items if i.kind == "value" and not i.after_code]
    code = [i for i in items if i.kind == "code"]
    _refuse_unseen_files(code, cluster, workers)
    _replay(imports, cluster, workers, sent)
    _send_values(values, cluster, workers, positions, shard_names, sent)
    _replay(code, cluster, workers, sent, sent["digests"])
    _send_values([i for i in items if i.kind == "value" and i.after_code], cluster, workers, positions, shard_names,
                 sent)  # (Keras objects of the notebook's own classes, rebuilt by the class's name)
    return sent


def _send_values(values: list[Item], cluster, workers: list[int], positions: dict, shard_names: set[str],
                 sent: dict) -> None:
    if not values:
        return
    client = cluster.client
    have = _gather(cluster, {eid: client[eid].apply_async(namespace.value_digests) for eid in workers})
    for item in values:
        sent["digests"][item.name] = _send_value(item, cluster, positions, have, item.name in shard_names, sent)


def _replay(items: list[Item], cluster, workers: list[int], sent: dict, digests: dict | None = None) -> None:
    """Run imports and code on the engines that do not have them yet. Statements that remade a value
    (`Item.remade`) run again when what they read changed: their digest holds what came before them."""
    if not items:
        return
    client = cluster.client
    have = _gather(cluster, {eid: client[eid].apply_async(namespace.definition_digests) for eid in workers})
    before = "".join(f"{name}={digest};" for name, digest in sorted((digests or {}).items()))
    for item in items:
        key = f"bring:{item.name}"
        digest = hashlib.sha256(((before if item.remade else "") + item.source).encode()).hexdigest()[:16]
        if item.fresh:  # a generator is used up by one run: made again for every run
            digest += os.urandom(4).hex()
        if item.remade:
            before += f"{item.name}={digest};"
        calls = {eid: client[eid].apply_async(namespace.run_definition, key, digest, item.source,
                                              f"brought {item.name}", os.getcwd(), random_state=item.random_state)
                 for eid in workers if have[eid].get(key) != digest}
        _gather(cluster, calls, item)
        if calls:
            sent["names"].append(item.name)
    return sent


def _refuse_unseen_files(code: list[Item], cluster, workers: list[int]) -> None:
    """A cell replayed on an engine that reads files of this host the engine cannot see is refused by name."""
    paths = sorted({p for item in code for p in item.paths})
    if not paths:
        return
    seen = _gather(cluster, {eid: cluster.client[eid].apply_async(namespace.paths_exist, paths) for eid in workers})
    for eid in workers:
        missing = [p for p, there in zip(paths, seen[eid]) if not there]
        if missing:
            item = next(i for i in code if missing[0] in i.paths)
            raise OptionError(
                f"`{item.name}` is made in cell [{item.cell}] from {missing[0]}, a file of this host that "
                f"{cluster.info(eid).label()} cannot see, so that engine cannot make its own. Put the data where "
                "every host sees it (a shared file system, the same path on each host), or read it into arrays in "
                "a cell (nbdist sends arrays to the engines, each worker its shard).")


def _send_value(item: Item, cluster, positions: dict[int, tuple[int, int]], have: dict, by_shard: bool,
                sent: dict) -> str:
    value = item.value
    digest, blob = digest_of(value)
    most = max(size for _, size in positions.values())
    by_shard = by_shard and most > 1 and blob is None and value.ndim >= 1 and len(value) >= most
    if blob is None and not by_shard:
        _place_by_host(item, digest, cluster, [e for e in positions if have[e].get(item.name) != digest], sent)
        return digest
    calls = {}
    for eid, (rank, size) in positions.items():
        if by_shard:
            from ...datasets.sharding import strided

            mine = f"{digest}:{rank}/{size}"
            if have[eid].get(item.name) != mine:
                part = np.ascontiguousarray(value[strided(len(value), rank, size)])
                calls[eid] = cluster.client[eid].apply_async(namespace.receive_value, item.name, mine, part, False,
                                                             (rank, size, len(value)))
                sent["data_bytes"] += part.nbytes
        elif have[eid].get(item.name) != digest:
            payload = value if blob is None else blob
            calls[eid] = cluster.client[eid].apply_async(namespace.receive_value, item.name, digest, payload,
                                                         blob is not None)
            sent["data_bytes"] += value.nbytes if blob is None else len(blob)
    _gather(cluster, calls, item)
    if calls:
        sent["names"].append(item.name)
        if by_shard:
            sent["sharded"].append(item.name)
    return digest


def _place_by_host(item: Item, digest: str, cluster, engines: list[int], sent: dict) -> None:
    """An array sent whole: one copy per host (`host_cache`). The kernel places it itself on its own host; on
    another, the first engine that needs it receives it and places it; the host's other engines map it."""
    if not engines:
        return
    by_host: dict[str, list[int]] = {}
    for eid in engines:
        by_host.setdefault(cluster.machine_of(eid), []).append(eid)
    client, cache = cluster.client, cluster.cache_key
    for machine, eids in by_host.items():
        if cluster.is_local(eids[0]):
            host_cache.place(cache, digest, item.value)
            first = []
        else:
            first = eids[:1]
            _gather(cluster, {first[0]: client[first[0]].apply_async(namespace.receive_value, item.name, digest,
                                                                     item.value, False, None, cache)}, item)
            sent["data_bytes"] += item.value.nbytes
        mapped = _gather(cluster, {eid: client[eid].apply_async(namespace.map_value, item.name, digest, cache)
                                   for eid in eids if eid not in first}, item)
        for eid in [e for e, ok in mapped.items() if not ok]:  # its host's cache lost the file: sent to it
            _gather(cluster, {eid: client[eid].apply_async(namespace.receive_value, item.name, digest, item.value,
                                                           False, None, cache)}, item)
            sent["data_bytes"] += item.value.nbytes
    sent["names"].append(item.name)


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
