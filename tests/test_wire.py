"""The wire format: round trips, and every rejection, over a real ZeroMQ socket pair."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zmq

from nbdist.ps import wire

KEY = wire.new_key()
GRADS = {"dense/kernel": np.arange(12, dtype=np.float32).reshape(3, 4), "dense/bias": np.ones(4, np.float32)}
EXPECTED = {name: (a.shape, a.dtype.name) for name, a in GRADS.items()}


@pytest.fixture
def sockets():
    context = zmq.Context()
    server, client = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client.connect(f"tcp://127.0.0.1:{port}")
    yield server, client
    for s in (server, client):
        s.close(linger=0)
    context.term()


def send_and_receive(sockets, frames, **kwargs):
    server, client = sockets
    client.send_multipart(frames, copy=False)
    assert server.poll(5000), "nothing arrived"
    return wire.decode(KEY, server.recv_multipart(copy=False), **kwargs)


def test_round_trip_is_zero_copy_and_exact(sockets):
    message = send_and_receive(sockets, wire.encode(KEY, "push", GRADS, worker=2, version=7))
    assert message.kind == "push" and message.header["worker"] == 2 and message.header["version"] == 7
    for name, array in GRADS.items():
        np.testing.assert_array_equal(message.arrays[name], array)
        assert not message.arrays[name].flags.writeable  # a view over the frame: copy before mutating
    wire.check_arrays(message.arrays, EXPECTED)


def test_large_message_is_hashed_in_parallel_and_round_trips(sockets):
    big = {"w": np.random.default_rng(0).normal(size=(2_000_000,)).astype(np.float32)}
    message = send_and_receive(sockets, wire.encode(KEY, "pull_reply", big))
    np.testing.assert_array_equal(message.arrays["w"], big["w"])


def test_unsigned_is_rejected(sockets):
    frames = wire.encode(KEY, "push", GRADS)
    frames[1] = b""
    with pytest.raises(wire.Rejected) as rejected:
        send_and_receive(sockets, frames)
    assert rejected.value.reason == "unsigned"


def test_wrong_key_is_rejected(sockets):
    with pytest.raises(wire.Rejected) as rejected:
        send_and_receive(sockets, wire.encode(wire.new_key(), "push", GRADS))
    assert rejected.value.reason == "bad_signature"


def test_tampered_header_or_buffer_is_rejected(sockets):
    frames = wire.encode(KEY, "push", GRADS, worker=1)
    frames[0] = frames[0].replace(b'"worker":1', b'"worker":9')
    with pytest.raises(wire.Rejected) as rejected:
        send_and_receive(sockets, frames)
    assert rejected.value.reason == "bad_signature"
    frames = wire.encode(KEY, "push", GRADS)
    frames[2] = bytes(frames[2])[:-4] + b"\x00\x00\x80\x7f"  # the last float becomes inf
    with pytest.raises(wire.Rejected) as rejected:
        send_and_receive(sockets, frames)
    assert rejected.value.reason == "bad_digest"


def test_signed_but_malformed_header_is_rejected(sockets):
    header = json.dumps({"v": wire.VERSION, "kind": "push", "nonce": "00", "arrays": [
        {"name": "x", "dtype": "object", "shape": [1], "tag": ""}]}).encode()
    import hashlib
    import hmac

    frames = [header, hmac.new(KEY, header, hashlib.sha256).digest(), b"\x00" * 8]
    with pytest.raises(wire.Rejected) as rejected:
        send_and_receive(sockets, frames)
    assert rejected.value.reason in ("malformed", "bad_digest")


def test_oversized_is_rejected(sockets):
    with pytest.raises(wire.Rejected) as rejected:
        send_and_receive(sockets, wire.encode(KEY, "push", GRADS), max_bytes=64)
    assert rejected.value.reason == "oversized"


@pytest.mark.parametrize("change, reason", [
    ({"dense/bias": np.ones(5, np.float32)}, "wrong_shape"),
    ({"dense/bias": np.ones(4, np.float64)}, "wrong_dtype"),
    ({"dense/bias": np.array([1, np.nan, 1, 1], np.float32)}, "non_finite"),
    ({"dense/bias": np.array([1, np.inf, 1, 1], np.float32)}, "non_finite"),
])
def test_wrong_shape_dtype_or_non_finite_is_rejected(sockets, change, reason):
    message = send_and_receive(sockets, wire.encode(KEY, "push", {**GRADS, **change}))
    with pytest.raises(wire.Rejected) as rejected:
        wire.check_arrays(message.arrays, EXPECTED)
    assert rejected.value.reason == reason


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_finiteness_check_rejects_any_nan_or_inf_and_no_finite_value(dtype):
    big = np.full(300_000, np.finfo(dtype).max / 2, dtype)  # finite, though the sum of squares overflows
    assert wire.check_arrays({"w": big}, {"w": ((300_000,), np.dtype(dtype).name)}) is None
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, 70_000, 299_999):  # in the first chunk, a later one, the last entry
            flawed = np.ones(300_000, dtype)
            flawed[where] = bad
            with pytest.raises(wire.Rejected, match="NaN or inf"):
                wire.check_arrays({"w": flawed}, {"w": ((300_000,), np.dtype(dtype).name)})


def test_pickle_is_not_a_dtype():
    with pytest.raises(ValueError, match="dtype object"):
        wire.encode(KEY, "push", {"x": np.array([object()])})
