"""`tensor`: model parallelism within layers; the large layers of a Sequential or functional model split across
engines.

Every engine takes the same batches. Large `Dense` layers are split by output units (and, in a
Sequential model, the `Dense` right after one by input units, Megatron-LM's pair),
`MultiHeadAttention` by heads, `Embedding` by output dimension, `Conv2D` by filters
(`nbdist.tensor_parallel.plan`); Horovod's allgather and allreduce over Gloo
join the slices (`nbdist.tensor_parallel.layers`). Keras' own `fit` runs on every engine on its
share of the model, compiled as the cell compiled its own; at the end every engine gathers the
whole weights and optimizer state into the cell's model (`nbdist.tensor_parallel.model`). The
Horovod job is `hfdt`'s (its rendezvous, one rank per engine), not elastic: a dead engine fails
the run naming it. See DESIGN.md section 9 and docs/strategies/tensor.md.
"""

from __future__ import annotations

import random

from ..keras_bridge import build_for_training
from ..tensor_parallel.model import engine_bytes, parallel_model, reassemble
from ..tensor_parallel.plan import plan_splits
from . import horovod_ops as ops
from .base import Option, Reports
from .hfdt import STALL_TIMEOUT, HfdtStrategy
from .hfdt_worker import HfdtWorker

SPLIT_LAYERS = Option("--split-layers", "tensor: auto (every Dense, Embedding and Conv2D whose kernel holds at "
                      "least 1/8 of the model's parameter bytes) or the names of the layers to split, "
                      "comma-separated", default="auto", metavar="auto|NAMES")


class TensorWorker(HfdtWorker):
    """One engine's share of every split layer; the cell's `fit` on it, the whole model gathered at the end."""

    def fit(self, request):
        self.refuse_other_optimizers(request)
        hvd = self._init_horovod()
        model = request.model
        try:
            build_for_training(model, request.x)
            ops.broadcast_from_rank0(hvd, list(model.variables) + list(model.optimizer.variables))
            plan = plan_splits(model, hvd.size(), self.values.get("split_layers"))
            parallel = parallel_model(model, plan, hvd.rank(), hvd.size())
            if self.spec.get("seed") is None:  # every engine must draw the same batches (and Dropout masks)
                import keras

                keras.utils.set_random_seed(hvd.broadcast_object(random.randrange(2 ** 31), root_rank=0,
                                                                 name="nbdist_tp_seed"))
            callbacks = [*self.user_callbacks(request), self.make_reporter(request.samples_per_step or 32)]
            history = request.original_fit(parallel, **{**request.args, "callbacks": callbacks, "verbose": 0})
            self.fit_timings["tensor"] = {"plan": plan, "engine_bytes": engine_bytes(parallel), "rank": hvd.rank(),
                                          "shapes": [[list(w.shape) for w in layer.weights]
                                                     for layer in parallel.layers]}
            reassemble(hvd, model, parallel, plan)
            return history
        finally:
            hvd.shutdown()


class TensorStrategy(HfdtStrategy):
    """Within-layer model parallelism over one Horovod job; prints the split plan under the cell."""

    name = "tensor"
    summary = "model parallel within layers: large Dense / attention / Embedding / Conv2D layers split across engines"
    reads = (SPLIT_LAYERS, STALL_TIMEOUT)
    reports = Reports(panels=("loss", "throughput"), controls=())
    worker_class = TensorWorker
    min_workers = 2

    def array_shards(self) -> bool:
        return False  # every engine trains on all the data

    def finish(self, run) -> None:
        super().finish(run)
        fits = run.fits
        if fits and fits[-1].timings.get("tensor"):
            run.plan = plan_table([fit.timings["tensor"] for fit in _last_fits(run)])
            run.note(run.plan["text"])


def _last_fits(run) -> list:
    return [run.results[eid][-1] for eid in run.workers if run.results.get(eid)]


def plan_table(parts: list[dict]) -> dict:
    """The split as the cell prints it: each layer, how it is split, its bytes on one engine; and each
    engine's variable and optimizer-slot bytes."""
    plan = parts[0]["plan"]
    lines = [f"nbdist: tensor split over {len(parts)} engines:",
             f"  {'layer':<24} {'kind':<11} {'MB':>8} {'MB per engine':>13}  note"]
    for entry in plan:
        if entry["class"] == "InputLayer":
            continue
        note = entry["reason"] if entry["reason"] and entry["reason"] != "small" else ""
        lines.append(f"  {entry['name']:<24} {entry['kind']:<11} {entry['bytes'] / 1e6:8.3f} "
                     f"{entry['bytes_per_engine'] / 1e6:13.3f}  {note}".rstrip())
    engines = sorted(parts, key=lambda p: p["rank"])
    lines.append("  variables + optimizer slots per engine (MB): " +
                 ", ".join(f"rank {p['rank']} {p['engine_bytes']['total'] / 1e6:.3f}" for p in engines))
    return {"layers": plan, "engine_bytes": [p["engine_bytes"] for p in engines], "text": "\n".join(lines)}
