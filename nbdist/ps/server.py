"""One parameter-server shard process: ``python -m nbdist.ps.server`` with a JSON config on stdin.

The per-run key comes in the config on stdin, so it never shows in a process list. The
process binds (TCP, and a Unix socket for clients on its host: `same_host`), prints
``READY <port>``, and answers `wire` messages (`nbdist.ps.shard.Shard` decides the replies)
until told to stop (SIGTERM included) or until whoever started it is gone; then it removes
its same-host files.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

from . import rules, same_host, wire
from .shard import Shard
from .tables import ShardTables
from .zero_copy import frames as reply_frames

POLL_MS = 200


def serve(config: dict, key: bytes, ready=print) -> None:
    """Bind, announce the port through `ready`, and answer messages until told to stop."""
    import zmq

    shard = ShardTables(config)
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 1000)
    port = _bind(socket, config)
    local = same_host.ShardEnd(socket) if same_host.enabled() and config.get("same_host", True) else None
    ready(f"READY {port}")
    parent = os.getppid()
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    replays = wire.ReplayGuard()
    inbox = local.inbox if local is not None else None

    def send(replies, route: tuple | None = None):
        """Send `replies`; `route`: (a client on this host that asked over TCP, how it reaches the shard here)."""
        for ident, kind, arrays, fields in replies:
            outbox = local.outbox(ident) if local is not None else None
            if route is not None and route[0] == ident:
                fields = {**fields, "route": route[1]}
            encoded = wire.encode(key, kind, arrays, outbox=outbox, **fields)
            if outbox is not None:  # the arrays were copied into the outbox: nothing holds them any more
                socket.send_multipart([ident, *encoded], copy=False)
                shard.shared.sent(list((arrays or {}).values()), [None] * len(arrays or {}))
                continue
            buffers, trackers = reply_frames(arrays, encoded[2:])
            socket.send_multipart([ident, *encoded[:2], *buffers], copy=False)
            shard.shared.sent(list((arrays or {}).values()), trackers)

    def answer(ident: bytes, body: list, message: wire.Message | None = None):
        try:
            if message is None:
                message = wire.decode(key, body, max_bytes=shard.max_bytes, inbox=inbox)
                replays.check(message.header)
                if local is not None:
                    local.received(ident, message.header)
                    if message.kind == "bye":  # a same-host client closes
                        local.bye(ident)
                        send([(ident, "ok", None, {})])
                        return
                if keras_import.defers(shard.table(message), ident, body, message):
                    return
            route = local.route(message.header) if local is not None else None
            send(shard.handle(ident, message), (ident, route) if route else None)
        except wire.Rejected as exc:
            shard.reject(exc.reason, str(exc), _claimed_worker(body))
            send([(ident, "rejected", None, {"reason": exc.reason, "detail": str(exc)[:300]})])
        except Exception as exc:  # noqa: BLE001 - one message the rules did not foresee must not end the run
            traceback.print_exc()
            shard.reject("internal_error", repr(exc), _claimed_worker(body))
            detail = (f"{repr(exc)[:200]}: a message nbdist's shard did not foresee (a bug; please report "
                      "it with the traceback in the shard's stderr log); the shard goes on serving")
            send([(ident, "rejected", None, {"reason": "internal_error", "detail": detail})])

    keras_import = KerasImport()
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))  # the loop ends within POLL_MS, cleaning up
    try:
        _loop(shard, socket, poller, answer, send, keras_import, parent, local, terminated)
    finally:
        shard.log.close()
        socket.close()
        context.term()
        if local is not None:
            local.close()


def _loop(shard: ShardTables, socket, poller, answer, send, keras_import: "KerasImport", parent: int,
          local: same_host.ShardEnd | None, terminated: list) -> None:
    """Answer what arrives, then what waited for Keras, then judge silence; until told to stop or orphaned."""
    reclaimed: set = set()
    while not shard.stopping and not terminated:
        if poller.poll(POLL_MS):
            received = socket.recv_multipart(copy=False)
            answer(received[0].bytes, received[1:])
        for deferred in keras_import.ready():
            answer(*deferred)
        if not poller.poll(0):  # every ping that reached us is read: a shard that was itself slow drops no one
            send(shard.check_heartbeats(time.time()))
            if local is not None:
                _reclaim(shard, local, reclaimed)
        if os.getppid() != parent:  # whoever started us is gone: do not linger as an orphan
            break


def _reclaim(shard: ShardTables, local: same_host.ShardEnd, reclaimed: set) -> None:
    """A worker dropped as dead leaves no segment behind (a newcomer or a restarted one speaks anew)."""
    for worker, state in shard.first.workers.items():
        if not state.alive and worker not in reclaimed:
            reclaimed.add(worker)
            local.reclaim(worker)


class KerasImport:
    """Importing Keras (and TensorFlow) and tracing a first step take seconds: 13 on a loaded 2-core machine,
    longer than a worker or the kernel waits for an answer. An `init` whose optimizer needs Keras waits while a
    thread does both (`keras_updater.warm_up`); the loop goes on answering pings and the kernel's monitor."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.waiting: list[tuple] = []

    def defers(self, shard: Shard, ident: bytes, body: list, message: wire.Message) -> bool:
        """Whether `message` waits for the import (started now if it has not been)."""
        if message.kind != "init":
            return False
        if self.thread is None:  # no import under way: start one if this init needs Keras and it is not there
            if "keras" in sys.modules or not _needs_keras(shard, message.header.get("optimizer") or {}):
                return False
            self.thread = threading.Thread(target=_warm_keras, daemon=True)
            self.thread.start()
        self.waiting.append((ident, body, message))
        return True

    def ready(self) -> list[tuple]:
        """The deferred messages, once the import ended (a failed import fails them as the loop would)."""
        if self.thread is None or self.thread.is_alive():
            return []
        waiting, self.waiting, self.thread = self.waiting, [], None
        return waiting


def _warm_keras() -> None:
    from .keras_updater import warm_up

    warm_up()


def _needs_keras(shard: Shard, optimizer: dict) -> bool:
    return (optimizer.get("name") == rules.KERAS or optimizer.get("schedule") is not None
            or shard.optimizer_backend == "keras")


def _bind(socket, config: dict) -> int:
    """Bind to the configured port (a restarted shard takes its predecessor's: workers reconnect by
    themselves) or to a free one; the port."""
    address = f"tcp://{config.get('bind', '127.0.0.1')}"
    if config.get("port"):
        socket.bind(f"{address}:{int(config['port'])}")
        return int(config["port"])
    return socket.bind_to_random_port(address)


def _claimed_worker(frames):
    try:
        return json.loads(bytes(frames[0].buffer if hasattr(frames[0], "buffer") else frames[0])).get("worker")
    except Exception:  # the claim of a malformed message is only for the log
        return None


def main() -> None:
    config = json.loads(sys.stdin.readline())
    key = bytes.fromhex(config.pop("key"))
    serve(config, key, ready=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
