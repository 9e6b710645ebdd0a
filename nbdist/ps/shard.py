"""One parameter-server shard's state and rules: `Shard.handle` maps one decoded message to its replies.

The shard owns some variables and the updater that applies gradients to them
(`nbdist.ps.updaters`); when a push is applied and its reply released is its release
policy's business (`nbdist.ps.release`); what one strategy adds (ASHL's profiles,
allocations and phase switch) comes in as a `ShardExtension`. Anything that fails a check
is answered with ``rejected``, counted and logged, and never applied.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import asdict, replace

import numpy as np

from ..limits import LIMITS
from ..keras_semantics.optimizer_state import ITERATIONS
from . import rules, wire
from .compression import decode_push
from .dealer import Dealer
from .extension import load_extension
from .flat_layout import FlatLayout, is_flat, layout_digest
from .handlers import HANDLERS, HELD_KINDS
from .push_log import LOG_FIELDS, WINDOW, PushLog
from .release import SynchronousRounds
from .updaters import CommitUpdater, make_updater
from .virtual_time import policy_for
from .worker_state import WorkerState
from .zero_copy import SharedArrays

WEIGHTS_REQUESTS = ("pull", "push", "done", "probe")  # answered with the weights
NEEDS_MODEL = ("push", "pull", "probe", "epoch", "done", "learning_rate", "report", "turn", "profile", "batch",
               "weights")
CONTROLLER = "controller"
CONTROLLER_KINDS = {"state", "stats", "restore", "stop", "heartbeat", "control", "admit", "drop"}


class Shard:
    """The state and rules of one shard; `handle` maps one decoded message to its replies."""

    log_fields = LOG_FIELDS

    def __init__(self, config: dict):
        self.index: int = config.get("shard", 0)
        self.incarnation: int = int(config.get("incarnation", 0))  # how often this shard was restarted
        self.rule: dict | None = config.get("rule")  # None: the cell's optimizer; see updaters.make_updater
        self.clock = config.get("clock", "real")
        self.policy = policy_for(config.get("max_staleness"), bool(config.get("synchronous")), self.clock,
                                 bool(config.get("start_barrier")))
        self.momentum: float | None = config.get("momentum")
        self.optimizer_backend: str = config.get("optimizer_backend", "auto")  # "keras": never the numpy rules
        self.heartbeat_timeout_s: float = config.get("heartbeat_timeout_s", LIMITS.shard_worker_silence_s)
        self.max_bytes: int = config.get("max_bytes", wire.DEFAULT_MAX_BYTES)
        self.extension = load_extension(config.get("extension"))
        # --data dynamic: shard 0 deals the batches (every worker talks to it)
        self.dealer = Dealer(config["data"]) if config.get("data") and self.index == 0 else None
        self.workers = {k: WorkerState() for k in range(config["workers"])}
        if self.incarnation:  # restarted: a worker that finished its fit before the crash says nothing more
            for worker in self.workers.values():
                worker.last_seen = time.time()
        self.flat: dict[str, np.ndarray] = {}  # one array per dtype (FlatLayout) ...
        self.variables: dict[str, np.ndarray] = {}  # ... and each variable a view into it
        self.flat_layout: FlatLayout | None = None
        self.variables_base: dict[str, np.ndarray] = {}  # the flat arrays the views were made of
        self.updater = None
        self.frozen: dict[str, np.ndarray] = {}
        self.layout: list = []
        self.spec: rules.OptimizerSpec | None = None
        self.version = 0
        self.restored: dict | None = None
        self.counts = Counter(applied=0, acked=0, dropped=0, rejected=0)
        self.rejections: Counter = Counter()
        self.log = PushLog(config.get("log_path"), config.get("log_window") or WINDOW, resume=self.incarnation > 0)
        self.events: list[dict] = []
        self.shared = SharedArrays()
        self.waiting: list[tuple[bytes, wire.Message]] = []  # held requests, in arrival order
        self.epoch_logs: dict[int, dict[int, dict]] = {}  # epoch -> worker -> its epoch-end logs
        self.epoch_vts: dict[int, dict[int, float]] = {}  # ... and when it reached the epoch's end (virtual)
        self.epoch_shares: dict[int, float] = {}  # worker -> its share of the data, the weight of its logs
        self.at_barrier: set[int] = set()  # workers waiting for the others' epoch-end logs
        self.tables: dict[int, Shard] = {0: self}  # every table of this shard process (`ps.tables`): table 0's
        # epoch barrier and batches are every table's, and a worker's push waiting at one holds its pushes to all
        self.stopping = False  # told to exit
        self.finalized = False  # the end-of-fit finalisation (EMA) was done
        self.model: str | None = None  # which model (rank 0's) the variables are of: another's fit re-initialises
        self.fit_ready = 0  # the fit (of rank 0's count) whose init arrived: a pull of a later one waits for it
        self.fits_ended = 0  # end-of-fit barriers released: a newcomer joins only the first fit
        self.paused = False  # control: hold every pull and push, so the version stands still
        self.finishing = False  # every push reply tells its worker to end its fit ...
        self.finishing_reason = ""  # ... because of a graceful "stop", or "laggards" (ASHL)
        self.lr_scale = 1.0
        self.step_cost: dict | None = None

    # -- who is where ------------------------------------------------------------------
    @property
    def initialised(self) -> bool:
        return bool(self.variables)

    @property
    def synchronous(self) -> bool:
        return isinstance(self.policy, SynchronousRounds)

    def live(self) -> list[int]:
        return [k for k, w in self.workers.items() if w.alive and not w.done and not w.evicted]

    def awaiting_batch(self, worker: int) -> bool:
        """Whether `worker` waits for a batch (`--data dynamic`): it pushes nothing, to any table, until it gets one."""
        dealer = self.tables[0].dealer
        return dealer is not None and dealer.awaiting(worker)

    def at_epoch_end(self, worker: int) -> bool:
        """Whether `worker` waits for the others' epoch-end logs: it pushes nothing, to any table, until then."""
        return worker in self.tables[0].at_barrier

    def pushing(self) -> list[int]:
        """The live workers that may still push before they hear from the shard (not waiting for a batch)."""
        return [k for k in self.live() if not self.awaiting_batch(k)]

    def pacers(self) -> list[int]:
        """The live workers a synchronous round waits for (one at an epoch's end pushes nothing more)."""
        live = [k for k in self.pushing() if not self.at_epoch_end(k)]
        return self.extension.pacers(self, live) if self.extension is not None else live

    def round_total(self, batches: list[int]) -> int:
        """What a synchronous round's batch-weighted mean divides by (the extension may say otherwise)."""
        return self.extension.round_total(self, batches) if self.extension is not None else sum(batches)

    def slowest(self) -> int | None:
        counts = [self.workers[k].pushed for k in self.pushing()]
        return min(counts) if counts else None

    def lead(self) -> int:
        counts = [self.workers[k].pushed for k in self.pushing()]
        return max(counts) - min(counts) if counts else 0

    def expected(self) -> dict:
        return {name: (v.shape, wire.dtype_name(v.dtype)) for name, v in self.variables.items()}

    def worker_of(self, message: wire.Message) -> int:
        worker = message.header.get("worker")
        if worker == CONTROLLER and message.kind in CONTROLLER_KINDS:
            return -1
        if not isinstance(worker, int) or worker not in self.workers:
            raise wire.Rejected("unknown_worker", f"worker {worker!r}")
        if not self.workers[worker].alive:
            raise wire.Rejected("unknown_worker", f"worker {worker} was dropped as dead")
        return worker

    # -- messages ----------------------------------------------------------------------
    def handle(self, ident: bytes, message: wire.Message) -> list:
        """Replies as (ident, kind, arrays, fields); held requests are answered later by `release`."""
        worker = self.worker_of(message)
        kind = message.kind
        if worker >= 0:
            self.workers[worker].last_seen = time.time()
            if kind in WEIGHTS_REQUESTS:  # (one at a time per worker: the reply answers this one)
                self.workers[worker].flat = "flat" in message.header
        if self.incarnation and not self.initialised and kind in NEEDS_MODEL:
            # a request queued for the shard that died: the worker resends it once this one announces itself
            raise wire.Rejected("restarting", "the shard was restarted and has not received its checkpoint yet")
        extension = self.extension
        if extension is not None and kind in extension.kinds + extension.held_kinds:
            fields = self._extension_call(extension.handle, worker, message)
            if kind in extension.kinds:
                return [(ident, "ok", None, fields or {})]
        elif kind in HANDLERS:
            replies = HANDLERS[kind](self, ident, worker, message)
            if kind not in HELD_KINDS:
                return replies
        else:
            raise wire.Rejected("malformed", f"unknown kind {kind!r}")
        return self.hold(ident, message)

    def hold(self, ident: bytes, message: wire.Message) -> list:
        """Keep a request until `release` can answer it; what can be answered now."""
        self.waiting.append((ident, message))
        return [*self.policy.complete_round(self), *self.release()]  # a worker done with its fit leaves the round

    def _extension_call(self, method, *args):
        try:
            return method(self, *args)
        except ValueError as exc:
            raise wire.Rejected("malformed", str(exc)) from None

    def release(self) -> list:
        """Answer every held request whose condition now holds (repeat: one release can free others)."""
        replies, progressed = [], True
        while progressed:
            progressed = False
            for item in list(self.waiting):
                reply = self._try(*item)
                if reply is not None:
                    self.waiting.remove(item)
                    replies += reply
                    progressed = True
            held = self.policy.release_held(self)
            replies += held
            progressed = progressed or bool(held)
        return replies

    def _try(self, ident: bytes, message: wire.Message):
        worker, kind = message.header.get("worker"), message.kind
        if not self.workers[worker].alive:
            return []  # dropped as dead while waiting: nobody to answer
        if self.workers[worker].evicted and kind != "pull":  # its fit ends now, with the weights so far
            return [self.weights_reply(ident, worker, stop=True)]
        if self.paused:
            return None
        if kind == "pull":
            step = {"step": self.step_cost} if self.step_cost else {}
            ready = (self.initialised and (message.header.get("fit") or 0) <= self.fit_ready  # this fit's init came
                     and message.header.get("layout") in (None, self.held_layout()))  # ... and holds this model
            return [self.weights_reply(ident, worker, stop=False, **step)] if ready else None
        if kind == "init":  # another model's, held until every worker has begun this fit
            return None if self.replacing_too_soon(worker, message) else [(ident, *self.init(message))]
        if kind == "done":  # the end-of-fit barrier: answered once no live worker is still training
            return self._end_of_fit(ident, worker)
        if kind == "epoch":
            agreed = self._agreed_epoch(worker, message.header["epoch"])
            if agreed is None:
                return None
            # (asked with weights: the model as every worker's epoch left it, before any pushes past the barrier)
            return [self.weights_reply(ident, worker, stop=False, **agreed) if message.header.get("weights")
                    else (ident, "ok", None, agreed)]
        if kind == "push":
            return self.policy.try_push(self, ident, worker, message)
        if kind == "batch":
            fields = self.dealer.answer(self, worker)
            return None if fields is None else [(ident, "ok", None, fields)]
        fields = self._extension_call(self.extension.ready, worker, message)
        return None if fields is None else [(ident, "ok", None, fields)]

    def replacing_too_soon(self, sender: int, message: wire.Message) -> bool:
        """Whether an init of another model (a later fit of the cell) must wait: a worker that has not begun this
        fit may still read the last model's final state (its optimizer slots, its statistics) from this shard."""
        model = message.header.get("model")
        if not self.initialised or model is None or self.model in (None, model):
            return False
        return any(not w.pulled for k, w in self.workers.items() if k != sender and w.alive and not w.evicted)

    def _end_of_fit(self, ident, worker):
        if self.live():
            return None
        if not self.finalized and hasattr(self.updater, "finalize"):  # EMA: the averages become the weights
            self.writable()
            self.updater.finalize(self.variables)
        if not self.finalized:
            self.fits_ended += 1
            for state in self.workers.values():  # each begins the next fit with its pull
                state.pulled = False
        self.finalized = True
        clock = {"vt": getattr(self.policy, "times").now} if self.clock == "virtual" else {}
        return [self.weights_reply(ident, worker, stop=False, **clock)]

    # -- pushes ------------------------------------------------------------------------
    def check_push(self, message: wire.Message) -> None:
        """Decode a (compressed) push or probe and check its arrays; raise `wire.Rejected` otherwise. Its
        arrays become flat (`FlatLayout`): a push of a buffer per variable is packed here."""
        if not self.initialised:
            raise wire.Rejected("malformed", f"{message.kind} before init")
        reason = message.header.get("compression_reason")
        if reason:
            self.record("compression", worker=message.header.get("worker"), mode=message.header.get("compression"),
                        reason=str(reason)[:200])
        if is_flat(message.arrays):
            if message.header.get("flat") != self.flat_layout.digest:
                raise wire.Rejected("wrong_shape", "the worker lays this shard's variables out differently: its "
                                                   "model is not the one the shard holds. Re-run the training cell "
                                                   "(a new run starts its shards from the model as it is now)")
            wire.check_arrays(message.arrays, self.flat_layout.expected())
        else:
            try:
                message.arrays = decode_push(message.arrays, message.header.get("compression"), self.expected())
            except ValueError as exc:
                raise wire.Rejected("malformed", f"compressed push: {exc}") from None
            wire.check_arrays(message.arrays, self.expected())
            message.arrays = self.flat_layout.read(message.arrays)
        version = message.header.get("version")
        if message.kind == "push" and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
            raise wire.Rejected("malformed", "push without the version its gradient was computed on")

    def apply_push(self, ident: bytes, worker: int, message: wire.Message, t: float | None = None, **fields) -> list:
        """Apply one worker's push now (the release policy said so); its reply (with `fields`). `t`: the
        push log's time (the virtual instant, on the virtual clock)."""
        batch = self.count_push(worker, message.header.get("taken"))
        # after a restart from a checkpoint a push may come from weights newer than the shard's: as stale by the gap
        staleness = abs(self.version - message.header["version"])
        grads = message.arrays
        scale = self.extension.push_scale(message.header.get("batch")) if self.extension is not None else 1.0
        if scale != 1.0:
            grads = {name: g * np.asarray(scale, g.dtype) for name, g in grads.items()}
        info = self.update(grads, worker, staleness)
        self.log_push(worker, message.header.get("step"), staleness, info, t=t, batch=batch)
        self.counts["acked"] += 1
        return [self.weights_reply(ident, worker, staleness=staleness, gamma=info["gamma"], **fields)]

    def count_push(self, worker: int, taken=None, deal: bool = True) -> list | None:
        """One more push of `worker` taken (applied, dropped by the rule, or in a round); the batches it reports
        `taken` and trained since its last report are done: [epoch, start, count, ...] (`--data dynamic` on shard 0),
        else None; it is dealt its next ones now, or (`deal` False) by `deal_next`."""
        self.workers[worker].pushed += 1
        return self.dealer.pushed(worker, taken, deal) if self.dealer is not None else None

    def deal_next(self, worker: int) -> None:
        """`worker`'s next batches (`--data dynamic`): a synchronous round deals them when it completes, rank by
        rank, so who gets which batch does not depend on the order its pushes arrived in."""
        if self.dealer is not None:
            self.dealer.top_up(worker)

    def update(self, grads: dict, worker: int, staleness: int) -> dict:
        """One update of the shard's variables by the updater, from flat gradients; what it did (DESIGN.md
        section 8 fields). The numpy rules update each flat array at once, Keras each variable."""
        flat = self.writable()
        if getattr(self.updater, "per_variable", False):
            info = self.updater.apply(self.variables, self.flat_layout.views(grads), worker, staleness, self.version,
                                      self.lr_scale)
        else:
            info = self.updater.apply(flat, grads, worker, staleness, self.version, self.lr_scale)
        if info["outcome"] == "applied":
            self.version += 1
        self.counts[info["outcome"]] += 1
        return info

    def writable(self) -> dict[str, np.ndarray]:
        """The flat arrays, safe to update in place (copied first where a reply holds one); the views follow."""
        flat = {key: self.shared.writable(self.flat, key) for key in list(self.flat)}
        if any(flat[key] is not self.variables_base[key] for key in flat):
            self.variables, self.variables_base = self.flat_layout.views(flat), dict(flat)
        return flat

    def weights(self, worker: int) -> dict[str, np.ndarray]:
        """The arrays of a weights reply to `worker`, flat if it asked so; held until sent (an update before then
        works on a copy)."""
        arrays = dict(self.flat) if self.workers[worker].flat else dict(self.variables)
        self.shared.hold(arrays.values())
        return arrays

    def held_layout(self) -> str:
        """The digest of the names and shapes of the variables this shard holds (`flat_layout.layout_digest`)."""
        return layout_digest({name: value.shape for name, value in self.variables.items()})

    def weights_reply(self, ident: bytes, worker: int, stop: bool | None = None, **fields) -> tuple:
        """The current weights for `worker` (what it computes on next), with the shard's version."""
        self.updater.sent(worker, self.flat)
        extra = self.extension.reply_fields(self) if self.extension is not None else {}
        if self.dealer is not None:  # the batches dealt to it since its last reply
            extra = {**extra, **self.dealer.deliver(worker)}
        return (ident, "weights", self.weights(worker),
                {"version": self.version, "stop": self.finishing if stop is None else stop, **extra, **fields})

    def become_synchronous(self) -> None:
        """Rounds from now on (ASHL's SHL phase), applied by the cell's own optimizer (or, where workers step
        locally and push their updates, the round's batch-weighted mean update)."""
        if self.synchronous:
            return
        previous, self.policy = self.policy, policy_for(None, True, self.clock)
        if hasattr(previous, "times"):  # the virtual clock: the workers' clocks carry on into the rounds
            self.policy.times = previous.times
        if isinstance(self.updater, CommitUpdater):  # workers step locally: a round applies its mean update whole
            self.updater = CommitUpdater(1)
        elif self.initialised:
            self.updater = make_updater(None, self.spec, self.variables, {}, getattr(self.updater, "iterations", 0),
                                        self.optimizer_backend)

    # -- epochs ------------------------------------------------------------------------
    def post_epoch(self, worker: int, header: dict) -> None:
        epoch, logs = header.get("epoch"), header.get("logs")
        if not isinstance(epoch, int) or not isinstance(logs, dict) or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in logs.values()):
            raise wire.Rejected("malformed", "an epoch message carries an int epoch and numeric logs")
        share = header.get("share", 1.0)
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not share > 0:
            raise wire.Rejected("malformed", "an epoch message's share is a positive number")
        self.epoch_logs.setdefault(epoch, {})[worker] = logs
        self.epoch_shares[worker] = float(share)
        if isinstance(header.get("vt"), (int, float)):
            self.epoch_vts.setdefault(epoch, {})[worker] = float(header["vt"])
        self.at_barrier.add(worker)

    def _agreed_epoch(self, worker: int, epoch: int) -> dict | None:
        """The reply fields (the mean of every worker's logs for `epoch`, weighted by the workers' shares of the
        data) once every live worker has posted them."""
        posted = self.epoch_logs.get(epoch, {})
        if any(k not in posted for k in self.live() if self.workers[k].first_epoch <= epoch):
            return None
        keys = sorted({k for logs in posted.values() for k in logs})
        share = self.epoch_shares
        mean = {k: sum(share[w] * logs[k] for w, logs in posted.items() if k in logs)
                / sum(share[w] for w, logs in posted.items() if k in logs) for k in keys}
        if self.extension is not None and not self.extension.epoch_closes(self, epoch, mean):
            return None
        self.at_barrier.discard(worker)
        for old in [e for e in self.epoch_logs if e < epoch - 1]:
            del self.epoch_logs[old]
            self.epoch_vts.pop(old, None)
        agreed = {"logs": mean, "workers": sorted(posted)}
        vts = self.epoch_vts.get(epoch)
        if vts:  # on the virtual clock every worker leaves the barrier when the last one reached it
            agreed["vt"] = max(vts.values())
            self.policy.barrier_released(self, [worker], agreed["vt"])
        return agreed

    # -- workers that join or go -------------------------------------------------------
    def requeue(self, worker: int) -> dict:
        """A worker that goes leaves the batches it held to the others (`--data dynamic`): how many samples."""
        return {} if self.dealer is None else {"requeued": self.dealer.lost(worker)}

    # -- controls, log, health ---------------------------------------------------------
    def record(self, kind: str, t: float | None = None, **fields) -> None:
        """Note an event of this shard (the run takes those it tells from the shard's final stats)."""
        self.events.append({"t": time.time() if t is None else t, "event": kind, **fields})

    def control(self, header: dict) -> dict:
        """Apply one control (dashboard, sidebar, `Run.control`); the reply (the control state) acknowledges it."""
        from .controls import apply_control

        action, value = header.get("action"), header.get("value")
        extension = self.extension
        if extension is not None and action in extension.controls:
            self._extension_call(extension.control, action, value)
        else:
            apply_control(self, action, value)
        self.record(f"control:{action}", value=value)
        return self.control_state()

    def control_state(self) -> dict:
        return {"paused": self.paused, "finishing": self.finishing, "lr_scale": self.lr_scale,
                "max_staleness": getattr(self.policy, "bound", None), "version": self.version,
                "synchronous": self.synchronous, "evicted": [k for k, w in self.workers.items() if w.evicted],
                "held": len(self.waiting)}  # requests held (paused, a barrier, a bound): their workers wait

    def log_push(self, worker, step, staleness, info: dict, t: float | None = None, batch=None) -> None:
        self.log.append([round(time.time() if t is None else t, 6), worker, step, self.version, staleness,
                         info["outcome"], self.lead(), info.get("gamma"), info.get("momentum"), info.get("comp_norm"),
                         info.get("lr"), batch])

    def reject(self, reason: str, detail: str, worker=None) -> None:
        self.counts["rejected"] += 1
        self.rejections[reason] += 1
        if isinstance(worker, int) and worker in self.workers:
            self.log_push(worker, None, None, {"outcome": f"rejected:{reason}"})
        print(f"nbdist-ps shard {self.index}: rejected {reason} ({detail}) from worker {worker!r}",
              file=sys.stderr, flush=True)

    def check_heartbeats(self, now: float) -> list:
        """Drop workers silent for longer than the heartbeat timeout; answer what that frees."""
        dropped = False
        for k, w in self.workers.items():
            if w.alive and not w.done and w.last_seen is not None and now - w.last_seen > self.heartbeat_timeout_s:
                w.alive, w.died_at, dropped = False, now, True
                self.record("worker_dropped", t=now, worker=k, pushed=w.pushed, silent_s=round(now - w.last_seen, 2),
                            **self.requeue(k))
                print(f"nbdist-ps shard {self.index}: worker {k} silent for {now - w.last_seen:.1f} s, dropped",
                      file=sys.stderr, flush=True)
        if dropped or self.policy.waits_on_time():  # a drop, or a deadline (the start barrier's), frees held ones
            return self.policy.complete_round(self) + self.release()
        return []

    def summary(self) -> dict:
        return {"shard": self.index, "version": self.version, "counts": dict(self.counts),
                "rule": self.rule, "synchronous": self.synchronous, "control": self.control_state(),
                "rejections": dict(self.rejections), "layout": self.layout, "names": list(self.variables),
                "coordination": self.extension.summary() if self.extension is not None else None,
                "data": self.dealer.summary() if self.dealer is not None else None,
                "optimizer": asdict(self.spec) if self.spec else None,
                "workers": {k: {"pushed": w.pushed, "alive": w.alive, "done": w.done, "died_at": w.died_at}
                            for k, w in self.workers.items()}}

    def state_arrays(self) -> dict:
        """Copies (a checkpoint is rare; copies need no tracking while they are sent); none before the model."""
        if not self.initialised:
            return {}
        return {**{n: np.array(v) for n, v in self.variables.items()}, **self.updater.state(), **self.frozen}

    # -- the model arrives -------------------------------------------------------------
    def init(self, message: wire.Message):
        """The first worker's model: variables, the notebook optimizer's slots, the updater; (kind, arrays, fields)."""
        trainable = set(message.header.get("trainable") or [])
        names = [n for n in message.arrays if n in trainable]
        model = message.header.get("model")
        if self.initialised and model is not None and self.model not in (None, model):  # another model's fit
            self.variables, self.restored = {}, None  # starts from that model's own weights, as a local fit would
        self.model, self.fit_ready = model or self.model, message.header.get("fit") or self.fit_ready
        if self.initialised:  # resumed, or a later fit of the same model in the cell: the PS keeps its state
            if sorted(names) != sorted(self.variables):
                return "error", None, {"message": f"shard {self.index} holds {sorted(self.variables)[:3]}..., "
                                                  f"this model has {sorted(names)[:3]}...; the model changed "
                                                  "between fit calls of one run"}
            return "ok", None, {"version": self.version, "kept": True}
        saved = {n: a for n, a in message.arrays.items() if n.rsplit(":", 1)[0] in trainable}
        iterations = int(message.header.get("iterations") or 0)
        source = message.arrays
        if self.restored is not None:
            source = saved = self.restored["arrays"]
            missing = [n for n in names if n not in source]
            if missing:
                return "error", None, {"message": f"the checkpoint has no variable(s) {missing[:3]}; it was "
                                                  "saved from another model"}
            self.version = self.restored["version"]
            iterations = int(np.asarray(saved.get(ITERATIONS, self.version)))
        self.spec = rules.OptimizerSpec(**message.header["optimizer"])
        if self.momentum is not None:  # --momentum overrides the cell's (asgd:momentum=0 in comparisons)
            self.spec = replace(self.spec, momentum=float(self.momentum))
        values = {}
        for name in names:
            values[name] = value = np.asarray(source[name], dtype=message.arrays[name].dtype)
            if value.shape != message.arrays[name].shape:
                return "error", None, {"message": f"checkpoint {name} has shape {value.shape}, the model "
                                                  f"{message.arrays[name].shape}"}
        self.flat_layout = FlatLayout.of(values)
        self.flat = self.flat_layout.pack(values)
        self.variables, self.variables_base = self.flat_layout.views(self.flat), dict(self.flat)
        self.updater = make_updater(self.rule, self.spec, self.variables, saved, iterations, self.optimizer_backend)
        self.frozen = {k: np.array(v) for k, v in message.arrays.items() if k not in self.variables and k not in saved}
        self.layout = message.header.get("layout") or []
        self.step_cost = message.header.get("step")  # the virtual clock's step cost, for every worker's pull
        self.record("init", version=self.version, resumed=self.restored is not None, iterations=iterations)
        return "ok", None, {"version": self.version, "kept": False}

