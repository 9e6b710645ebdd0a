"""keras-io's own examples as notebooks with no marks: one module per example, one kernel per module.

Every test here is an `acceptance` test (`make acceptance` runs them; `make test` and `make check` leave them out)
and a `cluster` test. The modules use the suite's shared 2-engine cluster (tests/conftest.py): an example leaves
its engines idle, as any notebook should.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.keras_io.harness import (CELL_TIMEOUT_S, DETERMINISM, RESEED, NotebookKernel, engine_threads, plain_cell,
                                    plain_determinism)
from tests.state_oracle import capture
from tests.support import idle_engines, scaled

SETUP_TIMEOUT_S = 180  # a cell of an example's set-up (imports, data, a small pre-training in the kernel)


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.acceptance)
            item.add_marker(pytest.mark.cluster)


@dataclass
class PlainRun:
    """The example run plain: its kernel's whole state (the state walk's capture) and its MEASURE."""

    state: object
    measure: float


@pytest.fixture(scope="module")
def plain_notebook(cluster, request, tmp_path_factory) -> PlainRun:
    """The example's cells run once as a plain notebook (no nbdist), seeded and deterministic as the distributed
    runs are, on an engine's thread pools (`harness.plain_determinism`, `plain_cell`), in a folder and a kernel of
    their own, stopped at once."""
    module = request.module
    folder = tmp_path_factory.mktemp(module.__name__.rsplit(".", 1)[-1] + "-plain")
    driver = NotebookKernel(cwd=str(folder))
    try:
        driver.run(plain_determinism(engine_threads(cluster))).check()
        for cell in module.SETUP:
            driver.run(cell, timeout=SETUP_TIMEOUT_S).check()
        driver.run(RESEED).check()
        for cell in module.RUN:
            if not callable(cell):
                driver.run(plain_cell(cell), timeout=CELL_TIMEOUT_S).check()
        return PlainRun(capture(driver, folder / "state-plain.pkl"), float(driver.value(module.MEASURE.expression)))
    finally:
        driver.stop()


@pytest.fixture(scope="module")
def notebook(cluster, request, tmp_path_factory):
    """A fresh kernel for the module's example (a new notebook): nbdist loaded and connected, then the example's
    SETUP cells run as plain cells, in a folder of its own (the example's files land there). Stopped at the
    module's end, also when a test failed."""
    folder = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    idle_engines(cluster, 2)
    driver = NotebookKernel(cwd=str(folder))
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run(f"%dist connect --cluster-id {cluster.cluster_id}", timeout=scaled(120)).check()
        # on an engine's thread pools too, as the plain kernel: what the SETUP cells compute here (a pre-training,
        # an adapt) must be the plain kernel's to the bit, or local starts from other values than plain
        driver.run(plain_determinism(engine_threads(cluster))).check()
        for cell in request.module.SETUP:
            driver.run(cell, timeout=SETUP_TIMEOUT_S).check()
        driver.folder = folder
        yield driver
    finally:
        driver.stop()
