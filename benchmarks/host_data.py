"""One copy of the data per host (issue 34): 4 engines of one host training on the notebook's arrays with batches
on demand, against ipyparallel's own push of the same arrays to each engine, side by side.

nbdist: an unmarked notebook holds all 60,000 Fashion-MNIST samples as float32 (`x`, `y`); a
`%%distribute --strategy nfdt --workers 4` cell trains on them (`--data dynamic`, the default: every worker
needs every sample). The kernel places the arrays once in the host's cache and every engine maps them. While
the run trains, the engines' proportional set sizes of the mapped file (`/proc/PID/smaps`, the mapping's Pss)
are summed: the host's resident data. Anchor: `client[ids].push({"x": x, "y": y})`, a private copy on each
engine, measured as the engines' resident memory it added. Prints a table, then:
    RESULT host_data_copies=<resident data of the mapped arrays / the arrays' bytes, nbdist>
    RESULT push_data_copies=<resident memory the push added / the arrays' bytes, the anchor>

    .venv/bin/python benchmarks/host_data.py [--engines 4]
"""

from __future__ import annotations

import argparse
import time

from common import notebook_shell, print_table
from nbdist.datasets import host_cache
from nbdist.datasets import fashion_mnist

CELL = '''
model = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=64, epochs={epochs}, verbose=0)
'''


def mapped_pss(pid: int, folder: str) -> int:
    """Bytes of `pid`'s proportional set size in mappings of files under `folder`."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) >= 6 and fields[5].startswith(folder)
            elif inside and fields and fields[0] == "Pss:":
                total += int(fields[1]) * 1024
    return total


def resident(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    ip, session = notebook_shell()
    (x, y), _ = fashion_mnist()
    ip.user_ns.update(x=x.astype("float32") / 255, y=y)
    ip.run_cell("import keras")
    data_bytes = ip.user_ns["x"].nbytes + y.nbytes
    print(f"Starting {args.engines} engines; x and y {data_bytes / 1e6:.1f} MB")
    ip.run_line_magic("dist", f"start -n {args.engines}")
    try:
        cluster = session.cluster
        engines = sorted(cluster.ids())
        pids = {eid: cluster.info(eid).pid for eid in engines}
        folder = str(host_cache.folder(cluster.cache_key))
        ip.run_cell_magic("distribute", f"--strategy nfdt --workers {args.engines} --background --progress none",
                          CELL.format(epochs=args.epochs))
        run = session.last_run
        deadline = time.time() + 300
        while time.time() < deadline and not any(p.get("record") for p in run.progress.values()):
            time.sleep(0.5)  # polling the run's published progress, bounded
        placed = {eid: mapped_pss(pid, folder) for eid, pid in pids.items()}
        training_rss = {eid: resident(pid) for eid, pid in pids.items()}
        ip.run_line_magic("dist", "wait")
        held = cluster.cache_holdings()
        before = {eid: resident(pid) for eid, pid in pids.items()}
        cluster.client[engines].push({"x_push": ip.user_ns["x"], "y_push": y}, block=True)
        pushed = {eid: resident(pid) - before[eid] for eid, pid in pids.items()}
    finally:
        ip.run_line_magic("dist", "stop")
    copies, push_copies = sum(placed.values()) / data_bytes, sum(pushed.values()) / data_bytes
    print()
    print_table(["engine", "mapped data Pss MB (nbdist, training)", "RSS MB (training)", "push added MB (anchor)"],
                [[eid, f"{placed[eid] / 1e6:.1f}", f"{training_rss[eid] / 1e6:.0f}", f"{pushed[eid] / 1e6:.1f}"]
                 for eid in engines])
    print(f"the host's cache: {held}; the arrays: {data_bytes / 1e6:.1f} MB")
    print(f"RESULT host_data_copies={copies:.3f}")
    print(f"RESULT push_data_copies={push_copies:.3f}")


if __name__ == "__main__":
    main()
