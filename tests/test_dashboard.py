"""The dashboard through a real kernel and a real run: figures fill, controls act and are acknowledged."""

from __future__ import annotations

import time

import pytest

from nbdist.ps.push_log import LOG_FIELDS
from tests.support import SGD_CELL, eventually, idle_engines, own_cluster, scaled

pytestmark = pytest.mark.cluster
cluster = own_cluster(engines=2)  # its tests evict a worker and stop runs

LONG = SGD_CELL.format(lr=0.05, batch=32, epochs=200, steps="None", shuffle=True)


def test_background_run_with_dashboard_obeys_every_control(kernel, cluster):
    idle_engines(cluster, 2)
    kernel.run("%%distribute --strategy nfdt --workers 2 --background --progress dashboard\n" + LONG,
               timeout=120).check()
    kernel.run("run = nbdist.last_run; d = run.display").check()
    # nfdt's four panels (loss, throughput, staleness and its distribution), a trace per node in each,
    # and the loss and staleness traces of both nodes fill up
    assert kernel.value("len(d.figure.data)") == 4 * 2 + 2  # a trace per node and panel, global and validation
    eventually(kernel, "all(len(d.trace(p, k).y or ()) > 0 for p in ('loss', 'staleness') for k in (0, 1))")

    kernel.run("d.pause_button.click()").check()
    assert "pause</b> acknowledged by 1 shard" in kernel.value("d.ack.value")
    frozen = kernel.value("run.control('pause')[0]['version']")
    # both workers' next requests reach the shard and are held there: from now on only the pause stops them
    eventually(kernel, "run.control('pause')[0]['held'] >= 2")
    assert kernel.value("run.control('pause')[0]['version']") == frozen
    kernel.run("d.resume_button.click()").check()
    eventually(kernel, f"run.control('resume')[0]['version'] > {frozen}")

    kernel.run("d.lr.value = 0.5; d.lr_button.click(); lr_at = run.control('resume')[0]['version']").check()
    kernel.run("d.evict_choice.value = 1; d.evict_button.click()").check()
    assert kernel.value("run.control('resume')[0]['evicted']") == [1]
    # pushes at the new rate must reach the log before the stop, however fast the stop would come
    eventually(kernel, "run.control('resume')[0]['version'] > lr_at + 3")
    kernel.run("d.stop_button.click()").check()
    kernel.run("%dist wait", timeout=120).check()

    result = kernel.value(
        "{'status': run.status, 'epochs': len(history.history['loss']), 'weights': len(model.get_weights()), "
        "'same': all((a == b).all() for a, b in zip(model.get_weights(), run.weights)), "
        f"'lrs': sorted({{round(e[{LOG_FIELDS.index('lr')}], 6) for e in run.ps[0]['log'] if e[3] > lr_at + 1}}), "
        "'evicted_pushes_after': run.ps[0]['workers']['1']['pushed'], 'events': [e['event'] for e in run.events], "
        "'static': len(d.static.data), 'header': d.header.value, "
        "'applied_at': [r['t'] for r in run.push_records if r['applied']], 'controls': [(e['event'], e['t']) for e in run.ps[0]['events'] "
        "if e['event'] in ('control:pause', 'control:resume')]}")
    assert result["status"] == "done" and 0 < result["epochs"] < 200  # stopped early, History closed
    assert result["weights"] > 0 and result["same"]
    assert result["lrs"] == [0.025]  # 0.05 x the dashboard's 0.5
    assert {"control:pause", "control:resume", "control:lr_scale", "control:evict", "control:stop"} <= set(
        result["events"])
    assert result["static"] == 10  # the final state as a static figure, every trace of the live one
    assert f"stopped at epoch {result['epochs']} of 200" in result["header"] and "ETA" not in result["header"]
    # the shard's own log: no push was applied between the pause and the resume that followed it
    paused_at = next(t for event, t in result["controls"] if event == "control:pause")
    resumed_at = next(t for event, t in result["controls"] if event == "control:resume" and t > paused_at)
    assert not [t for t in result["applied_at"] if paused_at < t < resumed_at], (paused_at, resumed_at)
    assert any(t < paused_at for t in result["applied_at"]) and any(t > resumed_at for t in result["applied_at"])


def test_controls_on_a_finished_run_say_why_not(kernel):
    reply = kernel.run("nbdist.last_run.control('pause')")
    assert reply.ename == "OptionError" and "only a running run takes controls" in reply.evalue


def test_buttons_clicked_by_the_front_end_act_while_the_cell_blocks(kernel, cluster):
    """The test plays the front end: it sends the widget 'click' messages a browser sends, mid-cell."""
    idle_engines(cluster, 2)
    kc = kernel.kc
    msg_id = kernel.submit("%%distribute --strategy nfdt --workers 2 --progress dashboard\n" + LONG)
    buttons, acks, mimetypes, headers = {}, [], set(), []
    deadline = time.time() + scaled(180)

    def read_until(done):
        while time.time() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:  # queue.Empty: keep waiting, bounded by the deadline
                continue
            kind, content = msg["msg_type"], msg["content"]
            # updates a click causes answer the click's message, not the cell: take comm_msg from any parent
            if msg["parent_header"].get("msg_id") != msg_id and kind != "comm_msg":
                continue
            if kind == "comm_open":
                state = content["data"].get("state", {})
                if state.get("_model_name") == "ButtonModel":
                    buttons[state.get("description")] = content["comm_id"]
            elif kind == "comm_msg":
                value = (content["data"].get("state") or {}).get("value")
                if isinstance(value, str) and "acknowledged" in value:
                    acks.append(value)
                elif isinstance(value, str) and value.startswith("<b>run "):
                    headers.append(value)
            elif kind in ("display_data", "update_display_data"):  # the static figure replaces the widget's
                mimetypes.update(content["data"])
            elif kind == "status" and content["execution_state"] == "idle":
                return "idle"
            if done():
                return "done"
        raise AssertionError(f"the dashboard did not answer in time: buttons {sorted(buttons)}, "
                             f"last headers {headers[-2:]}, acks {acks}")

    def click(description):
        kc.shell_channel.send(kc.session.msg("comm_msg", {
            "comm_id": buttons[description], "data": {"method": "custom", "content": {"event": "click"}}}))

    assert read_until(lambda: "Pause" in buttons and "Stop" in buttons) == "done"
    assert read_until(lambda: bool(headers) and not headers[-1].endswith(" 0%")) == "done"  # training under way
    click("Pause")
    assert read_until(lambda: any("pause</b> acknowledged" in a for a in acks)) == "done"
    click("Resume")
    assert read_until(lambda: any("resume</b> acknowledged" in a for a in acks)) == "done"
    click("Stop")
    assert read_until(lambda: False) == "idle"  # the graceful stop ended the cell
    reply = kc.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "ok"
    assert "application/vnd.plotly.v1+json" in mimetypes  # the static final figure, kept by a saved notebook
    assert kernel.value("len(history.history['loss']) < 200 and nbdist.last_run.status == 'done'")
