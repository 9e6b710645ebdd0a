"""What the benchmarks share: the ENVIRONMENT.md baseline CNN, an epoch timer, a notebook shell."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

from nbdist.experiments import notebook_shell  # noqa: F401 (the benchmarks' shell: a notebook kernel's)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A callback every benchmark cell times its epochs with (after `import time, keras`).
EPOCH_TIMER = textwrap.dedent('''
    class EpochTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.seconds = []
        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.perf_counter()
        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._t)
''')
# Runs in the notebook, on the engines (as a definition cell) and in plain scripts alike.
DEFINITION = textwrap.dedent('''
    import time, keras
    from nbdist.datasets import fashion_mnist
    (x, y), _ = fashion_mnist(limit={samples})
    x = x.astype("float32")[..., None] / 255
''') + EPOCH_TIMER + textwrap.dedent('''
    def build():
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
''')


SGD_MOMENTUM = "keras.optimizers.SGD(0.05, momentum=0.9)"  # the benchmarks' optimizer unless one says otherwise
TRAIN = textwrap.dedent('''
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer={optimizer},
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    timer = EpochTimer()
    history = model.fit(x, y, batch_size=64, epochs={epochs}, callbacks=[timer], verbose=0)
''')


def plain_fit(samples: int, epochs: int, optimizer: str = SGD_MOMENTUM) -> dict:
    """Plain Keras in a fresh Python process, as an engine is one."""
    script = DEFINITION.format(samples=samples) + "\n_t0 = time.perf_counter()\n" + \
        TRAIN.format(epochs=epochs, optimizer=optimizer) + (
        "\nimport json; print('@@' + json.dumps({'epochs': timer.seconds, 'wall': time.perf_counter() - _t0}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith("@@")][-1][2:])


def script_result(command: list[str], script: str, env: dict | None = None, timeout: float = 900):
    """Run `script` with this Python behind `command` (a launcher such as horovodrun, or none); the JSON its first
    process printed after "@@" on its last such line."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "script.py"
        path.write_text(script)
        out = subprocess.run([*command, sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **(env or {})})
    lines = [ln.split("@@", 1)[1] for ln in out.stdout.splitlines() if "@@" in ln]
    if out.returncode or not lines:
        raise RuntimeError(f"{command or 'python'} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def against_plain_fit_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a benchmark that alternates an nbdist cell with plain `fit`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating nbdist / plain rounds (this machine is noisy: the ratio is their median)")
    return parser


@contextlib.contextmanager
def benchmark_cluster(samples: int, epochs: int, engines: int = 1):
    """A notebook shell with a cluster of `engines` (1) and the benchmark data defined; the cluster stops after."""
    ip, session = notebook_shell()
    print(f"Starting a {engines}-engine cluster; {samples} Fashion-MNIST samples, {epochs} epochs, batch 64")
    ip.run_line_magic("dist", f"start -n {engines}")
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=samples))
        engine_threads(session)
        yield ip, session
    finally:
        ip.run_line_magic("dist", "stop")


def alternate_with_plain_fit(ip, session, magic_line: str, samples: int, epochs: int, rounds: int,
                             optimizer: str = SGD_MOMENTUM) -> list[dict]:
    """`rounds` x (the TRAIN cell under `%%distribute magic_line`, then plain fit), alternating so
    drift in machine speed hits both sides alike. Samples/s of rank 0's steady epochs."""
    results = []
    for _ in range(rounds):
        t0 = time.time()
        ip.run_cell_magic("distribute", magic_line, TRAIN.format(epochs=epochs, optimizer=optimizer))
        wall = time.time() - t0
        epoch_s = session.cluster.client[session.last_run.workers[0]].pull("timer.seconds", block=True)
        plain = plain_fit(samples, epochs, optimizer)
        per_worker = samples // len(session.last_run.workers)
        results.append({"nbdist": steady_samples_per_s(epoch_s, per_worker) * len(session.last_run.workers),
                        "nbdist_wall": wall, "plain": steady_samples_per_s(plain["epochs"], samples),
                        "plain_wall": plain["wall"]})
    return results


def print_rounds(label: str, rounds: list[dict], extra_rows=()) -> float:
    """The side-by-side table of `alternate_with_plain_fit`; returns the median round's ratio."""
    def median(key):
        return statistics.median(r[key] for r in rounds)

    ratio = statistics.median(r["nbdist"] / r["plain"] for r in rounds)
    print()
    print_table(["measure", label, "plain fit", "ratio"], [
        ["samples/s (median epoch 2+), median round", f"{median('nbdist'):,.0f}", f"{median('plain'):,.0f}",
         f"{ratio:.3f}"],
        ["wall time of the training cell, s, median", f"{median('nbdist_wall'):.2f}", f"{median('plain_wall'):.2f}",
         f"{median('plain_wall') / median('nbdist_wall'):.3f}"],
        *extra_rows,
    ])
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: nbdist {r['nbdist']:,.0f} samples/s, plain {r['plain']:,.0f} samples/s, "
              f"ratio {r['nbdist'] / r['plain']:.3f}")
    return ratio


def engine_threads(session) -> dict[str, str]:
    """The TensorFlow thread pools of the cluster's engines (each its share of the host, as `%dist status` shows
    them), printed, as the environment an anchor's processes get so both sides compute with the same threads."""
    from nbdist.host.threads import INTER_ENV, INTRA_ENV

    labels = {session.cluster.info(eid).threads for eid in session.cluster.ids()}
    print(f"engines' TensorFlow threads (intra/inter-op): {', '.join(sorted(map(str, labels)))}")
    if len(labels) != 1 or "/" not in str(next(iter(labels))):
        return {}
    intra, inter = next(iter(labels)).split("/")
    return {name: n for name, n in ((INTRA_ENV, intra), (INTER_ENV, inter)) if n.isdigit()}


def steady_samples_per_s(epoch_seconds: list[float], samples: int) -> float:
    """Samples/s of the median epoch after the first (which includes tracing); the median shrugs
    off an epoch that a noisy neighbour slowed down."""
    return samples / statistics.median(epoch_seconds[1:] or epoch_seconds)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


# A model over 1 GB for the model-parallel strategies' memory: 4 x 8192 x 8192 float32 kernels, SGD (no slots).
# Defined, so the notebook holds it: a model-parallel engine builds it empty and fills its own part.
BIG_DEFINITION = textwrap.dedent('''
    import keras, numpy as np
    big = keras.Sequential([keras.Input((8192,))] + [keras.layers.Dense(8192) for _ in range(4)]
                           + [keras.layers.Dense(10)])
    big.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
''')
BIG_CELL = textwrap.dedent('''
    xb = np.random.default_rng(0).random(({batch}, 8192), np.float32); yb = np.arange({batch}) % 10
    history = big.fit(xb, yb, batch_size=8, epochs=1, verbose=0)
''')


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def big_model_peaks(ip, session, line: str, steps: int, held) -> tuple[list, float]:
    """On a fresh 3-engine cluster: `local` on engine 2, then `line` (a model-parallel strategy) on engines 0 and 1,
    each `steps` steps of the big model. Rows (engine, RSS before, peak RSS, variables held, cell s) and the larger
    model-parallel engine's peak RSS over the local engine's. `held(run, eid)`: the bytes engine `eid` trained with."""
    ip.run_line_magic("dist", "stop")
    ip.run_line_magic("dist", "start -n 3")
    ip.run_cell_magic("distribute", "define", BIG_DEFINITION)
    client = session.cluster.client
    pids = {eid: client[eid].apply_sync(os.getpid) for eid in (0, 1, 2)}
    before = {eid: peak_rss_mb(pid) for eid, pid in pids.items()}
    done = {}
    for magic in ("--strategy local --targets 2", f"{line} --targets 0,1"):
        t0 = time.time()
        ip.run_cell_magic("distribute", f"{magic} --progress none", BIG_CELL.format(batch=steps * 8))
        done[magic.split("--targets ")[1]] = (session.last_run, time.time() - t0)
    local_fit = done["2"][0].fits[0]
    local_bytes = sum(w.nbytes for w in local_fit.weights + local_fit.optimizer_weights)
    peaks = {eid: peak_rss_mb(pid) for eid, pid in pids.items()}
    rows = []
    for eid in (0, 1, 2):
        run, seconds = done["2" if eid == 2 else "0,1"]
        rows.append([f"engine {eid} ({'local' if eid == 2 else 'rank ' + str(eid)})", f"{before[eid]:,.0f}",
                     f"{peaks[eid]:,.0f}", f"{(local_bytes if eid == 2 else held(run, eid)) / 1e6:,.0f}",
                     f"{seconds:.1f}"])
    return rows, max(peaks[0], peaks[1]) / peaks[2]
