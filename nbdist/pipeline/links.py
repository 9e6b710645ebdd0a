"""The pipeline's sockets: the kernel's address book, and each stage's links to its neighbours.

Every stage binds one PULL socket (its inbox) and PUSHes to its neighbours' inboxes. The
kernel's `AddressBook` (a ROUTER) tells every stage where the others listen once all have
said hello, and hands them the split stage 0 chose; then each stage fetches from it the notebook's
values of the variables its stage owns (`fetch_part`), so no engine receives the whole model. Every
message is a signed wire message (`nbdist.ps.wire`): a JSON header and raw array buffers, sent
without copying; nothing is unpickled. Waits are bounded: a stage that hears nothing from a neighbour for `silence_s`
(not counting time paused) fails, naming that neighbour.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import ClusterError
from ..limits import LIMITS
from ..ps import wire

POLL_MS = 200
FLUSH_MS = 5000  # a closing stage's sends get this long to leave (a dead neighbour does not hold it longer)


class AddressBook:
    """Kernel side: collects every stage's hello, then answers all with the addresses and the split; serves
    each stage its part of the notebook's models (`models`: {name: `ModelState`})."""

    def __init__(self, workers: int, key: bytes, models: dict | None = None):
        self.workers, self.key, self.models = workers, key, models or {}
        self.address: str | None = None
        self._stop = threading.Event()
        self._thread = self._socket = self._context = None

    def start(self, bind: str) -> str:
        import zmq

        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{bind}")
        self.address = f"tcp://{bind}:{port}"
        self._thread = threading.Thread(target=self._serve, name="nbdist-pipeline-book", daemon=True)
        self._thread.start()
        return self.address

    def _serve(self) -> None:
        hellos: dict[int, tuple[bytes, dict]] = {}
        while not self._stop.is_set():
            if not self._socket.poll(POLL_MS):
                continue
            ident, *frames = self._socket.recv_multipart()
            try:
                header = wire.decode(self.key, frames).header
                if header["kind"] == "part":
                    self._socket.send_multipart([ident, *self._part(header)])
                    continue
                hellos[int(header["stage"])] = (ident, header)
            except (wire.Rejected, KeyError, ValueError):
                continue  # not from this run's stages: never acted on
            if len(hellos) == self.workers:
                reply = wire.encode(self.key, "peers", addresses=[hellos[s][1]["address"] for s in range(self.workers)],
                                    split=hellos[0][1].get("split"))
                for ident_, _ in hellos.values():
                    self._socket.send_multipart([ident_, *reply])
                hellos = {}  # a second fit of the cell says hello again

    def _part(self, header: dict) -> list:
        state = self.models.get(header["model"])
        if state is None or state.architecture != header["architecture"]:  # one the cell made itself
            return wire.encode(self.key, "part", held=False)
        weights, optimizer = state.part(header["weights"], header["trainable"], int(header["prefix"]))
        arrays = {f"w{i}": w for i, w in enumerate(weights)}
        arrays.update({f"o{i}": o for i, o in enumerate(optimizer or [])})
        return wire.encode(self.key, "part", arrays, held=True, optimizer=len(optimizer or []) if optimizer else None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._socket is not None:
            self._socket.close(linger=0)
            self._context.term()
        self._socket = self._context = self._thread = None


class StageLinks:
    """One stage's inbox and its sends to the stages before and after it."""

    def __init__(self, spec: dict, rank: int, engines: list[int], paused=lambda: False):
        import zmq

        from ..netroute import local_ip_towards

        self.key = bytes.fromhex(spec["key"])
        self.rank, self.engines, self.paused = rank, engines, paused
        self.silence_s = float(spec.get("silence_s", LIMITS.stage_silence_s))
        self._context = zmq.Context()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.setsockopt(zmq.LINGER, 0)
        host = local_ip_towards(spec["book"].split("//")[1].rsplit(":", 1)[0])
        self.address = f"tcp://{host}:{self._inbox.bind_to_random_port(f'tcp://{host}')}"
        self._book_address = spec["book"]
        self._out: dict[int, object] = {}
        self._pending: dict[tuple, wire.Message] = {}
        self.bytes_sent = 0
        self.rejected = 0

    def join(self, targets: list[int], split=None, timeout_s: float = 120.0):
        """Say hello to the kernel's address book and connect to the ranks `targets`; returns the split
        rank 0 chose, once every worker is in."""
        import zmq

        book = self._context.socket(zmq.DEALER)
        book.setsockopt(zmq.LINGER, 0)
        book.connect(self._book_address)
        try:
            book.send_multipart(wire.encode(self.key, "hello", stage=self.rank, address=self.address, split=split))
            if not book.poll(int(timeout_s * 1000)):
                raise ClusterError(f"pipeline rank {self.rank} (engine {self.engines[self.rank]}): the other workers "
                                   f"did not all start within {timeout_s:.0f} s.")
            peers = wire.decode(self.key, book.recv_multipart()).header
        finally:
            book.close(linger=0)
        for target in targets:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, FLUSH_MS)  # the last step's logs must still reach the stage before
            sock.connect(peers["addresses"][target])
            self._out[target] = sock
        return peers["split"]

    def fetch_part(self, model: str, architecture: str, weights: list[int], trainable: list[int], prefix: int,
                   timeout_s: float = 120.0) -> tuple[list | None, list | None]:
        """The notebook's values of model `model`'s weights at `weights` and of its optimizer's variables for the
        trainable variables at `trainable` (see `ModelState.part`); (None, None) where the notebook does not hold
        the model, the optimizer's None where it was not built."""
        import zmq

        book = self._context.socket(zmq.DEALER)
        book.setsockopt(zmq.LINGER, 0)
        book.connect(self._book_address)
        try:
            book.send_multipart(wire.encode(self.key, "part", model=model, architecture=architecture, weights=weights,
                                            trainable=trainable, prefix=prefix, stage=self.rank))
            if not book.poll(int(timeout_s * 1000)):
                raise ClusterError(f"pipeline rank {self.rank} (engine {self.engines[self.rank]}): the notebook did not "
                                   f"send this stage's weights within {timeout_s:.0f} s.")
            reply = wire.decode(self.key, book.recv_multipart(copy=False), max_bytes=1 << 40)  # (a part may be large)
        finally:
            book.close(linger=0)
        if not reply.header["held"]:
            return None, None
        count = reply.header["optimizer"]
        return ([reply.arrays[f"w{i}"] for i in range(len(weights))],
                [reply.arrays[f"o{i}"] for i in range(count)] if count else None)

    def send(self, to: int, kind: str, step: int, micro: int, array: np.ndarray | None = None,
             arrays: dict | None = None, **fields) -> None:
        """Send `array` (an activation or its gradient), `arrays`, or a bare message to rank `to`."""
        arrays = {"t": array} if array is not None else arrays
        frames = wire.encode(self.key, kind, arrays, step=step, m=micro, stage=self.rank, **fields)
        self.bytes_sent += sum(len(f) for f in frames)
        self._out[to].send_multipart(frames, copy=len(frames) < 3)

    def receive(self, kind: str, step: int, micro: int, source: int) -> wire.Message:
        """The message `kind` of this step and micro-batch (or replica) from rank `source`, waiting
        (bounded) for it."""
        import zmq

        want = (kind, step, micro)
        heard = time.monotonic()
        while want not in self._pending:
            if self._inbox.poll(POLL_MS):
                try:
                    message = wire.decode(self.key, self._inbox.recv_multipart(zmq.NOBLOCK, copy=False))
                except wire.Rejected:
                    self.rejected += 1  # not from this run's stages: counted, never used
                    continue
                header = message.header
                self._pending[(message.kind, header["step"], header["m"])] = message
                heard = time.monotonic()
            elif self.paused():
                heard = time.monotonic()  # a pause lasts as long as the user wants
            elif time.monotonic() - heard > self.silence_s:
                raise ClusterError(
                    f"pipeline rank {self.rank} (engine {self.engines[self.rank]}) heard nothing from rank "
                    f"{source} (engine {self.engines[source]}) for {self.silence_s:.0f} s while waiting for its "
                    f"{kind} of micro-batch {micro} at step {step}: that engine stopped or died.")
        return self._pending.pop(want)

    def close(self) -> None:
        for sock in self._out.values():
            sock.close()
        self._inbox.close(linger=0)
        self._context.term()
