"""Which layers of a Sequential model `tensor` splits across N engines, and how (a pure function).

- `Dense` is split by output units (column), or, right after a column-split `Dense` whose
  activation is elementwise, by input units (row): the pair needs one collective forward
  and one backward, as Megatron-LM pairs them.
- `Embedding` is split by output dimension, `Conv2D` by filters.
- `auto` splits every such layer whose kernel holds at least 1/8 of the model's parameter
  bytes; names split the layers named. Every other layer is replicated, with the reason.
"""

from __future__ import annotations

from ..errors import OptionError

AUTO_SHARE = 1 / 8
ELEMENTWISE = {"linear", "relu", "relu6", "gelu", "tanh", "sigmoid", "elu", "selu", "swish", "silu", "softplus",
               "leaky_relu", "hard_sigmoid", "mish"}
SPLITTABLE = {"Dense": "column", "Embedding": "embedding", "Conv2D": "conv"}
# how each kind cuts its variables (in the layer's order): the axis of each slice, None for replicated
AXES = {"column": (-1, 0), "row": (0, None), "embedding": (-1,), "conv": (-1, 0), "replicated": None}


def nbytes(layer) -> int:
    return sum(int(w.numpy().nbytes) if hasattr(w, "numpy") else 0 for w in layer.weights)


def activation_name(layer) -> str:
    act = getattr(layer, "activation", None)
    return getattr(act, "__name__", str(act)) if act is not None else "linear"


def plan_splits(model, size: int, requested: str = "auto") -> list[dict]:
    """One entry per layer of `model` (a `keras.Sequential`): name, class, kind (column, row, embedding,
    conv or replicated), reason (why replicated), bytes (all ranks) and bytes per engine."""
    import keras

    if not isinstance(model, keras.Sequential):
        raise OptionError("--strategy tensor splits the layers of a keras.Sequential model; this cell's model is "
                          f"a {type(model).__name__}. Use --strategy pipeline for a functional model too large for "
                          "one engine, or hfdt to train it data parallel.")
    layers = list(model.layers)
    total = sum(nbytes(layer) for layer in layers) or 1
    named = None if requested in (None, "", "auto") else [n.strip() for n in str(requested).split(",") if n.strip()]
    if named:
        unknown = [n for n in named if n not in {layer.name for layer in layers}]
        if unknown:
            raise OptionError(f"--split-layers names {', '.join(unknown)}, not layers of the model; its layers: "
                              f"{', '.join(layer.name for layer in layers)}.")
    plan, previous = [], None
    for layer in layers:
        entry = _entry(layer, size, total, named, previous)
        plan.append(entry)
        previous = entry
    return plan


def _entry(layer, size: int, total: int, named, previous) -> dict:
    kind, reason = _kind(layer, size, total, named, previous)
    own = nbytes(layer)
    return {"name": layer.name, "class": type(layer).__name__, "kind": kind, "reason": reason, "bytes": own,
            "bytes_per_engine": own if kind == "replicated" else _split_bytes(layer, kind, size),
            "gathers": kind in ("column", "embedding", "conv"),
            # a column-split Dense may hand its slice on to a row-split Dense if its activation is elementwise
            "pairs": kind == "column" and activation_name(layer) in ELEMENTWISE}


def _kind(layer, size: int, total: int, named, previous) -> tuple[str, str | None]:
    cls = type(layer).__name__
    wanted = layer.name in named if named else bool(layer.weights) and nbytes(layer) >= AUTO_SHARE * total
    if not wanted:
        return "replicated", None if named else "small"
    if cls not in SPLITTABLE:
        return "replicated", f"a {cls} cannot be split (tensor splits Dense, Embedding and Conv2D)"
    if cls == "Dense" and previous is not None and previous["kind"] == "column" and previous["pairs"]:
        previous["gathers"] = False  # its output stays split: this layer takes its slice by rows
        return "row", None
    width = {"Dense": "units", "Embedding": "output_dim", "Conv2D": "filters"}[cls]
    if getattr(layer, width) % size:
        return "replicated", f"its {width} ({getattr(layer, width)}) is not a multiple of {size} engines"
    return SPLITTABLE[cls], None


def _split_bytes(layer, kind: str, size: int) -> int:
    weights = [w.numpy() for w in layer.weights]
    return sum(w.nbytes if axis is None else w.nbytes // size for w, axis in zip(weights, AXES[kind]))
