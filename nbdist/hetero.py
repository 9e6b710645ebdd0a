"""Simulated heterogeneity (DESIGN.md section 7): slower compute and links for chosen workers.

``--simulate "speed=1,1,0.5,0.25; bandwidth=1g,1g,100m,10m; latency=0,0,5ms,20ms"`` makes
worker k sleep, after each step, (1/speed_k - 1) times the compute time it measured, and
per exchange 2 x latency_k plus the bytes it moved over bandwidth_k. So staleness and
stragglers are reproducible on one machine; real slow hosts need no flag.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass

from .errors import OptionError

STEP_WINDOW = 9  # steps whose median is "the measured step time"
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


def parse_simulate(text: str | None, workers: int) -> list[Profile]:
    """One `Profile` per worker from the option text (one value for all, or one per worker)."""
    if not text:
        return [Profile()] * workers
    fields: dict[str, list] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, _, values = part.partition("=")
        key = key.strip().lower()
        if key not in ("speed", "bandwidth", "latency") or not values.strip():
            raise OptionError(f"--simulate takes 'speed=...; bandwidth=...; latency=...'. Received part {part!r}.")
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
    units = _UNITS_BPS if key == "bandwidth" else _UNITS_S if key == "latency" else {"": 1.0}
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*([a-z]*)", item.lower())
    if not match or match.group(2) not in units:
        examples = {"speed": "0.5", "bandwidth": "100m (bits/s; k, m, g)", "latency": "5ms (s, ms, us)"}
        raise OptionError(f"--simulate {key}={item!r} is not a number with a known unit; for example {examples[key]}.")
    value = float(match.group(1)) * units[match.group(2)]
    if key == "speed" and not 0 < value <= 1:
        raise OptionError(f"--simulate speed={item} must be in (0, 1]: speeds are relative to the engine's real "
                          "speed (1 as fast as it runs, 0.5 half as fast).")
    if key == "bandwidth" and value <= 0:
        raise OptionError(f"--simulate bandwidth={item} must be positive.")
    return value


class Slowdown:
    """Worker side: the sleeps that make this worker as slow as its profile, timed around each exchange."""

    def __init__(self, profile: Profile | dict | None):
        self.profile = Profile(**profile) if isinstance(profile, dict) else (profile or Profile())
        self._compute_started: float | None = None
        self._recent: deque[float] = deque(maxlen=STEP_WINDOW)
        self.slept_s = 0.0

    @property
    def active(self) -> bool:
        p = self.profile
        return p.speed < 1 or p.bandwidth_bps is not None or p.latency_s > 0

    def before_exchange(self) -> None:
        """Stretch the step that just ended to 1/speed of this worker's step time.

        The step time is the median of the last few measured steps, so a one-off pause
        between two steps (tracing, validation at an epoch's end) is not stretched too.
        """
        if self._compute_started is not None and self.profile.speed < 1:
            self._recent.append(time.perf_counter() - self._compute_started)
            self._sleep(statistics.median(self._recent) * (1 / self.profile.speed - 1))

    def after_exchange(self, bytes_moved: int) -> None:
        """Charge the link for one exchange, then start timing the next step's compute."""
        p = self.profile
        delay = 2 * p.latency_s + (bytes_moved * 8 / p.bandwidth_bps if p.bandwidth_bps else 0.0)
        if delay > 0:
            self._sleep(delay)
        self._compute_started = time.perf_counter()

    def local_step(self) -> None:
        """A step that ended without an exchange: start timing the next one."""
        self._compute_started = time.perf_counter()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # the point of simulation: this worker really is this much slower
        self.slept_s += seconds
