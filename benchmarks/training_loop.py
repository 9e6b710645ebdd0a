"""A cell's own training loop (keras.io's guide, its `tf.function` form) under nbdist against its anchors, paired
epoch by epoch in one run: under `--strategy local` and `nfdt` (1 worker) against the same loop in a plain Python
process, under `hfdt` (2 workers) against the same loop written for Horovod (`hvd.DistributedGradientTape`,
`hvd.broadcast_variables`) under `horovodrun --gloo`. Every side computes with the engines' TensorFlow thread pools.

Both sides stay warm for the whole run (the engines; one plain process and one horovodrun job, each told through a
pipe when to train a slice), and they take turns by the epoch: in a slice, nbdist's epoch 1, the anchor's epoch 1,
nbdist's epoch 2, ... (each process's `bench_turn()`, after its epoch's timer stopped, waits for its next turn), so
the two epochs of a pair meet the same moments of a shared machine, a fraction of a second apart. Each slice gives
one ratio: the median over its timed epochs (all but the first, which on the nbdist side traces the step) of
nbdist's samples/s in epoch k over the anchor's in its epoch k. The headline is the median of the slices' ratios,
with their interquartile range. Prints a table and every slice, then:
    RESULT loop_local_vs_plain=<median slice>          RESULT loop_local_vs_plain_iqr=<q1>-<q3>
    RESULT loop_hfdt_vs_horovod_tape=<median slice>    RESULT loop_hfdt_vs_horovod_tape_iqr=<q1>-<q3>
    RESULT loop_nfdt1_vs_plain=<median slice>          RESULT loop_nfdt1_vs_plain_iqr=<q1>-<q3>
and with `--pairs` naming them, `loop_local_vs_engine` (nbdist local over the same loop sent to another engine with
`client.execute`, no nbdist: what nbdist adds in an engine), `loop_engine_vs_plain` (that engine over the plain
process: what the engine process costs) and `loop_plain_vs_plain` (two plain processes: the method's own noise).

    .venv/bin/python benchmarks/training_loop.py [--samples 20000 --epochs 8 --alternations 11 --pairs local,hfdt,nfdt1]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from common import engine_threads, notebook_shell, print_table, steady_samples_per_s

# the guide's set-up and tf.function step (its model, Adam, batches of 64), on Fashion-MNIST read offline
SETUP = textwrap.dedent('''
    import time
    import tensorflow as tf
    import keras
    import numpy as np
    from nbdist.datasets import fashion_mnist

    def get_model():
        inputs = keras.Input(shape=(784,), name="digits")
        x1 = keras.layers.Dense(64, activation="relu")(inputs)
        x2 = keras.layers.Dense(64, activation="relu")(x1)
        outputs = keras.layers.Dense(10, name="predictions")(x2)
        return keras.Model(inputs=inputs, outputs=outputs)

    keras.utils.set_random_seed(0)
    model = get_model()
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
    batch_size = 64
    epochs = {epochs}
    (x_train, y_train), _ = fashion_mnist(limit={samples})
    x_train = np.reshape(x_train, (-1, 784)).astype("float32") / 255
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024).batch(batch_size)
''')
STEP = textwrap.dedent('''
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        train_acc_metric.update_state(y, logits)
        return loss_value
''')
# the training cell: the guide's loop, each epoch timed; then (untimed) the other side's turn
LOOP = textwrap.dedent('''
    seconds = []
    for epoch in range(epochs):
        start_time = time.perf_counter()
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = train_step(x_batch_train, y_batch_train)
        float(loss_value)
        train_acc_metric.reset_state()
        seconds.append(time.perf_counter() - start_time)
        bench_turn()
''')
# The pairing, in every process of both sides: after an epoch, say so (`done-<pid>`) and wait for this process's
# next turn (`go-<pid>`); both pipes exist only while a paired slice runs (a warm-up slice runs straight through).
TURN = textwrap.dedent('''
    def bench_turn():
        import os
        done = os.path.join({turns!r}, f"done-{{os.getpid()}}")
        if not os.path.exists(done):
            return
        with open(done, "w") as pipe:
            pipe.write("1")
        with open(os.path.join({turns!r}, f"go-{{os.getpid()}}")) as pipe:
            pipe.read()
''')

# the same loop as Horovod's documentation writes it (its core ops: horovod.keras does not work with Keras 3; Keras 3's
# variables hold TensorFlow's in `.value`, and Horovod's tape and broadcast need those, horovod#4290)
HOROVOD_SETUP = textwrap.dedent('''
    import horovod.tensorflow as hvd

    hvd.init()
    per_rank = int(train_dataset.cardinality()) // hvd.size()
    train_dataset = train_dataset.shard(hvd.size(), hvd.rank()).take(per_rank)
    optimizer.learning_rate = 1e-3 * hvd.size()
    first_batch = True

    @tf.function
    def train_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, [v.value for v in model.trainable_weights])
        optimizer.apply(grads, model.trainable_weights)
        if first_batch:
            hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
            hvd.broadcast_variables([v.value for v in optimizer.variables], root_rank=0)
        train_acc_metric.update_state(y, logits)
        return loss_value
''')
HOROVOD_LOOP = textwrap.dedent('''
    seconds = []
    for epoch in range(epochs):
        start_time = time.perf_counter()
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = train_step(x_batch_train, y_batch_train, first_batch)
            first_batch = False
        float(loss_value)
        train_acc_metric.reset_state()
        seconds.append(time.perf_counter() - start_time)
        bench_turn()
''')

# A warm anchor: set up once, say its pid, then one slice of `epochs` epochs per line read from its pipe (`go<rank>`
# in NBDIST_BENCH_DIR); rank 0 prints the slice's epoch seconds after "@@".
SERVE = textwrap.dedent('''
    import json, os
    _rank = {rank}
    print(f"@@pid {{os.getpid()}}", flush=True)
    _loop = compile({loop!r}, "<the loop>", "exec")
    with open(os.path.join(os.environ["NBDIST_BENCH_DIR"], f"go{{_rank}}")) as _commands:
        for _line in _commands:
            if not _line.strip().isdigit():
                break
            epochs = int(_line)
            exec(_loop, globals())
            if _rank == 0:
                print("@@" + json.dumps(seconds), flush=True)
''')

# the loop on an engine without nbdist (`client.execute`), in a namespace of its own
ENGINE_DEFINE = "__bench_loop__ = {{}}\nexec({source!r}, __bench_loop__)\n"
ENGINE_SLICE = ("__bench_loop__['epochs'] = {epochs}\nexec({loop!r}, __bench_loop__)\n"
                "__bench_seconds__ = __bench_loop__['seconds']\n")
TIMEOUT_S = 300  # the longest a side may take for one epoch (or to start) before the run fails


class WarmScript:
    """`script` (set-up, step, TURN and SERVE) run once behind `launcher` (none, or horovodrun with `ranks` ranks),
    kept alive; `start(epochs)` starts a slice on every rank, `result()` returns rank 0's epoch seconds."""

    def __init__(self, launcher: list[str], script: str, ranks: int, env: dict):
        self.ranks = ranks
        self.dir = tempfile.mkdtemp(prefix="nbdist-loop-bench-")
        path = Path(self.dir) / "script.py"
        path.write_text(script)
        for rank in range(ranks):
            os.mkfifo(Path(self.dir) / f"go{rank}")
        self.process = subprocess.Popen([*launcher, sys.executable, "-u", str(path)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, **env, "NBDIST_BENCH_DIR": self.dir},
                                        start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.pid_lines: queue.Queue = queue.Queue()
        self.tail: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.pipes = [self._open(Path(self.dir) / f"go{rank}") for rank in range(ranks)]
        self.pids = [self._get(self.pid_lines, "said no pid") for _ in range(ranks)]

    def _read(self) -> None:
        for line in self.process.stdout:
            self.tail = (self.tail + [line])[-60:]
            if "@@pid " in line:
                self.pid_lines.put(int(line.split("@@pid ", 1)[1]))
            elif "@@" in line:
                self.lines.put(line.split("@@", 1)[1])
        self.lines.put(None)
        self.pid_lines.put(None)

    def _get(self, lines: queue.Queue, what: str):
        try:
            value = lines.get(timeout=TIMEOUT_S)
        except queue.Empty:
            value = None
        if value is None:
            raise RuntimeError(self._failure(what))
        return value

    def _open(self, fifo: Path):
        """The rank's pipe, once the rank opened it (a rank that died first: an error, not a hang)."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.set_blocking(fd, True)
                return os.fdopen(fd, "w", buffering=1)
            except OSError:  # ENXIO: no reader yet
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(self._failure("did not start")) from None
                time.sleep(0.05)

    def start(self, epochs: int) -> None:
        for pipe in self.pipes:
            pipe.write(f"{epochs}\n")

    def result(self) -> list[float]:
        return json.loads(self._get(self.lines, "gave no result"))

    def alive(self) -> bool:
        return self.process.poll() is None

    def _failure(self, what: str) -> str:
        return f"the warm anchor {what} (exit {self.process.poll()}):\n{''.join(self.tail)[-4000:]}"

    def close(self) -> None:
        for pipe in getattr(self, "pipes", []):
            try:
                pipe.write("quit\n")
                pipe.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Turns:
    """The epoch-by-epoch pairing of a slice: the processes of side A (`a_pids`, started by the caller) and of side B
    (`b_pids`, started by `start_b` once A's first epoch ended) take turns, A first, one epoch each; after both sides'
    last epoch both go on (their cells end). Run `pair` in a thread beside the one that runs side A."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="nbdist-loop-turns-")
        self.error: BaseException | None = None

    def open(self, pids) -> None:
        for pid in pids:
            for kind in ("done", "go"):
                os.mkfifo(Path(self.dir) / f"{kind}-{pid}")

    def close_slice(self, pids) -> None:
        for pid in pids:
            for kind in ("done", "go"):
                Path(self.dir, f"{kind}-{pid}").unlink(missing_ok=True)

    def pair(self, a_pids, b_pids, epochs: int, start_b, alive) -> None:
        try:
            for epoch in range(epochs):
                self._wait_done(a_pids, alive)
                if epoch == 0:
                    start_b()
                else:
                    self._release(b_pids, alive)
                self._wait_done(b_pids, alive)
                if epoch < epochs - 1:
                    self._release(a_pids, alive)
            self._release(a_pids, alive)
            self._release(b_pids, alive)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller; the sides are let go
            self.error = exc
            self._let_go(a_pids + b_pids)

    def _wait_done(self, pids, alive) -> None:
        for pid in pids:
            fd = os.open(Path(self.dir) / f"done-{pid}", os.O_RDONLY | os.O_NONBLOCK)
            try:
                deadline = time.monotonic() + TIMEOUT_S
                while True:
                    ready, _, _ = select.select([fd], [], [], 0.5)
                    if ready and os.read(fd, 16):
                        break
                    if not alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"process {pid} did not end its epoch")
            finally:
                os.close(fd)

    def _release(self, pids, alive) -> None:
        for pid in pids:
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                try:
                    fd = os.open(Path(self.dir) / f"go-{pid}", os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError:  # ENXIO: not waiting yet
                    if not alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"process {pid} did not wait for its turn") from None
                    time.sleep(0.001)
            os.close(fd)  # the reader sees the end of the pipe: its turn

    def _let_go(self, pids) -> None:
        """After a failure: no process waits for a turn any more."""
        self.close_slice(pids)
        for pid in pids:
            for _ in range(3):
                try:
                    os.close(os.open(Path(self.dir) / f"go-{pid}", os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    break

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, statistics.median(values), q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=8,
                        help="epochs per slice and side, taken in turns (the first is not timed)")
    parser.add_argument("--alternations", type=int, default=11,
                        help="slices per comparison (at least 9): the ratio is their median")
    parser.add_argument("--save", metavar="PATH", help="also write every slice's epoch seconds (JSON) there")
    parser.add_argument("--pairs", default="local,hfdt,nfdt1",
                        help="which comparisons (comma-separated): local, hfdt, nfdt1, and the diagnostics "
                             "local_engine, engine_plain, plain_plain")
    args = parser.parse_args()
    if args.alternations < 9:
        parser.error("--alternations: at least 9")
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the first is not timed)")
    order = [p.strip() for p in args.pairs.split(",") if p.strip()]
    known = ("local", "hfdt", "nfdt1", "local_engine", "engine_plain", "plain_plain")
    if set(order) - set(known):
        parser.error(f"--pairs: one of {', '.join(known)}")
    batches = -(-args.samples // 64)
    samples = {1: args.samples, 2: (batches // 2) * 2 * 64}  # what one epoch trains (2 workers: equal shards)
    ip, session = notebook_shell()
    print(f"keras.io's tf.function loop: {args.samples} Fashion-MNIST samples, batch 64, slices of {args.epochs} "
          f"epochs a side in turns, {args.alternations} slices a comparison; load average {os.getloadavg()[0]:.2f} "
          "at the start")
    horovodrun = [str(Path(sys.executable).with_name("horovodrun")), "-np", "2", "-H", "localhost:2", "--gloo",
                  "--network-interface", "lo"]
    setup = SETUP.format(samples=args.samples, epochs=args.epochs)
    turns = Turns()
    turn = TURN.format(turns=turns.dir)
    anchors: dict[str, WarmScript] = {}
    loads: list[float] = []
    raw: dict[str, list[dict]] = {}  # every slice's epoch seconds, for --save
    pids: dict[int, int] = {}  # engine id -> pid

    class Nbdist:  # a side run by a training cell (side A: in this thread)
        def __init__(self, line: str, targets: list[int], workers: int):
            self.line, self.targets, self.workers = f"{line} --targets {','.join(map(str, targets))}", targets, workers

        def pids(self):
            return [pids[e] for e in self.targets]

        def run(self) -> list[float]:
            ip.user_ns["seconds"] = None
            ip.run_cell_magic("distribute", f"{self.line} --progress none", LOOP)
            if not ip.user_ns.get("seconds"):
                raise RuntimeError(f"%%distribute {self.line} did not train (see above)")
            return ip.user_ns["seconds"]

        def alive(self):
            return True

    class Anchor:  # a warm script (side B, or side A run here)
        def __init__(self, name: str, workers: int):
            self.name, self.workers = name, workers

        def pids(self):
            return anchors[self.name].pids

        def start(self):
            anchors[self.name].start(args.epochs)

        def result(self) -> list[float]:
            return anchors[self.name].result()

        def run(self) -> list[float]:
            self.start()
            return self.result()

        def alive(self):
            return anchors[self.name].alive()

    class Engine:  # the loop sent to an engine without nbdist
        def __init__(self, eid: int):
            self.eid, self.workers = eid, 1

        def pids(self):
            return [pids[self.eid]]

        def start(self):
            view = session.cluster.client[self.eid]
            self.pending = view.execute(ENGINE_SLICE.format(epochs=args.epochs, loop=LOOP), block=False)

        def result(self) -> list[float]:
            self.pending.get(timeout=TIMEOUT_S)
            return session.cluster.client[self.eid].pull("__bench_seconds__", block=True)

        def run(self) -> list[float]:
            self.start()
            return self.result()

        def alive(self):
            return True

    sides = {  # name: (label, side A (nbdist), side B (anchor))
        "local": ("local / the plain loop", Nbdist("--strategy local", [0], 1), Anchor("plain", 1)),
        "hfdt": ("hfdt, 2 workers / horovodrun (DistributedGradientTape)",
                 Nbdist("--strategy hfdt", [0, 1], 2), Anchor("horovod", 2)),
        "nfdt1": ("nfdt, 1 worker / the plain loop", Nbdist("--strategy nfdt", [0], 1),
                  Anchor("plain", 1)),
        "local_engine": ("local / the loop on another engine without nbdist", Nbdist("--strategy local", [0], 1),
                         Engine(1)),
        "engine_plain": ("the loop on an engine without nbdist / the plain loop", Engine(1), Anchor("plain", 1)),
        "plain_plain": ("a plain loop / another plain loop", Anchor("plain2", 1), Anchor("plain", 1)),
    }

    def paired(name: str) -> tuple[float, float, float]:
        """One slice of the comparison `name`, its sides in turns: (A's samples/s, B's, the slice's ratio: the median
        over its timed epochs k of A's epoch k over B's epoch k, which ran right after it)."""
        _, a, b = sides[name]
        a_pids, b_pids = a.pids(), b.pids()
        turns.open(a_pids + b_pids)
        try:
            helper = threading.Thread(target=turns.pair, args=(a_pids, b_pids, args.epochs, b.start,
                                                               lambda: a.alive() and b.alive()), daemon=True)
            helper.start()
            try:
                seconds_a = a.run()
            finally:
                helper.join(timeout=TIMEOUT_S)
            if turns.error is not None:
                raise RuntimeError(f"the {name} slice failed: {turns.error}") from turns.error
            seconds_b = b.result()
        finally:
            turns.close_slice(a_pids + b_pids)
        work_a, work_b = samples[a.workers], samples[b.workers]
        ratios = [(work_a / ta) / (work_b / tb) for ta, tb in zip(seconds_a[1:], seconds_b[1:])]
        raw.setdefault(name, []).append({"a": seconds_a, "b": seconds_b, "load": os.getloadavg()[0]})
        return (steady_samples_per_s(seconds_a, work_a), steady_samples_per_s(seconds_b, work_b),
                statistics.median(ratios))

    ip.run_line_magic("dist", "start -n 2")
    pairs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in order}
    try:
        threads = engine_threads(session)
        client = session.cluster.client
        pids.update({eid: client[eid].apply_sync(os.getpid) for eid in client.ids})
        ip.run_cell(setup + STEP + turn, store_history=True)
        plains = {"plain"} if {"local", "nfdt1", "engine_plain", "plain_plain"} & set(order) else set()
        for plain in plains | ({"plain2"} if "plain_plain" in order else set()):
            anchors[plain] = WarmScript([], setup + STEP + turn + SERVE.format(rank=0, loop=LOOP), 1, threads)
        if "hfdt" in order:
            anchors["horovod"] = WarmScript(horovodrun, setup + HOROVOD_SETUP + turn + SERVE.format(
                rank="hvd.rank()", loop=HOROVOD_LOOP), 2, threads)
        if {"local_engine", "engine_plain"} & set(order):
            client[1].execute(ENGINE_DEFINE.format(source=setup + STEP + turn), block=True)
        for name in order:  # warm-up, not timed, not paired: each side's first slice (first imports, first traces)
            sides[name][1].run(), sides[name][2].run()
        for i in range(args.alternations):
            for name in order:
                loads.append(os.getloadavg()[0])
                a, b, ratio = paired(name)
                pairs[name].append((a, b, ratio))
                print(f"  {name} slice {i + 1}: {a:,.0f} / {b:,.0f} samples/s, ratio {ratio:.3f} (load "
                      f"{loads[-1]:.2f})", flush=True)
    finally:
        for anchor in anchors.values():
            anchor.close()
        ip.run_line_magic("dist", "stop")
        turns.remove()

    if args.save:
        Path(args.save).write_text(json.dumps({"args": vars(args), "samples": samples, "slices": raw}, indent=1))
    ratios = {name: [ratio for _, _, ratio in rounds] for name, rounds in pairs.items()}
    print()
    print(f"load average (1 min) during the slices: median {statistics.median(loads):.2f}, "
          f"range {min(loads):.2f}-{max(loads):.2f}")
    rows = []
    for name in order:
        q1, med, q3 = quartiles(ratios[name])
        rows.append([sides[name][0], f"{statistics.median(a for a, _, _ in pairs[name]):,.0f}",
                     f"{statistics.median(b for _, b, _ in pairs[name]):,.0f}", f"{med:.3f}", f"{q1:.3f}-{q3:.3f}",
                     f"{min(ratios[name]):.3f}-{max(ratios[name]):.3f}"])
    print_table(["samples/s (median epoch 2+ of each slice)", "nbdist", "anchor", "ratio (median slice)", "IQR",
                 "range"], rows)
    for name in order:
        print(f"{name} slices: " + ", ".join(f"{r:.3f}" for r in ratios[name]))
    results = {"local": "loop_local_vs_plain", "hfdt": "loop_hfdt_vs_horovod_tape", "nfdt1": "loop_nfdt1_vs_plain",
               "local_engine": "loop_local_vs_engine", "engine_plain": "loop_engine_vs_plain",
               "plain_plain": "loop_plain_vs_plain"}
    for name in order:
        q1, med, q3 = quartiles(ratios[name])
        print(f"RESULT {results[name]}={med:.3f}")
        print(f"RESULT {results[name]}_iqr={q1:.3f}-{q3:.3f}")


if __name__ == "__main__":
    main()
