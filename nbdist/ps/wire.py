"""The one wire format of nbdist's own sockets: a signed JSON header plus raw array buffers.

Frames: ``[header, signature, buffer_0, buffer_1, ...]``. The header is UTF-8 JSON that lists
each buffer's name, dtype, shape and authentication tag; the signature is HMAC-SHA256 of
the header under the run's key. Each buffer's tag is GMAC (AES-256-GCM over no plaintext,
the buffer as associated data) under a one-message key, HMAC-SHA256(run key, the header's
random nonce), with the buffer's index as the GCM nonce, so no (key, nonce) pair ever tags
two buffers: one HMAC check authenticates the header, the tags it carries bind every buffer,
and a 40 MB array costs about 2 ms to authenticate (AES-NI and carry-less multiply) instead
of SHA-256's 22 ms (a PS round trip does it four times). Nothing is ever unpickled. Receivers
get read-only numpy views over the received frames (zero copy): copy before mutating.

On one host (`same_host`) a message's buffers may instead lie in a shared-memory segment the
header names (``shm``), each at the ``offset`` its description gives in place of a tag: the
operating system's file permissions guard them there, and the receiver must have said that it
accepts such a message (`decode`'s `inbox`).

Every header also carries its sender's session (random, one per thread and process) and a
sequence number that grows with each message the session sends, so a receiver that keeps
the last number of each session (`ReplayGuard`) rejects a valid message sent again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = 3  # 3: GMAC buffer tags, one GCM nonce per buffer (2: Poly1305, one key for all buffers)
DEFAULT_MAX_BYTES = 1 << 30
ALLOWED_DTYPES = {"float16", "float32", "float64", "int32", "int64", "uint8", "bool"}
_NAMES = {np.dtype(name): name for name in ALLOWED_DTYPES}  # numpy's dtype.name is Python code, 9 us a call


def dtype_name(dtype: np.dtype) -> str:
    return _NAMES.get(dtype) or dtype.name


class Rejected(Exception):
    """A message that must not be applied; `reason` is one of the counters the server keeps."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Message:
    header: dict
    arrays: dict[str, np.ndarray]

    @property
    def kind(self) -> str:
        return self.header["kind"]


def new_key() -> bytes:
    """A random per-run key (32 bytes)."""
    return secrets.token_bytes(32)


def _buffer_key(key: bytes, nonce: str) -> AESGCM:
    """The one-message GMAC key: never reused across messages, because the nonce is 128 random bits."""
    return AESGCM(hmac.new(key, b"nbdist-buffers:" + nonce.encode(), hashlib.sha256).digest())


def _tag(buffer_key: AESGCM, index: int, buffer) -> bytes:
    return buffer_key.encrypt(index.to_bytes(12, "big"), b"", buffer)


_sender = threading.local()


def _next_sequence() -> tuple[str, int]:
    """This thread's session and its next sequence number (a forked child starts a session of its own)."""
    state = getattr(_sender, "state", None)
    if state is None or state[0] != os.getpid():
        state = _sender.state = [os.getpid(), secrets.token_hex(8), 0]
    state[2] += 1
    return state[1], state[2]


class ReplayGuard:
    """Rejects a message whose sequence number is not past the last one seen from its sender's session."""

    def __init__(self, sessions: int = 4096):
        self.last: OrderedDict[str, int] = OrderedDict()
        self.sessions = sessions  # remembered at most (the least recently heard from are forgotten)

    def check(self, header: dict) -> None:
        sid, seq = header.get("sid"), header.get("seq")
        if not isinstance(sid, str) or not isinstance(seq, int) or isinstance(seq, bool):
            raise Rejected("malformed", "no sender session and sequence number")
        if seq <= self.last.get(sid, 0):
            raise Rejected("replayed", f"message {seq} of session {sid} was already received (last {self.last[sid]})")
        self.last[sid] = seq
        self.last.move_to_end(sid)
        if len(self.last) > self.sessions:
            self.last.popitem(last=False)


def encode(key: bytes, kind: str, arrays: dict[str, np.ndarray] | None = None, outbox=None, **fields) -> list:
    """Frames for one message; `fields` go into the header (JSON-serialisable values only). With `outbox`
    (a `same_host.Outbox`) the arrays are written there and the frames are the signed header alone."""
    nonce = secrets.token_hex(16)
    sid, seq = _next_sequence()
    buffer_key = _buffer_key(key, nonce) if arrays and outbox is None else None
    buffers, specs = [], []
    for name, array in (arrays or {}).items():
        array = np.asarray(array)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would also turn a 0-d array into 1-d)
            array = np.ascontiguousarray(array)
        dtype = _NAMES.get(array.dtype)
        if dtype is None:
            raise ValueError(f"array {name!r} has dtype {array.dtype}; the wire carries {sorted(ALLOWED_DTYPES)}")
        buffer = memoryview(array).cast("B")
        buffers.append(buffer)
        specs.append({"name": name, "dtype": dtype, "shape": list(array.shape)})
        if buffer_key is not None:
            specs[-1]["tag"] = _tag(buffer_key, len(specs) - 1, buffer).hex()
    if outbox is not None and buffers:
        fields["shm"], offsets = outbox.place(buffers)
        for spec, offset in zip(specs, offsets):
            spec["offset"] = offset
        buffers = []
    header = json.dumps({"v": VERSION, "kind": kind, "nonce": nonce, "sid": sid, "seq": seq, "arrays": specs,
                         **fields},
                        separators=(",", ":")).encode()
    return [header, hmac.new(key, header, hashlib.sha256).digest(), *buffers]


def decode(key: bytes, frames, max_bytes: int = DEFAULT_MAX_BYTES, inbox=None) -> Message:
    """Check and parse frames (bytes or zmq.Frame); raise `Rejected` with a reason otherwise. `inbox` (a
    `same_host.Inbox`): where a message's buffers may lie in shared memory (none accepted without one)."""
    frames = [f.buffer if hasattr(f, "buffer") else f for f in frames]
    if len(frames) < 2 or len(frames[1]) == 0:
        raise Rejected("unsigned", "no signature frame")
    header_bytes = bytes(frames[0])
    if not hmac.compare_digest(bytes(frames[1]), hmac.new(key, header_bytes, hashlib.sha256).digest()):
        raise Rejected("bad_signature")
    total = sum(len(f) for f in frames)
    if total > max_bytes:
        raise Rejected("oversized", f"{total} bytes > limit {max_bytes}")
    try:
        header = json.loads(header_bytes)
        specs = header["arrays"]
        if not isinstance(header, dict) or header.get("v") != VERSION or not isinstance(header.get("kind"), str) \
                or not isinstance(specs, list):
            raise ValueError("version or kind")
        if "shm" in header:
            return Message(header, _shared_arrays(header, specs, frames, inbox, max_bytes))
        if len(specs) != len(frames) - 2:
            raise ValueError("buffer count")
        for spec in specs:
            _check_spec(spec)
        if len({spec["name"] for spec in specs}) != len(specs):
            raise ValueError("two buffers of one name")
        buffer_key = _buffer_key(key, str(header["nonce"])) if specs else None
        tags = [bytes.fromhex(spec["tag"]) for spec in specs]
    except (ValueError, KeyError, TypeError) as exc:
        raise Rejected("malformed", str(exc)) from None
    buffers = frames[2:]
    for index, (spec, tag, buffer) in enumerate(zip(specs, tags, buffers)):
        try:
            buffer_key.decrypt(index.to_bytes(12, "big"), tag, buffer)
        except InvalidTag:
            raise Rejected("bad_digest", f"buffer {spec.get('name')!r} does not match its header") from None
    arrays = {}
    for spec, buffer in zip(specs, buffers):
        try:
            array = np.frombuffer(buffer, np.dtype(spec["dtype"])).reshape(spec["shape"])
            array.flags.writeable = False  # a view over the received frame
            arrays[spec["name"]] = array
        except (TypeError, ValueError, KeyError) as exc:
            raise Rejected("malformed", f"array {spec.get('name')!r}: {exc}") from None
    return Message(header, arrays)


def _shared_arrays(header: dict, specs: list, frames, inbox, max_bytes: int) -> dict[str, np.ndarray]:
    """A same-host message's arrays: read-only views into the segment its header names (raises ValueError)."""
    if inbox is None:
        raise Rejected("malformed", "names a shared-memory segment where this receiver takes none")
    if len(frames) != 2 or not isinstance(header["shm"], str):
        raise ValueError("a shared-memory message is a header alone, naming its segment")
    arrays, total = {}, 0
    for spec in specs:
        _check_spec(spec, "offset")
        if spec["name"] in arrays:
            raise ValueError("two buffers of one name")
        dtype = np.dtype(spec["dtype"])
        nbytes = int(np.prod(spec["shape"], dtype=np.int64)) * dtype.itemsize
        total += nbytes
        if total > max_bytes:
            raise Rejected("oversized", f"{total} bytes > limit {max_bytes}")
        array = np.frombuffer(inbox.view(header["shm"], spec["offset"], nbytes), dtype).reshape(spec["shape"])
        array.flags.writeable = False
        arrays[spec["name"]] = array
    return arrays


def _check_spec(spec, where: str = "tag") -> None:
    """A buffer's description: a name, an allowed dtype, a shape of whole non-negative numbers, and its tag
    (`where` "tag") or its offset in a shared-memory segment ("offset")."""
    if not isinstance(spec, dict):
        raise ValueError(f"buffer description {str(spec)[:200]}")
    placed = isinstance(spec.get("tag"), str) if where == "tag" else \
        isinstance(spec.get("offset"), int) and not isinstance(spec.get("offset"), bool) and spec["offset"] >= 0
    if not isinstance(spec.get("name"), str) or \
            spec.get("dtype") not in ALLOWED_DTYPES or not placed or \
            not isinstance(spec.get("shape"), list) or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in spec["shape"]):
        raise ValueError(f"buffer description {str(spec)[:200]}")


def check_arrays(arrays: dict[str, np.ndarray], expected: dict[str, tuple[tuple, str]]) -> None:
    """Reject arrays whose names, shapes or dtypes differ from `expected`, or that hold NaN / inf."""
    if set(arrays) != set(expected):
        raise Rejected("wrong_shape", f"expected arrays {sorted(expected)}, got {sorted(arrays)}")
    for name, array in arrays.items():
        shape, dtype = expected[name]
        if tuple(array.shape) != tuple(shape):
            raise Rejected("wrong_shape", f"{name}: expected {tuple(shape)}, got {tuple(array.shape)}")
        if dtype_name(array.dtype) != dtype:
            raise Rejected("wrong_dtype", f"{name}: expected {dtype}, got {array.dtype.name}")
        if array.dtype.kind == "f" and not _all_finite(array.reshape(-1)):
            raise Rejected("non_finite", f"{name} holds NaN or inf")


def _all_finite(flat: np.ndarray, chunk: int = 1 << 16) -> bool:
    # x . x is NaN or inf when any entry is (its terms are squares: no inf - inf), and BLAS takes one pass
    # without a temporary: 2.4x faster than isfinite at 10M values. A finite sum that overflows is looked at
    # entry by entry.
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.dot(flat, flat)):
            return True
    return all(np.isfinite(flat[i:i + chunk]).all() for i in range(0, flat.size, chunk))
