"""How a keras-io example runs as a notebook under a strategy, and what its declared outcome requires.

An example module (one notebook) declares:

- SOURCE, LICENCE: where the example comes from (keras-team/keras-io, Apache License 2.0);
- SETUP: its first cells (imports, data), run once in the module's fresh kernel, as plain cells;
- RUN: the cells run again for each strategy: the ones that build the model, the training cell(s), whose first
  line is `%%distribute {line}` (the strategy's options fill it), and the cells after training; an entry may
  also be a function (notebook, strategy) that checks the notebook between two cells;
- OUTCOMES: for every strategy of STRATEGIES, `Trains()` or `Refused("a phrase of nbdist's OptionError")`;
- MODEL: the notebook name of the model the training cell fits (an hfdt run's ranks must end equal);
- check(notebook, strategy): what the example's own text says it shows, at the small size, without a number to reach;
- MEASURE: the example's headline number (`Measure`: a test accuracy, a loss), read in the notebook after RUN;
- BOUNDS: for every strategy but `local` that trains it, the bound its MEASURE must reach (`Bound`), measured from the
  spread of five seeded runs under that strategy (`python -m tests.keras_io.measure`), with how, beside it;
- IGNORE (optional): addresses of the state walk the state oracle leaves out, with why;
- LOCAL_DIFFERS (optional): why `local` cannot end where plain does here (a known gap of nbdist, named in the
  issue): the oracle then holds it to the same objects and step counts, not values;
- FILES (optional): glob patterns of the files the example writes beside the notebook, removed before each
  strategy's run so that its check sees that run's files.

Every example also runs plain, once, in a kernel of its own (`plain_notebook`, tests/keras_io/conftest.py): the same
cells without `%%distribute`, seeded as `--seed 1` seeds the engines, with TensorFlow's op determinism on in both
kernels (the engines take it from the notebook). After each strategy's run the state oracle (tests/state_oracle.py)
compares the two notebooks' whole state by that strategy's rule; under `local` the MEASURE equals plain's
(`LOCAL_MEASURE_TOLERANCE`), under the others it reaches its measured bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests import state_oracle
from tests.kernel_driver import KernelDriver

STRATEGIES = ("local", "hfdt", "nfdt", "pipeline", "tensor")
SEED = 1
# both kernels, before anything else: TensorFlow computes the same numbers every time (the engines follow the
# notebook's setting), and Python, NumPy and TensorFlow are seeded; before each strategy's cells, seeded again
DETERMINISM = ("import keras as _keras, tensorflow as _tf\n_tf.config.experimental.enable_op_determinism()\n"
               f"_keras.utils.set_random_seed({SEED})")
RESEED = f"_keras.utils.set_random_seed({SEED})"
# the plain kernel computes on as many threads as an engine (its share of the host's cores): TensorFlow's
# deterministic kernels still split a sum by thread, so two thread counts are two orders of summing (a WGAN's
# weights differed by 3e-4 relative after 16 steps on 1 thread against 2; on equal threads, not at all)
PLAIN_THREADS = ("_tf.config.threading.set_intra_op_parallelism_threads({intra})\n"
                 "_tf.config.threading.set_inter_op_parallelism_threads({inter})\n")


def engine_threads(cluster) -> dict:
    """The TensorFlow thread pools of an engine of the cluster: {"intra": n, "inter": n}."""
    def pools():
        import os

        import tensorflow as tf

        from nbdist.host.threads import INTER_ENV, INTRA_ENV

        return {"intra": tf.config.threading.get_intra_op_parallelism_threads() or int(os.environ.get(INTRA_ENV, 0)),
                "inter": tf.config.threading.get_inter_op_parallelism_threads() or int(os.environ.get(INTER_ENV, 0))}

    return cluster.client[cluster.client.ids[0]].apply_sync(pools)


def plain_determinism(threads: dict) -> str:
    """The plain kernel's first cell: the engines' thread pools, then `DETERMINISM`."""
    first, rest = DETERMINISM.split("\n", 1)
    return first + "\n" + PLAIN_THREADS.format(**threads) + rest


WORKERS = {"local": 1, "hfdt": 2, "nfdt": 2, "asgd": 2, "pipeline": 2, "tensor": 2}
# a seeded local run against its plain run: the measures below differed by at most this (make acceptance,
# 2026-12-07; weights within state_oracle.LOCAL_RTOL), an image or two of a test set flipping at most
LOCAL_MEASURE_TOLERANCE = 0.01
LINES = {
    "local": "--strategy local --workers 1 --seed 1",
    "hfdt": "--strategy hfdt --workers 2 --seed 1",
    # on the virtual clock: the asynchronous run is the same every time, so its checks are reproducible
    "nfdt": "--strategy nfdt --workers 2 --seed 1 --simulate 'clock=virtual; step=10ms'",
    "asgd": "--strategy asgd --workers 2 --seed 1 --simulate 'clock=virtual; step=10ms'",  # (the examples that add it)
    "pipeline": "--strategy pipeline --stages 2 --seed 1",
    "tensor": "--strategy tensor --workers 2 --seed 1",
}
CELL_TIMEOUT_S = 480  # one cell of an example at its small size, on a loaded 2-core machine (the siamese
# network under pipeline took 187 s in CI, and more than 240 s beside two other runs)


@dataclass(frozen=True)
class Measure:
    """An example's headline number: `expression` evaluated in the notebook after its cells (plain or not: it reads
    the notebook's names, not nbdist's); `higher` is better (an accuracy) or not (a loss)."""

    name: str
    expression: str
    higher: bool | None = True  # None: neither (a GAN's losses): equal to plain's under local, no bound elsewhere


@dataclass(frozen=True)
class Bound:
    """What a strategy's run must reach on the example's MEASURE, and how that was measured (the runs' values, their
    mean and spread, plain's mean and the gap): `value` is the mean less three standard deviations of five runs with
    seeds 1-5 (plus three for a lower-is-better measure)."""

    value: float
    measured: str


@dataclass(frozen=True)
class Trains:
    """The example trains under the strategy; the module's `check` then asserts what the example shows."""


@dataclass(frozen=True)
class Refused:
    """The strategy refuses the example by name, before any engine trains: nbdist's OptionError saying `says`, at
    the example's training cell number `at` (0: the first; those before it train)."""

    says: str
    at: int = 0


NO_GRAPH = "is a subclassed model, whose layers have no graph nbdist can cut"  # what `pipeline` says of one


def trains_everywhere() -> dict:
    """OUTCOMES of an example that trains under every strategy."""
    return {strategy: Trains() for strategy in STRATEGIES}


def pipeline_refuses(says: str, tensor: Trains | Refused = Trains()) -> dict:
    """OUTCOMES of an example that trains under local, hfdt and nfdt (and, unless told, tensor) and that
    `pipeline` refuses saying `says`."""
    return {"local": Trains(), "hfdt": Trains(), "nfdt": Trains(), "pipeline": Refused(says), "tensor": tensor}


def distributed(cell: str, strategy: str) -> str:
    return cell.replace("%%distribute {line}", f"%%distribute {LINES[strategy]}", 1)


def plain_cell(cell: str) -> str:
    """A training cell as the plain notebook runs it: without the magic line, seeded as `--seed` seeds the engines."""
    return f"{RESEED}\n" + cell.split("\n", 1)[1] if cell.startswith("%%distribute") else cell


def run_example(notebook, module, strategy: str, cluster, plain=None) -> None:
    """Run the example's RUN cells under `strategy` and hold it to its declared outcome; with `plain` (the example
    run plain, `plain_notebook`), the state oracle and the MEASURE against it or the strategy's bound."""
    outcome = module.OUTCOMES[strategy]
    for pattern in getattr(module, "FILES", ()):
        for path in notebook.folder.glob(pattern):
            path.unlink()
    notebook.run(RESEED).check()
    trained = 0
    for cell in module.RUN:
        if callable(cell):
            cell(notebook, strategy)
            continue
        is_training = cell.startswith("%%distribute {line}")
        refused = is_training and isinstance(outcome, Refused) and trained == outcome.at
        before = notebook.value("nbdist.last_run.id if nbdist.last_run else 0") if refused else None
        reply = notebook.run(distributed(cell, strategy) if is_training else cell, timeout=CELL_TIMEOUT_S)
        if refused:
            assert_refused(notebook, reply, outcome, before)
            return
        assert reply.status == "ok", f"a cell failed under {strategy}: {brief(reply)}\ncell:\n{cell[:400]}"
        trained += is_training
    assert isinstance(outcome, Trains), f"{strategy} was declared {outcome} but every cell ran"
    if strategy == "hfdt":
        assert_replicas_agree(notebook, cluster, module.MODEL)
    module.check(notebook, strategy)
    if plain is not None:
        assert_like_plain(notebook, module, strategy, plain)


def assert_like_plain(notebook, module, strategy: str, plain) -> None:
    """The state oracle against the plain run, then the example's MEASURE: under `local` plain's, elsewhere its
    measured bound."""
    state = state_oracle.capture(notebook, notebook.folder / f"state-{strategy}.pkl")
    differs = strategy == "local" and getattr(module, "LOCAL_DIFFERS", None)
    rule = "local, values differ" if differs else strategy
    state_oracle.assert_state_matches(plain.state, state, rule, WORKERS[strategy], getattr(module, "IGNORE", ()))
    measure = module.MEASURE
    value = float(notebook.value(measure.expression))
    if differs:
        print(f"local differs from plain here, known: {differs} ({measure.name} {value:.4f}, plain {plain.measure:.4f})")
        return
    if strategy == "local":
        assert abs(value - plain.measure) <= LOCAL_MEASURE_TOLERANCE, (
            f"{measure.name} {value:.4f} under local, {plain.measure:.4f} plain (seed {SEED}): local is plain Keras")
        return
    if measure.higher is None:
        return
    bound = module.BOUNDS.get(strategy)
    assert bound is not None, f"{module.__name__} measured no bound of its {measure.name} under {strategy}"
    reached = value >= bound.value if measure.higher else value <= bound.value
    assert reached, (f"{measure.name} {value:.4f} under {strategy}, against its bound {bound.value:.4f} "
                     f"({bound.measured}); plain {plain.measure:.4f}")


def assert_refused(notebook, reply, outcome: Refused, before: int) -> None:
    """An OptionError of nbdist naming what it refuses, not a traceback from inside Keras; no engine trained."""
    assert reply.status == "error", f"expected a refusal saying {outcome.says!r}; the cell ran:\n{reply.stdout[-3000:]}"
    assert reply.ename == "OptionError", f"expected nbdist's OptionError saying {outcome.says!r}, got: {brief(reply)}"
    assert outcome.says in reply.evalue, f"the refusal does not say {outcome.says!r}: {reply.evalue}"
    assert "keras/src" not in reply.error_text, f"the refusal carries a Keras traceback: {brief(reply)}"
    trained = notebook.value(f"bool(nbdist.last_run and nbdist.last_run.id != {before} and "
                             "any(nbdist.last_run.results.values()))")
    assert not trained, "an engine trained before the refusal"


class NotebookKernel(KernelDriver):
    """A KernelDriver whose replies keep every error a cell showed (`reply.errors`), not only the last: when the
    notebook's replay of a training cell fails, nbdist's own error follows the one that says why."""

    def collect(self, msg_id, timeout=120, until_output=None):
        errors, read = [], self.kc.get_iopub_msg

        def reading(timeout=None):
            msg = read(timeout=timeout)
            if msg["msg_type"] == "error" and msg["parent_header"].get("msg_id") == msg_id:
                errors.append(msg["content"])
            return msg

        self.kc.get_iopub_msg = reading
        try:
            reply = super().collect(msg_id, timeout, until_output)
        finally:
            self.kc.get_iopub_msg = read
        reply.errors = errors
        return reply


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def brief(reply, lines: int = 10) -> str:
    """A failed cell's errors in a few lines each: name and message, then the end of the traceback (no colours)."""
    shown = []
    for error in getattr(reply, "errors", None) or [{"ename": reply.ename, "evalue": reply.evalue,
                                                      "traceback": reply.traceback}]:
        tail = [line for line in _plain("\n".join(error.get("traceback") or [])).splitlines() if line.strip()]
        shown += [f"{error['ename']}: {_plain(str(error['evalue']))}", *tail[-lines:]]
    return "\n".join([*shown, f"stdout: {_plain(reply.stdout[-1500:])}"])


DIGEST = '''
import hashlib as _hashlib, numpy as _np
_nbdist_test_digest = _hashlib.sha256(b"".join(_np.asarray(w).tobytes() for w in {name}.trainable_weights)).hexdigest()
'''


def assert_replicas_agree(notebook, cluster, name: str) -> None:
    """After a synchronous data-parallel run every rank holds the same trainable weights (rank 0's)."""
    client = cluster.client
    workers = notebook.value("nbdist.last_run.workers")
    digests = {}
    for eid in workers:
        client[eid].execute(DIGEST.format(name=name), block=True)
        digests[eid] = client[eid].pull("_nbdist_test_digest", block=True)
        client[eid].execute("del _nbdist_test_digest", block=True)
    assert len(set(digests.values())) == 1, (f"the hfdt ranks ended with different weights of `{name}` "
                                             f"(engine: digest) {digests}: its updates were not averaged")


def history(notebook, key: str) -> list[float]:
    """The run's History values of `key`, as the notebook received them."""
    return notebook.value(f"[float(v) for v in nbdist.last_run.history[{key!r}]]")
