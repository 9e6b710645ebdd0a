"""nbdist HFDT against a plain Horovod script under `horovodrun --gloo`, side by side in one run.

Same model, data, per-worker batch and TensorFlow thread pools (horovodrun's ranks get the engines' share of
the host, printed); 1 and 2 workers on each side, `--rounds` alternating rounds of
each. Prints a table, then:
    RESULT hfdt_vs_horovodrun=<nbdist 2-worker samples/s over horovodrun 2-worker samples/s, median round>
    RESULT hfdt1_vs_horovodrun=<the same with 1 worker>

    .venv/bin/python benchmarks/hfdt_vs_horovodrun.py [--samples 20000 --epochs 4 --batch 64 --rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap
from pathlib import Path

from common import DEFINITION, engine_threads, notebook_shell, print_table, script_result, steady_samples_per_s

HFDT_CELL = textwrap.dedent('''
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
    timer = EpochTimer()
    history = model.fit(x, y, batch_size={batch}, epochs={epochs}, callbacks=[timer], verbose=0)
''')

# What a user writes with Horovod's core ops today (horovod.keras does not work with Keras 3).
HOROVOD_SCRIPT = DEFINITION + textwrap.dedent('''
    import json, sys
    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    usable = (len(x) // size) * size
    data = tf.data.Dataset.from_tensor_slices((x[rank:usable:size], y[rank:usable:size]))
    data = data.shuffle(len(x), seed=rank).batch({batch}).prefetch(2)
    model = build()
    optimizer = keras.optimizers.SGD(0.05 * size, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    optimizer.build(model.trainable_variables)
    for i, v in enumerate(model.variables + optimizer.variables):
        v.assign(hvd.broadcast(tf.convert_to_tensor(v), 0, name=f"init_{{i}}"))

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        grads = hvd.grouped_allreduce(grads, op=hvd.Average, name="grads")
        optimizer.apply(grads, model.trainable_variables)
        return loss

    seconds = []
    for epoch in range({epochs}):
        t = time.perf_counter()
        for xb, yb in data:
            loss = step(xb, yb)
        float(loss)
        seconds.append(time.perf_counter() - t)
    if rank == 0:
        print("@@" + json.dumps(seconds))
''')


def horovodrun(workers: int, samples: int, epochs: int, batch: int, threads: dict[str, str]) -> list[float]:
    command = [str(Path(sys.executable).with_name("horovodrun")), "-np", str(workers), "-H", f"localhost:{workers}",
               "--gloo", "--network-interface", "lo"]
    return script_result(command, HOROVOD_SCRIPT.format(samples=samples, epochs=epochs, batch=batch), threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch size")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of each worker count (this machine is noisy: the ratio is their median)")
    args = parser.parse_args()
    used = {n: (args.samples // n) * n for n in (1, 2)}  # samples per epoch after equal sharding

    ip, session = notebook_shell()
    print(f"{args.samples} Fashion-MNIST samples, {args.epochs} epochs, per-worker batch {args.batch}")
    cell = HFDT_CELL.format(batch=args.batch, epochs=args.epochs)

    def nbdist_rate(workers):
        ip.run_cell_magic("distribute", f"--strategy hfdt --workers {workers}", cell)
        seconds = session.cluster.client[session.last_run.workers[0]].pull("timer.seconds", block=True)
        return steady_samples_per_s(seconds, used[workers])

    def horovod_rate(workers):
        return steady_samples_per_s(horovodrun(workers, args.samples, args.epochs, args.batch, threads),
                                    used[workers])

    ip.run_line_magic("dist", "start -n 2")
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
        threads = engine_threads(session)  # horovodrun's ranks compute with the engines' thread pools
        singles = [(nbdist_rate(1), horovod_rate(1)) for _ in range(args.rounds)]  # alternate: drift hits both
        rounds = [(nbdist_rate(2), horovod_rate(2)) for _ in range(args.rounds)]
    finally:
        ip.run_line_magic("dist", "stop")
    nbdist_rates = {1: statistics.median(r[0] for r in singles), 2: statistics.median(r[0] for r in rounds)}
    horovod_rates = {1: statistics.median(r[1] for r in singles), 2: statistics.median(r[1] for r in rounds)}
    ratio = statistics.median(a / b for a, b in rounds)
    single = statistics.median(a / b for a, b in singles)
    print()
    print_table(["samples/s (median epoch 2+)", "nbdist hfdt", "horovodrun", "nbdist / horovodrun"], [
        ["1 worker (median round)", f"{nbdist_rates[1]:,.0f}", f"{horovod_rates[1]:,.0f}", f"{single:.3f}"],
        ["2 workers (median round)", f"{nbdist_rates[2]:,.0f}", f"{horovod_rates[2]:,.0f}", f"{ratio:.3f}"],
        ["scaling 1 -> 2 workers", f"{nbdist_rates[2] / nbdist_rates[1]:.2f}x",
         f"{horovod_rates[2] / horovod_rates[1]:.2f}x", "-"],
    ])
    for workers, measured in ((1, singles), (2, rounds)):
        for i, (a, b) in enumerate(measured, 1):
            print(f"{workers}-worker round {i}: nbdist {a:,.0f} samples/s, horovodrun {b:,.0f} samples/s, "
                  f"ratio {a / b:.3f}")
    print(f"RESULT hfdt_vs_horovodrun={ratio:.3f}")
    print(f"RESULT hfdt1_vs_horovodrun={single:.3f}")


if __name__ == "__main__":
    main()
