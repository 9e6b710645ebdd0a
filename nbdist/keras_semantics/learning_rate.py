"""A learning rate scaled by a factor (linear scaling, a live control), constant or a Keras schedule.

The scaled schedule is an instance of a subclass of the user's own schedule class with the
user's attributes, so it serialises exactly as the user's schedule (a ModelCheckpoint written
during training loads anywhere, with the user's own, unscaled schedule) while it returns
`base(step) * factor`, ramped up from 1 over `warmup_steps` steps after `start_step`.
"""

from __future__ import annotations

_subclasses: dict[type, type] = {}


def is_schedule(value) -> bool:
    import keras

    return isinstance(value, keras.optimizers.schedules.LearningRateSchedule)


def schedule_of(optimizer):
    """The optimizer's LearningRateSchedule, or None for a constant (variable) learning rate.

    Keras keeps the schedule in the private `_learning_rate` (its public `learning_rate` is
    the current value): this is the one place nbdist reads it.
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's rate is its inner's
    value = getattr(optimizer, "_learning_rate", None)
    return value if is_schedule(value) else None


def scaled(base, factor: float, warmup_steps: int = 0, start_step: int = 0):
    """`base` (a LearningRateSchedule) times `factor`, ramped over `warmup_steps` steps from `start_step`."""
    base = getattr(base, "nbdist_base", base)
    cls = _scaled_class(type(base))
    schedule = cls.__new__(cls)
    schedule.__dict__.update(vars(base))
    schedule.nbdist_base, schedule.nbdist_factor = base, float(factor)
    schedule.nbdist_warmup, schedule.nbdist_start = int(warmup_steps), int(start_step)
    return schedule


def unscaled(schedule):
    """The user's own schedule behind a scaled one (itself otherwise)."""
    return getattr(schedule, "nbdist_base", schedule)


def _scaled_class(base_cls: type) -> type:
    if base_cls not in _subclasses:
        def __call__(self, step):
            from keras import ops

            value = self.nbdist_base(step)
            if self.nbdist_factor == 1.0:
                return value
            ramp = 1.0
            if self.nbdist_warmup > 0:
                done = ops.cast(step, "float32") - float(self.nbdist_start)
                ramp = ops.clip(done / float(self.nbdist_warmup), 0.0, 1.0)
            return value * (1.0 + (self.nbdist_factor - 1.0) * ramp)

        # `__class__` answers the user's class, so Keras serialises (and pickles) a scaled schedule as the
        # user's own; calls still go through this subclass (Python looks special methods up on the type).
        def __reduce__(self):
            return scaled, (self.nbdist_base, self.nbdist_factor, self.nbdist_warmup, self.nbdist_start)

        cls = type(base_cls.__name__, (base_cls,), {"__call__": __call__, "__reduce__": __reduce__,
                                                     "__class__": property(lambda self: base_cls),
                                                     "__module__": base_cls.__module__})
        _subclasses[base_cls] = cls
    return _subclasses[base_cls]
