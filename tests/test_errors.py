"""Every way a run can go wrong, through a real kernel and a real cluster: clear, fast, nothing hangs."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.conftest import TRAIN
from tests.support import new_engine, own_cluster

pytestmark = pytest.mark.cluster
cluster = own_cluster(engines=2)  # its tests interrupt and kill engines

LONG_TRAIN = TRAIN.format(epochs=200)


def assert_one_line(reply, ename):
    assert reply.status == "error", reply.stdout
    assert reply.ename == ename, reply.error_text
    assert not any("Traceback" in line for line in reply.traceback), reply.error_text


def test_unknown_strategy_prints_usage(kernel):
    reply = kernel.run("%%distribute --strategy warp-drive\n" + TRAIN.format(epochs=1))
    assert_one_line(reply, "UsageError")
    assert "invalid choice: 'warp-drive'" in reply.evalue and "local" in reply.evalue


def test_unknown_option_prints_usage(kernel):
    reply = kernel.run("%%distribute --wrokers 2\n" + TRAIN.format(epochs=1))
    assert_one_line(reply, "UsageError")
    assert "--wrokers" in reply.evalue and "Did you mean --workers?" in reply.evalue


def test_a_fit_argument_the_strategy_cannot_honour_is_refused_by_name(kernel):
    reply = kernel.run("%%distribute --strategy ashl --workers 2\n"
                       + TRAIN.format(epochs=1).replace("epochs=1", "epochs=1, steps_per_epoch=3"), timeout=180)
    assert_one_line(reply, "OptionError")
    assert "steps_per_epoch=3" in reply.evalue and "Remove it" in reply.evalue and "engine " in reply.evalue


def test_local_refuses_two_workers(kernel):
    reply = kernel.run("%%distribute --strategy local --workers 2\n" + TRAIN.format(epochs=1))
    assert_one_line(reply, "OptionError")
    assert "at most 1" in reply.evalue


def test_cell_without_fit_says_so(kernel):
    reply = kernel.run("%%distribute\nmodel = build()\n", timeout=120)
    assert_one_line(reply, "NoFitCall")
    assert "without calling model.fit" in reply.evalue


def test_user_exception_names_engine_with_remote_traceback(kernel):
    code = "%%distribute --targets 1\nmodel = build()\nratio = len(x) / (len(x) - 2000)\n" + TRAIN.format(epochs=1)
    reply = kernel.run(code, timeout=60)
    assert reply.status == "error" and reply.ename == "EngineFailure", reply.error_text
    assert "ZeroDivisionError" in reply.evalue and "engine 1 (host " in reply.evalue
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(reply.traceback))
    print(text)
    assert "Remote traceback" in text and "ratio = len(x) / (len(x) - 2000)" in text
    assert kernel.value("nbdist.last_run.status") == "failed"


def test_definition_failing_on_engine_names_engine_and_reason(kernel, tmp_path):
    # A package that exists in the notebook's environment but not on the engines.
    (tmp_path / "only_in_notebook.py").write_text("VALUE = 1\n")
    kernel.run(f"import sys; sys.path.insert(0, {str(tmp_path)!r})").check()
    kernel.run("%%distribute define --name extra\nimport only_in_notebook").check()
    reply = kernel.run("%%distribute\n" + TRAIN.format(epochs=1), timeout=120)
    assert reply.status == "error" and reply.ename == "DefinitionFailed", reply.error_text
    assert "engine 0 (host " in reply.evalue and "No module named 'only_in_notebook'" in reply.evalue
    # Repaired definition: the next run goes through.
    kernel.run("%%distribute define --name extra\nVALUE = 1").check()
    kernel.run("%%distribute\n" + TRAIN.format(epochs=1), timeout=180).check()


def test_kernel_interrupt_stops_every_engine_and_cluster_serves_next_cell(kernel):
    msg_id = kernel.submit("%%distribute\n" + LONG_TRAIN)
    kernel.collect(msg_id, timeout=120, until_output="step")  # training is under way on the engine
    kernel.km.interrupt_kernel()
    reply = kernel.collect(msg_id, timeout=120)
    assert_one_line(reply, "RunInterrupted")
    assert "stopped on engine(s) [0]" in reply.evalue
    status = kernel.run("%dist status").check().stdout
    rows = [line.split() for line in status.splitlines()[2:]]
    assert rows and all(row[-1] == "idle" for row in rows), status
    kernel.run("%%distribute\n" + TRAIN.format(epochs=1), timeout=180).check()


def test_engine_killed_during_run_fails_naming_it(kernel, cluster):
    victim, pid = new_engine(cluster)

    msg_id = kernel.submit(f"%%distribute --targets {victim}\n" + LONG_TRAIN)
    kernel.collect(msg_id, timeout=120, until_output="step")
    os.kill(pid, signal.SIGKILL)
    reply = kernel.collect(msg_id, timeout=120)
    assert reply.status == "error" and reply.ename == "EngineDied", reply.error_text
    assert f"engine {victim} (host " in reply.evalue and f"pid {pid}" in reply.evalue
    assert "dead" in kernel.run("%dist status").check().stdout
