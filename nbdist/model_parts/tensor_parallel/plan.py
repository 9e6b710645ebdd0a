"""Which layers of a model `tensor` splits across N engines, and how (a pure function of the model).

The layers are found where they sit in the model's layer tree (`leaf_layers`): a Sequential's or functional
model's layers, a subclassed model's attributes, the layers of models nested in them, a library's subclasses.

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

from ...keras_semantics.empty_weights import variable_bytes
from ...errors import OptionError

AUTO_SHARE = 1 / 8
ELEMENTWISE = {"linear", "relu", "relu6", "gelu", "tanh", "sigmoid", "elu", "selu", "swish", "silu", "softplus",
               "leaky_relu", "hard_sigmoid", "mish"}
SPLITTABLE = {"Dense": "column", "Embedding": "embedding", "Conv2D": "conv", "MultiHeadAttention": "heads",
              "EinsumDense": "einsum"}
WIDTH = {"Dense": "units", "Embedding": "output_dim", "Conv2D": "filters", "MultiHeadAttention": "num_heads"}
# how each kind cuts its variables (in the layer's order): the axis of each slice, None for replicated
AXES = {"column": (-1, 0), "row": (0, None), "embedding": (-1,), "conv": (-1, 0)}
# an attention layer's projections (kernel axis, bias axis): to heads by the heads axis, the output projection
# by its heads rows, its bias replicated (added once, after the sum over the engines)
HEAD_AXES = {"query": (1, 0), "key": (1, 0), "value": (1, 0), "output": (0, None)}


def split_axes(kind: str, layer) -> list[int | None]:
    """The axis each of `layer`'s variables is split along under `kind` (None: replicated), in their order."""
    if kind == "heads":
        axes = {}
        for name, (kernel_axis, bias_axis) in HEAD_AXES.items():
            projection = getattr(layer, f"_{name}_dense")
            axes.update(zip(map(id, projection.weights), (kernel_axis, bias_axis)))
        return [axes.get(id(w)) for w in layer.weights]
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


def leaf_layers(model) -> list[tuple[str, object, object]]:
    """Every layer `tensor` plans for, where it sits in `model`'s layer tree, in a fixed order: (its name, with the
    names of the models or layers holding it, "backbone/dense"; the layer; the layer or model holding it). A
    splittable layer (Dense, EinsumDense, MultiHeadAttention, Embedding, Conv2D, or a library's subclass) is a
    leaf; a nested model or a layer holding layers is entered (also one called more than once, a siamese tower:
    each call's collectives are named apart, `layers.call_tag`); a layer reached twice is planned once."""
    import keras

    leaves, seen = [], set()

    def walk(container, prefix: str):
        children = container.layers if isinstance(container, keras.Model) else \
            container._flatten_layers(include_self=False, recursive=False)  # (a Sequential's leave out its input)
        for layer in children:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            if isinstance(layer, _FAMILIES(keras)) or not list(
                    layer._flatten_layers(include_self=False, recursive=False)):
                leaves.append((f"{prefix}{layer.name}", layer, container))
            else:
                walk(layer, f"{prefix}{layer.name}/")

    walk(model, "")
    return leaves


def _FAMILIES(keras) -> tuple:
    layers = keras.layers
    return layers.Dense, layers.EinsumDense, layers.MultiHeadAttention, layers.Embedding, layers.Conv2D


def family(layer) -> str | None:
    """The Keras class `layer` is (or subclasses) among those tensor splits, by name."""
    import keras

    return next((cls.__name__ for cls in _FAMILIES(keras) if isinstance(layer, cls)), None)


def plan_splits(model, size: int, requested: str = "auto") -> list[dict]:
    """One entry per layer of `model`'s layer tree (`leaf_layers`: a Sequential, functional or subclassed model, and
    the models nested in it): name, class, kind (column, row, heads, embedding, conv, einsum or replicated), reason
    (why replicated), bytes (all ranks) and bytes per engine. A Dense splits by rows after a column-split one only
    where the graph shows that the second takes the first's output alone (a Sequential's or functional model's
    layers); a subclassed model's `call` is not a graph, so there each split layer gathers its own output."""
    import keras

    leaves = leaf_layers(model)
    largest = max([nbytes(layer) for _, layer, _ in leaves] or [1])
    named = None if requested in (None, "", "auto") else [n.strip() for n in str(requested).split(",") if n.strip()]
    if named:
        known = {name for name, _, _ in leaves} | {layer.name for _, layer, _ in leaves}
        unknown = [n for n in named if n not in known]
        if unknown:
            raise OptionError(f"--split-layers names {', '.join(unknown)}, not layers of the model; its layers: "
                              f"{', '.join(name for name, _, _ in leaves)}.")
        named = [n.rsplit("/", 1)[-1] if n in {name for name, _, _ in leaves} and "/" in n else n for n in named]
    shared = _shared_variables(leaves)
    plan, previous, previous_layer, previous_container = [], None, None, None
    for name, layer, container in leaves:
        graph = isinstance(container, keras.Sequential) or hasattr(container, "_nodes_by_depth")
        chained = container is previous_container and graph and (
            isinstance(container, keras.Sequential) or _feeds_only(previous_layer, layer))
        entry = _entry(layer, size, largest, named, previous if chained else None, shared)
        entry["name"] = name
        plan.append(entry)
        previous, previous_layer, previous_container = entry, layer, container
    return plan


def _shared_variables(leaves) -> set[int]:
    """The ids of variables more than one planned layer holds (tied weights: splitting one layer would cut the
    other's)."""
    counts: dict[int, int] = {}
    for _, layer, _ in leaves:
        for variable in {id(w) for w in layer.weights}:
            counts[variable] = counts.get(variable, 0) + 1
    return {v for v, n in counts.items() if n > 1}


def _feeds_only(before, layer) -> bool:
    """Whether, in a functional model, `before`'s output goes to `layer` alone and is all `layer` takes in: then
    `before`'s output slices may stay split into `layer`'s rows."""
    if before is None or len(before._outbound_nodes) != 1 or len(layer._inbound_nodes) != 1:
        return False
    node = layer._inbound_nodes[0]
    return before._outbound_nodes[0] is node and [p.operation for p in node.parent_nodes] == [before]


def _entry(layer, size: int, largest: int, named, previous, shared: set[int]) -> dict:
    kind, reason = _kind(layer, size, largest, named, previous, shared)
    own = nbytes(layer)
    return {"name": layer.name, "class": type(layer).__name__, "kind": kind, "reason": reason, "bytes": own,
            "bytes_per_engine": own if kind == "replicated" else _split_bytes(layer, kind, size),
            "gathers": kind in ("column", "embedding", "conv", "einsum"),
            # a column-split Dense may hand its slice on to a row-split Dense if its activation is elementwise
            "pairs": kind == "column" and activation_name(layer) in ELEMENTWISE}


def _kind(layer, size: int, largest: int, named, previous, shared: set[int]) -> tuple[str, str | None]:
    cls = family(layer)
    wanted = layer.name in named if named else bool(layer.weights) and nbytes(layer) >= AUTO_SHARE * largest
    if not wanted:
        return "replicated", None if named else "small"
    if cls is None:
        return "replicated", (f"a {type(layer).__name__} cannot be split (tensor splits Dense, EinsumDense, "
                              "MultiHeadAttention, Embedding and Conv2D, and their subclasses)")
    why = _why_not_in_place(layer, cls, shared)
    if why:
        return "replicated", why
    if cls == "MultiHeadAttention" and getattr(layer, "_use_gate", False):
        return "replicated", "its gate multiplies all heads' output before the output projection"
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
    value = layer.get_config()[width]
    if value % size:
        return "replicated", f"its {width} ({value}) is not a multiple of {size} engines"
    return SPLITTABLE[cls], None


def _why_not_in_place(layer, cls: str, shared: set[int]) -> str | None:
    """Why `layer` (of the Keras family `cls`) cannot compute on its slices in place, or None."""
    import keras

    base = getattr(keras.layers, cls)
    if any(id(w) in shared for w in layer.weights):
        return "its weights are tied to another layer's"
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return "it is LoRA-enabled or quantized"
    if cls == "MultiHeadAttention":
        projections = [getattr(layer, f"_{p}_dense", None) for p in ("query", "key", "value", "output")]
        if any(type(p) is not keras.layers.EinsumDense for p in projections):
            return "its projections are not Keras' EinsumDense"
        return None
    if type(layer).call is not base.call:
        return f"its class {type(layer).__name__} computes its own call (split, it would compute {cls}'s)"
    if cls == "Conv2D" and (layer.data_format != "channels_last" or layer.groups != 1):
        return "it is channels-first or grouped"
    return None


def _split_bytes(layer, kind: str, size: int) -> int:
    return sum(variable_bytes(w) // (1 if axis is None else size) for w, axis in zip(layer.weights,
                                                                                    split_axes(kind, layer)))
