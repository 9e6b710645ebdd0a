"""Fixtures: one real ipyparallel cluster for the whole suite, real kernels that drive the magics."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.kernel_driver import KernelDriver

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NBDIST_PROGRESS", "text")  # kernels started by tests have no browser; tests that want
# the dashboard say --progress dashboard (the browser test's JupyterLab drops this variable)

DEFINITION = '''
import keras, numpy as np
from nbdist.datasets import fashion_mnist
(x, y), (xt, yt) = fashion_mnist(limit=2000)
x = x.astype("float32")[..., None] / 255
xt = xt.astype("float32")[..., None] / 255
def build():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
'''

TRAIN = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=64, epochs={epochs}, validation_data=(xt, yt))
'''


@pytest.fixture(scope="session")
def cluster():
    """A real 2-engine local ipyparallel cluster, stopped at the end even if tests fail."""
    import ipyparallel as ipp

    from nbdist.cluster import HEARTBEAT_ARGS

    cluster = ipp.Cluster(n=2, cluster_id=f"nbdist-test-{uuid.uuid4().hex[:8]}",
                          controller_args=list(HEARTBEAT_ARGS), log_level=30)
    client = cluster.start_and_connect_sync()
    try:
        yield cluster, client
    finally:
        client.close()
        cluster.stop_cluster_sync()


SETTLE_S = 60  # a kernel that stopped has its watcher interrupt the training it left running on shared engines


def engines_idle(client, timeout: float) -> None:
    """Wait (bounded) until no registered engine of the shared cluster has a task; warn naming those
    still busy after `timeout` (a killed engine leaves the hub's list within a few seconds; one that
    stays busy was never freed, or lost its reply: `tests.support.idle_engines` passes it over)."""
    import time
    import warnings

    from tests.support import busy_ids

    deadline = time.time() + timeout
    while True:
        busy = busy_ids(client)
        if not busy:
            return
        if time.time() > deadline:
            warnings.warn(f"engines still busy {timeout} s after the previous module's kernel stopped: {busy}")
            return
        time.sleep(0.2)  # polling the hub's queue status, bounded by the deadline


@pytest.fixture(scope="module")
def kernel(cluster):
    """A real IPython kernel with nbdist loaded, connected to the shared cluster, definitions recorded."""
    ipp_cluster, client = cluster
    engines_idle(client, SETTLE_S)
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run(f"%dist connect --cluster-id {ipp_cluster.cluster_id}", timeout=120).check()
        driver.run("%%distribute define --name data\n" + DEFINITION, timeout=120).check()
        yield driver
    finally:
        driver.stop()
