"""HFDT on 2 real engines with real Horovod, through a real kernel."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.conftest import TRAIN
from tests.support import dies_at, eventually, new_engine, own_cluster, paused_in_first_two_epochs, scaled, within

pytestmark = pytest.mark.cluster
cluster = own_cluster(engines=2)  # its tests kill, stall and interrupt engines

EPOCHS = 4
WEIGHTS_OF_RANKS = ("(lambda r: max(float(abs(a - b).max()) for a, b in "
                    "zip(r.results[r.workers[0]][-1].weights, r.results[r.workers[1]][-1].weights)))"
                    "(nbdist.last_run)")


def test_ranks_agree_loss_falls_and_model_comes_back(kernel):
    kernel.run("%%distribute --strategy hfdt --workers 2 --seed 1 --compression fp16 --warmup-epochs 1\n"
               + TRAIN.format(epochs=3), timeout=240).check()
    assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6
    result = kernel.value("{'loss': history.history['loss'], 'val': history.history['val_accuracy'][-1], "
                          "'eval': model.evaluate(xt, yt, verbose=0)[1], 'workers': nbdist.last_run.workers, "
                          "'lr': float(model.optimizer.learning_rate)}")
    assert result["loss"][0] > result["loss"][1] > result["loss"][2]
    assert len(result["workers"]) == 2
    # Validation is sharded evenly and averaged: it equals evaluating the returned model on all of it.
    assert result["eval"] == pytest.approx(result["val"], abs=1e-6)
    assert result["lr"] == pytest.approx(0.05)  # the scaled rate is the engines' business; the user's is restored


def test_two_workers_batch_b_match_local_batch_2b(kernel):
    cell = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size={batch}, epochs=1, steps_per_epoch=10, shuffle=False)
'''
    kernel.run("%%distribute --strategy local --seed 11\n" + cell.format(batch=64), timeout=180).check()
    kernel.run("local_weights = model.get_weights()").check()
    kernel.run("%%distribute --strategy hfdt --workers 2 --scale-lr none --seed 11\n" + cell.format(batch=32),
               timeout=180).check()
    diff = kernel.value("max(float(abs(a - b).max()) for a, b in zip(local_weights, model.get_weights()))")
    scale = kernel.value("max(float(abs(w).max()) for w in local_weights)")
    assert diff <= 1e-5 * max(1.0, scale), diff


def test_rerun_with_another_number_of_workers(kernel):
    short = TRAIN.format(epochs=1).replace("epochs=1", "epochs=1, steps_per_epoch=5")
    kernel.run("%%distribute --strategy hfdt --workers 1\n" + short, timeout=180).check()
    assert len(kernel.value("nbdist.last_run.workers")) == 1
    kernel.run("%%distribute --strategy hfdt --workers 2\n" + short, timeout=180).check()
    assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6


def test_hfdt_refuses_options_of_nothing_and_local_refuses_hfdt_options(kernel):
    reply = kernel.run("%%distribute --strategy local --compression fp16\n" + TRAIN.format(epochs=1))
    assert reply.ename == "OptionError" and "--compression applies to hfdt" in reply.evalue


def test_engine_killed_mid_run_fails_fast_and_next_hfdt_cell_works(kernel, cluster):
    ipp_cluster, client = cluster
    before = set(client.ids)
    ipp_cluster.start_engines_sync(n=2)
    client.wait_for_engines(len(before) + 2, timeout=90, block=True)
    survivor, victim = sorted(set(client.ids) - before)
    pid = client[victim].apply_sync(os.getpid)

    # the victim dies as its 11th step begins, the survivor inside that step's allreduce
    cell = dies_at(pid, 10) + TRAIN.format(epochs=200).replace("validation_data=(xt, yt))",
                                                              "validation_data=(xt, yt), callbacks=[DiesAt()])")
    reply = kernel.run(f"%%distribute --strategy hfdt --on-failure fail --targets {survivor},{victim}\n" + cell,
                       timeout=240)
    assert reply.ename == "EngineDied", reply.error_text
    assert f"engine {victim} (host " in reply.evalue and f"pid {pid}" in reply.evalue
    # The survivor was freed (Horovod shut down) and trains again with another engine.
    kernel.run(f"%%distribute --strategy hfdt --targets {survivor},0\n" + TRAIN.format(epochs=1), timeout=180).check()
    assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6


def test_a_rank_killed_mid_run_leaves_the_survivors_training_to_the_end_with_equal_weights(kernel, cluster):
    victim, pid = new_engine(cluster)
    steps = 21  # an epoch: a rank's 667 (or 666) strided samples of 2000 in batches of 32
    cell = dies_at(pid, steps) + TRAIN.format(epochs=EPOCHS).replace("batch_size=64", "batch_size=32").replace(
        "validation_data=(xt, yt))", "validation_data=(xt, yt), callbacks=[DiesAt()])")
    kernel.run(f"%%distribute --strategy hfdt --seed 3 --targets 0,1,{victim}\n" + cell, timeout=300).check()
    run = kernel.value("{'events': nbdist.last_run.events, 'loss': history.history['loss'], "
                       "'val': history.history['val_accuracy']}")
    died = [e for e in run["events"] if e["event"] == "worker_died"]
    recovered = [e for e in run["events"] if e["event"] == "recovered"]
    assert [(e["engine"], e["rank"]) for e in died] == [(victim, 2)]
    # the survivors resumed from the last step all three completed: the first epoch's last
    assert [(e["engine"], e["size"], e["step"]) for e in recovered] == [(victim, 2, steps)], recovered
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert len(run["loss"]) == len(run["val"]) == EPOCHS  # one History, every epoch
    assert run["loss"][-1] < run["loss"][1]  # training went on after the re-forming, on 2 ranks
    assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6  # ranks 0 and 1, the survivors


def test_an_engine_started_mid_run_joins_the_horovod_job_at_an_epoch_end_with_equal_weights(kernel, cluster):
    epochs = 5
    cell = TRAIN.format(epochs=epochs).replace("validation_data=", "callbacks=[Gate()], validation_data=")
    with paused_in_first_two_epochs(kernel, "--strategy hfdt --seed 3 --targets 0,1", cell):
        newcomer, _ = new_engine(cluster)  # no epoch ends until the newcomer waits for the job
        # the kernel announces the larger job once the newcomer waits for it; the ranks leave at the next epoch end
        eventually(kernel, "(nbdist.last_run.controller.bus.state['reform'] or {}).get('grow')", timeout=120)
        kernel.run("nbdist.last_run.control('resume')").check()
        reply = kernel.run("%dist wait", timeout=300).check()
    events = kernel.value("nbdist.last_run.events")
    joined, = [e for e in events if e["event"] == "worker_joined"]
    grown, = [e for e in events if e["event"] == "grown"]
    assert (joined["engine"], joined["rank"], grown["size"]) == (newcomer, 2, 3), events
    assert "the Horovod job grew to 3 ranks" in reply.stdout
    assert kernel.value("nbdist.last_run.workers") == [0, 1, newcomer]
    assert kernel.value(f"len(nbdist.last_run.results[{newcomer}][0].history['loss'])") == epochs - grown["epoch"]
    assert kernel.value("len(history.history['loss'])") == epochs  # one History, every epoch
    assert kernel.value("(lambda r: max(float(abs(a - b).max()) for e in r.workers[1:] for a, b in "
                        "zip(r.results[r.workers[0]][-1].weights, r.results[e][-1].weights)))(nbdist.last_run)") <= 1e-6
    loss = kernel.value("history.history['loss']")
    assert loss[-1] < loss[0], loss


def test_an_engine_started_after_a_death_takes_the_dead_ranks_shard_at_an_epoch_end(kernel, cluster):
    victim, pid = new_engine(cluster)
    kernel.run(f"%%distribute --strategy hfdt --background --targets 0,1,{victim}\n" + TRAIN.format(epochs=200),
               timeout=120).check()
    eventually(kernel, "all(nbdist.last_run.progress.get(e) for e in nbdist.last_run.workers)", timeout=120)
    os.kill(pid, signal.SIGKILL)
    within(lambda: victim not in cluster.client.ids, timeout=60, what=f"the hub to drop engine {victim}")
    newcomer, _ = new_engine(cluster)  # taken in once the survivors have re-formed, at an epoch's end after
    eventually(kernel, f"(nbdist.last_run.progress.get({newcomer}) or {{}}).get('record')", timeout=180)
    kernel.run("nbdist.last_run.stop()").check()  # every rank stops at the same step
    kernel.run("%dist wait", timeout=120).check()
    events = kernel.value("[(e['event'], e.get('engine'), e.get('size')) for e in nbdist.last_run.events "
                          "if e['event'] in ('worker_died', 'recovered', 'worker_joined', 'grown')]")
    assert sorted(map(tuple, events), key=str) == sorted(
        [("worker_died", victim, None), ("recovered", victim, 2), ("worker_joined", newcomer, None),
         ("grown", None, 3)], key=str), events
    assert kernel.value("(lambda r: max(float(abs(a - b).max()) for e in (r.workers[1], r.workers[3]) for a, b in "
                        "zip(r.results[r.workers[0]][-1].weights, r.results[e][-1].weights)))(nbdist.last_run)") <= 1e-6


def test_an_engine_death_below_min_workers_fails_the_run_naming_it(kernel, cluster):
    victim, pid = new_engine(cluster)
    msg_id = kernel.submit(f"%%distribute --strategy hfdt --min-workers 2 --targets 0,{victim}\n"
                           + TRAIN.format(epochs=200))
    kernel.collect(msg_id, timeout=180, until_output="step")
    os.kill(pid, signal.SIGKILL)
    reply = kernel.collect(msg_id, timeout=90)
    assert reply.ename == "EngineDied" and f"engine {victim} (host " in reply.evalue, reply.error_text
    assert "--min-workers 2" in reply.evalue and "nbdist.last_run.weights" in reply.evalue
    # the survivor ended its fit at the last completed step and sent those weights back
    assert kernel.value("[w.shape for w in nbdist.last_run.weights] == [w.shape for w in build().get_weights()]")
    kernel.run("%%distribute --strategy hfdt --targets 0,1\n" + TRAIN.format(epochs=1), timeout=180).check()


STUCK_RANK_1 = '''
import os, threading
class StuckOnRank1(keras.callbacks.Callback):
    """Rank 1 hangs in the cell's own code at the third step of its second epoch; rank 0 waits in the
    allreduce. (The first epoch's end is a progress record the stall message can quote.)"""
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 2 and os.environ.get("HOROVOD_RANK") == "1":
            threading.Event().wait()  # hangs until the engine is interrupted or killed
model = build()
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=64, epochs=2, callbacks=[StuckOnRank1()])
'''


def test_a_stalled_step_names_the_rank_it_waits_for_and_the_cluster_serves_the_next_cell(kernel):
    reply = kernel.run(f"%%distribute --strategy hfdt --on-failure fail --stall-timeout {scaled(3):g} --targets 0,1\n"
                       + STUCK_RANK_1, timeout=180)
    assert reply.ename == "CollectiveStalled", reply.error_text
    assert "rank 1 (engine 1, host " in reply.evalue and "its last progress: epoch " in reply.evalue
    assert "rank 0" not in reply.evalue  # it was the one waiting
    kernel.run("%%distribute --strategy hfdt --targets 0,1\n" + TRAIN.format(epochs=1), timeout=180).check()


def test_an_elastic_run_treats_a_rank_that_stays_stalled_as_dead_and_the_others_finish(kernel, cluster):
    victim, pid = new_engine(cluster)
    stuck = STUCK_RANK_1.replace('== "1"', '== "2"')
    reply = kernel.run(f"%%distribute --strategy hfdt --stall-timeout {scaled(3):g} --targets 0,1,{victim}\n"
                       + stuck, timeout=240).check()
    events = kernel.value("nbdist.last_run.events")
    assert [(e["event"], e["engine"]) for e in events if e["event"] in ("stalled_rank_killed", "worker_died")] == [
        ("stalled_rank_killed", victim), ("worker_died", victim)], events
    assert [e["size"] for e in events if e["event"] == "recovered"] == [2]
    assert f"rank 2 (engine {victim}, host" in reply.stdout and "treated as dead" in reply.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert kernel.value("len(history.history['loss'])") == 2 and kernel.value(WEIGHTS_OF_RANKS) <= 1e-6


def test_an_interrupt_while_the_survivors_re_form_stops_every_engine(kernel, cluster):
    victim, pid = new_engine(cluster)
    msg_id = kernel.submit(f"%%distribute --strategy hfdt --targets 0,1,{victim}\n" + TRAIN.format(epochs=200))
    kernel.collect(msg_id, timeout=180, until_output="step")
    os.kill(pid, signal.SIGKILL)  # the survivors now leave the broken job and wait for the new one
    kernel.km.interrupt_kernel()
    reply = kernel.collect(msg_id, timeout=90)
    assert reply.ename == "RunInterrupted", reply.error_text
    kernel.run("%%distribute --strategy hfdt --targets 0,1\n" + TRAIN.format(epochs=1), timeout=180).check()
    assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6


def test_a_stop_sent_while_paused_ends_every_rank_at_the_same_step(kernel):
    cell = TRAIN.format(epochs=200).replace("validation_data=", "callbacks=[Gate()], validation_data=")
    with paused_in_first_two_epochs(kernel, "--strategy hfdt --targets 0,1", cell):
        kernel.run("nbdist.last_run.control('stop')").check()  # the ranks leave the pause and agree on the stop
        kernel.run("%dist wait", timeout=120).check()
    assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6
    assert 1 <= kernel.value("len(history.history['loss'])") <= 2  # paused in its first two epochs, then stopped
    # each rank's last record, returned with its result (published progress may arrive after the result)
    steps = kernel.value("[r.results[e][-1].records[-1]['step'] for r in [nbdist.last_run] for e in r.workers]")
    assert steps[0] == steps[1], steps


def test_balance_auto_sizes_batches_by_speed_and_the_slow_rank_no_longer_sets_the_pace(kernel):
    cell = TRAIN.format(epochs=2).replace("batch_size=64", "batch_size=32")
    times = {}
    for balance in ("none", "auto"):
        kernel.run(f'%%distribute --strategy hfdt --workers 2 --balance {balance} --simulate "speed=1,0.5; '
                   f'clock=virtual; step=1ms+50us/sample"\n' + cell, timeout=240).check()
        assert kernel.value(WEIGHTS_OF_RANKS) <= 1e-6
        records = kernel.value("[(r['worker'], r['samples'] // r['step'], r['step'], "
                               "round(r['t'] - nbdist.last_run.started_at, 6)) for r in nbdist.last_run.metrics]")
        times[balance] = max(t for *_, t in records)
        batches = sorted({(rank, batch) for rank, batch, _, _ in records})
        steps = {rank: max(s for r, _, s, _ in records if r == rank) for rank in (0, 1)}
        assert steps[0] == steps[1]  # the same steps on both ranks, or the allreduce would deadlock
    # (1 ms + 50 us b) / s equal with b0 + b1 = 64: b = 49.33, 14.67 -> 49, 15 (largest remainder)
    assert batches == [(0, 49), (1, 15)]
    # a step costs the slower rank's compute: max(3.45, 3.5) ms balanced, 31 steps of 64 an epoch (shares of
    # 1531 and 469 samples); 2 x 2.6 ms with equal batches, 32 steps (1000 samples a rank, the last batch partial)
    # two epochs, each of all those steps (an epoch of the few steps left over would end sooner)
    assert times["auto"] == pytest.approx(2 * 31 * 0.0035, rel=1e-6)
    assert times["none"] == pytest.approx(2 * 32 * 0.0052, rel=1e-6)
    assert kernel.value("len(history.history['loss'])") == 2


def test_balance_auto_at_equal_speeds_is_plain_hfdt(kernel):
    # equal speeds: balanced batches equal the cell's (weights 1), 1000 samples a rank make 25 whole batches of 40,
    # so nothing is dropped and both runs take the same steps on the same samples (static shards: --balance sizes
    # each rank's own shard)
    cell = TRAIN.format(epochs=2).replace("batch_size=64", "batch_size=40")
    weights = {}
    for balance in ("none", "auto"):
        kernel.run(f'%%distribute --strategy hfdt --workers 2 --balance {balance} --data static --seed 3 --simulate '
                   f'"speed=1,1; clock=virtual; step=1ms+50us/sample"\n' + cell, timeout=240).check()
        weights[balance] = kernel.value("[w.tolist() for w in model.get_weights()]")
    assert weights["auto"] == weights["none"]


LOOP = '''
optimizer = keras.optimizers.SGD(0.05)
loss_fn = keras.losses.SparseCategoricalCrossentropy()
import os as _os, signal as _signal
for step in range(200):
    if _os.getpid() == {pid} and step == 10:
        _os.kill(_os.getpid(), _signal.SIGKILL)
    with tf.GradientTape() as tape:
        loss_value = loss_fn(y[:32], model(x[:32], training=True))
    optimizer.apply(tape.gradient(loss_value, model.trainable_weights), model.trainable_weights)
'''


def test_an_engine_that_dies_in_a_loop_of_the_cells_own_fails_the_run_naming_it(kernel, cluster):
    """A loop has no epoch to resume from: an elastic hfdt (the default) does not re-form the job for it, the run
    fails within seconds, naming the dead engine, and the survivor is free for the next cell."""
    victim, pid = new_engine(cluster)
    kernel.run("import tensorflow as tf\nmodel = build()").check()
    reply = kernel.run(f"%%distribute --strategy hfdt --targets 0,{victim}\n" + LOOP.format(pid=pid), timeout=240)
    assert reply.ename == "EngineDied", reply.error_text
    assert f"engine {victim} (host " in reply.evalue and f"pid {pid}" in reply.evalue
    assert not kernel.value("[e['event'] for e in nbdist.last_run.events if e['event'] == 'recovered']")
    kernel.run("%%distribute --strategy hfdt --targets 0,1\n" + TRAIN.format(epochs=1), timeout=180).check()
