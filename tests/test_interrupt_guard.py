"""The engine-side guard: SIGINT interrupts a training cell, and is dropped just after one ends."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import pytest

from nbdist.host import interrupt_guard
from nbdist.limits import LIMITS


@pytest.fixture
def guard(monkeypatch):
    previous = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(interrupt_guard, "_state", interrupt_guard._State())
    yield interrupt_guard
    signal.signal(signal.SIGINT, previous)


def interrupt():
    os.kill(os.getpid(), signal.SIGINT)


def test_sigint_interrupts_a_training_cell(guard):
    with pytest.raises(KeyboardInterrupt):
        with guard.training():
            interrupt()


def test_a_late_sigint_is_dropped_then_the_engines_own_handler_has_it_again(guard, monkeypatch):
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    with guard.training():
        pass
    interrupt()  # just after the cell: meant for a run that has ended, it would break the engine's reply
    assert seen == []
    monkeypatch.setattr(guard._state, "ended_at", guard._state.ended_at - LIMITS.late_interrupt_s)
    interrupt()
    assert seen == [signal.SIGINT]


def test_an_interrupt_while_training_calls_what_waits_inside_an_op_from_another_thread(guard):
    """A SIGINT also wakes the guard's own thread (the main thread may sit inside TensorFlow, where Python's
    handler cannot run): what the cell registered gives up at once; the wake-up fd is given back after."""
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    gave_up = threading.Event()
    with guard.training(), guard.on_interrupt(gave_up.set):
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(10)  # bounded: the handler's KeyboardInterrupt ends it
        assert gave_up.wait(10)
    assert signal.set_wakeup_fd(before) == before


def test_a_graph_an_interrupt_left_the_default_is_undone_before_the_next_training_cell(guard):
    import tensorflow as tf
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    # what an interrupt leaves between TensorFlow's entering a graph (Graph.as_default) and the `try` that exits it
    graph = tf.Graph()
    ops._default_graph_stack.stack.append(graph)
    context.context().context_switches.push(graph.building_function, graph.as_default, graph._device_function_stack)
    context.context()._thread_local_data.is_eager = False
    assert not tf.executing_eagerly()
    with guard.training():
        assert tf.executing_eagerly()
        assert float(tf.Variable(2.0).numpy()) == 2.0


def test_an_interrupt_an_op_took_for_its_own_failure_still_ends_a_survivors_wait(guard):
    """A SIGINT taken inside a TensorFlow op surfaces as that op's error, which an elastic `hfdt` rank would read as
    a broken collective and wait (up to LIMITS.reform_s) for a re-formed job: the interrupt ends it instead."""
    import tensorflow as tf

    from nbdist.strategies.control_bus import ControlBus, ControlPoint
    from nbdist.strategies.hfdt_elastic import Survivor
    from tests.support import within

    bus = ControlBus().start("127.0.0.1")
    control = ControlPoint(bus.spec())
    survivor = Survivor(None, None, control, join=None, resized=None, left=lambda generation: None)

    def step_whose_collective_broke():
        with contextlib.suppress(KeyboardInterrupt):  # as an op would, turning it into its own failure
            interrupt()
            threading.Event().wait(10)  # bounded: the handler's KeyboardInterrupt ends it
        within(guard.interrupted, 10, "the guard's wake-up thread to hear the SIGINT")
        raise tf.errors.UnknownError(None, None, "[/gloo/transport/tcp/pair.cc] Read error: Connection reset by peer")

    try:
        with guard.training(), pytest.raises(KeyboardInterrupt):
            survivor._survive(step_whose_collective_broke)
        assert not guard.interrupted()  # it belonged to that cell
    finally:
        control.close()
        bus.stop()
