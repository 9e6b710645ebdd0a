"""Horovod built with MPI (Debian's Open MPI) by `python -m nbdist.horovod install`, engines started
under mpiexec by `%dist start --engines mpi`: hfdt trains on them, and Horovod runs over MPI there.

The MPI build goes into its own environment layered over this one (its own site-packages first),
so the project's Gloo-only Horovod in .venv is never replaced.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import DEFINITION, TRAIN
from tests.kernel_driver import KernelDriver

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not (shutil.which("mpicc") and shutil.which("mpirun")),
                                 reason="needs an MPI implementation: apt-get install openmpi-bin libopenmpi-dev")]
BUILD_TIMEOUT_S = 1200  # the MPI build itself, when not cached yet: about 3 minutes on 2 cores


@pytest.fixture(scope="module")
def mpi_python(tmp_path_factory) -> str:
    """A venv whose own site-packages hold the MPI Horovod and mpi4py, on top of this environment's packages."""
    venv = tmp_path_factory.mktemp("mpi") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "nbdist-base.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([python, "-m", "nbdist.horovod", "install"], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "MPI yes" in done.stdout, done.stdout
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--ignore-installed", "mpi4py"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return python


@pytest.fixture
def mpi_kernel(mpi_python):
    """A kernel in the MPI environment (its engines too); its cluster is stopped afterwards."""
    env = {**os.environ, "NBDIST_PROGRESS": "text"}
    if os.geteuid() == 0:  # Open MPI refuses to start processes as root without these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    driver = KernelDriver(env=env, python=mpi_python)
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        yield driver
    finally:
        try:
            driver.run("%dist stop", timeout=60)
        finally:
            driver.stop()


ENGINES = "nbdist.get_session().cluster.client[:]"
WORLD = ("(lambda: (__import__('nbdist.horovod').horovod.mpi_world(), "
         "__import__('horovod.tensorflow').tensorflow.mpi_built()))")
OVER_MPI = '''
def allreduce_over_mpi():
    import tensorflow as tf
    from nbdist.horovod import init_over_mpi
    hvd = init_over_mpi([0, 1])
    total = float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum))
    state = (hvd.rank(), hvd.size(), hvd.mpi_enabled(), hvd.gloo_enabled(), total)
    hvd.shutdown()
    return state
'''


@pytest.mark.timeout(900)
def test_hfdt_on_mpi_engines_and_horovod_over_mpi(mpi_kernel):
    kernel = mpi_kernel
    kernel.run("%dist start -n 2 --engines mpi", timeout=240).check()
    assert kernel.value(f"{ENGINES}.apply_sync({WORLD})") == [[[0, 2], True], [[1, 2], True]]

    kernel.run("%%distribute define --name data\n" + DEFINITION, timeout=120).check()
    kernel.run("%%distribute --strategy hfdt --workers 2\n" + TRAIN.format(epochs=2), timeout=300).check()
    result = kernel.value("{'loss': history.history['loss'], 'status': nbdist.last_run.status, "
                          "'workers': nbdist.last_run.workers}")
    assert result["status"] == "done" and result["workers"] == [0, 1]
    assert result["loss"][1] < result["loss"][0]

    # The same engines, Horovod's controller and reductions over MPI, no rendezvous. (Horovod keeps
    # gloo_enabled() true after the Gloo job above; and a process that ran Horovod over MPI dies when it
    # inits over Gloo later, so a strategy must pick one of the two per engine, not alternate.)
    kernel.run(OVER_MPI).check()
    states = kernel.value(f"{ENGINES}.apply_sync(allreduce_over_mpi)", timeout=120)
    assert [(rank, size, mpi, total) for rank, size, mpi, _, total in states] == [(0, 2, True, 3.0), (1, 2, True, 3.0)]
