"""The kernel's half of ASHL: every decision, with its reason, from what the workers report.

Called from the run's wait loop (`AshlStrategy.check`) with the PS's telemetry and the
workers' latest progress. It allocates once every live worker has posted its profile,
re-allocates when a newcomer has posted its own or a worker's measured step time drifts from the
allocation's prediction,
and applies the AHL -> SHL switch rule every half epoch (on the virtual clock: at every epoch's
end, on the epoch's agreed logs, while the workers wait at the epoch barrier, so the decision
and the instant it takes effect are the same every run). Actions go to the shards as
`allocate` / `switch_phase` / `epoch_decided` controls; each decision is appended to `run.events`.
"""

from __future__ import annotations

import math
import statistics

from .allocation import CostModel, allocate_commits, allocate_with_periods, drifted, shard_fractions
from .switch import Check, SwitchRule

MIN_SHARE = 1 / 8  # no worker gets less than this part of an equal share of the global batch
MIN_TIMED_STEPS = 8  # an epoch report with fewer measured steps says too little to re-allocate on


class Coordinator:
    """One run's ASHL decisions. `control(action, value)` reaches every shard."""

    def __init__(self, workers: int, control, virtual: bool = False, without: set[str] = frozenset(),
                 switch_at: float | None = None, local_steps: bool = False, dealt: bool = False):
        self.workers, self.control, self.virtual = workers, control, virtual
        self.dealt = dealt  # shard 0 deals the batches: a worker that leaves leaves nothing untrained
        self.left: set[int] = set()  # workers that left at the switch (their commits span several rounds)
        self.without = set(without)  # parts switched off (ablations): allocation, switch
        self.local_steps = local_steps  # workers commit local updates: one commit cadence for all
        self.models: list[CostModel] | None = None
        self.batches: list[int] | None = None
        self.periods: list[int] | None = None  # steps between a worker's pushes
        self.every: list[int] | None = None  # common intervals between a worker's pushes (1: the cadence)
        self.allocation_id = 0
        self.checked_allocation = 0  # the allocation in force at the last switch check
        self.phase = "profile"
        self.rule = SwitchRule(switch_at)
        self.next_check = 0.5  # epochs; the switch rule is consulted every half epoch
        self.gammas: list[float] = []  # since the last check
        self.reports_seen: dict[int, float] = {}  # worker -> time of the last epoch report acted on
        self.drifting: set[int] = set()  # workers that drifted at the last report round
        self.initial_lr: float | None = None
        self.events_seen = 0

    # -- inputs ----------------------------------------------------------------------------
    def update(self, run, telemetry: dict, progress: dict[int, dict]) -> None:
        """One look at the run: `telemetry` from the PS (`PsService.recent`), `progress` rank -> latest data."""
        coordination = telemetry.get("coordination") or {}
        self._copy_shard_events(run, telemetry.get("events") or [])
        if telemetry.get("log_fields"):
            column = telemetry["log_fields"].index("gamma")
            self.gammas += [entry[column] for entry in telemetry["log"] if entry[column] is not None]
        live = self._live(run)
        profiles = {int(k): v for k, v in (coordination.get("profiles") or {}).items()}
        if self.batches is None:
            if live and all(rank in profiles for rank in live):
                self._allocate_first(run, profiles)
            return
        for rank in sorted(r for r in profiles if r >= self.workers):
            self._admit(run, rank, profiles)
        if self.virtual:  # the cost model is exact: nothing drifts; the switch is decided at epoch ends
            self._decide_epoch_ends(run, coordination.get("epoch_ends") or {}, profiles)
            return
        self._reallocate_on_drift(run, {int(k): v for k, v in (coordination.get("reports") or {}).items()}, live)
        if self.phase == "ahl" and "switch" not in self.without:
            self._consider_switch(run, progress, live)

    def _live(self, run) -> list[int]:
        gone = run.dead_ranks() | self.left
        return [r for r in range(self.workers) if r not in gone]

    def _copy_shard_events(self, run, events: list[dict]) -> None:
        for event in events[self.events_seen:]:
            if event["event"] in ("compression", "end_laggards"):  # worker_dropped: the PS strategy records it
                run.record(event["event"], **{k: v for k, v in event.items() if k != "event"})
        self.events_seen = len(events)

    # -- allocation ------------------------------------------------------------------------
    def _allocate_first(self, run, profiles: dict[int, dict]) -> None:
        self.models = [CostModel(p["fixed_s"], p["per_sample_s"], p["comm_s"]) for _, p in sorted(profiles.items())]
        if len(self.models) != self.workers:  # a worker died before profiling: it keeps an equal guess
            known = {r: CostModel(p["fixed_s"], p["per_sample_s"], p["comm_s"]) for r, p in profiles.items()}
            slowest = max(known.values(), key=lambda m: m.per_sample_s)
            self.models = [known.get(r, slowest) for r in range(self.workers)]
        global_batch = sum(int(profiles.get(r, {}).get("b0") or 32) for r in range(self.workers))
        self._solve(global_batch)
        self._send_allocation(run, "allocated", f"profiled {len(profiles)} worker(s); step times equalised at "
                                                f"{self._predicted_step(0):.4f} s", profile=self._rows(profiles))
        self.checked_allocation = self.allocation_id
        self.phase = "ahl"

    def _admit(self, run, rank: int, profiles: dict[int, dict]) -> None:
        """A newcomer (rank `rank`, joined while the run trains) posted its profile: the allocation solved again
        for the workers with it, the global batch grown by its b0 (a rank between, that died before profiling,
        keeps the slowest's model)."""
        p = profiles[rank]
        slowest = max(self.models, key=lambda m: m.per_sample_s)
        self.models += [slowest] * (rank - self.workers) + [CostModel(p["fixed_s"], p["per_sample_s"], p["comm_s"])]
        self.workers = rank + 1
        self._solve(sum(self.batches) + int(p.get("b0") or 32) * (len(self.models) - len(self.batches)))
        self.drifting = set()
        self._send_allocation(run, "reallocated", f"worker {rank} joined and profiled; step times equalised at "
                                                  f"{self._predicted_step(0):.4f} s", profile=self._rows(profiles))

    def _rows(self, profiles: dict[int, dict]) -> list[dict]:
        """The profile table's rows: each worker's measured costs and its allocation."""
        return [{"worker": r, "host": profiles.get(r, {}).get("host"), "per_sample_s": m.per_sample_s,
                 "fixed_s": m.fixed_s, "comm_s": m.comm_s, "bandwidth_bps": profiles.get(r, {}).get("bandwidth_bps"),
                 "batch": b, "shard": f, "period": k}
                for r, (m, b, f, k) in enumerate(zip(self.models, self.batches, shard_fractions(self.batches),
                                                     self.periods))]

    def _solve(self, global_batch: int) -> None:
        if "allocation" in self.without:
            self.batches, self.periods = [global_batch // self.workers] * self.workers, [1] * self.workers
            self.every = self.periods
            return
        floor = max(1, math.floor(MIN_SHARE * global_batch / self.workers))
        if self.local_steps:
            self.batches, self.periods, self.every = allocate_commits(self.models, global_batch, b_min=floor)
        else:  # gradients accumulated over k_i steps: a step takes the same time everywhere
            self.batches, self.periods = allocate_with_periods(self.models, global_batch, b_min=floor)
            self.every = self.periods

    def _predicted_step(self, rank: int) -> float:
        m = self.models[rank]
        return m.fixed_s + m.per_sample_s * self.batches[rank] + m.comm_s / self.periods[rank]

    def _send_allocation(self, run, event: str, reason: str, **extra) -> None:
        self.allocation_id += 1
        value = {"id": self.allocation_id, "batches": self.batches, "periods": self.periods, "every": self.every,
                 "fractions": [round(f, 6) for f in shard_fractions(self.batches)], "reason": reason}
        self.control("allocate", value)
        run.record(event, batches=list(self.batches), periods=list(self.periods), every=list(self.every),
                   reason=reason, **extra)

    def _reallocate_on_drift(self, run, reports: dict[int, dict], live: list[int]) -> None:
        """Once every live worker has reported on the current allocation again: re-allocate when a worker's
        step time left the prediction by > 15% relative to the others (a uniform slowdown, such as
        workers sharing a host's cores, changes no batch), at two report rounds in a row."""
        # (reports arrive about once a second from each worker; see strategies/ashl.Reports)
        fresh = {r: rep for r, rep in reports.items()
                 if r in live and rep.get("compute_s") and rep.get("timed_steps", 0) >= MIN_TIMED_STEPS
                 and rep.get("t", 0) > self.reports_seen.get(r, 0) and rep.get("allocation") == self.allocation_id}
        if set(fresh) != set(live):
            return
        self.reports_seen.update({r: rep["t"] for r, rep in fresh.items()})
        ranks = sorted(fresh)
        predicted = [self.models[r].fixed_s + self.models[r].per_sample_s * self.batches[r] for r in ranks]
        ratios = [fresh[r]["compute_s"] / p for r, p in zip(ranks, predicted)]
        common = statistics.median(ratios)
        now = {ranks[i] for i in drifted([common * p for p in predicted], [fresh[r]["compute_s"] for r in ranks])}
        confirmed, self.drifting = now & self.drifting, now
        if not confirmed:
            return
        for r, ratio in zip(ranks, ratios):  # re-fit: everyone by the common factor, the drifted by their own
            m, factor = self.models[r], ratio if r in confirmed else common
            self.models[r] = CostModel(m.fixed_s * factor, m.per_sample_s * factor, fresh[r].get("exchange_s") or m.comm_s)
        before = (self.batches, self.periods)
        self._solve(sum(self.batches))
        self.drifting = set()
        why = ", ".join(f"worker {r} ran {ratios[ranks.index(r)] / common:.2f}x its predicted step time "
                        "relative to the others" for r in sorted(confirmed))
        if (self.batches, self.periods) != before:
            self._send_allocation(run, "reallocated", f"drift > 15% at two report rounds: {why}", previous=before[0])

    # -- the phase switch ------------------------------------------------------------------
    def _consider_switch(self, run, progress: dict[int, dict], live: list[int]) -> None:
        seen = [progress[r] for r in live if progress.get(r, {}).get("record")]
        if len(seen) < len(live):
            return
        epochs = seen[0].get("epochs") or 1
        shortest = min(self.every[r] for r in live)
        done = min(_epochs_done(progress[r]) for r in live if self.every[r] == shortest)  # the run's pace
        lrs = [p["record"].get("lr") for p in seen if p["record"].get("lr")]
        if self.initial_lr is None and lrs:
            self.initial_lr = max(lrs)
        if done < self.next_check:
            return
        self.next_check = math.floor(done / 0.5) * 0.5 + 0.5
        losses = [p["record"]["loss"] for p in seen if p["record"].get("loss") is not None]
        check = Check(epoch=done, epochs=epochs, loss=sum(losses) / len(losses) if losses else float("nan"),
                      gammas=self.gammas, settled=self._settled(),
                      lr_decayed=bool(lrs and self.initial_lr and min(lrs) < 0.999 * self.initial_lr))
        self.gammas = []
        reason = self.rule.check(check)
        if reason:
            self.switch(run, reason)

    def _decide_epoch_ends(self, run, epoch_ends: dict, profiles: dict[int, dict]) -> None:
        """The virtual clock: the switch rule at each epoch end the shard holds, then the barrier's release."""
        for epoch, end in sorted((int(e), v) for e, v in epoch_ends.items()):
            if self.phase == "ahl" and "switch" not in self.without:
                logs = end["logs"]
                lr = logs.get("learning_rate")
                if self.initial_lr is None and lr:
                    self.initial_lr = lr
                epochs = max(int(p.get("epochs") or 1) for p in profiles.values())
                check = Check(epoch=epoch + 1, epochs=epochs, loss=logs.get("loss", float("nan")),
                              gammas=end["gammas"], lr_decayed=bool(lr and lr < 0.999 * self.initial_lr),
                              settled=self._settled())
                reason = self.rule.check(check)
                if reason:
                    self.switch(run, reason, epoch=epoch + 1)
            self.control("epoch_decided", epoch)

    def _settled(self) -> bool:
        """The allocation has held since the last check (no re-allocation, no worker drifting); without the
        allocation nothing equalises step times."""
        held = self.allocation_id == self.checked_allocation and not self.drifting
        self.checked_allocation = self.allocation_id
        return held and "allocation" not in self.without

    def switch(self, run, reason: str, **extra) -> list[dict]:
        """AHL -> SHL now (the rule said so, or the dashboard's button); the shards' acknowledgements.
        `extra`: more fields for the event (`epoch`: the epoch end it took effect at, virtual clock)."""
        acks = self.control("switch_phase", None)
        if self.phase != "shl":
            self.phase = "shl"
            run.record("switch_phase", to="shl", reason=reason, **extra)
            self._slow_links_leave(run)
        return acks

    def _slow_links_leave(self, run) -> None:
        """With batches dealt, a worker whose commits span several commit intervals leaves at the switch: in
        rounds its update would come m - 1 rounds stale (or every round would wait for it); its batches go to
        the others. With static shares it stays (its share would be lost)."""
        live = self._live(run)
        if not self.dealt or not live or "allocation" in self.without:
            return
        shortest = min(self.every[r] for r in live)
        leaving = [r for r in live if self.every[r] > shortest]
        for rank in leaving:  # as the dashboard's evict does: its fit ends, the run reads it as evicted
            self.control("evict", rank)
            run.record("control:evict", value=rank)
        if leaving:
            self.left |= set(leaving)
            run.record("left_shl", workers=leaving,
                       reason="; ".join(f"worker {r} commits once every {self.every[r]} intervals: in synchronous "
                                        f"rounds its update would be {self.every[r] - 1} round(s) stale"
                                        for r in leaving) + "; its batches are dealt to the others")


def _epochs_done(latest: dict) -> float:
    """Fractional epochs a worker has done, from its latest progress report."""
    epoch = latest["record"]["epoch"]
    return epoch + 1 if latest.get("epoch_end") else epoch + (latest.get("batch") or 0) / max(latest.get("steps") or 1, 1)
