"""A real JupyterLab server and Debian's headless Chromium for the browser tests, each stopped on exit."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    port: int
    token: str

    def url(self, notebook: str) -> str:
        """The notebook's page; `reset` so no earlier layout or tabs are restored."""
        return f"http://127.0.0.1:{self.port}/lab/tree/{notebook}?reset&token={self.token}"


@contextlib.contextmanager
def jupyter_lab(root: Path, python: str = sys.executable, env: dict | None = None):
    """JupyterLab of `python`'s environment on 127.0.0.1 serving `root`; on exit it is stopped, and so is
    every process it started (kernels, and the clusters those kernels started) that outlives it."""
    import psutil

    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: run `make setup` (apt-get install chromium)")
    port, token = free_port(), uuid.uuid4().hex
    log = root / "lab.log"
    server = subprocess.Popen(
        [python, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", "--ServerApp.allow_root=True", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={root / 'user-settings'}", f"--LabApp.workspaces_dir={root / 'ws'}"],
        stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
        env={k: v for k, v in (os.environ if env is None else env).items()
             if k != "NBDIST_PROGRESS"})  # a browser: auto = dashboard
    try:
        def answers() -> bool:
            if server.poll() is not None:
                raise AssertionError("JupyterLab exited: " + log.read_text()[-2000:])
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                return True
            except OSError:
                return False

        try:
            wait_for(answers, "JupyterLab to answer on its port", START_TIMEOUT_S, every=0.3)
        except AssertionError as exc:
            raise AssertionError(f"JupyterLab did not start ({exc}): " + log.read_text()[-2000:]) from None
        yield LabServer(port, token)
    finally:
        try:
            descendants = psutil.Process(server.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        server.terminate()  # shuts its kernels down, whose clusters stop at exit
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
        _, alive = psutil.wait_procs(descendants, timeout=STOP_TIMEOUT_S)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


@contextlib.contextmanager
def chromium_page(viewport=(1400, 1800), timeout_ms: int = 120_000):
    """A Playwright page in Debian's headless Chromium; the browser is closed on exit."""
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            browser.close()
