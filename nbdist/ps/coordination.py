"""ASHL's meeting point on the parameter server (DESIGN.md section 6).

Workers profile in turn (those sharing a host one after another, once all of them have
traced their model, so they do not time each other), post their profiles and wait for the allocation the kernel computes from them;
about once a second they report their measured step times and read the allocation then
in force. The shards only hold these messages: every decision is the kernel's
(`nbdist.ashl.coordinator`), sent as `allocate` and `switch_phase` controls.
"""

from __future__ import annotations

import time


class Coordination:
    """Profiles, epoch reports and the current allocation, as one shard holds them."""

    def __init__(self, config: dict):
        # the workers of each host, in the order they time their steps
        self.group_of = {w: [int(v) for v in group] for group in config.get("profile_groups", []) for w in group}
        self.ready: set[int] = set()  # asked for their turn: their tracing is over
        self.profiles: dict[int, dict] = {}
        self.reports: dict[int, dict] = {}
        self.allocation: dict | None = None  # {"id", "batches", "fractions", "reason"}

    def ask_turn(self, worker: int) -> None:
        self.ready.add(worker)

    def turn_ready(self, worker: int, live: list[int]) -> bool:
        """Every worker of its host has traced, and those before it have posted their profiles."""
        group = self.group_of.get(worker, [worker])
        before = group[:group.index(worker)]
        return all(w in self.ready or w not in live for w in group) and \
            all(w in self.profiles or w not in live for w in before)

    def post_profile(self, worker: int, profile) -> None:
        if not isinstance(profile, dict):
            raise ValueError("a profile is a JSON object")
        self.profiles[worker] = {**profile, "t": time.time()}

    def post_report(self, worker: int, report) -> None:
        if not isinstance(report, dict):
            raise ValueError("a report is a JSON object")
        self.reports[worker] = {**report, "t": time.time()}

    def allocate(self, value) -> None:
        batches = value.get("batches") if isinstance(value, dict) else None
        if not isinstance(batches, list) or not all(isinstance(b, int) and b > 0 for b in batches):
            raise ValueError(f"an allocation needs positive whole batches, not {value!r}")
        self.allocation = dict(value)

    def batch_scale(self, batch: int | None) -> float:
        """AHL: a push of `batch` samples counts batch / mean(b) (twice the samples move the model twice as far)."""
        if self.allocation is None or not batch:
            return 1.0
        batches = self.allocation["batches"]
        return batch * len(batches) / sum(batches)

    def summary(self) -> dict:
        return {"profiles": self.profiles, "reports": self.reports, "allocation": self.allocation}
