"""ASHL's moving parts without a cluster: the shard's coordination messages, compressed pushes, the
kernel's coordinator, and the proportional batches (the real-cluster run is tests/test_ashl.py)."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.strategies.ashl.batches import ProportionalBatches
from nbdist.strategies.ashl.coordinator import Coordinator
from nbdist.strategies.ashl.meeting import SPEC as ASHL_MEETING
from nbdist.strategies.ashl.switch import SETTLED
from nbdist.ps import wire
from nbdist.ps.shard import Shard
from nbdist.notebook.run import Run
from tests.support import SGD, W0, grads, message

EXPECTED = {name: (w.shape, "float32") for name, w in W0.items()}


def ashl_shard(workers=2, groups=None, preset="ddc-asgd") -> Shard:
    shard = Shard({"workers": workers, "extension": {"class": ASHL_MEETING, "config": {"profile_groups": groups or []}},
                   "rule": {"preset": preset, "workers": workers}})
    shard.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0)))
    return shard


def kinds(replies):
    return [(ident, kind) for ident, kind, _, _ in replies]


def test_workers_of_one_host_profile_in_turn_and_wait_for_the_allocation():
    shard = ashl_shard(groups=[[0, 1]])
    assert kinds(shard.handle(b"w0", message("turn", worker=0))) == []  # held: worker 1 is still tracing
    assert kinds(shard.handle(b"w1", message("turn", worker=1))) == [(b"w0", "ok")]  # worker 0 profiles first
    assert shard.handle(b"w0", message("profile", worker=0, profile={"fixed_s": 0.001})) == [
        (b"w1", "ok", None, {})]  # worker 0's profile frees worker 1's turn; its own reply waits
    shard.handle(b"w1", message("profile", worker=1, profile={"fixed_s": 0.002}))
    replies = shard.handle(b"k", message("control", worker="controller", action="allocate",
                                         value={"id": 1, "batches": [48, 16]}))
    answered = {ident: fields for ident, kind, _, fields in replies if kind == "ok" and ident != b"k"}
    assert set(answered) == {b"w0", b"w1"} and answered[b"w0"]["allocation"]["batches"] == [48, 16]
    assert answered[b"w0"]["phase"] == "ahl"


def test_ahl_scales_a_push_by_its_batch_share_and_shl_averages_by_batch():
    shard = ashl_shard()
    shard.handle(b"k", message("control", worker="controller", action="allocate", value={"id": 1, "batches": [48, 16]}))
    before = shard.variables["dense/bias"].copy()
    shard.handle(b"w1", message("pull", worker=1))
    shard.handle(b"w1", message("push", grads(1.0), worker=1, version=0, step=1, batch=16))
    moved = before - shard.variables["dense/bias"]
    # ddc-asgd at tau = 0: plain SGD step of lr 0.5 on g * b_1/mean(b) = 16/32
    assert moved == pytest.approx(np.full(3, 0.5 * 0.5))
    shard.handle(b"k", message("control", worker="controller", action="switch_phase"))
    assert shard.synchronous and shard.control_state()["synchronous"]
    bias = shard.variables["dense/bias"].copy()
    assert shard.handle(b"w0", message("push", grads(1.0), worker=0, version=1, step=1, batch=48)) == []  # a round
    replies = shard.handle(b"w1", message("push", grads(5.0), worker=1, version=1, step=2, batch=16))
    assert {fields["phase"] for _, _, _, fields in replies} == {"shl"}
    mean = (48 * 1.0 + 16 * 5.0) / 64  # batch-weighted, unscaled, the cell's SGD
    assert bias - shard.variables["dense/bias"] == pytest.approx(np.full(3, 0.5 * mean))


def test_with_local_steps_ahl_adds_each_update_by_its_batch_share_and_shl_adds_the_rounds_mean():
    shard = ashl_shard(preset="adsp")  # ASHL's default: workers step locally and push their updates
    shard.handle(b"k", message("control", worker="controller", action="allocate", value={"id": 1, "batches": [48, 16]}))
    before = shard.variables["dense/bias"].copy()
    shard.handle(b"w1", message("pull", worker=1))
    shard.handle(b"w1", message("push", grads(-1.0), worker=1, version=0, step=3, batch=16))
    # an update of -1 (three local steps of worker 1) counts b_1/B = 16/64 of itself
    assert shard.variables["dense/bias"] - before == pytest.approx(np.full(3, -0.25))
    shard.handle(b"k", message("control", worker="controller", action="switch_phase"))
    bias = shard.variables["dense/bias"].copy()
    assert shard.handle(b"w0", message("push", grads(-1.0), worker=0, version=1, step=4, batch=48)) == []
    shard.handle(b"w1", message("push", grads(-5.0), worker=1, version=1, step=4, batch=16))
    # SHL: the round's batch-weighted mean update, whole: (48 x -1 + 16 x -5) / 64 = -2
    assert shard.variables["dense/bias"] - bias == pytest.approx(np.full(3, -2.0))
    shard.handle(b"w0", message("done", worker=0))
    bias = shard.variables["dense/bias"].copy()
    shard.handle(b"w1", message("push", grads(-8.0), worker=1, version=2, step=9, batch=16))
    # alone in its round, worker 1's update still counts 16/64 of itself, not all of it
    assert shard.variables["dense/bias"] - bias == pytest.approx(np.full(3, -2.0))


def test_a_synchronous_round_completes_when_the_other_worker_ends_its_fit():
    shard = ashl_shard()
    shard.handle(b"k", message("control", worker="controller", action="switch_phase"))
    for w in (0, 1):
        shard.handle(f"w{w}".encode(), message("pull", worker=w))
    assert shard.handle(b"w1", message("push", grads(1.0), worker=1, version=0, step=1, batch=16)) == []
    replies = shard.handle(b"w0", message("done", worker=0))  # worker 0 had no more steps to push
    assert (b"w1", "weights") in kinds(replies)


def test_shl_rounds_wait_only_for_the_workers_that_push_every_step():
    shard = ashl_shard()
    shard.handle(b"k", message("control", worker="controller", action="allocate",
                               value={"id": 1, "batches": [48, 16], "periods": [1, 3]}))
    shard.handle(b"k", message("control", worker="controller", action="switch_phase"))
    for w in (0, 1):
        shard.handle(f"w{w}".encode(), message("pull", worker=w))
    bias = shard.variables["dense/bias"].copy()
    replies = shard.handle(b"w0", message("push", grads(1.0), worker=0, version=0, step=1, batch=48))
    assert kinds(replies) == [(b"w0", "weights")]  # worker 1 pushes every 3 steps: not waited for
    assert shard.handle(b"w1", message("push", grads(4.0), worker=1, version=1, step=3, batch=48)) == []
    replies = shard.handle(b"w0", message("push", grads(1.0), worker=0, version=1, step=2, batch=48))
    assert sorted(kinds(replies)) == [(b"w0", "weights"), (b"w1", "weights")]  # one round, both pushes
    expected = 0.5 * 1.0 + 0.5 * (0.5 * 1.0 + 0.5 * 4.0)  # lr 0.5: round 1 alone, round 2 weighted 48:48
    assert bias - shard.variables["dense/bias"] == pytest.approx(np.full(3, expected))


def test_on_the_virtual_clock_a_slower_push_waits_for_the_round_it_reaches_in_virtual_time():
    shard = Shard({"workers": 2, "clock": "virtual", "rule": {"preset": "adsp", "workers": 2},
                   "extension": {"class": ASHL_MEETING, "config": {}}})
    shard.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0)))
    shard.handle(b"k", message("control", worker="controller", action="allocate",
                               value={"id": 1, "batches": [48, 16], "periods": [1, 3], "every": [1, 3]}))
    shard.handle(b"k", message("control", worker="controller", action="switch_phase"))

    def push(worker, vt):
        replies = shard.handle(f"w{worker}".encode(), message("push", grads(1.0), worker=worker, version=0, step=1,
                                                              batch=16, vt=vt, gap=0.1))
        return sorted((int(ident[1:]), fields["vt"]) for ident, kind, _, fields in replies if kind == "weights")

    # worker 1 commits every third interval: its push (sent first) reaches the PS at 3.0 virtual s, so the rounds
    # of worker 0's pushes at 1.0 and 2.0 complete without it, and it joins the one at 3.5
    assert push(1, 3.0) == []
    assert push(0, 1.0) == [(0, 1.0)]
    assert push(0, 2.0) == [(0, 2.0)]
    assert push(0, 3.5) == [(0, 3.5), (1, 3.5)]


def test_when_the_every_step_workers_are_done_the_lagging_one_is_told_to_stop():
    shard = ashl_shard()
    shard.handle(b"k", message("control", worker="controller", action="allocate",
                               value={"id": 1, "batches": [48, 16], "periods": [1, 4]}))
    for w in (0, 1):
        shard.handle(f"w{w}".encode(), message("pull", worker=w))
    shard.handle(b"w0", message("done", worker=0))
    replies = shard.handle(b"w1", message("push", grads(1.0), worker=1, version=0, step=4, batch=64))
    assert replies[0][3]["stop"] and shard.events[-1]["event"] == "end_laggards"
    shard.handle(b"w0", message("pull", worker=0))  # the cell's next fit starts afresh
    assert not shard.finishing


def test_coordination_messages_are_refused_outside_ashl_and_allocations_checked():
    plain = Shard({"workers": 1})
    with pytest.raises(wire.Rejected, match="unknown kind 'turn'"):
        plain.handle(b"w0", message("turn", worker=0))
    with pytest.raises(wire.Rejected, match="positive whole batches"):
        ashl_shard().handle(b"k", message("control", worker="controller", action="allocate", value={"batches": [0]}))


def profiles(*per_sample):
    return {str(i): {"fixed_s": 0.0, "per_sample_s": c, "comm_s": 0.0, "b0": 32, "host": "h"}
            for i, c in enumerate(per_sample)}


def coordinated(workers=2):
    sent = []
    run = Run(strategy="ashl", options={}, workers=list(range(workers)), cell="")
    return Coordinator(workers, lambda action, value: sent.append((action, value)) or []), run, sent


def test_the_coordinator_allocates_once_every_worker_has_profiled():
    coordinator, run, sent = coordinated()
    coordinator.update(run, {"coordination": {"profiles": profiles(0.001)}}, {})
    assert sent == []
    coordinator.update(run, {"coordination": {"profiles": profiles(0.001, 0.003)}}, {})
    assert sent[0][0] == "allocate" and sent[0][1]["batches"] == [48, 16]
    event = run.events_of("allocated")[0]
    assert event["profile"][1]["batch"] == 16 and event["profile"][0]["shard"] == pytest.approx(0.75)


def test_drift_relative_to_the_others_at_two_epoch_ends_reallocates():
    coordinator, run, sent = coordinated()
    coordinator.update(run, {"coordination": {"profiles": profiles(0.001, 0.003)}}, {})

    def report(t, slow_factor):  # both workers 2x slower than profiled (a shared host), worker 1 more so
        return {"coordination": {"profiles": profiles(0.001, 0.003), "reports": {
            "0": {"t": t, "compute_s": 2 * 0.048, "timed_steps": 20, "allocation": 1},
            "1": {"t": t, "compute_s": 2 * slow_factor * 0.048, "timed_steps": 20, "allocation": 1}}}}

    coordinator.update(run, report(1, 1.0), {})
    coordinator.update(run, report(2, 1.0), {})
    assert len(sent) == 1  # a uniform slowdown changes nothing
    coordinator.update(run, report(3, 2.0), {})
    assert len(sent) == 1  # once is not yet drift
    coordinator.update(run, report(4, 2.0), {})
    assert sent[-1][0] == "allocate" and sent[-1][1]["batches"] == [64 - 9, 9]
    assert "worker 1 ran 1.33x" in run.events_of("reallocated")[0]["reason"]  # vs the median of 2 and 4


def test_the_switch_rule_is_consulted_every_half_epoch_from_the_workers_progress():
    coordinator, run, sent = coordinated()
    coordinator.update(run, {"coordination": {"profiles": profiles(0.001, 0.003)}}, {})

    def progress(epoch, batch):
        return {r: {"record": {"epoch": epoch, "loss": 1.0, "lr": 0.1}, "batch": batch, "steps": 10, "epochs": 4}
                for r in range(2)}

    coordinator.update(run, {"log_fields": ["gamma"], "log": [[0.9]]}, progress(0, 5))
    assert coordinator.phase == "ahl"  # half an epoch of 4: before 20% of the epochs, whatever holds
    coordinator.update(run, {"log_fields": ["gamma"], "log": [[0.9]]}, progress(1, 0))
    switch = run.events_of("switch_phase")
    assert sent[-1][0] == "switch_phase" and len(switch) == 1 and coordinator.phase == "shl"
    assert switch[0]["reason"] == SETTLED  # the allocation held from the check at 0.5 epoch to this one


def test_a_worker_drifting_at_a_check_keeps_ahl_until_the_allocation_holds_or_the_loss_is_flat():
    coordinator, run, sent = coordinated()
    coordinator.update(run, {"coordination": {"profiles": profiles(0.001, 0.003)}}, {})
    coordinator.drifting = {1}  # as `_reallocate_on_drift` leaves it after one report round out of line

    def progress(epoch, batch, loss):
        return {r: {"record": {"epoch": epoch, "loss": loss, "lr": 0.1}, "batch": batch, "steps": 10, "epochs": 10}
                for r in range(2)}

    for epoch, batch, loss in ((0, 5, 2.0), (1, 0, 1.0), (1, 5, 0.5)):  # loss falling fast
        coordinator.update(run, {}, progress(epoch, batch, loss))
    assert coordinator.phase == "ahl" and not run.events_of("switch_phase")
    coordinator.update(run, {}, progress(2, 0, 0.5))  # flat at two checks in a row (1.5 and 2.0)
    assert coordinator.phase == "ahl"
    coordinator.update(run, {}, progress(2, 5, 0.5))
    assert "loss improved 0.00% per epoch" in run.events_of("switch_phase")[0]["reason"]


def test_proportional_batches_cover_each_epoch_once_between_the_workers():
    x, y = np.arange(100), np.arange(100)
    sets = [ProportionalBatches(x, y, rank, [6, 3, 1], seed=7) for rank in range(3)]
    for epoch in range(2):
        seen = np.concatenate([s.batch(k)[0] for s in sets for k in range(sets[0].steps)])
        assert sets[0].steps == 10 and len(seen) == 100 and len(set(seen.tolist())) == 100
        assert [len(s.batch(0)[0]) for s in sets] == [6, 3, 1]
        for s in sets:
            s.new_epoch()
    for s in sets:
        s.set_batches([2, 4, 4])
    assert [s.size for s in sets] == [2, 4, 4]


def test_ablations_switch_allocation_off_and_name_the_parts_there_are():
    from nbdist.errors import OptionError
    from nbdist.strategies.ashl.strategy import commits_local_steps, parts_off

    sent = []
    coordinator = Coordinator(2, lambda action, value: sent.append((action, value)) or [], without={"allocation"})
    run = Run(strategy="ashl", options={}, workers=[0, 1], cell="")
    profiles = {r: {"fixed_s": 0.001, "per_sample_s": 1e-4 * (r + 1), "comm_s": 0.01, "b0": 64} for r in (0, 1)}
    coordinator.update(run, {"coordination": {"profiles": profiles}}, {})
    assert sent[0][0] == "allocate" and sent[0][1]["batches"] == [64, 64] and sent[0][1]["periods"] == [1, 1]
    assert parts_off("switch+compression") == {"switch", "compression"}
    assert commits_local_steps({"commits": "local-steps"})
    assert not commits_local_steps({"commits": "local-steps", "without": "local-steps"})
    with pytest.raises(OptionError, match="parts are allocation, switch, compression, local-steps; unknown: profile"):
        parts_off("profile")


def test_the_decision_line_names_a_link_that_commits_at_a_multiple_of_the_cadence():
    from nbdist.strategies.ashl.report import decisions

    coordinator, run, sent = coordinated()
    coordinator.local_steps = True
    slow_link = {"fixed_s": 0.0, "per_sample_s": 1e-3, "comm_s": 1.0, "b0": 60}
    profiles = {0: {"fixed_s": 0.0, "per_sample_s": 1e-3, "comm_s": 0.0, "b0": 60}, 1: slow_link}
    coordinator.update(run, {"coordination": {"profiles": profiles}}, {})
    every = sent[-1][1]["every"]
    assert every[0] == 1 and every[1] > 1 and run.events_of("allocated")[0]["every"] == every
    assert f"worker 1 once every {every[1]} commit intervals" in decisions(run)[0]


def test_with_dealt_batches_a_link_that_commits_every_few_intervals_leaves_at_the_switch():
    from nbdist.strategies.ashl.report import decisions

    slow_link = {"fixed_s": 0.0, "per_sample_s": 1e-3, "comm_s": 1.0, "b0": 60}
    profiles = {0: {"fixed_s": 0.0, "per_sample_s": 1e-3, "comm_s": 0.0, "b0": 60}, 1: slow_link}
    for dealt in (False, True):
        sent = []
        coordinator = Coordinator(2, lambda action, value: sent.append((action, value)) or [], local_steps=True,
                                  dealt=dealt)
        run = Run(strategy="ashl", options={}, workers=[0, 1], cell="")
        coordinator.update(run, {"coordination": {"profiles": profiles}}, {})
        every = sent[-1][1]["every"]
        coordinator.switch(run, "by hand")
        if not dealt:  # its share of every global batch would be lost: it stays
            assert ("evict", 1) not in sent and not run.events_of("left_shl")
            continue
        assert sent[-1] == ("evict", 1) and run.evicted_ranks() == {1}
        assert run.events_of("left_shl")[0]["workers"] == [1]
        assert f"worker 1 commits once every {every[1]} intervals: in synchronous rounds its update would be " \
               f"{every[1] - 1} round(s) stale; its batches are dealt to the others" in decisions(run)[-1]
