"""Trained weights that stay on the engines (`--strategy pipeline --keep-weights engines`): for a model the
notebook's host cannot hold, or need not.

Engine side: each stage keeps its trained part (`keep`) instead of handing it to the kernel; `write` writes it as
its file of a sharded checkpoint (`sharded_checkpoint.write_part`); the next pipeline run of the model takes it
back (`take`), on the same engines with the same split.

Kernel side: the notebook's model becomes its skeleton (`hold`): built, compiled, its values released, and marked
with where its weights are (`model._nbdist_kept`). Its `save_weights` asks every stage to write its part,
`load_weights` brings a checkpoint's values back into the notebook, and what needs the values here says so.
"""

from __future__ import annotations

import socket

from ..errors import OptionError

KEPT: dict[str, dict] = {}  # engine side: model name -> this stage's kept part


# -- engine side ---------------------------------------------------------------------------
def keep(name: str, run: int, model, stage, layout: dict, ownership) -> dict:
    """This stage's trained part of `model` (named `name` in the notebook) stays here; what the kernel is told."""
    KEPT[name] = {"run": run, "model": model, "stage": stage, "layout": layout, "ownership": ownership}
    return {"model": name, "run": run}


def write(name: str, run: int, filepath: str) -> dict:
    """This stage's kept part of model `name` to its file of the sharded checkpoint at `filepath` (the last stage
    also writes the index); where it wrote."""
    from .sharded_checkpoint import shard_path, write_part

    part = _kept(name, run)
    index = write_part(part["model"], filepath, part["ownership"])
    return {"index": str(index), "file": str(shard_path(index, part["ownership"].me)), "host": socket.gethostname()}


def take(name: str, run: int, layout: dict) -> tuple[list, list]:
    """The kept values of this stage's variables and optimizer slots (`layout`: the new run's), each let go here as
    it is taken; refused, saying what to do, where this engine kept another part."""
    from .desk import taken

    part = _kept(name, run)
    if part["layout"]["weight_index"] != layout["weight_index"]:
        raise OptionError(f"this engine kept another part of {name!r} (the layers of another stage): run the "
                          "pipeline on the same engines in the same order with the same --split as run "
                          f"{run}, or write the weights with {name}.save_weights(path) and read them with "
                          f"{name}.load_weights(path) first")
    weights = [taken(v) for v in part["layout"]["variables"]]
    slots = [taken(v) for v in part["stage"].optimizer.variables]
    KEPT.pop(name)
    return weights, slots


def _kept(name: str, run: int) -> dict:
    part = KEPT.get(name)
    if part is None or part["run"] != run:
        held = f"only run {part['run']}'s weights of {name!r}" if part else f"no weights of {name!r}"
        raise OptionError(f"this engine holds {held}, not run {run}'s (the engine restarted, or another run took "
                          f"them): they are lost. Train {name!r} again from the notebook's definition cells.")
    return part


# -- kernel side ---------------------------------------------------------------------------
def bytes_needed(state) -> int:
    """What the notebook needs to hold a model of `state` (`model_sync.ModelState`) after training: its weights and
    its optimizer's variables (three times the weights where the optimizer has none yet, as Adam's two slots)."""
    weights = sum(a.nbytes for a in state.weights or [])
    return weights + (sum(a.nbytes for a in state.optimizer) if state.optimizer is not None else 2 * weights)


def hold(model, kept: dict, client) -> None:
    """The notebook's `model` as the skeleton of a model whose weights stay on the engines `kept["engines"]`."""
    from .desk import free_values

    free_values(model)
    model._nbdist_kept = dict(kept)

    def save_weights(filepath, overwrite=True, max_shard_size=None):
        """Every stage writes its part to its own file beside `filepath`; the last the index (the checkpoint's
        path)."""
        calls = [client[eid].apply_async(write, kept["model"], kept["run"], str(filepath)) for eid in kept["engines"]]
        written = [call.get(timeout=600) for call in calls]
        print(f"nbdist: {kept['model']}'s weights, kept on engines {kept['engines']}, written as a sharded checkpoint: "
              f"{written[-1]['index']} (the index) and one file per stage, each by its engine "
              f"({', '.join(w['file'] + ' on ' + w['host'] for w in written)}); "
              f"{kept['model']}.load_weights({written[-1]['index']!r}) reads it")
        return written[-1]["index"]

    def load_weights(filepath, *args, **kwargs):
        """The checkpoint's values into the notebook's model, which holds its weights here again."""
        release_hold(model)
        return model.load_weights(filepath, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise OptionError(f"the weights of {kept['model']!r} stay on engines {kept['engines']} (run {kept['run']}, "
                          f"--keep-weights engines): {kept['model']}.save_weights('name.weights.h5') writes them "
                          "there as a sharded checkpoint, which load_weights reads into the notebook, or a next "
                          "%%distribute --strategy pipeline cell trains on from them")

    model.save_weights, model.load_weights = save_weights, load_weights
    for method in ("get_weights", "save", "predict", "evaluate", "export"):
        setattr(model, method, refuse)


def release_hold(model) -> None:
    """`model` holds its own weights again (their initialisers' values until given others): its own methods back,
    the marker gone. Nothing to do for a model that holds them."""
    from ..keras_semantics.empty_weights import fill

    if kept_of(model) is None:
        return
    for variable in list(model.weights) + list(getattr(model.optimizer, "variables", None) or []):
        fill(variable)
    for method in ("save_weights", "load_weights", "get_weights", "save", "predict", "evaluate", "export"):
        model.__dict__.pop(method, None)
    model.__dict__.pop("_nbdist_kept", None)


def kept_of(model) -> dict | None:
    """Where `model`'s weights stay, if on engines."""
    return getattr(model, "_nbdist_kept", None)
