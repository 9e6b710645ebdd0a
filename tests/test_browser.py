"""The dashboard in a real JupyterLab, in Debian's headless Chromium driven by Playwright."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.conftest import DEFINITION
from tests.lab_helpers import SCREENSHOTS, chromium_page, jupyter_lab
from tests.support import idle_engines

pytestmark = pytest.mark.cluster

DASHBOARD = ".jp-OutputArea-output"  # the dashboard's buttons, not the Distributed sidebar's own Stop
TRAIN = '''%%distribute --strategy nfdt --workers 2
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=500)  # the test stops it'''


@pytest.fixture
def lab(tmp_path: Path, cluster):
    """A JupyterLab server on 127.0.0.1 serving a notebook that trains on the shared cluster; stopped after."""
    ipp_cluster, _ = cluster
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        f"%load_ext nbdist\n%dist connect --cluster-id {ipp_cluster.cluster_id}",
        "%%distribute define --name data\n" + DEFINITION,
        TRAIN,
    )], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, tmp_path / "dashboard.ipynb")
    with jupyter_lab(tmp_path) as server:
        yield server.url("dashboard.ipynb")


def test_dashboard_draws_and_its_pause_and_resume_act_in_a_real_browser(lab, cluster):
    idle_engines(cluster, 2)
    with chromium_page() as page:
        try:
            page.goto(lab)
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_selector("text=| Idle")  # the kernel is up
            for i in range(3):  # run each cell as a user does; the setup cells must finish first
                page.click(f".jp-Notebook .jp-Cell >> nth={i}")
                page.keyboard.press("Shift+Enter")
                if i < 2:
                    page.wait_for_selector(f".jp-Notebook .jp-Cell >> nth={i} >> .jp-InputPrompt:has-text('[{i + 1}]')")

            page.wait_for_selector(f"{DASHBOARD} button:has-text('Pause')")
            page.wait_for_selector(".js-plotly-plot .scatterlayer .trace path.js-line")  # drawn lines, not axes only
            page.wait_for_selector("table:has-text('last seen') >> text=running")
            # the figure the browser holds: nfdt's four panels with a trace per node, then the global and validation
            # loss (as test_dashboard counts them in the kernel); both nodes' loss traces have points
            traces = page.evaluate("() => document.querySelector('.js-plotly-plot').data"
                                   ".map(t => [t.name, (t.y || t.x || []).length])")
            assert len(traces) == 4 * 2 + 2, traces
            assert [name for name, _ in traces[:2]] == ["worker 0", "worker 1"] and all(n for _, n in traces[:2])
            page.screenshot(path=str(SCREENSHOTS / "dashboard-during-training.png"), full_page=True)

            # JupyterLab's dark theme: the extension tells the kernel, the plots turn dark while training
            page.click(".lm-MenuBar-itemLabel:text-is('Settings')")
            page.click(".lm-Menu-itemLabel:text-is('Theme')")
            page.click(".lm-Menu-itemLabel:text-is('JupyterLab Dark')")
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
            page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot .main-svg')]
                .some(svg => getComputedStyle(svg).backgroundColor === 'rgb(17, 17, 17)')""")  # plotly_dark's paper
            page.screenshot(path=str(SCREENSHOTS / "dashboard-dark-theme.png"), full_page=True)

            page.click(f"{DASHBOARD} button:has-text('Pause')")
            page.wait_for_selector("text=pause acknowledged")
            page.wait_for_selector("text=phase paused")
            page.screenshot(path=str(SCREENSHOTS / "dashboard-paused.png"), full_page=True)
            page.click(f"{DASHBOARD} button:has-text('Resume')")
            page.wait_for_selector("text=resume acknowledged")
            page.wait_for_selector("text=phase train")
            page.click(f"{DASHBOARD} button:has-text('Stop')")

            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", state="attached",
                                   timeout=180_000)
            page.wait_for_selector(".jp-OutputArea-output.jp-RenderedPlotly")  # the static final figure (mimetype)
            page.screenshot(path=str(SCREENSHOTS / "dashboard-after-training.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "dashboard-failure.png"), full_page=True)
            print("OUTPUTS", page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output')]
                .map(e => e.className + ' :: ' + e.innerText.slice(0, 80) + ' :: ' + e.innerHTML.length)"""))
            raise
