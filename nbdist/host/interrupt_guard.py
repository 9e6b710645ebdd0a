"""On an engine: an interrupt meant for an nbdist run that has just ended is dropped.

When a run fails or is stopped, the kernel interrupts (SIGINT) the workers it still sees running.
A worker that finishes at that moment is already in ipyparallel's own code sending its reply;
a KeyboardInterrupt there loses the reply, and the hub then counts the engine busy for ever.
So while a training cell runs, SIGINT raises KeyboardInterrupt as usual; for `LIMITS.late_interrupt_s` after it
ends, SIGINT is ignored; after that the engine's own handler has it again.

Python runs a signal handler only when its main thread runs Python code, and a training cell's main thread
sits inside TensorFlow while an op waits (a parameter-server exchange in a `numpy_function`, up to its
timeout). So while a cell trains, the signal also wakes a thread of its own (`signal.set_wakeup_fd`), which
calls what the cell registered with `on_interrupt`: the waiting exchange gives up within its poll, the op
fails, and the main thread takes the KeyboardInterrupt at once (an interrupt, or a dead kernel's watcher
releasing the engine, is then acted on in well under a second instead of after the exchange's timeout).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from ..limits import LIMITS


class _State:
    def __init__(self):
        self.active = 0  # training cells running in this process
        self.ended_at = float("-inf")
        self.previous = signal.default_int_handler  # the handler nbdist's replaced
        self.aborts: list = []  # what `on_interrupt` registered: called from the wake-up thread on SIGINT
        self.wakeup: tuple | None = None  # (write fd, the wake-up fd before ours) while a cell trains
        self.interrupted = False  # a SIGINT reached the training cell that runs now


_state = _State()


@contextlib.contextmanager
def on_interrupt(abort):
    """Within: a SIGINT while a training cell runs also calls `abort()` (from another thread, at once)."""
    _state.aborts.append(abort)
    try:
        yield
    finally:
        _state.aborts.remove(abort)


def _wake_on_signals() -> None:
    """The wake-up fd and its reader, for the main thread of a process that starts training."""
    if _state.wakeup is not None or threading.current_thread() is not threading.main_thread():
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter after all
        os.close(read)
        os.close(write)
        return
    _state.wakeup = (write, before)
    threading.Thread(target=_read_signals, args=(read, before), name="nbdist-interrupt-wakeup", daemon=True).start()


def _read_signals(read: int, before: int) -> None:
    with open(read, "rb", buffering=0, closefd=True) as pipe:
        while got := pipe.read(64):  # empty: the pipe closed, the training ended
            _woken(got, before)


def _woken(got: bytes, before: int) -> None:
    if before >= 0:  # whoever had the wake-up fd before still hears of every signal
        with contextlib.suppress(OSError):
            os.write(before, got)
    if signal.SIGINT in got and _state.active:
        _state.interrupted = True
        for abort in list(_state.aborts):
            with contextlib.suppress(Exception):  # one that fails must not keep the others from giving up
                abort()


def _stop_waking() -> None:
    if _state.wakeup is None:
        return
    write, before = _state.wakeup
    _state.wakeup = None
    signal.set_wakeup_fd(before)
    os.close(write)  # the reader sees the end of the pipe and closes its side


def _handle(signum, frame):
    if _state.active:
        raise KeyboardInterrupt
    if time.monotonic() - _state.ended_at < LIMITS.late_interrupt_s:
        return  # late: the run it was meant for has ended
    previous = _state.previous
    if callable(previous):
        return previous(signum, frame)
    if previous != signal.SIG_IGN:
        raise KeyboardInterrupt


def _install() -> None:
    """Put the guard in front of whatever handler the engine has now (ipykernel may have set its own)."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; a cell run elsewhere keeps Python's
    current = signal.getsignal(signal.SIGINT)
    if current is not _handle:
        _state.previous = current
        signal.signal(signal.SIGINT, _handle)


def _eager_again() -> None:
    """TensorFlow as a new cell expects it: eager, no graph the default. An interrupt that lands between TensorFlow
    making a graph the default (as a `tf.function` traces) and the `try` that would undo it leaves that graph the
    default for good, and the next cell fails creating its first variable ("could not be lifted out of a
    tf.function"); seen once in a hog run of the interrupt-during-recovery test."""
    import sys

    if "tensorflow" not in sys.modules:
        return
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    graphs = ops._default_graph_stack.stack  # (TensorFlow's own stacks: no public way to reset them)
    if not graphs:
        return
    graphs.clear()
    switches = context.context().context_switches
    while len(switches.stack) > 1:  # the first is the thread's own mode
        switches.pop()
    context.context()._thread_local_data.is_eager = context.default_execution_mode == context.EAGER_MODE


def interrupted() -> bool:
    """Whether the training cell running now was interrupted: code that waits in a loop of its own (or that
    could take the KeyboardInterrupt, raised inside a TensorFlow op, for the op's failure) ends on it."""
    return _state.active > 0 and _state.interrupted


@contextlib.contextmanager
def training():
    """Within: SIGINT interrupts the training cell; just after it: ignored (see the module's doc)."""
    _install()
    _wake_on_signals()
    if not _state.active:
        _eager_again()
        _state.interrupted = False
    _state.active += 1
    try:
        yield
    finally:
        _state.active -= 1
        _state.ended_at = time.monotonic()
        if not _state.active:
            _stop_waking()
