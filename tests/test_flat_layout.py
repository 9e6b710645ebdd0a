"""One buffer per shard (issue 36): the flat layout, and one flat push against the per-variable updates it replaces."""

import numpy as np
import pytest

from nbdist.ps import delay, rules, wire
from nbdist.ps.flat_layout import FlatLayout, is_flat
from nbdist.ps.shard import Shard
from nbdist.ps.updaters import DelayUpdater, OptimizerUpdater
from nbdist.ps.zero_copy import SharedArrays

KEY = b"k" * 32
RNG = np.random.default_rng(7)


def mixed() -> dict:
    return {"t0002:dense/kernel": RNG.standard_normal((5, 3)).astype(np.float32),
            "t0000:embedding": RNG.standard_normal((7, 2)).astype(np.float64),
            "t0001:dense/bias": RNG.standard_normal(3).astype(np.float32),
            "t0003:scale": np.array(1.5, np.float32),
            "t0004:counts": np.arange(4, dtype=np.int32)}


def test_pack_then_views_give_back_every_array_and_the_views_are_of_the_flat_array():
    arrays = mixed()
    layout = FlatLayout.of(arrays)
    flat = layout.pack(arrays)
    assert is_flat(flat) and not is_flat(arrays)
    assert {k: (v.dtype.name, v.size) for k, v in flat.items()} == {
        "flat:float32": ("float32", 15 + 3 + 1), "flat:float64": ("float64", 14), "flat:int32": ("int32", 4)}
    views = layout.views(flat)
    assert list(views) == list(arrays)  # the order it was given
    for name, array in arrays.items():
        assert views[name].shape == array.shape and views[name].dtype == array.dtype
        np.testing.assert_array_equal(views[name], array)
        assert np.shares_memory(views[name], flat["flat:" + array.dtype.name])  # a view, not a copy
    views["t0001:dense/bias"][1] = 42.0  # names sort within a dtype: the bias (t0001) first, then the kernel
    assert flat["flat:float32"][1] == 42.0
    np.testing.assert_array_equal(flat["flat:float32"][3:18], arrays["t0002:dense/kernel"].reshape(-1))


def test_reading_a_push_copies_only_where_a_dtype_holds_several_variables():
    one = {"w": np.ones((3, 4), np.float32), "n": np.arange(3, dtype=np.int64)}
    read = FlatLayout.of(one).read(one)
    assert all(np.shares_memory(read["flat:" + a.dtype.name], a) for a in one.values())
    arrays = mixed()
    read = FlatLayout.of(arrays).read(arrays)
    np.testing.assert_array_equal(read["flat:float32"], FlatLayout.of(arrays).pack(arrays)["flat:float32"])
    assert not np.shares_memory(read["flat:float32"], arrays["t0001:dense/bias"])


def test_the_same_variables_given_in_another_order_lay_out_alike_and_a_change_changes_the_digest():
    arrays = mixed()
    reordered = dict(reversed(list(arrays.items())))
    assert FlatLayout.of(arrays).digest == FlatLayout.of(reordered).digest
    for key in ("flat:float32", "flat:float64"):
        np.testing.assert_array_equal(FlatLayout.of(arrays).pack(arrays)[key],
                                      FlatLayout.of(reordered).pack(reordered)[key])
    changed = {**arrays, "t0002:dense/kernel": np.zeros((3, 5), np.float32)}
    assert FlatLayout.of(changed).digest != FlatLayout.of(arrays).digest


FLOATS = {"t0000:kernel": RNG.standard_normal((64, 33)).astype(np.float32),
          "t0001:bias": RNG.standard_normal(33).astype(np.float32),
          "t0002:big": RNG.standard_normal(70_000).astype(np.float32)}  # past rules.CHUNK: updated a chunk at a time


@pytest.mark.parametrize("spec", [rules.OptimizerSpec("SGD", 0.1), rules.OptimizerSpec("SGD", 0.1, momentum=0.9),
                                  rules.OptimizerSpec("SGD", 0.1, momentum=0.9, nesterov=True),
                                  rules.OptimizerSpec("Adam", 0.01)], ids=["sgd", "momentum", "nesterov", "adam"])
def test_updates_over_the_flat_array_equal_the_per_variable_updates(spec):
    per_variable = {n: v.copy() for n, v in FLOATS.items()}
    slots = {n: rules.new_state(spec, v.shape, v.dtype) for n, v in FLOATS.items()}
    layout = FlatLayout.of(FLOATS)
    flat = layout.pack(FLOATS)
    updater = OptimizerUpdater(spec, layout.views(flat), {})
    for step in range(3):
        grads = {n: RNG.standard_normal(v.shape).astype(np.float32) for n, v in FLOATS.items()}
        for name, g in grads.items():
            rules.apply(spec, per_variable[name], g, slots[name], 0.1 if spec.name == "SGD" else 0.01, step)
        updater.apply(flat, layout.pack(grads), 0, 0, step)
    for name, value in layout.views(flat).items():
        if spec.name == "SGD":
            np.testing.assert_array_equal(value, per_variable[name])  # 0 ULP
        else:
            np.testing.assert_allclose(value, per_variable[name], rtol=0, atol=1e-7)
        for slot, array in slots[name].items():
            np.testing.assert_allclose(updater.state()[f"{name}:{slot}"], array, rtol=0, atol=1e-7)


def test_the_delay_rule_over_the_flat_array_equals_it_per_variable():
    params = delay.preset("ddc-asgd", 0.9, 4)
    spec = rules.OptimizerSpec("SGD", 0.05, momentum=0.9)
    by_name = {n: v.copy() for n, v in FLOATS.items()}
    layout = FlatLayout.of(FLOATS)
    flat = layout.pack(FLOATS)
    reference = DelayUpdater(params, spec, by_name, {})
    updater = DelayUpdater(params, spec, layout.views(flat), {})
    for step, tau in enumerate([0, 2, 1, 3]):
        worker = step % 2
        reference.sent(worker, by_name)
        updater.sent(worker, flat)
        grads = {n: RNG.standard_normal(v.shape).astype(np.float32) for n, v in FLOATS.items()}
        expected = reference.apply(by_name, grads, worker, tau, step)
        got = updater.apply(flat, layout.pack(grads), worker, tau, step)
        assert got["gamma"] == expected["gamma"] and got["comp_norm"] == pytest.approx(expected["comp_norm"], 1e-5)
    for name, value in layout.views(flat).items():
        np.testing.assert_array_equal(value, by_name[name])


def shard_with(arrays, spec):
    shard = Shard({"workers": 1})
    init = wire.decode(KEY, wire.encode(KEY, "init", arrays, worker=0, trainable=list(arrays),
                                        optimizer=spec.__dict__))
    assert shard.handle(b"w", init)[0][1] == "ok"
    return shard


def test_a_flat_push_and_a_push_per_variable_update_the_shard_alike_and_each_is_answered_in_its_own_form():
    spec = rules.OptimizerSpec("SGD", 0.1, momentum=0.9)
    grads = {n: RNG.standard_normal(v.shape).astype(np.float32) for n, v in FLOATS.items()}
    layout = FlatLayout.of(FLOATS)
    answers = []
    for arrays, fields in [(grads, {}), (layout.pack(grads), {"flat": layout.digest})]:
        shard = shard_with(FLOATS, spec)
        push = wire.decode(KEY, wire.encode(KEY, "push", arrays, worker=0, version=0, **fields))
        (_, kind, reply, header), = shard.handle(b"w", push)
        assert kind == "weights" and header["version"] == 1 and is_flat(reply) == bool(fields)
        answers.append(layout.views(reply) if fields else reply)
    for name in FLOATS:
        np.testing.assert_array_equal(answers[0][name], answers[1][name])


def test_a_flat_push_laid_out_differently_is_refused_not_applied():
    shard = shard_with(FLOATS, rules.OptimizerSpec("SGD", 0.1))
    other = FlatLayout.of({**FLOATS, "t0001:bias": np.zeros(33, np.float32), "t0003:more": np.zeros(1, np.float32)})
    zeros = other.pack({n: np.zeros(v.shape, np.float32) for n, v in {**FLOATS, "t0003:more": np.zeros(1)}.items()})
    push = wire.decode(KEY, wire.encode(KEY, "push", zeros, worker=0, version=0, flat=other.digest))
    with pytest.raises(wire.Rejected, match="lays this shard's variables out differently"):
        shard.handle(b"w", push)
    assert shard.version == 0


def test_an_update_while_a_reply_holds_a_view_works_on_a_copy_of_the_flat_array():
    flat = {"flat:float32": np.zeros(6, np.float32)}
    views = FlatLayout.of({"a": np.zeros(2, np.float32), "b": np.zeros(4, np.float32)}).views(flat)
    shared = SharedArrays()
    shared.hold([views["a"], views["b"]])  # a reply of a buffer per variable, not sent yet
    held = flat["flat:float32"]
    writable = shared.writable(flat, "flat:float32")
    assert writable is not held and flat["flat:float32"] is writable
    writable += 1
    assert views["a"].sum() == 0  # what the reply sends is unchanged
