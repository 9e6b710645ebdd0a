"""The dashboard in a real JupyterLab, in Debian's headless Chromium driven by Playwright."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

from tests.conftest import DEFINITION
from tests.test_nfdt import idle_engines

pytestmark = pytest.mark.cluster

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
TRAIN = '''%%distribute --strategy nfdt --workers 2
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=60)'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path, cluster):
    """A JupyterLab server on 127.0.0.1 serving a notebook that trains on the shared cluster; stopped after."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: run `make setup` (apt-get install chromium)")
    ipp_cluster, _ = cluster
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        f"%load_ext nbdist\n%dist connect --cluster-id {ipp_cluster.cluster_id}",
        "%%distribute define --name data\n" + DEFINITION,
        TRAIN,
    )], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, tmp_path / "dashboard.ipynb")
    port, token = free_port(), uuid.uuid4().hex
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", "--ServerApp.allow_root=True", f"--ServerApp.root_dir={tmp_path}",
         f"--LabApp.user_settings_dir={tmp_path / 'user-settings'}", f"--LabApp.workspaces_dir={tmp_path / 'ws'}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "wb"),
        env={k: v for k, v in os.environ.items() if k != "NBDIST_PROGRESS"})  # a browser: auto = dashboard
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise AssertionError("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/lab/tree/dashboard.ipynb?reset&token={token}"
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def test_dashboard_draws_and_its_pause_and_resume_act_in_a_real_browser(lab, cluster):
    from playwright.sync_api import sync_playwright

    idle_engines(cluster, 2)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.set_default_timeout(120_000)
            page.goto(lab)
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_selector("text=| Idle")  # the kernel is up
            for i in range(3):  # run each cell as a user does; the setup cells must finish first
                page.click(f".jp-Notebook .jp-Cell >> nth={i}")
                page.keyboard.press("Shift+Enter")
                if i < 2:
                    page.wait_for_selector(f".jp-Notebook .jp-Cell >> nth={i} >> .jp-InputPrompt:has-text('[{i + 1}]')")

            page.wait_for_selector("button:has-text('Pause')")
            page.wait_for_selector(".js-plotly-plot .scatterlayer .trace path.js-line")  # drawn lines, not axes only
            page.wait_for_selector("table:has-text('last seen') >> text=running")
            assert page.locator(".js-plotly-plot .scatterlayer .trace").count() >= 2
            page.screenshot(path=str(SCREENSHOTS / "dashboard-during-training.png"), full_page=True)

            page.click("button:has-text('Pause')")
            page.wait_for_selector("text=pause acknowledged")
            page.wait_for_selector("text=phase paused")
            page.screenshot(path=str(SCREENSHOTS / "dashboard-paused.png"), full_page=True)
            page.click("button:has-text('Resume')")
            page.wait_for_selector("text=resume acknowledged")
            page.wait_for_selector("text=phase train")
            page.click("button:has-text('Stop')")

            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", state="attached",
                                   timeout=180_000)
            page.wait_for_selector(".jp-OutputArea-output.jp-RenderedPlotly")  # the static final figure (mimetype)
            page.screenshot(path=str(SCREENSHOTS / "dashboard-after-training.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "dashboard-failure.png"), full_page=True)
            print("OUTPUTS", page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output')]
                .map(e => e.className + ' :: ' + e.innerText.slice(0, 80) + ' :: ' + e.innerHTML.length)"""))
            raise
        finally:
            browser.close()
