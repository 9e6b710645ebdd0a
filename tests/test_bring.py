"""A notebook with no marks trains: what the training cell uses is brought to the engines (issue 19),
through a real kernel and the suite's real cluster."""

from __future__ import annotations

import pytest

from tests.kernel_driver import KernelDriver
from tests.support import idle_engines

pytestmark = pytest.mark.cluster

# the cells of a notebook written before nbdist (names of their own: the suite's engines hold others)
IMPORTS = "import keras\nimport numpy as npx\nfrom nbdist.datasets import fashion_mnist"
DATA = '(px, py), _ = fashion_mnist(limit=1024)\npx = px.reshape(-1, 784).astype("float32") / 255'
MODEL = '''
class Scale(keras.layers.Layer):
    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, inputs):
        return inputs * self.factor

HIDDEN = 16

def make_plain_model():
    return keras.Sequential([keras.Input((784,)), Scale(0.5), keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])
'''
TRAIN = '''
model = make_plain_model()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
history = model.fit(px, py, batch_size=32, epochs=1, shuffle=False)
'''
LINES = {"local": "--strategy local --seed 3", "hfdt": "--strategy hfdt --workers 2 --seed 3",
         "nfdt": '--strategy nfdt --workers 2 --seed 3 --simulate "clock=virtual; step=1ms"'}
WEIGHTS = "[w.ravel().tolist() for w in model.get_weights()]"


@pytest.fixture(scope="module")
def plain(cluster):
    """A kernel whose notebook has no %%distribute define cell, only plain cells."""
    ipp_cluster, _ = cluster
    driver = KernelDriver()
    try:
        driver.run("%load_ext nbdist\nimport nbdist").check()
        driver.run(f"%dist connect --cluster-id {ipp_cluster.cluster_id}", timeout=120).check()
        for cell in (IMPORTS, DATA, MODEL):
            driver.run(cell, timeout=120).check()
        yield driver
    finally:
        driver.stop()


def brought(kernel) -> dict:
    return kernel.value("nbdist.last_run.sent.get('brought') or {}")


@pytest.mark.parametrize("strategy", ["local", "nfdt", "hfdt"])
def test_an_unmarked_notebook_trains_and_a_rerun_sends_no_data(plain, cluster, strategy):
    idle_engines(cluster, 2)
    plain.run(f"%%distribute {LINES[strategy]}\n" + TRAIN, timeout=240).check()
    if strategy == "local":  # the module's first run: everything the cell reads, and nothing it does not (npx)
        assert sorted(brought(plain)["names"]) == ["HIDDEN", "Scale", "keras", "make_plain_model", "px", "py"]
    plain.run(f"%%distribute {LINES[strategy]}\n" + TRAIN, timeout=240).check()
    assert brought(plain)["data_bytes"] == 0 and brought(plain)["names"] == []
    assert plain.value("float(history.history['loss'][0])") < 2.5


def test_with_static_shards_each_worker_receives_only_its_shard(plain, cluster):
    _, client = cluster
    idle_engines(cluster, 2)
    plain.run("px, py = px[::-1].copy(), py[::-1].copy()").check()  # new content: sent afresh (by digest)
    plain.run(f"%%distribute {LINES['nfdt']} --data static\n" + TRAIN, timeout=240).check()
    sent = brought(plain)
    assert sent["sharded"] == ["px", "py"] and sent["data_bytes"] == 1024 * 784 * 4 + 1024  # halves, one a worker
    workers = plain.value("nbdist.last_run.workers")
    for eid in workers:
        client[eid].execute("_px_held = len(px)", block=True)
    assert [client[eid].pull("_px_held", block=True) for eid in workers] == [512, 512]


def test_an_array_sent_whole_is_placed_once_on_the_host_and_every_engine_maps_that_copy(plain, cluster):
    _, client = cluster
    idle_engines(cluster, 2)
    plain.run("px = px.copy()\npx[0, 0] = 0.5").check()  # new content: placed afresh (by digest)
    plain.run(f"%%distribute {LINES['nfdt']}\n" + TRAIN, timeout=240).check()  # batches on demand: whole arrays
    sent = brought(plain)
    assert "px" in sent["names"] and sent["data_bytes"] == 0  # the kernel shares the host: it wrote the copy itself
    files = [client[eid].apply_sync(_mapped_file, "px") for eid in plain.value("nbdist.last_run.workers")]
    assert files[0] is not None and files[0] == files[1], files  # one file, mapped by both engines
    assert "data placed on" in plain.run("%dist status").check().stdout


def _mapped_file(name: str) -> str | None:
    from nbdist.host.namespace import user_namespace

    return getattr(user_namespace()[name], "filename", None)


def test_the_same_notebook_with_marks_gives_the_same_weights(plain, cluster):
    idle_engines(cluster, 2)
    plain.run(DATA, timeout=120).check()  # the data as the cells make it (an earlier test reversed it)
    plain.run(f"%%distribute {LINES['hfdt']}\n" + TRAIN, timeout=240).check()
    unmarked = plain.value(WEIGHTS)
    plain.run("%%distribute define --name plain\n" + "\n".join((IMPORTS, DATA, MODEL)), timeout=120).check()
    plain.run(f"%%distribute {LINES['hfdt']}\n" + TRAIN, timeout=240).check()
    assert brought(plain).get("names", []) == []  # marked cells win: nothing brought
    marked = plain.value(WEIGHTS)
    assert max(abs(a - b) for wa, wb in zip(unmarked, marked) for a, b in zip(wa, wb)) <= 1e-6


def test_a_value_that_cannot_be_sent_names_the_cell_that_made_it(plain, cluster, tmp_path):
    idle_engines(cluster, 1)
    plain.run(f"log = open({str(tmp_path / 'log.txt')!r}, 'w')").check()
    index = plain.value("len(In) - 2")  # In[-1] is this very cell
    reply = plain.run("%%distribute --strategy local\nlog.write('x')\n" + TRAIN, timeout=60)
    assert reply.status == "error" and "`log`" in reply.evalue and "open file" in reply.evalue
    assert f"cell [{index}]" in reply.evalue and "%%distribute define" in reply.evalue
    plain.run("log.close()").check()


def test_no_bring_leaves_the_engines_to_marked_cells_and_the_error_says_so(plain, cluster):
    idle_engines(cluster, 1)
    plain.run("only_here = 41").check()
    reply = plain.run("%%distribute --strategy local --no-bring\nprint(only_here + 1)\n" + TRAIN, timeout=60)
    assert reply.ename == "EngineFailure" and "NameError" in reply.evalue and "only_here" in reply.evalue
    assert "%%distribute define" in reply.evalue
    reply = plain.run("%%distribute --strategy local\nprint(only_here + 1)\n" + TRAIN, timeout=120)
    assert "brought only_here" in reply.stdout and reply.status == "ok"  # got past the name, and trained
