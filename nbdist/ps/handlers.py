"""What a shard does with each kind of message (`Shard.handle` dispatches here by kind).

A handler returns the replies to send now. For the held kinds (pull, push, done, epoch) it
only records what the message says; the shard then holds the message until its release
policy or barrier can answer it.
"""

from __future__ import annotations

import time

import numpy as np

from . import wire
from .dealer import check_taken
from .worker_state import WorkerState

HELD_KINDS = ("pull", "push", "done", "epoch", "batch")  # answered when their condition holds


def _heartbeat(shard, ident, worker, message):
    # a restarted shard announces its incarnation once it holds its checkpoint: requests resent to it find the model
    incarnation = shard.incarnation if shard.initialised else 0
    return [(ident, "pong", None, {"version": shard.version, "incarnation": incarnation})]


def _init(shard, ident, worker, message):
    if shard.replacing_too_soon(worker, message):  # another model's fit: once every worker ended the last one
        return shard.hold(ident, message)
    return [(ident, *shard.init(message)), *shard.release()]


def _push(shard, ident, worker, message):
    check_taken(message.header)
    try:
        shard.check_push(message)
    except wire.Rejected as exc:
        if exc.reason == "non_finite" and shard.dealer is not None:
            shard.dealer.pushed(worker, message.header.get("taken"))  # trained (into NaN): the worker goes on
        raise
    if shard.clock == "virtual" and not all(isinstance(message.header.get(k), (int, float)) for k in ("vt", "gap")):
        raise wire.Rejected("malformed", "a push on the virtual clock carries its arrival time vt and gap")
    shard.policy.note_push(shard, worker, message)
    return []


def _probe(shard, ident, worker, message):
    """A timed round trip of a push's size (profiling): nothing is applied."""
    shard.check_push(message)
    return [(ident, "weights", shard.weights(worker), {"version": shard.version})]


def _weights(shard, ident, worker, message):
    """The weights now (a worker that takes the job's model at an epoch's end, from the shards after the first)."""
    return [shard.weights_reply(ident, worker, stop=False)]


def _pull(shard, ident, worker, message):
    """The start of a (next) fit call."""
    if shard.finalized:  # the first pull of a later fit: its epochs are dealt and agreed anew (a fit's epoch 0
        shard.epoch_logs.clear()  # logs are not the last fit's epoch 0 logs)
        shard.epoch_vts.clear()
        if shard.dealer is not None:
            shard.dealer.new_fit()
    shard.workers[worker].done = False
    shard.workers[worker].pulled = True
    shard.finalized = False
    if shard.finishing_reason == "laggards":
        shard.finishing, shard.finishing_reason = False, ""
    return []


def _done(shard, ident, worker, message):
    shard.workers[worker].done = True
    if shard.dealer is not None:  # a fit stopped early leaves the batches it held to the others
        shard.dealer.lost(worker)
    if shard.extension is not None:
        shard.extension.on_done(shard)
    return []


def _batch(shard, ident, worker, message):
    """A worker asks for batches (`--data dynamic`): the first of an epoch, or more when it has none."""
    if shard.dealer is None:
        raise wire.Rejected("malformed", "this run deals no batches (its data is sharded statically)")
    shard.dealer.note(worker, message.header)
    return []


def _epoch(shard, ident, worker, message):
    shard.post_epoch(worker, message.header)
    return []


def _learning_rate(shard, ident, worker, message):
    """The cell's callbacks changed the learning rate on the workers: the optimizer here follows."""
    value = message.header.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise wire.Rejected("malformed", f"a learning rate is a positive number, not {value!r}")
    if shard.initialised:
        shard.updater.set_learning_rate(float(value))
    shard.record("learning_rate", value=float(value))
    return [(ident, "ok", None, {})]


def _statistics(shard, ident, worker, message):
    """A worker's changes to the model's running statistics (BatchNormalization's moving mean and variance, the
    float non-trainable variables) since the values it last received: added to the shard's (shard 0 keeps them,
    as TensorFlow's ParameterServerStrategy keeps such variables on the PS); the reply holds the sums."""
    expected = {n: (v.shape, wire.dtype_name(v.dtype)) for n, v in shard.frozen.items() if n in message.arrays}
    if not shard.initialised or set(message.arrays) - set(shard.frozen):
        raise wire.Rejected("malformed", "statistics of variables this shard does not hold")
    wire.check_arrays(message.arrays, expected)
    for name, delta in message.arrays.items():
        shard.frozen[name] = shard.frozen[name] + delta
    names = message.header.get("names")
    names = names if isinstance(names, list) else list(message.arrays)
    return [(ident, "statistics", {n: shard.frozen[n] for n in names if n in shard.frozen}, {})]


def _state(shard, ident, worker, message):
    return [(ident, "state", shard.state_arrays(), shard.summary())]


def _stats(shard, ident, worker, message):
    since, log = shard.log.since(int(message.header.get("since") or 0))
    shard.log.flush()  # so the file holds at least what this reply reports
    return [(ident, "stats", None, {**shard.summary(), "log_fields": shard.log_fields, "log": log, "since": since,
                                     "log_total": len(shard.log), "log_file": shard.log.path, "events": shard.events})]


def _control(shard, ident, worker, message):
    return [(ident, "ok", None, shard.control(message.header)), *shard.policy.complete_round(shard),
            *shard.release()]


def _restore(shard, ident, worker, message):
    shard.restored = {"arrays": {k: np.array(v) for k, v in message.arrays.items()},
                      "version": int(message.header.get("version", 0))}
    return [(ident, "ok", None, {})]


def _admit(shard, ident, worker, message):
    """A newcomer joins the running fit as worker `worker_id` (DESIGN.md section 10): from the epoch after the
    last one any worker posted (or the open epoch's, where batches are dealt), its pushes counted from the slowest
    live worker's (a staleness bound does not hold the others back for it). Refused once a fit has ended or no
    epoch of `epochs` is left."""
    newcomer, epochs = message.header.get("worker_id"), message.header.get("epochs")
    if not isinstance(newcomer, int) or newcomer in shard.workers or not isinstance(epochs, int):
        raise wire.Rejected("malformed", "an admit names a new worker id and the fit's epochs")
    first = max(shard.epoch_logs, default=-1) + 1
    if shard.dealer is not None and shard.dealer.first_epoch() is not None:  # batches of the open epoch are left
        first = shard.dealer.first_epoch()
    if shard.fits_ended or not shard.initialised or not shard.live():
        answer = {"admitted": False, "reason": "the run's first fit has ended"}
    elif first >= epochs:
        answer = {"admitted": False, "reason": f"no epoch is left to join (the run posted epoch {first - 1})"}
    else:
        shard.workers[newcomer] = WorkerState(pushed=shard.slowest() or 0, first_epoch=first)
        shard.record("worker_admitted", worker=newcomer, first_epoch=first)
        answer = {"admitted": True, "first_epoch": first}
    return [(ident, "ok", None, answer)]


def _drop(shard, ident, worker, message):
    """The kernel saw worker `worker_id`'s engine die: nothing is waited for from it any more."""
    dead = message.header.get("worker_id")
    state = shard.workers.get(dead) if isinstance(dead, int) else None
    if state is None:
        raise wire.Rejected("malformed", f"drop of unknown worker {dead!r}")
    if state.alive:
        state.alive, state.died_at = False, time.time()
        shard.record("worker_dropped", t=state.died_at, worker=dead, pushed=state.pushed, silent_s=None,
                     **shard.requeue(dead))
    return [(ident, "ok", None, {}), *shard.policy.complete_round(shard), *shard.release()]


def _stop(shard, ident, worker, message):
    shard.stopping = True
    return [(ident, "ok", None, {})]


HANDLERS = {"heartbeat": _heartbeat, "init": _init, "push": _push, "probe": _probe, "pull": _pull, "done": _done,
            "epoch": _epoch, "batch": _batch, "weights": _weights, "learning_rate": _learning_rate, "state": _state, "statistics": _statistics, "stats": _stats, "control": _control,
            "restore": _restore, "stop": _stop, "admit": _admit, "drop": _drop}
