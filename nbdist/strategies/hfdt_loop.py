"""`hfdt` under a cell's own training loop (DESIGN.md section 13): every rank runs the loop over its shard, and
every step of every optimizer averages its gradients over the ranks first (one fused allreduce, named by the
optimizer's number, which is the order of first steps and the same on every rank). Before an optimizer's first
step, rank 0's values of the variables it updates and of its own state are broadcast (inside a traced step,
eagerly, through `tf.init_scope`), and its learning rate is scaled as `fit`'s is (`--scale-lr`), restored when
the cell ends. The run's controls travel in the step's allreduce, so every rank pauses or stops after the same step.
"""

from __future__ import annotations

from . import horovod_ops as ops
from .control_step import StepControls


class HorovodLoop:
    """One rank's side of a loop cell under hfdt (made once Horovod's job is joined)."""

    def __init__(self, hvd, control, compression: str | None, scale_lr: bool):
        self.hvd, self.compression, self.scale_lr = hvd, compression, scale_lr
        self.controls = StepControls(control)  # `seen` set by the loop's monitor, `agreed` by each step
        self.started: set[int] = set()  # optimizers whose first step has been made
        self.learning_rates: list[tuple] = []  # (optimizer, the cell's learning rate) to restore

    def step(self, index: int, optimizer, grads: list, variables: list, apply):
        import tensorflow as tf

        if index not in self.started:
            with tf.init_scope():  # eagerly, also while a tf.function traces its first step
                self._first_step(index, optimizer, variables)
        averaged = ops.averaged(self.hvd, grads, self.compression, self.controls,
                                name=f"nbdist_loop_gradients_{index}")
        with tf.control_dependencies([g for g in averaged if g is not None]):
            apply(averaged, variables)
        return self.controls.agreed.read_value()

    def _first_step(self, index: int, optimizer, variables: list) -> None:
        self.started.add(index)
        if not optimizer.built:
            optimizer.build(variables)
        ops.broadcast_from_rank0(self.hvd, list(variables) + list(optimizer.variables))
        if self.scale_lr and self.hvd.size() > 1:
            from ..keras_semantics.learning_rate import scaled, schedule_of

            schedule = schedule_of(optimizer)
            self.learning_rates.append((optimizer, schedule if schedule is not None else
                                        float(optimizer.learning_rate)))
            optimizer.learning_rate = (scaled(schedule, self.hvd.size()) if schedule is not None
                                       else float(optimizer.learning_rate) * self.hvd.size())

    def restore(self) -> None:
        """The cell's own learning rates back in place, as a statement that stepped ends (what it leaves is what
        the notebook's optimizer receives); a later statement's first steps scale them again."""
        for optimizer, rate in self.learning_rates:
            optimizer.learning_rate = rate
        self.learning_rates, self.started = [], set()
