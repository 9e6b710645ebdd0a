"""Fixtures: real ipyparallel clusters and real kernels that drive the magics.

One shared cluster serves the modules that leave engines as they found them; after every test that used
it, its engines must be idle again or that test fails, naming the engines left busy. A module that kills,
interrupts, stalls, restarts or evicts engines or shards owns its cluster (`support.own_cluster`).
"""

from __future__ import annotations

import os

import pytest

from tests.kernel_driver import KernelDriver
from tests.support import EnginesLeftBusy, failed_since, free_engines, scaled, start_cluster, stop_cluster, wait_idle

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

IDLE_AFTER_TEST_S = 30  # a finished cell leaves its engines idle at once; this is only the hub's lag, generously
IDLE_AFTER_KERNEL_S = 60  # after a module's kernel stopped (its lifeline releases the engines)


# `make test` runs the suite on two pytest-xdist workers, a file at a time: the longest files first, so that the two
# workers end together (seconds on one worker of a 2-core machine, build/junit.xml of 2026-12-07; a file not named
# here comes after them, in the order pytest collects it).
LONGEST_FIRST = ("test_data_structures.py", "test_hfdt.py", "test_keras_semantics.py", "test_install.py",
                 "08-plan.ipynb", "test_training_loops.py", "test_planner.py", "test_pipeline.py",
                 "test_lifeline.py", "07-model-parallel.ipynb", "test_nfdt.py", "test_tensor.py",
                 "test_dynamic_data.py", "test_ashl.py", "test_lab_extension.py")


def pytest_collection_modifyitems(items):
    """A test on a cluster or a kernel is a `cluster` test (`make check` runs the others), marked or not; files
    in LONGEST_FIRST's order, each file's tests in their own order."""
    for item in items:
        if {"cluster", "kernel", "shared_cluster"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def shared_cluster(request):
    """The suite's shared 2-engine local cluster (more engines are started when a test asks for them); one
    per pytest-xdist worker."""
    handle = start_cluster(2, shared=True)
    try:
        yield handle
    finally:
        stop_cluster(handle, keep_logs=failed_since(request, 0))


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    """The cluster a module's tests use: the shared one, unless the module declares its own."""
    return shared_cluster


@pytest.fixture(autouse=True)
def _shared_engines_left_idle(request):
    """After a test on the shared cluster: every engine idle again, or this test fails naming them."""
    yield
    if "cluster" not in request.fixturenames:
        return
    handle = request.getfixturevalue("cluster")
    if not handle.shared:
        return
    busy = wait_idle(handle.client, scaled(IDLE_AFTER_TEST_S))
    if busy:
        done = free_engines(handle.client, busy, scaled(IDLE_AFTER_TEST_S))
        raise EnginesLeftBusy(f"{request.node.nodeid} left engine(s) of the shared cluster busy "
                              f"{scaled(IDLE_AFTER_TEST_S):.0f} s after it ended: {busy} ({done})")


@pytest.fixture(scope="module")
def kernel(cluster, request):
    """A real IPython kernel with nbdist loaded, connected to the module's cluster, definitions recorded.

    Stopped at the module's end; on the shared cluster its engines must then be idle, or the module fails."""
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run(f"%dist connect --cluster-id {cluster.cluster_id}", timeout=scaled(120)).check()
        driver.run("%%distribute define --name data\n" + DEFINITION, timeout=scaled(120)).check()
        yield driver
    finally:
        driver.stop()
    if cluster.shared:
        busy = wait_idle(cluster.client, scaled(IDLE_AFTER_KERNEL_S))
        if busy:
            done = free_engines(cluster.client, busy, scaled(IDLE_AFTER_TEST_S))
            raise EnginesLeftBusy(f"{request.module.__name__}'s kernel stopped and left engine(s) of the shared "
                                  f"cluster busy for {scaled(IDLE_AFTER_KERNEL_S):.0f} s: {busy} ({done})")
