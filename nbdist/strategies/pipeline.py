"""`pipeline`: model parallelism between layers; the model cut into K stages, one per engine.

Stage i holds only its layers' variables and their optimizer state. Each mini-batch is cut
into M micro-batches that flow through the stages on the 1F1B (default) or GPipe schedule;
activations and their gradients travel between neighbours over nbdist's signed wire. See
DESIGN.md section 9, docs/strategies/pipeline.md and `nbdist.model_parts.pipeline`.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..host import gpus
from ..keras_semantics.empty_weights import fill, finalize_states, materialized, weights_without_values
from ..errors import OptionError
from ..keras_semantics.keras_bridge import FitResult, build_from_sample
from ..model_parts.desk import (load_slots, notebook_name, optimizer_prefix, refuse_second_fit, release, slot_indices,
                                slots_per_variable, taken)
from ..model_parts.pipeline import schedule as schedules
from ..model_parts.pipeline import split as splits
from ..model_parts.pipeline.links import AddressBook, StageLinks
from ..model_parts.pipeline.replicas import Position
from ..model_parts.pipeline.stage import SAVE, differentiable, gather, index_batches, stage_model
from ..model_parts.pipeline.streams import Stream, is_stream
from ..model_parts.pipeline.streams import steps as stream_steps
from ..model_parts import kept_weights
from ..model_parts.sharded_checkpoint import (Ownership, index_path, refuse_unservable_savers, with_checkpoints,
                                              write_gathered, write_part)
from ..ps import wire
from ..datasets.dynamic_data import single_target
from ..datasets.structures import length, map_leaves, rows, take
from .base import Option, Reports, Strategy, Worker
from .control_step import stop_when_stopped

STAGES = Option("--stages", "number of pipeline stages, one engine each (pipeline)", type=int, metavar="K", minimum=2)
MICROBATCHES = Option("--microbatches", "micro-batches each mini-batch is cut into (pipeline; more shrink the "
                      "idle bubble (K-1)/(M+K-1))", type=int, default=4, metavar="M", minimum=1)
SPLIT = Option("--split", "where to cut the model: auto (balance measured per-layer time) or the names of the "
               "layers after which to cut, comma-separated (pipeline)", default="auto", metavar="auto|NAMES")
REPLICAS = Option("--replicas", "data parallelism across pipelines: R pipelines of K stages on R x K engines, each "
                  "taking every R-th sample of a batch, the replicas of a stage summing their gradients (pipeline)",
                  type=int, default=1, metavar="R", minimum=1)
SCHEDULE = Option("--schedule", "micro-batch order: 1f1b (one forward, one backward; at most K micro-batches "
                  "of activations per stage) or gpipe (all forwards, then all backwards)", default="1f1b",
                  choices=schedules.KINDS)
KEEP_WEIGHTS = Option("--keep-weights", "where the trained weights go (pipeline): notebook (joined into the "
                      "notebook's model), engines (each stage keeps its part; the notebook's model is its skeleton, "
                      "whose save_weights writes a sharded checkpoint and which the next pipeline run trains on), or "
                      "auto (engines where the notebook's model needs more than half of its host's available memory)",
                      default="auto", choices=("auto", "notebook", "engines"))
TIMING_REPEATS = 5


class PipelineWorker(Worker):
    """One stage: builds its part of the model, frees the rest, and runs Keras' `fit` on the part."""

    handed_in = {"fit": -1}  # what the last fit's `_hand_in` sent the kernel
    saves = 0  # whole-model saves relayed down the pipeline (their messages' numbers)

    @property
    def position(self) -> Position:
        return Position(self.rank, self.config["stages"], self.config["replicas"])

    @property
    def last(self) -> bool:
        return self.position.last

    @property
    def keeps_callbacks(self) -> bool:
        # the first pipeline's last stage computes the loss: its callbacks hold what a local fit's would
        return self.rank == self.position.stages - 1

    def cell_context(self):
        return gpus.device_scope()

    def fit(self, request):
        model = request.model
        self.refuse_other_optimizers(request)
        refuse_second_fit(model, "pipeline")
        arrays = fit_arrays(request)
        if arrays["train"].get("streamed") and self.config["replicas"] > 1:
            raise OptionError("--strategy pipeline with --replicas reads the training data as arrays (every "
                              "replica takes its share of the same batch); a stream is read once, by one first "
                              "stage: pass numpy arrays, or train without --replicas.")
        if not model.built:
            with weights_without_values():  # each stage gives values to its own part only
                build_from_sample(model, request.x)
        refuse_unservable_savers(request.callbacks, "pipeline")
        chain = splits.chain_of(model)
        control = self.control_point()
        links = StageLinks(self.config["links"], self.rank, self.config["engines"],
                           paused=lambda: bool(control.flags()[0]))
        try:
            plan = self._plan(chain, arrays, request) if self.rank == 0 else None
            plan = links.join(self.position.neighbours(), split=plan)
            part = splits.stage_part(chain, plan["cut_at"], self.position.stage)
            stage = stage_model(part, self.position, links, {**plan, "microbatches": self.config["microbatches"],
                                                              "schedule": self.config["schedule"]}, self._own(arrays))
            self.layout = stage_layout(model, part)
            if self.last and getattr(model, "output_names", None):  # a loss dict keyed by the model's output names
                stage.output_names = list(model.output_names)
            stage.compile(**stage_compile_args(model, self.last), run_eagerly=True)
            fill_own_part(model, stage, self.layout, links.desk)
            release(model, keep=part.weights)
            self._own_checkpoints(model, chain, plan, stage)
            stage.steps.control = control
            self.stage, self.plan, self.links = stage, plan, links
            history = self._fit_stage(request, stage, arrays)
            self._give_back(model, stage)
            return history
        finally:
            control.close()
            links.close()

    @property
    def keeps_weights(self) -> bool:
        """Whether each stage keeps its trained part on its engine (`--keep-weights engines`)."""
        return self.config.get("keep") == "engines"

    def _own_checkpoints(self, model, chain, plan, stage) -> None:
        """What this stage owns of the whole model, and what a save of it writes (the first pipeline's stages
        relay their parts to the last, which writes the file the cell named; with `--keep-weights engines`, a model
        too large to gather, each writes its part of a sharded checkpoint; the other replicas, equal, nothing)."""
        self.ownership = Ownership.of_parts(splits.stage_ranges(chain, plan["cut_at"]), self.position.stage,
                                            keeper=self.position.stages - 1, optimizer=stage.optimizer,
                                            own_trainable_index=self.layout["trainable_index"])
        stage.checkpoint = (lambda path: None) if self.position.replica else (
            (lambda path: write_part(model, path, self.ownership)) if self.keeps_weights else
            (lambda path: self._save_whole(model, path)))
        stage.whole_checkpoint = (lambda path: None) if self.position.replica else (
            lambda path: self._save_whole(model, path))

    def _save_whole(self, model, path) -> None:
        """A whole-model save (a ModelCheckpoint's `model.save` to a .keras path, or its `save_weights` to a
        .weights.h5 one), on every stage of the first
        pipeline at the same step: each stage adds its variables and its optimizer variables (by their numbers in
        the whole model's) to what the stage before sent and hands it down; the last stage writes the whole
        model's .keras file as Keras' `model.save` does, holding every stage's values while it writes."""
        position = self.position
        self.saves += 1
        parts = {}
        if not position.first:
            parts = {k: np.array(v) for k, v in self.links.receive(SAVE, self.saves, 0, position.up).arrays.items()}
        parts.update({f"w{i}": np.asarray(v.numpy()) for i, v in zip(self.layout["weight_index"],
                                                                     self.layout["variables"])})
        parts.update({f"s{n}": np.asarray(v.numpy()) for n, v in self.ownership.slots.items()})
        if not position.last:
            self.links.send(position.down, SAVE, self.saves, 0, arrays=parts)
            return
        index_of = {id(v): i for i, v in enumerate(model.weights)}

        def whole(variable):
            key = f"w{index_of[id(variable)]}"
            if key not in parts:
                raise OptionError(f"--strategy pipeline cannot save the whole model: its variable {variable.path!r} "
                                  "is in no stage (no output of the model depends on it).")
            return parts[key]

        slots = {int(k[1:]): (lambda k=k: parts[k]) for k in sorted(parts) if k.startswith("s")}
        write_gathered(model, path, whole, slots, writer=True)

    def _give_back(self, model, stage) -> None:
        """The trained part to the kernel, or kept here (`--keep-weights engines`)."""
        if self.keeps_weights:
            self.handed_in = {"fit": self.handed_in["fit"] + 1, "kept": kept_weights.keep(
                notebook_name(model), int(self.spec["run"]), model, stage, self.layout, self.ownership)}
        else:
            self._hand_in(stage)

    def _fit_stage(self, request, stage, arrays):
        batch = int(request.batch_size or 32)
        seed = self.spec["options"].get("seed")
        seed = int(seed if seed is not None else self.spec["run"])
        train, val = arrays["train"], arrays["val"]
        train = (step_numbers(train["steps"]) if train.get("streamed") else
                 index_batches(length(train["x"]), batch, bool(request.shuffle), seed,
                               endless=request.steps_per_epoch is not None))
        if val is not None:
            val = (step_numbers(val["steps"]) if val.get("streamed") else
                   index_batches(length(val["x"]), int(request.validation_batch_size or batch), False, seed))
        kept, self.callback_changes = self._callbacks_for_stage(request)
        reporter = self.make_reporter(batch)
        steps = stage.steps
        reporter.extra = lambda: {"bytes_sent": self.links.bytes_sent, "compute_s": steps.busy_s,
                                  "comm_s": steps.step_s - steps.busy_s,
                                  "bubble": 1 - steps.busy_s / steps.step_s if steps.step_s else None}
        # Keras' own fit (the cell's fit is nbdist's), in order; IndexBatches shuffles, Keras must not
        return request.original_fit(stage, train, validation_data=val, epochs=request.epochs,
                                    initial_epoch=request.initial_epoch, steps_per_epoch=request.steps_per_epoch,
                                    validation_steps=request.validation_steps, validation_freq=request.validation_freq,
                                    verbose=0, shuffle=False,
                                    callbacks=[*kept, stop_when_stopped(steps.control), reporter])

    def _callbacks_for_stage(self, request):
        """Every stage runs the cell's callbacks on the same logs (a learning-rate change acts on every
        stage's optimizer); the file writers run on the last stage only."""
        from ..keras_semantics import callbacks

        kept, changes = callbacks.for_rank(request.callbacks, 0 if self.keeps_callbacks else self.rank + 1, self.size)
        kept = with_checkpoints(request.callbacks, kept)
        callbacks.set_monitor_directions(kept, request.model)  # a stage before the last compiles no metric
        self.files_written = ([sharded_note(w) if self.keeps_weights else w for w in callbacks.files_written(kept)]
                              if self.keeps_callbacks else [])
        return kept, changes

    def _plan(self, chain, arrays, request) -> dict:
        """Stage 0's choice of cuts, with each candidate segment's measured time and bytes."""
        requested = self.values.get("split") or "auto"
        segments = splits.stage_ranges(chain, splits.positions(chain, chain.cuttable))
        sizes = [sum(splits.layer_bytes(layer) for layer in seg) for seg in segments]
        basis, costs = "bytes", [float(s) for s in sizes]
        with contextlib.suppress(Exception):  # a part that cannot be timed alone: balance by bytes instead
            train = arrays["train"]
            sample = train["stream"].sample_x() if train.get("streamed") else train["x"]
            costs, basis = time_segments(chain, sample, int(request.batch_size or 32)), "time"
        names = [seg[-1].name for seg in segments]
        if requested == "auto":
            cuts = splits.balanced_cuts(names, costs, chain.cuttable, self.position.stages)
        else:
            cuts = splits.check_cuts(chain, [n.strip() for n in requested.split(",") if n.strip()],
                                     self.position.stages)
        return {"cuts": cuts, "cut_at": splits.positions(chain, cuts), "basis": basis, "requested": requested,
                "segments": [{"layers": [layer.name for layer in seg], "bytes": b, "cost": c}
                             for seg, b, c in zip(segments, sizes, costs)]}

    def _own(self, arrays: dict) -> dict:
        """What this stage reads of the data: the inputs on the first stage, labels and weights on the last."""
        def part(data):
            if data is not None and data.get("streamed"):  # (the first stage reads it, and hands the targets down)
                return {**data, "stream": data["stream"] if self.position.first else None}
            return None if data is None else {"x": data["x"] if self.position.first else None,
                                              "y": data["y"] if self.last else None,
                                              "sample_weight": data["sample_weight"] if self.last else None}

        return {"train": part(arrays["train"]), "val": part(arrays["val"])}

    def _hand_in(self, stage) -> None:
        """The trained part to the kernel over the stages' own wire (ipyparallel would pickle a copy of it), each
        variable's memory freed as it is taken: the engine's model is released after a pipeline fit."""
        prefix, slots = optimizer_prefix(stage.optimizer), list(stage.optimizer.variables)
        weights = [taken(v) for v in self.layout["variables"]]
        optimizer = [np.asarray(v.numpy()) for v in slots[:prefix]] + [taken(v) for v in slots[prefix:]]
        self.handed_in = {"fit": self.handed_in["fit"] + 1, "optimizer_prefix": prefix,
                          "variable_bytes": int(sum(a.nbytes for a in weights + optimizer))}
        self.links.desk.send_part(self.handed_in["fit"], weights, optimizer)

    def result(self, request, history, records, timings, states) -> FitResult:
        """History, records and callbacks; the weights went to the kernel (`_hand_in`), which puts them in."""
        stage = self.stage
        result = FitResult.collect(None, history, records, timings, states, self.files_written)
        result.parts = {"stage": self.position.stage, "replica": self.position.replica,
                        "weight_index": self.layout["weight_index"],
                        "trainable_index": self.layout["trainable_index"],
                        "busy_s": stage.steps.busy_s, "step_s": stage.steps.step_s,
                        "bytes_sent": self.links.bytes_sent, "plan": self.plan, **self.handed_in}
        if self.last:
            result.parts["metrics"] = compiled_metrics_state(stage)
        return result


def fit_arrays(request) -> dict:
    """The cell's training and validation data, as a local fit would cut them: arrays (every stage indexes the
    same batch), or a stream the first stage reads (`pipeline.streams`), with the steps a pass takes."""
    x, y = request.x, request.y
    if is_stream(x):
        train = {"streamed": True, "stream": Stream(x, request.class_weight),
                 "steps": stream_steps(x, request.steps_per_epoch, "training")}
        return {"train": train, "val": _validation(request)}
    sample_weight = request.sample_weight
    if request.class_weight:
        from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

        sample_weight = np.asarray(class_weight_to_sample_weights(rows(single_target(y)), request.class_weight))
    train = {"x": x, "y": map_leaves(rows, y), "sample_weight": map_leaves(rows, sample_weight)}
    val = _validation(request)
    if val is None and request.validation_split:
        split_at = int(np.floor(length(train["x"]) * (1.0 - request.validation_split)))
        val = {k: take(v, slice(split_at, None)) for k, v in train.items()}
        train = {k: take(v, slice(0, split_at)) for k, v in train.items()}
    return {"train": train, "val": val}


def _validation(request) -> dict | None:
    """The cell's validation data: a dataset, PyDataset or generator the first stage streams, or arrays (x, y[, w]:
    Keras' tuple) every stage indexes; None without validation_data."""
    data = request.validation_data
    if data is None:
        return None
    if is_stream(data):
        return {"streamed": True, "stream": Stream(data), "steps": stream_steps(data, request.validation_steps,
                                                                                   "validation")}
    data = tuple(data)
    return {"x": data[0], "y": map_leaves(rows, data[1]),
            "sample_weight": map_leaves(rows, data[2]) if len(data) > 2 else None}


def step_numbers(count: int):
    """A `keras.utils.PyDataset` of `count` steps whose items only count them (a streamed pass: the first stage
    reads each batch from the stream)."""
    import keras

    class StepNumbers(keras.utils.PyDataset):
        def __len__(self):
            return count

        def __getitem__(self, i):
            return np.array([i], np.int64)

    return StepNumbers()


def sharded_note(written: dict) -> dict:
    """Where a stage's callback wrote: a ModelCheckpoint's save is the index of a sharded checkpoint."""
    if written["callback"] != "ModelCheckpoint" or str(written["path"]).endswith(".keras"):
        return written  # (a whole model's .keras file: the last stage wrote it whole)
    return {**written, "path": str(index_path(written["path"])),
            "note": "a sharded checkpoint: an index and one file per stage beside it, each written by its stage; "
                    "model.load_weights(path) reads it"}


def stage_layout(model, part) -> dict:
    """Where the part's variables sit in the whole model: positions in `get_weights()` and among the
    trainable variables (the order of the optimizer's slots)."""
    own = {id(v) for v in part.weights}
    weights = [v for v in model.weights if id(v) in own]
    return {"variables": weights,
            "weight_index": [i for i, v in enumerate(model.weights) if id(v) in own],
            "trainable_index": [i for i, v in enumerate(model.trainable_variables) if id(v) in own]}


COMPILED_STATE = ("model._compile_loss", "model._compile_metrics", "model._loss_tracker")


def compiled_metrics_state(stage):
    """The last stage's compiled loss and metrics (the stage is compiled as the cell's model is, so their state
    walk addresses are the notebook model's): this replica's totals, as hfdt gives rank 0's."""
    from ..keras_semantics.state_walk import Walk, capture

    walk = Walk({"model": stage})
    others = {id(v) for a, v in walk.variables.items() if not a.startswith(COMPILED_STATE)}  # (not copied)
    return capture(walk.roots, walk=walk, skip=others).only(COMPILED_STATE)


def stage_compile_args(model, last: bool) -> dict:
    """The cell's compile arguments for a stage: a fresh copy of its optimizer on every stage, the loss
    and metrics on the last."""
    config = dict(model._compile_config.config) if getattr(model, "_compile_config", None) else {}
    optimizer = model.optimizer
    args = {"optimizer": type(optimizer).from_config(optimizer.get_config())}
    if last:
        args.update({k: config.get(k) for k in ("loss", "loss_weights", "metrics", "weighted_metrics")})
    return args


def fill_own_part(model, stage, layout, desk) -> None:
    """This stage's variables and optimizer slots, as the notebook's model held them when the cell began, fetched
    from the kernel (no engine receives the whole model). A model the notebook does not hold (the cell made it)
    keeps this engine's values, or takes its initialisers' where its weights were made empty."""
    from ..model_parts.model_sync import architecture

    name = notebook_name(model)
    weights, slots = (desk.fetch_part(name, architecture(model), layout["weight_index"], layout["trainable_index"],
                                      optimizer_prefix(stage.optimizer)) if name else (None, None))
    if desk.kept is not None:  # the weights stayed on the engines after the run that trained them last
        weights, slots = kept_weights.take(name, int(desk.kept["run"]), layout)
    for variable, value in zip(layout["variables"], weights or [None] * len(layout["variables"])):
        fill(variable, value)
    finalize_states(stage.part)  # (an adapted Normalization's statistics)
    load_slots(stage.optimizer, stage.trainable_variables, slots)


def time_segments(chain, x, batch: int) -> list[float]:
    """Each cuttable segment's forward + backward seconds on one batch (the least of a few runs)."""
    import time

    import tensorflow as tf

    cut_at = splits.positions(chain, chain.cuttable)
    segments = splits.stage_ranges(chain, cut_at)
    h = gather(x, np.arange(min(batch, length(x))))
    costs = []
    for i in range(len(segments)):
        part = splits.stage_part(chain, cut_at, i)
        best = float("inf")
        with materialized(part.weights):  # one segment's weights at a time, where the model was built empty
            for _ in range(TIMING_REPEATS + 1):  # the first call traces: not counted
                t0 = time.perf_counter()
                inputs = differentiable(h) if i else []
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    out = part(h, training=True)
                    total = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in differentiable(out)] or
                                     [tf.constant(0.0)])
                tape.gradient(total, list(part.trainable_weights) + inputs)
                best = min(best, time.perf_counter() - t0) if _ else best
        costs.append(best)
        h = out
    return costs


class PipelineStrategy(Strategy):
    """Model parallel between layers: K stages on K engines, micro-batches on the 1F1B or GPipe schedule."""

    name = "pipeline"
    summary = "model parallel between layers: K stages, micro-batches on a 1F1B or GPipe schedule"
    reads = (STAGES, MICROBATCHES, SPLIT, SCHEDULE, REPLICAS, KEEP_WEIGHTS)
    reports = Reports(panels=("loss", "throughput", "bubble"), controls=("pause", "resume", "stop"))
    worker_class = PipelineWorker
    loop_refusal = ("it cuts the model fit(...) trains into stages on different engines, and a loop of the cell's "
                    "own calls the whole model on one")
    min_workers = 2
    fills_own_part = True

    def __init__(self, values):
        super().__init__(values)
        self.book: AddressBook | None = None
        self.keep_reason: str | None = None  # why --keep-weights auto kept the weights on the engines
        self.stages: int | None = None

    def choose_workers(self, available, workers, targets):
        stages, replicas = self.value("stages"), int(self.value("replicas") or 1)
        needed = stages * replicas if stages is not None else None
        if needed is not None and workers is not None and workers != needed:
            raise OptionError(f"--strategy pipeline runs one stage per engine, --stages x --replicas engines: give "
                              f"--stages or --workers, or matching numbers. Received: --stages {stages} --replicas "
                              f"{replicas} --workers {workers}")
        count = workers if workers is not None else needed or (None if targets else 2 * replicas)
        chosen = super().choose_workers(available, count, targets)
        if len(chosen) % replicas or len(chosen) // replicas < 2:
            raise OptionError(f"--replicas {replicas} needs a multiple of {replicas} engines, at least 2 stages each. "
                              f"Received: {len(chosen)} engine(s) {chosen}.")
        return chosen

    def role(self, rank: int) -> str:
        replicas = int(self.value("replicas") or 1)
        return Position(rank, self.stages or rank + 1, replicas).role()

    def prepare(self, run, cluster) -> dict:
        key = wire.new_key()
        address = cluster.address_towards(run.workers)
        self.book = AddressBook(len(run.workers), key, self.notebook_models)
        book = self.book.start(address)
        replicas = int(self.value("replicas") or 1)
        self.stages = len(run.workers) // replicas
        return {"links": {"book": book, "key": key.hex()}, "engines": list(run.workers),
                "stages": self.stages, "replicas": replicas,
                "microbatches": int(self.value("microbatches")), "schedule": self.value("schedule"),
                "keep": self._where_weights_go()}

    def _where_weights_go(self) -> str:
        """--keep-weights, `auto` decided: the engines keep the weights of a notebook model whose weights and optimizer
        slots need more than half of the notebook host's available memory (a model the cell builds comes back)."""
        import psutil

        keep = self.value("keep_weights")
        if keep != "auto":
            return keep
        kept = [state.kept for state in self.notebook_models.values() if state.kept is not None]
        if kept:
            self.keep_reason = f"--keep-weights auto: they stayed on the engines after run {kept[0]['run']}"
            return "engines"
        needed = max((kept_weights.bytes_needed(state) for state in self.notebook_models.values()), default=0)
        available = psutil.virtual_memory().available
        if needed <= available / 2:
            return "notebook"
        self.keep_reason = (f"--keep-weights auto: {needed / 1e9:.1f} GB of weights and optimizer slots, more than "
                            f"half of the {available / 1e9:.1f} GB this host has available")
        return "engines"

    @classmethod
    def gather_result(cls, run) -> list:
        """The whole model of each `fit`: every stage's variables and optimizer slots in their places; History,
        callbacks and records from the last stage."""
        results = [run.results.get(eid) or [] for eid in run.workers]
        per_stage = [r for r in results if r and r[0].parts.get("replica", 0) == 0]  # the first pipeline's
        stages = len(run.workers) // int(run.options.get("replicas") or 1)
        if len(per_stage) != stages or any(len(r) != len(per_stage[-1]) for r in per_stage):
            return []  # a stage did not finish: there is no whole model to install
        fits = [assemble([stage_results[i] for stage_results in per_stage]) for i in range(len(per_stage[-1]))]
        for fit in fits:
            if fit.kept is not None:  # each of the first pipeline's stages kept its part on its engine
                fit.kept["engines"] = list(run.workers[:stages])
        return fits

    def finish(self, run) -> None:
        if self.book is not None:
            self.book.stop()
            for rank, eid in enumerate(run.workers):  # the stages' trained parts, which came to the book
                for result in run.results.get(eid) or []:
                    result.weights, result.optimizer_weights, _ = self.book.trained.get(
                        (rank, result.parts["fit"]), (result.weights, result.optimizer_weights, None))
            self.book = None
        fits = self.gather_result(run) if run.status == "done" else []
        if fits:
            run.plan = plan_table(fits[-1].parts["stages"])
            run.note(run.plan["text"])
        if fits and fits[-1].kept is not None:
            kept = fits[-1].kept
            why = self.keep_reason or "--keep-weights engines"
            run.note(f"nbdist: the trained weights of {kept['model']!r} stay on engines {kept['engines']}, one stage "
                     f"each ({why}); the notebook's {kept['model']} is their skeleton: "
                     f"{kept['model']}.save_weights('{kept['model']}.weights.h5') writes them as a sharded checkpoint, "
                     "and the next --strategy pipeline cell on these engines trains on from them.")


def assemble(results: list[FitResult]) -> FitResult:
    """One fit's result for the whole model from each stage's (in stage order)."""
    count = sum(len(r.parts["weight_index"]) for r in results)
    weights: list = [None] * count
    for r in results:
        for i, w in zip(r.parts["weight_index"], r.weights):
            weights[i] = w
    last = results[-1]
    if last.parts.get("kept"):
        merged = FitResult(weights=[], optimizer_weights=[], history=last.history, params=last.params,
                           epoch=last.epoch, records=last.records, timings=last.timings, callbacks=last.callbacks,
                           files=last.files, kept=dict(last.parts["kept"]))
        merged.parts = {"stages": [r.parts for r in results]}
        return merged
    prefix = last.parts["optimizer_prefix"]
    trainable = sum(len(r.parts["trainable_index"]) for r in results)
    slots: list = [None] * trainable
    per = None
    for r in results:
        own = len(r.parts["trainable_index"])
        per = slots_per_variable(len(r.optimizer_weights), prefix, own) if own else per
        for j, i in enumerate(r.parts["trainable_index"]):
            slots[i] = [r.optimizer_weights[k] for k in slot_indices(prefix, per, j)]
    optimizer = list(last.optimizer_weights[:prefix]) + [s for group in slots if group for s in group]
    merged = FitResult(weights=weights, optimizer_weights=optimizer, history=last.history, params=last.params,
                       epoch=last.epoch, records=last.records, timings=last.timings, callbacks=last.callbacks,
                       files=last.files)
    merged.parts = {"stages": [r.parts for r in results], "metrics": last.parts.get("metrics")}
    return merged


def plan_table(stages: list[dict]) -> dict:
    """The split as the cell prints it: each stage's layers, parameter bytes, measured time, busy fraction."""
    plan = stages[0]["plan"]
    segments = plan["segments"]
    ends = plan["cuts"] + [segments[-1]["layers"][-1]]
    rows, start = [], 0
    for s, end in enumerate(ends):
        stop = next(i for i, seg in enumerate(segments) if seg["layers"][-1] == end) + 1
        own = segments[start:stop]
        layers = [name for seg in own for name in seg["layers"]]
        part = stages[s]
        rows.append({"stage": s, "layers": layers, "bytes": sum(seg["bytes"] for seg in own),
                     "cost_s": sum(seg["cost"] for seg in own) if plan["basis"] == "time" else None,
                     "busy": part["busy_s"] / part["step_s"] if part["step_s"] else None,
                     "bytes_sent": part["bytes_sent"]})
        start = stop
    lines = [f"nbdist: pipeline split ({'--split auto, balanced by measured time' if plan['requested'] == 'auto' and plan['basis'] == 'time' else '--split auto, balanced by parameter bytes' if plan['requested'] == 'auto' else '--split ' + plan['requested']}): "
             f"cut after {', '.join(plan['cuts'])}",
             f"  {'stage':>5}  {'layers':<40} {'params MB':>9} {'time ms':>8} {'busy':>5} {'sent MB':>8}"]
    for row in rows:
        names = ", ".join(row["layers"])
        names = names if len(names) <= 40 else names[:37] + "..."
        cost = f"{row['cost_s'] * 1e3:8.2f}" if row["cost_s"] is not None else f"{'-':>8}"
        busy = f"{row['busy']:5.0%}" if row["busy"] is not None else f"{'-':>5}"
        lines.append(f"  {row['stage']:>5}  {names:<40} {row['bytes'] / 1e6:9.3f} {cost} {busy} "
                     f"{row['bytes_sent'] / 1e6:8.2f}")
    return {"cuts": plan["cuts"], "basis": plan["basis"], "stages": rows, "text": "\n".join(lines)}
