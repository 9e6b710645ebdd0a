"""The comparison tool's parsing and summaries (the runs themselves are the integration tests' job)."""

from __future__ import annotations

import math

import pytest

from nbdist.errors import OptionError
from nbdist.experiments import markdown, parse_rows, result_lines, summarise
from nbdist.strategies import option_line


def test_rows_carry_their_options_with_the_magics_types():
    rows = parse_rows("local, asgd:momentum=0, ddc-asgd:p=2:tau-drop=inf")
    assert [(r.label, r.strategy, r.options) for r in rows] == [
        ("local", "local", {}), ("asgd:momentum=0", "asgd", {"momentum": 0.0}),
        ("ddc-asgd:p=2:tau-drop=inf", "ddc-asgd", {"p": 2.0, "tau_drop": math.inf})]


@pytest.mark.parametrize("text, message", [("sgdx", "unknown strategy 'sgdx'"),
                                           ("dc-asgd:p=2", "dc-asgd has no option 'p'")])
def test_bad_rows_name_the_problem(text, message):
    with pytest.raises(OptionError, match=message):
        parse_rows(text)


def test_option_line_round_trips_through_the_magic_flags():
    line = option_line({"strategy": "ddc-asgd", "workers": 4, "simulate": "speed=1,0.5; latency=5ms", "tau_drop": 8})
    assert line == "--strategy ddc-asgd --workers 4 --simulate 'speed=1,0.5; latency=5ms' --tau-drop 8"


def test_summary_is_mean_and_std_over_seeds_in_row_order():
    results = [{"label": label, "accuracy": acc, "wall_s": 10.0, "staleness_mean": 1.0, "staleness_max": m,
                "dropped": 0, "error": None}
               for label, acc, m in (("b", 0.8, 3), ("a", 0.7, 1), ("b", 0.6, 5))]
    summary = summarise(results)
    assert [s["label"] for s in summary] == ["b", "a"]
    assert summary[0]["accuracy_mean"] == pytest.approx(0.7) and summary[0]["accuracy_std"] == pytest.approx(0.1414, abs=1e-4)
    assert summary[0]["staleness_max"] == 5 and summary[1]["accuracy_std"] == 0.0

    class Args:
        workers, samples, hidden, lr, momentum, batch, epochs, seeds, simulate = 4, 8000, 128, 0.05, 0.9, 64, 2, 2, None
        model, target_accuracy = "mlp", None
    table = markdown(summary, "python -m nbdist.experiments compare", Args)
    assert "| b | 0.7000 +- 0.1414 | 10.0 | - | 1.00 | 5 | 0 |" in table


def test_time_to_target_and_the_ratios_of_ashl_to_the_others():
    def result(label, times, accs, sent=2e6):
        return {"label": label, "accuracy": accs[-1], "wall_s": times[-1], "staleness_mean": 0.0, "staleness_max": 0,
                "dropped": 0, "error": None, "bytes_sent": sent, "curve": {"t": times, "val_accuracy": accs}}

    results = [result("ashl", [5, 10], [0.7, 0.81]), result("ashl", [4, 8], [0.80, 0.85]),
               result("ssgd", [10, 20], [0.6, 0.80]), result("ssgd", [10, 20], [0.5, 0.7]),
               result("adsp", [3, 6], [0.5, 0.6], sent=None)]
    summary = summarise(results, target=0.8)
    ashl, ssgd, adsp = summary
    assert ashl["time_to_target"] == pytest.approx(7.0) and ashl["reached"] == 2
    assert ssgd["time_to_target"] == pytest.approx(20.0) and ssgd["reached"] == 1
    assert adsp["time_to_target"] is None and adsp["bytes_sent"] is None and ashl["bytes_sent"] == 2e6
    # final accuracy: ashl (0.81 + 0.85) / 2 = 0.83 against the best baseline, ssgd's (0.80 + 0.70) / 2 = 0.75
    assert result_lines(summary) == ["RESULT ashl_vs_ssgd_time=0.350", "RESULT ashl_vs_adsp_time=0",
                                     "RESULT ashl_minus_best_pts=8.00"]


def test_a_diverged_row_counts_as_failed_instead_of_crashing_the_summary():
    results = [{"label": "asgd", "accuracy": acc, "wall_s": 1.0, "staleness_mean": 1.0, "staleness_max": 2,
                "dropped": 0, "error": None} for acc in (0.8, float("nan"), 0.6)]
    summary = summarise(results)[0]
    assert summary["accuracy_mean"] == pytest.approx(0.7) and summary["failed"] == 1


def test_the_ddc_claim_lines_come_from_the_rows_means():
    from nbdist.experiments import ddc_result_lines

    summary = [{"label": label, "accuracy_mean": acc} for label, acc in
               (("local", 0.85), ("asgd:momentum=0", 0.80), ("asgd", 0.10), ("dc-asgdk", 0.81), ("ddc-asgd", 0.83))]
    assert ddc_result_lines(summary) == ["RESULT ddc_minus_asgd_pts=3.00", "RESULT ddc_minus_dcasgdk_pts=2.00",
                                         "RESULT ddc_gap_closed=0.500"]


def test_rows_on_the_virtual_clock_share_one_step_cost_and_one_engine_rows_get_only_the_clock():
    from types import SimpleNamespace

    from nbdist.experiments.grid import row_simulate

    args = SimpleNamespace(simulate="speed=1,1,0.2,0.1", clock="virtual", step="1ms+30us/sample")
    rows = {r.label: r for r in parse_rows("local,ddc-asgd")}
    assert row_simulate(rows["ddc-asgd"], args) == "speed=1,1,0.2,0.1; clock=virtual; step=1ms+30us/sample"
    assert row_simulate(rows["local"], args) == "clock=virtual; step=1ms+30us/sample"
