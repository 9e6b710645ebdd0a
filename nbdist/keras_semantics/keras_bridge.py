"""Where nbdist meets Keras: `fit` interception, argument checks, the result a worker returns and the model built
for training (the results are installed in the notebook's model by `nbdist.notebook.results`)."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..datasets import structures
from ..datasets.sharding import first_batch, is_dataset, is_generator, is_py_dataset
from ..errors import OptionError

# Every argument of Keras' own `fit`: each worker runs that `fit`, so each is honoured (a strategy
# that cannot honour one refuses it by name, see `Strategy.refuse`).
FIT_ARGS = (
    "x", "y", "batch_size", "epochs", "verbose", "callbacks", "validation_split", "validation_data", "shuffle",
    "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch", "validation_steps",
    "validation_batch_size", "validation_freq",
)


@dataclass
class FitRequest:
    """One `model.fit(...)` call made by the training cell, with its arguments bound by name."""

    model: Any
    args: dict
    original_fit: Callable
    chosen: frozenset = frozenset()  # the arguments given a value other than Keras' default

    def __getattr__(self, name):  # request.epochs, request.batch_size, ...
        try:
            return self.__dict__["args"][name]
        except KeyError:
            raise AttributeError(name) from None

    def given(self, name: str) -> bool:
        """Whether the cell gave `name` a value other than Keras' default."""
        return name in self.chosen

    @property
    def samples_per_step(self) -> int | None:
        """The global batch size of one step, when it can be known before training."""
        if is_py_dataset(self.args["x"]) or is_generator(self.args["x"]):
            return None
        if is_dataset(self.args["x"]):
            dims = getattr(structures.first_leaf(self.args["x"].element_spec), "shape", None)
            return int(dims[0]) if dims is not None and len(dims) and dims[0] is not None else None
        return int(self.args["batch_size"] or 32)

    def run_plain(self, **overrides):
        """Call Keras' own `fit` with the cell's arguments, some replaced."""
        return self.original_fit(self.model, **{**self.args, **overrides})


@dataclass
class FitResult:
    """What a worker sends back for one `fit` call: the trained state, History, metrics.

    `state` is the state walk's capture of everything the fit's model reaches (layers, its optimizers, metrics,
    seed generators: `state_walk`), installed in the notebook's model by address; `weights` and `optimizer_weights`
    are the model's weights (`model.weights` order, what `model.set_weights` takes) and its optimizer's variables,
    the same arrays where `state` holds them, or joined by a model-parallel strategy from its engines' parts."""

    weights: list
    optimizer_weights: list
    history: dict
    params: dict
    epoch: list
    records: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    callbacks: list = field(default_factory=list)  # each user callback's state after training (rank 0's)
    files: list = field(default_factory=list)  # where file-writing callbacks wrote: [{"callback", "path", "host"}]
    parts: dict = field(default_factory=dict)  # a model-parallel worker's share: where its variables go, its timings
    kept: dict | None = None  # the weights stayed on the engines (`kept_weights`): where
    loop: dict | None = None  # a cell that stepped its optimizers itself: {"snapshots": {statement: Snapshot},
    # "steps", "stopped", "shards"} (`cell_runner`); the notebook installs the snapshots instead of the loop
    state: Any = None  # the fit's model's `state_walk.State` (None: a model-parallel worker's, whose parts are joined)
    cell_state: Any = None  # the last fit's only: what else of the cell's names changed (`state_walk.State`)

    @staticmethod
    def pack(results: list) -> list:
        """Results as ipyparallel sends them without copying: every array a top-level item, once however often it
        is named (it pickles anything nested, so a copy of every weight would be made on the engine), the results
        without them first. (A list of 64 items or more it pickles whole: a model of many variables still pays the
        copy.)"""
        arrays: list = []
        index: dict[int, int] = {}

        def out(values):
            places = []
            for value in values:
                if id(value) not in index:
                    index[id(value)] = len(arrays)
                    arrays.append(value)
                places.append(index[id(value)])
            return places

        def out_state(state):
            if state is None:
                return None
            return replace(state, values=dict(zip(state.values, out(state.values.values()))))

        shells = [replace(r, state=out_state(r.state), cell_state=out_state(r.cell_state), weights=out(r.weights),
                          optimizer_weights=out(r.optimizer_weights)) for r in results]
        return [shells, *arrays]

    @staticmethod
    def unpack(packed: list) -> list:
        """The results `pack` sent."""
        shells, arrays = packed[0], packed[1:]

        def state_of(state):
            return None if state is None else replace(state, values={a: arrays[i] for a, i in state.values.items()})

        return [replace(r, state=state_of(r.state), cell_state=state_of(r.cell_state),
                        weights=[arrays[i] for i in r.weights],
                        optimizer_weights=[arrays[i] for i in r.optimizer_weights]) for r in shells]

    @classmethod
    def collect(cls, model, history, records=(), timings=None, callbacks=(), files=()) -> "FitResult":
        """The fit's result from the trained `model` (None: a model-parallel worker, whose parts went to the kernel
        by `nbdist.model_parts.desk`)."""
        from .state_walk import Walk, capture

        state = weights = optimizer_weights = None
        if model is not None:
            walk = Walk({"model": model})
            state = capture(walk.roots, walk=walk)
            optimizer = getattr(model, "optimizer", None)
            weights = [state.values[walk.address_of(w)] for w in model.weights]
            optimizer_weights = ([state.values[walk.address_of(v)] for v in optimizer.variables]
                                 if optimizer is not None else [])
        return cls(
            weights=weights or [],
            optimizer_weights=optimizer_weights or [],
            history={k: [float(v) for v in vals] for k, vals in history.history.items()},
            params=dict(history.params or {}),
            epoch=list(history.epoch),
            records=list(records),
            timings=dict(timings or {}),
            callbacks=list(callbacks),
            files=list(files),
            state=state,
        )


def bind_fit_arguments(original_fit: Callable, model, args: tuple, kwargs: dict) -> FitRequest:
    """Bind a `fit` call's arguments by name, and note which ones the cell chose."""
    signature = inspect.signature(original_fit)
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError as exc:
        raise OptionError(f"model.fit(...) was called with arguments Keras does not accept: {exc}") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    values.pop(next(iter(signature.parameters)))  # self
    chosen = frozenset(name for name, value in values.items() if _differs(value, signature.parameters[name].default))
    return FitRequest(model=model, args={k: values[k] for k in FIT_ARGS if k in values}, original_fit=original_fit,
                      chosen=chosen)


@contextlib.contextmanager
def intercept_fit(handler: Callable[[FitRequest], Any]):
    """Within the block, `keras.Model.fit(...)` calls `handler(FitRequest)` and returns its result."""
    import keras

    original = keras.Model.fit

    def fit(self, *args, **kwargs):
        return handler(bind_fit_arguments(original, self, args, kwargs))

    fit.__doc__ = original.__doc__
    keras.Model.fit = fit
    try:
        yield
    finally:
        keras.Model.fit = original


def other_optimizers(model) -> dict:
    """The optimizers a model holds besides `model.optimizer`, by attribute (a GAN's `d_optimizer` and
    `g_optimizer`, which its own `train_step` applies)."""
    import keras

    main = getattr(model, "optimizer", None)
    return {name: value for name, value in vars(model).items()
            if isinstance(value, keras.optimizers.Optimizer) and value is not main and not name.startswith("_")}


@contextlib.contextmanager
def apply_gradients_restored(model):
    """Within the block a strategy may replace the `apply_gradients` of `model.optimizer` (and of the model's
    other optimizers) and `jit_compile`; after it all are back as they were and the train function is
    retraced, on both sides of the block."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:  # not compiled: Keras' own fit says so
        yield
        return
    optimizers = [optimizer, *other_optimizers(model).values()]
    originals, jit = [o.apply_gradients for o in optimizers], model.jit_compile
    model.train_function = None
    try:
        yield
    finally:
        for each, original in zip(optimizers, originals):
            each.apply_gradients = original
        model.jit_compile = jit
        model.train_function = None


def build_for_training(model, x) -> None:
    """Make sure `model` has its variables (a subclassed model is called on `x[:1]`), and its optimizer where Keras'
    own train step steps it (it would build it at its first step; built now, every rank starts from the same
    variables). A model whose own `train_step` may step other optimizers keeps its optimizer as it is: one that no
    step uses (a GAN's default RMSprop beside its own two) stays unbuilt, as a local fit leaves it."""
    if not model.built:
        build_from_sample(model, x)
    if keras_train_step(model) and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def keras_train_step(model) -> bool:
    """Whether `model` trains with Keras' own `train_step` (not one of its class's)."""
    return (getattr(type(model).train_step, "__module__", "") or "").startswith("keras.")


def build_from_sample(model, sample_input):
    """Build a subclassed model by calling it once on one example of the training input. A model with no
    `call` of its own (a GAN whose `train_step` drives its sub-models) has its sub-models' variables: nothing
    to call."""
    import keras

    if type(model).call is keras.Model.call:
        return
    if sample_input is None:
        raise OptionError("The model has no weights yet and the training input is unknown; build it before fit.")
    if is_dataset(sample_input) or is_py_dataset(sample_input):
        sample_input = first_batch(sample_input)[0]
    model(structures.take(sample_input, slice(0, 1)))


def _differs(value, default) -> bool:
    if value is default:
        return False
    try:
        return bool(value != default)
    except Exception:  # arrays and the like: anything given is a choice
        return True


def short(value, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters (for refusals that echo a value)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
