"""The virtual clock on real engines and a real parameter server: pushes applied in virtual-time order,
the same log and weights every run, and the start barrier on the real clock."""

from __future__ import annotations

import pytest

from tests.support import VIRTUAL_MLP, eventually, idle_engines, push_log, wait_for

pytestmark = pytest.mark.cluster

CELL = '''
model = vmlp()
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
history = model.fit(vx, vy, batch_size=32, epochs={epochs}, steps_per_epoch={steps}, shuffle=True)
'''


@pytest.fixture(scope="module")
def kernel(kernel, cluster):
    idle_engines(cluster, 3)
    kernel.run("%%distribute define --name virtual\n" + VIRTUAL_MLP, timeout=120).check()
    return kernel


def test_pushes_are_applied_in_virtual_time_order_as_computed_by_hand(kernel):
    kernel.run('%%distribute --strategy nfdt --workers 3 --simulate "speed=1,0.5,0.25; clock=virtual; step=10ms"\n'
               + CELL.format(epochs=1, steps=4), timeout=240).check()
    log = [(e["worker"], round(e["t"] * 1000), e["staleness"]) for e in push_log(kernel)]
    # steps cost 10, 20 and 40 ms; every push arrives at a multiple of its worker's step, ties go by rank:
    # (worker, arrival ms, staleness = versions applied since the weights it computed on)
    assert log == [(0, 10, 0), (0, 20, 0), (1, 20, 2), (0, 30, 1), (0, 40, 0), (1, 40, 2), (2, 40, 6), (1, 60, 1),
                   (1, 80, 0), (2, 80, 2), (2, 120, 0), (2, 160, 0)]
    # what the workers' records and the History report is virtual time: 4 steps of 40 ms for the slowest
    assert kernel.value("round(max(r['t'] for r in nbdist.last_run.metrics) - nbdist.last_run.started_at, 6)") \
        == pytest.approx(0.16)


def test_the_same_cell_seed_and_spec_give_the_same_log_and_weights(kernel, cluster):
    line = '%%distribute --strategy ddc-asgd --workers 3 --seed 5 --simulate "speed=1,0.6,0.3; clock=virtual; step=7ms"\n'
    runs = []
    for _ in range(2):
        kernel.run(line + CELL.format(epochs=2, steps=6), timeout=240).check()
        log = [(e["worker"], e["step"], e["version"], e["staleness"]) for e in push_log(kernel)]
        runs.append((log, kernel.value("[w.ravel().tolist() for w in model.get_weights()]")))
    (log_a, weights_a), (log_b, weights_b) = runs
    assert log_a == log_b and len(log_a) == 3 * 2 * 6
    assert max(abs(a - b) for wa, wb in zip(weights_a, weights_b) for a, b in zip(wa, wb)) <= 1e-6
    # deterministic ops were the run's: an engine computes later runs as an engine that never ran one
    _, client = cluster
    workers = kernel.value("nbdist.last_run.workers")
    assert client[workers].apply_sync(_determinism_enabled) == [False] * 3


def _determinism_enabled() -> bool:
    from tensorflow.python.framework import config

    return config.is_op_determinism_enabled()


def test_the_start_barrier_holds_first_pushes_until_every_worker_has_stepped(kernel, cluster, tmp_path):
    import os

    _, client = cluster
    punctual, slow = idle_engines(cluster, 2)
    late = client[slow].apply_sync(os.getpid)
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    # the late worker begins training only once the test opens the gate (opening a FIFO to read blocks until
    # a writer comes), and the test opens it only once the punctual worker's first push is held at the shard
    delayed = CELL.format(epochs=1, steps=8).replace(
        "shuffle=True)", f"shuffle=True, callbacks=[keras.callbacks.LambdaCallback(on_train_begin=lambda logs: "
                         f"open({str(gate)!r}).close() if os.getpid() == {late} else None)])")

    def open_gate() -> bool:
        try:
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
            return True
        except OSError:  # ENXIO: nobody waits at the gate yet
            return False

    try:
        kernel.run(f"%%distribute --strategy nfdt --background --targets {punctual},{slow}\n" + delayed,
                   timeout=240).check()  # real clock
        # (no ack while the run still starts its shard)
        eventually(kernel, "(nbdist.last_run.control('resume') or [{}])[0].get('held', 0) >= 1", timeout=120)
        wait_for(open_gate, "the late worker to wait at its gate", timeout=120)
    finally:
        open_gate()  # a run that failed before the gate must not leave its engine waiting there
    kernel.run("%dist wait", timeout=240).check()
    log = push_log(kernel)
    first = {w: next(e for e in log if e["worker"] == w) for w in (0, 1)}
    # without the barrier the punctual worker's first push would have been applied while the late worker had
    # not begun (the shard would hold nothing); held, both first pushes are at most N - 1 stale
    assert all(e["staleness"] <= 1 for e in first.values()), first
    assert sorted(log.index(e) for e in first.values()) == [0, 1]


def test_speed_shards_give_each_worker_data_in_proportion_to_its_speed(kernel):
    kernel.run('%%distribute --strategy nfdt --workers 2 --shards speed --simulate "speed=1,0.5; clock=virtual; '
               'step=10ms"\nmodel = vmlp()\nmodel.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")\n'
               'history = model.fit(vx[:192], vy[:192], batch_size=32, epochs=1)', timeout=240).check()
    log = push_log(kernel)
    # 192 samples shared 2:1 are 4 and 2 batches of 32; at 10 and 20 ms a step both end at 40 ms
    assert [sum(e["worker"] == w for e in log) for w in (0, 1)] == [4, 2]
    assert [round(max(e["t"] for e in log if e["worker"] == w) * 1000) for w in (0, 1)] == [40, 40]


def test_speed_shards_without_differing_speeds_say_what_to_add(kernel):
    reply = kernel.run("%%distribute --strategy nfdt --workers 2 --shards speed\nmodel = vmlp()", timeout=60)
    assert "--shards speed splits the data by the --simulate speeds" in reply.error_text
