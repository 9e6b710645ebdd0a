"""Horovod's Gloo rendezvous, run by the notebook kernel; the ranks' arrival at each Horovod job; and the host plan
from the engine inventory."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

from ..errors import ClusterError
from ..limits import LIMITS


def require_horovod():
    """Import Horovod's runner pieces, or say how to install it."""
    try:
        from horovod.runner.common.util import hosts
        from horovod.runner.http import http_server
    except ImportError as exc:
        raise ClusterError(
            f"--strategy hfdt needs Horovod in the notebook's environment ({exc}). "
            "Install it with `python -m nbdist.horovod install` (builds Horovod 0.28.1 once and caches the wheel)."
        ) from None
    return hosts, http_server


def host_plan(hostnames: list[str]):
    """Horovod slot assignments for workers on these hosts (one entry per worker, in worker order).

    Returns:
        (order, slots): `order[rank]` is the index into `hostnames` of the worker given that
        rank, and `slots[rank]` its Horovod SlotInfo (local rank, cross rank, sizes).
    """
    hosts, _ = require_horovod()
    counts: dict[str, int] = {}
    for name in hostnames:
        counts[name] = counts.get(name, 0) + 1
    infos = [hosts.HostInfo(name, slots) for name, slots in counts.items()]
    slots = hosts.get_host_assignments(infos, len(hostnames), len(hostnames))
    waiting = {name: [i for i, h in enumerate(hostnames) if h == name] for name in counts}
    order = [waiting[slot.hostname].pop(0) for slot in slots]
    return order, slots


def scoped_finalize_handler():
    """Horovod's rendezvous handler with one fix: a scope whose ranks have all finalized forgets its addresses and
    only its own count of finalized ranks.

    Horovod 0.28.1's handler clears every scope's count when any scope completes, so a scope whose ranks
    finalize around another's completion (rank 0 done with `local_<host>` and its one-rank `cross_0` before rank
    1 finalizes `local_<host>`: a few milliseconds on a loaded host) never completes and keeps its addresses. A
    run re-initialises Horovod on the same server for each `fit` of its cell; the next init then reads a peer's
    stale address, Gloo's connect to it is refused, and Gloo's exception in Horovod's background thread aborts
    both engines (`gloo::IoException ... pair.cc:799] connect ...: Connection refused`)."""
    _, http_server = require_horovod()

    class ScopedFinalize(http_server.RendezvousHandler):
        def do_DELETE(self):
            parts = self.path.split("/")
            server = self.server
            if len(parts) != 3 or parts[1] not in server.scope_size:
                return super().do_DELETE()  # (a malformed path or an ad-hoc scope: Horovod's own handling)
            _, scope, key = parts
            with server.finished_list_lock:
                finished = server.finished_list[scope]
                if key not in finished:
                    finished.append(key)
                if len(finished) == server.scope_size[scope]:
                    with server.cache_lock:
                        server.cache.pop(scope, None)
                    del server.finished_list[scope]
            self.send_status_code(http_server.OK)

    return ScopedFinalize


class Rendezvous:
    """Horovod's own HTTP rendezvous server, bound to one address (not all interfaces), serving every Horovod job
    of one run (`scoped_finalize_handler`: each job finds none of the last one's addresses)."""

    def __init__(self, address: str):
        self.address = address
        self.port: int | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self, slots) -> int:
        _, http_server = require_horovod()
        self._server = http_server.RendezvousHTTPServer((self.address, 0), self.handler(), 0)
        self._server.init(slots)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="nbdist-rendezvous", daemon=True)
        self._thread.start()
        return self.port

    def handler(self):
        """The request handler class the server answers with."""
        return scoped_finalize_handler()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


ARRIVAL_POLL_S = 0.02  # a polling interval, not a limit


def arrive_together(address: str, port: int, rank: int, size: int, job: int) -> None:
    """Return once every rank of the run's `job`-th Horovod job (counted per rendezvous) has reached its init.

    Gloo gives a rank HOROVOD_GLOO_TIMEOUT_SECONDS (5 s, for a dead peer to be noticed soon) to find the
    others' addresses at init and, past it, throws in Horovod's background thread, which aborts the process: a
    rank still busy with the last `fit`'s end or the next one's data 5 s after a peer would end that peer. So
    the ranks meet here first, in a scope of the run's rendezvous server of their own, for as long as
    LIMITS.job_start_s; then a ClusterError names the ranks that never came."""
    host = f"[{address}]" if ":" in address else address  # (an IPv6 address)
    base = f"http://{host}:{port}/nbdist_arrive_{job}"
    _request("PUT", f"{base}/{rank}", b"1")
    waiting = set(range(size)) - {rank}
    deadline = time.monotonic() + LIMITS.job_start_s
    pause = threading.Event()
    while True:
        waiting = {other for other in waiting if _request("GET", f"{base}/{other}") != 200}
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"rank {rank} waited {LIMITS.job_start_s:g} s for rank(s) {sorted(waiting)} to start "
                               f"Horovod job {job} of this run; they never came (see %dist status)")
        pause.wait(ARRIVAL_POLL_S)


def _request(method: str, url: str, body: bytes | None = None) -> int:
    """The rendezvous server's HTTP status for one request (404: no such key yet)."""
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=LIMITS.gloo_peer_s) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        raise ClusterError(f"the run's Horovod rendezvous at {url.rsplit('/', 2)[0]} did not answer: {error}") from None
