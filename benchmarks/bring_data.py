"""Bringing a notebook's data to 4 engines (issue 19) against ipyparallel's own push, side by side.

nbdist: what `%%distribute --strategy nfdt --workers 4` brings for a cell that trains on the
notebook's `x, y` (all 60,000 Fashion-MNIST samples, float32): each engine its strided
shard, identified by content digest; then the same again (an unchanged re-run). Anchor:
`client[ids].push({"x": x, "y": y})`, what a `%%px` user does, a full copy to every engine.
Prints a table, then:
    RESULT bring_vs_push_time=<nbdist seconds over push seconds, first send>
    RESULT bring_rerun_bytes=<bytes an unchanged re-run sends>

    .venv/bin/python benchmarks/bring_data.py [--engines 4 --rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import notebook_shell, print_table
from nbdist.notebook import bring
from nbdist.notebook.bring.names import fit_array_names
from nbdist.datasets import fashion_mnist

CELL = "model.fit(x, y, batch_size=64)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ip, session = notebook_shell()
    (x, y), _ = fashion_mnist()
    ip.user_ns.update(x=x.astype("float32") / 255, y=y)
    print(f"Starting {args.engines} engines; x {ip.user_ns['x'].nbytes / 1e6:.0f} MB, y {y.nbytes / 1e6:.2f} MB")
    ip.run_line_magic("dist", f"start -n {args.engines}")
    try:
        cluster = session.cluster
        workers = sorted(cluster.ids())
        rows = []
        for _ in range(args.rounds):
            ip.user_ns["x"] = ip.user_ns["x"].copy()
            ip.user_ns["x"][0, 0, 0] += 1e-3  # new content: the engines must receive it again
            items = session.bring_plan(CELL)
            t0 = time.perf_counter()
            first = bring.send(items, cluster, workers, fit_array_names(CELL))
            t1 = time.perf_counter()
            again = bring.send(session.bring_plan(CELL), cluster, workers, fit_array_names(CELL))
            t2 = time.perf_counter()
            cluster.client[workers].push({"x_push": ip.user_ns["x"], "y_push": y}, block=True)
            t3 = time.perf_counter()
            rows.append({"bring_s": t1 - t0, "bring_bytes": first["data_bytes"], "rerun_s": t2 - t1,
                         "rerun_bytes": again["data_bytes"], "push_s": t3 - t2,
                         "push_bytes": len(workers) * (ip.user_ns["x"].nbytes + y.nbytes)})
            cluster.client[workers].execute("del x_push, y_push", block=True)
    finally:
        ip.run_line_magic("dist", "stop")

    def median(key):
        return statistics.median(r[key] for r in rows)

    print()
    print_table(["measure", "nbdist bring", "ipyparallel push", "ratio"], [
        ["seconds, first send (median)", f"{median('bring_s'):.2f}", f"{median('push_s'):.2f}",
         f"{median('bring_s') / median('push_s'):.3f}"],
        ["MB sent, first send", f"{median('bring_bytes') / 1e6:.0f}", f"{median('push_bytes') / 1e6:.0f}",
         f"{median('bring_bytes') / median('push_bytes'):.3f}"],
        ["seconds / MB, unchanged re-run", f"{median('rerun_s'):.2f} / {median('rerun_bytes') / 1e6:.0f}", "-", "-"],
    ])
    print(f"RESULT bring_vs_push_time={median('bring_s') / median('push_s'):.3f}")
    print(f"RESULT bring_rerun_bytes={int(median('rerun_bytes'))}")


if __name__ == "__main__":
    main()
