"""Batches on demand through a real cluster (issue 34, DESIGN.md section 11): on the virtual clock the fast worker
takes four batches to the slow one's one and every sample is trained once an epoch, the same every run; a worker
killed mid-epoch leaves its batch to the others (under nfdt, and under ASHL, whose batches are its allocation); a
newcomer's batches overlap no one's; hfdt after a death splits the rest of the epoch over the survivors. Counted from the shards' push records and the ranks' own logs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import (VIRTUAL_MLP, dealt_by_epoch, dies_at, idle_engines, join_mid_run, own_cluster,
                           push_log)

pytestmark = pytest.mark.cluster

cluster = own_cluster(engines=3)  # its tests kill workers and start engines

CELL = '''{extra}
model = vmlp()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
history = model.fit(vx, vy, batch_size=32, epochs={epochs}, shuffle=True{callbacks})
'''
SAMPLES = 1536


@pytest.fixture(scope="module")
def kernel(kernel):
    kernel.run("%%distribute define --name dynamic\n" + VIRTUAL_MLP, timeout=120).check()
    return kernel


def coverage(ranges, n=SAMPLES) -> np.ndarray:
    """How often each position 0..n-1 is covered by the (start, count) ranges."""
    counts = np.zeros(n, int)
    for start, count in ranges:
        counts[start:start + count] += 1
    return counts


def test_on_the_virtual_clock_the_fast_worker_takes_four_batches_to_one_and_each_sample_trains_once(kernel, cluster):
    idle_engines(cluster, 2)
    line = '%%distribute --strategy nfdt --workers 2 --seed 4 --simulate "speed=1,0.25; clock=virtual; step=10ms"\n'
    runs = []
    for _ in range(2):
        kernel.run(line + CELL.format(extra="", epochs=2, callbacks=""), timeout=240).check()
        runs.append((push_log(kernel), kernel.value("[w.ravel().tolist() for w in model.get_weights()]")))
    (log, weights), (again, weights_again) = runs
    for epoch, batches in dealt_by_epoch(log).items():
        assert list(coverage([(s, c) for _, s, c in batches])) == [1] * SAMPLES, epoch
        # 48 batches of 32. Steps cost 10 ms and 40 ms: each 40 ms the fast worker pushes 4 times, the slow one
        # once (after it: ties go by rank), each answer dealing the next batch; both got one as the epoch opened.
        # Nine such rounds deal batches 2..46, the fast worker's next push the last: 38 against 10.
        per_worker = [sum(1 for w, _, _ in batches if w == k) for k in (0, 1)]
        assert per_worker == [38, 10], (epoch, per_worker)
    # the same seed and spec: the same hand-outs, push order and weights
    assert [(e["worker"], e["version"], e["batch"]) for e in log] == [(e["worker"], e["version"], e["batch"])
                                                                      for e in again]
    assert max(abs(a - b) for wa, wb in zip(weights, weights_again) for a, b in zip(wa, wb)) <= 1e-6


KILLS_ITSELF = '''
import os as _os, signal as _signal
class KillsItself(keras.callbacks.Callback):
    """Engine process {pid} kills itself as its {batch}th batch of epoch 1 begins: it holds that batch, dealt."""
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.batches = epoch, 0
    def on_train_batch_begin(self, batch, logs=None):
        self.batches += 1
        if _os.getpid() == {pid} and self.epoch == 1 and self.batches == {batch}:
            _os.kill(_os.getpid(), _signal.SIGKILL)
'''


def run_losing_the_last_engine(kernel, cluster, options: str, batch: int) -> list[dict]:
    """A 3-epoch run on 3 engines with `options`, the last engine killing itself as its `batch`th batch of epoch 1
    begins; the run's events."""
    engines = idle_engines(cluster, 3)
    _, client = cluster
    pid = client[engines[-1]].apply_sync(_pid)
    cell = CELL.format(extra=KILLS_ITSELF.format(pid=pid, batch=batch), epochs=3,
                       callbacks=", callbacks=[KillsItself()]")
    reply = kernel.run(f"%%distribute {options} --targets {','.join(map(str, engines))}\n" + cell, timeout=300)
    assert reply.status == "ok", reply.error_text
    return kernel.value("nbdist.last_run.events")


def test_a_worker_killed_mid_epoch_leaves_its_batch_to_the_others_and_every_epoch_covers_each_sample_once(kernel,
                                                                                                       cluster):
    # on the virtual clock at equal speeds the batches go round robin and no worker runs ahead of another in
    # virtual time: as its 5th batch of epoch 1 begins, the victim holds that batch (16 of 48 dealt)
    events = run_losing_the_last_engine(kernel, cluster, "--strategy nfdt --seed 1 --simulate 'clock=virtual; "
                                                         "step=10ms'", batch=5)
    dropped = [e for e in events if e["event"] == "worker_dropped"]
    assert len(dropped) == 1, events
    dropped = dropped[0]
    assert dropped["worker"] == 2 and dropped["requeued"] == 32  # the batch it held went back to the queue
    by_epoch = dealt_by_epoch(push_log(kernel))
    assert sorted(by_epoch) == [0, 1, 2]
    for epoch, batches in by_epoch.items():  # every sample once an epoch: the dead worker's batch trained by another
        assert list(coverage([(s, c) for _, s, c in batches])) == [1] * SAMPLES, epoch
    assert {w for w, _, _ in by_epoch[1]} == {0, 1, 2} and {w for w, _, _ in by_epoch[2]} == {0, 1}
    assert sum(1 for w, _, _ in by_epoch[1] if w == 2) == 4  # it trained 4 batches of epoch 1, then died


def test_ashl_deals_the_allocation_and_a_killed_workers_batches_are_trained_by_the_others(kernel, cluster):
    events = run_losing_the_last_engine(kernel, cluster, "--strategy ashl --seed 1 --simulate 'speed=1,1,0.5; "
                                                         "clock=virtual; step=10ms'", batch=3)
    batches = [e for e in events if e["event"] == "allocated"][0]["batches"]
    dropped = [e for e in events if e["event"] == "worker_dropped"]
    assert len(dropped) == 1 and dropped[0]["worker"] == 2 and dropped[0]["requeued"] > 0, dropped
    by_epoch = dealt_by_epoch(push_log(kernel))
    assert sorted(by_epoch) == [0, 1, 2]
    for epoch, dealt in by_epoch.items():  # every sample once an epoch: what the dead worker held trained by another
        assert list(coverage([(s, c) for _, s, c in dealt])) == [1] * SAMPLES, epoch
        # its allocated size (the epoch's last batch, and the pieces of the dead worker's, may be smaller)
        assert all(c <= batches[w] for w, _, c in dealt), (epoch, batches)
        assert epoch == 1 or all(c == batches[w] for w, _, c in dealt[:-1]), (epoch, batches)
    assert {w for w, _, _ in by_epoch[1]} == {0, 1, 2} and {w for w, _, _ in by_epoch[2]} == {0, 1}
    # the allocation equalises the steps (free links: a commit a step), so batches go round robin, 96 samples a
    # round: the victim dies as its third of epoch 1 begins, holding [2 x 96 + 77, + 19), which worker 0 trains
    assert batches == [39, 38, 19] and dropped[0]["requeued"] == 19 and (0, 269, 19) in by_epoch[1]
    assert kernel.value("history.history['loss'][-1] < history.history['loss'][0]")


def test_an_engine_that_joins_mid_run_takes_batches_from_the_queue_that_overlap_no_ones(kernel, cluster):
    engines = idle_engines(cluster, 2)
    cell = CELL.format(extra="", epochs=4, callbacks=", callbacks=[Gate()]")
    joined, _, _ = join_mid_run(kernel, cluster, f"--strategy nfdt --seed 2 --targets {','.join(map(str, engines))}",
                                cell)
    by_epoch = dealt_by_epoch(push_log(kernel))
    for epoch, batches in by_epoch.items():
        assert list(coverage([(s, c) for _, s, c in batches])) == [1] * SAMPLES, epoch
    first = joined["first_epoch"]
    trained_in = sorted({e for e, batches in by_epoch.items() if any(w == 2 for w, _, _ in batches)})
    # it draws from the epoch open when it joined (or, when that was spent before its engine was ready, the next)
    # and from every epoch after
    assert trained_in[0] in (first, first + 1) and trained_in == list(range(trained_in[0], 4)), (first, trained_in)


def test_an_engine_that_joins_an_ashl_run_is_profiled_allocated_and_dealt_batches_of_its_size(kernel, cluster):
    engines = idle_engines(cluster, 2)
    cell = CELL.format(extra="", epochs=4, callbacks=", callbacks=[Gate()]")
    # without the switch: a link a loaded host measures slow would leave at it (left_shl), which is not tested here
    joined, _, _ = join_mid_run(kernel, cluster, f"--strategy ashl --without switch --seed 2 "
                                                 f"--targets {','.join(map(str, engines))}", cell)
    events = kernel.value("[e for e in nbdist.last_run.events if e['event'] in ('allocated', 'reallocated')]")
    assert len(events[0]["batches"]) == 2
    admitted = [e for e in events if "worker 2 joined" in e["reason"]]
    assert len(admitted) == 1 and len(admitted[0]["batches"]) == 3, events
    sizes = {e["batches"][2] for e in events[events.index(admitted[0]):]}  # its allocations (drift may change it)
    by_epoch = dealt_by_epoch(push_log(kernel))
    for epoch, dealt in by_epoch.items():  # each sample once an epoch, before and after it joined
        assert list(coverage([(s, c) for _, s, c in dealt])) == [1] * SAMPLES, epoch
    mine = [(epoch, c) for epoch, dealt in by_epoch.items() for w, _, c in dealt if w == 2]
    assert mine and sorted({e for e, _ in mine}) == list(range(min(e for e, _ in mine), 4))
    assert all(c <= max(sizes) for _, c in mine) and any(c in sizes for _, c in mine), (sizes, mine)
    assert kernel.value("'ASHL profile' in nbdist.strategies.ashl.report.profile_table(nbdist.last_run) and "
                        "len(nbdist.strategies.ashl.report.profile_table(nbdist.last_run).splitlines()) == 3 + 3")


def test_hfdt_after_a_death_splits_the_rest_of_the_epoch_over_the_survivors_each_sample_once(kernel, cluster):
    engines = idle_engines(cluster, 3)
    _, client = cluster
    victim = engines[-1]
    pid = client[victim].apply_sync(_pid)
    # 1536 samples, 3 ranks of 32: 16 steps an epoch. Rank 2 dies as step 20 begins (epoch 1, its 5th step)
    cell = CELL.format(extra=dies_at(pid, 20), epochs=3, callbacks=", callbacks=[DiesAt()]")
    reply = kernel.run(f"%%distribute --strategy hfdt --seed 3 --targets {','.join(map(str, engines))}\n" + cell,
                       timeout=300)
    assert reply.status == "ok", reply.error_text
    assert [e["size"] for e in kernel.value("nbdist.last_run.events") if e["event"] == "recovered"] == [2]
    steps = kernel.value(f"nbdist.last_run.results[{engines[0]}][0].timings['batches']")
    for epoch in ("0", "1", "2"):  # each sample once an epoch, the last few left only when fewer than the ranks
        counts = coverage(steps[epoch])
        assert counts.max() == 1 and (counts == 0).sum() < 3, (epoch, int((counts == 0).sum()))
    assert [c for _, c in steps["1"][:4]] == [96] * 4 and {c for _, c in steps["1"][4:-1]} == {64}, steps["1"]
    assert kernel.value("history.history['loss'][-1] < history.history['loss'][0]")


def _pid() -> int:
    import os

    return os.getpid()
