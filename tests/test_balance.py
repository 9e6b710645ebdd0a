"""`hfdt --balance auto`'s arithmetic: batches by speed, gradient weights, whole batches, what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.strategies import balance
from nbdist.errors import OptionError
from nbdist.host.hetero import Profile, StepCost

STEP = StepCost(fixed_s=0.001, per_sample_s=50e-6)


def test_batches_equalise_step_time_and_weights_make_the_global_mean():
    costs = [balance.own_cost({"x": np.zeros((4, 1)), "y": np.zeros(4)}, None, 32, Profile(speed=s), STEP)
             for s in (1.0, 0.5)]
    # (1 ms + 50 us b) / s equal with b0 + b1 = 64: b = 49.33, 14.67 -> 49, 15 (largest remainder)
    batches = balance.balanced_batches(costs, 32)
    assert batches == [49, 15]
    weights = [balance.gradient_weight(batches, rank) for rank in (0, 1)]
    assert sum(w * 1.0 for w in weights) / 2 == pytest.approx(1.0)  # an average of equal gradients is unchanged
    assert weights == pytest.approx([2 * 49 / 64, 2 * 15 / 64])


def test_a_share_is_cut_to_whole_batches_and_a_share_under_one_batch_is_refused():
    data = {"x": np.arange(100), "y": np.arange(100), "sample_weight": None}
    assert balance.steps_per_epoch(100, 15) == 6
    cut = balance.whole_batches(data, 6 * 15)
    assert len(cut["x"]) == len(cut["y"]) == 90 and "sample_weight" not in cut
    with pytest.raises(OptionError, match="less than its balanced batch of 101"):
        balance.steps_per_epoch(100, 101)


def test_inputs_other_than_arrays_are_refused_saying_what_to_pass():
    with pytest.raises(OptionError, match="pass x and y as arrays, or use --balance none"):
        balance.own_cost({"x": [[1.0]] * 4, "y": [0] * 4}, None, 32, Profile(), STEP)
