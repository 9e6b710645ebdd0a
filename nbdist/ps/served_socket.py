"""A kernel-side socket bound to a free port and the daemon thread that serves it, until `stop`."""

from __future__ import annotations

import threading


class ServedSocket:
    """Base of the kernel's small services (the control bus, the parts desk): `_serve_on` binds and starts the
    thread, which runs until `_stopped` is set; `stop` ends both and is idempotent."""

    def __init__(self):
        self.address: str | None = None
        self._stopped = threading.Event()
        self._socket = self._context = self._thread = None

    def _serve_on(self, bind: str, socket_type: int, serve, name: str) -> str:
        import zmq

        self._context = zmq.Context()
        self._socket = self._context.socket(socket_type)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{bind}")
        self.address = f"tcp://{bind}:{port}"
        self._thread = threading.Thread(target=serve, name=name, daemon=True)
        self._thread.start()
        return self.address

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._socket is not None:
            self._socket.close(linger=0)
            self._context.term()
        self._socket = self._context = self._thread = None
