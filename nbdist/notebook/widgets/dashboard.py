"""The live dashboard of a run: the figures its strategy reports, a node table and the live controls.

Built from the run's own records (DESIGN.md section 8): the workers' records arrive through
ipyparallel's datapub (at most 2 a second each), the parameter server's push log through
`Strategy.telemetry`. Which figures and controls appear is the strategy's `Reports`; controls
call `Run.control`, which returns each worker's or shard's acknowledgement. The cell awaits
the run (see `magics.async_dashboard_cells`), so the kernel's event loop handles widget
events and the buttons act on the running job.
"""

from __future__ import annotations

import datetime
import html
import re
import statistics
import time

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...errors import NbdistError
from ...strategies import REGISTRY
from .controls import WIDGETS, Controls
from .panels import figures_of

REFRESH_S = 0.5
DECISIONS_SHOWN = 8
# what an acknowledgement shows of the control state (not the wire's own fields: nonce, kind, ...)
ACK_FIELDS = ("version", "paused", "finishing", "lr_scale", "max_staleness", "evicted", "synchronous")
MAX_POINTS = 2000  # per trace; past it a series keeps every other point (memory stays bounded)
AXIS_TITLE_PX = 12  # two panels share a row: titles that fit half a notebook cell
COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")


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
        self.reports = REGISTRY[run.strategy].reports
        self.panels = figures_of(self.reports.panels)
        self.workers = list(range(len(run.workers)))
        self.series = {(p.name, k): Series() for p in self.panels for k in self.workers}
        # drawn on the loss panel, and (when the strategy reports throughput) on the throughput panel
        self.overall = {"global loss": Series(), "validation loss": Series()}
        self.last_seen: dict[int, float] = {}
        self.epoch_t: dict[int, float] = {}  # the first worker's latest time in each epoch (planned against measured)
        self.last_t = 0.0
        self.control_state: dict = {}
        self.header = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0, max=1, layout=widgets.Layout(width="100%"))
        self.figure = go.FigureWidget(self._empty_figure())
        self.table = widgets.HTML()
        self.decisions = widgets.HTML()  # ASHL's allocations, phase switch and compression changes, with reasons
        self.events = widgets.HTML()  # deaths, recoveries, engines that joined (Run.event_lines)
        self.controls = Controls(self.workers, self.reports.controls, self.act)
        for name in WIDGETS:  # d.pause_button, d.ack, ... as the dashboard's own
            setattr(self, name, getattr(self.controls, name))
        self.box = widgets.VBox([self.header, self.bar, self.controls.box, self.controls.ack, self.decisions,
                                 self.events, self.figure, self.table])
        self.template = None
        self._follow_theme()
        self._listen_for_theme()
        # the cell's display of the box, replaced by the static figure at the end (the box lives on in tabs)
        self.handle = display(self.box) if display is not None else show(self.box, display_id=True)

    # -- figure ------------------------------------------------------------------------------
    def _empty_figure(self) -> go.Figure:
        rows = max(1, (len(self.panels) + 1) // 2)
        figure = make_subplots(rows=rows, cols=2 if len(self.panels) > 1 else 1, horizontal_spacing=0.15,
                               subplot_titles=[p.title for p in self.panels], vertical_spacing=0.2)
        for i, panel in enumerate(self.panels):
            row, col = divmod(i, 2)
            for k in self.workers:
                colour = COLOURS[k % len(COLOURS)]  # one colour per node in every panel
                trace = (go.Histogram(name=f"worker {k}", legendgroup=str(k), showlegend=False, opacity=0.6,
                                      marker_color=colour) if panel.histogram else
                         go.Scatter(name=f"worker {k}", legendgroup=str(k), showlegend=i == 0, mode="lines",
                                    line_color=colour))
                figure.add_trace(trace, row=row + 1, col=col + 1)
            figure.update_xaxes(title_text=panel.x_title(self.run.clock), title_font_size=AXIS_TITLE_PX,
                                row=row + 1, col=col + 1)
            figure.update_yaxes(title_text="pushes" if panel.histogram else panel.y_title,
                                title_font_size=AXIS_TITLE_PX, row=row + 1, col=col + 1)
        figure.add_trace(go.Scatter(name="global loss (mean of nodes)", mode="lines",
                                    line={"color": "black", "dash": "dash"}), row=1, col=1)
        figure.add_trace(go.Scatter(name="validation loss (epoch ends)", mode="markers",
                                    marker={"color": "black", "symbol": "x"}), row=1, col=1)
        figure.update_layout(height=260 * rows + 80, margin={"t": 40, "b": 30, "l": 60, "r": 20}, barmode="overlay",
                             legend={"orientation": "h"})
        return figure

    def trace(self, panel: str, worker: int):
        """The figure trace of `worker` in `panel`."""
        index = [p.name for p in self.panels].index(panel)
        return self.figure.data[index * len(self.workers) + worker]

    # -- controls --------------------------------------------------------------------------
    def act(self, action: str, value=None) -> list[dict]:
        """What a control button does: send it, then show the acknowledgement (or why not)."""
        try:
            acks = self.run.control(action, value)
        except NbdistError as exc:
            self.controls.ack.value = f"<span style='color:#b00'>{html.escape(action)}: {html.escape(str(exc))}</span>"
            return []
        state = acks[0] if acks else {}
        when = datetime.datetime.now().strftime("%H:%M:%S")
        shown = ", ".join(f"{k.replace('_', ' ')} {state[k]}" for k in ACK_FIELDS if k in state)
        source = "the control bus" if REGISTRY[self.run.strategy].uses_control_bus else f"{len(acks)} shard(s)"
        self.controls.ack.value = (f"<b>{html.escape(action)}{'' if value is None else ' ' + html.escape(str(value))}"
                                   f"</b> acknowledged by {source} at {when}: {html.escape(shown)}")
        return acks

    # -- updates ---------------------------------------------------------------------------
    def __call__(self, run) -> None:
        now = time.time()
        if now - self.last_t < REFRESH_S:
            return
        self.last_t = now
        self._take_newcomers(run)
        self._take_records(run)
        self._take_pushes(run)
        self._draw(run, now)

    def _take_newcomers(self, run) -> None:
        """Workers that joined the run since the last refresh: their traces (the figure laid out again with
        them), table rows and evict choice."""
        if len(run.workers) <= len(self.workers):
            return
        self.workers = list(range(len(run.workers)))
        for panel in self.panels:
            for k in self.workers:
                self.series.setdefault((panel.name, k), Series())
        fresh = self._empty_figure()
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(list(fresh.data))
        self.template = None  # the overall traces take the theme's ink again
        self.controls.evict_choice.options = [(f"worker {k}", k) for k in self.workers]

    def _take_records(self, run) -> None:
        rank_of = {eid: k for k, eid in enumerate(run.workers)}
        for eid, latest in list(run.progress.items()):
            record = latest.get("record") or {}
            k, t = rank_of.get(eid), record.get("t")
            if k is None or t is None or t <= self.last_seen.get(k, 0):
                continue
            self.last_seen[k] = t
            if k == 0 and record.get("epoch") is not None:
                self.epoch_t[record["epoch"]] = t
            x = round(t - (run.started_at or self.started), 2)
            for panel in self.panels:
                if panel.source == "records":
                    self.series[(panel.name, k)].add(x, record.get(panel.field))
            latest_losses = [self.series[("loss", j)].y[-1] for j in self.workers if self.series[("loss", j)].y]
            if record.get("loss") is not None:
                self.overall["global loss"].add(x, statistics.mean(latest_losses))
            if latest.get("epoch_end"):
                self.overall["validation loss"].add(x, (latest.get("logs") or {}).get("val_loss"))

    def _take_pushes(self, run) -> None:
        from ..run import log_rows

        controller = run.controller
        telemetry = controller.telemetry() if controller is not None else {}
        for row in log_rows(telemetry.get("log_fields") or (), telemetry.get("log", [])):
            k = row["worker"]
            if k not in self.workers or row["staleness"] is None:
                continue
            x = round(row["t"] if run.clock == "virtual" else row["t"] - (run.started_at or self.started), 2)
            for panel in self.panels:
                if panel.source == "pushes":
                    self.series[(panel.name, k)].add(x, row.get(panel.field))
        if telemetry.get("control"):
            self.control_state = telemetry["control"][0]

    def _listen_for_theme(self) -> None:
        """An ended dashboard no longer redraws: a theme change reaches it from the session."""
        from ..session import get_session

        session = get_session()
        if session is not None:
            session.listeners.append(lambda what: self._follow_theme() if what == "theme" else None)

    def _follow_theme(self) -> None:
        """Plotly's dark or light template, as JupyterLab's theme is (the extension tells the kernel)."""
        from ..session import get_session

        dark = getattr(get_session(), "theme", "light") == "dark"
        template = "plotly_dark" if dark else "plotly_white"
        if template != self.template:
            self.template = template
            ink = "white" if dark else "black"
            with self.figure.batch_update():
                self.figure.layout.template = template
                first = len(self.panels) * len(self.workers)
                self.figure.data[first].line.color = ink  # the global loss and validation marks
                self.figure.data[first + 1].marker.color = ink

    def _draw(self, run, now: float) -> None:
        self._follow_theme()
        with self.figure.batch_update():
            for (name, k), series in self.series.items():
                trace = self.trace(name, k)
                if trace.type == "histogram":
                    trace.x = series.y
                else:
                    trace.x, trace.y = series.x, series.y
            for i, series in enumerate(self.overall.values()):
                trace = self.figure.data[len(self.panels) * len(self.workers) + i]
                trace.x, trace.y = series.x, series.y
        self.header.value = self._header(run, now)
        self.table.value = self._node_table(run, now)
        shown = "decisions" in self.reports.panels
        lines = REGISTRY[run.strategy].decision_lines(run)[-DECISIONS_SHOWN:] if shown else []
        self.decisions.value = ("<b>decisions</b><pre style='margin:0'>" + html.escape("\n".join(lines)) + "</pre>"
                                if lines else "")
        happened = run.event_lines()
        self.events.value = ("<b>events</b><ul style='margin:0'>" + "".join(f"<li>{html.escape(line)}</li>"
                                                                           for line in happened) + "</ul>"
                             if happened else "")

    def _header(self, run, now: float) -> str:
        done = run.progress_fraction or 0.0
        self.bar.value = done
        unit = "virtual s" if run.clock == "virtual" else "s"
        if run.clock == "virtual":  # the latest record's virtual time, not the wall clock
            latest_t = max((p.get("record") or {}).get("t") or 0 for p in run.progress.values()) if run.progress else 0
            elapsed = max(0.0, latest_t - (run.started_at or self.started))
        else:
            elapsed = (run.ended_at or now) - (run.started_at or self.started)
        title = f"<b>run {run.id}</b> · {html.escape(run.strategy)} on {len(run.workers)} worker(s)"
        if run.status not in ("pending", "running"):
            return f"{title} · {html.escape(ended_how(run))} · {elapsed:.1f} {unit} in all{self._planned(run, unit)}"
        eta = f"{elapsed * (1 - done) / done:.0f} {unit}" if done > 0.02 else "-"
        latest = run.latest(0)
        record = latest.get("record") or {}
        state = self.control_state
        phase = ("paused" if state.get("paused") else "stopping" if state.get("finishing")
                 else record.get("phase") or "train")
        if latest.get("loop"):  # a loop of the cell's own: its steps so far (how many it makes is its own)
            rate = f" · {latest['steps_per_s']:.1f} steps/s" if latest.get("steps_per_s") else ""
            return f"{title} · phase <b>{phase}</b> · elapsed {elapsed:.0f} {unit} · step {record.get('step')}{rate}"
        return (f"{title} · phase <b>{phase}</b> · elapsed {elapsed:.0f} {unit} · ETA {eta} · {done:.0%}"
                + self._planned(run, unit))

    def _planned(self, run, unit: str) -> str:
        """For a run `--strategy auto` chose: the plan's seconds an epoch, and the measured ones after the first
        epoch (from the whole records once the run ended)."""
        from ...planner.calibrate import seconds_an_epoch, steady_epoch_s

        planned = run.options.get("planned_epoch_s")
        if not planned:
            return ""
        ended = run.status not in ("pending", "running")
        measured = (steady_epoch_s(run) if ended else None) or seconds_an_epoch(self.epoch_t)
        return f" · planned {planned:.3g} {unit} an epoch" + (
            f", measured {measured:.3g} ({measured / planned - 1:+.0%})" if measured else "")

    def _node_table(self, run, now: float) -> str:
        rates = {k: self.series[("throughput", k)].y[-1] for k in self.workers
                 if ("throughput", k) in self.series and self.series[("throughput", k)].y}
        median = statistics.median(rates.values()) if rates else None
        evicted = set(self.control_state.get("evicted") or [])  # acknowledged by a shard before the run knows
        rows = []
        for k, eid in enumerate(run.workers):
            latest = run.progress.get(eid) or {}
            state = run.worker_state(k)
            if state in ("running", "-") and k in evicted:
                state = "evicted"
            elif state == "running" and median and rates.get(k, median) < 0.5 * median:
                state = "slow"
            elif state == "-" and run.status not in ("pending", "running"):
                state = "done"
            seen = f"{now - self.last_seen[k]:.1f} s ago" if k in self.last_seen else "-"
            info = run.hosts.get(eid, {})
            rate = f"{rates[k]:,.0f}" if k in rates else "-"
            rows.append(f"<tr><td>{k}</td><td>{eid}</td><td>{html.escape(str(info.get('host', '')))}</td>"
                        f"<td>{html.escape(', '.join(info.get('gpus') or []) or '-')}</td>"
                        f"<td>{latest.get('batch_size') or '-'}</td><td>{rate}</td>"
                        f"<td>{state}</td><td>{seen}</td></tr>")
        total = f"{sum(rates.values()):,.0f}" if rates else "-"
        rows.append(f"<tr><td colspan='5'><b>all workers</b></td><td><b>{total}</b></td><td></td><td></td></tr>")
        return ("<table><tr><th>worker</th><th>engine</th><th>host</th><th>GPU</th><th>batch</th><th>samples/s</th>"
                "<th>state</th><th>last seen</th></tr>" + "".join(rows) + "</table>")

    def close(self) -> None:
        """The final state: last redraw, controls hidden (called where the run ends, any thread)."""
        try:
            self.last_t = 0.0
            self._take_records(self.run)
            self._draw(self.run, time.time())
        except Exception:  # the final redraw is cosmetic; the run's outcome is what matters
            pass
        self.controls.box.layout.display = "none"
        self.static = go.Figure(self.figure)
        # the header (how the run ended, its time) travels with the figure that replaces the widget
        title = html.unescape(re.sub(r"<[^>]+>", "", self.header.value))
        self.static.update_layout(title={"text": title, "x": 0, "font": {"size": 13}}, margin={"t": 80})

    def conclude(self) -> None:
        """In the cell that waits for the run: the dashboard gives way to a static figure, which a saved
        notebook keeps (plotly's own mimetype, no widget state needed). The widget itself stays, with its
        final figures, for a dashboard tab opened from the sidebar."""
        import plotly.io as pio
        from IPython.display import display

        if hasattr(self.handle, "update"):  # plotly's own display ignores display ids: send its mimetype
            bundle = pio.renderers["plotly_mimetype"].to_mimebundle(self.static.to_dict())
            self.handle.update({**bundle, "text/plain": f"<run {self.run.id}: final figure>"}, raw=True)
        else:
            display(self.static)


def ended_how(run) -> str:
    """How an ended run ended, in words: done, stopped at epoch e of E, interrupted, or failed and why."""
    if run.status == "failed":
        return f"failed: {run.error}"
    if run.status == "interrupted":
        return "interrupted"
    epochs = run.latest(0).get("epochs")  # what the fit asked for; the History says how far it got (the
    # last progress message may still be on its way when the result is in)
    done = len(next(iter(run.history.values()), []))
    return f"stopped at epoch {done} of {epochs}" if epochs and done and done < epochs else "done"
