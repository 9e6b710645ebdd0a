"""Adding a strategy is one module: a test-only strategy, registered from here, appears in the magic's
help, in README's generated options table and with its own panels in the dashboard."""

from __future__ import annotations

import pytest

from nbdist import strategies
from nbdist.notebook.run import Run
from nbdist.strategies import Option, Reports, Strategy
from nbdist.strategies.local import LocalWorker


class EchoStrategy(Strategy):
    """A test-only strategy: one engine, Keras' own fit, one option of its own."""

    name = "echo-test"
    summary = "a strategy that exists only in this test"
    reads = (Option("--echo-level", "how loud the test strategy is", type=int, default=1, minimum=0),)
    reports = Reports(panels=("loss",), controls=("stop",))
    worker_class = LocalWorker
    max_workers = 1


@pytest.fixture
def echo():
    strategies.register(EchoStrategy)
    try:
        yield EchoStrategy
    finally:
        strategies.unregister(EchoStrategy.name)


def test_it_is_in_the_magics_help_and_parser(echo):
    from nbdist.magics import NbdistMagics, distribute_parser

    assert "--echo-level" in NbdistMagics.distribute.__doc__ and "echo-test" in NbdistMagics.distribute.__doc__
    args = distribute_parser().parse_args(["--strategy", "echo-test", "--echo-level", "3"])
    assert strategies.make_strategy(vars(args)).value("echo_level") == 3
    with pytest.raises(strategies.OptionError, match="--echo-level takes a number of at least 0"):
        strategies.make_strategy({"strategy": "echo-test", "echo_level": -1})
    with pytest.raises(strategies.OptionError, match="--echo-level applies to echo-test, not to --strategy local"):
        strategies.make_strategy({"strategy": "local", "echo_level": 2})


def test_it_is_in_the_generated_options_table(echo):
    from tests.support import script

    options_reference = script("options_reference")

    row = next(line for line in options_reference.markdown().splitlines() if line.startswith("| `--echo-level"))
    assert row.endswith("| echo-test |") and "how loud" in row
    assert "'echo-test'" in options_reference.strategies_module()


def test_the_dashboard_shows_its_panels_and_its_controls_only(echo):
    from nbdist.notebook.widgets.dashboard import Dashboard

    run = Run(strategy="echo-test", options={}, workers=[0], cell="")
    dashboard = Dashboard(run, display=lambda box: None)
    assert [p.name for p in dashboard.panels] == ["loss"]
    assert len(dashboard.figure.data) == 1 + 2  # worker 0, and the global and validation loss
    assert dashboard.stop_button.disabled is False and dashboard.pause_button.disabled is True
    assert dashboard.figure.layout.xaxis.title.text == "s since start"
