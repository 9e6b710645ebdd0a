"""Optimizer update rules as pure functions on numpy arrays (in place), matching Keras 3's.

The parameter server applies the user's compiled optimizer. For plain SGD (momentum,
Nesterov) and Adam it uses these numpy rules: the same hyper-parameters and the same
arithmetic as `keras.optimizers.SGD` / `Adam`, and faster per update than calling Keras
(docs/benchmarks.md, ps_bandwidth.py). Every other optimizer, or one of these with an
option the numpy rules do not implement (weight decay, clipping, EMA, amsgrad), is applied
by Keras itself on the shard (`nbdist.ps.keras_updater`), rebuilt from its config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import OptionError

CHUNK = 1 << 16  # elements per step of a large update

_NUMPY_UNSUPPORTED = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema")
NUMPY_RULES = ("SGD", "Adam")
KERAS = "keras"  # OptimizerSpec.name of an optimizer Keras applies on the shard


@dataclass
class OptimizerSpec:
    """The user's optimizer as the PS receives it: plain values for the numpy rules, and its Keras config."""

    name: str  # SGD or Adam (numpy rules), or KERAS
    learning_rate: float
    momentum: float = 0.0
    nesterov: bool = False
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    schedule: dict | None = None  # a Keras LearningRateSchedule, serialised; followed by update count
    keras: dict | None = None  # keras.optimizers.serialize(optimizer): what the Keras path rebuilds
    kind: str = ""  # the optimizer's class name, for messages


def spec_from_keras(optimizer) -> OptimizerSpec:
    """The PS's description of a compiled Keras optimizer; refuses what cannot travel, by name. A
    `LossScaleOptimizer` (mixed precision) is described by its inner optimizer: the shards apply unscaled float32
    gradients with it, and each worker keeps its loss scale (`inner_of`)."""
    import keras

    optimizer = inner_of(optimizer)
    kind = type(optimizer).__name__
    lr, schedule = _learning_rate_of(optimizer)
    config = keras.optimizers.serialize(optimizer)
    numpy_ok = kind in NUMPY_RULES and not getattr(optimizer, "amsgrad", False) and all(
        getattr(optimizer, option, None) in (None, False, 0, 0.0) for option in _NUMPY_UNSUPPORTED)
    if not numpy_ok:
        return OptimizerSpec(KERAS, lr, momentum=float(getattr(optimizer, "momentum", 0.0) or 0.0),
                             schedule=schedule, keras=config, kind=kind)
    if kind == "SGD":
        return OptimizerSpec("SGD", lr, momentum=float(optimizer.momentum), nesterov=bool(optimizer.nesterov),
                             schedule=schedule, keras=config, kind=kind)
    return OptimizerSpec("Adam", lr, beta_1=float(optimizer.beta_1), beta_2=float(optimizer.beta_2),
                         epsilon=float(optimizer.epsilon), schedule=schedule, keras=config, kind=kind)


def inner_of(optimizer):
    """The optimizer the shards apply: a `LossScaleOptimizer`'s inner one, any other as it is."""
    import keras

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def _learning_rate_of(optimizer) -> tuple[float, dict | None]:
    import keras

    from ..keras_semantics.learning_rate import schedule_of, unscaled

    schedule = schedule_of(optimizer)
    if schedule is not None:
        schedule = unscaled(schedule)
        return float(schedule(0)), keras.saving.serialize_keras_object(schedule)
    value = getattr(optimizer, "_learning_rate", None)
    if callable(value) and not hasattr(value, "numpy"):
        raise OptionError("the parameter server follows a constant learning rate or a "
                          "keras.optimizers.schedules.LearningRateSchedule; a plain callable cannot be sent to it.")
    return float(optimizer.learning_rate), None


def learning_rate(spec: OptimizerSpec, step: int) -> float:
    """The learning rate of update number `step` (0-based), following the user's schedule if any."""
    if spec.schedule is None:
        return spec.learning_rate
    return float(_schedule(json.dumps(spec.schedule, sort_keys=True))(step))


@lru_cache(maxsize=4)
def _schedule(serialised: str):
    import keras  # only a PS that follows a schedule pays for importing Keras

    return keras.saving.deserialize_keras_object(json.loads(serialised))


def new_state(spec: OptimizerSpec, shape, dtype=np.float32) -> dict[str, np.ndarray]:
    """The per-variable slots the rule keeps, named as Keras names them (momentum; Adam's velocity)."""
    if spec.name == "SGD":
        return {"momentum": np.zeros(shape, dtype)} if spec.momentum else {}
    return {"momentum": np.zeros(shape, dtype), "velocity": np.zeros(shape, dtype)}


def apply(spec: OptimizerSpec, w: np.ndarray, g: np.ndarray, state: dict, lr: float, step: int) -> None:
    """One update of `w` in place with gradient `g`; `step` counts updates already applied (Keras' iterations).

    Every rule is elementwise, so a large variable is updated a chunk at a time: the same
    arithmetic, with temporaries that stay in cache instead of fresh pages the size of `w`.
    """
    rule = _sgd if spec.name == "SGD" else _adam
    keys = list(state)
    for w_part, g_part, *slots in chunks([w, g, *state.values()]):
        rule(spec, w_part, g_part, dict(zip(keys, slots)), lr, step)


def chunks(arrays: list[np.ndarray]):
    """Matching flat views of equally sized C-contiguous arrays, CHUNK elements at a time
    (the whole arrays when small): elementwise rules then keep their temporaries in cache."""
    if arrays[0].size <= CHUNK:
        yield arrays
        return
    flat = [a.reshape(-1) for a in arrays]
    if any(not np.shares_memory(f, a) for f, a in zip(flat, arrays) if a.flags.writeable):
        raise ValueError("update rules need C-contiguous variables and slots")
    for start in range(0, flat[0].size, CHUNK):
        yield [f[start:start + CHUNK] for f in flat]


def _sgd(spec, w, g, state, lr, step):
    if not spec.momentum:
        w -= lr * g
        return
    m = state["momentum"]
    m *= spec.momentum
    m -= lr * g
    if spec.nesterov:
        w += spec.momentum * m - lr * g
    else:
        w += m


def _adam(spec, w, g, state, lr, step):
    t = step + 1
    alpha = lr * np.sqrt(1 - spec.beta_2 ** t) / (1 - spec.beta_1 ** t)
    m, v = state["momentum"], state["velocity"]
    m += (g - m) * (1 - spec.beta_1)
    v += (g * g - v) * (1 - spec.beta_2)
    w -= (alpha * m / (np.sqrt(v) + spec.epsilon)).astype(w.dtype, copy=False)
