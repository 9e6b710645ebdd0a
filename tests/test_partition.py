"""Variables over parameter-server shards: balanced by size, the same plan everywhere."""

from __future__ import annotations

import pytest

from nbdist.ps.partition import partition


def test_hand_example_is_balanced_and_keeps_order():
    sizes = {"conv/k": 300, "conv/b": 10, "dense/k": 250, "dense/b": 40, "out/k": 100}
    plan = partition(sizes, 2)
    # Largest first onto the lighter shard: 300 -> 0, 250 -> 1, 100 -> 1, 40 -> 0, 10 -> 0.
    assert plan == [["conv/k", "conv/b", "dense/b"], ["dense/k", "out/k"]]
    assert [sum(sizes[n] for n in shard) for shard in plan] == [350, 350]


def test_every_variable_once_and_no_empty_shards():
    sizes = {f"v{i}": (i * 37) % 101 + 1 for i in range(30)}
    plan = partition(sizes, 4)
    assert sorted(n for shard in plan for n in shard) == sorted(sizes)
    loads = [sum(sizes[n] for n in shard) for shard in plan]
    assert max(loads) <= 4 / 3 * (sum(sizes.values()) / 4) + max(sizes.values())
    assert partition({"only": 5}, 3) == [["only"]]


def test_bad_shard_count():
    with pytest.raises(ValueError, match="Received: shards=0"):
        partition({"a": 1}, 0)
