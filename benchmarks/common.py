"""What the benchmarks share: the ENVIRONMENT.md baseline CNN, an epoch timer, a notebook shell."""

from __future__ import annotations

import os
import statistics
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Runs in the notebook, on the engines (as a definition cell) and in plain scripts alike.
DEFINITION = textwrap.dedent('''
    import time, keras
    from nbdist.datasets import fashion_mnist
    (x, y), _ = fashion_mnist(limit={samples})
    x = x.astype("float32")[..., None] / 255

    class EpochTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.seconds = []
        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.perf_counter()
        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._t)

    def build():
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
''')


def steady_samples_per_s(epoch_seconds: list[float], samples: int) -> float:
    """Samples/s of the median epoch after the first (which includes tracing); the median shrugs
    off an epoch that a noisy neighbour slowed down."""
    return samples / statistics.median(epoch_seconds[1:] or epoch_seconds)


def notebook_shell():
    """A real IPython shell with nbdist loaded, as a notebook kernel has."""
    from IPython.testing.globalipapp import start_ipython

    import nbdist

    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbdist")
    return shell, nbdist.get_session(shell)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
