"""Many clients against two real shards: every push acknowledged is applied, none lost, no deadlock.

`--clients` processes (each a PsClient, as a worker is) push a gradient split over 2 shard
processes `--pushes` times each, as fast as the shards answer, and time every push-pull.
The anchor is the count itself: on every shard, applied == acknowledged == pushes sent.
Prints a table, then:
    RESULT ps_load_lost=<pushes sent minus pushes applied, over both shards>
    RESULT ps_load_p50_ms=<median push-pull latency>
    RESULT ps_load_p99_ms=<99th percentile push-pull latency>

    .venv/bin/python benchmarks/ps_load.py [--clients 32 --pushes 1000 --values 20000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

import numpy as np

from common import print_table
from nbdist.ps import launcher, wire
from nbdist.ps.client import PsClient
from nbdist.ps.partition import partition

SGD = {"name": "SGD", "learning_rate": 1e-6}
JOIN_TIMEOUT_S = 600


def client_loop(addresses, key, rank, pushes, values, plan, out) -> None:
    gradient = {"a": np.full(values // 2, 1e-3, np.float32), "b": np.full(values - values // 2, 1e-3, np.float32)}
    per_shard = [{name: gradient[name] for name in shard} for shard in plan]
    seconds = []
    with PsClient(addresses, key, rank) as client:
        versions = [r.header["version"] for r in client.request("pull")]
        for step in range(pushes):
            started = time.perf_counter()
            replies = client.request("push", per_shard, fields_per_shard=[{"version": v} for v in versions], step=step)
            seconds.append(time.perf_counter() - started)
            versions = [r.header["version"] for r in replies]
        client.request("done")
        out.put((rank, (seconds, all(route is not None for route in client.local))))


def load(clients: int, pushes: int, values: int) -> dict:
    key = wire.new_key()
    shards = [launcher.start_shard({"shard": i, "workers": clients}, key) for i in range(2)]
    addresses = [f"tcp://127.0.0.1:{s['port']}" for s in shards]
    plan = partition({"a": values // 2, "b": values - values // 2}, 2)
    try:
        with PsClient(addresses, key, 0, heartbeat=False) as first:
            variables = {"a": np.zeros(values // 2, np.float32), "b": np.zeros(values - values // 2, np.float32)}
            first.request("init", [{n: variables[n] for n in shard} for shard in plan], optimizer=SGD,
                          trainable=list(variables))
        out = multiprocessing.Queue()
        workers = [multiprocessing.Process(target=client_loop, args=(addresses, key, r, pushes, values, plan, out))
                   for r in range(clients)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        results = dict(out.get(timeout=JOIN_TIMEOUT_S) for _ in workers)  # bounded: a deadlock fails here
        same_host = [local for _, local in results.values()]
        results = {rank: seconds for rank, (seconds, _) in results.items()}
        seconds = time.perf_counter() - started
        for w in workers:
            w.join(timeout=60)
        with PsClient(addresses, key, "controller", heartbeat=False) as controller:
            stats = [m.header for m in controller.request("stats", since=10**12)]
            controller.request("stop")
    finally:
        for s in shards:
            launcher.stop_shard(s["pid"])
    latencies = np.concatenate([np.asarray(v) for v in results.values()]) * 1000
    return {"stats": stats, "sent": clients * pushes, "latencies_ms": latencies, "seconds": seconds,
            "clients_done": len(results), "same_host": sum(same_host)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--pushes", type=int, default=1000)
    parser.add_argument("--values", type=int, default=20_000, help="float32 values per gradient, over 2 shards")
    args = parser.parse_args()
    result = load(args.clients, args.pushes, args.values)
    rows, lost = [], 0
    for shard in result["stats"]:
        counts = shard["counts"]
        lost += result["sent"] - counts["applied"]
        rows.append([str(shard["shard"]), f"{result['sent']:,}", f"{counts['acked']:,}", f"{counts['applied']:,}",
                     f"{counts['rejected']}", str(shard["version"])])
    print_table(["shard", "pushes sent", "acknowledged", "applied", "rejected", "version"], rows)
    latencies = result["latencies_ms"]
    p50, p99 = np.percentile(latencies, [50, 99])
    print(f"{args.clients} clients x {args.pushes} pushes of {args.values:,} float32 in {result['seconds']:.1f} s "
          f"({result['sent'] / result['seconds']:,.0f} push-pulls/s); latency p50 {p50:.2f} ms, "
          f"p90 {np.percentile(latencies, 90):.2f} ms, p99 {p99:.2f} ms, max {latencies.max():.2f} ms")
    acked_equals_applied = all(s["counts"]["acked"] == s["counts"]["applied"] for s in result["stats"])
    print(f"clients on the same-host path (shared memory, Unix socket): {result['same_host']} of {args.clients}"
          " (NBDIST_PS_SAME_HOST=0: none, signed TCP)")
    print(f"RESULT ps_load_lost={lost}")
    print(f"RESULT ps_load_p50_ms={p50:.2f}")
    print(f"RESULT ps_load_p99_ms={p99:.2f}")
    sys.exit(0 if lost == 0 and acked_equals_applied and result["clients_done"] == args.clients else 1)


if __name__ == "__main__":
    main()
