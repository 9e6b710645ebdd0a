"""ASHL on real engines and a real parameter server: profiling, allocation, the phase switch."""

from __future__ import annotations

import pytest

from nbdist.experiments import MODELS
from tests.support import eventually, idle_engines

pytestmark = pytest.mark.cluster

SPEEDS = (1, 1, 0.5, 0.25)
B0 = 64
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


@pytest.fixture(scope="module")
def ashl_run(heavier, cluster):
    """One 4-worker ASHL run under simulated speeds 1, 1, 0.5, 0.25; its events and push log."""
    kernel = heavier
    idle_engines(cluster, 4)
    speeds = ",".join(map(str, SPEEDS))
    reply = kernel.run(f'%%distribute --strategy ashl --workers 4 --seed 3 --simulate "speed={speeds}"\n'
                       + CELL.format(epochs=10), timeout=400)  # SHL gets the last 3-4 epochs
    reply.check()
    return {"stdout": reply.stdout,
            "events": kernel.value("nbdist.last_run.events"),
            "history": kernel.value("nbdist.last_run.history"),
            "pushes": kernel.value("[(r['worker'], r['staleness'], r['t']) for r in nbdist.last_run.push_records]")}


def test_profiled_speeds_follow_the_simulated_ones_and_batches_follow_them(ashl_run):
    allocated = [e for e in ashl_run["events"] if e["event"] == "allocated"]
    assert len(allocated) == 1
    rows = allocated[0]["profile"]
    # speed = samples per second at the larger profiling batch, relative to the fastest worker
    per_sample = [r["per_sample_s"] + r["fixed_s"] / (2 * B0) for r in rows]
    measured = [min(per_sample) / t for t in per_sample]
    expected = [s / max(SPEEDS) for s in SPEEDS]
    assert all(abs(m - e) <= 0.2 * e for m, e in zip(measured, expected)), (measured, expected)
    batches = allocated[0]["batches"]
    assert sum(batches) == 4 * B0
    assert batches[0] > batches[2] > batches[3] and abs(batches[0] - batches[1]) <= 0.25 * batches[0], batches
    assert "profile" in ashl_run["stdout"] and "batch" in ashl_run["stdout"]  # the table is shown


def test_ahl_then_shl_with_the_reason_and_the_model_learns(ashl_run):
    switches = [e for e in ashl_run["events"] if e["event"] == "switch_phase"]
    assert len(switches) == 1 and switches[0]["reason"]
    assert any(s > 0 for _, s, _ in ashl_run["pushes"])  # AHL: asynchronous, stale pushes
    after = [s for _, s, t in ashl_run["pushes"] if t > switches[0]["t"]]  # acknowledged by then
    assert after and set(after) == {0}  # SHL: synchronous rounds
    losses = ashl_run["history"]["loss"]
    assert losses[-1] < losses[0] and ashl_run["history"]["val_accuracy"][-1] > 0.5, ashl_run["history"]


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
