"""Pure pieces of HFDT: sharding, Horovod host plans, the bound rendezvous, lr scaling."""

from __future__ import annotations

import socket
import urllib.request

import keras
import numpy as np
import pytest
import tensorflow as tf

from nbdist.errors import ClusterError, OptionError
from nbdist.host.netroute import interface_towards
from nbdist.strategies.rendezvous import Rendezvous, host_plan
from nbdist.datasets.sharding import shard_arrays, shard_dataset, split_validation
from nbdist.strategies.hfdt_worker import require_resolvable
from nbdist.strategies.horovod_ops import lr_scaler as _lr_scaler


def test_split_validation_is_keras_own():
    x, y = np.arange(10), np.arange(10) * 10
    (tx, ty), (vx, vy) = split_validation(x, y, 0.25)
    assert tx.tolist() == list(range(8)) and vx.tolist() == [8, 9]  # ceil(10 * 0.75) = 8
    assert vy.tolist() == [80, 90]


def test_shards_are_equal_strided_and_rebuild_the_global_batches():
    x = np.arange(11)
    shards = [shard_arrays(x, x, rank, 2)[0] for rank in range(2)]
    assert [s.tolist() for s in shards] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]  # sample 10 left out
    b = 2  # per-worker batch: global batch i of the two shards == x[4i:4i+4]
    for i in range(2):
        assert sorted(np.concatenate([s[i * b:(i + 1) * b] for s in shards]).tolist()) == list(range(4 * i, 4 * i + 4))


def test_shards_of_dicts_and_too_few_samples():
    x = {"a": np.arange(6), "b": np.arange(6) * 2}
    sx, sy = shard_arrays(x, np.arange(6), 2, 3)
    assert sx["a"].tolist() == [2, 5] and sx["b"].tolist() == [4, 10] and sy.tolist() == [2, 5]
    with pytest.raises(OptionError, match="2 training samples cannot be shared by 3 workers"):
        shard_arrays(np.arange(2), np.arange(2), 0, 3)


def test_dataset_shards_have_equal_batch_counts():
    data = tf.data.Dataset.range(50).batch(5)  # 10 batches over 3 ranks: 3 each
    counts = [len(list(shard_dataset(data, r, 3, None)[0])) for r in range(3)]
    assert counts == [3, 3, 3]
    first = [int(b[0]) for b in shard_dataset(data, 1, 3, None)[0]]
    assert first == [5, 20, 35]  # batches 1, 4, 7


def test_dataset_of_unknown_length_needs_steps():
    unknown = tf.data.Dataset.range(10).filter(lambda v: v > 2).batch(2)
    with pytest.raises(OptionError, match="unknown length: give fit a steps_per_epoch"):
        shard_dataset(unknown, 0, 2, None)
    _, steps = shard_dataset(unknown, 0, 2, 3)
    assert steps == 3


def test_host_plan_groups_local_ranks_by_host():
    order, slots = host_plan(["h1", "h2", "h1"])
    assert order == [0, 2, 1]  # engines 0 and 2 share h1: ranks 0 and 1
    assert [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank) for s in slots] == [
        ("h1", 0, 0, 2, 0), ("h1", 1, 1, 2, 0), ("h2", 2, 0, 1, 1)]


def test_rendezvous_binds_only_the_given_address():
    _, slots = host_plan(["h"])
    with Rendezvous("127.0.0.1") as rendezvous:
        port = rendezvous.start(slots)
        assert rendezvous._server.server_address == ("127.0.0.1", port)
        # Horovod's rendezvous answers a GET for an unknown key with 404: the server is up.
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/global/nothing", timeout=5)
        assert missing.value.code == 404
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def _http(method: str, port: int, path: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        return urllib.request.urlopen(request, timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_scope_whose_ranks_finalized_around_another_scopes_completion_forgets_its_addresses():
    # Two ranks on host h: scopes global and local_h of 2, cross_0 and cross_1 of 1. Rank 0 finalizes local_h and
    # then its cross_0 before rank 1 finalizes local_h (a loaded host): Horovod 0.28.1's handler would forget that
    # rank 0 had finalized local_h, keep its addresses, and the run's next Horovod job would read them.
    _, slots = host_plan(["h", "h"])
    with Rendezvous("127.0.0.1") as rendezvous:
        port = rendezvous.start(slots)
        for scope, ranks in (("global", 2), ("local_h", 2), ("cross_0", 1), ("cross_1", 1)):
            for rank in range(ranks):
                assert _http("PUT", port, f"/{scope}/{rank}", b"address") == 200
        for path in ("/global/0", "/global/1", "/local_h/0", "/cross_0/0", "/local_h/1", "/cross_1/0"):
            assert _http("DELETE", port, path) == 200
        assert [_http("GET", port, f"/{scope}/0") for scope in ("global", "local_h", "cross_0", "cross_1")] == [404] * 4
        assert _http("GET", port, "/local_h/1") == 404
        assert _http("PUT", port, "/local_h/0", b"next job") == 200 and _http("GET", port, "/local_h/0") == 200


RANK = """
import os, sys, time
import horovod.tensorflow as hvd, tensorflow as tf
from nbdist.strategies.rendezvous import arrive_together
rank, port = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
for job in range(int(sys.argv[1])):
    if rank == 1 and job == 1:
        time.sleep(float(sys.argv[2]))  # the fault itself, not a wait on anything: late past Gloo's own 5 s
    arrive_together("127.0.0.1", port, rank, 2, job)  # what each rank does before hvd.init (HfdtWorker)
    hvd.init()
    assert float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)[0]) == 2.0
    hvd.shutdown()
"""


class _LoadedHost(Rendezvous):
    """The interleaving a loaded host makes, forced by conditions on what the server has seen: in every job rank 1
    finalizes its host's local scope only after rank 0 finalized cross_0, and from the second job on it publishes
    its new local address only after rank 0 has asked for it. (Gloo names the local scope by the host's name.)"""

    def handler(self):
        import threading

        base, host = super().handler(), socket.gethostname()
        seen = {"finalized cross_0": 0, "published local 0": 0, "asked local 1": 0}
        changed = threading.Condition()

        def count(what):
            with changed:
                seen[what] += 1
                changed.notify_all()

        def after(condition):  # bounded: with Horovod's handler rank 0 may already be dead and never ask
            with changed:
                changed.wait_for(lambda: condition(seen), timeout=30)

        class Late(base):
            jobs = {"published": 0, "finalized": 0}

            def do_GET(self):
                if self.path == f"/local_{host}/1":
                    count("asked local 1")
                super().do_GET()

            def do_PUT(self):
                if self.path == f"/local_{host}/0":
                    with changed:
                        seen["asked local 1"] = 0  # (asked in this job, from here on)
                    count("published local 0")
                if self.path == f"/local_{host}/1":
                    Late.jobs["published"] += 1
                    job = Late.jobs["published"]
                    if job > 1:
                        after(lambda s: s["published local 0"] >= job and s["asked local 1"] > 0)
                super().do_PUT()

            def do_DELETE(self):
                if self.path == f"/local_{host}/1":
                    Late.jobs["finalized"] += 1
                    job = Late.jobs["finalized"]
                    after(lambda s: s["finalized cross_0"] >= job)
                super().do_DELETE()
                if self.path == "/cross_0/0":
                    count("finalized cross_0")

        return Late


@pytest.mark.cluster
def test_horovod_jobs_one_after_another_on_one_rendezvous_survive_a_late_rank():
    """Two real Horovod processes, three jobs each (init, allreduce, shutdown: a cell's three `fit`s) on one run's
    rendezvous, rank 1 reaching the second job 6 s late. With Horovod's own handler both abort at the second
    job's init (`gloo::IoException ... connect ...: Connection refused`: each connects to the other's last job's
    address); without `arrive_together` rank 0 aborts there (`... Wait timeout after 5 seconds for key(s)`)."""
    import os
    import subprocess
    import sys

    host = socket.gethostname()
    _, slots = host_plan([host, host])
    with _LoadedHost("127.0.0.1") as rendezvous:
        port = rendezvous.start(slots)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo",
               "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": interface_towards("127.0.0.1"),
               "HOROVOD_HOSTNAME": host, "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2",
               "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "5"}
        ranks = [subprocess.Popen([sys.executable, "-c", RANK, "3", "6"], stderr=subprocess.PIPE, text=True,
                                  env={**env, "HOROVOD_RANK": str(rank), "HOROVOD_LOCAL_RANK": str(rank)})
                 for rank in range(2)]
        try:
            errors = [rank.communicate(timeout=180)[1] for rank in ranks]
        finally:
            for rank in ranks:
                rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(e[-2000:] for e in errors)


def test_ranks_arrive_together_and_a_rank_that_never_comes_is_named(monkeypatch):
    import threading

    from nbdist import limits
    from nbdist.strategies import rendezvous as module

    _, slots = host_plan(["h", "h", "h"])
    with Rendezvous("127.0.0.1") as rendezvous:
        port = rendezvous.start(slots)
        arrived = []
        first = threading.Thread(target=lambda: (module.arrive_together("127.0.0.1", port, 0, 2, 0), arrived.append(0)))
        first.start()
        first.join(0.5)
        assert first.is_alive() and not arrived  # rank 0 waits for rank 1
        module.arrive_together("127.0.0.1", port, 1, 2, 0)
        first.join(10)
        assert arrived == [0]
        monkeypatch.setattr(module, "LIMITS", limits.Limits(job_start_s=0.5))
        with pytest.raises(ClusterError, match=r"rank 0 waited 0.5 s for rank\(s\) \[1, 2\] to start Horovod job 1"):
            module.arrive_together("127.0.0.1", port, 0, 3, 1)


def test_interface_towards_loopback():
    assert interface_towards("127.0.0.1", 80) == "lo"


def test_lr_scaler_ramps_linearly_then_restores():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: seen.append(round(float(model.optimizer.learning_rate), 6)))
    model.fit(np.zeros((8, 2)), np.zeros(8), batch_size=2, epochs=2, verbose=0,
              callbacks=[_lr_scaler(model.optimizer, 4, warmup_epochs=1), record])
    # 4 steps per epoch; warm-up over epoch 0 from 0.1 to 0.4, then 0.4 (= 0.1 x 4 workers).
    assert seen == [0.1, 0.175, 0.25, 0.325, 0.4, 0.4, 0.4, 0.4]
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)


def test_an_unresolvable_host_name_is_refused_before_horovod_crashes_on_it():
    require_resolvable("localhost")
    with pytest.raises(ClusterError, match="does not resolve here.*DNS or /etc/hosts"):
        require_resolvable("no-such-host.invalid")


def test_speed_shares_are_interleaved_and_cover_every_sample_once():
    from nbdist.datasets.sharding import shard_by_fraction, weighted_owners

    owners = weighted_owners(10, [2.0, 1.0, 2.0])  # shares 4, 2, 4 of ten samples, spread through them
    assert owners.tolist() == [0, 2, 1, 0, 2, 0, 2, 1, 0, 2]
    x = np.arange(100)
    parts = [shard_by_fraction(x, x, rank, [1.0, 1.0, 0.2, 0.1])[0] for rank in range(4)]
    assert [len(p) for p in parts] == [44, 43, 9, 4] and sorted(np.concatenate(parts).tolist()) == list(range(100))
