"""When ASHL leaves its asynchronous phase (AHL) for the synchronous one (SHL), with the reason.

Checked every half epoch (on the virtual clock at epoch ends, where the barrier holds every worker);
never before 20% of the epochs. It switches at the first check at which the allocation has held since
the check before (no re-allocation, no worker drifting from its predicted step time): step times are
equalised, so a synchronous round waits for no one, and further asynchrony only adds staleness (the
switch point swept on H1 and H2, docs/results.md). While the allocation still moves, it switches when
one of these holds at two checks in a row:
  - loss improvement under 1% per epoch,
  - more than 30% of the pushes since the last check had gamma < 0.5 (ddc-asgd judged them stale),
  - the first learning-rate decay is reached,
  - 60% of the epochs are done.
With a fixed share of the epochs (`--switch-at`), it switches at the first check at or past it, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHECK_EVERY_EPOCHS = 0.5
MIN_PROGRESS = 0.20
DONE_FRACTION = 0.60
MIN_IMPROVEMENT_PER_EPOCH = 0.01
STALE_GAMMA = 0.5
STALE_SHARE = 0.30
SETTLED = "the allocation has held since the last check: step times are equalised"


@dataclass
class Check:
    """What is known at one check (every half epoch)."""

    epoch: float  # epochs done, fractional
    epochs: int  # epochs asked for
    loss: float  # training loss now (a smoothed value)
    gammas: list[float] = field(default_factory=list)  # gamma of the pushes since the previous check
    lr_decayed: bool = False  # the learning-rate schedule has made its first decay
    settled: bool = False  # the allocation has held since the previous check


class SwitchRule:
    """Feed it one `Check` per half epoch; `check` returns the reason to switch now, or None. `at`: switch at
    this share of the epochs instead (for sweeps of the switch point)."""

    def __init__(self, at: float | None = None):
        self.at = at
        self.previous: Check | None = None
        self.pending: str | None = None  # the condition that held at the last check

    def check(self, now: Check) -> str | None:
        if self.at is not None:
            return f"{now.epoch / now.epochs:.0%} of the epochs done (--switch-at {self.at:g})" \
                if now.epoch >= self.at * now.epochs - 1e-9 else None
        reason = SETTLED if now.settled else self._condition(now)
        self.previous, held_before = now, self.pending
        self.pending = reason
        if reason is None or now.epoch < MIN_PROGRESS * now.epochs:
            return None
        if now.settled:  # held over the whole interval since the last check already
            return reason
        # the share of epochs done is arithmetic: past 60% half an epoch ago, it held at the check then, even
        # where checks come a whole epoch apart (the virtual clock), so the switch lands where half-epoch
        # checks would put it rather than an epoch later
        done_before = now.epoch - CHECK_EVERY_EPOCHS >= DONE_FRACTION * now.epochs
        return reason if held_before is not None or done_before else None

    def _condition(self, now: Check) -> str | None:
        if now.epoch >= DONE_FRACTION * now.epochs:
            return f"{now.epoch / now.epochs:.0%} of the epochs done (>= {DONE_FRACTION:.0%})"
        if now.lr_decayed:
            return "the learning rate made its first decay"
        if now.gammas:
            stale = sum(g < STALE_GAMMA for g in now.gammas) / len(now.gammas)
            if stale > STALE_SHARE:
                return f"{stale:.0%} of pushes had gamma < {STALE_GAMMA} (> {STALE_SHARE:.0%})"
        before = self.previous
        if before is not None and now.epoch > before.epoch and before.loss > 0:
            per_epoch = (before.loss - now.loss) / before.loss / (now.epoch - before.epoch)
            if per_epoch < MIN_IMPROVEMENT_PER_EPOCH:
                return f"loss improved {per_epoch:.2%} per epoch (< {MIN_IMPROVEMENT_PER_EPOCH:.0%})"
        return None
