"""The pipeline's sockets: the kernel's address book, and each stage's links to its neighbours.

Every stage binds one PULL socket (its inbox) and PUSHes to its neighbours' inboxes. The
kernel's `AddressBook` (a ROUTER) tells every stage where the others listen once all have
said hello, and hands them the split stage 0 chose; then each stage fetches from it the notebook's
values of the variables its stage owns (`fetch_part`), so no engine receives the whole model, and at the
end sends its trained part back the same way (`send_part`: no copy on the engine). Every
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
        self.trained: dict[tuple[int, int], tuple[list, list]] = {}  # (rank, fit) -> (weights, optimizer variables)
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
                header = wire.decode(self.key, frames, max_bytes=1 << 40).header  # (a stage's trained part is large)
                if header["kind"] == "part":
                    self._socket.send_multipart([ident, *self._part(header)])
                    continue
                if header["kind"] == "trained":
                    self._keep_trained(header, wire.decode(self.key, frames, max_bytes=1 << 40).arrays)
                    self._socket.send_multipart([ident, *wire.encode(self.key, "kept")])
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

    def _keep_trained(self, header: dict, arrays: dict) -> None:
        weights = [arrays[f"w{i}"] for i in range(int(header["weights"]))]
        optimizer = [arrays[f"o{i}"] for i in range(int(header["optimizer"]))]
        self.trained[(int(header["stage"]), int(header["fit"]))] = (weights, optimizer)

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

    def _ask_book(self, frames: list, waiting_for: str, timeout_s: float) -> wire.Message:
        """Send `frames` to the kernel's address book (without copying them) and return its signed answer, waiting
        at most `timeout_s` for it."""
        import zmq

        book = self._context.socket(zmq.DEALER)
        book.setsockopt(zmq.LINGER, 0)
        book.connect(self._book_address)
        try:
            book.send_multipart(frames, copy=False)
            if not book.poll(int(timeout_s * 1000)):
                raise ClusterError(f"pipeline rank {self.rank} (engine {self.engines[self.rank]}): {waiting_for} "
                                   f"within {timeout_s:.0f} s.")
            return wire.decode(self.key, book.recv_multipart(copy=False), max_bytes=1 << 40)  # (a part may be large)
        finally:
            book.close(linger=0)

    def join(self, targets: list[int], split=None, timeout_s: float = 120.0):
        """Say hello to the kernel's address book and connect to the ranks `targets`; returns the split
        rank 0 chose, once every worker is in."""
        import zmq

        peers = self._ask_book(wire.encode(self.key, "hello", stage=self.rank, address=self.address, split=split),
                               "the other workers did not all start", timeout_s).header
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
        reply = self._ask_book(wire.encode(self.key, "part", model=model, architecture=architecture, weights=weights,
                                           trainable=trainable, prefix=prefix, stage=self.rank),
                               "the notebook did not send this stage's weights", timeout_s)
        if not reply.header["held"]:
            return None, None
        count = reply.header["optimizer"]
        return ([reply.arrays[f"w{i}"] for i in range(len(weights))],
                [reply.arrays[f"o{i}"] for i in range(count)] if count else None)

    def send_part(self, fit: int, weights: list, optimizer: list, timeout_s: float = 120.0) -> None:
        """Send this stage's trained variables and optimizer variables of its `fit`-th fit to the kernel, without
        copying them; returns once the kernel has them."""
        arrays = {f"w{i}": w for i, w in enumerate(weights)}
        arrays.update({f"o{i}": o for i, o in enumerate(optimizer)})
        self._ask_book(wire.encode(self.key, "trained", arrays, stage=self.rank, fit=fit, weights=len(weights),
                                   optimizer=len(optimizer)),
                       "the notebook did not take this stage's trained weights", timeout_s)

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
