"""The stall watch: a rank that waits in a collective says so once; the kernel names the others."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from nbdist.strategies.stall_watch import WAITING_KEY, StallWatch, stalled


def test_a_rank_waiting_past_the_timeout_says_so_once_and_then_that_the_wait_is_over():
    said, spoke = [], threading.Event()
    watch = StallWatch(lambda data: (said.append(data), spoke.set()), timeout_s=0.2)
    try:
        watch.entering(7)
        assert spoke.wait(5)  # bounded: the watchdog checks twice a second
        assert said == [{WAITING_KEY: {"since": watch.entered, "unit": 7}}]
        watch.left()
        assert said[-1] == {WAITING_KEY: None} and len(said) == 2
    finally:
        watch.stop()


def test_the_ranks_that_do_not_wait_are_named_with_their_last_progress():
    now = time.time()
    run = SimpleNamespace(hosts={3: {"host": "gpu-a"}, 7: {"host": "gpu-b"}},
                          progress={3: {WAITING_KEY: {"since": now - 70, "unit": 12}},
                                    7: {"record": {"epoch": 1, "step": 12, "t": now - 40}}})
    text = stalled(run, [3, 7], 30)
    assert "more than 30 s (--stall-timeout)" in text
    assert "rank 1 (engine 7, host gpu-b; its last progress: epoch 1, step 12, 40 s ago)" in text
    assert "rank 0" not in text


def test_no_stall_while_no_rank_waits_or_every_rank_does_or_the_others_may_still_be_arriving():
    waiting = {WAITING_KEY: {"since": 0, "unit": 1}}
    assert stalled(SimpleNamespace(hosts={}, progress={}), [0, 1], 30) is None
    assert stalled(SimpleNamespace(hosts={}, progress={0: waiting, 1: waiting}), [0, 1], 30) is None
    # rank 0 has waited 40 s of a 30 s timeout: rank 1 may have entered 15 s after it and not have said so yet
    recent = {WAITING_KEY: {"since": time.time() - 40, "unit": 1}}
    assert stalled(SimpleNamespace(hosts={}, progress={0: recent}), [0, 1], 30) is None


def test_a_unit_entered_untimed_is_never_watched():
    watch = StallWatch(lambda data: None, timeout_s=0.0)
    try:
        watch.entering(0, timed=False)  # a job's first unit: every rank traces its train step there
        assert watch.entered is None and watch.unit == 0
        watch.entering(1)
        assert watch.entered is not None
    finally:
        watch.stop()
