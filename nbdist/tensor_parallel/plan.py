"""Which layers of a Sequential or functional model `tensor` splits across N engines, and how (a pure function).

- `Dense` is split by output units (column), or, right after a column-split `Dense` whose activation
  is elementwise and whose output it alone takes, by input units (row): the pair needs one
  collective forward and one backward, as Megatron-LM pairs them (a transformer's MLP).
- `MultiHeadAttention` is split by heads: the query, key and value projections by heads, the
  output projection by its input (the heads' rows), Megatron-LM's attention pair: one
  allreduce forward, one backward.
- `Embedding` is split by output dimension, `Conv2D` by filters, `EinsumDense` by an output axis its kernel
  alone gives (one the input does not have: `einsum_split`), its slices gathered along that axis.
- `auto` splits every such layer holding at least 1/8 of the parameter bytes of the model's largest
  layer (a deep model of equal layers has all split, a small head stays whole); names split the
  layers named. Every other layer (LayerNormalization, residual adds, ...) is replicated, with the
  reason.
"""

from __future__ import annotations

from ..empty_weights import variable_bytes
from ..errors import OptionError

AUTO_SHARE = 1 / 8
ELEMENTWISE = {"linear", "relu", "relu6", "gelu", "tanh", "sigmoid", "elu", "selu", "swish", "silu", "softplus",
               "leaky_relu", "hard_sigmoid", "mish"}
SPLITTABLE = {"Dense": "column", "Embedding": "embedding", "Conv2D": "conv", "MultiHeadAttention": "heads",
              "EinsumDense": "einsum"}
WIDTH = {"Dense": "units", "Embedding": "output_dim", "Conv2D": "filters", "MultiHeadAttention": "num_heads"}
# how each kind cuts its variables (in the layer's order): the axis of each slice, None for replicated
AXES = {"column": (-1, 0), "row": (0, None), "embedding": (-1,), "conv": (-1, 0)}
# an attention layer's variables by their sublayer: projections to heads by the heads axis, the output
# projection by its heads rows, its bias replicated (added once, after the sum over the engines)
HEAD_AXES = {("query", "kernel"): 1, ("key", "kernel"): 1, ("value", "kernel"): 1, ("query", "bias"): 0,
             ("key", "bias"): 0, ("value", "bias"): 0, ("attention_output", "kernel"): 0,
             ("attention_output", "bias"): None}


def split_axes(kind: str, layer) -> list[int | None]:
    """The axis each of `layer`'s variables is split along under `kind` (None: replicated), in their order."""
    if kind == "heads":
        return [HEAD_AXES[tuple(w.path.split("/")[-2:])] for w in layer.weights]
    if kind == "einsum":
        split = einsum_split(layer.get_config())
        return [split["kernel_axis"], split["bias_axis"]][:len(layer.weights)]
    return list(AXES.get(kind) or [None] * len(layer.weights))


def einsum_split(config: dict) -> dict:
    """How an `EinsumDense` (its config) splits: along an output axis that only its kernel gives (the last such),
    {"letter", "kernel_axis", "output_axis" (negative, in the output), "shape_index" (in its output_shape),
    "bias_axis" (None: its bias does not vary along it, and is added after the gather)}; {"reason"} where none."""
    import re

    equation = config["equation"]
    match = re.match(r"^([a-zA-Z.]+),([a-zA-Z]+)->([a-zA-Z.]+)$", equation.replace(" ", ""))
    if match is None:
        return {"reason": f"its equation {equation!r} is not one tensor splits (input,kernel->output)"}
    source, kernel, output = match.groups()
    if "..." in output and not output.startswith("..."):
        return {"reason": f"its equation {equation!r} elides its last axes"}
    letters = output.replace("...", "")
    own = [c for c in letters if c in kernel and c not in source.replace("...", "")]
    if not own:
        return {"reason": f"no output axis of {equation!r} comes from its kernel alone"}
    letter = own[-1]
    shape = config["output_shape"]
    shape = [shape] if isinstance(shape, int) else list(shape)
    index = letters.index(letter) - (0 if output.startswith("...") else 1)  # (output_shape leaves out the batch)
    bias = config.get("bias_axes") or ""
    first = min((letters.find(c) for c in bias), default=0)
    return {"letter": letter, "kernel_axis": kernel.index(letter), "output_axis": letters.index(letter) - len(letters),
            "shape_index": index, "width": shape[index],
            "bias_axis": letters[first:].index(letter) if letter in bias else None}


def nbytes(layer) -> int:
    return sum(variable_bytes(w) for w in layer.weights)


def activation_name(layer) -> str:
    act = getattr(layer, "activation", None)
    return getattr(act, "__name__", str(act)) if act is not None else "linear"


def plan_splits(model, size: int, requested: str = "auto") -> list[dict]:
    """One entry per layer of `model` (a `keras.Sequential` or functional model, in `model.layers`' order): name,
    class, kind (column, row, heads, embedding, conv or replicated), reason (why replicated), bytes (all ranks)
    and bytes per engine."""
    import keras

    if not isinstance(model, keras.Sequential) and not hasattr(model, "_nodes_by_depth"):
        raise OptionError("--strategy tensor splits the layers of a keras.Sequential or functional model; this cell's "
                          f"model is a {type(model).__name__} (subclassed: no graph of layers to follow). Write it as "
                          "a functional model (keras.Model(inputs, outputs)), or train it with hfdt.")
    layers = list(model.layers)
    sequential = isinstance(model, keras.Sequential)
    largest = max([nbytes(layer) for layer in layers] or [1])
    named = None if requested in (None, "", "auto") else [n.strip() for n in str(requested).split(",") if n.strip()]
    if named:
        unknown = [n for n in named if n not in {layer.name for layer in layers}]
        if unknown:
            raise OptionError(f"--split-layers names {', '.join(unknown)}, not layers of the model; its layers: "
                              f"{', '.join(layer.name for layer in layers)}.")
    plan, previous, previous_layer = [], None, None
    for layer in layers:
        chained = sequential or _feeds_only(previous_layer, layer)  # a row split takes its input's slice only
        entry = _entry(layer, size, largest, named, previous if chained else None)
        plan.append(entry)
        previous, previous_layer = entry, layer
    return plan


def _feeds_only(before, layer) -> bool:
    """Whether, in a functional model, `before`'s output goes to `layer` alone and is all `layer` takes in: then
    `before`'s output slices may stay split into `layer`'s rows."""
    if before is None or len(before._outbound_nodes) != 1 or len(layer._inbound_nodes) != 1:
        return False
    node = layer._inbound_nodes[0]
    return before._outbound_nodes[0] is node and [p.operation for p in node.parent_nodes] == [before]


def _entry(layer, size: int, largest: int, named, previous) -> dict:
    kind, reason = _kind(layer, size, largest, named, previous)
    own = nbytes(layer)
    return {"name": layer.name, "class": type(layer).__name__, "kind": kind, "reason": reason, "bytes": own,
            "bytes_per_engine": own if kind == "replicated" else _split_bytes(layer, kind, size),
            "gathers": kind in ("column", "embedding", "conv", "einsum"),
            # a column-split Dense may hand its slice on to a row-split Dense if its activation is elementwise
            "pairs": kind == "column" and activation_name(layer) in ELEMENTWISE}


def _kind(layer, size: int, largest: int, named, previous) -> tuple[str, str | None]:
    cls = type(layer).__name__
    wanted = layer.name in named if named else bool(layer.weights) and nbytes(layer) >= AUTO_SHARE * largest
    if not wanted:
        return "replicated", None if named else "small"
    if cls not in SPLITTABLE:
        return "replicated", (f"a {cls} cannot be split (tensor splits Dense, EinsumDense, MultiHeadAttention, "
                              "Embedding and Conv2D)")
    if cls == "MultiHeadAttention" and (layer.dropout or getattr(layer, "_use_gate", False)):
        return "replicated", ("its attention dropout draws one mask over all heads" if layer.dropout else
                              "its gate multiplies all heads' output before the output projection")
    if cls == "EinsumDense":
        split = einsum_split(layer.get_config())
        if "reason" in split:
            return "replicated", split["reason"]
        if split["width"] is None or split["width"] % size:
            return "replicated", f"its output axis {split['letter']!r} ({split['width']}) is not a multiple of {size} engines"
        return "einsum", None
    if cls == "Dense" and previous is not None and previous["kind"] == "column" and previous["pairs"]:
        previous["gathers"] = False  # its output stays split: this layer takes its slice by rows
        return "row", None
    width = WIDTH[cls]
    if getattr(layer, width) % size:
        return "replicated", f"its {width} ({getattr(layer, width)}) is not a multiple of {size} engines"
    return SPLITTABLE[cls], None


def _split_bytes(layer, kind: str, size: int) -> int:
    return sum(variable_bytes(w) // (1 if axis is None else size) for w, axis in zip(layer.weights,
                                                                                    split_axes(kind, layer)))
