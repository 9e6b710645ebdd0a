"""Magic parsing, help and definition recording in a real InteractiveShell (no cluster needed)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

import nbdist
from nbdist.errors import ClusterError, OptionError


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbdist")
    yield shell
    shell.run_line_magic("unload_ext", "nbdist")


@pytest.fixture
def session(ip):
    session = nbdist.get_session(ip)
    session.definitions.clear()
    return session


def test_help_lists_every_option(ip):
    dist_help = ip.find_line_magic("dist").__doc__
    for flag in ("-n N", "--engines", "--profile", "--cluster-id", "--file", "start,add,connect,stop,status,runs"):
        assert flag in dist_help
    distribute_help = ip.find_cell_magic("distribute").__doc__
    for flag in ("--strategy", "--workers", "--targets", "--seed", "define", "--name", "local"):
        assert flag in distribute_help


def test_unknown_dist_action_and_misplaced_flags(ip):
    with pytest.raises(UsageError, match="invalid choice: 'frobnicate'"):
        ip.run_line_magic("dist", "frobnicate")
    with pytest.raises(UsageError, match="-n does not apply to %dist status"):
        ip.run_line_magic("dist", "status -n 3")
    with pytest.raises(UsageError, match="unknown option --engine for %dist. Did you mean --engines?"):
        ip.run_line_magic("dist", "start --engine mpi")
    with pytest.raises(UsageError, match="positive number of engines"):
        ip.run_line_magic("dist", "start -n 0")


def test_dist_refuses_bad_threads_saying_what_to_give(ip):
    with pytest.raises(UsageError, match=r"--threads takes a number of threads per engine \(1 or more\), `auto`"):
        ip.run_line_magic("dist", "start -n 2 --threads 0")
    with pytest.raises(UsageError, match="Received: --threads many"):
        ip.run_line_magic("dist", "connect --cluster-id x --threads many")
    with pytest.raises(UsageError, match="--threads does not apply to %dist status"):
        ip.run_line_magic("dist", "status --threads 2")
    assert "--threads N" in ip.find_line_magic("dist").__doc__


def test_no_cluster_says_how_to_start_one(ip, session):
    with pytest.raises(ClusterError, match="%dist start -n 2"):
        ip.run_line_magic("dist", "status")
    with pytest.raises(ClusterError, match="%dist start"):
        ip.run_cell_magic("distribute", "", "model.fit(x, y)")


def test_empty_training_cell_is_refused(ip, session):
    with pytest.raises(OptionError, match="needs a training cell"):
        ip.run_cell_magic("distribute", "--seed 1", "   \n")


def test_define_runs_here_and_records(ip, session):
    ip.run_cell_magic("distribute", "define", "defined_here = 41 + 1")
    assert ip.user_ns["defined_here"] == 42
    assert [d.source for d in session.definitions.values()] == ["defined_here = 41 + 1"]


def test_failing_define_is_not_recorded(ip, session):
    with pytest.raises(UsageError, match="not recorded"):
        ip.run_cell_magic("distribute", "define", "1 / 0")
    assert not session.definitions


def test_redefinition_replaces_in_place_by_name_or_cell_id(ip, session):
    ip.run_cell_magic("distribute", "define --name data", "a = 1")
    ip.run_cell_magic("distribute", "define --name model", "b = 1")
    ip.run_cell_magic("distribute", "define --name data", "a = 2")
    assert [(d.key, d.index, d.source) for d in session.definitions.values()] == [
        ("data", 1, "a = 2"), ("model", 2, "b = 1")]
    session.current_cell_id = "cell-xyz"  # what a notebook front end sends with each cell
    ip.run_cell_magic("distribute", "define", "c = 1")
    session.current_cell_id = "cell-xyz"
    ip.run_cell_magic("distribute", "define", "c = 2")
    assert session.definitions["cell-xyz"].source == "c = 2" and session.definitions["cell-xyz"].index == 3


def test_define_refuses_training_options(ip, session):
    with pytest.raises(UsageError, match="--seed applies to training cells"):
        ip.run_cell_magic("distribute", "define --seed 3", "z = 1")


def test_targets_must_be_numbers(ip, session):
    from nbdist.notebook.session import _parse_targets

    assert _parse_targets("0, 2") == [0, 2]
    with pytest.raises(OptionError, match="Received: --targets a,b"):
        _parse_targets("a,b")
