"""What nbdist's cells leave in an engine's namespace: definition cells and values the notebook sent (with
their digests, so only what changed is sent again), the names they bound, and `release`, which clears them.
Runs inside an engine; imports nothing above it."""

from __future__ import annotations

import contextlib
import linecache
import os

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


def python_of(source: str) -> str:
    """Cell text (IPython syntax allowed) as the Python it runs."""
    return _shell().transform_cell(source)


def run_source(source: str, filename: str) -> None:
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


def definition_digests() -> dict:
    """The {key: digest} of the definition cells this engine has run."""
    return dict(_shell().user_ns.get(DEFINITIONS_VAR, {}))


def forget(keys: list[str]) -> None:
    """Forget that these were run here: they run again the next time they are sent."""
    for key in keys:
        _shell().user_ns.get(DEFINITIONS_VAR, {}).pop(key, None)


def run_definition(key: str, digest: str, source: str, index, cwd: str | None = None,
                   empty_weights: bool = False, random_state: dict | None = None) -> None:
    """Run one recorded definition cell and remember its digest; in the notebook's working directory `cwd`
    where this engine sees it (its relative paths then mean what they mean in the notebook). With
    `empty_weights` (a model-parallel run) the layers it builds get weights without values (`keras_semantics.empty_weights`);
    with `random_state` (the notebook's before the cell ran) it draws what it drew in the notebook."""
    from ..keras_semantics.empty_weights import weights_without_values
    from ..keras_semantics.keras_globals import drawing_as

    with working_directory(cwd), (weights_without_values() if empty_weights else contextlib.nullcontext()), \
            drawing_as(random_state):
        run_source(source, f"<nbdist definition cell {index}>")
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


def receive_value(name: str, digest: str, value, pickled: bool = False, shard: tuple | None = None,
                  cache: str | None = None) -> None:
    """Bind a value the notebook sent (`nbdist.notebook.bring`); `shard` (rank, size, full length): it is this
    rank's strided shard of the notebook's array; `cache`: an array this host's other engines map too, placed
    in the host's cache of that cluster (`host_cache`)."""
    if pickled:
        from ..keras_semantics.own_classes import loads

        value = loads(value, _shell().user_ns)  # (an optimizer of a class of the notebook's own)
    if shard is not None:
        from ..datasets.sharding import mark_presharded

        mark_presharded(value, *shard)
    if cache is not None:
        from ..datasets import host_cache

        value = host_cache.place(cache, digest, value)
    _bind_value(name, digest, value)


def map_value(name: str, digest: str, cache: str) -> bool:
    """Bind the array this host's cache holds under `digest`; False when it holds none (then send it)."""
    from ..datasets import host_cache

    value = host_cache.mapped(cache, digest)
    if value is None:
        return False
    _bind_value(name, digest, value)
    return True


def _bind_value(name: str, digest: str, value) -> None:
    namespace = _shell().user_ns
    namespace[name] = value
    namespace.setdefault(VALUES_VAR, {})[name] = (digest, id(value))
    namespace.setdefault(NAMES_VAR, set()).add(name)
