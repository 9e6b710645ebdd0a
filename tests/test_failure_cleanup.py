"""A failed run of any strategy family leaves its engines idle within seconds, and the next run works."""

from __future__ import annotations

import os

import pytest

from tests.support import eventually, idle_engines

pytestmark = pytest.mark.cluster

CELL = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=32, epochs=20, callbacks=[keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: fail() if os.getpid() == {pid} and batch == 3 else None)])
'''
DEFINE = '''
import os
def fail():
    raise RuntimeError("injected failure")
'''
IDLE = "sorted(nbdist.get_session().cluster.busy())"


@pytest.fixture(scope="module")
def kernel(kernel, cluster):
    idle_engines(cluster, 2)
    kernel.run("%%distribute define --name failure\n" + DEFINE, timeout=120).check()
    return kernel


@pytest.mark.parametrize("strategy, failing_rank", [("local", 0), ("hfdt", 1), ("nfdt", 1)])
def test_a_worker_that_fails_frees_every_engine_of_the_run(kernel, cluster, strategy, failing_rank):
    _, client = cluster
    engines = idle_engines(cluster, 2)[: 1 if strategy == "local" else 2]
    pid = client[engines[failing_rank]].apply_sync(os.getpid)
    reply = kernel.run(f"%%distribute --strategy {strategy} --targets {','.join(map(str, engines))}\n"
                       + CELL.format(pid=pid), timeout=180)
    assert reply.ename == "EngineFailure" and "injected failure" in reply.evalue, reply.error_text
    assert f"engine {engines[failing_rank]} " in reply.evalue
    eventually(kernel, f"{IDLE} == []", timeout=30)
    kernel.run(f"%%distribute --strategy {strategy} --targets {','.join(map(str, engines))}\n"
               + CELL.format(pid=-1).replace("epochs=20", "epochs=1"), timeout=180).check()


def test_a_failure_in_the_kernels_half_of_a_run_frees_the_engines(kernel, cluster):
    idle_engines(cluster, 2)
    kernel.run("import nbdist.strategies.ashl.coordinator as _c\n_update = _c.Coordinator.update\n"
               "def _broken(self, *args):\n    raise ZeroDivisionError('injected in the coordinator')\n"
               "_c.Coordinator.update = _broken").check()
    try:
        reply = kernel.run("%%distribute --strategy ashl --workers 2\n" + CELL.format(pid=-1), timeout=180)
        assert reply.ename == "ZeroDivisionError" and "injected" in reply.evalue, reply.error_text
        assert kernel.value("nbdist.last_run.status") == "failed"
        eventually(kernel, f"{IDLE} == []", timeout=30)
    finally:
        kernel.run("_c.Coordinator.update = _update").check()
    kernel.run("%%distribute --strategy nfdt --workers 2\n" + CELL.format(pid=-1).replace("epochs=20", "epochs=1"),
               timeout=180).check()
