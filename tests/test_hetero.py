"""--simulate parsing and the worker-side slowdown."""

from __future__ import annotations

import time

import pytest

from nbdist.errors import OptionError
from nbdist.hetero import Profile, Slowdown, parse_simulate


def test_parses_per_worker_values_with_units():
    profiles = parse_simulate("speed=1,1,0.5,0.25; bandwidth=1g,1g,100m,10k; latency=0,0,5ms,20ms", 4)
    assert [p.speed for p in profiles] == [1, 1, 0.5, 0.25]
    assert [p.bandwidth_bps for p in profiles] == [1e9, 1e9, 1e8, 1e4]
    assert [p.latency_s for p in profiles] == pytest.approx([0, 0, 0.005, 0.02])


def test_one_value_applies_to_every_worker_and_nothing_means_real_speed():
    assert parse_simulate("latency=1ms", 3) == [Profile(latency_s=0.001)] * 3
    assert parse_simulate(None, 2) == [Profile(), Profile()]


@pytest.mark.parametrize("text, message", [
    ("speed=1,0.5", "lists 2 values for 3 workers"),
    ("speed=2,1,1", "must be in (0, 1]"),
    ("bandwidth=fast", "not a number with a known unit"),
    ("colour=red", "takes 'speed=...; bandwidth=...; latency=...'"),
])
def test_bad_specs_say_what_to_write(text, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_simulate(text, 3)


def test_slowdown_stretches_compute_and_charges_the_link():
    slow = Slowdown(Profile(speed=0.5, bandwidth_bps=8e6, latency_s=0.01))
    slow.after_exchange(0)  # the first exchange: 2 x 10 ms latency, then the first step is timed
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.05:  # 50 ms of "compute"
        pass
    slow.before_exchange()  # speed 0.5: as long again
    slow.after_exchange(100_000)  # 2 x 10 ms latency + 800 kbit at 8 Mbit/s = 0.12 s
    assert slow.slept_s == pytest.approx(0.02 + 0.05 + 0.02 + 0.1, abs=0.02)
    assert not Slowdown(None).active and slow.active
