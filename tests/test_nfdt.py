"""NFDT on real engines with a real parameter-server process, through a real kernel."""

from __future__ import annotations

import os
import signal

import numpy as np
import psutil
import pytest

from nbdist.ps import checkpoint
from tests.support import SGD_CELL, idle_engines, join_mid_run, own_cluster, push_log, wait_for, within

pytestmark = pytest.mark.cluster
cluster = own_cluster(engines=2)  # its tests kill workers and shards


def test_one_worker_plain_sgd_equals_sequential_sgd(kernel):
    cell = SGD_CELL.format(lr=0.1, batch=32, epochs=1, steps=12, shuffle=False)
    kernel.run("%%distribute --strategy local --seed 5\n" + cell, timeout=180).check()
    kernel.run("sequential = model.get_weights()").check()
    kernel.run("%%distribute --strategy nfdt --workers 1 --overlap off --seed 5\n" + cell, timeout=180).check()
    diff = kernel.value("max(float(abs(a - b).max()) for a, b in zip(sequential, model.get_weights()))")
    assert diff <= 1e-6, diff
    assert kernel.value("nbdist.last_run.ps[0]['version']") == 12


def test_overlap_with_one_worker_computes_each_step_on_the_weights_one_exchange_older(kernel):
    cell = SGD_CELL.format(lr=0.1, batch=32, epochs=1, steps=12, shuffle=False)
    kernel.run("%%distribute --strategy nfdt --workers 1 --seed 5\n" + cell, timeout=180).check()  # overlap: default
    # push k was computed on the weights push k-2 brought back (the first two on the start): one version stale
    assert [e["staleness"] for e in push_log(kernel)] == [0] + [1] * 11
    assert kernel.value("nbdist.last_run.ps[0]['version']") == 12  # no push lost, the one in flight included
    timings = kernel.value("nbdist.last_run.fits[0].timings")
    # the step waits only while an exchange is in flight: the exposed part is a part of the flight time
    assert 0 <= timings["exchange_waited_s"] <= timings["exchange_flight_s"], timings
    assert timings["exposed_exchange_fraction"] == pytest.approx(
        timings["exchange_waited_s"] / timings["exchange_flight_s"], abs=1e-4), timings


def test_overlap_auto_stays_off_for_a_high_sgd_momentum_and_says_why(kernel):
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=1, steps=6, shuffle=False).replace(
        "SGD(0.05)", "SGD(0.05, momentum=0.9)")
    reply = kernel.run("%%distribute --strategy nfdt --workers 1\n" + cell, timeout=180).check()
    assert "--overlap auto was off: the SGD momentum 0.9" in reply.stdout
    assert {e["staleness"] for e in push_log(kernel)} == {0}  # every step waited for its own reply


def test_overlap_with_two_workers_applies_every_acknowledged_push_and_loss_falls(kernel, cluster):
    idle_engines(cluster, 2)
    cell = SGD_CELL.format(lr=0.1, batch=32, epochs=3, steps="None", shuffle=True)
    # the virtual clock makes the push order, hence the loss, the same every run
    kernel.run('%%distribute --strategy nfdt --workers 2 --seed 2 --simulate "clock=virtual; step=5ms"\n' + cell,
               timeout=300).check()
    counts = kernel.value("nbdist.last_run.ps[0]['counts']")
    steps = 3 * -(-2000 // 32)  # batches on demand: each epoch's batches of 32, every sample once
    assert counts["applied"] == counts["acked"] == steps and counts["rejected"] == 0, (counts, steps)
    log = push_log(kernel)
    assert sorted(e["batch"] for e in log) == sorted([e, s, min(32, 2000 - s)] for e in range(3) for s in range(0, 2000, 32))
    # after its first push a worker's pushes alternate with the other's, one version stale; only the last batch of
    # an epoch, pushed while the other worker waits for the epoch's end, can be fresh: at most one an epoch
    assert sum(1 for e in log if e["step"] > 1 and e["staleness"] == 0) <= 3, [e["staleness"] for e in log]
    loss = kernel.value("history.history['loss']")
    assert loss[-1] < loss[0], loss


def test_four_workers_apply_every_acknowledged_push_with_staleness_and_loss_falls(kernel, cluster):
    idle_engines(cluster, 4)
    cell = SGD_CELL.format(lr=0.1, batch=32, epochs=3, steps="None", shuffle=True)
    # the virtual clock (equal speeds, static shards of 500: 16 steps each an epoch): the four workers' pushes
    # arrive together and go in rank order, so every push after the first round is 3 versions stale, on both
    # shards alike; but rank 0 takes the job's model at each epoch's barrier (its checkpoint is the job's), so its
    # first push of a later epoch is fresh
    kernel.run('%%distribute --strategy nfdt --workers 4 --ps-shards 2 --seed 2 --data static '
               '--simulate "clock=virtual; step=5ms"\n' + cell, timeout=300).check()
    shards = kernel.value("[s['counts'] for s in nbdist.last_run.ps]")
    steps = kernel.value("sum(len(fit.history['loss']) * fit.params['steps'] "
                         "for fits in nbdist.last_run.results.values() for fit in fits)")
    for counts in shards:  # every shard saw every push; each acknowledged push was applied exactly once
        assert counts["applied"] == counts["acked"] == steps, (counts, steps)
        assert counts["rejected"] == 0
    log = push_log(kernel)
    assert len(log) == steps and [e["staleness"] for e in log[:4]] == [0, 1, 2, 3]
    fresh = [e["staleness"] for e in log[4:] if e["worker"] == 0 and e["step"] % 16 == 1]
    assert fresh == [0, 0], [(e["worker"], e["step"], e["staleness"]) for e in log]
    assert {e["staleness"] for e in log[4:] if not (e["worker"] == 0 and e["step"] % 16 == 1)} == {3}
    result = kernel.value("{'loss': history.history['loss'], 'eval': model.evaluate(xt, yt, verbose=0)[1]}")
    assert result["loss"][-1] < result["loss"][0], result
    assert result["eval"] > 0.5, result


def test_each_epochs_checkpoint_is_the_jobs_model_at_that_epoch_and_the_last_is_the_model_returned(kernel, cluster,
                                                                                                       tmp_path):
    """keras.io's `ModelCheckpoint("save_at_{epoch}.keras")` under two asynchronous workers: rank 0 writes the model
    the shards hold at each epoch's barrier, not its own last copy, so the last file predicts what the notebook's
    model predicts (it once differed: 0.1197 against 0.1348 on one image)."""
    idle_engines(cluster, 2)
    path = tmp_path / "save_at_{epoch}.keras"
    cell = TRAIN_WITH_CHECKPOINTS.format(path=str(path))
    kernel.run('%%distribute --strategy nfdt --workers 2 --seed 3 --simulate "clock=virtual; step=5ms"\n' + cell,
               timeout=300).check()
    assert sorted(p.name for p in tmp_path.glob("save_at_*.keras")) == ["save_at_1.keras", "save_at_2.keras"]
    gap = kernel.value(f"float(abs(keras.saving.load_model({str(tmp_path / 'save_at_2.keras')!r}).predict(x[:64], "
                       "verbose=0) - model.predict(x[:64], verbose=0)).max())")
    assert gap <= 1e-6, gap
    first = kernel.value(f"float(abs(keras.saving.load_model({str(tmp_path / 'save_at_1.keras')!r}).predict(x[:64], "
                         "verbose=0) - model.predict(x[:64], verbose=0)).max())")
    assert first > 1e-4, first  # (the first epoch's file is that epoch's model, not the last)


TRAIN_WITH_CHECKPOINTS = """
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=64, epochs=2, callbacks=[keras.callbacks.ModelCheckpoint({path!r})], verbose=0)
"""


def test_max_staleness_bounds_the_lead_over_the_slowest_worker(kernel, cluster):
    idle_engines(cluster, 4)
    cell = SGD_CELL.format(lr=0.05, batch=16, epochs=1, steps="None", shuffle=True)
    kernel.run("%%distribute --strategy nfdt --workers 4 --max-staleness 1 --ps-on engines --ps-shards 2\n" + cell,
               timeout=300).check()
    placed = kernel.value("[(s['shard'], s['engine']) for s in nbdist.last_run.ps]")
    placed = [tuple(p) for p in placed]
    assert placed == [(0, kernel.value("nbdist.last_run.workers[0]")), (1, kernel.value("nbdist.last_run.workers[1]"))]
    log = push_log(kernel)
    assert len(log) == -(-2000 // 16)  # batches on demand: every sample once, in batches of 16
    assert max(e["lead"] for e in log) <= 1, max(e["lead"] for e in log)


def test_a_worker_killed_mid_run_is_dropped_and_the_others_finish(kernel, cluster):
    engines = idle_engines(cluster, 3)
    _, client = cluster
    victim = engines[-1]
    pid = client[victim].apply_sync(os.getpid)
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=20, steps="None", shuffle=True)
    msg_id = kernel.submit(f"%%distribute --strategy nfdt --targets {','.join(map(str, engines))}\n" + cell)
    kernel.collect(msg_id, timeout=180, until_output="step")
    os.kill(pid, signal.SIGKILL)
    reply = kernel.collect(msg_id, timeout=240)
    assert reply.status == "ok", reply.error_text
    assert f"worker rank 2 (engine {victim}" in reply.stdout and "died" in reply.stdout
    events = kernel.value("nbdist.last_run.events")
    assert [e["rank"] for e in events if e["event"] == "worker_died"] == [2]
    assert [e["worker"] for e in events if e["event"] == "worker_dropped"] == [2]
    assert kernel.value("len(nbdist.last_run.results)") == 2
    assert kernel.value("len(model.get_weights()) == len(nbdist.last_run.weights) > 0")


def test_an_engine_started_mid_run_joins_it_with_its_pushes_applied_and_acknowledged(kernel, cluster):
    engines = idle_engines(cluster, 2)
    epochs = 4
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=epochs, steps="None", shuffle=True).replace(
        "validation_data=", "callbacks=[Gate()], validation_data=")
    joined, newcomer, reply = join_mid_run(kernel, cluster,
                                           f"--strategy nfdt --targets {','.join(map(str, engines))}", cell)
    assert f"engine {newcomer} (host" in reply.stdout and "joined run" in reply.stdout
    assert kernel.value("nbdist.last_run.workers") == [*engines, newcomer]
    first = joined["first_epoch"]
    assert kernel.value(f"len(nbdist.last_run.results[{newcomer}][0].history['loss'])") == epochs - first
    counts = kernel.value("nbdist.last_run.ps[0]['counts']")
    steps = epochs * -(-2000 // 32)  # batches on demand: each epoch every sample once, the newcomer's among them
    assert counts["applied"] == counts["acked"] == steps and counts["rejected"] == 0, (counts, steps)
    dealt = kernel.value(f"nbdist.last_run.results[{newcomer}][0].timings['batches']")  # what it trained, by epoch
    assert 0 < sum(1 for e in push_log(kernel) if e["worker"] == 2) == sum(len(b) for b in dealt.values())
    assert kernel.value("len(history.history['loss'])") == epochs


def test_ps_killed_fails_fast_with_the_checkpoint_then_resume_continues_from_it(kernel, cluster, tmp_path):
    idle_engines(cluster, 2)
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=200, steps="None", shuffle=True)
    msg_id = kernel.submit(f"%%distribute --strategy nfdt --workers 2 --checkpoint-every 1 --ps-restarts 0 "
                           f"--checkpoint-dir {tmp_path}\n" + cell)
    kernel.collect(msg_id, timeout=180, until_output="step")
    saved = kernel_checkpoint(tmp_path)
    # the shard this run started: the kernel's one child running a shard (the kernel is busy with the cell)
    shard, = [p for p in psutil.Process(kernel.pid).children() if "nbdist.ps.server" in " ".join(p.cmdline())]
    shard.kill()
    reply = kernel.collect(msg_id, timeout=120)
    assert reply.status == "error" and reply.ename == "ParameterServerFailed", reply.error_text
    assert str(saved) in reply.evalue and "--resume" in reply.evalue
    state = checkpoint.load(saved)
    returned = kernel.value("[w.tolist() for w in nbdist.last_run.weights]")
    assert len(returned) == len(state["layout"]) > 0
    for got, want in zip(returned, checkpoint.model_weights(state)):
        np.testing.assert_array_equal(np.asarray(got, np.float32), want)

    short = SGD_CELL.format(lr=0.05, batch=32, epochs=1, steps=3, shuffle=True)
    kernel.run(f"%%distribute --strategy nfdt --workers 2 --checkpoint-dir {tmp_path} --resume\n" + short,
               timeout=180).check()
    resumed = checkpoint.load(saved)["version"]
    assert kernel.value("[e['event'] for e in nbdist.last_run.events]")[:1] == ["resumed"]
    assert kernel.value("nbdist.last_run.ps[0]['version']") == resumed + 6


def test_a_killed_shard_is_restarted_from_its_checkpoint_and_the_run_finishes(kernel, cluster, tmp_path):
    idle_engines(cluster, 2)
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=6, steps="None", shuffle=True)
    # static shards: a restarted shard 0 cannot resume dealing batches on demand (their runs do not restart shards)
    msg_id = kernel.submit(f"%%distribute --strategy nfdt --workers 2 --data static --checkpoint-dir {tmp_path}\n"
                           + cell)
    kernel.collect(msg_id, timeout=180, until_output="step")
    kernel_checkpoint(tmp_path)  # the first checkpoint is taken as soon as the model reached the shard
    within(lambda: any(p.stat().st_size for p in tmp_path.glob("*.pushlog-0.jsonl")))  # flushed once a second
    shard, = [p for p in psutil.Process(kernel.pid).children() if "nbdist.ps.server" in " ".join(p.cmdline())]
    shard.kill()
    reply = kernel.collect(msg_id, timeout=240)
    assert reply.status == "ok", reply.error_text
    restarted, = [e for e in kernel.value("nbdist.last_run.events") if e["event"] == "shard_restarted"]
    assert restarted["shard"] == 0 and restarted["restarts_left"] == 2
    assert kernel.value("len(history.history['loss'])") == 6  # every epoch, in one History
    losses = kernel.value("history.history['loss']")
    assert losses[-1] < losses[0]
    final = kernel.value("nbdist.last_run.ps[0]")
    assert final["counts"]["applied"] == final["counts"]["acked"] > 0  # the restarted shard's own pushes
    records = kernel.value("[r['version'] for r in nbdist.last_run.push_records]")
    assert len(records) > final["counts"]["acked"]  # the log carries on across the restart: before and after


def kernel_checkpoint(directory, timeout: float = 60):
    """The first checkpoint the run writes (the file appears when the PS has been saved once)."""
    return wait_for(lambda: checkpoint.latest(directory), f"a checkpoint in {directory}", timeout)


def test_options_nfdt_cannot_honour_are_refused_by_name(kernel):
    rmsprop = SGD_CELL.format(lr=0.1, batch=32, epochs=1, steps=2, shuffle=False).replace(
        "keras.optimizers.SGD(0.1)", "keras.optimizers.RMSprop()")
    reply = kernel.run("%%distribute --strategy nfdt --max-staleness -1\n" + rmsprop)
    assert reply.ename == "OptionError" and "--max-staleness takes a number of at least 0" in reply.evalue
    reply = kernel.run("%%distribute --strategy hfdt --ps-shards 2\n" + rmsprop)
    assert reply.ename == "OptionError" and "--ps-shards applies to nfdt" in reply.evalue
