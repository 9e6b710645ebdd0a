"""A worker's exchange with the parameter server: push a gradient, receive the weights to compute on next.

One `PushPull` lives for one `fit`; its `push` runs inside the compiled train step (a
`tf.numpy_function`). It keeps the shard versions the worker's weights came from, the
staleness and gamma the PS reported, and the worker's step timing (`StepTimer`).

With `overlap()` (`--overlap`, the default of the asynchronous strategies on the real clock)
a push returns at once with the weights of the exchange before it, while its own exchange
runs in a background thread: the next step computes during the round trip, on weights one
exchange older (one more version of staleness, which the PS sees in the push's version).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..host.hetero import Slowdown
from ..host.step_timer import StepTimer
from .client import PsClient, PsRefused
from .flat_layout import FlatLayout, is_flat

MAX_NON_FINITE_IN_A_ROW = 10
# a loss-scaled optimizer's overflowing steps are skipped by design, each halving its scale: from Keras' initial
# 2**15, 40 halvings in a row reach 2**-25, where no float16 gradient overflows any more
MAX_LOSS_SCALE_OVERFLOWS_IN_A_ROW = 40


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
        self.non_finite_limit = MAX_NON_FINITE_IN_A_ROW
        self.stop_asked = False  # the PS said: end this fit (a graceful stop, or this worker was evicted)
        self.phase: str | None = None  # the phase the PS answered with (ASHL)
        self.current: list[np.ndarray] = []  # the weights last received
        self.layouts: list[FlatLayout] | None = None  # each shard's, from the first push: then pushes and replies
        # are one buffer per dtype and shard
        self.virtual = None  # a VirtualClock on the virtual clock (nothing sleeps then)
        self.pulled: dict = {}  # the header of the last pull's first reply (the run's step cost, on the virtual clock)
        self.on_answer = None  # called with shard 0's header of every answer to a push (--data dynamic)
        self.report = None  # the header fields every push carries to shard 0's dealer (--data dynamic)
        self._flight: ThreadPoolExecutor | None = None  # overlap: the one thread exchanges run in
        self._in_flight = None  # overlap: the future of the exchange not yet taken up, -> (weights, versions)
        self._computed_on: list[int] = []  # overlap: the versions of the weights the model computes on now
        self._inside = threading.local()  # overlap: set in the exchange thread
        self.waited_s = 0.0  # overlap: time steps waited for an exchange to finish
        self.flight_s = 0.0  # overlap: the exchanges' own time

    # -- overlapping the exchange with the next step ------------------------------------------
    def overlap(self) -> None:
        """From now on each push returns the weights of the exchange before it while its own is in flight."""
        self._flight = ThreadPoolExecutor(1, thread_name_prefix="nbdist-push")
        self._computed_on = list(self.versions)
        self.client.before_request = self.settle  # nothing else may use the sockets while an exchange is out

    def settle(self) -> None:
        """Wait until no exchange is in flight (its weights stay for the next push to take up)."""
        if self._in_flight is not None and not getattr(self._inside, "yes", False):
            self._in_flight.exception()

    def close(self) -> None:
        """Finish the exchange in flight and stop its thread (the end of a fit)."""
        if self._flight is not None:
            self.settle()
            self.client.before_request = None
            self._flight.shutdown(wait=True)
            self._flight = None
            if self._in_flight is not None:
                self._in_flight.result()  # an exchange that failed fails the fit here

    def abandon(self) -> None:
        """The fit failed or was interrupted: the exchange in flight gives up within one poll of its sockets."""
        if self._flight is not None:
            self.client.abort()
            self._flight.shutdown(wait=True)
            self._flight = None

    def overlap_timings(self) -> dict:
        """What the overlap hid: the steps' waits for their exchanges against the exchanges' own time."""
        if not self.flight_s:
            return {}
        return {"exchange_waited_s": round(self.waited_s, 6), "exchange_flight_s": round(self.flight_s, 6),
                "exposed_exchange_fraction": round(self.waited_s / self.flight_s, 4)}

    def _push_overlapped(self, grads: dict, fields: dict) -> list[np.ndarray]:
        previous = self._in_flight
        self._in_flight = self._flight.submit(self._fly, grads, fields, list(self._computed_on))
        if previous is None:  # the first push: the next step computes on the weights the fit started from
            return self.current
        waited = time.perf_counter()
        weights, self._computed_on = previous.result()
        self.waited_s += time.perf_counter() - waited
        return weights

    def _fly(self, grads: dict, fields: dict, versions: list[int]):
        self._inside.yes = True
        started = time.perf_counter()
        weights = self.exchange(grads, fields, versions=versions, timed=False)
        self.flight_s += time.perf_counter() - started
        return weights, list(self.versions)

    def pull(self, layouts: list[str] | None = None, **fields) -> list[np.ndarray]:
        """The current weights (the start of a fit); `fields`: the pull's header (`fit`: which fit of this worker);
        `layouts`: each shard's part of this worker's model (`flat_layout.layout_digest`), which the shard answers
        only once it holds that (a later fit of another model: once rank 0's init replaced the last model's)."""
        per_shard = self._flat_fields()
        if layouts is not None:
            per_shard = [{**(mine or {}), "layout": layout} for mine, layout in zip(per_shard or [None] * len(layouts),
                                                                                    layouts)]
        replies = self.client.request("pull", None, per_shard, **fields)
        self.pulled = replies[0].header
        return self._weights(replies)

    def at_epoch_end(self, first) -> list[np.ndarray]:
        """The job's weights at an epoch's barrier: shard 0's in its answer `first` to the barrier, the other shards'
        asked now (every push of the epoch was answered before the barrier: they hold it too)."""
        replies = [first]
        if len(self.plan) > 1:
            replies += self.client.request("weights", None, self._flat_fields())[1:]
        if self._flight is not None:  # the exchange still out (settled before the barrier) brings older weights
            self.settle()
            self._in_flight = None
        weights = self._answered(replies)
        self._computed_on = list(self.versions)
        return weights

    def done(self) -> list[np.ndarray]:
        """The final weights, once every worker has finished its fit (the end-of-fit barrier)."""
        replies = self.client.request("done", None, self._flat_fields(), **self.clock_fields())
        self._virtual_reply(replies)
        return self._weights(replies)

    def clock_fields(self) -> dict:
        """Where this worker is on the virtual clock (nothing on the real one)."""
        return {} if self.virtual is None else {"vt": self.virtual.now}

    def _virtual_reply(self, replies) -> None:
        vts = [r.header["vt"] for r in replies if isinstance(r.header.get("vt"), (int, float))]
        if self.virtual is not None and vts:
            self.virtual.replied(max(vts), sum(a.nbytes for r in replies for a in r.arrays.values()))

    def dealer_fields(self) -> dict:
        """What a push tells shard 0's dealer, as the push is made (not as an overlapped exchange sends it)."""
        return self.report() if self.report is not None else {}

    def push(self, *gradients, steps: int = 1) -> list[np.ndarray]:
        """One step's gradients (or `steps` steps' update), in `names` order; the weights to compute on next."""
        self.steps += 1
        if self.virtual is None:
            real = self.timer.compute_ended()
            slept = self.slowdown.stretch(self.timer.typical_compute_s())
            self.timer.exchange_started(None if real is None else real + slept)
        else:
            self.virtual.local_steps(steps - 1)
        grads, fields = dict(zip(self.names, gradients)), {"step": self.steps, "batch": self.batch_size,
                                                            **self.dealer_fields()}
        if self._flight is not None:
            weights = self._push_overlapped(grads, fields)
            self.timer.exchange_ended(0.0)  # the step waited only for the exchange before
            return weights
        return self.exchange(grads, fields)

    def exchange(self, grads: dict, fields: dict, compute_steps: int = 1, versions: list[int] | None = None,
                 timed: bool = True) -> list[np.ndarray]:
        """Send `grads` (name -> array) computed on shard `versions` (default: the last received) with
        header `fields`; the weights that come back. On the virtual clock the push arrives after
        `compute_steps` steps (0: steps already counted, a flush). `timed`: the step waits for it."""
        if self.virtual is not None:
            return self._exchange_virtual(grads, fields, compute_steps)
        moved = self.client.bytes_sent + self.client.bytes_received
        held_s = 0.0
        try:
            replies = self.client.request("push", *self._per_shard(grads, fields, versions or self.versions), **fields)
            held_s = max(r.header.get("held_s") or 0.0 for r in replies)  # waiting for a round: not communication
        except PsRefused as exc:
            if exc.reason != "non_finite":
                raise
            return self._skip_non_finite(exc)
        finally:
            self.slowdown.charge(self.client.bytes_sent + self.client.bytes_received - moved)
            if timed:
                self.timer.exchange_ended(held_s)
        return self._answered(replies)

    def _exchange_virtual(self, grads: dict, fields: dict, compute_steps: int) -> list[np.ndarray]:
        """The virtual clock's exchange: no sleeps; the push says when it arrives, the reply when it left."""
        virtual, sent = self.virtual, sum(np.asarray(g).nbytes for g in grads.values())
        fields = {**fields, **virtual.push_fields(sent, steps=compute_steps)}
        try:
            replies = self.client.request("push", *self._per_shard(grads, fields, self.versions), **fields)
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

    def _per_shard(self, grads: dict, fields: dict, versions: list[int]) -> tuple[list[dict], list[dict]]:
        """Each shard's arrays and header fields of a push: its gradients packed into one buffer per dtype,
        unless compressed (top-k selects per variable: a buffer per variable then)."""
        arrays, own = split(grads, self.shard_of, len(self.plan)), [{"version": v} for v in versions]
        if "compression" in fields:
            return arrays, own
        if self.layouts is None:
            self.layouts = [FlatLayout.of(part) for part in arrays]
        return [layout.read(part) for layout, part in zip(self.layouts, arrays)], \
            [{**mine, "flat": layout.digest} for mine, layout in zip(own, self.layouts)]

    def _flat_fields(self) -> list[dict] | None:
        """What asks the shards for flat replies, once this worker lays its pushes out flat."""
        return None if self.layouts is None else [{"flat": layout.digest} for layout in self.layouts]

    def _answered(self, replies) -> list[np.ndarray]:
        if self.on_answer is not None:
            self.on_answer(replies[0].header)
        self.non_finite = 0
        self.staleness = max(r.header.get("staleness", 0) for r in replies)
        gammas = [r.header["gamma"] for r in replies if r.header.get("gamma") is not None]
        self.gamma = min(gammas) if gammas else None
        self.phase = replies[0].header.get("phase", self.phase)
        return self._weights(replies)

    def _skip_non_finite(self, refusal) -> list[np.ndarray]:
        """A NaN / inf gradient is not applied; the step continues from the PS's current weights."""
        self.non_finite += 1
        if self.non_finite >= self.non_finite_limit:
            raise FloatingPointError(
                f"{self.non_finite} gradients in a row held NaN or inf ({refusal}); the PS applied none of them "
                "and kept its weights. Lower the learning rate, check the inputs for NaN, or add gradient "
                "scaling, then re-run (with --resume to continue from the last checkpoint).")
        weights = self.pull()
        if self.on_answer is not None:  # the next batch its refused push was dealt comes with the weights
            self.on_answer(self.pulled)
        return weights

    def tolerate_non_finite(self, loss_scaled: bool) -> None:
        """A loss-scaled optimizer's pushes overflow now and then by design (the step is skipped, the scale halved):
        they fail the run only after `MAX_LOSS_SCALE_OVERFLOWS_IN_A_ROW` in a row."""
        self.non_finite_limit = MAX_LOSS_SCALE_OVERFLOWS_IN_A_ROW if loss_scaled else MAX_NON_FINITE_IN_A_ROW

    def _weights(self, replies) -> list[np.ndarray]:
        self.versions = [r.header["version"] for r in replies]
        self.stop_asked = self.stop_asked or any(r.header.get("stop") for r in replies)
        new = {}
        for i, reply in enumerate(replies):
            own = {key: array if array.flags.writeable else np.array(array)  # received frames are read-only
                   for key, array in reply.arrays.items()}
            new.update(self.layouts[i].views(own) if is_flat(own) else own)
        self.current = [new[name] for name in self.names]
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
