"""The pipeline's sockets: the kernel's address book, and each stage's links to its neighbours.

Every stage binds one PULL socket (its inbox) and PUSHes to its neighbours' inboxes. The
kernel's `AddressBook` (a ROUTER) tells every stage where the others listen once all have
said hello, and hands them the split stage 0 chose; it is the run's `PartsDesk` too: each stage fetches from it
the notebook's values of the variables its stage owns, so no engine receives the whole model, and at the end
sends its trained part back the same way (no copy on the engine; `nbdist.model_parts.desk`). Every
message is a signed wire message (`nbdist.ps.wire`): a JSON header and raw array buffers, sent
without copying; nothing is unpickled. Waits are bounded: a stage that hears nothing from a neighbour for `silence_s`
(not counting time paused) fails, naming that neighbour.
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import ClusterError
from ...limits import LIMITS
from ..desk import DeskClient, PartsDesk
from ...ps import wire

POLL_MS = 200
FLUSH_MS = 5000  # a closing stage's sends get this long to leave (a dead neighbour does not hold it longer)


class AddressBook(PartsDesk):
    """Kernel side: collects every stage's hello, then answers all with the addresses and the split; serves
    each stage its part of the notebook's models and keeps the trained parts (`PartsDesk`)."""

    thread_name = "nbdist-pipeline-book"

    def __init__(self, workers: int, key: bytes, models: dict | None = None):
        super().__init__(key, models)
        self.workers = workers
        self._hellos: dict[int, tuple[bytes, dict]] = {}

    def other(self, ident: bytes, header: dict) -> None:
        if header["kind"] != "hello":
            raise KeyError(header["kind"])
        self._hellos[int(header["stage"])] = (ident, header)
        if len(self._hellos) == self.workers:
            hellos, self._hellos = self._hellos, {}  # a second fit of the cell says hello again
            reply = wire.encode(self.key, "peers", addresses=[hellos[s][1]["address"] for s in range(self.workers)],
                                split=hellos[0][1].get("split"))
            for ident_, _ in hellos.values():
                self.send(ident_, reply)


class StageLinks:
    """One stage's inbox and its sends to the stages before and after it."""

    def __init__(self, spec: dict, rank: int, engines: list[int], paused=lambda: False):
        import zmq

        from ...host.netroute import local_ip_towards

        self.key = bytes.fromhex(spec["key"])
        self.rank, self.engines, self.paused = rank, engines, paused
        self.silence_s = float(spec.get("silence_s", LIMITS.stage_silence_s))
        self._context = zmq.Context()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.setsockopt(zmq.LINGER, 0)
        host = local_ip_towards(spec["book"].split("//")[1].rsplit(":", 1)[0])
        self.address = f"tcp://{host}:{self._inbox.bind_to_random_port(f'tcp://{host}')}"
        self.desk = DeskClient(spec["book"], self.key, rank, f"pipeline rank {rank} (engine {engines[rank]})",
                               self._context)
        self._out: dict[int, object] = {}
        self._pending: dict[tuple, wire.Message] = {}
        self.bytes_sent = 0
        self.rejected = 0

    def join(self, targets: list[int], split=None, timeout_s: float = 120.0):
        """Say hello to the kernel's address book and connect to the ranks `targets`; returns the split
        rank 0 chose, once every worker is in."""
        import zmq

        peers = self.desk.ask(wire.encode(self.key, "hello", stage=self.rank, address=self.address, split=split),
                              "the other workers did not all start", timeout_s).header
        for target in targets:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, FLUSH_MS)  # the last step's logs must still reach the stage before
            sock.connect(peers["addresses"][target])
            self._out[target] = sock
        return peers["split"]

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
