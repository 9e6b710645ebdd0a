"""The planner: epoch times from hand-given costs, refusals with their reasons, the ranking, and
`--strategy auto` / `--plan-only` / `%dist plan` through a real kernel on the shared cluster."""

from __future__ import annotations

import re

import numpy as np
import pytest

from nbdist.host.hetero import Profile, StepCost
from nbdist.planner.chart import plan_figure
from nbdist.planner.calibrate import solve
from nbdist.planner.costs import ClusterCosts, MeasuredSteps, ServerCosts
from nbdist.planner.plan import kendall_tau, make_plan, scaling, trend_crossing
from nbdist.planner.predict import predict
from tests.conftest import TRAIN

# Two workers, the second half as fast; 100 Mbit/s links with 1 ms latency; t(b) = 2 ms + 0.1 ms x b;
# 640 samples in batches of 32; a model of 100,000 bytes.
LINK = dict(bandwidth_bps=100e6, latency_s=1e-3)
COSTS = ClusterCosts((Profile(1.0, **LINK), Profile(0.5, **LINK)), StepCost(2e-3, 1e-4), samples=640, batch=32,
                     model_bytes=100_000)
COMPUTE = [0.002 + 0.0032, (0.002 + 0.0032) / 0.5]  # 5.2 ms and 10.4 ms a step
ONE_WAY = 0.001 + 100_000 * 8 / 100e6  # 9 ms: latency + transfer


def test_a_synchronous_epoch_is_the_slowest_ranks_steps_then_the_ring_by_hand():
    steps = 640 // (2 * 32)  # 10 steps of 2 x 32
    ring = 2 * 1 / 2 * 100_000 * 8 / 100e6 + 2 * 1 * 0.001  # 2(N-1)/N of the bytes, 2(N-1) latencies: 10 ms
    assert predict("hfdt", COSTS).epoch_s == pytest.approx(steps * (COMPUTE[1] + ring))  # 0.204 s
    assert predict("ssgd", COSTS).epoch_s == pytest.approx(steps * (COMPUTE[1] + 2 * ONE_WAY))  # 0.284 s
    assert "waits for worker 1, 2.0x slower" in predict("hfdt", COSTS).reason


def test_an_asynchronous_epoch_with_batches_dealt_is_the_samples_over_the_summed_rates_by_hand():
    cycles = [c + 2 * ONE_WAY for c in COMPUTE]  # 23.2 ms and 28.4 ms
    rate = sum(32 / c for c in cycles)  # samples per second of both
    assert predict("asgd", COSTS).epoch_s == pytest.approx(640 / rate + cycles[1] / 2)
    static = predict("asgd", COSTS, {"data": "static"})
    assert static.epoch_s == pytest.approx(10 * cycles[1])  # each its 320 samples; the slower one ends the epoch
    assert predict("local", COSTS).epoch_s == pytest.approx(20 * COMPUTE[0])


def test_the_parameter_servers_cost_per_message_bounds_the_asynchronous_epoch_and_says_so():
    busy = ClusterCosts(COSTS.profiles, COSTS.step, 640, 32, 100_000, server=ServerCosts(message_s=0.02))
    prediction = predict("asgd", busy)
    assert prediction.epoch_s == pytest.approx(20 * 0.02)  # 20 pushes an epoch, answered one by one
    assert prediction.reason.startswith("PS saturated")


def test_what_short_real_runs_measured_is_solved_from_each_strategys_own_epoch_by_hand():
    free = ClusterCosts(COSTS.profiles, COSTS.step, 640, 32, 100_000, measured=MeasuredSteps(2))  # links free
    # local took 0.124 s for 20 steps: 6.2 ms a step, 1 ms more than the profiled 5.2 ms
    extra = solve("local", "step_extra_s", free, 0.124)
    assert extra == pytest.approx(0.001)
    steps = MeasuredSteps(2, step_extra_s=extra)
    # hfdt took 0.2 s for 10 steps of the slower rank's 11.4 ms: its allreduce added 8.6 ms a step
    ring = solve("hfdt", "ring_s", ClusterCosts(**{**vars(free), "measured": steps}), 0.2)
    assert ring == pytest.approx(0.020 - (COMPUTE[1] + 0.001))
    measured = ClusterCosts(**{**vars(free), "measured": MeasuredSteps(2, extra, ring, exchange_s=0.004)})
    assert predict("hfdt", measured).epoch_s == pytest.approx(0.2)  # and predicts it back
    cycles = [c + 0.001 + 0.004 for c in COMPUTE]  # every PS strategy's exchange is the one measured
    assert predict("asgd", measured).epoch_s == pytest.approx(640 / sum(32 / c for c in cycles) + cycles[1] / 2)
    assert solve("local", "step_extra_s", free, 0.05) == 0  # faster than profiled: nothing added
    assert measured.grown(4).measured == MeasuredSteps(4, extra)  # at another size: the link model's exchanges


def test_a_strategy_the_cell_cannot_run_is_refused_with_the_reason():
    adam = ClusterCosts(COSTS.profiles, COSTS.step, 640, 32, 100_000, optimizer="Adam")
    refused = predict("ddc-asgd", adam)
    assert refused.epoch_s is None and "the cell compiled Adam" in refused.refused
    assert predict("asgd", adam).refused is None  # keeps the cell's optimizer
    alone = ClusterCosts(COSTS.profiles[:1], COSTS.step, 640, 32, 100_000)
    assert predict("hfdt", alone).refused == "needs at least 2 engines; the cluster has 1"
    assert "fits" in predict("pipeline", COSTS).refused
    pipeline = ClusterCosts(COSTS.profiles, COSTS.step, 640, 32, 100_000, arrays=False)
    assert "tf.data" in predict("ashl", pipeline).refused


def test_the_plan_ranks_by_epoch_time_prefers_the_synchronous_strategy_on_a_tie_and_lists_refusals_last():
    equal = ClusterCosts((Profile(), Profile()), StepCost(0.0, 1e-4), samples=640, batch=32, model_bytes=1000)
    plan = make_plan(equal, [("local", {}), ("asgd", {}), ("hfdt", {}), ("pipeline", {})])
    assert [p.strategy for p in plan.ranked] == ["hfdt", "asgd", "local", "pipeline"]
    assert plan.choice_line().startswith("auto chose hfdt on 2 engine(s): predicted ")
    assert re.search(r"^ *- pipeline .* refused: not planned", plan.table(), re.M)


def test_time_to_target_is_the_short_runs_samples_at_the_predicted_speed_by_hand():
    plan = make_plan(COSTS, [("local", {}), ("hfdt", {})])
    plan.add_curves({"local": {"accuracy": [0.5, 0.7, 0.9], "samples": 160},
                     "hfdt": {"accuracy": [0.4, 0.6, 0.85], "samples": 160}}, target=0.8)
    local, hfdt = plan.predictions
    # local crosses 0.8 halfway between its 2nd and 3rd short epochs: 2.5 x 160 = 400 of 640 samples
    assert plan.time_to_target(local) == pytest.approx(400 / 640 * local.epoch_s)
    assert plan.time_to_target(hfdt) == pytest.approx((2 + 0.2 / 0.25) * 160 / 640 * hfdt.epoch_s)
    figure = plan_figure(plan)
    assert [trace.name for trace in figure.data] == [p.label for p in plan.ranked]
    assert list(figure.data[0].x) == pytest.approx([e * 160 / 640 * plan.ranked[0].epoch_s for e in (1, 2, 3)])


def test_grown_clusters_repeat_the_measured_speeds_and_show_where_a_strategy_stops_scaling():
    link = Profile(bandwidth_bps=10e9, latency_s=50e-6)
    plan = make_plan(ClusterCosts((Profile(1.0), Profile(0.25)), StepCost(1e-3, 3e-5), 60000, 64, 400_000,
                                  server=ServerCosts(message_s=1e-3)), [("hfdt", {}), ("asgd", {})])
    assert [p.speed for p in plan.costs.grown(5).profiles] == [1.0, 0.25, 1.0, 0.25, 1.0]
    rows = {r["label"]: r for r in scaling(plan, [4, 16, 64, 128], link)}
    assert rows["asgd"]["stops"] is not None and "PS" in rows["asgd"]["why"]  # 1 ms a push serialises them
    assert rows["hfdt"]["epoch_s"][0] > rows["hfdt"]["epoch_s"][1]  # synchronous still gains from 4 to 16


def test_past_the_cluster_a_count_whose_virtual_workers_miss_the_target_stops_the_scaling_and_says_why():
    plan = make_plan(ClusterCosts((Profile(1.0), Profile(1.0)), StepCost(1e-3, 0.0), 640, 32, 4000), [("asgd", {})])
    plan.add_curves({}, target=0.8)
    curves = {("asgd", 2): {"accuracy": [0.5, 0.85], "samples": 320, "staleness": 1.0},
              ("asgd", 8): {"accuracy": [0.4, 0.45], "samples": 320, "staleness": 7.0}}
    (row,) = scaling(plan, [2, 8], curves=curves)
    two = predict("asgd", plan.costs.grown(2), {})  # 0.8 lies 0.3/0.35 of the way from its 1st short epoch to its 2nd
    assert row["to_target"][0] == pytest.approx((1 + 0.3 / 0.35) * 320 / 640 * two.epoch_s)
    assert row["stops"] == 8 and row["why"] == ("staleness about 7 updates: its short run reaches 0.450, under the "
                                                 "target 0.800")


def test_virtual_workers_emulate_each_strategys_own_schedule_rule_and_learning_rate():
    from nbdist.planner.short_runs import emulation

    grown = COSTS.grown(4)  # speeds 1, 0.5, 1, 0.5
    plan = make_plan(COSTS, [("hfdt", {"warmup_epochs": 1.0}), ("ddc-asgd", {}), ("nfdt", {"max_staleness": 2})])
    hfdt, ddc, bounded = plan.predictions
    assert emulation(hfdt, grown, 160) == {  # warm-up in the short run's epochs: 1 of 640 samples = 4 of 160
        "workers": 4, "seconds": [COMPUTE[0] + 2 * ONE_WAY, COMPUTE[1] + 2 * ONE_WAY] * 2, "synchronous": True,
        "rule": None, "lr_scale": 4, "warmup_epochs": 4.0}
    emulated = emulation(ddc, grown, 160)
    assert emulated["rule"] == {"preset": "ddc-asgd", "workers": 4, "overrides": {}} and not emulated["synchronous"]
    with pytest.raises(Exception, match="--max-staleness is not emulated"):
        emulation(bounded, grown, 160)


def test_a_short_run_simulates_the_plans_cluster_and_trains_on_the_first_samples():
    from nbdist.host.hetero import parse_clock, parse_simulate
    from nbdist.keras_semantics.keras_bridge import FitRequest
    from nbdist.planner.short_runs import limit_request, simulate_text

    text = simulate_text(COSTS, 2)
    assert parse_simulate(text, 2) == list(COSTS.profiles)
    clock, step = parse_clock(text)
    assert clock == "virtual" and (step.fixed_s, step.per_sample_s) == pytest.approx((2e-3, 1e-4), rel=1e-9)
    x, y = np.arange(100.0).reshape(50, 2), np.arange(50)
    request = FitRequest(None, {"x": x, "y": y, "validation_data": (x, y), "epochs": 1, "initial_epoch": 0,
                                "sample_weight": None}, None)
    limit_request(request, 8, epochs=4, validation=5)
    assert request.args["x"].tolist() == x[:8].tolist() and request.args["y"].tolist() == list(range(8))
    assert [len(v) for v in request.args["validation_data"]] == [5, 5] and request.args["epochs"] == 4
    probe = FitRequest(None, {"x": x, "y": y, "validation_data": (x, y), "epochs": 1, "initial_epoch": 0,
                              "steps_per_epoch": 40}, None)
    limit_request(probe, 8, epochs=3, validation=0)  # the calibration's probe: no validation, the cut arrays
    assert probe.args["validation_data"] is None and probe.args["steps_per_epoch"] is None


def test_auto_trains_its_choice_on_the_engines_it_planned_with():
    from nbdist.planner.auto import chosen_options

    options = {"strategy": "auto", "simulate": "speed=1,0.5; clock=virtual", "workers": None, "targets": None}
    chosen, dropped = chosen_options(make_plan(COSTS, [("hfdt", {})]), options)
    assert (chosen["strategy"], chosen["workers"], dropped) == ("hfdt", 2, [])  # not every idle engine
    # local (0.104 s an epoch against hfdt's 0.204): one engine, simulated as the first worker
    chosen, _ = chosen_options(make_plan(COSTS, [("local", {}), ("hfdt", {})]), options)
    assert (chosen["strategy"], chosen["workers"], chosen["simulate"]) == ("local", 1, "speed=1; clock=virtual")


def test_a_curve_that_ends_under_the_target_reaches_it_on_its_trend_within_the_cells_training_by_hand():
    # accuracy 0.5 + 0.1 log2(x): 0.8 at x = 8 short-run epochs
    assert trend_crossing([1, 2, 4], [0.5, 0.6, 0.7], 0.8, limit=10) == pytest.approx(8)
    assert trend_crossing([1, 2, 4], [0.5, 0.6, 0.7], 0.8, limit=6) is None  # past the cell's own training
    assert trend_crossing([1, 2, 3], [0.7, 0.6, 0.5], 0.8, limit=100) is None  # falling: never
    assert trend_crossing([1, 2, 3], [0.3, 0.3, 0.3 + 1e-9], 0.8, limit=100) is None  # all but flat: never
    four_epochs = ClusterCosts(COSTS.profiles, COSTS.step, 640, 32, 100_000, epochs=4)
    plan = make_plan(four_epochs, [("local", {}), ("hfdt", {})])
    plan.add_curves({"local": {"accuracy": [0.7, 0.81], "samples": 640},
                     "hfdt": {"accuracy": [0.6, 0.7], "samples": 160}}, target=0.8)
    hfdt = next(p for p in plan.predictions if p.strategy == "hfdt")
    # 0.6 + 0.1 log2(x) reaches 0.8 at x = 4 short-run epochs of 160 samples: 640, one of the cell's epochs
    assert plan.extrapolated(hfdt) and plan.time_to_target(hfdt) == pytest.approx(hfdt.epoch_s)
    assert [p.strategy for p in plan.ranked] == ["local", "hfdt"]  # seen to reach it, before reaching it on a trend
    assert "~" in plan.table().splitlines()[2]


def test_several_seeds_give_the_mean_curve_and_each_seeds_time_to_target_by_hand():
    from nbdist.planner.short_runs import combined

    runs = [{"accuracy": [0.7, 0.8], "samples": 640, "metric": "val_accuracy"},
            {"accuracy": [0.75, 0.9, 0.95], "samples": 640, "metric": "val_accuracy"}]
    both = combined(runs)  # the epochs both seeds have
    assert both["accuracy"] == pytest.approx([0.725, 0.85]) and both["runs"] == [[0.7, 0.8], [0.75, 0.9]]
    assert (both["samples"], both["metric"]) == (640, "val_accuracy")
    assert combined([*runs, {"error": "ValueError: x"}]) == {"error": "ValueError: x"}
    plan = make_plan(ClusterCosts(COSTS.profiles, COSTS.step, 640, 32, 100_000), [("local", {})])
    plan.add_curves({"local": combined(runs)}, target=0.8)
    local = plan.predictions[0]
    # the mean crosses 0.8 at 1 + 0.075/0.125 = 1.6 epochs; seed 1 at 1 + 0.05/0.15, seed 0 at its second epoch
    assert plan.time_to_target(local) == pytest.approx(1.6 * local.epoch_s)
    assert plan.seeds_range(local) == pytest.approx([4 / 3 * local.epoch_s, 2 * local.epoch_s])
    assert f"{1.6 * local.epoch_s:.3f} ({4 / 3 * local.epoch_s:.3g}-{2 * local.epoch_s:.3g})" in plan.table()
    assert "2 seeds" in plan.table() and "the target is the one given" in plan.table()


def test_the_plans_own_options_are_refused_without_strategy_auto():
    from nbdist.errors import OptionError
    from nbdist.notebook.session import Session

    with pytest.raises(OptionError, match="--target-accuracy, --plan-seeds: options of --strategy auto"):
        Session()._strategy_for("model.fit(x, y)", {"strategy": "hfdt", "target_accuracy": 0.9, "plan_seeds": 3})


def test_kendall_tau_by_hand():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1
    assert kendall_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)
    never = float("inf")  # two that never reach the target, in both orderings: agreement
    assert kendall_tau([1, 2, never, never], [5, 6, never, never]) == 1


@pytest.mark.cluster
def test_plan_only_measures_the_engines_lists_refusals_and_trains_nothing(kernel):
    adam = TRAIN.format(epochs=1).replace("keras.optimizers.SGD(0.05, momentum=0.9)", '"adam"')
    kernel.run("model = None").check()
    reply = kernel.run("%%distribute --strategy auto --plan-only --target-accuracy 0.5\n" + adam, timeout=180).check()
    assert re.search(r"to 0\.500 s", reply.stdout) and "the target is the one given" in reply.stdout
    assert re.search(r"^ *- ddc-asgd .* refused: an SGD rule: the cell compiled Adam", reply.stdout, re.M), reply.stdout
    assert re.search(r"^ *1 \S+ ", reply.stdout, re.M)  # a first choice, with its predicted epoch time
    for measured in ("Horovod's allreduce of the model's gradients: [0-9.]+ ms a step, measured by a short real "
                     "run of hfdt", "nbdist's wire, the PS's service included: [0-9.]+ ms a step, measured by a "
                     "short real run of nfdt"):  # the local cluster's own exchanges, in place
        assert re.search(measured, reply.stdout), reply.stdout
    assert kernel.value("model is None") is True  # the cell did not run here: nothing trained, nothing installed
    scaled_out = kernel.run("%dist plan --workers 8", timeout=240).check().stdout
    assert "stops scaling at" in scaled_out and "hfdt" in scaled_out
    # the accuracy at 8 workers: a short run of that many virtual workers on one engine
    assert "predicted s to accuracy 0.500" in scaled_out, scaled_out
    assert re.search(r"^nfdt +(~?[0-9.]+|never)  0\.\d{3}$", scaled_out, re.M), scaled_out
    assert kernel.value("model is None") is True
    session = "nbdist.get_session()"
    kernel.run(f"_cluster, {session}.cluster = {session}.cluster, None").check()
    try:  # with no cluster, the accuracy part says what to do, and --no-accuracy gives the epoch times at once
        refused = kernel.run("%dist plan --workers 4", timeout=30)
        assert refused.ename == "OptionError", refused.error_text
        assert "--no-accuracy for the epoch times" in refused.evalue
        assert "stops scaling at" in kernel.run("%dist plan --workers 4 --no-accuracy", timeout=30).check().stdout
    finally:
        kernel.run(f"{session}.cluster = _cluster").check()


@pytest.mark.cluster
def test_strategy_auto_on_two_engines_trains_and_names_its_choice(kernel):
    cell = "%%distribute --strategy auto --seed 3 --simulate 'speed=1,0.25; clock=virtual; step=2ms'\n"
    reply = kernel.run(cell + TRAIN.format(epochs=2), timeout=300).check()
    chosen = re.search(r"auto chose (\S+?)(?::\S+)? on (\d) engine", reply.stdout)
    assert chosen, reply.stdout
    run = kernel.value("{'strategy': nbdist.last_run.strategy, 'status': nbdist.last_run.status, "
                       "'epochs': len(history.history['loss'])}")
    assert run == {"strategy": chosen.group(1), "status": "done", "epochs": 2}  # the cell's own epochs, all data
    assert re.search(r"the plan predicted [0-9.]+ s an epoch for \S+; it took [0-9.]+ s", reply.stdout)
    first = re.search(r"^ *1 (\S+) ", reply.stdout, re.M).group(1)  # the table's first row is what it chose
    assert first.split(":")[0] == chosen.group(1)
    assert re.search(r"to 0\.\d{3} s", reply.stdout)  # the accuracy part: a target from the short local run


def test_the_profile_reads_an_epochs_samples_and_batch_from_arrays_pipelines_and_py_datasets_and_cuts_them():
    import keras
    import tensorflow as tf

    from nbdist.errors import OptionError
    from nbdist.strategies.profile import epoch_of

    x, y = np.zeros((100, 3), "float32"), np.zeros(100)
    assert epoch_of(x, 16) == (100, 16) and epoch_of(x, None) == (100, 32)  # Keras' default batch
    assert epoch_of(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), None) == (128, 64)  # 2 batches of 64

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return x[:20], y[:20]

    assert epoch_of(Batches(), None) == (100, 20)
    with pytest.raises(OptionError, match="this cell fits a generator"):
        epoch_of((b for b in [x]), None)

    from nbdist.keras_semantics.keras_bridge import FitRequest
    from nbdist.planner.short_runs import limit_request

    short = FitRequest(None, {"x": Batches(), "y": None, "epochs": 1, "initial_epoch": 0, "steps_per_epoch": 5}, None)
    limit_request(short, 45, epochs=4, whole=45)  # a short run of 45 samples: the first 3 batches of 20
    assert len(short.args["x"]) == 3 and short.args["steps_per_epoch"] is None and short.args["epochs"] == 4
    assert short.args["x"][2][0].shape == (20, 3)


def test_several_measured_seeds_are_compared_on_their_mean_curve_by_hand():
    from nbdist.experiments.plan_check import mean_result

    one = {"label": "hfdt", "curve": {"t": [1.0, 2.0, 3.0], "val_accuracy": [0.5, 0.7, 0.8]}, "error": None}
    two = {"label": "hfdt", "curve": {"t": [1.2, 2.2], "val_accuracy": [0.6, 0.8]}, "error": "diverged"}
    mean = mean_result([one, two])
    assert mean["curve"]["t"] == pytest.approx([1.1, 2.1])
    assert mean["curve"]["val_accuracy"] == pytest.approx([0.55, 0.75])
    assert mean["error"] == "diverged" and mean["seeds"] == [one, two] and mean_result([one]) is one
