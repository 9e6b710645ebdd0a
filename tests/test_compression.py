"""Gradient compression for PS pushes (nbdist/ps/compression.py): fp16, top-k with error feedback, the
policy that picks between them, and a shard applying what a compressed push encodes."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.strategies.ashl.meeting import SPEC as ASHL_MEETING
from nbdist.ps.compression import CompressionPolicy, PushCompressor, TopK, decode_push, from_fp16, to_fp16
from nbdist.ps.shard import Shard
from tests.support import SGD, W0, message

EXPECTED = {name: (w.shape, "float32") for name, w in W0.items()}


def ashl_shard(workers=1) -> Shard:
    shard = Shard({"workers": workers, "extension": {"class": ASHL_MEETING, "config": {}},
                   "rule": {"preset": "ddc-asgd", "workers": workers}})
    shard.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0)))
    return shard


def test_top_k_with_error_feedback_carries_exactly_what_was_not_sent():
    rng = np.random.default_rng(0)
    topk = TopK((50, 4), density=0.05)
    sent_total, grad_total = np.zeros((50, 4)), np.zeros((50, 4))
    for _ in range(20):
        g = rng.normal(size=(50, 4)).astype(np.float32)
        indices, values = topk.compress(g)
        assert len(indices) == 10
        sent_total += TopK.decompress(indices, values, (50, 4))
        grad_total += g
    np.testing.assert_allclose(sent_total + topk.residual, grad_total, atol=1e-5)


def test_fp16_round_trip_error_is_within_half_precision():
    rng = np.random.default_rng(1)
    g = (rng.normal(size=10_000) * 10.0 ** rng.integers(-4, 4, size=10_000)).astype(np.float32)
    back = from_fp16(to_fp16(g))
    normal = np.abs(g) >= np.finfo(np.float16).tiny
    assert np.all(np.abs(back - g)[normal] <= 2.0 ** -11 * np.abs(g)[normal])  # half a unit in the last place
    assert np.all(np.abs(back - g)[~normal] <= 2.0 ** -25)  # subnormal spacing
    assert from_fp16(to_fp16(np.array([1e6, -1e6], np.float32))).tolist() == [65504.0, -65504.0]  # saturates


def test_compression_policy_hysteresis_and_warm_up():
    policy = CompressionPolicy()
    assert policy.decide(comm_s=0.9, compute_s=0.1, epoch=1.0)[0] == "none"  # never in the first 2 epochs
    assert policy.decide(comm_s=0.4, compute_s=0.6, epoch=2.5)[0] == "fp16"
    assert policy.decide(comm_s=0.2, compute_s=0.8, epoch=3.0)[0] == "fp16"  # 20%: between off and on, stays
    assert policy.decide(comm_s=0.1, compute_s=0.9, epoch=3.5)[0] == "none"
    assert policy.decide(comm_s=0.7, compute_s=0.3, epoch=4.0)[0] == "topk"


@pytest.mark.parametrize("mode", ["fp16", "topk"])
def test_a_compressed_push_is_applied_as_the_dense_gradient_it_encodes(mode):
    compressor = PushCompressor(density=0.5)
    compressor.policy.mode = mode
    g = {name: np.linspace(-1, 1, w.size, dtype=np.float32).reshape(w.shape) for name, w in W0.items()}
    sent = compressor.encode(g)
    dense = decode_push(sent, mode, EXPECTED)
    if mode == "fp16":
        assert all(np.abs(dense[n] - g[n]).max() <= 1e-3 for n in g)
    else:
        for name in g:  # what was not sent is exactly what top-k kept back
            assert np.allclose(dense[name] + compressor.topk[name].residual, g[name])
    shard = ashl_shard(workers=1)
    shard.handle(b"w0", message("pull", worker=0))
    before = shard.variables["dense/kernel"].copy()
    shard.handle(b"w0", message("push", sent, worker=0, version=0, step=1, compression=mode, compression_reason="x"))
    assert before - shard.variables["dense/kernel"] == pytest.approx(0.5 * dense["dense/kernel"], abs=1e-6)
    assert shard.events[-1]["event"] == "compression" and shard.events[-1]["mode"] == mode


def test_leaving_top_k_sends_what_it_held_back():
    compressor = PushCompressor(density=0.2)
    compressor.policy.mode = "topk"
    g = {"v": np.arange(10, dtype=np.float32)}
    first = decode_push(compressor.encode(g), "topk", {"v": ((10,), "float32")})
    compressor.policy.mode = "none"
    second = compressor.encode(g)
    assert np.allclose(first["v"] + second["v"], 2 * g["v"]) and compressor.topk == {}


@pytest.mark.parametrize("arrays, message_", [
    ({"v|idx": np.array([10], np.int64), "v|val": np.array([1.0], np.float32)}, "outside"),
    ({"v|idx": np.array([1], np.int32), "v|val": np.array([1.0], np.float32)}, "int64"),
    ({"v": np.zeros(10, np.float32)}, "NAME|idx"),
])
def test_malformed_top_k_pushes_are_refused_by_what_is_wrong(arrays, message_):
    with pytest.raises(ValueError, match=message_):
        decode_push(arrays, "topk", {"v": ((10,), "float32")})
