"""The parameter server's same-host path: buffers in shared memory, a small control message on an ``ipc://`` socket.

When a worker (or the kernel) and a shard run on one host (same boot id and network
namespace), a message's arrays are not sent through a socket: the sender writes them once
into a shared-memory segment of its own (``/dev/shm``, created 0600) and the control message,
signed like every other (`wire`), names the segment and each array's offset. The receiver
reads them in place. The control messages travel over a Unix socket in a directory only
the run's user can open (0700). What guards the buffers is the operating system's file
permissions rather than a per-buffer GMAC: a process of another user can neither open a
segment nor connect to the socket. The header is still signed, still checked for replays,
and the arrays still for shape, dtype and finiteness.

Who writes where: a client writes its requests into its outbox (one per client socket), the
shard its replies into an outbox per client socket. A client sends one request at a time per
shard and copies a reply's arrays out before its next request, so each side rewrites its
outbox only once the other is done reading it.

Every name starts with the shard's prefix, ``nbdist-ps-<shard pid>-<random>-``, so whoever
outlives a shard (its launcher, the kernel's lifeline) removes what it left with one glob
(`remove_leftovers`).
"""

from __future__ import annotations

import glob
import mmap
import os
import re
import secrets
import shutil
import tempfile

from ..host.facts import boot_id, network_namespace

SHM_DIR = "/dev/shm"
ENV_SWITCH = "NBDIST_PS_SAME_HOST"  # "0": every exchange takes the signed TCP path, as across hosts
_NAME = re.compile(r"^nbdist-ps-\d+-[0-9a-f]{16}-[a-z0-9-]{1,64}$")
_ALIGN = 64


def enabled() -> bool:
    """Whether this process may take the same-host path (POSIX shared memory there, and not switched off)."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def host_facts() -> list:
    """What two processes must share to reach each other's memory and Unix sockets: boot id and network namespace."""
    return [boot_id(), network_namespace()]


def same_host(facts) -> bool:
    """Whether `facts` (another process's `host_facts`) are this process's, and both are known."""
    mine = host_facts()
    return enabled() and isinstance(facts, list) and None not in mine and facts == mine


def new_prefix(pid: int | None = None) -> str:
    """A shard's prefix for every name it and its clients create."""
    return f"nbdist-ps-{pid or os.getpid()}-{secrets.token_hex(8)}-"


def socket_dir(prefix: str) -> str:
    """A new directory (0700) for a shard's Unix socket."""
    path = os.path.join(tempfile.gettempdir(), prefix.rstrip("-"))
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)  # whatever the umask
    return path


def leftovers(pid: int) -> list[str]:
    """The segments (its clients' included) and the socket directory named for the shard of process `pid`."""
    return sorted(glob.glob(os.path.join(SHM_DIR, f"nbdist-ps-{pid}-*"))
                  + glob.glob(os.path.join(tempfile.gettempdir(), f"nbdist-ps-{pid}-*")))


def remove_leftovers(pid: int) -> None:
    """Unlink every segment and socket directory named for the shard of process `pid`."""
    for path in leftovers(pid):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


def _pad(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class Segment:
    """One mapped shared-memory file: created (0600, by its writer) or opened (by its reader)."""

    def __init__(self, name: str, size: int = 0, create: bool = False):
        if not _NAME.match(name):
            raise ValueError(f"not a segment name of nbdist's: {name[:80]!r}")
        self.name, self.path = name, os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, max(size, 1))
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.view = memoryview(self.map)

    def close(self) -> None:
        try:
            self.view.release()
            self.map.close()
        except BufferError:  # an array still views it: the mapping goes when that array does
            pass

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Outbox:
    """A writer's segment, grown (as a new segment) when a message needs more room than it has."""

    def __init__(self, prefix: str, owner: str):
        self.prefix, self.owner = prefix, owner
        self.segment: Segment | None = None
        self.generation = 0

    def place(self, buffers: list) -> tuple[str, list[int]]:
        """Write `buffers` (byte memoryviews) into the segment; its name and each buffer's offset."""
        offsets, end = [], 0
        for buffer in buffers:
            offsets.append(end)
            end += _pad(len(buffer))
        if self.segment is None or self.segment.size < end:
            self._grow(end)
        view = self.segment.view
        for buffer, offset in zip(buffers, offsets):
            view[offset:offset + len(buffer)] = buffer
        return self.segment.name, offsets

    def _grow(self, size: int) -> None:
        self.close()  # the reader finished with the old one (one request at a time): its mapping goes with it
        self.generation += 1
        self.segment = Segment(f"{self.prefix}{self.owner}-{self.generation}", size + size // 4, create=True)

    def close(self) -> None:
        if self.segment is not None:
            self.segment.unlink()
            self.segment.close()
            self.segment = None


class Inbox:
    """The segments a reader has opened, by name: views of `nbytes` at `offset`, bounds checked."""

    def __init__(self, prefix: str | None = None):
        self.prefix = prefix  # a shard accepts only names of its own prefix
        self.segments: dict[str, Segment] = {}

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        segment = self.segments.get(name)
        if segment is None:
            if self.prefix is not None and not name.startswith(self.prefix):
                raise ValueError(f"segment {name[:80]!r} is not of this shard")
            for old in [n for n in self.segments if n.rsplit("-", 1)[0] == name.rsplit("-", 1)[0]]:
                self.segments.pop(old).close()  # the writer grew its outbox: the old one is unlinked
            try:
                segment = self.segments[name] = Segment(name)
            except OSError as exc:
                raise ValueError(f"segment {name[:80]!r}: {exc.strerror}") from None
        if not (isinstance(offset, int) and isinstance(nbytes, int) and 0 <= offset and offset + nbytes <= segment.size):
            raise ValueError(f"bytes {offset}..{offset}+{nbytes} outside segment {name!r} of {segment.size}")
        return segment.view[offset:offset + nbytes]

    def forget(self, owner_prefix: str) -> None:
        """Close and unlink the segments whose names start with `owner_prefix` (a whole name, or a dead writer's
        prefix)."""
        for name in [n for n in self.segments if n.startswith(owner_prefix)]:
            segment = self.segments.pop(name)
            segment.unlink()
            segment.close()

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


class ShardEnd:
    """A shard's end of the same-host path: its Unix socket, the segments its clients write, its reply outboxes.

    A client on another host never learns of it; one on this host says where it runs (``host`` in a request
    over TCP) and is answered with the `route` (the socket and the names' prefix), then asks with
    ``same_host`` set in each request's header, over the Unix socket, and says ``bye`` (answered) when it closes. What
    each client socket used goes with its bye, or with its worker when that is dropped as dead.
    """

    def __init__(self, socket):
        self.prefix = new_prefix()
        self.dir = socket_dir(self.prefix)
        self.address = f"ipc://{os.path.join(self.dir, 'shard.sock')}"
        socket.bind(self.address)
        os.chmod(os.path.join(self.dir, "shard.sock"), 0o600)
        self.inbox = Inbox(self.prefix)
        self.outboxes: dict[bytes, Outbox] = {}  # client socket -> the shard's replies to it
        self.worker_of: dict[bytes, object] = {}  # client socket -> the worker it speaks for
        self.read_from: dict[bytes, set] = {}  # client socket -> the segments its requests named
        self.facts = host_facts()

    def route(self, header: dict) -> dict | None:
        """What to tell a client that asked over TCP from this host: how to reach the shard here."""
        facts = header.get("host")
        if facts is not None and None not in self.facts and facts == self.facts:
            return {"ipc": self.address, "prefix": self.prefix}
        return None

    def received(self, ident: bytes, header: dict) -> None:
        """Note what a request of `ident` used: the outbox its replies go to, the segment it named."""
        if header.get("same_host") and ident not in self.outboxes:
            self.outboxes[ident] = Outbox(self.prefix, f"r-{ident.hex()[:32]}")
            self.worker_of[ident] = header.get("worker")
        if isinstance(header.get("shm"), str):
            self.read_from.setdefault(ident, set()).add(header["shm"])

    def outbox(self, ident: bytes) -> Outbox | None:
        """Where replies to `ident` go: its outbox once it asked over the same-host path, else None (the socket)."""
        return self.outboxes.get(ident)

    def bye(self, ident: bytes) -> None:
        """Client socket `ident` closed: unlink its reply outbox, let go of the segments it wrote."""
        outbox = self.outboxes.pop(ident, None)
        if outbox is not None:
            outbox.close()
        self.worker_of.pop(ident, None)
        for name in self.read_from.pop(ident, ()):
            self.inbox.forget(name)

    def reclaim(self, worker) -> None:
        """Worker `worker` was dropped as dead: what its client sockets used goes as at their bye."""
        for ident in [i for i, w in self.worker_of.items() if w == worker]:
            self.bye(ident)
        self.inbox.forget(f"{self.prefix}w{worker}-")

    def close(self) -> None:
        for outbox in self.outboxes.values():
            outbox.close()
        self.inbox.close()
        remove_leftovers(int(self.prefix.split("-")[2]))
