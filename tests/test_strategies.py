"""The Strategy contract's controller half: engine choice and option checks, without a cluster."""

from __future__ import annotations

import pytest

from nbdist import strategies
from nbdist.errors import ClusterError, OptionError
from nbdist.strategies import Option, Strategy


class Pair(Strategy):
    name = "pair"
    min_workers = 2
    reads = (Option("--zeta", "test", type=float),)


@pytest.fixture
def with_pair():
    strategies.register(Pair)
    try:
        yield
    finally:
        strategies.unregister("pair")


def test_local_picks_the_lowest_idle_engine():
    local = strategies.make_strategy({"strategy": "local"})
    assert local.choose_workers([1, 3], None, None) == [1]


def test_targets_must_be_idle_and_alive():
    local = strategies.make_strategy({"strategy": "local"})
    assert local.choose_workers([0, 1], None, [1]) == [1]
    with pytest.raises(ClusterError, match=r"engine\(s\) \[5\].*idle engines: \[0, 1\]"):
        local.choose_workers([0, 1], None, [5])


def test_local_refuses_more_than_one_engine():
    with pytest.raises(OptionError, match="at most 1 engine"):
        strategies.make_strategy({"strategy": "local"}).choose_workers([0, 1], 2, None)


def test_too_few_idle_engines_says_how_to_get_more(with_pair):
    with pytest.raises(ClusterError, match="--workers 4 needs 4 idle engines but 2 are idle.*%dist start -n 4"):
        strategies.make_strategy({"strategy": "pair"}).choose_workers([0, 1], 4, None)


def test_multi_worker_default_takes_every_idle_engine(with_pair):
    assert strategies.make_strategy({"strategy": "pair"}).choose_workers([0, 2, 3], None, None) == [0, 2, 3]
    with pytest.raises(OptionError, match="at least 2"):
        strategies.make_strategy({"strategy": "pair"}).choose_workers([0], None, None)


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(OptionError, match="Unknown strategy 'nope'. Choose one of: .*local"):
        strategies.make_strategy({"strategy": "nope"})


def test_option_of_another_strategy_is_refused_by_name(with_pair):
    with pytest.raises(OptionError, match="--zeta applies to pair, not to --strategy local"):
        strategies.make_strategy({"strategy": "local", "zeta": 0.1})
    assert strategies.make_strategy({"strategy": "pair", "zeta": 0.1}).values["zeta"] == 0.1


def test_workers_and_targets_together_are_refused():
    with pytest.raises(OptionError, match="--workers or --targets, not both"):
        strategies.make_strategy({"strategy": "local"}).choose_workers([0, 1], 1, [1])
