"""Live controls for strategies without a parameter server: pause, resume and stop, kernel to workers;
and, for an elastic `hfdt` run, the job the survivors of a dead rank re-form (`reform`).

The kernel publishes the whole control state on a ZeroMQ PUB socket, as signed wire messages
(`nbdist.ps.wire`), on every change and every half second (so a worker that connects late or
misses one learns it from the next). Each worker's `ControlPoint` polls its SUB socket between
train steps without waiting; under a synchronous strategy the ranks first agree on the flags
(they travel in the step's allreduce: `strategies.control_step`), so every rank pauses or stops
at the same step.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..ps import wire
from ..ps.served_socket import ServedSocket

REPEAT_S = 0.5
PAUSE_POLL_S = 0.05
PAUSED, STOP = 0, 1  # positions in the flags vector


class ControlBus(ServedSocket):
    """The kernel's side; `send` returns the new state (the acknowledgement). `stop()` is idempotent."""

    def __init__(self):
        super().__init__()
        self.key = wire.new_key()
        self.state = {"paused": False, "stop": False, "seq": 0, "reform": None}
        self._lock = threading.Lock()

    def start(self, bind: str) -> "ControlBus":
        import zmq

        self._serve_on(bind, zmq.PUB, self._repeat, "nbdist-control-bus")
        return self

    def send(self, action: str, value=None) -> dict:
        with self._lock:
            if action in ("pause", "resume"):
                self.state["paused"] = action == "pause"
            elif action == "stop":
                self.state.update(stop=True, paused=False)
            elif action == "reform":  # {"generation", "port", "slots": {original rank: Horovod slot}}
                self.state["reform"] = value
            self.state["seq"] += 1
            self._publish()
            return dict(self.state)

    def _publish(self) -> None:
        self._socket.send_multipart(wire.encode(self.key, "control", **self.state))

    def _repeat(self) -> None:
        while not self._stopped.wait(REPEAT_S):
            with self._lock:
                self._publish()

    def spec(self) -> dict:
        """What a worker needs to listen (its address and the key), JSON-able."""
        return {"address": self.address, "key": self.key.hex()}


class ControlPoint:
    """A worker's view of the bus, polled between (or, in a pipeline stage, inside) train steps. `stopped`
    ends the fit after the step."""

    def __init__(self, spec: dict):
        import zmq

        self.key = bytes.fromhex(spec["key"])
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(spec["address"])
        self.state = {"paused": False, "stop": False, "seq": -1, "reform": None}
        self.stopped = False

    def _poll(self) -> dict:
        import zmq

        while self._socket.poll(0):
            try:
                message = wire.decode(self.key, self._socket.recv_multipart(zmq.NOBLOCK))
            except wire.Rejected:
                continue  # not from this run's kernel: never acted on
            if message.header.get("seq", -1) >= self.state["seq"]:
                self.state = {k: message.header.get(k) for k in ("paused", "stop", "seq", "reform")}
        return self.state

    def flags(self) -> np.ndarray:
        """This worker's view, as numbers a collective can agree on: [paused, stop]."""
        state = self._poll()
        return np.array([float(bool(state["paused"])), float(bool(state["stop"]))], np.float32)

    def reform(self) -> dict | None:
        """The latest job the kernel re-formed for the survivors of a dead rank (None: none yet)."""
        return self._poll()["reform"]

    def act(self, agreed) -> np.ndarray:
        """Act on the flags every rank agreed on: wait while paused (until resumed or stopped), note a stop."""
        agreed = np.asarray(agreed)
        if agreed[STOP] > 0:
            self.stopped = True
        elif agreed[PAUSED] > 0:
            self.wait_while_paused()
            self.stopped = bool(self.state["stop"])
        return agreed

    def wait_while_paused(self) -> None:
        """Return once the bus says resume, or stop."""
        while self._poll()["paused"] and not self.state["stop"]:
            time.sleep(PAUSE_POLL_S)  # a pause lasts as long as the user wants; nothing waits on it

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
