"""`tensor`: model parallelism within layers; the large layers of any model (Sequential, functional, subclassed,
nested) split across engines where they sit.

Every engine takes the same batches. Large `Dense` layers are split by output units (and, where the graph shows
it, the `Dense` right after one by input units, Megatron-LM's pair),
`MultiHeadAttention` by heads, `Embedding` by output dimension, `Conv2D` by filters, `EinsumDense`
by an output axis (`nbdist.model_parts.tensor_parallel.plan`); Horovod's allgather and allreduce over Gloo
join the slices (`nbdist.model_parts.tensor_parallel.layers`). Each engine fetches its slices of the notebook's
model from the kernel, Keras' own `fit` runs on every engine on its share of the model (the engine's copy of
the cell's model, split in place: its compile and the cell's own functions stay), and each hands its trained slices back to the kernel, which joins them
(`nbdist.model_parts.desk`, `nbdist.model_parts.tensor_parallel.model`): no engine holds the whole model. The
Horovod job is `hfdt`'s (its rendezvous, one rank per engine), not elastic: a dead engine fails
the run naming it. See DESIGN.md section 9 and docs/strategies/tensor.md.
"""

from __future__ import annotations

import random

import numpy as np

from ..keras_semantics.empty_weights import fill, weights_without_values
from ..keras_semantics.keras_bridge import FitResult, build_from_sample
from ..model_parts.desk import (DeskClient, PartsDesk, cut, load_slots, notebook_name, optimizer_prefix,
                                refuse_second_fit, release, slots_per_variable, taken)
from ..ps import wire
from ..model_parts.sharded_checkpoint import refuse_unservable_savers, with_checkpoints, write_gathered
from ..model_parts.tensor_parallel.model import (as_written, draw_alike, engine_bytes, split_in_place, state_parts,
                                                 trainable_axes, weight_axes, whole, whole_state)
from ..model_parts.tensor_parallel.plan import plan_splits
from . import horovod_ops as ops
from .base import Option, Reports
from .hfdt import STALL_TIMEOUT, HfdtStrategy
from .hfdt_worker import HfdtWorker

SPLIT_LAYERS = Option("--split-layers", "tensor: auto (every Dense, EinsumDense, MultiHeadAttention, Embedding and Conv2D holding at "
                      "least 1/8 of the largest layer's parameter bytes) or the names of the layers to split, "
                      "comma-separated", default="auto", metavar="auto|NAMES")


class TensorWorker(HfdtWorker):
    """One engine's share of every split layer, its values fetched from the kernel (the cell's model here has none:
    `nbdist.keras_semantics.empty_weights`); the cell's `fit` on it; the trained slices handed back to the kernel."""

    fits = 0
    handed_state: tuple = (None, {})  # (rank 0's capture of what else the model reaches, how the kernel joins it)

    def fit(self, request):
        model = request.model
        self.handed_state = (None, {})
        refuse_second_fit(model, "tensor")
        refuse_unservable_savers(request.callbacks, "tensor")
        hvd, undo = self._init_horovod(), None
        links = self.config["parts"]
        desk = DeskClient(links["desk"], bytes.fromhex(links["key"]), hvd.rank(),
                          f"tensor rank {hvd.rank()} (engine {links['engines'][hvd.rank()]})")
        try:
            if not model.built:  # (a subclassed model: its weights made without values, as a define cell's are)
                with weights_without_values():
                    build_from_sample(model, request.x)
            plan = plan_splits(model, hvd.size(), self.values.get("split_layers"))
            axes = weight_axes(plan, model)
            values, slots, from_notebook = self._own_values(hvd, desk, model, axes)
            release(model)  # (this engine's copy: the slices above are all it trains with)
            undo = split_in_place(model, plan, hvd.rank(), hvd.size(), values)
            del values
            if slots is not None:  # (a fresh optimizer is built by the fit that applies it, as Keras builds it)
                load_slots(model.optimizer, model.trainable_variables, slots)
            model.save_weights = model.save = checkpoint_writer(hvd, model, axes)
            seed = self.spec.get("seed")
            if seed is None:  # every engine must draw the same batches (and Dropout masks)
                import keras

                seed = hvd.broadcast_object(random.randrange(2 ** 31), root_rank=0, name="nbdist_tp_seed")
                keras.utils.set_random_seed(seed)
            draw_alike(model, hvd.rank(), lambda states: hvd.broadcast_object(states, root_rank=0,
                                                                              name="nbdist_tp_generators"))
            callbacks = [*with_checkpoints(request.callbacks, self.user_callbacks(request)),
                         self.make_reporter(request.samples_per_step or 32)]
            history = request.original_fit(model, **{**request.args, "callbacks": callbacks, "verbose": 0})
            self.fit_timings["tensor"] = {"plan": plan, "engine_bytes": engine_bytes(model), "rank": hvd.rank(),
                                          "from_notebook": from_notebook,
                                          "shapes": [[list(w.shape) for w in layer.weights]
                                                     for layer in model.layers]}
            self._hand_in(desk, hvd.rank(), model, axes)
            return history
        finally:
            if undo is not None:
                undo()  # (whole-shaped again, its values released: the cell's code after fit reads its shapes)
            for saver in ("save_weights", "save"):
                vars(model).pop(saver, None)  # (the gathering writers: Horovod's job ends here)
            hvd.shutdown()

    @staticmethod
    def _own_values(hvd, desk, model, axes) -> tuple[list, list | None, bool]:
        """This engine's slice of each of the model's weights and of its optimizer's slots: the notebook's, fetched
        from the kernel. A model the cell made (a GAN over the notebook's discriminator and generator) takes the
        weights of the notebook's models inside it the same way, each by its notebook name; what no notebook model
        holds is rank 0's (its initialiser's values), broadcast and sliced here, and its optimizer is fresh."""
        from ..model_parts.model_sync import architecture

        slot_axes = trainable_axes(model, axes)
        name = notebook_name(model)
        prefix = optimizer_prefix(model.optimizer)
        weights, slots = (desk.fetch_part(name, architecture(model), list(range(len(model.weights))),
                                          list(range(len(slot_axes))), prefix, axes=axes, slot_axes=slot_axes,
                                          size=hvd.size()) if name else (None, None))
        if weights is not None:
            return weights, slots, True
        axis_of = dict(zip(map(id, model.weights), axes))
        values: dict[int, np.ndarray] = {}
        for inner, inner_name in _notebook_models_in(model):
            inner_weights = [w for w in inner.weights if id(w) not in values]
            if not inner_weights or len(inner_weights) < len(inner.weights):
                continue  # (reached already, inside another of the notebook's models)
            fetched, _ = desk.fetch_part(inner_name, architecture(inner), list(range(len(inner.weights))), [], 0,
                                         axes=[axis_of.get(id(w)) for w in inner.weights], slot_axes=[],
                                         size=hvd.size())
            if fetched is not None:
                values.update(zip(map(id, inner.weights), fetched))
        rest = [w for w in model.weights if id(w) not in values]
        for variable in rest:
            fill(variable)  # (made empty by a define cell: its initialiser's values, rank 0's broadcast below)
        ops.broadcast_from_rank0(hvd, rest)
        values.update({id(w): cut(np.asarray(w), axis_of[id(w)], hvd.rank(), hvd.size()) for w in rest})
        return [values[id(w)] for w in model.weights], None, len(rest) < len(model.weights)

    def _hand_in(self, desk, rank: int, model, axes) -> None:
        """The trained slices to the kernel, each variable's memory freed as it goes; a replicated variable is
        rank 0's alone. Besides the weights and `model.optimizer`, every other split variable the model reaches (the
        slots of the optimizers a `train_step` of its own applies) goes the same way, and rank 0 keeps the rest of
        what the model reaches for its result (`state_parts`; the kernel joins them: `whole_state`)."""
        def mine(variable, axis):
            return taken(variable) if axis is not None or rank == 0 else np.empty(0, np.float32)

        state, addresses, others, split = state_parts(model, axes, rank)
        slot_axes = trainable_axes(model, axes)
        optimizer = model.optimizer.variables
        prefix = optimizer_prefix(model.optimizer)
        per = slots_per_variable(len(optimizer), prefix, len(slot_axes))
        slots = [mine(v, slot_axes[k // per]) for k, v in enumerate(optimizer[prefix:])]
        self.fits += 1
        desk.send_part(self.fits, [mine(v, axis) for v, axis in zip(model.weights, axes)],
                       [np.asarray(v.numpy()) for v in optimizer[:prefix]] + slots, others, axes=axes,
                       slot_axes=slot_axes, prefix=prefix)
        self.fit_timings["tensor"]["fit"] = self.fits
        whole_model = addresses is not None and None not in addresses["weights"] + addresses["optimizer"]
        self.handed_state = (state, {"addresses": addresses, "split": split}) if whole_model else (None, {})

    def result(self, request, history, records, timings, states):
        """History, records and callbacks; the weights went to the kernel (`_hand_in`), which joins them."""
        result = FitResult.collect(None, history, records, timings, states, self.files_written)
        result.state, joining = self.handed_state
        result.parts = {"fit": timings["tensor"]["fit"], **joining}
        return result


def _notebook_models_in(model) -> list[tuple[object, str]]:
    """(model, its notebook name) of the notebook's models nested in `model`, outermost first (the engine's
    namespace holds them under the notebook's names, `model_sync`)."""
    import keras

    from ..host.namespace import user_namespace

    names = {id(v): k for k, v in user_namespace().items() if isinstance(v, keras.Model) and not k.startswith("_")}
    return [(layer, names[id(layer)]) for layer in model._flatten_layers(include_self=False, recursive=True)
            if id(layer) in names]


def checkpoint_writer(hvd, model, axes):
    """What a ModelCheckpoint's save runs on every rank (its `save` to a .keras path, its `save_weights` to a
    .weights.h5 one): the whole model's weights and optimizer variables gathered one at a time (a collective, in
    the same order on every rank), written by rank 0."""
    axis_of = dict(zip(map(id, model.weights), axes))
    slot_axes = trainable_axes(model, axes)
    calls = [0]

    def gathered(variable, axis):
        value = np.asarray(variable.numpy())
        if axis is None:
            return value
        calls[0] += 1
        moved = np.ascontiguousarray(np.moveaxis(value, axis, 0))
        return np.moveaxis(hvd.allgather(moved, name=f"nbdist_checkpoint_{calls[0]}").numpy(), 0, axis)

    def save(filepath, overwrite=True, **kwargs):
        optimizer = list(model.optimizer.variables)
        prefix = optimizer_prefix(model.optimizer)
        per = slots_per_variable(len(optimizer), prefix, len(slot_axes))
        slots = {n: (lambda v=v, a=(slot_axes[(n - prefix) // per] if n >= prefix else None): gathered(v, a))
                 for n, v in enumerate(optimizer)}
        with as_written(model):  # (the archive names each layer's own class)
            write_gathered(model, filepath, lambda v: gathered(v, axis_of[id(v)]), slots, writer=hvd.rank() == 0)

    return save


class TensorStrategy(HfdtStrategy):
    """Within-layer model parallelism over one Horovod job; prints the split plan under the cell."""

    name = "tensor"
    summary = "model parallel within layers: large Dense / attention / Embedding / Conv2D layers split across engines"
    reads = (SPLIT_LAYERS, STALL_TIMEOUT)
    reports = Reports(panels=("loss", "throughput"), controls=())
    worker_class = TensorWorker
    loop_refusal = ("it splits the layers of the model fit(...) trains across engines, and a loop of the cell's own "
                    "steps the whole model's variables on each")
    min_workers = 2

    fills_own_part = True

    def __init__(self, values):
        super().__init__(values)
        self.desk: PartsDesk | None = None

    def array_shards(self) -> bool:
        return False  # every engine trains on all the data

    def prepare(self, run, cluster) -> dict:
        config = super().prepare(run, cluster)  # (puts the workers in rank order)
        key = wire.new_key()
        self.desk = PartsDesk(key, self.notebook_models)
        config["parts"] = {"desk": self.desk.start(self.address), "key": key.hex(), "engines": list(run.workers)}
        return config

    def finish(self, run) -> None:
        if self.desk is not None:
            self.desk.stop()
            self._join_parts(run)
            self.desk = None
        super().finish(run)
        fits = run.fits
        if fits and fits[-1].timings.get("tensor"):
            run.plan = plan_table([fit.timings["tensor"] for fit in _last_fits(run)])
            run.note(run.plan["text"])

    def _join_parts(self, run) -> None:
        """Rank 0's results take the whole model each fit left, joined from every engine's trained slices: its
        weights and `model.optimizer`'s variables, and the state of everything else it reaches (`result.state`, by
        the state walk's addresses: the other optimizers a `train_step` of its own applies, with their slots
        joined)."""
        size = len(run.workers)
        for result in run.results.get(run.workers[0]) or []:
            fit = result.parts.get("fit")
            parts = [self.desk.trained.get((rank, fit)) for rank in range(size)]
            if not all(parts):
                result.state = None  # (the weights stay unjoined: the notebook says so)
                continue
            result.weights, result.optimizer_weights = whole(parts)
            if result.state is not None:
                result.state = whole_state(result.state, result.parts["addresses"], result.weights,
                                           result.optimizer_weights,
                                           [self.desk.trained_state.get((rank, fit)) or {} for rank in range(size)],
                                           result.parts["split"])


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
