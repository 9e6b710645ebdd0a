"""A worker's exchange with the parameter server: push a gradient, receive the weights to compute on next.

One `PushPull` lives for one `fit`; its `push` runs inside the compiled train step (a
`tf.numpy_function`). It keeps the shard versions the worker's weights came from, the
staleness and gamma the PS reported, and the worker's step timing (`StepTimer`).
"""

from __future__ import annotations

import numpy as np

from ..hetero import Slowdown
from ..step_timer import StepTimer
from .client import PsClient, PsRefused, merged

MAX_NON_FINITE_IN_A_ROW = 10


class PushPull:
    """The worker's side of one step: push this gradient, receive the weights to compute on next.

    Args:
        client: the worker's connection to every shard.
        plan: the variable names each shard holds.
        names: the model's trainable variables' names, in model order.
        batch_size: weights this worker's gradients in a synchronous (ssgd) average.
        slowdown: this worker's simulated slowness (`--simulate`), if any.
    """

    def __init__(self, client: PsClient, plan: list[list[str]], names: list[str], batch_size: int | None = None,
                 slowdown: Slowdown | None = None):
        self.client, self.plan, self.names = client, plan, names
        self.shard_of = {name: i for i, shard in enumerate(plan) for name in shard}
        self.batch_size = batch_size
        self.slowdown = slowdown or Slowdown(None)
        self.timer = StepTimer()
        self.versions = [0] * len(plan)
        self.staleness = 0
        self.gamma = None
        self.steps = 0
        self.non_finite = 0  # pushes in a row the PS rejected for NaN / inf
        self.stop_requested = False  # the PS said: end this fit (a graceful stop, or this worker was evicted)
        self.phase: str | None = None  # the phase the PS answered with (ASHL)
        self.current: list[np.ndarray] = []  # the weights last received
        self.virtual = None  # a VirtualClock on the virtual clock (nothing sleeps then)
        self.pulled: dict = {}  # the header of the last pull's first reply (the run's step cost, on the virtual clock)

    def pull(self) -> list[np.ndarray]:
        """The current weights (the start of a fit)."""
        replies = self.client.request("pull")
        self.pulled = replies[0].header
        return self._weights(replies)

    def done(self) -> list[np.ndarray]:
        """The final weights, once every worker has finished its fit (the end-of-fit barrier)."""
        replies = self.client.request("done", **self.clock_fields())
        self._virtual_reply(replies)
        return self._weights(replies)

    def clock_fields(self) -> dict:
        """Where this worker is on the virtual clock (nothing on the real one)."""
        return {} if self.virtual is None else {"vt": self.virtual.now}

    def _virtual_reply(self, replies) -> None:
        vts = [r.header["vt"] for r in replies if isinstance(r.header.get("vt"), (int, float))]
        if self.virtual is not None and vts:
            self.virtual.replied(max(vts), sum(a.nbytes for r in replies for a in r.arrays.values()))

    def push(self, *gradients, steps: int = 1) -> list[np.ndarray]:
        """One step's gradients (or `steps` steps' update), in `names` order; the weights to compute on next."""
        self.steps += 1
        if self.virtual is None:
            real = self.timer.compute_ended()
            slept = self.slowdown.stretch(self.timer.typical_compute_s())
            self.timer.exchange_started(None if real is None else real + slept)
        else:
            self.virtual.local_steps(steps - 1)
        return self.exchange(dict(zip(self.names, gradients)), {"step": self.steps, "batch": self.batch_size})

    def exchange(self, grads: dict, fields: dict, compute_steps: int = 1) -> list[np.ndarray]:
        """Send `grads` (name -> array) with header `fields`; the weights that come back. On the virtual
        clock the push arrives after `compute_steps` steps (0: steps already counted, a flush)."""
        if self.virtual is not None:
            return self._exchange_virtual(grads, fields, compute_steps)
        moved = self.client.bytes_sent + self.client.bytes_received
        held_s = 0.0
        try:
            replies = self.client.request("push", split(grads, self.shard_of, len(self.plan)),
                                          [{"version": v} for v in self.versions], **fields)
            held_s = max(r.header.get("held_s") or 0.0 for r in replies)  # waiting for a round: not communication
        except PsRefused as exc:
            if exc.reason != "non_finite":
                raise
            return self._skip_non_finite(exc)
        finally:
            self.slowdown.charge(self.client.bytes_sent + self.client.bytes_received - moved)
            self.timer.exchange_ended(held_s)
        return self._answered(replies)

    def _exchange_virtual(self, grads: dict, fields: dict, compute_steps: int) -> list[np.ndarray]:
        """The virtual clock's exchange: no sleeps; the push says when it arrives, the reply when it left."""
        virtual, sent = self.virtual, sum(np.asarray(g).nbytes for g in grads.values())
        fields = {**fields, **virtual.push_fields(sent, steps=compute_steps)}
        try:
            replies = self.client.request("push", split(grads, self.shard_of, len(self.plan)),
                                          [{"version": v} for v in self.versions], **fields)
        except PsRefused as exc:
            if exc.reason != "non_finite":
                raise
            virtual.local_steps(1)
            return self._skip_non_finite(exc)
        self._virtual_reply(replies)
        self.timer.compute_s = virtual.compute_s()
        self.timer.comm_s = virtual.link_s(sent) * 2
        self.timer.comm_total_s += self.timer.comm_s
        return self._answered(replies)

    def _answered(self, replies) -> list[np.ndarray]:
        self.non_finite = 0
        self.staleness = max(r.header.get("staleness", 0) for r in replies)
        gammas = [r.header["gamma"] for r in replies if r.header.get("gamma") is not None]
        self.gamma = min(gammas) if gammas else None
        self.phase = replies[0].header.get("phase", self.phase)
        return self._weights(replies)

    def _skip_non_finite(self, refusal) -> list[np.ndarray]:
        """A NaN / inf gradient is not applied; the step continues from the PS's current weights."""
        self.non_finite += 1
        if self.non_finite >= MAX_NON_FINITE_IN_A_ROW:
            raise FloatingPointError(
                f"{self.non_finite} gradients in a row held NaN or inf ({refusal}); the PS applied none of them "
                "and kept its weights. Lower the learning rate, check the inputs for NaN, or add gradient "
                "scaling, then re-run (with --resume to continue from the last checkpoint).")
        return self.pull()

    def _weights(self, replies) -> list[np.ndarray]:
        self.versions = [r.header["version"] for r in replies]
        self.stop_requested = self.stop_requested or any(r.header.get("stop") for r in replies)
        new = merged(replies)
        self.current = [np.array(new[name]) for name in self.names]  # own copies: the frames are read-only
        return self.current

    def metrics(self) -> dict:
        """This worker's fields of the metrics record (DESIGN.md section 8)."""
        extra = {"phase": self.phase} if self.phase else {}
        timer = self.timer
        return {"staleness": self.staleness, "gamma": self.gamma, "bytes_sent": self.client.bytes_sent,
                "comm_s": _round(timer.comm_s), "compute_s": _round(timer.compute_s), **extra}


def _round(value: float | None):
    return None if value is None else round(value, 5)


def split(arrays: dict, shard_of: dict[str, int], shards: int) -> list[dict]:
    """Arrays per shard; a compressed variable's parts (``name|idx``, ``name|val``) go with it."""
    out: list[dict] = [{} for _ in range(shards)]
    for key, array in arrays.items():
        out[shard_of[key.split("|")[0]]][key] = array
    return out
