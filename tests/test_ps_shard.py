"""The parameter-server shard: its rules on decoded messages, then a real shard process over real sockets."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zmq

from nbdist.ps import launcher, wire
from nbdist.ps.shard import LOG_FIELDS, Shard
from tests.support import KEY, SGD, W0, grads, message


def ready_shard(workers=2, max_staleness=None) -> Shard:
    shard = Shard({"workers": workers, "max_staleness": max_staleness})
    shard.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0)))
    return shard


def push(shard, worker, version, value=1.0):
    """Replies released by this push (to anyone), as (ident, fields)."""
    replies = shard.handle(f"w{worker}".encode(), message("push", grads(value), worker=worker, version=version,
                                                          step=0))
    return [(ident, fields) for ident, _, _, fields in replies]


def test_push_applies_sgd_and_reports_staleness():
    shard = ready_shard()
    assert push(shard, 0, 0) == [(b"w0", {"version": 1, "staleness": 0, "gamma": None, "stop": False})]
    assert push(shard, 1, 0) == [(b"w1", {"version": 2, "staleness": 1, "gamma": None, "stop": False})]  # computed on version 0, applied at 1
    np.testing.assert_allclose(shard.variables["dense/kernel"], W0["dense/kernel"] - 2 * 0.5)
    assert shard.counts["applied"] == shard.counts["acked"] == 2


def test_init_releases_held_pulls():
    shard = Shard({"workers": 2})
    assert shard.handle(b"w1", message("pull", worker=1)) == []
    replies = shard.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0)))
    assert [(r[0], r[1]) for r in replies] == [(b"w0", "ok"), (b"w1", "weights")]
    np.testing.assert_array_equal(replies[1][2]["dense/kernel"], W0["dense/kernel"])


def test_max_staleness_one_holds_a_worker_two_steps_ahead():
    shard = ready_shard(max_staleness=1)
    assert push(shard, 0, 0)  # lead 1: allowed
    assert push(shard, 0, 1) == []  # would lead by 2: held, not applied
    assert shard.version == 1
    released = push(shard, 1, 0)  # worker 1 catches up: its push and worker 0's held one go through
    assert [ident for ident, _ in released] == [b"w1", b"w0"] and shard.version == 3
    assert max(entry[LOG_FIELDS.index("lead")] for entry in shard.log) <= 1


def test_max_staleness_zero_is_lock_step():
    shard = ready_shard(max_staleness=0)
    assert push(shard, 0, 0) == []  # applied, but the new weights wait for the round to complete
    assert shard.version == 1
    released = push(shard, 1, 0)
    assert sorted(ident for ident, _ in released) == [b"w0", b"w1"]
    assert {fields["version"] for _, fields in released} == {2}  # both start the next step from one version


def test_dead_worker_is_dropped_and_releases_the_others():
    shard = ready_shard(max_staleness=1)
    shard.handle(b"w1", message("heartbeat", worker=1))
    push(shard, 0, 0)
    assert push(shard, 0, 1) == []
    later = time.time() + shard.heartbeat_timeout_s + 1
    shard.workers[0].last_seen = later  # worker 0 kept talking, worker 1 went silent
    released = shard.check_heartbeats(later)
    assert [r[0] for r in released] == [b"w0"]
    assert shard.events[-1]["event"] == "worker_dropped" and shard.events[-1]["worker"] == 1
    with pytest.raises(wire.Rejected, match="unknown_worker"):
        shard.handle(b"w1", message("push", grads(), worker=1, version=0))


def test_done_is_a_barrier_over_live_workers():
    shard = ready_shard()
    assert shard.handle(b"w0", message("done", worker=0)) == []
    replies = shard.handle(b"w1", message("done", worker=1))
    assert sorted(r[0] for r in replies) == [b"w0", b"w1"]


def control(shard, action, value=None):
    (_, kind, _, state), *released = shard.handle(b"ctl", message("control", worker="controller", action=action,
                                                                   value=value))
    assert kind == "ok"
    return state, [(ident, fields) for ident, _, _, fields in released]


def test_pause_holds_every_push_and_resume_applies_them():
    shard = ready_shard()
    state, _ = control(shard, "pause")
    assert state["paused"] and push(shard, 0, 0) == [] and shard.version == 0
    _, released = control(shard, "resume")
    assert [ident for ident, _ in released] == [b"w0"] and shard.version == 1


def test_learning_rate_multiplier_scales_the_next_updates():
    shard = ready_shard()
    control(shard, "lr_scale", 0.5)
    push(shard, 0, 0)
    np.testing.assert_allclose(shard.variables["dense/bias"], -0.25)  # 0.5 x lr 0.5 x gradient 1
    assert list(shard.log)[-1][LOG_FIELDS.index("lr")] == 0.25


def test_evicted_worker_is_told_to_stop_and_no_longer_holds_anyone_back():
    shard = ready_shard(max_staleness=1)
    push(shard, 0, 0)
    assert push(shard, 0, 1) == []  # held: worker 1 has not pushed
    state, released = control(shard, "evict", 1)
    assert state["evicted"] == [1] and [ident for ident, _ in released] == [b"w0"]
    (ident, fields), = push(shard, 1, 0)
    assert fields["stop"] is True and shard.version == 2  # worker 1's push was not applied
    assert [r[0] for r in shard.handle(b"w0", message("done", worker=0))] == [b"w0"]  # the barrier ignores it


def test_graceful_stop_tells_every_worker_to_end_its_fit():
    shard = ready_shard()
    control(shard, "stop")
    assert push(shard, 0, 0)[0][1]["stop"] is True and shard.version == 1  # the last push still counts


def test_adam_follows_the_update_count_and_momentum_state_is_kept():
    shard = Shard({"workers": 1})
    shard.handle(b"w0", message("init", W0, worker=0, trainable=list(W0),
                                optimizer={"name": "SGD", "learning_rate": 0.1, "momentum": 0.9}))
    push(shard, 0, 0)
    push(shard, 0, 1)
    # heavy ball: v1 = -0.1, v2 = 0.9 * -0.1 - 0.1 = -0.19; w = w0 - 0.29
    np.testing.assert_allclose(shard.variables["dense/bias"], -0.29, rtol=1e-6)
    np.testing.assert_allclose(shard.updater.slots["dense/bias"]["momentum"], -0.19, rtol=1e-6)


# -- a real shard process, real sockets ---------------------------------------------------

@pytest.fixture
def shard_process():
    info = launcher.start_shard({"shard": 0, "workers": 2, "max_bytes": 4096}, KEY)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(f"tcp://127.0.0.1:{info['port']}")
    try:
        yield socket
    finally:
        try:
            socket.send_multipart(wire.encode(KEY, "stop", worker="controller"))
            socket.poll(2000)
        finally:
            socket.close(linger=0)
            context.term()
            launcher.stop_shard(info["pid"])


def ask(socket, frames, key=KEY):
    socket.send_multipart(frames)
    assert socket.poll(5000), "the shard did not answer"
    return wire.decode(key, socket.recv_multipart())


def test_on_the_virtual_clock_a_push_waiting_at_one_optimizers_table_holds_back_no_other_table():
    """A GAN's step pushes to the critic's table (1), then the generator's (2), in that order. Worker 0's generator
    push waits at table 2 for worker 1, which has not pushed there yet; worker 1's next critic push must not wait at
    table 1 for worker 0, whose next push there follows that generator push (earlier, it waited 120 s for a
    latecomer)."""
    from nbdist.ps.tables import ShardTables

    tables = ShardTables({"workers": 2, "clock": "virtual"})
    for table in (1, 2):
        tables.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0),
                                     table=table))

    def push(worker, table, vt):
        replies = tables.handle(f"w{worker}".encode(), message("push", grads(0.0), worker=worker, version=0, step=1,
                                                               vt=vt, gap=0.1, table=table))
        return sorted((int(ident[1:]), fields["vt"]) for ident, kind, _, fields in replies if kind == "weights")

    assert push(0, 1, 1.0) == []  # worker 1 may still push at 1.0
    assert push(1, 1, 1.0) == [(0, 1.0), (1, 1.0)]
    assert push(0, 2, 2.0) == []  # worker 1 has never pushed to table 2: it may come first
    assert push(1, 1, 1.5) == [(1, 1.5)]  # worker 0's next push to table 1 follows its push at 2.0 to table 2
    assert push(1, 2, 2.5) == [(0, 2.0)]  # worker 0's may come before 2.5 again: worker 1 waits for it


def test_every_bad_message_is_rejected_counted_and_not_applied(shard_process):
    socket = shard_process
    assert ask(socket, wire.encode(KEY, "init", W0, worker=0, optimizer=SGD, trainable=list(W0))).kind == "ok"
    good = wire.encode(KEY, "push", grads(), worker=0, version=0)
    header = json.loads(bytes(good[0]))
    resigned = lambda h, bufs: [json.dumps(h).encode(), wire.hmac.new(KEY, json.dumps(h).encode(),  # noqa: E731
                                                                       wire.hashlib.sha256).digest(), *bufs]
    nan = grads()
    nan["dense/bias"] = np.array([0, np.nan, 0], np.float32)
    cases = {
        "unsigned": [good[0], b"", *good[2:]],
        "bad_signature": wire.encode(wire.new_key(), "push", grads(), worker=0, version=0),
        "unknown_worker": wire.encode(KEY, "push", grads(), worker=7, version=0),
        "wrong_shape": wire.encode(KEY, "push", {**grads(), "dense/bias": np.ones(4, np.float32)}, worker=0,
                                   version=0),
        "wrong_dtype": wire.encode(KEY, "push", {k: v.astype(np.float64) for k, v in grads().items()}, worker=0,
                                   version=0),
        "non_finite": wire.encode(KEY, "push", nan, worker=0, version=0),
        "oversized": wire.encode(KEY, "push", {**grads(), "pad": np.zeros(2048, np.float32)}, worker=0, version=0),
        "malformed": resigned({**header, "arrays": header["arrays"][:1]}, good[2:]),
        "bad_digest": [good[0], good[1], np.full(6, 2, np.float32).tobytes(), bytes(good[3])],
    }
    for reason, frames in cases.items():
        reply = ask(socket, frames)
        assert (reply.kind, reply.header.get("reason")) == ("rejected", reason), (reason, reply.header)
    state = ask(socket, wire.encode(KEY, "state", worker="controller"))
    assert state.header["version"] == 0 and state.header["counts"]["applied"] == 0
    assert state.header["rejections"] == {reason: 1 for reason in cases}
    np.testing.assert_array_equal(state.arrays["dense/kernel"], W0["dense/kernel"])
    fresh = wire.encode(KEY, "push", grads(), worker=0, version=0)
    assert ask(socket, fresh).header["version"] == 1  # a good push still goes through afterwards
    replayed = ask(socket, fresh)  # the same valid, signed frames again
    assert (replayed.kind, replayed.header["reason"]) == ("rejected", "replayed")
    unsequenced = ask(socket, resigned({k: v for k, v in json.loads(bytes(fresh[0])).items() if k != "seq"},
                                       fresh[2:]))
    assert (unsequenced.kind, unsequenced.header["reason"]) == ("rejected", "malformed")
    assert ask(socket, wire.encode(KEY, "state", worker="controller")).header["version"] == 1  # neither applied


def test_a_reply_is_signed_and_a_forged_key_cannot_read_it(shard_process):
    socket = shard_process
    socket.send_multipart(wire.encode(KEY, "heartbeat", worker=0))
    assert socket.poll(5000)
    frames = socket.recv_multipart()
    assert wire.decode(KEY, frames).kind == "pong"
    with pytest.raises(wire.Rejected, match="bad_signature"):
        wire.decode(wire.new_key(), frames)


@pytest.mark.cluster  # starts processes
def test_concurrent_pushes_of_large_arrays_all_get_intact_replies():
    """Replies leave zero-copy while later pushes update the same arrays: each reply must still verify."""
    from concurrent.futures import ThreadPoolExecutor

    from nbdist.ps.client import PsClient

    big = {"w": np.zeros(300_000, np.float32), "b": np.zeros(10, np.float32)}
    info = launcher.start_shard({"shard": 0, "workers": 3}, KEY)
    address = [f"tcp://127.0.0.1:{info['port']}"]
    try:
        with PsClient(address, KEY, 0) as first:
            first.request("init", [big], optimizer=SGD, trainable=list(big))

        def worker(rank):
            with PsClient(address, KEY, rank) as client:
                version = client.request("pull")[0].header["version"]
                for _ in range(30):
                    reply = client.request("push", [{k: np.ones_like(v) for k, v in big.items()}],
                                           version=version)[0]  # a reply that failed its tag would raise here
                    version = reply.header["version"]
                    assert np.all(np.diff(reply.arrays["w"][::1000]) == 0)  # one update state, not a mix
                return client.request("done")[0].header["version"]  # after every worker finished

        with ThreadPoolExecutor(3) as pool:
            finals = list(pool.map(worker, range(3)))
        assert finals == [90, 90, 90]
    finally:
        with PsClient(address, KEY, "controller", heartbeat=False) as controller:
            controller.request("stop")
        launcher.stop_shard(info["pid"])


RMSPROP = {"name": "keras", "learning_rate": 0.01, "kind": "RMSprop",
           "keras": {"module": "keras.optimizers", "class_name": "RMSprop", "config": {"learning_rate": 0.01},
                     "registered_name": None}}


@pytest.mark.cluster  # starts processes
def test_a_shard_importing_keras_for_the_optimizer_keeps_answering_and_drops_no_one():
    """The `init` of a Keras optimizer makes the shard import TensorFlow (3 to 13 s on this 2-core machine, longer
    than the 3 s silence limit set here): it imports in a thread and answers pings meanwhile, and judges silence
    only once it has read every ping that reached it. CI once dropped such a worker ("worker 0 was dropped as
    dead") and once failed the kernel's monitor of a shard busy importing."""
    from nbdist.ps.client import PsClient

    info = launcher.start_shard({"shard": 0, "workers": 1, "heartbeat_timeout_s": 3.0}, KEY)
    address = [f"tcp://127.0.0.1:{info['port']}"]
    try:
        with PsClient(address, KEY, 0) as client:  # gives up on a shard silent for LIMITS.ps_reply_s
            client.request("init", [W0], optimizer=RMSPROP, trainable=list(W0))
            pulled = client.request("pull")[0]  # refused "worker 0 was dropped as dead" before
            np.testing.assert_array_equal(pulled.arrays["dense/kernel"], W0["dense/kernel"])
            events = client.request("stats")[0].header["events"]
        assert [e for e in events if e["event"] == "worker_dropped"] == []
    finally:
        with PsClient(address, KEY, "controller", heartbeat=False) as controller:
            controller.request("stop")
        launcher.stop_shard(info["pid"])


@pytest.mark.cluster  # starts processes
def test_a_nan_gradient_is_skipped_by_the_worker_and_repeated_ones_stop_it():
    from nbdist.ps.client import PsClient
    from nbdist.ps.exchange import MAX_NON_FINITE_IN_A_ROW, PushPull

    info = launcher.start_shard({"shard": 0, "workers": 1}, KEY)
    address = [f"tcp://127.0.0.1:{info['port']}"]
    try:
        with PsClient(address, KEY, 0) as client:
            client.request("init", [W0], optimizer=SGD, trainable=list(W0))
            step = PushPull(client, [list(W0)], list(W0))
            step.pull()
            good = step.push(*grads().values())
            np.testing.assert_allclose(good[0], W0["dense/kernel"] - 0.5)
            bad = grads()["dense/kernel"].copy()
            bad[0, 0] = np.nan
            kept = step.push(bad, grads()["dense/bias"])  # rejected, not applied: the weights stay
            np.testing.assert_array_equal(kept[0], good[0])
            assert step.versions == [1]
            with pytest.raises(FloatingPointError, match="in a row held NaN or inf"):
                for _ in range(MAX_NON_FINITE_IN_A_ROW):
                    step.push(bad, grads()["dense/bias"])
            counts = client.request("state")[0].header
        assert counts["rejections"] == {"non_finite": MAX_NON_FINITE_IN_A_ROW}
    finally:
        with PsClient(address, KEY, "controller", heartbeat=False) as controller:
            controller.request("stop")
        launcher.stop_shard(info["pid"])


def test_epoch_logs_are_averaged_by_each_workers_share_of_the_data():
    shard = ready_shard()
    assert shard.handle(b"w0", message("epoch", worker=0, epoch=0, logs={"loss": 1.0}, share=2.0)) == []  # held
    replies = shard.handle(b"w1", message("epoch", worker=1, epoch=0, logs={"loss": 4.0}, share=1.0))
    assert {ident: fields["logs"] for ident, _, _, fields in replies} == {b"w0": {"loss": 2.0}, b"w1": {"loss": 2.0}}
    with pytest.raises(wire.Rejected, match="share is a positive number"):
        shard.handle(b"w0", message("epoch", worker=0, epoch=1, logs={"loss": 1.0}, share=0))


def admit(shard, worker, epochs):
    (_, kind, _, answer), = shard.handle(b"ctl", message("admit", worker="controller", worker_id=worker, epochs=epochs))
    assert kind == "ok"
    return answer


def epoch(shard, worker, number, loss):
    return shard.handle(f"w{worker}".encode(), message("epoch", worker=worker, epoch=number, logs={"loss": loss}))


def test_a_newcomer_joins_from_the_epoch_after_the_last_posted_and_only_later_barriers_wait_for_it():
    shard = ready_shard()
    push(shard, 0, 0)
    push(shard, 0, 1)  # worker 0 leads by two pushes; the newcomer starts level with the slowest (worker 1)
    assert epoch(shard, 0, 0, 1.0) == []  # worker 0 waits at epoch 0's end for worker 1
    assert admit(shard, 2, epochs=3) == {"admitted": True, "first_epoch": 1}
    assert shard.workers[2].pushed == 0
    released = epoch(shard, 1, 0, 3.0)  # epoch 0 does not wait for the newcomer
    assert sorted(ident for ident, *_ in released) == [b"w0", b"w1"]
    assert epoch(shard, 0, 1, 1.0) == [] and epoch(shard, 1, 1, 1.0) == []  # epoch 1 waits for it
    released = epoch(shard, 2, 1, 4.0)
    assert {ident: fields["logs"]["loss"] for ident, _, _, fields in released} == {b"w0": 2.0, b"w1": 2.0, b"w2": 2.0}
    assert push(shard, 2, 2) and shard.counts["applied"] == shard.counts["acked"] == 3


def test_a_newcomer_is_refused_when_no_epoch_is_left_or_a_fit_ended():
    shard = ready_shard()
    epoch(shard, 0, 0, 1.0)
    epoch(shard, 1, 0, 1.0)
    refused = admit(shard, 2, epochs=1)
    assert refused["admitted"] is False and "no epoch is left" in refused["reason"] and 2 not in shard.workers
    shard.handle(b"w0", message("done", worker=0))
    shard.handle(b"w1", message("done", worker=1))
    assert "first fit has ended" in admit(shard, 2, epochs=5)["reason"]
    with pytest.raises(wire.Rejected, match="new worker id"):
        admit(shard, 1, epochs=5)


def test_a_dropped_worker_is_no_longer_waited_for_at_an_epoch_end():
    shard = ready_shard()
    assert epoch(shard, 0, 0, 1.0) == []
    (_, kind, _, _), *released = shard.handle(b"ctl", message("drop", worker="controller", worker_id=1))
    assert kind == "ok" and [ident for ident, *_ in released] == [b"w0"]
    assert [e["worker"] for e in shard.events if e["event"] == "worker_dropped"] == [1]


@pytest.mark.cluster  # starts processes
def test_the_push_log_keeps_a_window_in_memory_and_every_push_in_its_file(tmp_path):
    """A long run's log must not grow the shard: the stats carry the window, the file every push."""
    from nbdist.ps.client import PsClient
    from nbdist.notebook.run import Run, whole_log

    path = tmp_path / "run-1.pushlog-0.jsonl"
    info = launcher.start_shard({"shard": 0, "workers": 1, "log_path": str(path), "log_window": 50}, KEY)
    address = [f"tcp://127.0.0.1:{info['port']}"]
    try:
        with PsClient(address, KEY, 0) as client:
            client.request("init", [W0], optimizer=SGD, trainable=list(W0))
            version = 0
            for _ in range(120):
                version = client.request("push", [grads(0.01)], version=version, step=version)[0].header["version"]
        with PsClient(address, KEY, "controller", heartbeat=False) as controller:
            recent = controller.request("stats", since=100)[0].header
            final = controller.request("stats")[0].header
            controller.request("stop")
    finally:
        launcher.stop_shard(info["pid"])
    assert (recent["since"], len(recent["log"])) == (100, 20)  # the telemetry's read from where it left off
    assert (final["since"], len(final["log"]), final["log_total"]) == (70, 50, 120)  # the window only
    assert [entry[LOG_FIELDS.index("version")] for entry in whole_log(final)] == list(range(1, 121))
    run = Run(id=1, cell="", strategy="nfdt", options={}, workers=[0])
    run.ps = [final]
    assert [r["version"] for r in run.push_records] == list(range(1, 121))
