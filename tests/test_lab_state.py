"""The sidebar's state snapshot and the Session's change notices, without a cluster."""

from __future__ import annotations

import json
import math

from nbdist.notebook import lab_state
from nbdist.notebook.run import Run
from nbdist.notebook.session import Session
from nbdist.engine.telemetry import make_record


def running_run() -> Run:
    run = Run(strategy="nfdt", options={}, workers=[3, 5], cell="model.fit(x, y)", cell_id="cell-7",
              status="running", started_at=100.0)
    run.hosts = {3: {"host": "a", "gpus": []}, 5: {"host": "b", "gpus": ["GPU:0"]}}
    for eid, loss in ((3, 0.5), (5, math.nan)):
        run.progress[eid] = {"record": make_record(run=run.id, worker=run.workers.index(eid), t=101.0, loss=loss,
                                                   epoch=1, step=15),
                             "epochs": 4, "steps": 10, "batch": 5}
    run.events.append({"t": 103.5, "event": "worker_died", "engine": 5, "rank": 1, "host": "b", "after_s": 3.5})
    return run


def test_snapshot_of_a_session_without_a_cluster_is_json():
    session = Session()
    session.record_definition("import keras\nx = 1\n", name="data")
    session.runs.append(running_run())
    state = lab_state.stamp(lab_state.snapshot(session))
    json.dumps(state, allow_nan=False)  # what Jupyter's message serialiser demands
    assert state["type"] == "state" and state["schema"] == lab_state.SCHEMA_VERSION
    assert state["cluster"] is None
    assert "nfdt" in state["strategies"] and "local" in state["strategies"]
    assert state["definitions"] == [{"key": "data", "index": 1, "digest": session.definitions["data"].digest,
                                     "first_line": "import keras", "lines": 2}]
    run = state["runs"][0]
    assert run["progress"] == 0.375  # rank 0: epoch 1 of 4, batch 5 of 10
    assert run["cell_id"] == "cell-7" and run["stoppable"] is True
    assert [n["host"] for n in run["nodes"]] == ["a", "b"]
    assert run["nodes"][0]["record"]["loss"] == 0.5 and run["nodes"][0]["losses"] == [0.5]
    assert run["nodes"][1]["record"]["loss"] is None  # NaN does not reach the front end
    assert run["events"] == [f"worker rank 1 (engine 5, host b) died 3.5 s into run {run['id']}"]


def test_sparklines_keep_each_new_record_once():
    lines = lab_state.Sparklines(points=3)
    for t, loss in ((1, 4.0), (1, 9.0), (2, 3.0), (3, None), (4, 2.0), (5, 1.0)):
        lines.add(1, 0, {"t": t, "loss": loss})
    assert lines.get(1, 0) == [3.0, 2.0, 1.0]
    assert lines.get(1, 1) == []


def test_session_tells_listeners_what_changed():
    session = Session()
    heard = []
    session.listeners.append(heard.append)
    session.record_definition("x = 1", name="a")
    assert session.stop() == "no cluster to stop"
    assert heard == ["definitions"]


def test_the_sidebar_offers_every_strategy_before_a_kernel_says_which():
    import re
    from pathlib import Path

    from nbdist.strategies import REGISTRY
    from tests.support import script

    source = (Path(__file__).resolve().parent.parent / "labextension" / "src" / "strategies.ts").read_text()
    listed = re.search(r"DEFAULT_STRATEGIES = \[(.*?)\]", source, re.S).group(1)
    assert sorted(re.findall(r"'([\w-]+)'", listed)) == sorted(REGISTRY)
    assert source == script("options_reference").strategies_module(), (
        "run python scripts/options_reference.py --strategies labextension/src/strategies.ts")
