"""Simulated heterogeneity (DESIGN.md section 7): slower compute and links for chosen workers.

``--simulate "speed=1,1,0.5,0.25; bandwidth=1g,1g,100m,10m; latency=0,0,5ms,20ms"`` makes
worker k sleep, after each step, (1/speed_k - 1) times the compute time it measured, and
per exchange 2 x latency_k plus the bytes it moved over bandwidth_k (``clock=real``, the
default). With ``clock=virtual`` nothing sleeps: every worker keeps a virtual clock on which
a step costs t(b)/speed_k (t measured once at the start, or given: ``step=12ms`` for the
cell's batch, ``step=1ms+30us/sample``) and an exchange 2 x latency_k + bytes/bandwidth_k,
and the parameter server applies pushes in virtual-time order (`nbdist.strategies.virtual_clock`).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass

from ..errors import OptionError

_UNITS_BPS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_UNITS_S = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True)
class Profile:
    """How much slower than the real engine one worker is made: compute speed and link."""

    speed: float = 1.0
    bandwidth_bps: float | None = None  # None: the real link
    latency_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepCost:
    """What a step computes for on the virtual clock, at speed 1: fixed_s + per_sample_s x batch.

    `relative_s` (``step=12ms``) is the cost at the cell's own batch, resolved by `at`."""

    fixed_s: float = 0.0
    per_sample_s: float = 0.0
    relative_s: float | None = None

    def at(self, batch: int) -> "StepCost":
        """This cost with a `relative_s` turned into seconds per sample of a `batch`-sample step."""
        if self.relative_s is None:
            return self
        return StepCost(0.0, self.relative_s / max(batch, 1))

    def seconds(self, batch: int) -> float:
        return self.fixed_s + self.per_sample_s * batch

    def text(self) -> str:
        """As `--simulate` writes it (what reproduces a measured cost exactly)."""
        if self.relative_s is not None:
            return f"{self.relative_s * 1e3:.6g}ms"
        return f"{self.fixed_s * 1e3:.6g}ms+{self.per_sample_s * 1e6:.6g}us/sample"

    def to_json(self) -> dict:
        return asdict(self)


def parse_clock(text: str | None) -> tuple[str, StepCost | None]:
    """The `clock` (real or virtual) and the given `step` cost of a `--simulate` text."""
    clock, step = "real", None
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        key, _, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        if key == "clock":
            if value not in ("real", "virtual"):
                raise OptionError(f"--simulate clock={value!r}: the clock is real (sleeps) or virtual. "
                                  f"Received part {part!r}.")
            clock = value
        elif key == "step":
            step = _parse_step(value)
    if step is not None and clock != "virtual":
        raise OptionError("--simulate step=... sets the virtual clock's step cost; add clock=virtual.")
    return clock, step


def _parse_step(value: str) -> StepCost:
    fixed, _, per = value.partition("+")
    if not per:
        return StepCost(relative_s=_parse("step", fixed))
    if not per.endswith("/sample"):
        raise OptionError(f"--simulate step={value!r}: write step=12ms (a step at the cell's batch) or "
                          "step=1ms+30us/sample.")
    return StepCost(_parse("step", fixed), _parse("step", per[: -len("/sample")]))


def parse_simulate(text: str | None, workers: int) -> list[Profile]:
    """One `Profile` per worker from the option text (one value for all, or one per worker)."""
    if not text:
        return [Profile()] * workers
    parse_clock(text)  # checks the clock's keys
    fields: dict[str, list] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, _, values = part.partition("=")
        key = key.strip().lower()
        if key in ("clock", "step"):
            continue
        if key not in ("speed", "bandwidth", "latency") or not values.strip():
            raise OptionError("--simulate takes 'speed=...; bandwidth=...; latency=...' (and 'clock=real|virtual; "
                              f"step=...'). Received part {part!r}.")
        items = [v.strip() for v in values.split(",")]
        if len(items) == 1:
            items *= workers
        if len(items) != workers:
            raise OptionError(f"--simulate {key} lists {len(items)} values for {workers} workers; give one value "
                              "per worker, or one for all.")
        fields[key] = [_parse(key, item) for item in items]
    return [Profile(speed=fields.get("speed", [1.0] * workers)[k],
                    bandwidth_bps=fields.get("bandwidth", [None] * workers)[k],
                    latency_s=fields.get("latency", [0.0] * workers)[k]) for k in range(workers)]


def _parse(key: str, item: str):
    units = _UNITS_BPS if key == "bandwidth" else _UNITS_S if key in ("latency", "step") else {"": 1.0}
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*([a-z]*)", item.lower())
    if not match or match.group(2) not in units:
        examples = {"speed": "0.5", "bandwidth": "100m (bits/s; k, m, g)", "latency": "5ms (s, ms, us)",
                    "step": "12ms, or 1ms+30us/sample"}
        raise OptionError(f"--simulate {key}={item!r} is not a number with a known unit; for example {examples[key]}.")
    value = float(match.group(1)) * units[match.group(2)]
    if key == "speed" and not 0 < value <= 1:
        raise OptionError(f"--simulate speed={item} must be in (0, 1]: speeds are relative to the engine's real "
                          "speed (1 as fast as it runs, 0.5 half as fast).")
    if key == "bandwidth" and value <= 0:
        raise OptionError(f"--simulate bandwidth={item} must be positive.")
    return value


class Slowdown:
    """Worker side: the sleeps that make this worker as slow as its profile (the step timer measures)."""

    def __init__(self, profile: Profile | dict | None):
        self.profile = Profile(**profile) if isinstance(profile, dict) else (profile or Profile())
        self.slept_s = 0.0

    @property
    def active(self) -> bool:
        p = self.profile
        return p.speed < 1 or p.bandwidth_bps is not None or p.latency_s > 0

    def stretch(self, compute_s: float | None) -> float:
        """Sleep so that a step of `compute_s` real seconds takes compute_s / speed; returns the sleep."""
        if compute_s is None or self.profile.speed >= 1:
            return 0.0
        return self._sleep(compute_s * (1 / self.profile.speed - 1))

    def charge(self, bytes_moved: int) -> float:
        """Sleep for one exchange of `bytes_moved` over this worker's link: 2 x latency + bytes / bandwidth."""
        p = self.profile
        return self._sleep(2 * p.latency_s + (bytes_moved * 8 / p.bandwidth_bps if p.bandwidth_bps else 0.0))

    def _sleep(self, seconds: float) -> float:
        if seconds > 0:
            time.sleep(seconds)  # the point of simulation: this worker really is this much slower
            self.slept_s += seconds
        return max(seconds, 0.0)
