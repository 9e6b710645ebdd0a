"""The delay-compensated rules and ssgd on real engines and a real parameter server."""

from __future__ import annotations

import pytest

from tests.support import SGD_CELL, idle_engines

pytestmark = pytest.mark.cluster


def pushes(kernel) -> list[dict]:
    return kernel.value("[{k: r[k] for k in ('worker', 'staleness', 'gamma', 'momentum', 'comp_norm', 'applied', "
                        "'dropped')} for r in nbdist.last_run.push_records]")


def test_slow_workers_push_stale_gradients_and_ddc_asgd_scales_them_down(kernel, cluster):
    idle_engines(cluster, 4)
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=1, steps=12, shuffle=True)
    kernel.run('%%distribute --strategy ddc-asgd --workers 4 --simulate "speed=1,1,0.5,0.25; clock=virtual; step=5ms"\n'
               + cell, timeout=300).check()
    log = pushes(kernel)
    assert sorted(p["worker"] for p in log) == sorted(list(range(4)) * 12)
    # on the virtual clock the order is the simulated cluster's: the slow workers' pushes come late
    assert all(max(p["staleness"] for p in log if p["worker"] == k) >= 3 for k in (2, 3))
    assert all(min(p["gamma"] for p in log if p["worker"] == k) < 1 for k in (2, 3))
    # whatever order the pushes arrived in, each one's gamma and momentum follow DESIGN.md section 5
    # (amended) from the delays logged before it
    tau_bar = 0.0
    for p in log:
        limit = 8 * (tau_bar + 1)
        tau_bar = 0.9 * tau_bar + 0.1 * min(p["staleness"], limit)
        assert p["dropped"] == (p["staleness"] > limit)
        if p["applied"]:
            gamma = min(1.0, max(0.1, (tau_bar + 1) / (p["staleness"] + 1)))
            assert p["gamma"] == pytest.approx(gamma, abs=1e-6)
            assert p["momentum"] == pytest.approx(max(0.0, 0.9 - tau_bar / (tau_bar + 1)) * gamma, abs=1e-6)
            assert p["comp_norm"] is not None


def test_ssgd_with_two_workers_equals_one_worker_with_twice_the_batch(kernel):
    cell = SGD_CELL.format(lr=0.1, batch="{batch}", epochs=1, steps=8, shuffle=False)
    kernel.run("%%distribute --strategy local --seed 4\n" + cell.format(batch=64), timeout=180).check()
    kernel.run("sequential = model.get_weights()").check()
    kernel.run("%%distribute --strategy ssgd --workers 2 --seed 4\n" + cell.format(batch=32), timeout=180).check()
    diff = kernel.value("max(float(abs(a - b).max()) for a, b in zip(sequential, model.get_weights()))")
    assert diff <= 1e-5, diff
    assert kernel.value("nbdist.last_run.ps[0]['version']") == 8  # one update per round of 2 pushes
    assert {p["staleness"] for p in pushes(kernel)} == {0}


def test_momentum_on_async_workers_is_reported_with_a_warning(kernel):
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=1, steps=10, shuffle=True).replace(
        "SGD(0.05)", "SGD(0.05, momentum=0.9)")
    reply = kernel.run('%%distribute --strategy asgd --workers 2 --simulate "clock=virtual; step=5ms"\n' + cell,
                       timeout=180).check()
    # equal speeds on the virtual clock: the two workers alternate, every push after the first one version stale
    assert [r["staleness"] for r in pushes(kernel)] == [0] + [1] * 19
    tau_bar = 19 / 20
    assert f"effective momentum ~ {0.9 + tau_bar / (tau_bar + 1):.2f} (momentum 0.9" in reply.stdout  # 1.39
    assert "may diverge" in reply.stdout and "--strategy ddc-asgd" in reply.stdout


def test_delay_rules_refuse_adam_by_name(kernel):
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=1, steps=2, shuffle=True).replace(
        "keras.optimizers.SGD(0.05)", "keras.optimizers.Adam()")
    reply = kernel.run("%%distribute --strategy dc-asgd-a --workers 1\n" + cell, timeout=180)
    assert reply.ename == "OptionError" and "compiled Adam" in reply.evalue and "--strategy asgd" in reply.evalue


def test_adsp_workers_commit_local_updates_and_learn(kernel):
    cell = SGD_CELL.format(lr=0.05, batch=32, epochs=2, steps="None", shuffle=True)
    kernel.run('%%distribute --strategy adsp --workers 2 --seed 1 --simulate "clock=virtual; step=5ms"\n' + cell,
               timeout=240).check()
    result = kernel.value("{'counts': nbdist.last_run.ps[0]['counts'], 'version': nbdist.last_run.ps[0]['version'], "
                          "'steps': sum(len(f.history['loss']) * f.params['steps'] for fits in "
                          "nbdist.last_run.results.values() for f in fits), 'loss': history.history['loss'], "
                          "'eval': model.evaluate(xt, yt, verbose=0)[1]}")
    commits = result["counts"]["applied"]
    assert result["version"] == commits == result["counts"]["acked"]
    assert 0 < commits < result["steps"]  # fewer commits than steps: each carries several local steps
    assert result["loss"][-1] < result["loss"][0] and result["eval"] > 0.5
