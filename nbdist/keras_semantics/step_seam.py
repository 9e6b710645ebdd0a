"""The optimizer step as the seam (DESIGN.md section 13): within a training cell on an engine, every step of a
Keras optimizer (`apply`, which `apply_gradients` and Keras' own train steps end in), eager or traced into a
`tf.function`, goes through the worker's `step` (Horovod's allreduce first, a push-pull with the parameter
server instead, or the step as it is); each optimizer is numbered in the order of its first step, the same on
every rank. The seam counts the steps of the first optimizer, reads the loss each step's gradients came from
(the target of the `tape.gradient` just before) and hands both to `on_step` after the update, in Python: where
the step is traced, through one `tf.numpy_function` op in it.

The run's controls (pause, stop) act between steps. Where the ranks agree them in the step (a synchronous router
returns the flags), the traced step holds the condition that calls Python while one is on. Otherwise (the flags
the monitor thread read) a step that runs once per Python call holds nothing for them: eager, or traced straight
into the graph of the `tf.function` the loop calls (not in a loop, branch or function inside it). The next call of
a `tf.function` (or the next eager step) acts on them in Python instead: a Dense step of a millisecond lost 2-4 % to
that condition and its variable reads (benchmarks/training_loop.py, docs/benchmarks.md).

Inside `fit` the strategy's own path keeps what it routes (`Worker.routes_in_fit`).
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np


class LoopStopped(Exception):
    """The run's controls said stop: a hand-written loop ends between two steps (raised from the step's hook)."""


class StepSeam:
    """A context manager: every optimizer step of the cell goes to `router.step(index, optimizer, grads,
    variables, apply)` (which returns this step's agreed control flags as a tensor, or None); `router.routes_in_fit
    (optimizer)` says which steps made inside `fit` it takes (the others run as they are).

    Nothing of Python runs in a traced step for the seam: the step counts itself and keeps its loss in variables,
    and `router.act_on_controls(flags)` is called only when a control is on (the flags the step agreed, or what
    `controls_seen` set: in the step where it runs more than once per call, else before the loop's next call of a
    `tf.function`). `monitor(seam)`, if given, runs every `MONITOR_S` in a thread of its own while the seam is open
    (it publishes the records and reads the run's controls)."""

    MONITOR_S = 0.25

    def __init__(self, router, monitor=None, loops: bool = True):
        self.router = router
        self.monitor = monitor
        self.loops = loops  # False: the cell trains by fit, and a step of its own outside fit is refused
        self.stop_requested = False  # the controls said stop (act_on_controls raised LoopStopped)
        self.optimizers: list = []  # in the order of their first step
        self.fitting = 0  # fit calls in progress
        self._target = threading.local()  # the last tape.gradient target of this thread
        self._wrapped = threading.local()  # on: inside a routed wrapper's own apply (its inner step is not routed)
        self._saved: list = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending = None  # the flags `controls_seen` set while a control is on, for the loop's thread to act on
        self._last_seen = None  # the flags last assigned to the variables
        self._loop_thread: threading.Thread | None = None  # the thread the cell runs in (that enters the seam)
        self._acting = False  # in `_between_calls`' act (what it calls is not checked again)

    @property
    def steps(self) -> int:
        """Steps of the first optimizer, outside fit."""
        return int(self._steps.numpy())

    @property
    def outside_fit(self) -> int:
        """Steps of any optimizer, outside fit."""
        return int(self._steps.numpy()) + int(self._others.numpy())

    @property
    def loss(self) -> float | None:
        """The loss of the first optimizer's last step (None if unknown)."""
        value = float(self._loss.numpy())
        return value if math.isfinite(value) else None

    # -- the patches ------------------------------------------------------------------------------------
    def __enter__(self):
        import tensorflow as tf
        from keras.src.optimizers.base_optimizer import BaseOptimizer

        with tf.init_scope():
            self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="nbdist_steps")
            self._others = tf.Variable(0, dtype=tf.int64, trainable=False, name="nbdist_steps_others")
            self._loss = tf.Variable(math.nan, dtype=tf.float32, trainable=False, name="nbdist_loss")
            self._seen = tf.Variable(np.zeros(2, np.float32), trainable=False, name="nbdist_controls")
            self._on = tf.Variable(False, trainable=False, name="nbdist_control_on")
        from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

        seam, apply, gradient = self, BaseOptimizer.apply, tf.GradientTape.gradient
        scaled_apply = LossScaleOptimizer.apply

        def routed_apply(optimizer, grads, trainable_variables=None):
            grads = list(grads)
            if not grads or not seam.takes(optimizer) or getattr(seam._wrapped, "on", False):
                return apply(optimizer, grads, trainable_variables)
            variables = list(trainable_variables if trainable_variables is not None
                             else optimizer._trainable_variables)
            return seam.step(optimizer, grads, variables, lambda g, v: apply(optimizer, g, v))

        def routed_scaled_apply(optimizer, grads, trainable_variables=None):
            """A LossScaleOptimizer's step: a synchronous router takes it whole (the loss-scaled gradients averaged
            first, so every rank finds the same overflow and skips the same steps); otherwise its inner
            optimizer's step is the seam's, made with the unscaled gradients when they are finite."""
            grads = list(grads)
            if not grads or not seam.takes(optimizer) or not getattr(seam.router, "synchronous", False):
                return scaled_apply(optimizer, grads, trainable_variables)
            variables = list(trainable_variables if trainable_variables is not None
                             else optimizer._trainable_variables)
            return seam.step(optimizer, grads, variables, lambda g, v: seam._unrouted(scaled_apply, optimizer, g, v))

        def noted_gradient(tape, target, *args, **kwargs):
            seam._target.value = target
            return gradient(tape, target, *args, **kwargs)

        routed_apply.__doc__, noted_gradient.__doc__ = apply.__doc__, gradient.__doc__
        self._saved = [(BaseOptimizer, "apply", apply), (tf.GradientTape, "gradient", gradient),
                       (LossScaleOptimizer, "apply", scaled_apply)]
        BaseOptimizer.apply, tf.GradientTape.gradient = routed_apply, noted_gradient
        LossScaleOptimizer.apply = routed_scaled_apply
        self._loop_thread = threading.current_thread()
        if self.loops:
            self._check_calls()
        if self.monitor is not None and self.loops:
            self._thread = threading.Thread(target=self._watch, name="nbdist-loop-monitor", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        self._saved = []
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _check_calls(self) -> None:
        """Within: every call of a `tf.function` (or of a concrete function) first acts on a control that is on,
        in the loop's thread, outside any trace: the point between two steps that a step traced once per call has."""
        from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        for owner in (Function, ConcreteFunction):
            self._saved.append((owner, "__call__", owner.__call__))
            owner.__call__ = _checked(owner.__call__, self)

    def _between_calls(self) -> None:
        """Act on the flags `controls_seen` set, where the loop's thread calls a function eagerly."""
        import tensorflow as tf

        flags = self._pending
        if flags is None or self.stop_requested or self._acting or \
                threading.current_thread() is not self._loop_thread or not tf.executing_eagerly():
            return
        self._acting = True
        try:
            self._act(flags)
        finally:
            self._acting = False

    def _unrouted(self, apply, optimizer, grads, variables):
        """`apply` with the optimizer steps it makes inside (a wrapper's inner optimizer) not routed again."""
        self._wrapped.on = True
        try:
            return apply(optimizer, grads, variables)
        finally:
            self._wrapped.on = False

    def _watch(self) -> None:
        import sys
        import traceback

        while not self._done.wait(self.MONITOR_S):
            try:
                self.monitor(self)
            except Exception:  # noqa: BLE001 - the loop trains on; its live view says nothing more
                print("nbdist: the loop's monitor stopped (the run trains on, unseen):", file=sys.stderr)
                traceback.print_exc()
                return

    # -- one step --------------------------------------------------------------------------------------
    def takes(self, optimizer) -> bool:
        """Whether this step is the seam's: every step outside fit; inside it, those the router takes."""
        return not self.fitting or self.router.routes_in_fit(optimizer)

    def index(self, optimizer) -> int:
        """The optimizer's number: the order of its first step (the same on every rank)."""
        for i, known in enumerate(self.optimizers):
            if known is optimizer:
                return i
        self.optimizers.append(optimizer)
        return len(self.optimizers) - 1

    def step(self, optimizer, grads, variables, apply):
        import tensorflow as tf

        if not self.fitting and not self.loops:
            from ..errors import OptionError

            raise OptionError("this cell steps an optimizer itself (a loop of its own) besides calling fit(...): "
                              "put the hand-written loop and the fit in cells of their own")
        index, loss = self.index(optimizer), self._loss_of_step()
        flags = self.router.step(index, optimizer, grads, variables, apply)
        if self.fitting:
            return None
        if index == 0:  # (as few ops as can be: a small model's step is a millisecond)
            self._steps.assign_add(1)
            if loss is not None:
                self._loss.assign(loss)
        else:
            self._others.assign_add(1)
        if flags is None and self._once_per_call():
            self._between_calls()  # (eager: acts now; traced: the loop's next call acts, see `_check_calls`)
            return None
        if flags is None:
            flags, on = self._seen, self._on
        else:
            flags = tf.cast(flags, tf.float32)
            on = tf.reduce_max(flags) > 0
        # Python only while a control is on (a pause waits there, a stop ends the loop)
        tf.cond(on, lambda: tf.numpy_function(self._act, [flags], tf.int64, stateful=True, name="nbdist_controls"),
                lambda: tf.constant(0, tf.int64))
        return None

    def controls_seen(self, flags) -> None:
        """The run's controls as the worker sees them ([paused, stop]), for the steps that agree none themselves."""
        flags = np.asarray(flags, np.float32)
        on = bool(flags.max() > 0)
        self._pending = flags if on else None
        if self._last_seen is None or not np.array_equal(flags, self._last_seen):  # (the steps read them)
            self._seen.assign(flags)
            self._on.assign(on)
            self._last_seen = flags

    @staticmethod
    def _once_per_call() -> bool:
        """Whether the step being made runs once per Python call of what makes it: eagerly, or traced straight
        into a `tf.function`'s own graph (not into a loop's body, a branch, or a function that graph calls)."""
        import tensorflow as tf
        from tensorflow.python.framework.func_graph import FuncGraph

        if tf.executing_eagerly():
            return True
        graph = tf.compat.v1.get_default_graph()
        return isinstance(graph, FuncGraph) and not isinstance(getattr(graph, "outer_graph", None), FuncGraph)

    def _act(self, flags) -> np.int64:
        try:
            self.router.act_on_controls(np.asarray(flags))
        except LoopStopped:
            self.stop_requested = True
            raise
        return np.int64(0)

    def _loss_of_step(self):
        """The loss the step's gradients came from, as a float32 scalar of this graph (None if unknown)."""
        import tensorflow as tf

        target = getattr(self._target, "value", None)
        self._target.value = None
        flat = [t for t in tf.nest.flatten(target) if tf.is_tensor(t)] if target is not None else []
        if not flat:
            return None
        tensor = flat[0]
        symbolic = tf.is_symbolic_tensor(tensor)
        if symbolic == tf.executing_eagerly():  # computed in another graph than this step's
            return None
        if symbolic and tensor.graph is not tf.compat.v1.get_default_graph():
            return None
        tensor = tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)
        return tensor if tensor.shape.rank == 0 else tf.reduce_mean(tensor)


def _checked(call, seam: StepSeam):
    """`call` (a function's `__call__`) acting first on a control that is on (`StepSeam._check_calls`)."""

    def checked_call(fn, *args, **kwargs):
        if seam._pending is not None:
            seam._between_calls()
        return call(fn, *args, **kwargs)

    checked_call.__doc__ = call.__doc__
    return checked_call


@contextlib.contextmanager
def no_steps_here():
    """Within (the notebook's replay of a loop cell): an optimizer step is an error, never a silent local step; the
    statements that stepped on the engines are installed, not run."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    from ..errors import NbdistError

    apply = BaseOptimizer.apply

    def refused(optimizer, grads, trainable_variables=None):
        raise NbdistError("a statement of the cell stepped an optimizer in the notebook while nbdist replayed it "
                          "(it made no step on the engines): nbdist installs what the engines' steps left instead, "
                          "so the step was refused. Make the steps the same on the engines and here.")

    BaseOptimizer.apply = refused
    try:
        yield
    finally:
        BaseOptimizer.apply = apply
