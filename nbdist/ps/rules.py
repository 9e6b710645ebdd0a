"""Optimizer update rules as pure functions on numpy arrays (in place), matching Keras 3's.

The parameter server applies the user's compiled optimizer with these: the same
hyper-parameters, the same arithmetic as `keras.optimizers.SGD` / `Adam`. Any other
optimizer, or an option these do not implement, is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import OptionError

CHUNK = 1 << 16  # elements per step of a large update

_UNSUPPORTED_OPTIONS = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema")


@dataclass
class OptimizerSpec:
    """The hyper-parameters of the user's optimizer, as plain values the PS can use."""

    name: str
    learning_rate: float
    momentum: float = 0.0
    nesterov: bool = False
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    schedule: dict | None = None  # a Keras LearningRateSchedule, serialised; followed by update count


def spec_from_keras(optimizer) -> OptimizerSpec:
    """Read SGD (momentum, Nesterov) or Adam from a compiled Keras optimizer; refuse the rest by name."""
    kind = type(optimizer).__name__
    if kind not in ("SGD", "Adam"):
        raise OptionError(f"the parameter server applies SGD (with momentum / Nesterov) and Adam. Received: "
                          f"optimizer={kind}. Compile with keras.optimizers.SGD or Adam, or use --strategy hfdt.")
    for option in _UNSUPPORTED_OPTIONS:
        value = getattr(optimizer, option, None)
        if value not in (None, False, 0, 0.0):
            raise OptionError(f"the parameter server does not implement `{option}`. Received: {option}={value!r}.")
    if kind == "Adam" and getattr(optimizer, "amsgrad", False):
        raise OptionError("the parameter server does not implement Adam's `amsgrad`. Received: amsgrad=True.")
    lr, schedule = _learning_rate_of(optimizer)
    if kind == "SGD":
        return OptimizerSpec("SGD", lr, momentum=float(optimizer.momentum), nesterov=bool(optimizer.nesterov),
                             schedule=schedule)
    return OptimizerSpec("Adam", lr, beta_1=float(optimizer.beta_1), beta_2=float(optimizer.beta_2),
                         epsilon=float(optimizer.epsilon), schedule=schedule)


def _learning_rate_of(optimizer) -> tuple[float, dict | None]:
    import keras

    value = getattr(optimizer, "_learning_rate", None)
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule):
        return float(value(0)), keras.saving.serialize_keras_object(value)
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
    """The per-variable slots the rule keeps (momentum; Adam's first and second moments)."""
    if spec.name == "SGD":
        return {"m": np.zeros(shape, dtype)} if spec.momentum else {}
    return {"m": np.zeros(shape, dtype), "v": np.zeros(shape, dtype)}


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
    m = state["m"]
    m *= spec.momentum
    m -= lr * g
    if spec.nesterov:
        w += spec.momentum * m - lr * g
    else:
        w += m


def _adam(spec, w, g, state, lr, step):
    t = step + 1
    alpha = lr * np.sqrt(1 - spec.beta_2 ** t) / (1 - spec.beta_1 ** t)
    m, v = state["m"], state["v"]
    m += (g - m) * (1 - spec.beta_1)
    v += (g * g - v) * (1 - spec.beta_2)
    w -= (alpha * m / (np.sqrt(v) + spec.epsilon)).astype(w.dtype, copy=False)
