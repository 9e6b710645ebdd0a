"""The live controls every shard honours (a strategy's own come through its `ShardExtension`)."""

from __future__ import annotations

from . import wire
from .release import BoundedStaleness

CONTROL_ACTIONS = ("pause", "resume", "stop", "lr_scale", "max_staleness", "evict")


def apply_control(shard, action: str, value) -> None:
    """Apply `action` to `shard`; refuse (`wire.Rejected`) a malformed one, naming what is wrong."""
    if action not in CONTROL_ACTIONS:
        more = shard.extension.controls if shard.extension is not None else ()
        raise wire.Rejected("malformed", f"unknown control {action!r}; one of {(*CONTROL_ACTIONS, *more)}")
    if action in ("pause", "resume"):
        shard.paused = action == "pause"
    elif action == "stop":
        shard.finishing, shard.finishing_reason, shard.paused = True, "stop", False
    elif action == "lr_scale":
        if not isinstance(value, (int, float)) or not value > 0:
            raise wire.Rejected("malformed", f"lr_scale must be a positive number, not {value!r}")
        shard.lr_scale = float(value)
    elif action == "max_staleness":
        if value is not None and (not isinstance(value, int) or value < 0):
            raise wire.Rejected("malformed", f"max_staleness must be a whole number >= 0 or null, not {value!r}")
        if isinstance(shard.policy, BoundedStaleness):  # held replies stay with it (released as before)
            shard.policy.bound = value
        elif not shard.synchronous and value is not None:  # a synchronous round is the tightest bound already
            shard.policy = BoundedStaleness(value, start_barrier=False)
    elif action == "evict":
        if value not in shard.workers:
            raise wire.Rejected("unknown_worker", f"cannot evict worker {value!r}")
        shard.workers[value].evicted = True
        shard.requeue(value)  # the batches it held are trained by the others
