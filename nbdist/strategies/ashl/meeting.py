"""ASHL's meeting point on the parameter server (DESIGN.md section 6): a shard extension.

Workers profile in turn (those sharing a host one after another, once all of them have
traced their model, so they do not time each other), post their profiles and wait for the
allocation the kernel computes from them; about once a second they report their measured
step times and read the allocation then in force. Every decision is the kernel's
(`nbdist.strategies.ashl.coordinator`), sent as `allocate` and `switch_phase` controls. On the virtual
clock the switch is decided at epoch ends: the epoch barrier waits for the kernel's
`epoch_decided`, so the switch takes effect at the same virtual instant every run. On pushes:
AHL scales each by its samples over the mean batch; SHL's rounds wait only for the workers
that push every step; once those have finished their fit, the others end theirs.
"""

from __future__ import annotations

import time

from ...ps.extension import ShardExtension
from ...ps.shard import LOG_FIELDS

SPEC = "nbdist.strategies.ashl.meeting:AshlMeeting"  # how a shard's config names this extension


class AshlMeeting(ShardExtension):
    """Profiles, step-time reports, the allocation in force, and ASHL's rules on pushes."""

    kinds = ("report",)
    held_kinds = ("turn", "profile")
    controls = ("allocate", "switch_phase", "epoch_decided")

    def __init__(self, config: dict):
        # the workers of each host, in the order they time their steps
        self.group_of = {w: [int(v) for v in group] for group in config.get("profile_groups", []) for w in group}
        self.ready_to_time: set[int] = set()  # asked for their turn: their tracing is over
        self.profiles: dict[int, dict] = {}
        self.profiled_at: dict[int, float] = {}  # worker -> virtual time its profile was posted
        self.reports: dict[int, dict] = {}
        self.allocation: dict | None = None  # {"id", "batches", "periods", "every", "fractions", "reason"}
        self.decide_at_epochs = bool(config.get("decide_at_epochs"))  # the virtual clock: see the docstring
        self.epoch_ends: dict[int, dict] = {}  # epoch -> its agreed logs and stale share, awaiting a decision
        self.decided: set[int] = set()
        self.log_seen = 0  # push-log entries counted into an epoch's stale share

    # -- messages --------------------------------------------------------------------------
    def handle(self, shard, worker: int, message) -> dict | None:
        payload = message.header.get(message.kind)
        if message.kind == "turn":
            self.ready_to_time.add(worker)
        elif not isinstance(payload, dict):
            raise ValueError(f"a {message.kind} is a JSON object")
        elif message.kind == "profile":
            self.profiles[worker] = {**payload, "t": time.time()}
            if isinstance(message.header.get("vt"), (int, float)):
                self.profiled_at[worker] = float(message.header["vt"])
        else:  # report
            self.reports[worker] = {**payload, "t": time.time()}
            return {"allocation": self.allocation, **self.reply_fields(shard)}
        return None

    def ready(self, shard, worker: int, message) -> dict | None:
        if message.kind == "turn":
            return {} if self._turn_ready(worker, shard.live()) else None
        if not self.allocation or worker >= len(self.allocation["batches"]):
            return None  # a newcomer waits for the allocation solved again with it
        # on the virtual clock every worker starts training when the last profile was posted
        start = {"vt": max(self.profiled_at.values())} if self.profiled_at else {}
        return {"allocation": self.allocation, **self.reply_fields(shard), **start}

    def _turn_ready(self, worker: int, live: list[int]) -> bool:
        """Every worker of its host has traced, and those before it have posted their profiles."""
        group = self.group_of.get(worker, [worker])
        before = group[:group.index(worker)]
        return all(w in self.ready_to_time or w not in live for w in group) and \
            all(w in self.profiles or w not in live for w in before)

    def epoch_closes(self, shard, epoch: int, logs: dict) -> bool:
        """On the virtual clock, in AHL: once the kernel has decided on the switch at this epoch's end."""
        if not self.decide_at_epochs or shard.synchronous or epoch in self.decided:
            return True
        if epoch not in self.epoch_ends:
            gammas = [entry[LOG_FIELDS.index("gamma")] for entry in shard.log.since(self.log_seen)[1]]
            gammas = [g for g in gammas if g is not None]
            self.log_seen = len(shard.log)
            self.epoch_ends[epoch] = {"logs": logs, "gammas": gammas}
        return False

    # -- controls --------------------------------------------------------------------------
    def control(self, shard, action: str, value) -> None:
        if action == "switch_phase":
            shard.become_synchronous()
            return
        if action == "epoch_decided":
            if not isinstance(value, int):
                raise ValueError(f"epoch_decided names an epoch, not {value!r}")
            self.decided.add(value)
            self.epoch_ends.pop(value, None)
            return
        batches = value.get("batches") if isinstance(value, dict) else None
        if not isinstance(batches, list) or not all(isinstance(b, int) and b > 0 for b in batches):
            raise ValueError(f"an allocation needs positive whole batches, not {value!r}")
        self.allocation = dict(value)
        if shard.dealer is not None:  # batches on demand: dealt at the allocation's sizes, a commit's worth held
            periods = value.get("periods") or [1] * len(batches)
            shard.dealer.resize({w: (b, max(1, int(k))) for w, (b, k) in enumerate(zip(batches, periods))})

    # -- rules on pushes ---------------------------------------------------------------------
    def push_scale(self, batch) -> float:
        """AHL: a push of `batch` samples counts batch / mean(b) (twice the samples move the model twice as far)."""
        if self.allocation is None or not batch:
            return 1.0
        batches = self.allocation["batches"]
        return batch * len(batches) / sum(batches)

    def _every(self, shard) -> dict[int, int]:
        """How many common intervals each allocated worker's pushes take (1: every interval); a newcomer not
        allocated yet has none."""
        allocation = self.allocation or {}
        every = allocation.get("every") or allocation.get("periods") or [1] * len(shard.workers)
        return dict(enumerate(every))

    def pacers(self, shard, live: list[int]) -> list[int]:
        """SHL: a round waits for the workers that push at every interval (a slow link joins the round its
        push reaches; a newcomer once it is allocated)."""
        every = self._every(shard)
        allocated = [k for k in live if k in every]
        if not allocated or not self.allocation:
            return live
        shortest = min(every[k] for k in allocated)
        return [k for k in allocated if every[k] == shortest]

    def round_total(self, shard, batches: list[int]) -> int:
        """SHL where workers push their local updates: each counts b_i/B of the whole allocation, whether the
        others are in the round or not (a worker absent from it has not moved the model; a lone push of a
        slow link's many local steps must not count as everyone's). A mean of gradients is over the round."""
        if self.allocation and (shard.rule or {}).get("preset") == "adsp":
            return sum(self.allocation["batches"])
        return sum(batches)

    def on_done(self, shard) -> None:
        """Once the workers that push every step have ended their fit, the others end theirs after the
        batch in hand: what remains of their shards is small, and pushes they made alone, many steps
        stale, would move the model the others finished."""
        if not self.allocation or shard.finishing:
            return
        every = self._every(shard)
        present = [k for k, w in shard.workers.items() if w.alive and not w.evicted and k in every]
        shortest = min((every[k] for k in present), default=1)
        setters = [k for k in present if every[k] == shortest]
        lagging = [k for k in present if not shard.workers[k].done]
        if lagging and all(shard.workers[k].done for k in setters):
            shard.finishing, shard.finishing_reason = True, "laggards"
            shard.record("end_laggards", workers=lagging,
                         reason=f"workers {setters} finished their epochs; {lagging} stop after their current batch")

    def reply_fields(self, shard) -> dict:
        """ASHL's phase, told with every reply to its workers."""
        return {"phase": "shl" if shard.synchronous else "ahl"}

    def summary(self) -> dict:
        return {"profiles": self.profiles, "reports": self.reports, "allocation": self.allocation,
                "epoch_ends": self.epoch_ends}
