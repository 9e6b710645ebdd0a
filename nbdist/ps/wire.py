"""The one wire format of nbdist's own sockets: a signed JSON header plus raw array buffers.

Frames: ``[header, signature, buffer_0, buffer_1, ...]``. The header is UTF-8 JSON that lists
each buffer's name, dtype, shape and SHA-256; the signature is HMAC-SHA256 of the header
under the run's key. So one HMAC check authenticates everything, buffers are hashed in
parallel (hashlib releases the GIL), and nothing is ever unpickled. Receivers get
read-only numpy views over the received frames (zero copy): copy before mutating.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30
ALLOWED_DTYPES = {"float16", "float32", "float64", "int32", "int64", "uint8", "bool"}
_HASH_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nbdist-wire-hash")


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


def _digests(buffers) -> list[str]:
    if sum(len(b) for b in buffers) < (1 << 20):
        return [hashlib.sha256(b).hexdigest() for b in buffers]
    return list(_HASH_POOL.map(lambda b: hashlib.sha256(b).hexdigest(), buffers))


def encode(key: bytes, kind: str, arrays: dict[str, np.ndarray] | None = None, **fields) -> list:
    """Frames for one message; `fields` go into the header (JSON-serialisable values only)."""
    names, buffers, specs = [], [], []
    for name, array in (arrays or {}).items():
        array = np.ascontiguousarray(array)
        if array.dtype.name not in ALLOWED_DTYPES:
            raise ValueError(f"array {name!r} has dtype {array.dtype}; the wire carries {sorted(ALLOWED_DTYPES)}")
        names.append(name)
        buffers.append(memoryview(array).cast("B"))
        specs.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape)})
    for spec, digest in zip(specs, _digests(buffers)):
        spec["sha256"] = digest
    header = json.dumps({"v": VERSION, "kind": kind, "arrays": specs, **fields}, separators=(",", ":")).encode()
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
    except (ValueError, KeyError, TypeError) as exc:
        raise Rejected("malformed", str(exc)) from None
    buffers = frames[2:]
    if [s.get("sha256") for s in specs] != _digests(buffers):
        raise Rejected("bad_digest", "a buffer does not match its header")
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
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise Rejected("non_finite", f"{name} holds NaN or inf")
