"""The functional BatchNorm cell (Conv2D + BatchNormalization twice, SGD 0.05 momentum 0.9, batch 64, 2 epochs of
Fashion-MNIST) under `local` and under `nfdt` and `asgd` on 2 workers, the same seeds on each side: every run's
test accuracy against `local`'s mean, and, for each run, the accuracy once the running statistics are estimated
anew on its final weights (what statistics coherent with those weights give: where it is close to the run's own,
the statistics that came back were coherent). Prints a table, then:
    RESULT running_statistics_nfdt_worst_gap=<points the worst nfdt run ends under local's mean>
    RESULT running_statistics_asgd_worst_gap=<the same for asgd>

    .venv/bin/python benchmarks/ps_running_statistics.py [--seeds 10 --samples 60000 --epochs 2 --ps-momentum MU]

`--ps-momentum MU` runs nfdt and asgd with `--momentum MU` (the shards' momentum instead of the cell's 0.9): with
two asynchronous workers each push is about one version stale, which acts as a momentum of about 0.5 of its own
(Mitliagkas et al., 2016), so 0.4 keeps the effective momentum at the cell's 0.9.
"""

from __future__ import annotations

import argparse
import statistics
import textwrap

from common import notebook_shell, print_table

DEFINITION = textwrap.dedent('''
    import keras, numpy as np
    from nbdist.datasets import fashion_mnist
    (x, y), (xt, yt) = fashion_mnist(limit={samples})
    x = x.astype("float32")[..., None] / 255
    xt = xt.astype("float32")[..., None] / 255

    def build():
        inputs = keras.Input((28, 28, 1))
        h = keras.layers.Conv2D(32, 3)(inputs)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.MaxPooling2D()(h)
        h = keras.layers.Conv2D(64, 3)(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.MaxPooling2D()(h)
        h = keras.layers.Flatten()(h)
        outputs = keras.layers.Dense(10, activation="softmax")(h)
        return keras.Model(inputs, outputs)

    def accuracy(m):
        return float(np.mean(np.argmax(m.predict(xt, verbose=0), -1) == yt))

    def reestimated(m):
        """The accuracy with each BatchNormalization's statistics those of 4,096 training samples at these weights."""
        copy = keras.models.clone_model(m)
        copy.set_weights(m.get_weights())
        for layer in copy.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = 0.0
        copy(x[:4096], training=True)
        return accuracy(copy)
''')
CELL = textwrap.dedent('''
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=64, epochs={epochs}, verbose=0)
''')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ps-momentum", type=float, default=None, help="nfdt's and asgd's --momentum")
    args = parser.parse_args()
    momentum = "" if args.ps_momentum is None else f" --momentum {args.ps_momentum}"
    ip, session = notebook_shell()
    ip.run_line_magic("dist", "start -n 2")
    results: dict[str, list[tuple[float, float, float]]] = {"local": [], "nfdt": [], "asgd": []}
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
        for seed in range(1, args.seeds + 1):
            for strategy in results:
                workers, extra = (1, "") if strategy == "local" else (2, momentum)
                ip.run_cell_magic("distribute", f"--strategy {strategy} --workers {workers} --seed {seed} "
                                  f"--progress none{extra}", CELL.format(epochs=args.epochs))
                ns = ip.user_ns
                row = (ns["accuracy"](ns["model"]), ns["reestimated"](ns["model"]), ns["history"].history["loss"][-1])
                results[strategy].append(row)
                print(f"seed {seed} {strategy}: test accuracy {row[0]:.4f} (statistics re-estimated {row[1]:.4f}), "
                      f"last epoch's loss {row[2]:.4f}", flush=True)
    finally:
        ip.run_line_magic("dist", "stop")
    local_mean = statistics.mean(r[0] for r in results["local"])
    rows = []
    for strategy, runs in results.items():
        accuracies = [r[0] for r in runs]
        rows.append([strategy, f"{statistics.mean(accuracies):.4f}", f"{min(accuracies):.4f}-{max(accuracies):.4f}",
                     f"{100 * (local_mean - min(accuracies)):.1f}",
                     f"{statistics.mean(r[1] for r in runs):.4f}", f"{statistics.mean(r[2] for r in runs):.4f}"])
    print()
    print_table(["strategy", "test accuracy, mean", "range", "worst, points under local's mean",
                 "re-estimated statistics, mean", "last epoch's loss, mean"], rows)
    for strategy in ("nfdt", "asgd"):
        gap = 100 * (local_mean - min(r[0] for r in results[strategy]))
        print(f"RESULT running_statistics_{strategy}_worst_gap={gap:.1f}")


if __name__ == "__main__":
    main()
