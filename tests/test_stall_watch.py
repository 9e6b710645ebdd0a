"""The stall watch: a rank that waits in a collective says so once; the kernel names the others. A
parameter-server worker silent past the timeout says what it waits for; the kernel fails the run once every live
worker has."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from nbdist.strategies.stall_watch import WAITING_KEY, Silence, StallWatch, silent_workers, stalled
from tests.support import wait_for


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


# -- parameter-server runs ------------------------------------------------------------------------------------
def test_a_ps_worker_silent_past_the_timeout_says_what_it_waits_for_and_that_it_goes_on():
    said = []
    silence = Silence(said.append, timeout_s=0.2)
    try:
        silence.tables[1] = "Adam 'adam'"
        with silence.waiting("push", {"step": 1, "table": 1}, [{"version": 0}], None):
            pass  # its first push answered: it has started
        with silence.waiting("push", {"step": 2, "table": 1}, [{"version": 3}, {"version": 5}], None):
            wait_for(lambda: said, "the wait said", timeout=5)  # bounded: the watchdog checks twice a second
        assert said == [{WAITING_KEY: {"since": said[0][WAITING_KEY]["since"], "unit": (
            "waiting for the shards' answers to its push of step 2 to table 1 (Adam 'adam'), computed on versions "
            "[3, 5]")}}, {WAITING_KEY: None}]  # answered: the wait is over
        wait_for(lambda: len(said) == 3, "the silence after the answer said", timeout=5)
        assert said[2][WAITING_KEY]["unit"] == ("in the cell's own code (a callback, the data pipeline, its train "
                                                "step) since its push of step 2 to table 1 (Adam 'adam'), computed "
                                                "on versions [3, 5] was answered")
    finally:
        silence.stop()
    assert said[-1] == {WAITING_KEY: None}


def test_a_ps_worker_starting_validating_at_an_epochs_end_or_at_a_tables_start_barrier_is_not_timed():
    silence = Silence(lambda data: None, timeout_s=0.1)
    try:
        assert silence.watch.entered is None and silence.watch.unit == Silence.STARTING
        with silence.waiting("pull", {}, None, None):  # the model reaches the shards, the first step is traced
            assert silence.watch.entered is None
        with silence.waiting("push", {"step": 1, "table": 1}, None, None):
            assert silence.watch.entered is None  # the start barrier
        assert silence.watch.entered is not None  # started: silence counts from here
        with silence.waiting("push", {"step": 1, "table": 2}, None, None):
            assert silence.watch.entered is None  # table 2's first push: its own start barrier
        silence.long_work("validating")
        assert silence.watch.entered is None and silence.watch.unit == "validating"
        with silence.waiting("epoch", {"epoch": 0}, None, 0):  # waiting on the others is timed, long work or not
            assert silence.watch.entered is not None
            assert silence.watch.unit == ("waiting for shard 0's answer to its logs of epoch 0 (their mean waits for "
                                          "every live worker's)")
        assert silence.watch.entered is None
        silence.long_work(None)
        assert silence.watch.entered is not None
    finally:
        silence.stop()


def test_a_ps_run_stalls_once_every_live_worker_said_it_was_silent_past_the_timeout_not_counting_a_pause():
    now = time.time()
    waits = {WAITING_KEY: {"since": now - 50, "unit": "waiting for shard 0's answer to its request for batches"}}
    held = {WAITING_KEY: {"since": now - 45, "unit": "in the cell's own code since step 3 of epoch 0 ended"}}
    run = SimpleNamespace(hosts={3: {"host": "a"}, 7: {"host": "b"}}, progress={3: waits, 7: {}})
    assert silent_workers(run, {0: 3, 1: 7}, 30) is None  # worker 1 may still be training
    run.progress[7] = held
    text = silent_workers(run, {0: 3, 1: 7}, 30)
    assert "no worker made progress (a step, a request to the parameter server, a reply) for more than 30 s" in text
    assert ("worker 0 (engine 3, host a), silent 50 s: waiting for shard 0's answer to its request for batches; "
            "worker 1 (engine 7, host b), silent 45 s: in the cell's own code since step 3 of epoch 0 ended") in text
    assert "--stall-timeout" in text
    assert silent_workers(run, {0: 3, 1: 7}, 30, since=now - 20) is None  # resumed 20 s ago: silent only since
    assert silent_workers(run, {0: 3}, 30) is not None  # worker 1 finished (or died): worker 0 alone waits
