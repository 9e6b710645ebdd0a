"""One parameter-server shard: a process that owns some variables and applies workers' pushes.

Run as ``python -m nbdist.ps.server`` with a JSON config on stdin (the per-run key among
it, so it never shows in a process list); prints ``READY <port>`` once bound. Every
message in or out is a `wire` message; anything that fails a check is answered with
``rejected``, counted and logged to stderr, and never applied.

Consistency (DESIGN.md section 5, exact reading in docs/strategies/nfdt.md): with
``max_staleness`` s, a push is applied only when, counted with it, its worker's pushed
steps lead the slowest live worker's by at most max(s, 1); with s = 0 the reply (the new
weights) is also held until every live worker has pushed as many steps: lock-step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace

import numpy as np

from . import rules, wire
from .compression import decode_push
from .coordination import Coordination
from ..optimizer_state import ITERATIONS
from .updaters import make_updater

HEARTBEAT_TIMEOUT_S = 5.0
ZERO_COPY_FROM = 1 << 16  # bytes: smaller arrays are copied into the message, larger ones sent by reference
LOG_LIMIT = 500_000  # push-log entries kept; past it the log stops growing (counters go on)
CONTROLLER = "controller"
CONTROLLER_KINDS = {"state", "stats", "restore", "stop", "heartbeat", "control"}
CONTROL_ACTIONS = ("pause", "resume", "stop", "lr_scale", "max_staleness", "evict", "allocate", "switch_phase")
HELD_KINDS = ("pull", "push", "done", "turn", "profile", "epoch")  # answered when their condition holds
LOG_FIELDS = ("t", "worker", "step", "version", "staleness", "outcome", "lead", "gamma", "momentum", "comp_norm",
              "lr")


@dataclass
class WorkerState:
    pushed: int = 0
    last_seen: float | None = None  # None until its first message: importing TensorFlow is not death
    alive: bool = True
    done: bool = False
    evicted: bool = False
    died_at: float | None = None


class Shard:
    """The state and rules of one shard; `handle` maps one decoded message to its replies."""

    def __init__(self, config: dict):
        self.index: int = config.get("shard", 0)
        self.max_staleness: int | None = config.get("max_staleness")
        self.rule: dict | None = config.get("rule")  # None: the cell's optimizer; see updaters.make_updater
        self.synchronous: bool = bool(config.get("synchronous"))  # ssgd: one averaged update per round
        self.momentum: float | None = config.get("momentum")
        self.optimizer_backend: str = config.get("optimizer_backend", "auto")  # "keras": never the numpy rules
        self.heartbeat_timeout_s: float = config.get("heartbeat_timeout_s", HEARTBEAT_TIMEOUT_S)
        self.max_bytes: int = config.get("max_bytes", wire.DEFAULT_MAX_BYTES)
        self.workers = {k: WorkerState() for k in range(config["workers"])}
        self.variables: dict[str, np.ndarray] = {}
        self.updater = None
        self.frozen: dict[str, np.ndarray] = {}
        self.layout: list = []
        self.spec: rules.OptimizerSpec | None = None
        self.version = 0
        self.restored: dict | None = None
        self.counts = Counter(applied=0, acked=0, dropped=0, rejected=0)
        self.rejections: Counter = Counter()
        self.log: list[list] = []
        self.events: list[dict] = []
        self.in_flight: dict[int, tuple] = {}  # id(array) -> (array, zmq trackers of the replies sending it)
        self.waiting: list[tuple[bytes, wire.Message]] = []  # held pulls, pushes and dones, in arrival order
        self.held_replies: list[tuple[bytes, int, int]] = []  # (ident, worker, pushed) under s = 0
        self.epoch_logs: dict[int, dict[int, dict]] = {}  # epoch -> worker -> its epoch-end logs
        self.at_barrier: set[int] = set()  # workers waiting for the others' epoch-end logs
        self.round: dict[int, tuple] = {}  # ssgd: worker -> (ident, step, gradients, batch) of this round
        self.round_arrived: dict[int, float] = {}  # ... and when each push arrived (its wait is not communication)
        self.stopping = False
        self.finalized = False  # the end-of-fit finalisation (EMA) was done
        self.paused = False  # control: hold every pull and push, so the version stands still
        self.finishing = False  # control: graceful stop, every push reply tells its worker to end its fit
        self.lr_scale = 1.0
        self.coordination = Coordination(config["ashl"]) if config.get("ashl") is not None else None

    # -- checks ------------------------------------------------------------------------
    @property
    def initialised(self) -> bool:
        return bool(self.variables)

    def live(self) -> list[int]:
        return [k for k, w in self.workers.items() if w.alive and not w.done and not w.evicted]

    def slowest(self) -> int | None:
        counts = [self.workers[k].pushed for k in self.live()]
        return min(counts) if counts else None

    def lead(self) -> int:
        counts = [self.workers[k].pushed for k in self.live()]
        return max(counts) - min(counts) if counts else 0

    def expected(self) -> dict:
        return {name: (v.shape, v.dtype.name) for name, v in self.variables.items()}

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
        if worker >= 0:
            self.workers[worker].last_seen = time.time()
        kind = message.kind
        if kind == "heartbeat":
            return [(ident, "pong", None, {"version": self.version})]
        if kind == "init":
            return [(ident, *self._init(message)), *self.release()]
        if kind in ("push", "probe"):
            if not self.initialised:
                raise wire.Rejected("malformed", f"{kind} before init")
            self._decode_push(message)
            wire.check_arrays(message.arrays, self.expected())
            if kind == "push" and not isinstance(message.header.get("version"), int):
                raise wire.Rejected("malformed", "push without the version its gradient was computed on")
        if kind == "probe":  # a timed round trip of a push's size (ASHL profiling): nothing is applied
            return [(ident, "weights", dict(self.variables), {"version": self.version})]
        if kind in ("turn", "profile", "report"):
            self._coordinate(worker, message)
        if kind == "report":
            return [(ident, "ok", None, self._coordination_reply())]
        if kind == "done":
            self.workers[worker].done = True
            self._end_laggards()
        if kind == "epoch":
            self._post_epoch(worker, message.header)
        if kind == "learning_rate":
            value = message.header.get("value")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise wire.Rejected("malformed", f"a learning rate is a positive number, not {value!r}")
            if self.initialised:
                self.updater.set_learning_rate(float(value))
            self.events.append({"t": time.time(), "event": "learning_rate", "value": float(value)})
            return [(ident, "ok", None, {})]
        if kind == "pull":  # the start of a (next) fit call
            self.workers[worker].done = False
            self.finalized = False
            if self.finishing == "laggards":
                self.finishing = False
        if kind in HELD_KINDS:
            self.waiting.append((ident, message))
            return [*self._complete_round(), *self.release()]  # a worker done with its fit leaves the round
        if kind == "state":
            return [(ident, "state", self._state_arrays(), self._summary())]
        if kind == "stats":
            since = int(message.header.get("since") or 0)
            return [(ident, "stats", None, {**self._summary(), "log_fields": LOG_FIELDS, "log": self.log[since:],
                                             "since": since, "events": self.events})]
        if kind == "control":
            return [(ident, "ok", None, self._control(message.header)), *self._complete_round(), *self.release()]
        if kind == "restore":
            self.restored = {"arrays": {k: np.array(v) for k, v in message.arrays.items()},
                             "version": int(message.header.get("version", 0))}
            return [(ident, "ok", None, {})]
        if kind == "stop":
            self.stopping = True
            return [(ident, "ok", None, {})]
        raise wire.Rejected("malformed", f"unknown kind {kind!r}")

    def _decode_push(self, message: wire.Message) -> None:
        reason = message.header.get("compression_reason")
        if reason:
            self.events.append({"t": time.time(), "event": "compression", "worker": message.header.get("worker"),
                                "mode": message.header.get("compression"), "reason": str(reason)[:200]})
        try:
            message.arrays = decode_push(message.arrays, message.header.get("compression"), self.expected())
        except ValueError as exc:
            raise wire.Rejected("malformed", f"compressed push: {exc}") from None

    def _post_epoch(self, worker: int, header: dict) -> None:
        epoch, logs = header.get("epoch"), header.get("logs")
        if not isinstance(epoch, int) or not isinstance(logs, dict) or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in logs.values()):
            raise wire.Rejected("malformed", "an epoch message carries an int epoch and numeric logs")
        self.epoch_logs.setdefault(epoch, {})[worker] = logs
        self.at_barrier.add(worker)

    def _agreed_epoch(self, worker: int, epoch: int) -> dict | None:
        """The reply fields (the mean of every worker's logs for `epoch`) once every live worker has posted them."""
        posted = self.epoch_logs.get(epoch, {})
        if any(k not in posted for k in self.live()):
            return None
        self.at_barrier.discard(worker)
        keys = sorted({k for logs in posted.values() for k in logs})
        mean = {k: sum(logs[k] for logs in posted.values() if k in logs) / sum(k in logs for logs in posted.values())
                for k in keys}
        for old in [e for e in self.epoch_logs if e < epoch - 1]:
            del self.epoch_logs[old]
        return {"logs": mean, "workers": sorted(posted)}

    def _coordinate(self, worker: int, message: wire.Message) -> None:
        if self.coordination is None:
            raise wire.Rejected("malformed", f"{message.kind} is for --strategy ashl; this run is not one")
        try:
            if message.kind == "turn":
                self.coordination.ask_turn(worker)
            elif message.kind == "profile":
                self.coordination.post_profile(worker, message.header.get("profile"))
            elif message.kind == "report":
                self.coordination.post_report(worker, message.header.get("report"))
        except ValueError as exc:
            raise wire.Rejected("malformed", str(exc)) from None

    def _coordination_reply(self) -> dict:
        return {"allocation": self.coordination.allocation, **self._phase()}

    def _phase(self) -> dict:
        """ASHL's phase, told with every reply to its workers (other strategies have none)."""
        return {} if self.coordination is None else {"phase": "shl" if self.synchronous else "ahl"}

    def _init(self, message: wire.Message):
        trainable = set(message.header.get("trainable") or [])
        names = [n for n in message.arrays if n in trainable]
        if self.initialised:  # resumed, or a later fit of the same cell: the PS keeps its state
            if sorted(names) != sorted(self.variables):
                return "error", None, {"message": f"shard {self.index} holds {sorted(self.variables)[:3]}..., "
                                                  f"this model has {sorted(names)[:3]}...; the model changed "
                                                  "between fit calls of one run"}
            return "ok", None, {"version": self.version, "kept": True}
        # the notebook optimizer's slots for these variables ("<name>:<slot>"), when it has state
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
        for name in names:
            value = np.array(source[name], dtype=message.arrays[name].dtype)
            if value.shape != message.arrays[name].shape:
                return "error", None, {"message": f"checkpoint {name} has shape {value.shape}, the model "
                                                  f"{message.arrays[name].shape}"}
            self.variables[name] = value
        self.updater = make_updater(self.rule, self.spec, self.variables, saved, iterations, self.optimizer_backend)
        self.frozen = {k: np.array(v) for k, v in message.arrays.items()
                       if k not in self.variables and k not in saved}
        self.layout = message.header.get("layout") or []
        self.events.append({"t": time.time(), "event": "init", "version": self.version,
                            "resumed": self.restored is not None, "iterations": iterations})
        return "ok", None, {"version": self.version, "kept": False}

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
            for held in list(self.held_replies):
                ident, worker, pushed = held
                slowest = self.slowest()
                if slowest is None or pushed <= slowest or not self.workers[worker].alive:
                    self.held_replies.remove(held)
                    replies.append((ident, "weights", self._weights_for(worker), {"version": self.version}))
                    progressed = True
        return replies

    def _control(self, header: dict) -> dict:
        """Apply one dashboard control; the reply (the shard's control state) is the acknowledgement."""
        action, value = header.get("action"), header.get("value")
        if action not in CONTROL_ACTIONS:
            raise wire.Rejected("malformed", f"unknown control {action!r}; one of {CONTROL_ACTIONS}")
        if action in ("pause", "resume"):
            self.paused = action == "pause"
        elif action == "stop":
            self.finishing, self.paused = True, False
        elif action == "lr_scale":
            if not isinstance(value, (int, float)) or not value > 0:
                raise wire.Rejected("malformed", f"lr_scale must be a positive number, not {value!r}")
            self.lr_scale = float(value)
        elif action == "max_staleness":
            if value is not None and (not isinstance(value, int) or value < 0):
                raise wire.Rejected("malformed", f"max_staleness must be a whole number >= 0 or null, not {value!r}")
            self.max_staleness = value
        elif action == "evict":
            if value not in self.workers:
                raise wire.Rejected("unknown_worker", f"cannot evict worker {value!r}")
            self.workers[value].evicted = True
        elif action == "allocate":
            if self.coordination is None:
                raise wire.Rejected("malformed", "allocate is for --strategy ashl")
            try:
                self.coordination.allocate(value)
            except ValueError as exc:
                raise wire.Rejected("malformed", str(exc)) from None
        elif action == "switch_phase":
            self._switch_to_synchronous()
        self.events.append({"t": time.time(), "event": f"control:{action}", "value": value})
        return self.control_state()

    def _switch_to_synchronous(self) -> None:
        """ASHL's SHL phase: one batch-weighted mean per round, applied by the cell's own optimizer."""
        if self.synchronous:
            return
        if self.coordination is None:
            raise wire.Rejected("malformed", "switch_phase is for --strategy ashl")
        self.synchronous, self.max_staleness = True, None
        if self.initialised:
            self.updater = make_updater(None, self.spec, self.variables, {}, getattr(self.updater, "iterations", 0),
                                        self.optimizer_backend)

    def control_state(self) -> dict:
        return {"paused": self.paused, "finishing": self.finishing, "lr_scale": self.lr_scale,
                "max_staleness": self.max_staleness, "version": self.version, "synchronous": self.synchronous,
                "evicted": [k for k, w in self.workers.items() if w.evicted]}

    def _try(self, ident: bytes, message: wire.Message):
        worker = message.header.get("worker")
        if not self.workers[worker].alive:
            return []  # dropped as dead while waiting: nobody to answer
        if self.workers[worker].evicted and message.kind != "pull":  # its fit ends now, with the weights so far
            return [(ident, "weights", self._weights_for(worker), {"version": self.version, "stop": True})]
        if self.paused:
            return None
        if message.kind == "pull":
            if not self.initialised:
                return None
            return [(ident, "weights", self._weights_for(worker), {"version": self.version})]
        if message.kind == "done":  # the end-of-fit barrier: answered once no live worker is still training
            if self.live():
                return None
            if not self.finalized and hasattr(self.updater, "finalize"):  # EMA: the averages become the weights
                self.updater.finalize({n: self._unshared(self.variables, n) for n in self.variables})
            self.finalized = True
            return [(ident, "weights", self._weights_for(worker), {"version": self.version})]
        if message.kind == "turn":
            return [(ident, "ok", None, {})] if self.coordination.turn_ready(worker, self.live()) else None
        if message.kind == "profile":
            return [(ident, "ok", None, self._coordination_reply())] if self.coordination.allocation else None
        if message.kind == "epoch":
            agreed = self._agreed_epoch(worker, message.header["epoch"])
            return None if agreed is None else [(ident, "ok", None, agreed)]
        return self._try_push(ident, worker, message)

    def _weights_for(self, worker: int) -> dict:
        self.updater.sent(worker, self.variables)
        return dict(self.variables)

    def _try_push(self, ident, worker, message):
        state = self.workers[worker]
        bound = self.max_staleness
        if bound is not None:
            others = [self.workers[k].pushed for k in self.live() if k != worker]
            if others and state.pushed + 1 - min(others) > max(bound, 1):
                return None
        if self.synchronous and worker in self.round:
            return None  # a worker that pushes more often than the round's pace waits for the next round
        state.pushed += 1
        if self.synchronous:
            self.round[worker] = (ident, message.header.get("step"), message.arrays, message.header.get("batch") or 1)
            self.round_arrived[worker] = time.time()
            return self._complete_round()
        staleness = self.version - message.header["version"]
        grads = message.arrays
        scale = self.coordination.batch_scale(message.header.get("batch")) if self.coordination is not None else 1.0
        if scale != 1.0:
            grads = {name: g * np.asarray(scale, g.dtype) for name, g in grads.items()}
        info = self._update(grads, worker, staleness)
        self._log(worker, message.header.get("step"), staleness, info)
        self.counts["acked"] += 1
        if bound == 0:
            slowest = self.slowest()
            if slowest is not None and state.pushed > slowest:
                self.held_replies.append((ident, worker, state.pushed))
                return []
        return [(ident, "weights", self._weights_for(worker),
                 {"version": self.version, "staleness": staleness, "gamma": info["gamma"], "stop": self.finishing,
                  **self._phase()})]

    def _update(self, grads: dict, worker: int, staleness: int) -> dict:
        variables = {name: self._unshared(self.variables, name) for name in grads}
        info = self.updater.apply(variables, grads, worker, staleness, self.version, self.lr_scale)
        if info["outcome"] == "applied":
            self.version += 1
        self.counts[info["outcome"]] += 1
        return info

    def _complete_round(self) -> list:
        """ssgd: once every live worker has pushed, apply their batch-weighted mean once and answer all.

        ASHL's SHL: the round waits for the workers that push every step; one that pushes every
        k steps (a slow link) joins whichever round its push reaches, weighted by its samples.
        """
        if not self.round or any(k not in self.round for k in self._pacers()):
            return []
        entries, self.round = self.round, {}
        total = sum(batch for _, _, _, batch in entries.values())
        mean = {name: sum(grads[name].astype(np.float64) * (batch / total) for _, _, grads, batch in entries.values())
                .astype(self.variables[name].dtype) for name in self.variables}
        info = self._update(mean, -1, 0)
        replies, now = [], time.time()
        for worker, (ident, step, _, _) in entries.items():
            self._log(worker, step, 0, info)
            self.counts["acked"] += 1
            held_s = round(now - self.round_arrived.pop(worker, now), 6)
            if self.workers[worker].alive:
                replies.append((ident, "weights", self._weights_for(worker),
                                {"version": self.version, "staleness": 0, "stop": self.finishing, "held_s": held_s,
                                 **self._phase()}))
        return replies

    def _end_laggards(self) -> None:
        """ASHL: once the workers that push every step have ended their fit, the others end theirs after
        the batch in hand. What remains of their shards is small, and pushes they made alone, many
        steps stale, would move the model the others finished."""
        if self.coordination is None or not self.coordination.allocation or self.finishing:
            return
        present = [k for k, w in self.workers.items() if w.alive and not w.evicted]
        periods = self.coordination.allocation.get("periods") or [1] * len(self.workers)
        shortest = min((periods[k] for k in present), default=1)
        setters = [k for k in present if periods[k] == shortest]
        lagging = [k for k in present if not self.workers[k].done]
        if lagging and all(self.workers[k].done for k in setters):
            self.finishing = "laggards"
            self.events.append({"t": time.time(), "event": "end_laggards", "workers": lagging,
                                "reason": f"workers {setters} finished their epochs; {lagging} stop after "
                                          "their current batch"})

    def _pacers(self) -> list[int]:
        """The live workers a synchronous round waits for: those with the shortest push period (a worker
        waiting at the epoch's end pushes nothing more this epoch)."""
        live = [k for k in self.live() if k not in self.at_barrier]
        periods = (self.coordination.allocation or {}).get("periods") if self.coordination is not None else None
        if not periods or not live:
            return live
        shortest = min(periods[k] for k in live)
        return [k for k in live if periods[k] == shortest]

    def sent(self, shared) -> None:
        """Large arrays go out zero-copy: remember, per (array, tracker), what ZeroMQ may still be reading."""
        for array, tracker in shared:
            self.in_flight.setdefault(id(array), (array, []))[1].append(tracker)

    def _unshared(self, container: dict, key: str) -> np.ndarray:
        """`container[key]`, safe to update in place: copied first if a reply is still sending it."""
        array = container[key]
        entry = self.in_flight.pop(id(array), None)
        # Replies to different workers leave through different pipes: any of them may still be queued.
        if entry is not None and not all(tracker.done for tracker in entry[1]):
            container[key] = array = array.copy()
        return array

    def _log(self, worker, step, staleness, info: dict):
        if len(self.log) < LOG_LIMIT:
            self.log.append([round(time.time(), 4), worker, step, self.version, staleness, info["outcome"],
                             self.lead(), info.get("gamma"), info.get("momentum"), info.get("comp_norm"),
                             info.get("lr")])

    def reject(self, reason: str, detail: str, worker=None) -> None:
        self.counts["rejected"] += 1
        self.rejections[reason] += 1
        if isinstance(worker, int) and worker in self.workers:
            self._log(worker, None, None, {"outcome": f"rejected:{reason}"})
        print(f"nbdist-ps shard {self.index}: rejected {reason} ({detail}) from worker {worker!r}",
              file=sys.stderr, flush=True)

    def check_heartbeats(self, now: float) -> list:
        """Drop workers silent for longer than the heartbeat timeout; answer what that frees."""
        dropped = False
        for k, w in self.workers.items():
            if w.alive and not w.done and w.last_seen is not None and now - w.last_seen > self.heartbeat_timeout_s:
                w.alive, w.died_at, dropped = False, now, True
                self.events.append({"t": now, "event": "worker_dropped", "worker": k, "pushed": w.pushed,
                                    "silent_s": round(now - w.last_seen, 2)})
                print(f"nbdist-ps shard {self.index}: worker {k} silent for {now - w.last_seen:.1f} s, dropped",
                      file=sys.stderr, flush=True)
        return (self._complete_round() + self.release()) if dropped else []

    def _summary(self) -> dict:
        return {"shard": self.index, "version": self.version, "counts": dict(self.counts),
                "rule": self.rule, "synchronous": self.synchronous, "control": self.control_state(),
                "rejections": dict(self.rejections), "layout": self.layout, "names": list(self.variables),
                "coordination": self.coordination.summary() if self.coordination is not None else None,
                "optimizer": asdict(self.spec) if self.spec else None,
                "workers": {k: {"pushed": w.pushed, "alive": w.alive, "done": w.done, "died_at": w.died_at}
                            for k, w in self.workers.items()}}

    def _state_arrays(self) -> dict:
        """Copies (a checkpoint is rare; copies need no tracking while they are sent)."""
        return {**{n: np.array(v) for n, v in self.variables.items()}, **self.updater.state(), **self.frozen}


def serve(config: dict, key: bytes, ready=print) -> None:
    """Bind, announce the port through `ready`, and answer messages until told to stop."""
    import zmq

    shard = Shard(config)
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 1000)
    port = socket.bind_to_random_port(f"tcp://{config.get('bind', '127.0.0.1')}")
    ready(f"READY {port}")
    parent = os.getppid()
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)

    def send(replies):
        for ident, kind, arrays, fields in replies:
            frames = wire.encode(key, kind, arrays, **fields)
            out, shared = [ident, *frames[:2]], []
            for array, buffer in zip((arrays or {}).values(), frames[2:]):
                if len(buffer) < ZERO_COPY_FROM:
                    out.append(bytes(buffer))
                else:  # each frame tracked on its own: one message's frames are released separately
                    frame = zmq.Frame(buffer, copy=False, track=True)
                    out.append(frame)
                    shared.append((array, frame.tracker))
            socket.send_multipart(out, copy=False)
            shard.sent(shared)

    try:
        while not shard.stopping:
            if poller.poll(200):
                frames = socket.recv_multipart(copy=False)
                ident, body = frames[0].bytes, frames[1:]
                try:
                    message = wire.decode(key, body, max_bytes=shard.max_bytes)
                    send(shard.handle(ident, message))
                except wire.Rejected as exc:
                    worker = _claimed_worker(body)
                    shard.reject(exc.reason, str(exc), worker)
                    send([(ident, "rejected", None, {"reason": exc.reason, "detail": str(exc)[:300]})])
            send(shard.check_heartbeats(time.time()))
            if os.getppid() != parent:  # whoever started us is gone: do not linger as an orphan
                break
    finally:
        socket.close()
        context.term()


def _claimed_worker(frames):
    try:
        return json.loads(bytes(frames[0].buffer if hasattr(frames[0], "buffer") else frames[0])).get("worker")
    except Exception:  # the claim of a malformed message is only for the log
        return None


def main() -> None:
    config = json.loads(sys.stdin.readline())
    key = bytes.fromhex(config.pop("key"))
    serve(config, key, ready=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
