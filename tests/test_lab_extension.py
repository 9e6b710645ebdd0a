"""The JupyterLab extension: its jest unit tests, and the sidebar, status item and commands in a real
JupyterLab driven through Debian's headless Chromium, on a cluster the notebook starts itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.conftest import DEFINITION
from tests.lab_helpers import SCREENSHOTS, chromium_page, jupyter_lab

pytestmark = pytest.mark.cluster  # jlpm, JupyterLab and a browser

LABEXTENSION = Path(__file__).resolve().parent.parent / "labextension"
EPOCHS = 200  # the run the sidebar stops: far longer than the test waits
CELLS = (
    "%load_ext nbdist\nimport nbdist",
    "%dist start -n 2",
    "%%distribute define --name data\n" + DEFINITION,
    '''%%distribute --strategy local
model = build()
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=64, epochs=2)''',
    f'''%%distribute --strategy nfdt --workers 2
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=32, epochs={EPOCHS})''',
    'print("epochs trained:", len(nbdist.last_run.history["loss"]), nbdist.last_run.status)',
    "model.summary()",  # the cell the two commands edit; never run
)
SETUP_TIMEOUT_MS = 240_000  # starting two engines that import TensorFlow, on a 2-core machine


def test_jest_unit_tests_pass():
    """The TypeScript unit tests (state model, comm handling, cell text), run by jest through jlpm."""
    jlpm = shutil.which("jlpm", path=str(Path(sys.executable).parent)) or shutil.which("jlpm")
    if not (LABEXTENSION / "node_modules").is_dir():
        pytest.fail("labextension/node_modules is missing: run `make setup`")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "CI": "true"}
    done = subprocess.run([jlpm, "test"], cwd=LABEXTENSION, env=env, capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    assert re.search(r"Tests:\s+\d+ passed, \d+ total", report), report[-2000:]


@pytest.fixture
def lab(tmp_path: Path):
    """JupyterLab serving a notebook that starts its own 2-engine cluster; the server, its kernel and
    that cluster are stopped afterwards, also when the test fails."""
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in CELLS],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, tmp_path / "sidebar.ipynb")
    with jupyter_lab(tmp_path) as server:
        yield server.url("sidebar.ipynb")


def run_cell(page, index: int, count: int, timeout_ms: int = 120_000) -> None:
    """Run cell `index` as a user does and wait until it shows execution count `count`."""
    page.click(f".jp-Notebook .jp-Cell >> nth={index} >> .jp-InputArea-editor")
    page.keyboard.press("Shift+Enter")
    wait_for_count(page, index, count, timeout_ms)


def wait_for_count(page, index: int, count: int, timeout_ms: int = 120_000) -> None:
    page.wait_for_selector(f".jp-Notebook .jp-Cell >> nth={index} >> .jp-InputPrompt:has-text('[{count}]')",
                           timeout=timeout_ms)


def cell_text(page, index: int) -> str:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content").inner_text()


def status_text(page) -> str:
    return page.locator(".jp-nbdist-status").inner_text()


@pytest.mark.timeout(600)
def test_sidebar_status_and_commands_in_a_real_jupyterlab(lab):
    with chromium_page() as page:
        try:
            page.goto(lab)
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_selector("text=| Idle")  # the kernel is up
            page.click(".jp-SideBar .lm-TabBar-tab[data-id='nbdist-sidebar']")
            page.wait_for_selector("#nbdist-sidebar >> text=nbdist is not loaded")
            page.screenshot(path=str(SCREENSHOTS / "lab-sidebar-empty.png"))

            run_cell(page, 0, 1)  # %load_ext: the kernel's comm reaches the sidebar
            page.wait_for_selector("#nbdist-sidebar >> text=No cluster yet")
            page.wait_for_selector(".jp-nbdist-status:has-text('nbdist: no cluster')")

            run_cell(page, 1, 2, SETUP_TIMEOUT_MS)  # %dist start -n 2
            page.wait_for_function("document.querySelectorAll('#nbdist-sidebar .jp-nbdist-engine').length === 2")
            assert page.locator("#nbdist-sidebar .jp-nbdist-engine[data-state='idle']").count() == 2
            page.wait_for_selector(".jp-nbdist-status:has-text('nbdist: 2 engines')")
            page.screenshot(path=str(SCREENSHOTS / "lab-sidebar-cluster.png"))

            run_cell(page, 2, 3)  # the definition cell
            page.wait_for_selector("#nbdist-sidebar >> text=Definition cells · 1")

            run_cell(page, 3, 4, SETUP_TIMEOUT_MS)  # a short local run
            page.wait_for_selector("#nbdist-sidebar .jp-nbdist-run[data-run-id='1'][data-status='done']")
            assert "local" in page.locator(".jp-nbdist-run[data-run-id='1'] .jp-nbdist-run-title").inner_text()
            page.wait_for_selector(".jp-nbdist-status:has-text('local done')")

            # The long run: progress in the status bar and the panel, then Stop from the sidebar.
            page.click(".jp-Notebook .jp-Cell >> nth=4 >> .jp-InputArea-editor")
            page.keyboard.press("Shift+Enter")
            running = "#nbdist-sidebar .jp-nbdist-run[data-run-id='2'][data-status='running']"
            page.wait_for_selector(f"{running} .jp-nbdist-stop", timeout=SETUP_TIMEOUT_MS)
            page.wait_for_function(
                "/nbdist: 2 engines · nfdt [1-9]\\d*%/.test(document.querySelector('.jp-nbdist-status').textContent)")
            page.wait_for_selector(f"{running} .jp-nbdist-node[data-rank='1'] svg.jp-nbdist-spark")
            page.wait_for_selector("#nbdist-sidebar .jp-nbdist-engine[data-state='busy']")
            page.screenshot(path=str(SCREENSHOTS / "lab-sidebar-training.png"))

            page.click(f"{running} .jp-nbdist-dashboard")  # the live dashboard, in a tab of its own
            page.wait_for_selector(".jp-nbdist-dashboard-view button:has-text('Pause')")
            page.screenshot(path=str(SCREENSHOTS / "lab-dashboard-tab.png"))

            page.click(f"{running} .jp-nbdist-stop")
            page.wait_for_selector("#nbdist-sidebar >> text=run 2: stopping")
            page.wait_for_selector("#nbdist-sidebar .jp-nbdist-run[data-run-id='2'][data-status='done']")
            # the tab opened during the run keeps the run's figures once it has ended, and says how it ended
            page.wait_for_selector(".jp-nbdist-dashboard-view:has-text('stopped at epoch')")
            assert page.locator(".jp-nbdist-dashboard-view .js-plotly-plot .scatterlayer .trace").count() >= 2
            page.screenshot(path=str(SCREENSHOTS / "lab-dashboard-tab-ended.png"))
            wait_for_count(page, 4, 5)
            run_cell(page, 5, 6)
            output = page.locator(".jp-Notebook .jp-Cell >> nth=5 >> .jp-OutputArea-output").inner_text()
            trained = int(re.search(r"epochs trained: (\d+) done", output).group(1))
            assert 1 <= trained < EPOCHS, output
            page.wait_for_selector(".jp-nbdist-status:has-text('nfdt done')")
            page.screenshot(path=str(SCREENSHOTS / "lab-sidebar-stopped.png"))

            # "Mark cell as model definition" from the command palette, on the cell never run.
            page.click(".jp-Notebook .jp-Cell >> nth=6 >> .jp-InputArea-editor")
            page.keyboard.press("Control+Shift+C")
            page.fill(".lm-CommandPalette-input", "Mark cell as model definition")
            page.keyboard.press("Enter")
            page.wait_for_function(
                "document.querySelectorAll('.jp-Notebook .jp-Cell')[6].querySelector('.cm-content')"
                ".innerText.startsWith('%%distribute define')")
            assert cell_text(page, 6).splitlines() == ["%%distribute define", "model.summary()"]

            # "Distribute this cell…" from the cell's context menu: the dialog writes the magic line.
            page.click(".jp-Notebook .jp-Cell >> nth=6 >> .jp-InputArea-editor", button="right")
            page.click(".lm-Menu-item:has-text('Distribute this cell')")
            page.select_option(".jp-Dialog select.jp-nbdist-form-strategy", "ddc-asgd")
            page.fill(".jp-Dialog input.jp-nbdist-form-workers", "2")
            page.screenshot(path=str(SCREENSHOTS / "lab-distribute-dialog.png"))
            page.click(".jp-Dialog button:has-text('Distribute')")
            page.wait_for_function(
                "document.querySelectorAll('.jp-Notebook .jp-Cell')[6].querySelector('.cm-content')"
                ".innerText.startsWith('%%distribute --strategy')")
            assert cell_text(page, 6).splitlines() == ["%%distribute --strategy ddc-asgd --workers 2",
                                                       "model.summary()"]
            page.screenshot(path=str(SCREENSHOTS / "lab-after-commands.png"))
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "lab-failure.png"), full_page=True)
            raise
