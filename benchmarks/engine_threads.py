"""4 nfdt workers on one host with each engine's share of its cores against TensorFlow's default threads.

Two fresh 4-engine clusters on this machine, started before either trains (an engine's TensorFlow keeps
the threads it started with): the notebook connects to one with `%dist connect` (nbdist's default:
each engine's intra-op and inter-op threads set to cores / engines of the host, at least 1) and to the
other with `--threads off` (TensorFlow's default: as many of each as the host has cores, per engine),
and runs the same `--strategy nfdt --workers 4` cell (plain SGD) on each, `--rounds` times, alternating which goes
first. The cluster's samples/s: the samples every worker trained in its epochs 2+ (epoch 1 traces), over
the wall-clock window from the first of those epochs' start to the last one's end, all workers
together (one machine, one clock). Beside it, per side: the threads read back from the engines, the
OS threads of an engine process, how many cores the workers kept busy (their CPU seconds over the
cell's wall time), and their involuntary context switches. Prints a table, then:
    RESULT threads_vs_unpinned_4_engines=<pinned cluster samples/s / unpinned, median of per-round ratios>

    .venv/bin/python benchmarks/engine_threads.py [--samples 20000 --epochs 3 --rounds 5 --engines 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import textwrap
import time
import uuid

from common import DEFINITION, notebook_shell, print_table

# Plain SGD: with 4 asynchronous workers, momentum 0.9 plus the staleness would pass 0.95 (nbdist warns).
OPTIMIZER = "keras.optimizers.SGD(0.05)"
SIDES = {"pinned": "", "unpinned": "--threads off"}  # the %dist connect options of each side
# Each worker's epochs on the wall clock, so the workers' epochs 2+ are counted over the window they shared.
EPOCH_CLOCK = textwrap.dedent('''
    class EpochClock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.spans = []
        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.time()
        def on_epoch_end(self, epoch, logs=None):
            self.spans.append((self._t, time.time()))
''')
CELL = textwrap.dedent('''
    model = build()
    model.compile(optimizer={optimizer}, loss="sparse_categorical_crossentropy")
    clock = EpochClock()
    history = model.fit(x, y, batch_size=64, epochs={epochs}, callbacks=[clock], verbose=0)
''')


def start_cluster(n: int):
    """A fresh local cluster with nbdist's heartbeats; nothing has run on its engines yet."""
    import ipyparallel as ipp

    from nbdist.cluster.cluster import HEARTBEAT_ARGS

    cluster = ipp.Cluster(n=n, cluster_id=f"nbdist-threads-{uuid.uuid4().hex[:8]}",
                          controller_args=list(HEARTBEAT_ARGS), log_level=30)
    client = cluster.start_and_connect_sync()
    client.wait_for_engines(n, timeout=300)
    client.close()
    return cluster


def one_run(ip, session, cluster, side: str, args) -> dict:
    """Connect to this side's cluster, train the cell on its workers, disconnect; what the table needs."""
    import psutil

    ip.run_line_magic("dist", f"connect --cluster-id {cluster.cluster_id} {SIDES[side]}")
    try:
        rows = session.cluster.inventory()
        processes = [psutil.Process(info.pid) for info, _ in rows]
        switches = [p.num_ctx_switches().involuntary for p in processes]
        cpu = [sum(p.cpu_times()[:2]) for p in processes]
        t0 = time.time()
        ip.run_cell_magic("distribute", f"--strategy nfdt --workers {args.engines} --progress none",
                          CELL.format(epochs=args.epochs, optimizer=OPTIMIZER))
        wall = time.time() - t0
        cpu_s = sum(sum(p.cpu_times()[:2]) - c for p, c in zip(processes, cpu))
        run = session.last_run
        if run.status != "done":
            raise RuntimeError(f"the {side} run ended {run.status}: {run.error}")
        spans = session.cluster.client[run.workers].pull("clock.spans", block=True)
        steady = [span for worker in spans for span in worker[1:]]
        window = max(end for _, end in steady) - min(begin for begin, _ in steady)
        return {"samples_per_s": len(steady) * (args.samples // len(run.workers)) / window, "wall": wall,
                "threads": sorted({info.threads for info, _ in rows}),
                "os_threads": statistics.median(p.num_threads() for p in processes),
                "cores_busy": cpu_s / wall,
                "switches": statistics.median(p.num_ctx_switches().involuntary - s
                                              for p, s in zip(processes, switches))}
    finally:
        ip.run_line_magic("dist", "stop")  # disconnects: the engines keep their TensorFlow, and its threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds (this machine is noisy: the ratio is the median of the rounds')")
    parser.add_argument("--engines", type=int, default=4, help="engines (= nfdt workers) per side")
    args = parser.parse_args()

    print(f"Starting two {args.engines}-engine clusters; {args.samples} Fashion-MNIST samples, {args.epochs} "
          f"epochs, batch 64 per worker, --strategy nfdt --workers {args.engines}")
    clusters = {}
    try:
        for side in SIDES:
            clusters[side] = start_cluster(args.engines)
        ip, session = notebook_shell()
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples) + EPOCH_CLOCK)
        rounds = []
        for r in range(args.rounds):  # alternate which side goes first, so drift hits both alike
            order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
            rounds.append({side: one_run(ip, session, clusters[side], side, args) for side in order})
            rounds[-1]["load"] = os.getloadavg()[0]  # other tenants of the machine show up here
    finally:
        for cluster in clusters.values():
            cluster.stop_cluster_sync()

    def median(side, key):
        return statistics.median(r[side][key] for r in rounds)

    ratio = statistics.median(r["pinned"]["samples_per_s"] / r["unpinned"]["samples_per_s"] for r in rounds)
    print()
    print_table(["measure", "pinned (nbdist's share)", "unpinned (--threads off)", "ratio"], [
        ["TensorFlow threads per engine, intra/inter", ", ".join(rounds[0]["pinned"]["threads"]),
         ", ".join(rounds[0]["unpinned"]["threads"]), "-"],
        ["cluster samples/s (epochs 2+, all workers), median round", f"{median('pinned', 'samples_per_s'):,.0f}",
         f"{median('unpinned', 'samples_per_s'):,.0f}", f"{ratio:.3f}"],
        ["wall time of the training cell, s, median", f"{median('pinned', 'wall'):.2f}",
         f"{median('unpinned', 'wall'):.2f}", f"{median('unpinned', 'wall') / median('pinned', 'wall'):.3f}"],
        ["OS threads of an engine process, median", f"{median('pinned', 'os_threads'):.0f}",
         f"{median('unpinned', 'os_threads'):.0f}", "-"],
        ["cores the workers kept busy (CPU s / cell s), median", f"{median('pinned', 'cores_busy'):.2f}",
         f"{median('unpinned', 'cores_busy'):.2f}", "-"],
        ["involuntary context switches per worker per run", f"{median('pinned', 'switches'):,.0f}",
         f"{median('unpinned', 'switches'):,.0f}", "-"],
    ])
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: pinned {r['pinned']['samples_per_s']:,.0f} samples/s, unpinned "
              f"{r['unpinned']['samples_per_s']:,.0f} samples/s, ratio "
              f"{r['pinned']['samples_per_s'] / r['unpinned']['samples_per_s']:.3f} (load average after it "
              f"{r['load']:.1f})")
    print(f"RESULT threads_vs_unpinned_4_engines={ratio:.3f}")


if __name__ == "__main__":
    main()
