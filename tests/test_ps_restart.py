"""A parameter-server shard that dies is restarted from the last checkpoint; its workers reconnect by themselves."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from nbdist.ps.client import PsClient, PsUnavailable
from nbdist.ps.service import PsService
from tests.support import SGD, W0, grads, within

pytestmark = pytest.mark.cluster  # shard processes, killed and restarted

SETTINGS = {"max_staleness": None, "rule": None, "synchronous": False, "momentum": None, "start_barrier": False,
            "clock": "real"}


@pytest.fixture
def service(tmp_path):
    ps = PsService(7, 1, 1, SETTINGS, str(tmp_path), checkpoint_every_s=3600, restarts=1)
    ps.start("127.0.0.1")
    yield ps
    ps.stop()


def test_a_killed_shard_restarts_from_its_checkpoint_and_the_waiting_push_is_resent(service):
    with PsClient(service.addresses, service.key, 0, ps_timeout_s=30) as worker:
        worker.request("init", [W0], optimizer=SGD, trainable=list(W0), layout=list(W0))
        worker.request("pull")
        for version in range(2):
            worker.request("push", [grads(1.0)], version=version, step=version)
        checkpointed = within(lambda: service.last_checkpoint)  # the first checkpoint: as soon as the model came
        saved = checkpointed["version"]
        killed = time.monotonic()
        os.kill(service.shards[0].pid, signal.SIGKILL)
        # pushed on version 2 while the shard is dead: held, resent to the restarted shard, applied there
        reply, = worker.request("push", [grads(1.0)], version=2, step=2)
        assert reply.kind == "weights" and reply.header["version"] == saved + 1
        assert reply.header["staleness"] == abs(saved - 2)  # computed on weights newer than the checkpoint
        # the monitor records the restart once its last request is answered, which can be just after the held push
        restarted, = within(lambda: service.restarts, timeout=10, what="the restart's event")
        since_kill = time.monotonic() - killed
        assert restarted["event"] == "shard_restarted" and restarted["shard"] == 0 and restarted["version"] == saved
        # the recovery it reports is the restart's own, which happened after the kill
        assert 0 < restarted["recovery_s"] <= since_kill and restarted["restarts_left"] == 0
        # the checkpoint's weights, then one SGD step of lr 0.5 on a gradient of ones
        np.testing.assert_allclose(reply.arrays["dense/bias"], -0.5 * np.ones(3) * (saved + 1))

        os.kill(service.shards[0].pid, signal.SIGKILL)  # no restarts left: the run fails, saying why
        within(lambda: service.failure)
        assert "no restarts left" in service.failure and "--ps-restarts" in service.failure
        with pytest.raises(PsUnavailable), PsClient(service.addresses, service.key, 0, ps_timeout_s=1) as late:
            late.request("pull")


def test_a_restarted_shard_turns_away_requests_until_its_checkpoint_arrives_and_then_says_so():
    from nbdist.ps import wire
    from nbdist.ps.handlers import HANDLERS
    from nbdist.ps.shard import Shard
    from tests.support import message

    shard = Shard({"workers": 1, "incarnation": 1})
    with pytest.raises(wire.Rejected, match="restarting"):  # a push queued for its predecessor
        shard.handle(b"w0", message("push", grads(1.0), worker=0, version=3, step=3))
    assert HANDLERS["heartbeat"](shard, b"w0", 0, None)[0][3]["incarnation"] == 0  # not announced yet
    shard.handle(b"k", message("restore", W0, worker=0, version=3))
    shard.handle(b"k", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0)))
    assert HANDLERS["heartbeat"](shard, b"w0", 0, None)[0][3]["incarnation"] == 1  # now workers resend to it
    replies = shard.handle(b"w0", message("push", grads(1.0), worker=0, version=5, step=5))
    assert replies[0][3]["staleness"] == 2 and shard.version == 4  # from weights 2 versions newer than the checkpoint


def test_the_monitor_asking_for_a_checkpoint_before_the_model_arrives_gets_nothing_and_no_error():
    from nbdist.ps.shard import Shard
    from tests.support import message

    shard = Shard({"workers": 1})
    (_, kind, arrays, fields), = shard.handle(b"k", message("state", worker="controller"))
    assert kind == "state" and arrays == {} and fields["names"] == []
