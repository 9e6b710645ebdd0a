"""On an engine: an interrupt meant for an nbdist run that has just ended is dropped.

When a run fails or is stopped, the kernel interrupts (SIGINT) the workers it still sees running.
A worker that finishes at that moment is already in ipyparallel's own code sending its reply;
a KeyboardInterrupt there loses the reply, and the hub then counts the engine busy for ever.
So while a training cell runs, SIGINT raises KeyboardInterrupt as usual; for `LIMITS.late_interrupt_s` after it
ends, SIGINT is ignored; after that the engine's own handler has it again.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from .limits import LIMITS


class _State:
    active = 0  # training cells running in this process
    ended_at = float("-inf")
    previous = signal.default_int_handler  # the handler nbdist's replaced


_state = _State()


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


@contextlib.contextmanager
def training():
    """Within: SIGINT interrupts the training cell; just after it: ignored (see the module's doc)."""
    _install()
    _state.active += 1
    try:
        yield
    finally:
        _state.active -= 1
        _state.ended_at = time.monotonic()
