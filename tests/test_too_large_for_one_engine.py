"""A model too large for one engine: each engine's memory capped (`%dist cap`: a cgroup v1 memory controller, as
root) below what training the whole model needs; `pipeline` trains it on two, `tensor` its subclassed twin on two,
`local` on one is killed and the cell says so, naming the engine."""

from __future__ import annotations

import pytest

from nbdist.cluster import memory_caps
from tests.support import idle_engines, own_cluster

# alone: its verdicts are engines' memory peaks under a cap, which another worker's load can raise (a pipeline
# stage was killed at 760 MB beside another pytest-xdist worker, 670-714 MB alone); `make test` runs it after the rest
pytestmark = [pytest.mark.cluster, pytest.mark.alone]
cluster = own_cluster(engines=5)  # the local run's engine is killed by the out-of-memory killer
# Each strategy runs on engines of its own: an engine keeps most of what a run allocated (TensorFlow's CPU
# allocator, not returned by gc or malloc_trim: 0.5 GB after a pipeline stage), which the next run's cap would count.
PIPELINE, TENSOR, LOCAL = slice(0, 2), slice(2, 4), 4

WIDTH, DEPTH = 2896, 8  # eight 2896 x 2896 kernels: 268 MB of variables, 805 MB with Adam's two slots
MB = 1 << 20
# What an engine may allocate once capped (its TensorFlow, imported before, is not counted): less than the model's
# variables and Adam slots (805 MB). A stage's engine holds half of them (403 MB), one micro-batch's gradients
# (134 MB) and the optimizer's temporaries for one 34 MB variable at a time: it peaks at 670-714 MB on this machine
# (`memory.max_usage_in_bytes`, three runs; capped engines take small pages: `memory_caps.small_pages`, without
# which one run's stage was killed at 778 MB holding 70 MB of huge pages); a tensor engine peaks at 477-494 MB.
# One engine training the whole model is killed while it receives it.
CAP = 760 * MB

DEFINE = f'''
import keras
model = keras.Sequential([keras.Input(({WIDTH},))] + [keras.layers.Dense({WIDTH}, name=f"wide_{{i}}") for i in range({DEPTH})]
                         + [keras.layers.Dense(10, name="logits")])
model.compile(optimizer=keras.optimizers.Adam(1e-4),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

class Wide(keras.Model):  # the same layers, subclassed: what `tensor` splits where they sit
    def __init__(self):
        super().__init__()
        self.blocks = [keras.layers.Dense({WIDTH}, name=f"block_{{i}}") for i in range({DEPTH})]
        self.logits = keras.layers.Dense(10, name="logits")

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return self.logits(x)

wide = Wide()
wide.compile(optimizer=keras.optimizers.Adam(1e-4),
             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
'''
DATA = f'''
import numpy as np
xb = np.random.default_rng(0).random((64, {WIDTH}), np.float32)
yb = np.arange(64) % 10
w0 = model.get_weights()
'''
FIT = "history = model.fit(xb, yb, batch_size=16, epochs=1, steps_per_epoch=2, shuffle=False)"


@pytest.fixture(scope="module")
def caps(kernel, cluster) -> list[int]:
    """Five engines capped by `%dist cap` (the user's way), the big model defined; the caps lifted after."""
    why = memory_caps.why_unavailable()
    if why:
        pytest.skip(why)
    ids = idle_engines(cluster, 5)
    try:
        kernel.run(f"%dist cap --memory {CAP // MB}M --targets {','.join(map(str, ids))}", timeout=300).check()
        kernel.run("%%distribute define --name big\n" + DEFINE, timeout=300).check()
        kernel.run(DATA, timeout=120).check()
        yield ids
    finally:
        kernel.run("%dist cap --memory none", timeout=60)


def _peaks(kernel, ids: list[int]) -> list[int]:
    """The most each engine held since it was capped (`memory.max_usage_in_bytes`)."""
    return kernel.value(f"[nbdist.notebook.session.get_session().cluster.caps.peak(e) for e in {ids}]")


def _targets(caps, which: slice) -> str:
    return ",".join(map(str, caps[which]))


def test_pipeline_trains_a_model_no_capped_engine_could_hold_whole(kernel, caps):
    kernel.run(f"%%distribute --strategy pipeline --microbatches 1 --seed 3 --targets "
               f"{_targets(caps, PIPELINE)}\n{FIT}", timeout=600).check()
    moved = kernel.value("[float(abs(a - b).max()) for a, b in zip(w0, model.get_weights())]")
    assert all(m > 0 for m in moved), moved  # every layer trained, the notebook's model whole again
    parts = kernel.value("[r[-1].parts['variable_bytes'] for r in nbdist.last_run.results.values()]")
    whole = DEPTH * (WIDTH * WIDTH + WIDTH) * 4 * 3  # the wide layers' variables and Adam slots
    assert all(2 * p < whole + 1e6 for p in parts), (parts, whole)  # each stage held half, no engine the whole
    peaks = _peaks(kernel, caps[PIPELINE])
    print(f"pipeline stages' peaks: {[p // MB for p in peaks]} MB")
    assert all(0 < peak <= CAP for peak in peaks), peaks


def test_tensor_trains_it_subclassed_with_each_engine_holding_half_of_every_layer(kernel, caps):
    """The same layers in a subclassed model, built in the notebook: each engine builds its copy without values,
    fetches its halves, and splits each Dense where it sits (no graph: each gathers its own output)."""
    kernel.run("wide(xb[:1]); w0 = wide.get_weights()", timeout=120).check()
    kernel.run(f"%%distribute --strategy tensor --seed 3 --targets {_targets(caps, TENSOR)}\n"
               + FIT.replace("model.fit", "wide.fit"), timeout=600).check()
    assert kernel.value("sorted({e['kind'] for e in nbdist.last_run.plan['layers']})") == ["column", "replicated"]
    moved = kernel.value("[float(abs(a - b).max()) for a, b in zip(w0, wide.get_weights())]")
    assert all(m > 0 for m in moved), moved
    held = kernel.value("[p['total'] for p in nbdist.last_run.plan['engine_bytes']]")
    whole = DEPTH * (WIDTH * WIDTH + WIDTH) * 4 * 3
    assert all(2 * h < whole + 1e6 for h in held), (held, whole)  # half of every wide layer and its slots
    peaks = _peaks(kernel, caps[TENSOR])
    print(f"tensor engines' peaks: {[p // MB for p in peaks]} MB")
    assert all(0 < peak <= CAP for peak in peaks), peaks


def test_local_on_one_capped_engine_is_killed_and_the_cell_names_it(kernel, caps):
    eid = caps[LOCAL]
    reply = kernel.run(f"%%distribute --strategy local --targets {eid}\n{FIT}", timeout=600)
    assert reply.status == "error"
    text = reply.error_text
    assert f"engine {eid}" in text and "memory" in text, text
