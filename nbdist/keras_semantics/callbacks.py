"""The training cell's own Keras callbacks on the workers, and their state brought back to the notebook.

Decision (docs/callbacks.md): each callback object in the notebook receives the attributes of
rank 0's copy after training (everything but its model), rather than having its epoch hooks
replayed from the History. A state copy is exact for any callback, including batch-level
hooks and private counters (EarlyStopping's `wait`, ReduceLROnPlateau's `cooldown_counter`,
a recorder's lists); a replay could only reproduce what the History logged.

Callbacks that write files run on rank 0 only (two ranks writing one checkpoint path corrupt
it), and so do the cell's own saves after `fit` (`one_writer`); TensorBoard runs on every rank with a
log directory per rank.
"""

from __future__ import annotations

import contextlib
import socket

# Keras callbacks whose job is writing files: one writer per run.
RANK_ZERO_ONLY = ("ModelCheckpoint", "CSVLogger", "BackupAndRestore")
PER_RANK_LOG_DIR = ("TensorBoard",)
_SKIPPED_TYPES = ("Layer", "Model", "Variable", "Optimizer", "EagerTensor", "Tensor", "ResourceVariable")


def _class_names(obj) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def for_rank(callbacks, rank: int, size: int) -> tuple[list, list[dict]]:
    """The callbacks worker `rank` of `size` runs, and the attribute changes made for it (undone by `collect`).

    Rank 0 runs every callback; other ranks skip the file writers. With several workers a
    TensorBoard callback writes under `<log_dir>/rank-<rank>` on every rank.
    """
    kept, changes = [], []
    for callback in callbacks or []:
        names = _class_names(callback)
        if rank != 0 and names & set(RANK_ZERO_ONLY):
            continue
        if size > 1 and names & set(PER_RANK_LOG_DIR) and getattr(callback, "log_dir", None):
            changes.append({"callback": callback, "attr": "log_dir", "value": callback.log_dir})
            callback.log_dir = f"{callback.log_dir.rstrip('/')}/rank-{rank}"
        kept.append(callback)
    return kept, changes


def collect(callbacks, changes: list[dict]) -> list[bytes]:
    """Each user callback's state after training (its picklable attributes except the model), cloudpickled:
    lambdas and closures in a callback's state travel too (ipyparallel's own pickling refuses them).

    Attributes changed by `for_rank` are reported with the user's own value.
    """
    import cloudpickle

    for change in changes:
        setattr(change["callback"], change["attr"], change["value"])
    states = []
    for callback in callbacks or []:
        state = {}
        for name, value in vars(callback).items():
            if name in ("_model", "model") or _is_model_object(value):
                continue
            try:
                cloudpickle.dumps(value)
            except Exception:  # open files, writers, locks: not state a notebook can use
                continue
            state[name] = value
        states.append(cloudpickle.dumps(state))
    return states


def _is_model_object(value) -> bool:
    return bool(_class_names(value) & set(_SKIPPED_TYPES))


def restore(callbacks, states: list[bytes | None], model, params: dict | None) -> None:
    """Give the notebook's callback objects the state rank 0's copies ended with."""
    import pickle

    for callback, blob in zip(callbacks or [], states or []):
        if blob is None:
            continue
        for name, value in pickle.loads(blob).items():
            setattr(callback, name, value)
        callback.set_model(model)
        if params is not None:
            callback.set_params(dict(params))


def files_written(callbacks) -> list[dict]:
    """Where rank 0's file-writing callbacks put their files: [{"callback", "path", "host"}]."""
    import os

    found = []
    for callback in callbacks or []:
        names = _class_names(callback)
        for attr in ("filepath", "filename", "backup_dir", "log_dir"):
            path = getattr(callback, attr, None)
            if path and names & set(RANK_ZERO_ONLY + PER_RANK_LOG_DIR):
                found.append({"callback": type(callback).__name__, "path": os.path.abspath(str(path)),
                              "host": socket.gethostname()})
                break
    return found


SAVERS = ("save", "save_weights", "export")  # keras.Model's methods that write files


@contextlib.contextmanager
def one_writer(rank: int, size: int):
    """Within (the training cell on an engine): only rank 0 of several writes the model's files, so code after
    `fit` that saves (`model.save(path)`, `save_weights`, `export`), run on every rank, writes each file once;
    the other ranks' calls do nothing. The files are rank 0's, complete before any rank returns from `fit`
    (each strategy's end-of-fit barrier)."""
    if rank == 0 or size < 2:
        yield
        return
    import keras

    originals = {name: getattr(keras.Model, name) for name in SAVERS}
    for name in originals:
        setattr(keras.Model, name, _skipped(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(keras.Model, name, original)


def _skipped(name: str):
    def skipped(self, *args, **kwargs):
        return None  # rank 0 writes this file

    skipped.__name__ = name
    return skipped


def set_monitor_directions(callbacks, model) -> None:
    """Give each monitoring callback (`ModelCheckpoint`, `EarlyStopping`, ... with `mode="auto"`) the direction of
    its metric as `model`, compiled by the cell, defines it. Keras reads it from the metrics of the model the
    callback runs with, which a worker's model may not hold (a pipeline stage before the last computes no
    metric, yet its logs carry every stage's agreed metrics)."""
    from keras import ops

    for callback in callbacks or []:  # (Keras' MonitorCallback is not public: what it holds says what it is)
        if not all(hasattr(callback, a) for a in ("monitor", "mode", "monitor_op", "min_delta")) \
                or callback.mode != "auto" or callback.monitor_op is not None:
            continue
        up = metric_direction(model, callback.monitor.removeprefix("val_"))
        if up is not None:
            callback.monitor_op = ops.greater if up else ops.less
            if not up:
                callback.min_delta *= -1  # as Keras' own `_set_monitor_op` leaves a decreasing monitor


def metric_direction(model, name: str) -> bool | None:
    """True where the cell's compiled metric `name` improves upwards, False downwards, None where not known."""
    import keras

    if name == "loss" or name.endswith("_loss"):
        return False
    config = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    for key in ("metrics", "weighted_metrics"):
        for metric in keras.tree.flatten(config.get(key)) if config.get(key) is not None else []:
            if isinstance(metric, str) and metric == name:
                metric = keras.metrics.get(metric)
            if getattr(metric, "name", None) == name and hasattr(metric, "_direction"):
                return metric._direction == "up"
    return None
