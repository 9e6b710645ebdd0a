"""The one wire format of nbdist's own sockets: a signed JSON header plus raw array buffers.

Frames: ``[header, signature, buffer_0, buffer_1, ...]``. The header is UTF-8 JSON that lists
each buffer's name, dtype, shape and authentication tag; the signature is HMAC-SHA256 of
the header under the run's key. Each buffer's tag is Poly1305 under a one-message key,
HMAC-SHA256(run key, the header's random nonce): so one HMAC check authenticates the
header, the tags it carries bind every buffer, and a 40 MB array costs 3 ms to
authenticate instead of SHA-256's 22 ms (a PS round trip does it four times). Nothing is
ever unpickled. Receivers get read-only numpy views over the received frames (zero
copy): copy before mutating.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.poly1305 import Poly1305

VERSION = 2
DEFAULT_MAX_BYTES = 1 << 30
ALLOWED_DTYPES = {"float16", "float32", "float64", "int32", "int64", "uint8", "bool"}


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


def _buffer_key(key: bytes, nonce: str) -> bytes:
    """The one-message Poly1305 key: never reused, because the nonce is 128 random bits."""
    return hmac.new(key, b"nbdist-buffers:" + nonce.encode(), hashlib.sha256).digest()


def encode(key: bytes, kind: str, arrays: dict[str, np.ndarray] | None = None, **fields) -> list:
    """Frames for one message; `fields` go into the header (JSON-serialisable values only)."""
    nonce = secrets.token_hex(16)
    buffer_key = _buffer_key(key, nonce) if arrays else b""
    buffers, specs = [], []
    for name, array in (arrays or {}).items():
        array = np.asarray(array)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would also turn a 0-d array into 1-d)
            array = np.ascontiguousarray(array)
        if array.dtype.name not in ALLOWED_DTYPES:
            raise ValueError(f"array {name!r} has dtype {array.dtype}; the wire carries {sorted(ALLOWED_DTYPES)}")
        buffer = memoryview(array).cast("B")
        buffers.append(buffer)
        specs.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape),
                      "tag": Poly1305.generate_tag(buffer_key, buffer).hex()})
    header = json.dumps({"v": VERSION, "kind": kind, "nonce": nonce, "arrays": specs, **fields},
                        separators=(",", ":")).encode()
    return [header, hmac.new(key, header, hashlib.sha256).digest(), *buffers]


def decode(key: bytes, frames, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Check and parse frames (bytes or zmq.Frame); raise `Rejected` with a reason otherwise."""
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
        if header.get("v") != VERSION or not isinstance(header.get("kind"), str) or len(specs) != len(frames) - 2:
            raise ValueError("version, kind or buffer count")
        buffer_key = _buffer_key(key, str(header["nonce"])) if specs else b""
        tags = [bytes.fromhex(spec["tag"]) for spec in specs]
    except (ValueError, KeyError, TypeError) as exc:
        raise Rejected("malformed", str(exc)) from None
    buffers = frames[2:]
    for spec, tag, buffer in zip(specs, tags, buffers):
        try:
            Poly1305.verify_tag(buffer_key, buffer, tag)
        except InvalidSignature:
            raise Rejected("bad_digest", f"buffer {spec.get('name')!r} does not match its header") from None
    arrays = {}
    for spec, buffer in zip(specs, buffers):
        try:
            dtype = np.dtype(spec["dtype"])
            if spec["dtype"] not in ALLOWED_DTYPES:
                raise TypeError(spec["dtype"])
            array = np.frombuffer(buffer, dtype).reshape(spec["shape"])
            array.flags.writeable = False  # a view over the received frame
            arrays[spec["name"]] = array
        except (TypeError, ValueError, KeyError) as exc:
            raise Rejected("malformed", f"array {spec.get('name')!r}: {exc}") from None
    return Message(header, arrays)


def check_arrays(arrays: dict[str, np.ndarray], expected: dict[str, tuple[tuple, str]]) -> None:
    """Reject arrays whose names, shapes or dtypes differ from `expected`, or that hold NaN / inf."""
    if set(arrays) != set(expected):
        raise Rejected("wrong_shape", f"expected arrays {sorted(expected)}, got {sorted(arrays)}")
    for name, array in arrays.items():
        shape, dtype = expected[name]
        if tuple(array.shape) != tuple(shape):
            raise Rejected("wrong_shape", f"{name}: expected {tuple(shape)}, got {tuple(array.shape)}")
        if array.dtype.name != dtype:
            raise Rejected("wrong_dtype", f"{name}: expected {dtype}, got {array.dtype.name}")
        if array.dtype.kind == "f" and not _all_finite(array.reshape(-1)):
            raise Rejected("non_finite", f"{name} holds NaN or inf")


def _all_finite(flat: np.ndarray, chunk: int = 1 << 16) -> bool:
    return all(np.isfinite(flat[i:i + chunk]).all() for i in range(0, flat.size, chunk))
