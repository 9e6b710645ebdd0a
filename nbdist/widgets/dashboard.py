"""The live dashboard of a run: per-node loss, throughput, staleness, a node table and controls.

Built from the run's own records (DESIGN.md section 8): the workers' records arrive through
ipyparallel's datapub (at most 2 a second each), the parameter server's push log through
`Strategy.telemetry`. Controls call `Run.control`, which reaches every PS shard and returns
its acknowledgement. The cell awaits the run (see `magics.async_dashboard_cells`), so
the kernel's event loop handles widget events and the buttons act on the running job.
"""

from __future__ import annotations

import datetime
import html
import statistics
import time

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..ashl.report import decisions
from ..errors import NbdistError

REFRESH_S = 0.5
DECISIONS_SHOWN = 8
MAX_POINTS = 2000  # per trace; past it a series keeps every other point (memory stays bounded)
COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")
PANELS = ("loss", "samples/s", "staleness", "staleness distribution", "gamma (ddc-asgd)", "compensation norm")


class Series:
    """x / y of one trace, halved when it grows past MAX_POINTS."""

    def __init__(self):
        self.x: list = []
        self.y: list = []

    def add(self, x, y) -> None:
        if y is None:
            return
        self.x.append(x)
        self.y.append(y)
        if len(self.x) > MAX_POINTS:
            self.x, self.y = self.x[::2], self.y[::2]


class Dashboard:
    """`on_progress` for `Session.distribute`: called with the run while it runs, `close()` at the end."""

    def __init__(self, run, display=None):
        from IPython.display import display as show

        self.run = run
        self.started = time.time()
        self.workers = list(range(len(run.workers)))
        self.series = {(panel, k): Series() for panel in PANELS for k in self.workers}
        self.overall = {"global loss": Series(), "validation loss": Series()}  # drawn on the loss panel
        self.last_seen: dict[int, float] = {}
        self.last_t = 0.0
        self.ack = widgets.HTML("")
        self.header = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0, max=1, layout=widgets.Layout(width="100%"))
        self.figure = go.FigureWidget(self._empty_figure())
        self.table = widgets.HTML()
        self.decisions = widgets.HTML()  # ASHL's allocations, phase switch and compression changes, with reasons
        self.controls = self._controls()
        self.box = widgets.VBox([self.header, self.bar, self.controls, self.ack, self.decisions, self.figure,
                                 self.table])
        (display or show)(self.box)

    # -- figure ------------------------------------------------------------------------------
    def _empty_figure(self) -> go.Figure:
        figure = make_subplots(rows=3, cols=2, subplot_titles=PANELS, vertical_spacing=0.09)
        for i, panel in enumerate(PANELS):
            row, col = divmod(i, 2)
            for k in self.workers:
                colour = COLOURS[k % len(COLOURS)]  # one colour per node in every panel
                trace = (go.Histogram(name=f"worker {k}", legendgroup=str(k), showlegend=False, opacity=0.6,
                                      marker_color=colour)
                         if panel == "staleness distribution" else
                         go.Scatter(name=f"worker {k}", legendgroup=str(k), showlegend=i == 0, mode="lines",
                                    line_color=colour))
                figure.add_trace(trace, row=row + 1, col=col + 1)
        figure.add_trace(go.Scatter(name="global loss (mean of nodes)", mode="lines",
                                    line={"color": "black", "dash": "dash"}), row=1, col=1)
        figure.add_trace(go.Scatter(name="validation loss (epoch ends)", mode="markers",
                                    marker={"color": "black", "symbol": "x"}), row=1, col=1)
        figure.update_layout(height=720, margin={"t": 40, "b": 30}, barmode="overlay", legend={"orientation": "h"})
        return figure

    def _trace(self, panel: str, worker: int):
        return self.figure.data[PANELS.index(panel) * len(self.workers) + worker]

    # -- controls --------------------------------------------------------------------------
    def _controls(self) -> widgets.Widget:
        self.pause_button = widgets.Button(description="Pause", icon="pause")
        self.resume_button = widgets.Button(description="Resume", icon="play")
        self.stop_button = widgets.Button(description="Stop", icon="stop", button_style="warning",
                                          tooltip="end training gracefully: weights kept, History closed")
        self.lr = widgets.BoundedFloatText(value=1.0, min=0.01, max=100.0, step=0.1, description="lr x",
                                           layout=widgets.Layout(width="150px"))
        self.lr_button = widgets.Button(description="Set lr")
        self.staleness = widgets.IntText(value=-1, description="max stale", layout=widgets.Layout(width="150px"),
                                         tooltip="-1: unbounded")
        self.staleness_button = widgets.Button(description="Set bound")
        self.evict_choice = widgets.Dropdown(options=[(f"worker {k}", k) for k in self.workers],
                                             layout=widgets.Layout(width="120px"))
        self.evict_button = widgets.Button(description="Evict", button_style="danger")
        self.switch_button = widgets.Button(description="Switch phase now", disabled=self.run.strategy != "ashl")
        self.pause_button.on_click(lambda _: self.act("pause"))
        self.resume_button.on_click(lambda _: self.act("resume"))
        self.stop_button.on_click(lambda _: self.act("stop"))
        self.lr_button.on_click(lambda _: self.act("lr_scale", float(self.lr.value)))
        self.staleness_button.on_click(
            lambda _: self.act("max_staleness", None if self.staleness.value < 0 else int(self.staleness.value)))
        self.evict_button.on_click(lambda _: self.act("evict", int(self.evict_choice.value)))
        self.switch_button.on_click(lambda _: self.act("switch_phase"))
        return widgets.VBox([
            widgets.HBox([self.pause_button, self.resume_button, self.stop_button, self.switch_button]),
            widgets.HBox([self.lr, self.lr_button, self.staleness, self.staleness_button, self.evict_choice,
                          self.evict_button]),
        ])

    def act(self, action: str, value=None) -> list[dict]:
        """What a control button does: send it, then show the acknowledgement (or why not)."""
        try:
            acks = self.run.control(action, value)
        except NbdistError as exc:
            self.ack.value = f"<span style='color:#b00'>{html.escape(action)}: {html.escape(str(exc))}</span>"
            return []
        state = acks[0] if acks else {}
        when = datetime.datetime.now().strftime("%H:%M:%S")
        self.ack.value = (f"<b>{html.escape(action)}{'' if value is None else ' ' + html.escape(str(value))}</b> "
                          f"acknowledged by {len(acks)} shard(s) at {when}: paused {state.get('paused')}, "
                          f"lr x {state.get('lr_scale')}, max staleness {state.get('max_staleness')}, "
                          f"evicted {state.get('evicted')}, synchronous {state.get('synchronous')}, "
                          f"PS version {state.get('version')}")
        return acks

    # -- updates ---------------------------------------------------------------------------
    def __call__(self, run) -> None:
        now = time.time()
        if now - self.last_t < REFRESH_S:
            return
        self.last_t = now
        self._take_records(run)
        self._take_pushes(run)
        self._draw(run, now)

    def _take_records(self, run) -> None:
        rank_of = {eid: k for k, eid in enumerate(run.workers)}
        for eid, latest in list(run.progress.items()):
            record = latest.get("record") or {}
            k = rank_of.get(eid)
            t = record.get("t")
            if k is None or t is None or t <= self.last_seen.get(k, 0):
                continue
            self.last_seen[k] = t
            x = round(t - (run.started_at or self.started), 2)
            self.series[("loss", k)].add(x, record.get("loss"))
            self.series[("samples/s", k)].add(x, record.get("samples_per_s"))
            latest_losses = [self.series[("loss", j)].y[-1] for j in self.workers if self.series[("loss", j)].y]
            if record.get("loss") is not None:
                self.overall["global loss"].add(x, statistics.mean(latest_losses))
            if latest.get("epoch_end"):
                self.overall["validation loss"].add(x, (latest.get("logs") or {}).get("val_loss"))

    def _take_pushes(self, run) -> None:
        controller = run.controller
        telemetry = controller.telemetry() if controller is not None else {}
        fields = telemetry.get("log_fields")
        for entry in telemetry.get("log", []):
            e = dict(zip(fields, entry))
            k = e["worker"]
            if k not in self.workers or e["staleness"] is None:
                continue
            x = round(e["t"] - (run.started_at or self.started), 2)
            self.series[("staleness", k)].add(x, e["staleness"])
            self.series[("staleness distribution", k)].add(x, e["staleness"])
            self.series[("gamma (ddc-asgd)", k)].add(x, e.get("gamma"))
            self.series[("compensation norm", k)].add(x, e.get("comp_norm"))
        if telemetry.get("control"):
            self.control_state = telemetry["control"][0]

    def _draw(self, run, now: float) -> None:
        with self.figure.batch_update():
            for (panel, k), series in self.series.items():
                trace = self._trace(panel, k)
                if panel == "staleness distribution":
                    trace.x = series.y
                else:
                    trace.x, trace.y = series.x, series.y
            for i, series in enumerate(self.overall.values()):
                trace = self.figure.data[len(PANELS) * len(self.workers) + i]
                trace.x, trace.y = series.x, series.y
        self.header.value = self._header(run, now)
        self.table.value = self._node_table(run, now)
        lines = decisions(run)[-DECISIONS_SHOWN:]
        self.decisions.value = ("<b>decisions</b><pre style='margin:0'>" + html.escape("\n".join(lines)) + "</pre>"
                                if lines else "")

    def _header(self, run, now: float) -> str:
        latest = (run.progress.get(run.workers[0]) or {}) if run.workers else {}
        epochs, steps = latest.get("epochs"), latest.get("steps")
        record = latest.get("record") or {}
        done = 0.0
        if epochs and steps:
            done = min(1.0, (record.get("epoch", 0) * steps + (latest.get("batch") or 0)) / (epochs * steps))
        self.bar.value = done
        elapsed = now - (run.started_at or self.started)
        eta = f"{elapsed * (1 - done) / done:.0f} s" if done > 0.02 else "-"
        state = getattr(self, "control_state", {})
        phase = "paused" if state.get("paused") else "stopping" if state.get("finishing") else record.get("phase") or "train"
        return (f"<b>run {run.id}</b> · {html.escape(run.strategy)} on {len(run.workers)} worker(s) · phase "
                f"<b>{phase}</b> · {run.status} · elapsed {elapsed:.0f} s · ETA {eta} · {done:.0%}")

    def _node_table(self, run, now: float) -> str:
        rates = {k: s.y[-1] for (panel, k), s in self.series.items() if panel == "samples/s" and s.y}
        median = statistics.median(rates.values()) if rates else None
        died = {e["rank"] for e in run.events_of("worker_died")}
        evicted = set(getattr(self, "control_state", {}).get("evicted") or [])
        rows = []
        for k, eid in enumerate(run.workers):
            latest = run.progress.get(eid) or {}
            state = ("dead" if k in died else "evicted" if k in evicted else
                     "slow" if median and rates.get(k, median) < 0.5 * median else "running")
            seen = f"{now - self.last_seen[k]:.1f} s ago" if k in self.last_seen else "-"
            info = run.hosts.get(eid, {})
            rows.append(f"<tr><td>{k}</td><td>{eid}</td><td>{html.escape(str(info.get('host', '')))}</td>"
                        f"<td>{html.escape(', '.join(info.get('gpus') or []) or '-')}</td>"
                        f"<td>{latest.get('batch_size') or '-'}</td>"
                        f"<td>{state}</td><td>{seen}</td></tr>")
        return ("<table><tr><th>worker</th><th>engine</th><th>host</th><th>GPU</th><th>batch</th><th>state</th>"
                "<th>last seen</th></tr>" + "".join(rows) + "</table>")

    def close(self) -> None:
        """The final state: last redraw, controls hidden (called where the run ends, any thread)."""
        try:
            self.last_t = 0.0
            self._take_records(self.run)
            self._draw(self.run, time.time())
        except Exception:  # the final redraw is cosmetic; the run's outcome is what matters
            pass
        self.controls.layout.display = "none"
        self.static = go.Figure(self.figure)

    def conclude(self) -> None:
        """In the cell that waits for the run: the live figure gives way to a static one, which a
        saved notebook keeps (plotly's own mimetype, no widget state needed)."""
        from IPython.display import display

        self.figure.close()
        display(self.static)
