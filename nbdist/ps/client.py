"""Talking to the parameter-server shards: one request to every shard at once, bounded waits.

A request may legitimately wait long (the staleness bound holds a fast worker back), so
"the PS is gone" is decided by a separate heartbeat: each shard must answer a ping at
least every `ps_timeout_s`, or the request fails with `PsUnavailable`.
"""

from __future__ import annotations

import os
import secrets
import threading
import time

import numpy as np
import zmq

from ..errors import NbdistError
from ..limits import LIMITS
from . import same_host, wire

PING_INTERVAL_S = 0.5
BYE_WAIT_MS = 1000  # how long a closing client waits for its shard to take its bye (it answers in microseconds)


class PsUnavailable(NbdistError):
    """A parameter-server shard stopped answering (its process died or its host is unreachable)."""


class PsRefused(NbdistError):
    """A shard answered a request with `rejected` or `error`; `reason` is the shard's word for why."""

    def __init__(self, message: str, reason: str = "error"):
        super().__init__(message)
        self.reason = reason


class PsClient:
    """A worker's (or the kernel's) connection to every shard of one run.

    Args:
        addresses: ``tcp://host:port`` of each shard, in shard order.
        key: the run's HMAC key.
        worker: this worker's rank, or ``"controller"`` for the kernel.
        heartbeat: ping the shards from a background thread (workers: so the PS knows they
            live; everyone: so a dead PS is noticed while a request waits).
        local: take the same-host path to a shard on this host (`nbdist.ps.same_host`; default: unless
            ``NBDIST_PS_SAME_HOST=0``). The first request goes over TCP; a shard that finds itself on this
            host answers with its route, and later requests use it.
    """

    def __init__(self, addresses: list[str], key: bytes, worker, heartbeat: bool = True,
                 ps_timeout_s: float = LIMITS.ps_reply_s, local: bool | None = None):
        self.addresses, self.key, self.worker, self.ps_timeout_s = list(addresses), key, worker, ps_timeout_s
        self.context = zmq.Context()
        self.sockets = [self._connect(a) for a in self.addresses]
        self.host = same_host.host_facts() if (same_host.enabled() if local is None else local) else None
        self.local: list[_LocalRoute | None] = [None] * len(self.addresses)  # each shard's same-host route, once known
        self.last_answer = [time.time()] * len(self.addresses)
        self.incarnation = [0] * len(self.addresses)  # each shard's, as its pongs say (a restart counts it up)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.comm_s = 0.0
        self._stop = threading.Event()
        self.before_request = None  # called first by every request (an overlapped exchange settles)
        self.watch = None  # a worker's stall watch: `watch.waiting(kind, fields, per_shard, only)` around each request
        self._aborted = threading.Event()  # set from another thread: a waiting request gives up
        self._pinger = None
        if heartbeat:
            self._pinger = threading.Thread(target=self._ping_loop, name="nbdist-ps-heartbeat", daemon=True)
            self._pinger.start()

    def _connect(self, address: str):
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(address)
        return socket

    def request(self, kind: str, per_shard: list[dict] | None = None, fields_per_shard: list[dict] | None = None,
                only: int | None = None, **fields) -> list[wire.Message]:
        """Send `kind` to every shard (or to shard `only`) with arrays `per_shard[i]`, header fields
        `fields_per_shard[i]` and `fields`, and wait for every answer."""
        if self.watch is None:
            return self._request(kind, per_shard, fields_per_shard, only, **fields)
        with self.watch.waiting(kind, fields, fields_per_shard, only):
            return self._request(kind, per_shard, fields_per_shard, only, **fields)

    def _request(self, kind: str, per_shard: list[dict] | None, fields_per_shard: list[dict] | None,
                 only: int | None, **fields) -> list[wire.Message]:
        if self.before_request is not None:
            self.before_request()
        started = time.time()
        targets = range(len(self.sockets)) if only is None else [only]
        sent_to: dict[int, int] = {}  # shard -> the incarnation the request went to

        def send(i: int) -> None:
            own = fields_per_shard[i] if fields_per_shard else {}
            arrays, local = per_shard[i] if per_shard else None, self.local[i]
            if local is not None:
                frames = wire.encode(self.key, kind, arrays, outbox=local.outbox, worker=self.worker,
                                     same_host=1, **fields, **own)
                self.bytes_sent += sum(np.asarray(a).nbytes for a in (arrays or {}).values())
            else:
                route = {"host": self.host} if self.host is not None else {}
                frames = wire.encode(self.key, kind, arrays, worker=self.worker, **route, **fields, **own)
            self.bytes_sent += sum(len(f) for f in frames)
            sent_to[i] = self.incarnation[i]
            self.sockets[i].send_multipart(frames, copy=len(frames) < 3)

        for i in targets:
            send(i)
        replies: dict[int, wire.Message | None] = {i: None for i in targets}
        poller = zmq.Poller()
        for i in targets:
            poller.register(self.sockets[i], zmq.POLLIN)
        while any(r is None for r in replies.values()):
            if self._aborted.is_set():
                raise PsUnavailable(f"the {kind} was abandoned: the fit that sent it ended")
            ready = dict(poller.poll(250))
            for i in targets:
                if ready.get(self.sockets[i]):
                    frames = self.sockets[i].recv_multipart(copy=False)
                    self.bytes_received += sum(len(f) for f in frames)
                    replies[i] = self._decode(i, frames)
                    self.last_answer[i] = time.time()
                    if replies[i].kind == "rejected" and replies[i].header.get("reason") == "restarting":
                        replies[i] = None  # sent before the shard died, reached its successor: resent below
                elif replies[i] is None and (self.incarnation[i] != sent_to[i] or self._route_gone(i)):
                    self._reconnect(i, poller)
                    send(i)
            self._check_alive(replies)
        self.comm_s += time.time() - started
        for i, message in replies.items():
            if self.local[i] is None and message.header.get("route"):
                self._go_local(i, message.header["route"])
        for i, message in replies.items():  # only once every shard answered: no reply is left queued
            if message.kind in ("rejected", "error"):
                header = message.header
                raise PsRefused(f"parameter-server shard {i} refused the {kind}: "
                                f"{header.get('detail') or header.get('message') or header.get('reason')}",
                                header.get("reason", "error"))
        return list(replies.values())

    def _decode(self, i: int, frames) -> wire.Message:
        local = self.local[i]
        if local is None:
            return wire.decode(self.key, frames)
        message = wire.decode(self.key, frames, inbox=local.inbox)
        if "shm" in message.header:  # copied out now: the shard rewrites its outbox once the next request is sent
            message.arrays = {name: np.array(array) for name, array in message.arrays.items()}
            self.bytes_received += sum(array.nbytes for array in message.arrays.values())
        return message

    def _go_local(self, i: int, route: dict) -> None:
        """Ask shard `i` over its Unix socket and through shared memory from now on (it runs on this host)."""
        if not (isinstance(route.get("ipc"), str) and route["ipc"].startswith("ipc://")
                and isinstance(route.get("prefix"), str)):
            return
        self.sockets[i].close(linger=0)
        self.sockets[i] = self._connect(route["ipc"])
        owner = f"w{self.worker}" if isinstance(self.worker, int) else "k"
        self.local[i] = _LocalRoute(route["ipc"][len("ipc://"):],
                                    same_host.Outbox(route["prefix"], f"{owner}-{secrets.token_hex(4)}"),
                                    same_host.Inbox(route["prefix"]))

    def _route_gone(self, i: int) -> bool:
        """Whether shard `i`'s Unix socket was removed: the shard died and was reaped (a successor, if any,
        listens on the TCP address)."""
        return self.local[i] is not None and not os.path.exists(self.local[i].path)

    def _reconnect(self, i: int, poller) -> None:
        """Shard `i` was restarted from a checkpoint: its successor is asked on a socket of its own, so an
        answer to the first request (had that reached the successor too) goes nowhere. Over TCP: a same-host
        route is learnt anew, the successor's."""
        poller.unregister(self.sockets[i])
        self.sockets[i].close(linger=0)
        self._drop_local(i)
        self.sockets[i] = self._connect(self.addresses[i])
        poller.register(self.sockets[i], zmq.POLLIN)

    def _drop_local(self, i: int, bye: bool = False) -> None:
        """Forget shard `i`'s same-host route; `bye`: tell the shard first, so it lets go of what this client
        used (its reply outbox, this client's segment) before the shard's run ends."""
        if self.local[i] is None:
            return
        if bye and not self._route_gone(i):  # answered, so that no later message of this thread overtakes it
            self.sockets[i].send_multipart(wire.encode(self.key, "bye", worker=self.worker, same_host=1))
            if self.sockets[i].poll(BYE_WAIT_MS):
                self.sockets[i].recv_multipart()
        self.local[i].close()
        self.local[i] = None

    def _check_alive(self, replies: dict) -> None:
        now = time.time()
        for i, reply in replies.items():
            if reply is None and now - self.last_answer[i] > self.ps_timeout_s:
                raise PsUnavailable(f"parameter-server shard {i} at {self.addresses[i]} has not answered for "
                                    f"{now - self.last_answer[i]:.0f} s; its process died or its host is unreachable.")

    def _ping_loop(self) -> None:
        sockets = [self._connect(a) for a in self.addresses]
        try:
            while not self._stop.wait(PING_INTERVAL_S):
                for i, socket in enumerate(sockets):
                    while socket.poll(0):
                        pong = wire.decode(self.key, socket.recv_multipart())
                        self.incarnation[i] = max(self.incarnation[i], int(pong.header.get("incarnation") or 0))
                        self.last_answer[i] = time.time()
                    socket.send_multipart(wire.encode(self.key, "heartbeat", worker=self.worker))
        finally:
            for socket in sockets:
                socket.close(linger=0)

    @property
    def aborted(self) -> bool:
        """Whether `abort` was called (the fit that uses this client ended)."""
        return self._aborted.is_set()

    def abort(self) -> None:
        """Make a request waiting in another thread give up (within 250 ms) and every later one fail."""
        self._aborted.set()

    def close(self) -> None:
        self._stop.set()
        if self._pinger is not None:
            self._pinger.join(timeout=2)
        for i in range(len(self.local)):
            self._drop_local(i, bye=True)
        for socket in self.sockets:
            socket.close(linger=0)
        self.context.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _LocalRoute:
    """A client's same-host ends with one shard: the shard's socket file, the client's outbox for requests, the
    shard's replies it has opened."""

    def __init__(self, path: str, outbox: same_host.Outbox, inbox: same_host.Inbox):
        self.path, self.outbox, self.inbox = path, outbox, inbox

    def close(self) -> None:
        self.outbox.close()
        self.inbox.close()


def merged(replies: list[wire.Message]) -> dict[str, np.ndarray]:
    """The arrays of every shard's reply, in one dict."""
    arrays: dict[str, np.ndarray] = {}
    for reply in replies:
        arrays.update(reply.arrays)
    return arrays
