"""Code that runs inside an ipyparallel engine: the status probe and the training cell (what definition
cells and brought values leave there is `nbdist.host.namespace`'s)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

from ..host.facts import boot_id, network_namespace, versions
from ..host.namespace import working_directory


def probe() -> dict:
    """What `%dist status` shows for this engine; importing TensorFlow here also warms the engine up
    (after `nbdist.host.gpus.pin` and `nbdist.host.threads.pin` when the kernel pinned this engine first)."""
    pinned = horovod_built = pools = None
    try:  # an engine with another nbdist may lack these modules: it still reports its versions
        from ..host import gpus, threads
        from .. import horovod

        pinned = gpus.pinned()
    except ImportError:
        horovod = threads = None
    visible: list[str] = []
    try:
        import tensorflow as tf

        visible = [d.name for d in tf.config.get_visible_devices("GPU")]
        horovod_built = horovod.built_with() if horovod is not None else None
        pools = threads.applied() if threads is not None else None
    except ImportError:
        pass
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "boot_id": boot_id(),
        "net_ns": network_namespace(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "gpus": visible,
        **versions(),
        "gpu": (pinned or {}).get("gpu"),
        "local_rank": (pinned or {}).get("local_rank"),
        "threads": (pools or {}).get("threads"),
        "threads_how": (pools or {}).get("how"),
        "horovod_built": horovod_built,
    }


def _seed(spec: dict) -> None:
    """--seed on every engine."""
    if spec.get("seed") is not None:
        import keras

        keras.utils.set_random_seed(spec["seed"])


@contextlib.contextmanager
def _deterministic_ops(spec: dict):
    """Within, on the virtual clock with --seed: deterministic ops (same seed and spec: same weights). Turned
    off again after: the setting is the process's, and later runs on this engine must compute as the others."""
    if spec.get("seed") is None or (spec.get("config") or {}).get("virtual") is None:
        yield
        return
    from tensorflow.python.framework import config

    before = config.is_op_determinism_enabled()
    config.enable_op_determinism()
    try:
        yield
    finally:
        if not before:
            config.disable_op_determinism()


@contextlib.contextmanager
def _interrupt_reported_short(run_id):
    """Within: an interrupt leaves as a KeyboardInterrupt of its own, without the frames it was raised in.

    The engine formats the error it returns with IPython's verbose traceback, which parses the source file of
    every frame: an interrupt raised deep inside TensorFlow (chained to a broken collective's error) took the
    engine over 40 s to report on a loaded host. None of those frames is the user's."""
    try:
        yield
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"run {run_id} was interrupted on this engine") from None


def _short_run(spec: dict, request) -> None:
    """A planner's short run (`nbdist.planner.short_runs`) trains on the fit's first samples only."""
    if spec["options"].get("plan_limit"):
        from ..planner.short_runs import VALIDATION, limit_request

        options = spec["options"]
        limit_request(request, options["plan_limit"], options.get("plan_epochs"),
                      options.get("plan_validation", VALIDATION), whole=options.get("plan_samples"))


def run_training_cell(spec: dict) -> list:
    """Run the training cell under its strategy: each `fit` replaced by the strategy's worker, every optimizer step
    of the cell's own through the worker's `step` (the step seam); return one result per fit, or one for a cell that
    stepped its optimizers itself (what each of its stepping statements left on rank 0).

    Returns:
        a packed list of `FitResult` (`FitResult.pack`).
    """
    from ipyparallel.datapub import publish_data

    from ..keras_semantics import callbacks
    from ..host import interrupt_guard
    from .cell_runner import cell_tree, fresh_traces, run_statements
    from ..errors import NoFitCall
    from ..keras_semantics.keras_bridge import FitResult, intercept_fit
    from .loop_data import LoopData
    from ..host.namespace import python_of, user_namespace
    from .reporter import LoopReporter, ProgressReporter  # imports Keras: engines only
    from ..keras_semantics.step_seam import StepSeam
    from ..strategies import strategy_class
    from ..keras_semantics.training_code import Training, training_of

    started = time.time()
    reporters = []

    def make_reporter(batch_size, **options):
        reporter = ProgressReporter(spec["run"], spec["rank"], batch_size, publish=publish_data, **options)
        reporters.append(reporter)
        return reporter

    worker = strategy_class(spec["strategy"]).worker_class(spec, make_reporter)
    results: list[FitResult] = []
    seam = None

    fitted: list = []  # the models the cell's fits trained (rank 0 captures the rest of the cell's state after)

    def handler(request):
        fitted.append(request.model)
        _short_run(spec, request)
        seam.fitting += 1
        try:
            history = worker.fit(request)
        finally:
            seam.fitting -= 1
        reporter = reporters[-1] if reporters else None
        timings = {"cell_start": spec.get("cell_start"), "engine_start": started,
                   "first_step": getattr(reporter, "first_step_t", None), "fit_end": time.time(),
                   "virtual_step": worker.virtual_step.text() if worker.virtual_step is not None else None,
                   **worker.fit_timings}
        states = callbacks.collect(request.callbacks, worker.callback_changes) if worker.keeps_callbacks else []
        results.append(worker.result(request, history, getattr(reporter, "records", ()), timings, states))
        return history

    filename = f"<nbdist training cell, run {spec['run']}>"
    namespace = user_namespace()
    python = python_of(spec["cell"])
    # how the cell trains, as the kernel read it from the notebook (which has the source of every function)
    training = Training(**spec["training"]) if spec.get("training") else training_of(python, namespace)
    data = LoopData(spec["rank"], spec["size"], worker.synchronous)
    loop_reporter = LoopReporter(spec["run"], spec["rank"], publish_data, batch_size=data.batch_size,
                                 extra=worker.loop_extra)

    def monitor(seam):  # every quarter second, in a thread of its own: the records out, the controls in
        loop_reporter.update(seam.steps, seam.loss)
        flags = worker.poll_controls()
        if flags is not None:
            seam.controls_seen(flags)

    seam = StepSeam(worker, monitor, loops=training.loop)
    if training.loop:
        fresh_traces(namespace)
    _carry_states(spec.get("states"), namespace)
    _seed(spec)
    tree = cell_tree(python, filename, training.loops_at)
    cell_names = rank_zero_state = None
    if spec["rank"] == 0 and not training.loop:  # what the cell's names hold before it, to tell what it changed
        from .cell_state import before_cell

        cell_names, rank_zero_state = before_cell(tree, namespace)
    outcome = None
    with _interrupt_reported_short(spec["run"]), interrupt_guard.training(), working_directory(spec.get("cwd")), \
            _deterministic_ops(spec), callbacks.one_writer(spec["rank"], spec["size"]), worker.cell_context(), \
            intercept_fit(handler), (worker.loop_context() if training.loop else contextlib.nullcontext()), seam:
        outcome = run_statements(tree, filename, namespace, seam, data,
                                 capture=training.loop and spec["rank"] == 0,
                                 statement_ended=worker.statement_ended)
    if not results and not seam.outside_fit:
        raise NoFitCall(
            "the training cell finished without calling model.fit(...) or stepping an optimizer. Put the fit call "
            "(or the training loop) in the %%distribute cell (it may be inside a function from a definition cell), "
            "or run the cell without %%distribute."
        )
    if results and cell_names is not None:
        from .cell_state import after_cell

        results[-1].cell_state = after_cell(tree, namespace, cell_names, rank_zero_state, fitted)
    if seam.outside_fit:
        loop_reporter.update(seam.steps, seam.loss, final=True)
        timings = {"cell_start": spec.get("cell_start"), "engine_start": started,
                   "first_step": loop_reporter.first_step_t, "fit_end": time.time(), **worker.fit_timings}
        results.append(FitResult([], [], {}, {}, [], records=loop_reporter.records, timings=timings,
                                 loop={**outcome, "steps": seam.steps, "optimizers": len(seam.optimizers),
                                       "shards": data.shards}))
    return FitResult.pack(results)


def _carry_states(state, namespace: dict) -> None:
    """The cell's optimizers and metrics take the state the notebook's have (`loop_state.carried`)."""
    if state is None:
        return
    from .loop_state import install_state

    problems = install_state(state, namespace)
    if problems:
        print("nbdist: " + "; ".join(problems), file=sys.stderr)
