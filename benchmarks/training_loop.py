"""A cell's own training loop (keras.io's guide, its `tf.function` form) under nbdist against its anchors, side by
side in one run: under `--strategy local` and `nfdt --workers 1` against the same loop in a plain Python process,
under `hfdt --workers 2` against the same loop written for Horovod (`hvd.DistributedGradientTape`,
`hvd.broadcast_variables`) under `horovodrun --gloo`. Every side computes with the engines' TensorFlow thread
pools. Prints a table and each round, then:
    RESULT loop_hfdt_vs_horovod_tape=<nbdist hfdt 2-worker samples/s over horovodrun's, median round>
    RESULT loop_local_vs_plain=<nbdist local samples/s over the plain loop's, median round>
    RESULT loop_nfdt1_vs_plain=<nbdist nfdt, one worker, over the plain loop's, median round>

    .venv/bin/python benchmarks/training_loop.py [--samples 20000 --epochs 4 --rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap
from pathlib import Path

from common import engine_threads, notebook_shell, print_table, script_result, steady_samples_per_s

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
# the training cell: the guide's loop, each epoch timed
LOOP = textwrap.dedent('''
    seconds = []
    for epoch in range(epochs):
        start_time = time.perf_counter()
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = train_step(x_batch_train, y_batch_train)
        float(loss_value)
        train_acc_metric.reset_state()
        seconds.append(time.perf_counter() - start_time)
''')
PLAIN = SETUP + STEP + LOOP + '\nimport json; print("@@" + json.dumps(seconds))\n'

# the same loop as Horovod's documentation writes it (its core ops: horovod.keras does not work with Keras 3; Keras 3's
# variables hold TensorFlow's in `.value`, and Horovod's tape and broadcast need those, horovod#4290)
HOROVOD = SETUP + textwrap.dedent('''
    import json
    import horovod.tensorflow as hvd

    hvd.init()
    per_rank = int(train_dataset.cardinality()) // hvd.size()
    train_dataset = train_dataset.shard(hvd.size(), hvd.rank()).take(per_rank)
    optimizer.learning_rate = 1e-3 * hvd.size()

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

    seconds = []
    for epoch in range(epochs):
        start_time = time.perf_counter()
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = train_step(x_batch_train, y_batch_train, epoch == 0 and step == 0)
        float(loss_value)
        train_acc_metric.reset_state()
        seconds.append(time.perf_counter() - start_time)
    if hvd.rank() == 0:
        print("@@" + json.dumps(seconds))
''')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of each pair (this machine is noisy: the ratio is their median)")
    args = parser.parse_args()
    batches = -(-args.samples // 64)
    samples = {1: args.samples, 2: (batches // 2) * 2 * 64}  # what one epoch trains (2 workers: equal shards)
    ip, session = notebook_shell()
    print(f"keras.io's tf.function loop: {args.samples} Fashion-MNIST samples, {args.epochs} epochs, batch 64")
    horovodrun = [str(Path(sys.executable).with_name("horovodrun")), "-np", "2", "-H", "localhost:2", "--gloo",
                  "--network-interface", "lo"]

    def nbdist_rate(line: str, workers: int) -> float:
        ip.run_cell(SETUP.format(samples=args.samples, epochs=args.epochs) + STEP, store_history=True)
        ip.run_cell_magic("distribute", f"{line} --progress none", LOOP)
        return steady_samples_per_s(ip.user_ns["seconds"], samples[workers])

    def script_rate(command: list[str], script: str, workers: int) -> float:
        seconds = script_result(command, script.format(samples=args.samples, epochs=args.epochs), threads)
        return steady_samples_per_s(seconds, samples[workers])

    ip.run_line_magic("dist", "start -n 2")
    try:
        threads = engine_threads(session)
        pairs = {"local": [], "nfdt1": [], "hfdt": []}
        for _ in range(args.rounds):  # alternating, so drift in the machine's speed hits both sides alike
            pairs["local"].append((nbdist_rate("--strategy local", 1), script_rate([], PLAIN, 1)))
            pairs["nfdt1"].append((nbdist_rate("--strategy nfdt --workers 1", 1), script_rate([], PLAIN, 1)))
            pairs["hfdt"].append((nbdist_rate("--strategy hfdt --workers 2", 2), script_rate(horovodrun, HOROVOD, 2)))
    finally:
        ip.run_line_magic("dist", "stop")
    ratios = {name: [a / b for a, b in rounds] for name, rounds in pairs.items()}
    print()
    print_table(["samples/s (median epoch 2+)", "nbdist", "anchor", "ratio (median round)", "ratio range"], [
        [f"{label}", f"{statistics.median(a for a, _ in pairs[name]):,.0f}",
         f"{statistics.median(b for _, b in pairs[name]):,.0f}", f"{statistics.median(ratios[name]):.3f}",
         f"{min(ratios[name]):.3f}-{max(ratios[name]):.3f}"]
        for name, label in (("local", "local vs the plain loop"), ("nfdt1", "nfdt, 1 worker, vs the plain loop"),
                            ("hfdt", "hfdt, 2 workers, vs horovodrun (DistributedGradientTape)"))])
    for name, rounds in pairs.items():
        for i, (a, b) in enumerate(rounds, 1):
            print(f"{name} round {i}: nbdist {a:,.0f} samples/s, anchor {b:,.0f} samples/s, ratio {a / b:.3f}")
    print(f"RESULT loop_hfdt_vs_horovod_tape={statistics.median(ratios['hfdt']):.3f}")
    print(f"RESULT loop_local_vs_plain={statistics.median(ratios['local']):.3f}")
    print(f"RESULT loop_nfdt1_vs_plain={statistics.median(ratios['nfdt1']):.3f}")


if __name__ == "__main__":
    main()
