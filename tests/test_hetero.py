"""--simulate parsing and the worker-side slowdown."""

from __future__ import annotations

import pytest

from nbdist.errors import OptionError
from nbdist.host.hetero import Profile, Slowdown, parse_simulate
from nbdist.host.step_timer import StepTimer


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
    assert slow.charge(0) == pytest.approx(0.02)  # 2 x 10 ms latency
    assert slow.stretch(0.05) == pytest.approx(0.05)  # speed 0.5: a 50 ms step takes as long again
    assert slow.charge(100_000) == pytest.approx(0.02 + 0.1)  # + 800 kbit at 8 Mbit/s
    assert slow.slept_s == pytest.approx(0.02 + 0.05 + 0.02 + 0.1)
    assert not Slowdown(None).active and slow.active


def test_the_step_timer_counts_compute_and_exchange_apart_from_pauses_and_held_time():
    now = [0.0]
    timer = StepTimer(clock=lambda: now[0])
    for step in range(10):
        now[0] += 0.5 if step == 7 else 0.01  # step 7: a pause (validation), not compute
        timer.compute_ended()
        timer.exchange_started(0.01 if step != 7 else 0.5)
        now[0] += 0.003
        timer.exchange_ended(held_s=0.001)
    assert timer.compute_s == pytest.approx(0.01) and timer.comm_s == pytest.approx(0.002)
    assert timer.comm_total_s == pytest.approx(10 * 0.002) and timer.typical_compute_s() == pytest.approx(0.01)


def test_the_virtual_clock_and_its_step_cost_are_parsed():
    from nbdist.host.hetero import StepCost, parse_clock

    assert parse_clock("speed=1,0.5") == ("real", None)
    clock, step = parse_clock("speed=1,0.5; clock=virtual; step=12ms")
    assert clock == "virtual" and step.at(64).seconds(64) == pytest.approx(0.012)
    assert step.at(64).seconds(128) == pytest.approx(0.024)  # proportional to the batch
    _, step = parse_clock("clock=virtual; step=1ms+30us/sample")
    assert step.fixed_s == pytest.approx(0.001) and step.per_sample_s == pytest.approx(30e-6)
    assert step.seconds(100) == pytest.approx(0.004)
    measured = StepCost(0.0012345678, 3.456789e-05)  # what a table records reproduces the measured cost
    assert parse_clock(f"clock=virtual; step={measured.text()}")[1].seconds(64) == pytest.approx(
        measured.seconds(64), rel=1e-5)
    assert parse_simulate("speed=1,0.5; clock=virtual; step=12ms", 2)[1].speed == 0.5
    with pytest.raises(OptionError, match="add clock=virtual"):
        parse_clock("step=12ms")
    with pytest.raises(OptionError, match="real .sleeps. or virtual"):
        parse_clock("clock=warp")
