"""Status tables and metric records."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from nbdist.notebook import report
from nbdist.engine import telemetry
from nbdist.cluster.cluster import EngineInfo
from nbdist.engine.reporter import ProgressReporter


def test_engine_table_has_one_row_per_engine_with_state():
    rows = [(EngineInfo(0, "h1", 11, None, 2, [], "2.21.0", "3.15.1", "0.28.1"), "idle"),
            (EngineInfo(1, "h2", 12, None, 8, ["/GPU:0", "/GPU:1"], "2.21.0", "3.15.1", None), "dead")]
    lines = report.engine_table(rows).splitlines()
    assert lines[0].split() == ["id", "host", "pid", "cpus", "gpus", "tensorflow", "keras", "horovod", "threads",
                                "state"]
    assert lines[2].split() == ["0", "h1", "11", "2", "0", "2.21.0", "3.15.1", "0.28.1", "-", "idle"]
    assert lines[3].split() == ["1", "h2", "12", "8", "2", "2.21.0", "3.15.1", "-", "-", "dead"]


def test_engine_table_shows_threads_and_says_why_they_were_not_applied():
    rows = [(EngineInfo(0, "h1", 11, threads="1/1", threads_how="environment"), "idle"),
            (EngineInfo(1, "h1", 12, threads="default", threads_how="not applied: Intra op parallelism cannot be "
                                                                    "modified after initialization."), "idle")]
    lines = report.engine_table(rows).splitlines()
    assert [line.split()[-2:] for line in lines[2:4]] == [["1/1", "idle"], ["default", "idle"]]
    assert lines[4] == ("engine 1: threads not applied: Intra op parallelism cannot be modified after "
                        "initialization. (TensorFlow started there before nbdist could set them)")


def test_make_record_fills_the_schema_and_refuses_strangers():
    record = telemetry.make_record(run=1, worker=0, loss=0.5)
    assert list(record) == list(telemetry.RECORD_FIELDS) and record["staleness"] is None
    assert telemetry.make_record(version=3)["version"] == 3
    with pytest.raises(ValueError, match="lossy"):
        telemetry.make_record(lossy=1)


def test_reporter_records_epochs_samples_and_publishes():
    published = []
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    reporter = ProgressReporter(run_id=7, worker=0, batch_size=10, publish=published.append,
                                        interval_s=3600)
    x, y = np.zeros((50, 4), "float32"), np.zeros(50, "int64")
    model.fit(x, y, batch_size=10, epochs=2, verbose=0, callbacks=[reporter])
    assert [r["epoch"] for r in reporter.records] == [0, 1]  # long interval: one record per epoch end
    assert [r["step"] for r in reporter.records] == [5, 10]
    assert [r["samples"] for r in reporter.records] == [50, 100]
    assert reporter.records[-1]["lr"] == pytest.approx(0.1)
    assert published[-1]["epochs"] == 2 and published[-1]["steps"] == 5 and published[-1]["epoch_end"]
    assert reporter.first_step_t is not None


def test_worker_table_summarises_each_rank():
    from nbdist.keras_semantics.keras_bridge import FitResult
    from nbdist.notebook.report import worker_table
    from nbdist.notebook.run import Run
    from nbdist.engine.telemetry import make_record

    run = Run(strategy="nfdt", options={}, workers=[3, 5], cell="")
    run.hosts = {3: {"host": "a"}, 5: {"host": "b"}}
    run.results = {3: [FitResult([], [], {}, {}, [], records=[make_record(step=40, loss=0.5, samples_per_s=900.0)])]}
    run.events = [{"event": "worker_died", "rank": 1}]
    text = worker_table(run)
    assert "0     3       a     40     0.5000  900" in text and "1     5       b" in text and "died" in text
