"""A long run against one real shard: does its memory stay flat however many pushes it applies?

Two client processes push a small MLP-sized gradient (plain SGD, every message signed and
checked) as fast as the shard answers, for `--pushes` pushes in all, while the shard's
resident memory is sampled every `--every` pushes. nbdist: the shard as it runs (a window
of the push log in memory, every entry streamed to a file). Anchor, in the same run: the
same shard keeping its whole log in memory (a window as large as the run), as the shard
did before, for a fifth of the pushes. Prints a table, then:
    RESULT ps_soak_rss_growth_kb_per_1k_pushes=<RSS growth after warm-up, per 1,000 pushes>
    RESULT ps_soak_unbounded_kb_per_1k_pushes=<the same for the whole log kept in memory>

    .venv/bin/python benchmarks/ps_soak.py [--pushes 500000 --values 10000]
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import tempfile
import time

import numpy as np

from common import print_table
from nbdist.ps import launcher, wire
from nbdist.ps.client import PsClient

SGD = {"name": "SGD", "learning_rate": 1e-6}


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def push_loop(address: list[str], key: bytes, rank: int, pushes: int, values: int, done) -> None:
    gradient = {"w": np.full(values, 1e-3, np.float32)}
    with PsClient(address, key, rank) as client:
        version = client.request("pull")[0].header["version"]
        for step in range(pushes):
            version = client.request("push", [gradient], version=version, step=step)[0].header["version"]
            if step % 1000 == 0:
                done[rank] = step
        done[rank] = pushes
        client.request("done")


def soak(pushes: int, values: int, every: int, window: int | None) -> dict:
    """Run `pushes` pushes from 2 clients; the shard's RSS at every `every` pushes applied."""
    key = wire.new_key()
    with tempfile.TemporaryDirectory() as directory:
        config = {"shard": 0, "workers": 2, "log_path": os.path.join(directory, "run-1.pushlog-0.jsonl")}
        if window:
            config["log_window"] = window
        info = launcher.start_shard(config, key)
        address = [f"tcp://127.0.0.1:{info['port']}"]
        with PsClient(address, key, 0) as first:
            first.request("init", [{"w": np.zeros(values, np.float32)}], optimizer=SGD, trainable=["w"])
        done = multiprocessing.Array("q", 2)
        workers = [multiprocessing.Process(target=push_loop, args=(address, key, r, pushes // 2, values, done))
                   for r in range(2)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        samples, next_at, segments = [], 0, 0
        while any(w.is_alive() for w in workers):
            applied = sum(done)
            if applied >= next_at:
                samples.append((applied, rss_kb(info["pid"])))
                segments = max(segments, len(glob.glob(f"/dev/shm/nbdist-ps-{info['pid']}-*")))
                next_at = applied + every
            time.sleep(0.05)  # sampling, not synchronisation: the workers' joins below are the end
        for w in workers:
            w.join(timeout=60)
        seconds = time.perf_counter() - started
        samples.append((sum(done), rss_kb(info["pid"])))
        with PsClient(address, key, "controller", heartbeat=False) as controller:
            stats = controller.request("stats", since=10**12)[0].header
            controller.request("stop")
        launcher.stop_shard(info["pid"])
        log_lines = sum(1 for _ in open(config["log_path"]))
    return {"samples": samples, "seconds": seconds, "applied": stats["counts"]["applied"],
            "log_total": stats["log_total"], "log_lines": log_lines, "segments_max": segments,
            "segments_left": len(glob.glob(f"/dev/shm/nbdist-ps-{info['pid']}-*"))}


def growth_kb_per_1k(samples: list[tuple[int, int]], warm_up: int) -> float:
    """Least-squares slope of RSS against pushes, after `warm_up` pushes, in KB per 1,000 pushes."""
    points = [(n, kb) for n, kb in samples if n >= warm_up]
    n, kb = np.array(points, dtype=float).T
    return float(np.polyfit(n, kb, 1)[0] * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pushes", type=int, default=500_000)
    parser.add_argument("--values", type=int, default=10_000, help="float32 values per gradient")
    parser.add_argument("--every", type=int, default=10_000, help="pushes between two RSS samples")
    args = parser.parse_args()
    from nbdist.ps.push_log import WINDOW

    bounded = soak(args.pushes, args.values, args.every, None)
    anchor_pushes = max(args.pushes // 5, 4 * args.every)
    unbounded = soak(anchor_pushes, args.values, args.every // 5, anchor_pushes)
    warm_up = max(2 * WINDOW, args.pushes // 5)  # the window fills (WINDOW pushes), the allocator settles
    rows = []
    for label, result, warm in (("nbdist (window of the log)", bounded, warm_up),
                                ("whole log in memory (before)", unbounded, anchor_pushes // 4)):
        first, last = result["samples"][0][1], result["samples"][-1][1]
        rows.append([label, f"{result['applied']:,}", f"{result['log_lines']:,}", f"{result['seconds']:.0f}",
                     f"{first / 1024:.0f}", f"{last / 1024:.0f}",
                     f"{growth_kb_per_1k(result['samples'], warm):.2f}"])
        assert result["applied"] == result["log_total"] == result["log_lines"], result  # nothing lost
    series = [(n, kb) for n, kb in bounded["samples"] if n % (5 * args.every) < args.every]
    print("nbdist shard RSS (MB) by pushes applied: " + ", ".join(f"{n // 1000}k {kb / 1024:.1f}" for n, kb in series))
    print(f"slope after {2 * WINDOW:,} pushes (the window full): "
          f"{growth_kb_per_1k(bounded['samples'], 2 * WINDOW):.2f} KB per 1k pushes")
    print_table(["shard", "pushes applied", "log file lines", "s", "RSS start MB", "RSS end MB",
                 "KB per 1k pushes after warm-up"], rows)
    print(f"shared-memory segments of the shard and its clients (the same-host path): at most {bounded['segments_max']} "
          f"during the run, {bounded['segments_left']} after it (NBDIST_PS_SAME_HOST=0: none, signed TCP)")
    print(f"RESULT ps_soak_rss_growth_kb_per_1k_pushes={float(rows[0][-1]):.2f}")
    print(f"RESULT ps_soak_unbounded_kb_per_1k_pushes={float(rows[1][-1]):.2f}")


if __name__ == "__main__":
    main()
