"""The text progress line: a Ctrl-C while it draws waits until tqdm let go of its locks."""

from __future__ import annotations

import os
import signal

import pytest

from nbdist.notebook.progress import _interrupt_after


@pytest.fixture(autouse=True)
def python_sigint():
    """Python's own SIGINT handler (an earlier test of the session may have left SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_the_bar_draws_comes_after_it():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with _interrupt_after():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")  # the handler would have run by now, inside tqdm
            reached.append("end of the block")
    assert reached == ["after the signal", "end of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_without_a_ctrl_c_nothing_is_raised():
    with _interrupt_after():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with _interrupt_after():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
