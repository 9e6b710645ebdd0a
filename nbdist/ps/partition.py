"""Which parameter-server shard holds which variable: balanced by size, deterministic."""

from __future__ import annotations


def partition(sizes: dict[str, int], shards: int) -> list[list[str]]:
    """Assign variables to `shards` shards, largest first onto the least-loaded shard.

    Greedy longest-processing-time: the heaviest shard holds at most 4/3 of the optimum.
    Ties break by shard index and variable name, so every process computes the same plan.

    Returns:
        one list of variable names per shard, in the order the variables were given.
    """
    if shards < 1:
        raise ValueError(f"Expected `shards` to be at least 1. Received: shards={shards}")
    shards = min(shards, max(1, len(sizes)))
    loads = [0] * shards
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        target = min(range(shards), key=lambda i: (loads[i], i))
        owner[name] = target
        loads[target] += sizes[name]
    return [[name for name in sizes if owner[name] == shard] for shard in range(shards)]
