"""ASHL on real engines and a real parameter server: profiling, allocation, the phase switch."""

from __future__ import annotations

import re

import numpy as np
import pytest

from nbdist.strategies.ashl.switch import SETTLED
from nbdist.experiments import MODELS
from tests.support import dealt_by_epoch, eventually, idle_engines, push_log

pytestmark = pytest.mark.cluster

SPEEDS = (1, 1, 0.5, 0.25)
# enough compute per step (~10 ms at b0 on one core) that profiling measures the model, not timer noise:
# the experiments' CNN, under its own name beside the suite's smaller `build`
HEAVIER = MODELS["cnn"].replace("def build():", "def build_heavier():")
CELL = '''
model = build_heavier()
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
history = model.fit(x, y, batch_size=64, epochs={epochs}, validation_data=(xt[:500], yt[:500]))
'''


@pytest.fixture(scope="module")
def heavier(kernel):
    kernel.run("%%distribute define --name heavier\n" + HEAVIER, timeout=120).check()
    return kernel


VIRTUAL = "clock=virtual; step=1ms+50us/sample"


def ashl_on_the_virtual_clock(kernel, epochs=10) -> dict:
    """One 4-worker ASHL run under speeds 1, 1, 0.5, 0.25 on the virtual clock; its events and push log."""
    speeds = ",".join(map(str, SPEEDS))
    reply = kernel.run(f'%%distribute --strategy ashl --workers 4 --seed 3 --simulate "speed={speeds}; {VIRTUAL}"\n'
                       + CELL.format(epochs=epochs), timeout=400)
    reply.check()
    return {"stdout": reply.stdout,
            "table": kernel.value("__import__('nbdist.strategies.ashl.report', fromlist=['_']).profile_table(nbdist.last_run)"),
            "events": kernel.value("[{k: v for k, v in e.items() if k != 't'} for e in nbdist.last_run.events]"),
            "history": kernel.value("nbdist.last_run.history"),
            "pushes": kernel.value("[(r['worker'], r['step'], r['version'], r['staleness'], "
                                   "round(r['t'] - nbdist.last_run.started_at, 6)) for r in nbdist.last_run.push_records]"),
            "log": push_log(kernel)}


@pytest.fixture(scope="module")
def ashl_run(heavier, cluster):
    idle_engines(cluster, 4)
    return ashl_on_the_virtual_clock(heavier)


def test_the_virtual_profile_is_the_simulated_speeds_and_batches_equalise_step_time(ashl_run):
    allocated = [e for e in ashl_run["events"] if e["event"] == "allocated"]
    assert len(allocated) == 1
    rows = allocated[0]["profile"]
    # the step cost 1 ms + 50 us per sample, over each speed, exactly
    assert [v for r in rows for v in (r["fixed_s"], r["per_sample_s"])] == pytest.approx(
        [v for s in SPEEDS for v in (1e-3 / s, 50e-6 / s)], rel=1e-9)
    # 1/s (1 ms + 50 us b) = T with sum b = 256: T = 16.8 ms / 2.75, b = (T s - 1 ms) / 50 us
    # = 102.18, 102.18, 41.09, 10.55 -> largest remainder 102, 102, 41, 11
    assert allocated[0]["batches"] == [102, 102, 41, 11]
    # the table shown under the cell is the run's profile, one row per worker with its allocated batch
    assert ashl_run["table"] in ashl_run["stdout"]
    rows = [re.split(r"\s{2,}", line) for line in ashl_run["table"].splitlines()[3:]]  # under title, head, rule
    assert [(row[0], row[6]) for row in rows] == [("0", "102"), ("1", "102"), ("2", "41"), ("3", "11")], rows


def test_ahl_then_shl_at_an_epoch_end_and_the_model_learns(ashl_run):
    switches = [e for e in ashl_run["events"] if e["event"] == "switch_phase"]
    # the allocation holds from the start on the virtual clock: the first check past 20% of 10 epochs
    assert len(switches) == 1 and switches[0]["reason"] == SETTLED and switches[0]["epoch"] == 2
    log = ashl_run["log"]  # each push names the batches it trained: [epoch, start, count, ...]
    before = [e["staleness"] for e in log if e["batch"][0] < switches[0]["epoch"]]
    after = [e["staleness"] for e in log if e["batch"][0] >= switches[0]["epoch"]]
    assert any(s > 0 for s in before)  # AHL: asynchronous, stale pushes
    assert after and set(after) == {0}  # SHL: synchronous rounds from the next epoch's first push
    losses = ashl_run["history"]["loss"]
    assert losses[-1] < losses[0] and ashl_run["history"]["val_accuracy"][-1] > 0.5, ashl_run["history"]


def test_shard_0_deals_each_worker_batches_of_its_allocated_size_and_every_epoch_trains_each_sample_once(ashl_run):
    batches = [e for e in ashl_run["events"] if e["event"] == "allocated"][0]["batches"]
    by_epoch = dealt_by_epoch(ashl_run["log"])
    assert sorted(by_epoch) == list(range(10))
    for epoch, dealt in by_epoch.items():
        counts = np.zeros(2000, int)
        for _, start, count in dealt:
            counts[start:start + count] += 1
        assert counts.min() == counts.max() == 1, epoch
        sizes = {w: {c for v, _, c in dealt if v == w} for w in range(4)}
        # its allocated size; the epoch's last batch may be short
        assert all(max(sizes[w]) == batches[w] and len(sizes[w] - {batches[w]}) <= 1 for w in range(4)), sizes


def test_the_same_ashl_run_on_the_virtual_clock_decides_and_pushes_the_same(heavier, cluster, ashl_run):
    idle_engines(cluster, 4)
    again = ashl_on_the_virtual_clock(heavier)
    assert again["pushes"] == ashl_run["pushes"]
    assert again["history"]["loss"] == pytest.approx(ashl_run["history"]["loss"], abs=1e-6)
    assert [e for e in again["events"] if e["event"] in ("allocated", "switch_phase")] == \
        [e for e in ashl_run["events"] if e["event"] in ("allocated", "switch_phase")]


def test_a_tf_data_pipeline_batched_last_trains_under_ashl(heavier, cluster):
    idle_engines(cluster, 2)
    cell = CELL.format(epochs=2).replace(
        "model.fit(x, y, batch_size=64,",
        "model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(2),").replace(
        "model = build_heavier()", "import tensorflow as tf\nmodel = build_heavier()")
    kernel = heavier
    kernel.run(f'%%distribute --strategy ashl --workers 2 --seed 1 --simulate "speed=1,0.5; {VIRTUAL}"\n' + cell,
               timeout=300).check()
    batches = kernel.value("nbdist.last_run.events_of('allocated')[0]['batches']")
    # 1/s (1 ms + 50 us b) = T, b0 + b1 = 128: T = (128 x 50 us + 2 x 1 ms) / 1.5 = 5.6 ms,
    # b = (T s - 1 ms) / 50 us = 92, 36
    assert batches == [92, 36]
    pushes = kernel.value("[r['worker'] for r in nbdist.last_run.push_records]")
    assert [pushes.count(w) for w in (0, 1)] == [2 * (2000 // 128)] * 2  # every worker: one share per global batch
    losses = kernel.value("history.history['loss']")
    assert losses[1] < losses[0]


def test_local_steps_keep_any_optimizer_and_push_one_update_per_step_on_free_links(heavier, cluster):
    idle_engines(cluster, 2)
    cell = CELL.format(epochs=2).replace("keras.optimizers.SGD(0.05, momentum=0.9)", "keras.optimizers.Adam(1e-3)")
    refused = heavier.run(f'%%distribute --strategy ashl --commits gradients --workers 2 --seed 1 '
                          f'--simulate "speed=1,0.5; {VIRTUAL}"\n' + cell, timeout=300)
    assert refused.ename == "OptionError" and "leave out --commits gradients" in refused.evalue
    heavier.run(f'%%distribute --strategy ashl --workers 2 --seed 1 --simulate "speed=1,0.5; {VIRTUAL}"\n' + cell,
                timeout=300).check()
    assert heavier.value("nbdist.last_run.events_of('allocated')[0]['batches']") == [92, 36]  # as computed above
    pushes = [(e["worker"], e["batch"]) for e in push_log(heavier)]
    assert all(len(batch) == 3 for _, batch in pushes)  # free links: a commit every step, one batch each
    assert sum(batch[2] for _, batch in pushes) == 2 * 2000  # every sample once an epoch
    assert heavier.value("type(model.optimizer).__name__") == "Adam"
    assert heavier.value("int(model.optimizer.iterations)") == sum(w == 0 for w, _ in pushes)  # rank 0's Adam steps
    losses = heavier.value("history.history['loss']")
    assert losses[1] < losses[0]


def test_the_dashboard_switches_phase_by_hand(heavier, cluster):
    kernel = heavier
    idle_engines(cluster, 2)
    kernel.run("%%distribute --strategy ashl --workers 2 --background --progress dashboard\n" + CELL.format(epochs=200),
               timeout=120).check()
    kernel.run("run = nbdist.last_run; d = run.display").check()
    assert kernel.value("d.switch_button.disabled") is False
    eventually(kernel, "run.events_of('allocated')")
    kernel.run("d.switch_button.click()").check()
    assert "synchronous True" in kernel.value("d.ack.value")
    eventually(kernel, "'switched to SHL' in d.decisions.value")
    kernel.run("d.stop_button.click()").check()
    kernel.run("%dist wait", timeout=120).check()
    result = kernel.value("{'events': [(e['event'], e.get('reason')) for e in run.events], 'status': run.status, "
                          "'epochs': len(history.history['loss'])}")
    assert ["switch_phase", "asked for by hand (dashboard or Run.control)"] in result["events"]
    assert result["status"] == "done" and result["epochs"] < 200
