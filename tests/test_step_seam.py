"""The step seam's controls in this process (no engine): where a loop's step runs once per call of its
`tf.function`, the traced step holds nothing for the run's controls (a millisecond's step lost 2-4 % to the
condition that was there) and a pause or a stop the monitor saw acts before the loop's next call; a step traced
into a loop of its function keeps the condition and acts inside."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from nbdist.keras_semantics.step_seam import LoopStopped, StepSeam  # noqa: E402

CONTROL_OPS = {"If", "StatelessIf", "PyFunc", "EagerPyFunc"}


class Router:
    """`local`'s routing (the step as it is, no flags agreed in it) with a pause that waits for `resume`."""

    synchronous = False

    def __init__(self):
        self.acted: list[list[float]] = []
        self.resume = threading.Event()

    def step(self, index, optimizer, grads, variables, apply):
        apply(grads, variables)
        return None

    def routes_in_fit(self, optimizer):
        return False

    def act_on_controls(self, flags):
        self.acted.append([float(f) for f in flags])
        if flags[1] > 0:
            raise LoopStopped("the run was stopped")
        if flags[0] > 0:
            assert self.resume.wait(30)


def _training():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
    x, y = np.ones((8, 4), np.float32), np.ones((8, 2), np.float32)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        return loss

    @tf.function
    def three_steps():
        for _ in tf.range(3):
            step()
        return 0

    return {"traced": tf.function(step), "eager": step, "in a loop": three_steps}, optimizer


def _op_types(function) -> set[str]:
    graph = function.get_concrete_function().graph
    types = {op.type for op in graph.get_operations()}
    for inner in graph._functions.values():  # the bodies of its loops and branches
        types |= {node.op for node in inner.definition.node_def}
    return types


def test_a_step_traced_once_per_call_holds_no_control_and_a_stop_acts_before_the_next_call():
    functions, optimizer = _training()
    router = Router()
    with StepSeam(router, loops=True) as seam:
        functions["traced"]()
        functions["traced"]()
        assert not CONTROL_OPS & _op_types(functions["traced"])
        assert seam.steps == 2
        seam.controls_seen([0.0, 1.0])
        with pytest.raises(LoopStopped):
            functions["traced"]()
        assert seam.stop_requested and seam.steps == 2 and int(optimizer.iterations.numpy()) == 2
        assert router.acted == [[0.0, 1.0]]
        functions["traced"]()  # after the stop nothing acts again (what rank 0 captures may call functions)
    assert router.acted == [[0.0, 1.0]]


def test_a_pause_waits_before_the_next_call_and_the_loop_goes_on_after_the_resume():
    functions, optimizer = _training()
    router = Router()
    with StepSeam(router, loops=True) as seam:
        functions["traced"]()
        seam.controls_seen([1.0, 0.0])
        threading.Timer(0.3, lambda: (seam.controls_seen([0.0, 0.0]), router.resume.set())).start()
        started = time.monotonic()
        functions["traced"]()
        assert time.monotonic() - started >= 0.25
        functions["traced"]()
        assert router.acted == [[1.0, 0.0]] and seam.steps == 3 and not seam.stop_requested


def test_an_eager_step_acts_right_after_its_update():
    functions, optimizer = _training()
    router = Router()
    with StepSeam(router, loops=True) as seam:
        functions["eager"]()
        seam.controls_seen([0.0, 1.0])
        with pytest.raises(LoopStopped):
            functions["eager"]()
        assert seam.steps == 2 and int(optimizer.iterations.numpy()) == 2


def test_a_step_traced_into_a_loop_of_its_function_keeps_the_condition():
    functions, optimizer = _training()
    router = Router()
    with StepSeam(router, loops=True) as seam:
        functions["in a loop"]()
        assert {"PyFunc", "EagerPyFunc"} & _op_types(functions["in a loop"])
        assert seam.steps == 3
        seam.controls_seen([0.0, 1.0])
        seam._pending = None  # (as if the monitor saw the stop after the call began: the condition acts in it)
        with pytest.raises(Exception):
            functions["in a loop"]()
        assert seam.stop_requested and seam.steps == 4 and router.acted == [[0.0, 1.0]]


def test_the_calls_are_unchecked_again_after_the_seam():
    from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    calls = Function.__call__, ConcreteFunction.__call__
    with StepSeam(Router(), loops=True):
        assert (Function.__call__, ConcreteFunction.__call__) != calls
    assert (Function.__call__, ConcreteFunction.__call__) == calls
    with StepSeam(Router(), loops=False):  # a fit cell: no loop, nothing to check
        assert (Function.__call__, ConcreteFunction.__call__) == calls
