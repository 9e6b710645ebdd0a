"""A training cell on an engine, one top-level statement at a time: which statements stepped an optimizer (the
step seam counts), the worker told after each that did (a parameter-server worker waits there for the others'
last pushes), and on rank 0 what each left behind (`loop_state.capture`), which the notebook installs instead
of running the statement again. The names of the loops' data are wrapped (`training_code.shard_data_loops`) so
each worker iterates its shard (`loop_data.LoopData`)."""

from __future__ import annotations

import ast
import contextlib
import io
import linecache
import sys

from . import loop_state
from ..host.namespace import NAMES_VAR
from ..keras_semantics.training_code import DATA_WRAPPER, shard_data_loops


def cell_tree(python: str, filename: str, loops_at) -> ast.Module:
    """The cell's statements, its data loops (starting at `loops_at`) wrapped; its source kept for tracebacks
    under `filename`."""
    linecache.cache[filename] = (len(python), None, python.splitlines(True), filename)
    return shard_data_loops(ast.parse(python, filename), loops_at)


def fresh_traces(namespace: dict) -> list[str]:
    """Every `tf.function` of the engine's namespace made anew (same options): a trace holds the step as the run
    that traced it routed it (its Horovod job, its parameter-server client; a failed trace, half its variables),
    so this run traces its own. Returns their names."""
    renewed = []
    for name, value in list(namespace.items()):
        if callable(getattr(value, "experimental_get_tracing_count", None)) and hasattr(value, "_clone"):
            namespace[name] = value._clone(python_function=None)
            renewed.append(name)
    return renewed


def run_statements(tree: ast.Module, filename: str, namespace: dict, seam, data, capture: bool,
                   statement_ended=lambda: None) -> dict:
    """Run the statements of `tree` in `namespace`, `data` bound as the data loops' wrapper; returns
    {"snapshots": {statement index: Snapshot}, "stopped": bool, "ran": statements run} (snapshots on `capture` only)."""
    snapshots: dict[int, loop_state.Snapshot] = {}
    before_names = dict(namespace)
    namespace[DATA_WRAPPER] = data
    stopped, ran = False, 0
    try:
        for index, statement in enumerate(tree.body):
            ran = index + 1
            steps, before = seam.outside_fit, loop_state.fingerprints(statement, namespace) if capture else {}
            code = compile(ast.Module([statement], type_ignores=[]), filename, "exec")
            out = io.StringIO()
            try:
                with _tee(out, capture):
                    exec(code, namespace)
            except Exception:
                if not seam.stop_requested:
                    raise
                stopped = True
            if seam.outside_fit > steps:
                statement_ended()
                if capture:
                    snapshots[index] = loop_state.capture(statement, namespace, before)
                    snapshots[index].stdout = out.getvalue()
            if stopped:
                break
    finally:
        namespace.pop(DATA_WRAPPER, None)
        bound = {k for k, v in namespace.items() if k not in before_names or before_names[k] is not v}
        namespace.setdefault(NAMES_VAR, set()).update(bound - {NAMES_VAR})
    return {"snapshots": snapshots, "stopped": stopped, "ran": ran}


@contextlib.contextmanager
def _tee(buffer: io.StringIO, on: bool):
    """Within: what the statement prints also goes to `buffer` (rank 0's lines, shown under the cell)."""
    if not on:
        yield
        return
    original = sys.stdout

    class Tee(io.TextIOBase):
        def write(self, text):
            buffer.write(text)
            return original.write(text)

        def flush(self):
            original.flush()

    sys.stdout = Tee()
    try:
        yield
    finally:
        sys.stdout = original
