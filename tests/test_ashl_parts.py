"""ASHL's decisions as pure functions: allocation, the phase switch, compression (DESIGN.md section 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbdist.strategies.ashl.allocation import CostModel, allocate, drifted, fit_profile, shard_fractions
from nbdist.strategies.ashl.switch import SETTLED, Check, SwitchRule
from nbdist.errors import OptionError


def test_allocation_equalises_step_time_on_a_hand_example():
    # T = (300 + 0.01/0.001 + 0.01/0.002) / (1/0.001 + 1/0.002) = 315 / 1500 = 0.21 s
    profiles = [CostModel(0.01, 0.001), CostModel(0.01, 0.002)]
    assert allocate(profiles, 300) == [200, 100]
    assert [p.step_s(b) for p, b in zip(profiles, [200, 100])] == pytest.approx([0.21, 0.21])


def test_allocation_counts_communication_time():
    # the second worker also spends 0.05 s per exchange: T = (300 + 10 + 30) / 1500 = 0.2267
    batches = allocate([CostModel(0.01, 0.001), CostModel(0.01, 0.002, comm_s=0.05)], 300)
    assert sum(batches) == 300 and batches == [217, 83]


def test_allocation_respects_bounds_and_sums_to_the_global_batch():
    profiles = [CostModel(0.0, 0.001), CostModel(0.0, 0.004), CostModel(0.0, 0.004), CostModel(0.0, 0.02)]
    batches = allocate(profiles, 256, b_min=16, b_max=120)
    assert sum(batches) == 256 and all(16 <= b <= 120 for b in batches)
    assert batches[0] == 120 and batches[3] == 16  # the fastest capped, the slowest floored
    assert batches[1] == batches[2]
    with pytest.raises(ValueError, match="cannot be split"):
        allocate(profiles, 1000, b_max=120)


def test_a_worker_whose_samples_cost_nothing_takes_what_leaves_the_others_their_smallest_batch():
    # a tiny model's profile under timer noise: worker 2's slope clamped to ~0, its fixed cost the smallest, so
    # every split gives it more; uncapped it took all 96 and the others' floors left no one to solve for
    profiles = [CostModel(0.002, 1e-5, 0.001), CostModel(0.002, 1e-5, 0.001), CostModel(0.0015, 1e-12, 0.001)]
    from nbdist.strategies.ashl.allocation import allocate_commits

    assert allocate(profiles, 96, b_min=4) == [4, 4, 88]
    assert allocate_commits(profiles, 96, b_min=4) == ([4, 4, 88], [1, 1, 1], [1, 1, 1])


def test_allocation_rounds_without_losing_a_sample():
    batches = allocate([CostModel(0.0, 1 / 3), CostModel(0.0, 1 / 3), CostModel(0.0, 1 / 3)], 100)
    assert sum(batches) == 100 and sorted(batches) == [33, 33, 34]
    assert shard_fractions([200, 100]) == pytest.approx([2 / 3, 1 / 3])


def test_profile_fit_and_drift():
    profile = fit_profile([32, 64, 32, 64], [0.042, 0.074, 0.042, 0.074])
    assert profile.per_sample_s == pytest.approx(0.001) and profile.fixed_s == pytest.approx(0.01)
    assert drifted([0.2, 0.2, 0.2], [0.21, 0.24, 0.16]) == [1, 2]


def run_checks(checks):
    rule = SwitchRule()
    return [rule.check(c) for c in checks]


def test_each_switch_condition_fires_on_its_own_at_the_second_check():
    flat = [Check(epoch=e, epochs=10, loss=1.0) for e in (2.0, 2.5, 3.0)]
    assert run_checks(flat)[2].startswith("loss improved 0.00%")
    falling = [Check(epoch=e, epochs=10, loss=loss) for e, loss in ((2.0, 1.0), (2.5, 0.8), (3.0, 0.6))]
    assert run_checks(falling) == [None, None, None]
    stale = [Check(epoch=e, epochs=10, loss=loss, gammas=[0.3, 0.4, 0.9]) for e, loss in ((2.0, 1.0), (2.5, 0.8))]
    assert run_checks(stale)[1].startswith("67% of pushes had gamma < 0.5")
    decayed = [Check(epoch=e, epochs=10, loss=loss, lr_decayed=True) for e, loss in ((2.0, 1.0), (2.5, 0.8))]
    assert run_checks(decayed)[1] == "the learning rate made its first decay"
    late = [Check(epoch=e, epochs=10, loss=loss) for e, loss in ((6.0, 1.0), (6.5, 0.8))]
    assert run_checks(late)[1].startswith("65% of the epochs done")


def test_checks_at_epoch_ends_switch_where_half_epoch_checks_would():
    # 4 epochs: 60% is epoch 2.4; half-epoch checks see it at 2.5 and 3.0 and switch at 3.0
    halves = [Check(epoch=e / 2, epochs=4, loss=2.0 - e / 10) for e in range(1, 9)]
    assert [i for i, r in enumerate(run_checks(halves)) if r] == [5, 6, 7]  # epochs 3.0, 3.5, 4.0
    ends = [Check(epoch=e, epochs=4, loss=2.0 - e / 5) for e in (1, 2, 3, 4)]
    assert run_checks(ends)[:3] == [None, None, "75% of the epochs done (>= 60%)"]


def test_a_fixed_switch_point_switches_at_its_first_check_and_on_nothing_else():
    rule = SwitchRule(at=0.25)
    stale_and_flat = [Check(epoch=e, epochs=4, loss=1.0, gammas=[0.1] * 9, lr_decayed=True) for e in (0.5, 1.0)]
    assert [rule.check(c) for c in stale_and_flat] == [None, "25% of the epochs done (--switch-at 0.25)"]
    late = SwitchRule(at=0.75)
    assert [late.check(Check(epoch=e, epochs=4, loss=1.0)) for e in (1, 2, 3)][2] == \
        "75% of the epochs done (--switch-at 0.75)"


def test_no_switch_on_a_single_check_or_before_a_fifth_of_the_epochs():
    one = [Check(epoch=2.0, epochs=10, loss=1.0, lr_decayed=True), Check(epoch=2.5, epochs=10, loss=0.5)]
    assert run_checks(one) == [None, None]
    early = [Check(epoch=e, epochs=10, loss=1.0, lr_decayed=True) for e in (0.5, 1.0, 1.5)]
    assert run_checks(early) == [None, None, None]
    assert run_checks(early + [Check(epoch=2.0, epochs=10, loss=1.0, lr_decayed=True)])[-1] is not None


def test_adsp_commit_interval_search_climbs_to_the_faster_interval_and_comes_back_from_worse():
    from nbdist.strategies.adsp import IntervalSearch

    search = IntervalSearch(start=4)
    rates = {4: 1.0, 8: 2.0, 16: 0.5, 2: 0.2}
    visited = []
    for _ in range(6):
        visited.append(search.interval)
        search.report(rates.get(search.interval, 0.0))
    assert visited[:3] == [4, 8, 16]  # climbs while it improves
    assert visited[3] in (4, 8) and search.best == (3, 2.0)  # back from the worse side; 8 stays the best
    assert [e["from"] for e in search.trials] == visited


def test_a_floored_worker_on_a_free_link_gets_period_one_not_a_division_by_zero():
    from nbdist.strategies.ashl.allocation import allocate_with_periods

    # worker 1 is so slow it is held at b_min, and nothing is left of the step for an exchange that costs 0
    profiles = [CostModel(0.001, 1e-5, 0.0), CostModel(0.05, 1e-3, 0.0)]
    batches, periods = allocate_with_periods(profiles, 128, b_min=16)
    assert sum(batches) == 128 and batches[1] == 16 and periods == [1, 1]


def test_a_dataset_batched_last_is_split_per_global_batch_by_the_allocation():
    import tensorflow as tf

    from nbdist.strategies.ashl.batches import DatasetBatches, per_sample

    x = np.arange(100, dtype="float32")
    samples, batch = per_sample(tf.data.Dataset.from_tensor_slices((x, x)).batch(8).prefetch(2))
    assert batch == 8 and int(samples.cardinality()) == 100
    mine = DatasetBatches(samples, 1, [5, 2, 3])  # global batches of 10: rank 1 takes samples 5 and 6 of each
    assert mine.steps == 10 and [b[0].numpy().tolist() for b in mine.dataset.take(2)] == [[5, 6], [15, 16]]
    mine.set_batches([4, 4, 2])  # a re-allocation moves its slice for the batches read from then on
    assert next(iter(mine.dataset))[0].numpy().tolist() == [4, 5, 6, 7]


def test_a_dataset_ashl_cannot_rebatch_is_refused_with_what_to_pass():
    import tensorflow as tf

    from nbdist.strategies.ashl.batches import per_sample

    x = np.arange(100, dtype="float32")
    with pytest.raises(OptionError, match="last transformation is MapDataset; move .batch"):
        per_sample(tf.data.Dataset.from_tensor_slices((x, x)).batch(8).map(lambda a, b: (a, b)))
    with pytest.raises(OptionError, match="known, finite length"):
        per_sample(tf.data.Dataset.from_tensor_slices((x, x)).filter(lambda a, b: a > 3).batch(8))


def test_local_steps_between_commits_on_a_hand_example():
    """Two workers of equal compute (1e-4 s a sample), the second on a link whose exchange takes 20 ms; B = 128.
    By hand: k = 1 gives b = [112, 16] (the second floored) and 14.8 ms of the common 16.4 ms left for its
    exchange, so k = 2; then k = 3 (9.8 ms left), then b = [97, 31] and k = 4; at k = 4 the exchange costs 5 ms
    a step and b = [89, 39] makes both steps 8.9 ms, of which the second worker's compute leaves 5 ms: k stays 4."""
    from nbdist.strategies.ashl.allocation import allocate_with_periods

    fast, slow_link = CostModel(0.0, 1e-4, 0.0), CostModel(0.0, 1e-4, 0.02)
    assert allocate_with_periods([fast, slow_link], 128, b_min=16) == ([89, 39], [1, 4])


def test_local_steps_at_one_commit_cadence_on_a_hand_example():
    """Three workers committing local updates, B = 100, times in ms. Workers 0 and 1: 1 ms a sample, a free
    link; worker 2: 2 ms a sample, a 40 ms exchange. By hand: at k = 1, T = (100 + 40/2) / (1 + 1 + 1/2) = 48
    and the exchange (40) is more than half of the interval 48; at k = 2, T = (100 + 20/2) / 2.5 = 44, so
    b = [44, 44, (44 - 20) / 2 = 12] and 40 <= 0.5 * 88: every worker makes 2 local steps and each interval
    is 88 ms: 2 * 44, 2 * 44 and 2 * 24 + 40."""
    from nbdist.strategies.ashl.allocation import allocate_commits

    ms = 1e-3
    profiles = [CostModel(0.0, 1 * ms, 0.0), CostModel(0.0, 1 * ms, 0.0), CostModel(0.0, 2 * ms, 40 * ms)]
    batches, steps, every = allocate_commits(profiles, 100)
    assert (batches, steps, every) == ([44, 44, 12], [2, 2, 2], [1, 1, 1])
    intervals = [k * (p.fixed_s + p.per_sample_s * b) + p.comm_s for p, b, k in zip(profiles, batches, steps)]
    assert intervals == pytest.approx([88 * ms] * 3)


def test_a_worker_held_at_b_min_and_a_link_too_slow_keep_the_cadence_as_near_as_they_can():
    """Workers 0 and 1 as above; worker 2 computes 4 ms a sample and exchanges in 60 ms; B = 100, b_min = 10.
    By hand: held at b = 10 (its ideal is 6.7 at k = 3), the others take 45 each, T = 45; k = 1 and 2 leave the
    exchange more than half of 45 and 90 ms; k = 3 fits it in 135 ms, where worker 2 makes
    round((135 - 60) / 40) = 2 steps (140 ms). A fourth worker on a 1 s link (1 ms a sample) cannot fit half of
    even 16 intervals: it commits every ceil(1000 / (0.5 * 16 * T)) intervals and makes the steps that fill them."""
    from nbdist.strategies.ashl.allocation import MAX_PERIOD, allocate_commits

    ms = 1e-3
    fast, slow = CostModel(0.0, 1 * ms, 0.0), CostModel(0.0, 4 * ms, 60 * ms)
    assert allocate_commits([fast, fast, slow], 100, b_min=10) == ([45, 45, 10], [3, 3, 2], [1, 1, 1])
    batches, steps, every = allocate_commits([fast, fast, slow, CostModel(0.0, 1 * ms, 1000 * ms)], 120, b_min=10)
    interval = MAX_PERIOD * (fast.per_sample_s * batches[0])
    assert steps[:2] == [MAX_PERIOD, MAX_PERIOD] and every[:2] == [1, 1]
    assert every[3] == math.ceil(1.0 / (0.5 * interval))
    assert steps[3] == round((every[3] * interval - 1.0) / (1 * ms * batches[3]))


def test_a_settled_allocation_switches_at_the_first_check_past_a_fifth_of_the_epochs():
    rule = SwitchRule()
    falling = [Check(epoch=e / 2, epochs=10, loss=2.0 - e / 10, settled=True) for e in range(1, 6)]
    assert [rule.check(c) for c in falling] == [None, None, None, SETTLED, SETTLED]  # 0.5 ... 2.0 epochs of 10
    moving = SwitchRule()  # re-allocated or drifting at every check: the loss decides, at two checks in a row
    decided = [moving.check(Check(epoch=e, epochs=4, loss=1.0)) for e in (1.0, 1.5, 2.0)]
    assert decided[:2] == [None, None] and decided[2].startswith("loss improved")
    once = SwitchRule()  # settled once, then moving again: nothing held at two checks in a row
    assert [once.check(Check(epoch=e, epochs=10, loss=2.0 - e / 5, settled=e == 2.5)) for e in (2.0, 3.0)] == \
        [None, None]
