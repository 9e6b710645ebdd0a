"""`python -m nbdist.horovod`: what a build includes on which host, the cache layout scripts/setup.sh
shares, and `install --check` on this environment's real Horovod."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbdist import horovod
from nbdist.horovod import HostFeatures


def test_gloo_only_build_keeps_the_cache_folder_setup_sh_always_used(tmp_path):
    assert horovod.wheel_dir(tmp_path, "2.21.0", "311", HostFeatures()) == tmp_path / "horovod-0.28.1-tf2.21.0-py311"
    mpi = HostFeatures(mpi="Open MPI 4.1.4")
    assert horovod.wheel_dir(tmp_path, "2.21.0", "311", mpi).name == "horovod-0.28.1-tf2.21.0-py311-mpi"
    both = HostFeatures("Open MPI 4.1.4", "/usr/local/cuda", "/usr")
    assert horovod.wheel_dir(tmp_path, "2.21.0", "311", both).name == "horovod-0.28.1-tf2.21.0-py311-mpi-nccl"


def test_cache_root_follows_nbdist_cache_then_xdg():
    assert horovod.cache_root({"NBDIST_CACHE": "/c"}) == Path("/c")
    assert horovod.cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/nbdist")
    assert horovod.cache_root({}) == Path.home() / ".cache" / "nbdist"


def test_build_environment_always_has_gloo_and_adds_what_the_host_has():
    plain = horovod.build_environment(HostFeatures(), jobs=2)
    assert plain["HOROVOD_WITH_GLOO"] == plain["HOROVOD_WITH_TENSORFLOW"] == plain["HOROVOD_WITHOUT_MPI"] == "1"
    assert "HOROVOD_GPU_OPERATIONS" not in plain and plain["MAKEFLAGS"] == "-j2"
    assert plain["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    gpu = horovod.build_environment(HostFeatures("Open MPI 4.1.4", "/opt/cuda", "/opt/nccl"))
    assert gpu["HOROVOD_WITH_MPI"] == "1" and "HOROVOD_WITHOUT_MPI" not in gpu
    assert (gpu["HOROVOD_GPU_OPERATIONS"], gpu["HOROVOD_CUDA_HOME"], gpu["HOROVOD_NCCL_HOME"]) == \
        ("NCCL", "/opt/cuda", "/opt/nccl")


def _executable(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{text}'\n")
    path.chmod(0o755)


def test_detect_finds_mpi_on_path_and_cuda_with_nccl(tmp_path):
    """A host laid out like one with Open MPI, the CUDA toolkit and NCCL (the files detection looks for)."""
    _executable(tmp_path / "bin" / "mpicc")
    _executable(tmp_path / "bin" / "mpirun", "mpirun (Open MPI) 4.1.4")
    _executable(tmp_path / "cuda" / "bin" / "nvcc")
    (tmp_path / "cuda" / "include").mkdir()
    (tmp_path / "cuda" / "include" / "cuda_runtime.h").write_text("")
    (tmp_path / "nccl" / "include").mkdir(parents=True)
    (tmp_path / "nccl" / "include" / "nccl.h").write_text("")
    (tmp_path / "nccl" / "lib").mkdir()
    (tmp_path / "nccl" / "lib" / "libnccl.so").write_text("")
    environ = {"PATH": str(tmp_path / "bin"), "CUDA_HOME": str(tmp_path / "cuda"),
               "HOROVOD_NCCL_HOME": str(tmp_path / "nccl")}
    found = horovod.detect(environ)
    assert found == HostFeatures("Open MPI 4.1.4", str(tmp_path / "cuda"), str(tmp_path / "nccl"))
    assert found.extras() == ["mpi", "nccl"]
    assert horovod.detect(environ, without=("mpi", "nccl")) == HostFeatures()
    assert horovod.detect({"PATH": str(tmp_path / "bin"), "CUDA_HOME": str(tmp_path / "cuda")}).nccl_home is None


def test_this_host_has_no_nccl_and_mpi_as_installed():
    found = horovod.detect()
    assert not found.nccl  # no NCCL on this machine (it has a CUDA toolkit in /usr/local/cuda, and no GPU)
    has_mpi = bool(shutil.which("mpicc") and shutil.which("mpirun"))
    assert (found.mpi is not None) == has_mpi
    assert horovod.missing_tools() == []  # make setup installed cmake, g++, make and the Python headers


def test_patch_removes_only_the_xla_line(tmp_path):
    cmake = tmp_path / "horovod" / "tensorflow" / "CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    cmake.write_text('list(APPEND SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/mpi_ops.cc"\n'
                     '                    "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\nset(X 1)\n')
    horovod.patch_source(tmp_path)
    assert cmake.read_text() == 'list(APPEND SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/mpi_ops.cc"\nset(X 1)\n'


def test_check_report_says_what_to_run():
    host = HostFeatures(mpi="Open MPI 4.1.4")
    text, ok = horovod.check_report(None, host)
    assert not ok and "Horovod is not installed" in text and "python -m nbdist.horovod install" in text
    text, ok = horovod.check_report({"version": "0.28.1", "error": "ImportError: undefined symbol"}, host)
    assert not ok and "does not load" in text and "install --force" in text
    built = {"version": "0.28.1", "gloo": True, "mpi": False, "nccl": 0, "cuda": False, "rocm": False}
    text, ok = horovod.check_report(built, host)
    assert not ok and "Gloo yes, MPI no, NCCL no" in text and "lacks MPI, which this host has" in text
    assert horovod.check_report({**built, "mpi": True}, host)[1]


def test_mpi_world_reads_the_launchers_variables():
    assert horovod.mpi_world({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert horovod.mpi_world({"PMI_RANK": "0", "PMI_SIZE": "4"}) == (0, 4)
    assert horovod.mpi_world({}) is None


@pytest.mark.cluster  # starts processes
def test_install_check_on_this_environment():
    """The real `install --check` of this environment's Horovod (the one make setup built)."""
    done = subprocess.run([sys.executable, "-m", "nbdist.horovod", "install", "--check"], capture_output=True,
                          text=True, timeout=180, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("Horovod 0.28.1 in ") and "Gloo yes" in first and "NCCL no" in first
    mpi_built = "MPI yes" in first
    offers = done.stdout.splitlines()[1]
    if shutil.which("mpirun") and not mpi_built:
        assert "MPI Open MPI" in offers and "lacks MPI" in done.stdout
    elif not shutil.which("mpirun"):
        assert "MPI no" in offers
