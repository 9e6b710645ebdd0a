"""The dashboard as a widget model, no browser: which figures each strategy gets, every axis titled with
its unit, one steady throughput estimator, and an ended run that says how it ended."""

from __future__ import annotations

import pytest

from nbdist.notebook.run import Run
from nbdist.strategies import REGISTRY
from nbdist.engine.telemetry import WindowedRate

ASYNC_PS = {"nfdt", "asgd", "adsp", "dc-asgd", "dc-asgd-a", "dc-asgdk", "ddc-asgd", "ashl"}
DELAY_RULES = {"dc-asgd", "dc-asgd-a", "dc-asgdk", "ddc-asgd", "ashl"}
PIPELINES = {"pipeline"}


def dashboard_of(strategy: str, **run_fields):
    from nbdist.notebook.widgets.dashboard import Dashboard

    return Dashboard(Run(strategy=strategy, options={}, workers=[0, 1], cell="", **run_fields), display=lambda box: None)


@pytest.mark.parametrize("strategy", sorted(REGISTRY))
def test_each_strategy_gets_only_the_figures_it_can_fill(strategy):
    names = [p.name for p in dashboard_of(strategy).panels]
    expected = ["loss", "throughput"]
    if strategy in ASYNC_PS:
        expected += ["staleness", "staleness distribution"]
    if strategy in DELAY_RULES:
        expected += ["gamma", "compensation"]
    if strategy in PIPELINES:
        expected += ["bubble"]
    assert names == expected


@pytest.mark.parametrize("strategy", ["local", "ddc-asgd"])
def test_every_axis_says_what_it_measures(strategy):
    layout = dashboard_of(strategy).figure.layout
    axes = [name for name in layout if name.startswith(("xaxis", "yaxis"))]
    assert len(axes) == 2 * len(dashboard_of(strategy).panels)
    titles = {name: layout[name].title.text for name in axes}
    assert all(titles.values()), titles
    assert titles["xaxis"] == "s since start" and titles["yaxis"] == "loss"
    assert titles["yaxis2"] == "samples/s"


def test_axes_say_virtual_seconds_on_the_virtual_clock():
    from nbdist.notebook.widgets.dashboard import Dashboard

    run = Run(strategy="asgd", options={"simulate": "clock=virtual; step=5ms"}, workers=[0], cell="")
    layout = Dashboard(run, display=lambda box: None).figure.layout
    assert layout.xaxis.title.text == "virtual s since start"
    assert layout.yaxis3.title.text == "versions"


@pytest.mark.parametrize("clock", ["real", "virtual"])
def test_the_axis_titles_of_a_row_fit_their_plots_at_a_narrow_cell_width(clock):
    """A 600 px wide output (a notebook cell beside JupyterLab's sidebar): each x-axis title, at a generous
    0.6 em a character, fits the width of its own plot, so the two of a row cannot run into each other; the
    right plot's y-axis title and tick labels (4 characters) fit the gap between the two."""
    from nbdist.notebook.widgets.dashboard import Dashboard

    options = {"simulate": "clock=virtual; step=5ms"} if clock == "virtual" else {}
    figure = Dashboard(Run(strategy="ashl", options=options, workers=[0, 1], cell=""), display=lambda box: None).figure
    layout, width = figure.layout, 600
    plotted = width - layout.margin.l - layout.margin.r
    for name in [n for n in layout if n.startswith("xaxis")]:
        axis = layout[name]
        text = len(axis.title.text) * 0.6 * axis.title.font.size
        assert text <= (axis.domain[1] - axis.domain[0]) * plotted, (name, axis.title.text)
    gap = (layout.xaxis2.domain[0] - layout.xaxis.domain[1]) * plotted
    assert gap >= (4 * 0.6 + 1.5) * layout.yaxis2.title.font.size


def test_the_windowed_rate_of_a_steady_stream_is_steady_across_an_epoch_end():
    # 1,000 samples/s in whole batches of 64; a record every 0.5 s, and at each epoch's end (every 5 s) one more
    # 10 ms after the last: over that 10 ms interval alone the rate reads 0 (no batch finished in it)
    def samples_at(t):
        return 64 * int(t * 1000 / 64)

    times = []
    for i in range(1, 41):
        times += [i * 0.5] + ([i * 0.5 + 0.01] if i % 10 == 0 else [])
    rate = WindowedRate(window_s=2.0)
    seen = [(t, rate.add(t, samples_at(t))) for t in times]
    assert seen[0][1] is None
    for t, value in seen[4:]:  # once the window is full
        assert value == pytest.approx(1000, rel=0.05), (t, value)


def test_the_rate_spans_the_window_not_the_last_interval():
    rate = WindowedRate(window_s=2.0)
    assert rate.add(0.0, 0) is None
    assert rate.add(1.0, 100) == 100
    assert rate.add(2.0, 200) == 100
    assert rate.add(2.01, 300) == pytest.approx(300 / 2.01)  # a burst moves the rate by its share of the window
    assert rate.add(3.0, 300) == pytest.approx(200 / 2.0)  # the window now starts at t = 1


def ended(status: str, epochs_done: int, error=None):
    """A dashboard whose 5-epoch run ended after `epochs_done` epochs of History (rank 0's result)."""
    from nbdist.keras_semantics.keras_bridge import FitResult

    dashboard = dashboard_of("nfdt", status=status, started_at=100.0, ended_at=112.5, error=error)
    dashboard.run.progress = {0: {"record": {"epoch": 0, "t": 1.0}, "epochs": 5, "steps": 10, "batch": 3}}
    if epochs_done:
        dashboard.run.results = {0: [FitResult([], [], {"loss": [1.0] * epochs_done}, {}, [])]}
    return dashboard


@pytest.mark.parametrize("status, epochs_done, error, says", [
    ("done", 5, None, "done"),
    ("done", 2, None, "stopped at epoch 2 of 5"),  # the last progress message said epoch 1: the History decides
    ("failed", 0, "EngineFailure: injected [on engine 1]", "failed: EngineFailure: injected"),
    ("interrupted", 0, None, "interrupted"),
])
def test_an_ended_run_says_how_it_ended_and_its_time_never_an_eta(status, epochs_done, error, says):
    dashboard = ended(status, epochs_done, error)
    header = dashboard._header(dashboard.run, now=200.0)
    assert says in header and "12.5 s in all" in header and "ETA" not in header


def test_the_node_table_shows_each_workers_rate_and_the_clusters_total():
    dashboard = dashboard_of("nfdt", status="running", started_at=100.0)
    dashboard.series[("throughput", 0)].add(1.0, 1200.0)
    dashboard.series[("throughput", 1)].add(1.0, 800.0)
    table = dashboard._node_table(dashboard.run, now=101.0)
    assert "<th>samples/s</th>" in table and "<td>1,200</td>" in table and "<td>800</td>" in table
    assert "<b>all workers</b></td><td><b>2,000</b>" in table


def test_an_acknowledgement_reads_as_the_control_state_and_an_ended_run_lists_its_workers_done():
    dashboard = dashboard_of("nfdt", status="done", started_at=100.0, ended_at=110.0)
    dashboard.run.control = lambda action, value=None: [{"v": 2, "kind": "ok", "nonce": "ab12", "version": 481,
                                                          "paused": False, "finishing": True, "evicted": []}]
    dashboard.act("stop")
    ack = dashboard.controls.ack.value
    assert "version 481, paused False, finishing True, evicted []" in ack and "nonce" not in ack
    assert dashboard._node_table(dashboard.run, now=111.0).count("<td>done</td>") == 2


def test_the_plots_follow_jupyterlabs_theme_as_the_extension_reports_it(monkeypatch):
    from types import SimpleNamespace

    import plotly.io as pio

    import nbdist
    from nbdist.notebook.lab_comm import LabChannel
    from nbdist.notebook.session import Session

    session = Session()
    monkeypatch.setattr(nbdist.notebook.session, "get_session", lambda shell=None: session)
    LabChannel(session).handle(SimpleNamespace(send=lambda message: None), {"action": "theme", "dark": True})
    assert session.theme == "dark"
    d = dashboard_of("nfdt")
    dark = pio.templates["plotly_dark"].layout.paper_bgcolor
    assert d.figure.layout.template.layout.paper_bgcolor == dark
    first = len(d.panels) * len(d.workers)
    assert d.figure.data[first].line.color == "white"  # the global loss line stays visible
    LabChannel(session).handle(SimpleNamespace(send=lambda message: None), {"action": "theme", "dark": False})
    # at once, without a redraw (an ended run's dashboard, shown in a tab, redraws no more)
    assert d.figure.layout.template.layout.paper_bgcolor != dark and d.figure.data[first].line.color == "black"


def test_a_dashboard_tab_opened_after_the_run_ended_shows_its_final_figures():
    from types import SimpleNamespace

    from nbdist.notebook.lab_comm import LabChannel
    from nbdist.notebook.session import Session

    session = Session()
    box = SimpleNamespace(comm=object(), model_id="box-1")
    session.runs.append(SimpleNamespace(id=3, status="done", display=SimpleNamespace(box=box), cell_id="c-3"))
    sent = []
    LabChannel(session).handle(SimpleNamespace(send=sent.append), {"action": "show_dashboard", "run": 3})
    assert sent == [{"type": "dashboard", "run": 3, "model_id": "box-1", "cell_id": "c-3", "message": ""}]


def test_a_worker_that_joins_the_run_gets_its_traces_row_and_evict_choice():
    dashboard = dashboard_of("nfdt", status="running", started_at=100.0)
    before = len(dashboard.figure.data)
    dashboard.run.workers.append(7)
    dashboard.run.progress[7] = {"record": {"t": 101.0, "loss": 0.5}}
    dashboard.last_t = 0.0
    dashboard(dashboard.run)
    assert len(dashboard.figure.data) == before + len(dashboard.panels)  # one more trace per panel
    assert list(dashboard.trace("loss", 2).y) == [0.5] and dashboard.trace("loss", 2).name == "worker 2"
    assert [value for _, value in dashboard.controls.evict_choice.options] == [0, 1, 2]
    assert "<tr><td>2</td><td>7</td>" in dashboard._node_table(dashboard.run, now=101.5)


def test_a_run_auto_chose_shows_the_plans_epoch_beside_the_measured_one():
    dashboard = dashboard_of("hfdt", status="running", started_at=100.0)
    dashboard.run.options["planned_epoch_s"] = 2.0
    assert dashboard._header(dashboard.run, now=101.0).endswith(" · planned 2 s an epoch")  # no epoch ended yet
    for t, epoch in ((103.0, 0), (104.0, 1), (105.5, 1), (107.0, 2), (108.0, 2)):  # the first worker's records
        dashboard.run.progress[0] = {"record": {"t": t, "epoch": epoch, "loss": 0.5}}
        dashboard.last_t = 0.0
        dashboard(dashboard.run)
    # epochs end at 103, 105.5, 108 (the latest seen of each): 2.5 s an epoch after the first, 25 % over
    assert dashboard._header(dashboard.run, now=108.0).endswith(" · planned 2 s an epoch, measured 2.5 (+25%)")
    plain = dashboard_of("hfdt", status="running", started_at=100.0)  # a run no plan chose: nothing planned said
    assert "planned" not in plain._header(plain.run, now=101.0)


def test_deaths_recoveries_and_joins_are_listed_under_the_controls_as_they_happen():
    dashboard = dashboard_of("hfdt", status="running", started_at=100.0)
    dashboard.run.events += [
        {"t": 105.0, "event": "worker_died", "engine": 1, "rank": 1, "host": "h1", "after_s": 5.0},
        {"t": 107.5, "event": "recovered", "engine": 1, "rank": 1, "size": 1, "step": 40, "recovery_s": 2.5},
        {"t": 110.0, "event": "worker_joined", "engine": 4, "rank": 2, "host": "h2", "first_epoch": None,
         "after_s": 10.0},
        {"t": 111.0, "event": "control:pause", "value": None}]  # controls have their own acknowledgement line
    dashboard.last_t = 0.0
    dashboard(dashboard.run)
    assert dashboard.events.value.count("<li>") == 3
    assert "worker rank 1 (engine 1, host h1) died 5.0 s into run" in dashboard.events.value
    assert "re-formed the Horovod job with 1 rank(s) at step 40, training again 2.5 s after" in dashboard.events.value
    assert "engine 4 (host h2) joined run" in dashboard.events.value
