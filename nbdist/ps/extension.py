"""What a strategy adds to a shard (`ShardExtension`): its own message kinds, controls, and hooks on pushes,
rounds, epochs and replies; a shard's config names it, `load_extension` makes it. ASHL's is `ashl/meeting.py`."""

from __future__ import annotations

import importlib


class ShardExtension:
    """What a strategy adds to a shard: message kinds, controls, and hooks on pushes and rounds."""

    kinds: tuple[str, ...] = ()  # answered by `handle` at once
    held_kinds: tuple[str, ...] = ()  # held until `ready` answers
    controls: tuple[str, ...] = ()

    def handle(self, shard, worker: int, message) -> dict | None:
        """Record a message of one of `kinds` / `held_kinds`; for `kinds`, the reply's fields."""

    def ready(self, shard, worker: int, message) -> dict | None:
        """A held message's reply fields, once it can be answered."""

    def control(self, shard, action: str, value) -> None:
        """Apply one of `controls`."""

    def push_scale(self, batch) -> float:
        return 1.0

    def pacers(self, shard, live: list[int]) -> list[int]:
        return live

    def round_total(self, shard, batches: list[int]) -> int:
        """What a synchronous round's batch-weighted mean divides by: the batches in the round."""
        return sum(batches)

    def on_done(self, shard) -> None:
        """A worker ended its fit."""

    def epoch_closes(self, shard, epoch: int, logs: dict) -> bool:
        """Whether the epoch barrier may release now (every live worker posted `logs`, their mean)."""
        return True

    def reply_fields(self, shard) -> dict:
        """Fields every weights reply to a worker carries."""
        return {}

    def summary(self) -> dict | None:
        return None


def load_extension(spec: dict | None) -> ShardExtension | None:
    """The extension a shard's config names: {"class": "nbdist.<module>:<Class>", "config": {...}}."""
    if not spec:
        return None
    module, _, name = spec["class"].partition(":")
    if not module.startswith("nbdist."):  # the config comes from the kernel; still, only nbdist's own code
        raise ValueError(f"shard extension {spec['class']!r} is not part of nbdist")
    return getattr(importlib.import_module(module), name)(spec.get("config") or {})
