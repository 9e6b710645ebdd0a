"""A shard that applies the cell's own Keras optimizer (RMSprop, AdamW, Adagrad, ... any of them).

The optimizer is rebuilt from its config (`keras.optimizers.deserialize`) over Keras
variables that mirror the shard's numpy arrays, so Keras does every part of the update
(schedules, weight decay, clipping, EMA) exactly as in a local `fit`. Imports TensorFlow:
only shards that need it pay for it. Clipping by global norm sees the shard's variables,
so with several shards it clips each shard's part of the gradient separately.
"""

from __future__ import annotations

import numpy as np

from ..keras_semantics.learning_rate import schedule_of
from ..keras_semantics.optimizer_state import ITERATIONS


def warm_up() -> None:
    """Import Keras and run one traced optimizer step on a throwaway variable. A process's first trace pays for
    TensorFlow's lazy loading (seconds on a loaded machine): a shard does it in a thread while it answers on."""
    import keras
    import tensorflow as tf

    variable = keras.Variable(np.zeros(1, np.float32))
    optimizer = keras.optimizers.SGD(0.0)
    tf.function(lambda grad: optimizer.apply([grad], [variable]))(tf.zeros(1))


class KerasUpdater:
    """The updater (see `nbdist.ps.updaters`) that hands each gradient to a Keras optimizer."""

    per_variable = True  # the shard hands it each variable (views of its flat arrays), not the flat arrays

    def __init__(self, config: dict, variables: dict[str, np.ndarray], saved: dict, iterations: int = 0):
        import keras
        import tensorflow as tf

        from ..keras_semantics import optimizer_state

        self.names = list(variables)
        self.optimizer = keras.optimizers.deserialize(config)
        self.keras_variables = [keras.Variable(value, name=f"v{i:05d}", dtype=value.dtype.name)
                                for i, value in enumerate(variables.values())]
        self.optimizer.build(self.keras_variables)
        optimizer_state.load(self.optimizer, self.keras_variables, self.names, saved, int(iterations))
        self._tf = tf
        self._lr_scale = 1.0
        self._base_lr = None if schedule_of(self.optimizer) else float(self.optimizer.learning_rate)
        self._step = self._compile()

    def _compile(self):
        optimizer, variables = self.optimizer, self.keras_variables

        @self._tf.function
        def step(grads):
            optimizer.apply(grads, variables)

        return step

    def sent(self, worker: int, variables: dict[str, np.ndarray]) -> None:
        """Which weights a worker computes on does not matter to this rule."""

    def apply(self, variables: dict, grads: dict, worker: int, tau: int, version: int, lr_scale: float = 1.0) -> dict:
        if lr_scale != self._lr_scale:
            self._set_scale(lr_scale)
        lr = float(self.optimizer.learning_rate)
        self._step([self._tf.convert_to_tensor(grads[name]) for name in self.names])
        for name, variable in zip(self.names, self.keras_variables):
            if name in variables:
                np.copyto(variables[name], variable.numpy())
        return {"outcome": "applied", "gamma": None, "momentum": None, "comp_norm": None, "lr": lr}

    def _set_scale(self, scale: float) -> None:
        from ..keras_semantics.learning_rate import scaled, unscaled

        schedule = schedule_of(self.optimizer)
        if schedule is None:
            self.optimizer.learning_rate = self._base_lr * scale
        else:
            self.optimizer.learning_rate = scaled(unscaled(schedule), scale)
            self._step = self._compile()  # the schedule object is part of the traced step
        self._lr_scale = scale

    def set_learning_rate(self, value: float) -> None:
        """The cell's callbacks changed the (constant) learning rate."""
        if self._base_lr is not None:
            self._base_lr = value
            self.optimizer.learning_rate = value * self._lr_scale

    def finalize(self, variables: dict) -> None:
        """EMA (`use_ema=True`): the final weights are the moving averages, as Keras' own fit ends."""
        if getattr(self.optimizer, "use_ema", False):
            self.optimizer.finalize_variable_values(self.keras_variables)
            for name, variable in zip(self.names, self.keras_variables):
                np.copyto(variables[name], variable.numpy())

    def state(self) -> dict[str, np.ndarray]:
        from ..keras_semantics import optimizer_state

        arrays, step = optimizer_state.export(self.optimizer, self.keras_variables, self.names)
        return {**arrays, ITERATIONS: np.array(step, np.int64)}
