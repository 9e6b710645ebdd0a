"""Engines that differ from the notebook (nbdist.cluster.compat): the rule on hand-built rows, then `%dist status`
on the shared real cluster with one engine's reported nbdist version changed."""

from __future__ import annotations

import pytest

from nbdist.cluster.cluster import EngineInfo
from nbdist.cluster.compat import problems
from tests.kernel_driver import KernelDriver

pytestmark = pytest.mark.cluster  # a kernel on the shared cluster

NOTEBOOK = {"nbdist": "0.1.0", "tensorflow": "2.21.0", "keras": "3.15.1", "horovod": "0.28.1", "python": "/nb/python"}
GLOO_ONLY = {"version": "0.28.1", "gloo": True, "mpi": False, "nccl": 0, "cuda": False, "rocm": False}


def engine(eid, host="cpu1", **kw):
    base = dict(tensorflow="2.21.0", keras="3.15.1", horovod="0.28.1", nbdist="0.1.0", python=f"/{host}/bin/python",
                horovod_built=GLOO_ONLY)
    return EngineInfo(eid, host, **{**base, **kw})


def test_engines_like_the_notebook_raise_nothing():
    assert problems(NOTEBOOK, [engine(0), engine(1), EngineInfo(2, "? (TimeoutError)")]) == []


def test_version_differences_name_the_host_and_the_command_to_run_there():
    found = problems(NOTEBOOK, [engine(0), engine(1, nbdist="0.0.9"), engine(2, nbdist="0.0.9"),
                                engine(3, "cpu2", tensorflow="2.20.0", keras="3.10.0")])
    texts = [p.text() for p in found]
    assert texts == [
        "nbdist: warning: engines 1, 2 on cpu1: nbdist 0.0.9 (the notebook has 0.1.0). "
        "On cpu1 run: /cpu1/bin/python -m pip install nbdist==0.1.0",
        "nbdist: warning: engine 3 on cpu2: TensorFlow 2.20.0 (the notebook has 2.21.0). On cpu2 run: "
        "/cpu2/bin/python -m pip install tensorflow-cpu==2.21.0, then /cpu2/bin/python -m nbdist.horovod install",
        "nbdist: warning: engine 3 on cpu2: Keras 3.10.0 (the notebook has 3.15.1). "
        "On cpu2 run: /cpu2/bin/python -m pip install keras==3.15.1"]
    assert len({p.key for p in found}) == 3


def test_gpu_engine_whose_horovod_lacks_nccl_is_told_to_rebuild_it():
    gpu = engine(0, "gpu1", gpus=["/physical_device:GPU:0"], gpu="0", tensorflow="2.20.0")
    found = problems(NOTEBOOK, [gpu])
    assert [p.what for p in found] == [
        "TensorFlow 2.20.0 (the notebook has 2.21.0)",
        "GPUs, but a Horovod built without NCCL: hfdt would reduce GPU gradients through the CPU"]
    assert found[0].command.startswith("/gpu1/bin/python -m pip install 'tensorflow[and-cuda]==2.21.0'")
    assert found[1].command.startswith("/gpu1/bin/python -m nbdist.horovod install")
    nccl = {**GLOO_ONLY, "nccl": 21802, "cuda": True}
    assert problems(NOTEBOOK, [engine(0, "gpu1", gpus=["/physical_device:GPU:0"], horovod_built=nccl)]) == []


def test_missing_or_broken_horovod_matters_only_when_the_notebook_has_horovod():
    broken = {"version": "0.28.1", "error": "ImportError: undefined symbol: _ZN10tensorflow"}
    rows = [engine(0, horovod=None, horovod_built=None), engine(1, horovod_built=broken)]
    found = problems(NOTEBOOK, rows)
    assert [p.what.split(",")[0] for p in found] == ["no Horovod", "a Horovod that does not load (ImportError: "
                                                     "undefined symbol: _ZN10tensorflow)"]
    assert [p.command for p in found] == ["/cpu1/bin/python -m nbdist.horovod install",
                                          "/cpu1/bin/python -m nbdist.horovod install --force"]
    assert problems({**NOTEBOOK, "horovod": None}, rows) == []


PATCH = ("import nbdist.engine.engine as _e\n"
         "_e._real_versions = getattr(_e, '_real_versions', _e.versions)\n"
         "_e.versions = lambda: {**_e._real_versions(), 'nbdist': '0.0.9'}")
UNPATCH = "import nbdist.engine.engine as _e\n_e.versions = getattr(_e, '_real_versions', _e.versions)"


@pytest.fixture
def engine_reporting_old_nbdist(cluster):
    """Engine 1 of the shared cluster reports nbdist 0.0.9 (its probe's version lookup patched there);
    restored afterwards, also when the test fails."""
    _, client = cluster
    target = sorted(client.ids)[1]
    client[target].execute(PATCH, block=True)
    try:
        yield target
    finally:
        client[target].execute(UNPATCH, block=True)


@pytest.mark.cluster
def test_status_warns_once_per_connect_about_an_engine_with_another_nbdist(cluster, engine_reporting_old_nbdist):
    ipp_cluster, _ = cluster
    target = engine_reporting_old_nbdist
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist").check()
        connected = driver.run(f"%dist connect --cluster-id {ipp_cluster.cluster_id}", timeout=120).check().stdout
        warnings = [line for line in connected.splitlines() if "warning" in line]
        assert len(warnings) == 1, connected
        assert f"engine {target} on " in warnings[0] and "nbdist 0.0.9 (the notebook has 0.1.0)" in warnings[0]
        assert "-m pip install nbdist==0.1.0" in warnings[0]
        assert "warning" not in driver.run("%dist status", timeout=60).check().stdout  # once per connect
        again = driver.run(f"%dist connect --cluster-id {ipp_cluster.cluster_id}", timeout=120).check().stdout
        assert "nbdist 0.0.9" in again  # a new connection warns again
    finally:
        driver.run("%dist stop", timeout=60)
        driver.stop()
