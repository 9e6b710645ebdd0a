"""The cluster notebooks/05-multi-host.ipynb connects to: started outside the notebook, as on real hosts
(`ipcluster start --profile nbdist-multihost`), before its first cell, and stopped when the session ends."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROFILE = "nbdist-multihost"
NOTEBOOK = "05-multi-host.ipynb"
ENGINES = 2
TIMEOUT_S = 180
_cluster: dict = {}


def _ipcluster(*args: str) -> subprocess.CompletedProcess:
    ipcluster = Path(sys.executable).parent / "ipcluster"
    return subprocess.run([str(ipcluster), *args, f"--profile={PROFILE}"], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _cluster or Path(str(item.fspath)).name != NOTEBOOK:
        return
    import ipyparallel as ipp
    from IPython.paths import get_ipython_dir

    profile_dir = Path(get_ipython_dir()) / f"profile_{PROFILE}"
    _cluster["created_profile"] = not profile_dir.exists()
    _cluster["profile_dir"] = profile_dir
    started = _ipcluster("start", f"-n={ENGINES}", "--daemonize")
    assert started.returncode == 0, started.stdout + started.stderr
    client = ipp.Client(profile=PROFILE, timeout=TIMEOUT_S)
    try:
        client.wait_for_engines(ENGINES, timeout=TIMEOUT_S)
    finally:
        client.close()


def pytest_sessionfinish(session):
    if not _cluster:
        return
    _ipcluster("stop")
    if _cluster["created_profile"]:
        shutil.rmtree(_cluster["profile_dir"], ignore_errors=True)
