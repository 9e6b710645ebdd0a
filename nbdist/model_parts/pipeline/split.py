"""Cutting a Keras model into K consecutive stages, and balancing them.

A model is cut after named layers. A Sequential model can be cut after any layer. A functional
model is first flattened (`flattened`: a functional model nested in it and called once, such as a
KerasHub backbone, stands as its own layers), then can be cut after any layer in its order except
where a layer's calls would fall on both sides or a model output is computed before the cut. Every
tensor computed before a cut and used after it crosses it (`Chain.crossing`: the activations, a
skip connection, an attention mask read from the inputs): the stage before sends them all, in one
order, and the stage after takes them as its inputs. Balancing is a pure function of per-layer
costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import OptionError


@dataclass
class Chain:
    """A model as the ordered layers a pipeline can cut between, and the cuts it allows."""

    model: object
    layers: list  # the model's layers in execution order (no InputLayer)
    cuttable: list[str] = field(default_factory=list)  # names of layers a stage may end at
    blocked: dict[str, str] = field(default_factory=dict)  # layer name -> why a cut after it is refused
    crossing: dict[str, list] = field(default_factory=dict)  # cuttable layer name -> the tensors crossing its cut

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def sequential(self) -> bool:
        import keras

        return isinstance(self.model, keras.Sequential)


def chain_of(model) -> Chain:
    """The model's layers in order and where it may be cut; refuses models with no graph to cut."""
    import keras

    if isinstance(model, keras.Sequential):
        layers = list(model.layers)
        return Chain(model, layers, cuttable=[layer.name for layer in layers[:-1]])
    if not hasattr(model, "_nodes_by_depth"):
        raise OptionError(f"--strategy pipeline cuts Sequential and functional models; {type(model).__name__} is "
                          "a subclassed model, whose layers have no graph nbdist can cut. Write it as a functional "
                          "model (keras.Model(inputs, outputs)), or train it with a data-parallel strategy.")
    return _functional_chain(model)


def flattened(model):
    """`model` with every functional model nested in it and called once (a KerasHub backbone, an encoder) replaced
    by its own layers, recursively: the same layers and weights, one graph a pipeline can cut inside them. A
    nested model called more than once (a siamese tower) stays one layer, as does one whose class computes its
    own `call`. `model` itself when nothing is nested."""
    import keras
    from keras.src.models.functional import Functional

    def inlined(op) -> bool:
        return isinstance(op, Functional) and type(op).call is Functional.call and len(op._inbound_nodes) == 1

    if not any(inlined(node.operation) for nodes in model._nodes_by_depth.values() for node in nodes):
        return model

    def replay(functional, inputs):
        def operation_fn(op):
            if inlined(op):
                return lambda inner, *args, **kwargs: replay(op, op._standardize_inputs(inner))
            return op
        return functional._run_through_graph(inputs, operation_fn=operation_fn)

    def fresh(tensor):
        return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype, sparse=tensor.sparse,
                           name=tensor._keras_history[0].name)

    inputs = keras.tree.map_structure(fresh, model._inputs_struct)
    return keras.Model(inputs, replay(model, inputs), name=model.name)


def _functional_chain(model) -> Chain:
    model = flattened(model)
    nodes = [node for depth in sorted(model._nodes_by_depth, reverse=True) for node in model._nodes_by_depth[depth]]
    ops = [node.operation for node in nodes if not node.is_input]
    order = [op for op in dict.fromkeys(ops)]
    position = {id(op): i for i, op in enumerate(order)}
    producer = {id(t): node.operation for node in nodes for t in node.output_tensors}
    outputs = {id(t) for t in model.outputs}
    chain = Chain(model, order)
    for i, op in enumerate(order[:-1]):
        reason = _why_not_a_cut(i, nodes, producer, position, outputs)
        if reason:
            chain.blocked[op.name] = reason
        else:
            chain.cuttable.append(op.name)
            chain.crossing[op.name] = _crossing(i, nodes, producer, position)
    return chain


def _upstream(source, i: int, position: dict) -> bool:
    """Whether `source` (a tensor's producer) computes before a cut after position `i` (a model input does)."""
    return source is not None and (id(source) not in position or position[id(source)] <= i)


def _why_not_a_cut(i, nodes, producer, position, outputs) -> str | None:
    """Why no cut may follow position `i` of the chain: data flowing back across it (a layer called twice, once on
    each side: a layer's calls must fall in one stage, its weights live in one), or a model output computed before
    it (None: it is a cut). A layer called more than once stands in the chain once, at its first call."""
    for node in nodes:
        if node.is_input or position[id(node.operation)] > i:
            continue
        for tensor in node.input_tensors:
            if not _upstream(producer.get(id(tensor)), i, position):
                return (f"{node.operation.name!r} is called more than once, on both sides of it: a layer's calls "
                        "must all fall in one stage (its weights live in one)")
    for tensor_id in outputs:
        source = producer.get(tensor_id)
        if source is not None and id(source) in position and position[id(source)] <= i:
            return f"the model's output {source.name!r} is produced before it"
    return None


def _crossing(i, nodes, producer, position) -> list:
    """The tensors computed before a cut after position `i` and used after it, in the graph's order (the same on
    every engine: each builds the same model)."""
    crossing: dict[int, object] = {}
    for node in nodes:
        if node.is_input or position[id(node.operation)] <= i:
            continue
        for tensor in node.input_tensors:
            if _upstream(producer.get(id(tensor)), i, position):
                crossing.setdefault(id(tensor), tensor)
    return list(crossing.values())


def check_cuts(chain: Chain, names: list[str], stages: int) -> list[str]:
    """The cut names, validated: K-1 of them, layers of the model, in order, each a legal cut."""
    if len(names) != stages - 1:
        raise OptionError(f"--split names the layers after which to cut: {stages - 1} name(s) for --stages {stages}. "
                          f"Received: --split {','.join(names)}")
    for name in names:
        if name not in chain.names:
            raise OptionError(f"--split names {name!r}, which is not a layer of the model; its layers are "
                              f"{', '.join(chain.names)}.")
        if name not in chain.cuttable:
            why = chain.blocked.get(name, "it is the last layer")
            raise OptionError(f"the model cannot be cut after {name!r}: {why}. Layers it can be cut after: "
                              f"{', '.join(chain.cuttable) or 'none'}.")
    positions = [chain.names.index(n) for n in names]
    if positions != sorted(set(positions)):
        raise OptionError(f"--split names must be distinct and in the model's order ({', '.join(chain.names)}). "
                          f"Received: --split {','.join(names)}")
    return names


def balanced_cuts(names: list[str], costs: list[float], cuttable: list[str], stages: int) -> list[str]:
    """The K-1 cuts (layer names, among `cuttable`) that make the costliest stage as cheap as possible.

    `costs[i]` is layer i's cost; a stage costs the sum of its layers'. Ties go to the earliest cut.
    """
    allowed = [i for i, n in enumerate(names) if n in cuttable]
    if len(allowed) < stages - 1:
        raise OptionError(f"--stages {stages} needs {stages - 1} cut(s) but the model can be cut only after "
                          f"{', '.join(cuttable) or 'no layer'}; use fewer stages.")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    ends = allowed + [len(names) - 1]

    def cost(start: int, end: int) -> float:  # layers start..end inclusive
        return prefix[end + 1] - prefix[start]

    best = {(0, e): (cost(0, e), []) for e in ends}  # (stages used, end) -> (max stage cost, cut positions)
    for k in range(1, stages):
        best.update({(k, e): min(((max(best[(k - 1, p)][0], cost(p + 1, e)), best[(k - 1, p)][1] + [p])
                                  for p in ends if p < e and (k - 1, p) in best), default=(float("inf"), []))
                     for e in ends})
    return [names[p] for p in best[(stages - 1, len(names) - 1)][1]]


def positions(chain: Chain, cuts: list[str]) -> list[int]:
    """The cut names as positions in the chain: what stages agree on (layer names are numbered per
    process, so two engines can name the same layer differently)."""
    return [chain.names.index(n) for n in cuts]


def stage_ranges(chain: Chain, cut_at: list[int]) -> list[list]:
    """Each stage's layers, given the positions of the layers the stages end at (all but the last)."""
    ends = list(cut_at) + [len(chain.layers) - 1]
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [chain.layers[s:e + 1] for s, e in zip(starts, ends)]


def layer_bytes(layer) -> int:
    import numpy as np

    return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize
               for v in getattr(layer, "weights", []))  # (a Keras op in the graph has none)


def stage_part(chain: Chain, cut_at: list[int], stage: int):
    """Stage `stage`'s part of the model, callable on its input: a layer chain (Sequential models) or the functional
    sub-model between two cuts, taking the tensors crossing the cut before it (one, or a list in
    `Chain.crossing`'s order) and giving those crossing the cut after it. Shares the model's layers (no copy)."""
    import keras

    layers = stage_ranges(chain, cut_at)[stage]
    if chain.sequential:
        return LayerChain(layers)
    model = chain.model

    def crossing(position: int):
        tensors = chain.crossing[chain.names[position]]
        return tensors[0] if len(tensors) == 1 else tensors

    inputs = model.input if stage == 0 else crossing(cut_at[stage - 1])
    outputs = model.output if stage == len(cut_at) else crossing(cut_at[stage])
    given = {id(t): j for j, t in enumerate(keras.tree.flatten(inputs))}
    passed = isinstance(outputs, list) and any(id(t) in given for t in outputs)
    try:
        if not passed:
            return keras.Model(inputs, outputs, name=f"pipeline_part_{stage}")
        # a tensor crossing both of the stage's cuts passes through it (a Keras model cannot output its input)
        computed = [t for t in outputs if id(t) not in given]
        core = keras.Model(inputs, computed[0] if len(computed) == 1 else computed, name=f"pipeline_part_{stage}")
        # numbered as the core lines its inputs up (the model's inputs: a dict's entries by name; a later stage's:
        # the crossing tensors in order, which Keras clones)
        given = {id(t): j for j, t in enumerate(core.inputs if stage == 0 else keras.tree.flatten(inputs))}
        return PassingThrough(core, [("given", given[id(t)]) if id(t) in given else ("computed", computed.index(t))
                                     for t in outputs])
    except ValueError as exc:  # a graph Keras cannot cut there: say which cut, and what to do, not Keras' words
        cuts = [chain.names[p] for p in cut_at]
        raise OptionError(f"--strategy pipeline cannot make stage {stage} of the cut after {', '.join(cuts)}: Keras "
                          f"says {str(exc).splitlines()[0][:200]}. Choose other cuts with --split (layers it can be "
                          f"cut after: {', '.join(chain.cuttable)}), or train the model with a data-parallel "
                          "strategy.") from None


def PassingThrough(core, sources: list[tuple[str, int]]):  # noqa: N802 - made on demand, as LayerChain
    """A Keras layer computing `core` and giving, for each of its outputs in `sources`, a tensor it was given
    ("given", index among its flattened inputs) or one `core` computed ("computed", index among its outputs)."""
    import keras

    class _PassingThrough(keras.layers.Layer):
        def __init__(self):
            super().__init__(name=core.name)
            self.core = core
            self.built = True

        def call(self, inputs, training=False):
            given = self.core._standardize_inputs(inputs)  # (in `core.inputs`' order, a dict's entries by name)
            computed = self.core(inputs, training=training)
            computed = list(computed) if isinstance(computed, (list, tuple)) else [computed]
            return [given[j] if kind == "given" else computed[j] for kind, j in sources]

    return _PassingThrough()


def LayerChain(layers):  # noqa: N802 - a class made on demand, so this module imports without Keras
    """A Keras layer that applies `layers` in order (a Sequential model's stage)."""
    import keras

    class _LayerChain(keras.layers.Layer):
        def __init__(self, parts):
            super().__init__(name=f"chain_{parts[0].name}_to_{parts[-1].name}")
            self.parts = list(parts)
            self.built = True

        def call(self, inputs, training=False):
            for layer in self.parts:
                inputs = layer(inputs, training=training)
            return inputs

    return _LayerChain(layers)
