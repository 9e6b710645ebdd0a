"""Code that runs inside an ipyparallel engine: probing, definition replay, the training cell."""

from __future__ import annotations

import contextlib
import linecache
import os
import socket
import time

DEFINITIONS_VAR = "__nbdist_definitions__"  # {key: digest} of definition cells run on this engine
VALUES_VAR = "__nbdist_values__"  # {name: (digest, id of the object received)} of values the notebook sent
NAMES_VAR = "__nbdist_names__"  # names that definition and training cells bound here (what `release` clears)


def _shell():
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("nbdist engine code must run inside an ipyparallel engine")
    return shell


def user_namespace() -> dict:
    """The engine's user namespace (where the training cell runs)."""
    return _shell().user_ns


def _run_source(source: str, filename: str) -> None:
    """Execute cell text (IPython syntax allowed) in the engine's namespace, with a readable traceback."""
    shell = _shell()
    python = shell.transform_cell(source)
    linecache.cache[filename] = (len(python), None, python.splitlines(True), filename)
    namespace = shell.user_ns
    before = dict(namespace)
    try:
        exec(compile(python, filename, "exec"), namespace)
    finally:  # a cell that failed half-way still leaves its names
        bound = {k for k, v in namespace.items() if k not in before or before[k] is not v}
        namespace.setdefault(NAMES_VAR, set()).update(bound - {NAMES_VAR})


def release() -> int:
    """Give back what nbdist's cells left on this engine: their names, then Keras' state and the memory
    TensorFlow can return (its GPU allocator keeps what it reserved until the process exits).

    Run on the engines of a cluster nbdist only connected to, when the notebook lets go of them.
    Returns how many names were cleared.
    """
    import gc
    import sys

    namespace = _shell().user_ns
    names = namespace.pop(NAMES_VAR, set())
    for name in names:
        namespace.pop(name, None)
    namespace.pop(DEFINITIONS_VAR, None)
    namespace.pop(VALUES_VAR, None)
    if "keras" in sys.modules:  # never import TensorFlow just to release it
        sys.modules["keras"].backend.clear_session(free_memory=True)
    gc.collect()
    return len(names)


def versions() -> dict:
    """The versions `%dist status` compares between the notebook and its engines, and this Python."""
    import sys
    from importlib import metadata

    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {"tensorflow": version("tensorflow") or version("tensorflow-cpu"), "keras": version("keras"),
            "horovod": version("horovod"), "nbdist": version("nbdist"), "python": sys.executable}


def machine() -> str:
    """What engines of one machine share (its GPUs): the boot id, else the host name."""
    return boot_id() or socket.gethostname()


def probe() -> dict:
    """What `%dist status` shows for this engine; importing TensorFlow here also warms the engine up
    (after `nbdist.gpus.pin` and `nbdist.threads.pin` when the kernel pinned this engine first)."""
    pinned = horovod_built = pools = None
    try:  # an engine with another nbdist may lack these modules: it still reports its versions
        from . import gpus, horovod, threads

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


def network_namespace() -> int | None:
    """The inode of this process's network namespace (Linux), None where there is none to read."""
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None


def boot_id() -> str | None:
    """This machine's boot id (Linux): engines with the kernel's run on the kernel's machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def definition_digests() -> dict:
    """The {key: digest} of the definition cells this engine has run."""
    return dict(_shell().user_ns.get(DEFINITIONS_VAR, {}))


def run_definition(key: str, digest: str, source: str, index, cwd: str | None = None) -> None:
    """Run one recorded definition cell and remember its digest; in the notebook's working directory `cwd`
    where this engine sees it (its relative paths then mean what they mean in the notebook)."""
    with working_directory(cwd):
        _run_source(source, f"<nbdist definition cell {index}>")
    _shell().user_ns.setdefault(DEFINITIONS_VAR, {})[key] = digest


@contextlib.contextmanager
def working_directory(path: str | None):
    """Within: the working directory is `path` when this engine sees that folder, else unchanged."""
    before = os.getcwd()
    if path and os.path.isdir(path):
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def paths_exist(paths: list[str]) -> list[bool]:
    """Which of these paths this engine sees."""
    return [os.path.exists(p) for p in paths]


def value_digests() -> dict:
    """The {name: digest} of the values the notebook sent that this engine still holds unchanged in name."""
    namespace = _shell().user_ns
    return {name: digest for name, (digest, ident) in namespace.get(VALUES_VAR, {}).items()
            if name in namespace and id(namespace[name]) == ident}


def receive_value(name: str, digest: str, value, pickled: bool = False, shard: tuple | None = None) -> None:
    """Bind a value the notebook sent (`nbdist.bring`); `shard` (rank, size, full length): it is this
    rank's strided shard of the notebook's array."""
    if pickled:
        import cloudpickle

        value = cloudpickle.loads(value)
    if shard is not None:
        from .sharding import mark_presharded

        mark_presharded(value, *shard)
    namespace = _shell().user_ns
    namespace[name] = value
    namespace.setdefault(VALUES_VAR, {})[name] = (digest, id(value))
    namespace.setdefault(NAMES_VAR, set()).add(name)


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


def run_training_cell(spec: dict) -> list:
    """Run the training cell with `fit` replaced by the strategy's worker; return one result per fit.

    Returns:
        a list of `FitResult` (one per `fit` call the cell made, in order).
    """
    from ipyparallel.datapub import publish_data

    from . import callbacks, interrupt_guard
    from .errors import NoFitCall
    from .keras_bridge import FitResult, intercept_fit
    from .strategies import REGISTRY
    from .telemetry import keras_reporter

    started = time.time()
    reporters = []

    def make_reporter(batch_size, **options):
        reporter = keras_reporter(spec["run"], spec["rank"], batch_size, publish=publish_data, **options)
        reporters.append(reporter)
        return reporter

    worker = REGISTRY[spec["strategy"]].worker_class(spec, make_reporter)
    results: list[FitResult] = []

    def handler(request):
        history = worker.fit(request)
        reporter = reporters[-1] if reporters else None
        timings = {"cell_start": spec.get("cell_start"), "engine_start": started,
                   "first_step": getattr(reporter, "first_step_t", None), "fit_end": time.time(),
                   "virtual_step": worker.virtual_step.text() if worker.virtual_step is not None else None,
                   **worker.fit_timings}
        states = callbacks.collect(request.callbacks, worker.callback_changes) if worker.keeps_callbacks else []
        results.append(worker.result(request, history, getattr(reporter, "records", ()), timings, states))
        return history

    _seed(spec)
    with interrupt_guard.training(), working_directory(spec.get("cwd")), _deterministic_ops(spec), \
            callbacks.one_writer(spec["rank"], spec["size"]), worker.cell_context(), intercept_fit(handler):
        _run_source(spec["cell"], f"<nbdist training cell, run {spec['run']}>")
    if not results:
        raise NoFitCall(
            "the training cell finished without calling model.fit(...). Put the fit call in the "
            "%%distribute cell (it may be inside a function from a definition cell), or run the cell without %%distribute."
        )
    return results
