"""Delay-compensated rules: hand-computed values and the special cases of DESIGN.md section 5."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbdist.ps import delay
from nbdist.ps.delay import DelayParams

ETA = 0.1
RNG = np.random.default_rng(7)
PUSHES = [(int(tau), RNG.normal(size=6), RNG.normal(size=6)) for tau in (0, 3, 1, 7, 2, 0, 5)]  # tau, g, w_bak


def run(params: DelayParams, pushes=PUSHES, w0=None):
    """Apply `pushes` with the general rule; returns the final weights and the decisions."""
    w = np.linspace(-1, 1, 6) if w0 is None else w0.copy()
    v, worker, tau_bar, decisions = np.zeros(6), delay.new_worker_state(6, np.float64), 0.0, []
    for tau, g, w_bak in pushes:
        worker["w_bak"][:] = w_bak
        decision = delay.decide(params, tau_bar, tau)
        tau_bar = decision.tau_bar
        delay.apply(params, decision, w, g, v, worker, ETA)
        decisions.append(decision)
    return w, decisions


def test_dc_asgd_constant_lambda_by_hand():
    params = delay.preset("dc-asgd", momentum=0.9, workers=4)
    w, g = np.array([1.0, 2.0]), np.array([0.2, -0.4])
    worker = {"w_bak": np.array([0.5, 2.0]), "ms": np.zeros(2)}
    decision = delay.decide(params, 0.0, 2)
    comp = delay.apply(params, decision, w, g, np.zeros(2), worker, ETA)
    # c = 0.04 * g^2 * (w - w_bak) = [0.04*0.04*0.5, 0] = [0.0008, 0]
    np.testing.assert_allclose(w, [1.0 - 0.1 * 0.2008, 2.0 + 0.1 * 0.4], rtol=0, atol=1e-12)
    assert comp == pytest.approx(0.0008 ** 2)
    assert (decision.gamma, decision.momentum, decision.dropped) == (1.0, 0.0, False)


def test_ddc_asgd_by_hand_with_the_taylor_clip():
    params = delay.preset("ddc-asgd", momentum=0.9, workers=4)
    w, g = np.array([5.0]), np.array([0.1])
    worker = {"w_bak": np.array([-5.0]), "ms": np.zeros(1)}
    decision = delay.decide(params, 0.0, 3)
    comp = delay.apply(params, decision, w, g, v := np.zeros(1), worker, ETA)
    # tau_bar = 0.1*3 = 0.3; gamma = 1.3/4 = 0.325; mu_t = (0.9 - 0.3/1.3) * 0.325
    assert decision.tau_bar == pytest.approx(0.3)
    assert decision.gamma == pytest.approx(0.325)
    assert decision.momentum == pytest.approx((0.9 - 0.3 / 1.3) * 0.325)
    # MS = 0.05*0.01; lam = 2/sqrt(MS+1e-7) ~ 89.4; c = lam*0.01*10 ~ 8.9 -> clipped to kappa*|g| = 0.1
    np.testing.assert_allclose(worker["ms"], [0.0005])
    assert comp == pytest.approx(0.1 ** 2)
    np.testing.assert_allclose(v, [-0.1 * 0.325 * (0.1 + 0.1)], atol=1e-12)
    np.testing.assert_allclose(w, [5.0 - 0.0065], atol=1e-12)


def test_a_push_far_staler_than_the_mean_is_dropped_and_changes_nothing():
    params = DelayParams(frozen_tau_bar=1.0)  # drop above tau_drop * (1 + 1) = 16
    w, worker = np.array([1.0]), {"w_bak": np.array([0.0]), "ms": np.zeros(1)}
    assert not delay.decide(params, 0.0, 16).dropped
    decision = delay.decide(params, 0.0, 17)
    assert decision.dropped
    assert delay.apply(params, decision, w, np.array([3.0]), np.zeros(1), worker, ETA) == 0.0
    assert w[0] == 1.0 and worker["ms"][0] == 0.0


def test_one_ancient_gradient_is_dropped_without_lifting_tau_bar_for_the_pushes_after_it():
    params = delay.preset("ddc-asgd", momentum=0.9, workers=4)
    tau_bar, seen = 0.0, []
    for tau in (3, 3, 3, 400, 3):  # by hand: tau_bar 0.3, 0.57, 0.813; 400 > 8 x 1.813 = 14.504
        decision = delay.decide(params, tau_bar, tau)
        tau_bar = decision.tau_bar
        seen.append((round(tau_bar, 6), decision.dropped))
    # the outlier feeds tau_bar only min(400, 14.504): 0.9 x 0.813 + 0.1 x 14.504 = 2.1821 (not 40.73)
    assert seen == [(0.3, False), (0.57, False), (0.813, False), (2.1821, True), (2.26389, False)]
    after = delay.decide(params, 2.1821, 3)
    assert after.momentum == pytest.approx(max(0.0, 0.9 - 2.26389 / 3.26389) * after.gamma, abs=1e-6)
    assert after.momentum > 0  # momentum is not switched off by the one outlier


def test_special_case_momentum_free_asgd():
    w, _ = run(DelayParams(p=0, lam0=0, momentum=0, tau_drop=math.inf))
    expected = np.linspace(-1, 1, 6) - ETA * sum(g for _, g, _ in PUSHES)
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-7)


def test_special_case_dc_asgd_a():
    w, _ = run(DelayParams(p=0, momentum=0, kappa=math.inf, tau_drop=math.inf))
    expected, ms = np.linspace(-1, 1, 6), np.zeros(6)
    for _, g, w_bak in PUSHES:  # Zheng et al.'s adaptive rule, written out
        ms = 0.95 * ms + 0.05 * g * g
        expected = expected - ETA * (g + 2.0 / np.sqrt(ms + 1e-7) * g * g * (expected - w_bak))
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(run(delay.preset("dc-asgd-a", 0.9, 4))[0], expected, rtol=0, atol=1e-7)


def test_special_case_dc_asgdk():
    workers, mu = 4, 0.9
    w, decisions = run(DelayParams(p=0, kappa=math.inf, tau_drop=math.inf, momentum=mu,
                                   frozen_tau_bar=workers - 1))
    mu_k = max(0.0, mu - (1 - 1 / workers))
    expected, ms, v = np.linspace(-1, 1, 6), np.zeros(6), np.zeros(6)
    for _, g, w_bak in PUSHES:  # compensated gradient of dc-asgd-a, heavy ball with momentum fixed by K
        ms = 0.95 * ms + 0.05 * g * g
        v = mu_k * v - ETA * (g + 2.0 / np.sqrt(ms + 1e-7) * g * g * (expected - w_bak))
        expected = expected + v
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-7)
    assert all(d.momentum == pytest.approx(mu_k) and d.gamma == 1.0 for d in decisions)
    np.testing.assert_allclose(run(delay.preset("dc-asgdk", mu, workers))[0], expected, rtol=0, atol=1e-7)


def test_special_case_staleness_aware_sgd():
    w, decisions = run(DelayParams(lam0=0, momentum=0, gamma_min=0, tau_drop=math.inf, frozen_tau_bar=0.0))
    expected = np.linspace(-1, 1, 6) - sum(ETA / (tau + 1) * g for tau, g, _ in PUSHES)
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-7)
    assert [d.gamma for d in decisions] == pytest.approx([1 / (tau + 1) for tau, _, _ in PUSHES])


def test_large_variables_are_compensated_in_chunks_with_the_same_result():
    params = delay.preset("ddc-asgd", momentum=0.9, workers=4)
    n = 3 * 65536 + 5
    rng = np.random.default_rng(3)
    w_big, g, bak = (rng.normal(size=n).astype(np.float32) for _ in range(3))
    w_small, v_big, v_small = w_big.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    decision = delay.decide(params, 0.5, 2)
    big = delay.apply(params, decision, w_big, g, v_big, {"w_bak": bak.copy(), "ms": np.zeros(n, np.float32)}, ETA)
    small = 0.0
    for start in range(0, n, 1000):  # the same update, 1000 elements at a time by hand
        part = slice(start, start + 1000)
        small += delay.apply(params, decision, w_small[part], g[part], v_small[part],
                             {"w_bak": bak[part].copy(), "ms": np.zeros(len(g[part]), np.float32)}, ETA)
    np.testing.assert_array_equal(w_big, w_small)
    assert big == pytest.approx(small, rel=1e-6)


def test_params_round_trip_through_json_with_infinities():
    params = delay.preset("dc-asgdk", 0.9, 8, lam0=1.5)
    assert delay.DelayParams.from_json(params.to_json()) == params
    assert params.to_json()["kappa"] is None and params.frozen_tau_bar == 7.0
