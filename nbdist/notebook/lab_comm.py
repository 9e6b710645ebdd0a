"""The JupyterLab sidebar's channel: comm target `nbdist`, state pushed from the kernel, actions taken.

Messages, kernel to front end: `state` (see `lab_state.snapshot`), `hello` (the data of the comm this
kernel opens when `%load_ext nbdist` runs), `ack` (the answer to `stop`) and `dashboard` (the answer
to `show_dashboard`). Front end to kernel: `{"action": "request_state" | "stop" | "show_dashboard",
"run": id}` and `{"action": "theme", "dark": bool}` (JupyterLab's theme, which the dashboards follow). A comm is live once its front end has asked for the state; only live comms get pushes,
so a kernel run by nbconvert or nbval sends nothing after its one `hello`.
"""

from __future__ import annotations

import logging
import threading

from . import lab_state

TARGET = "nbdist"
MIN_INTERVAL_S = 0.5  # at most two state messages a second while runs report progress
CHECK_S = 5.0  # without news, the state is re-read this often (an engine that died between runs)
log = logging.getLogger("nbdist")


class LabChannel:
    """Pushes a Session's state to every connected sidebar and carries out the sidebar's actions."""

    def __init__(self, session):
        self.session = session
        self.sparklines = lab_state.Sparklines()
        self._live: set = set()
        self._lock = threading.Lock()  # snapshots are taken in the publisher thread and in comm handlers
        self._dirty = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._announce = None

    def start(self) -> "LabChannel":
        """Register the comm target, announce this kernel to front ends, start pushing on changes."""
        import comm

        if self._thread is not None:
            return self
        comm.get_comm_manager().register_target(TARGET, self._on_open)
        self.session.listeners.append(self._on_change)
        self._thread = threading.Thread(target=self._publish_loop, name="nbdist-lab-publisher", daemon=True)
        self._thread.start()
        # A front end that registered the target answers with request_state; others just drop it.
        self._announce = comm.create_comm(target_name=TARGET, data={"type": "hello",
                                                                      "schema": lab_state.SCHEMA_VERSION})
        self._listen(self._announce)
        return self

    def stop(self) -> None:
        """Unregister, close every comm and end the publisher. Idempotent."""
        import comm

        if self._thread is None:
            return
        self._stopped.set()
        self._dirty.set()
        self._thread.join(timeout=2 * MIN_INTERVAL_S)
        self._thread = None
        if self._on_change in self.session.listeners:
            self.session.listeners.remove(self._on_change)
        comm.get_comm_manager().unregister_target(TARGET, self._on_open)
        for channel in {*self._live, self._announce} - {None}:
            channel.close()
        self._live.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- comms ---------------------------------------------------------------------------
    def _on_open(self, channel, open_msg) -> None:
        """A front end opened a comm to the target (a page reload, a second view): answer with the state."""
        self._listen(channel)
        self._go_live(channel)

    def _listen(self, channel) -> None:
        channel.on_msg(lambda msg: self.handle(channel, msg["content"]["data"]))
        channel.on_close(lambda msg: self._live.discard(channel))

    def _go_live(self, channel) -> None:
        self._live.add(channel)
        channel.send(lab_state.stamp(self._snapshot()))

    def handle(self, channel, data: dict) -> None:
        """One message from a front end."""
        action, run_id = data.get("action"), data.get("run")
        if action == "request_state":
            self._go_live(channel)
        elif action == "stop":
            channel.send({"type": "ack", "action": "stop", "run": run_id, **self._stop_run(run_id)})
        elif action == "show_dashboard":
            channel.send({"type": "dashboard", "run": run_id, **self._dashboard(run_id)})
        elif action == "theme":  # the dashboards' plots follow JupyterLab's theme; nothing to answer
            self.session.theme = "dark" if data.get("dark") else "light"
            self.session.changed("theme")
        else:
            channel.send({"type": "ack", "action": action, "run": run_id, "ok": False,
                          "message": f"unknown action {action!r}"})

    # -- actions -------------------------------------------------------------------------
    def _find(self, run_id):
        return next((run for run in self.session.runs if run.id == run_id), None)

    def _stop_run(self, run_id) -> dict:
        """Graceful stop through the strategy's controls (weights kept); without them, as an interrupt."""
        run = self._find(run_id)
        if run is None or run.status != "running":
            return {"ok": False, "message": f"run {run_id} is {run.status if run else 'unknown'}; nothing to stop"}
        message = run.stop()
        self._on_change("stop")
        return {"ok": True, "message": message}

    def _dashboard(self, run_id) -> dict:
        """The dashboard's widget id, live or ended (it keeps the final figures); without one, the run's cell."""
        run = self._find(run_id)
        if run is None:
            return {"model_id": None, "cell_id": None, "message": f"no run {run_id} in this kernel"}
        box = getattr(run.display, "box", None)
        live = box is not None and getattr(box, "comm", None) is not None
        message = "" if live or run.cell_id else f"run {run_id} has no dashboard (it ran with text progress)"
        return {"model_id": box.model_id if live else None, "cell_id": run.cell_id, "message": message}

    # -- pushing -------------------------------------------------------------------------
    def _on_change(self, what: str = "") -> None:
        self._dirty.set()

    def _snapshot(self) -> dict:
        with self._lock:
            return lab_state.snapshot(self.session, self.sparklines)

    def _publish_loop(self) -> None:
        last = None
        while not self._stopped.is_set():
            self._dirty.wait(CHECK_S)
            self._dirty.clear()
            if self._stopped.is_set():
                break
            if self._live:
                try:
                    state = self._snapshot()
                    if state != last:
                        last = state
                        for channel in list(self._live):
                            channel.send(lab_state.stamp(state))
                except Exception:  # never let the sidebar take the kernel's thread down
                    log.exception("nbdist: could not push the sidebar state")
            self._stopped.wait(MIN_INTERVAL_S)
