"""How a split layer of `tensor` computes, and the collectives that join its slices (Horovod over Gloo).

A layer is split where it sits in the model (`split_class`): it keeps its object, its place in its model's graph or
attributes, its config and every method but `call`, and computes on this engine's slices of its variables.
Every engine computes on the same batch. An attention layer split by heads computes its heads as Keras does (its
query, key and value projections hold their heads' slices) and sums its output projection's partial products
(`reduce_sum`). A column-split layer computes its slice of the output
units; `gather_last` joins the slices (forward: allgather; backward: each engine keeps its own
slice of the gradient, for everything after the gather is computed alike on every engine). A
row-split Dense multiplies its slice of the input by its rows of the kernel; `reduce_sum` adds
the partial products (forward: allreduce; backward: identity). `from_replicated` marks the input
of a split layer (forward: identity; backward: the sum of every engine's partial input gradient).
Each collective's gradient is its dual, itself differentiable the same way (gather <-> `own_slice`, `reduce_sum` <->
`from_replicated`), so a gradient of a gradient (a WGAN-GP's gradient penalty, differentiated again) is one
model's: Horovod's own gradients of its ops are data parallelism's (an allreduce's is an allreduce: N times the
gradient here; `tf.split`'s leaves out the other engines' slices) and are never used.
Each collective has a fixed name (`tag`), outside TensorFlow's name scope: Horovod matches tensors across
engines by name, and the scope (``sequential_3/...``) counts the models an engine built before. A layer called more
than once in a step (a GAN's generator, in its discriminator's step and its own) names each call's collectives
apart by the call's number (`call_tag`): every engine runs the same code on the same batch, so its calls come in
the same order, and two calls in flight at once never share a name.
"""

from __future__ import annotations

import keras


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def call_tag(layer) -> str:
    """The names of this call's collectives: the layer's tag and the number of its call on this engine."""
    object.__setattr__(layer, "_nbdist_calls", layer._nbdist_calls + 1)
    return f"{layer._nbdist_split['tag']}_{layer._nbdist_calls}"


def gather_last(x, tag: str, axis: int = -1):
    """The engines' slices of `x` along `axis` (negative: from the end), concatenated in rank order (on every
    engine). Its gradient is `own_slice` of the whole's gradient (the same on every engine): its dual."""
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        hvd = _hvd()
        moved = tf.experimental.numpy.moveaxis(x, axis, 0)
        gathered = hvd.allgather(moved, name=f"{tag}_gather", ignore_name_scope=True)
        whole = tf.experimental.numpy.moveaxis(gathered, 0, axis)
        if x.shape[axis] is not None:  # (allgather's shape is unknown: a LayerNormalization after it needs it)
            shape = list(x.shape)
            shape[axis] *= hvd.size()
            whole = tf.ensure_shape(whole, shape)
        return whole, lambda dy: own_slice(dy, f"{tag}_gather_d", axis)

    return run(x)


def own_slice(x, tag: str, axis: int = -1):
    """This engine's slice of `x` (the same on every engine) along `axis`; its gradient is every engine's slice's
    gradient gathered (`gather_last`: its dual), for each engine's slice holds a part of the whole's gradient."""
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        hvd = _hvd()
        return tf.split(x, hvd.size(), axis=axis)[hvd.rank()], lambda dy: gather_last(dy, f"{tag}_slice_d", axis)

    return run(x)


def reduce_sum(x, tag: str):
    """The sum of every engine's `x`. Its gradient is the sum's gradient as it is (`from_replicated`: its dual)."""
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        summed = _hvd().allreduce(x, op=_hvd().Sum, name=f"{tag}_sum", ignore_name_scope=True)
        return summed, lambda dy: from_replicated(dy, f"{tag}_sum_d")

    return run(x)


def from_replicated(x, tag: str):
    """`x` as it is; its gradient summed over the engines (each holds the part its slice contributes): `reduce_sum`,
    its dual."""
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        return tf.identity(x), lambda dy: reduce_sum(dy, f"{tag}_dx")

    return run(x)


def split_class(cls, kind: str):
    """The class a layer of class `cls` takes while split as `kind`: `cls` with the split's `call` in front (made
    once per class and kind). The layer keeps its own variables' slices, config and everything else of `cls`."""
    key = (cls, kind)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"TensorSplit{cls.__name__}", (_MIXINS[kind], cls), {"_nbdist_original_class": cls})
    return _CLASSES[key]


class _Column:
    """A `Dense` holding `units / size` of its output units (kernel columns and bias): its slice of the output,
    gathered (or, handed on to a row-split Dense, kept local), then activated."""

    def call(self, inputs, training=None):
        split, tag = self._nbdist_split, call_tag(self)
        y = keras.ops.matmul(from_replicated(inputs, tag), self.kernel)
        if self.bias is not None:
            y = keras.ops.add(y, self.bias)
        if split["gathers"]:
            y = gather_last(y, tag)
        return self.activation(y) if self.activation is not None else y

    def compute_output_shape(self, input_shape):
        split = self._nbdist_split
        return (*input_shape[:-1], self.units if split["gathers"] else self.units // split["size"])


class _Row:
    """A `Dense` holding `inputs / size` of its kernel's rows: its input is the previous layer's slice, the partial
    products summed over the engines, then the (whole) bias added once."""

    def call(self, inputs, training=None):
        y = reduce_sum(keras.ops.matmul(inputs, self.kernel), call_tag(self))
        if self.bias is not None:
            y = keras.ops.add(y, self.bias)
        return self.activation(y) if self.activation is not None else y


class _Embedding:
    """An `Embedding` holding `output_dim / size` of every vector."""

    def call(self, inputs):
        if inputs.dtype not in ("int32", "int64"):
            inputs = keras.ops.cast(inputs, "int32")
        y = gather_last(keras.ops.take(self.embeddings, inputs, axis=0), call_tag(self))
        return keras.ops.cast(y, dtype=self.compute_dtype)


class _Conv:
    """A `Conv2D` (channels-last) holding `filters / size` of its filters."""

    def call(self, inputs):
        tag = call_tag(self)
        y = self.convolution_op(from_replicated(inputs, tag), self.kernel)
        if self.use_bias:
            y = keras.ops.add(y, self.bias)
        y = gather_last(y, tag)
        return self.activation(y) if self.activation is not None else y


class _Einsum:
    """An `EinsumDense` holding `1 / size` of the output axis its kernel alone gives (`plan.einsum_split`): its
    kernel's slice (and its bias's, where the bias varies along it), the output's slices gathered along that axis;
    a bias that does not vary along it is added after the gather, on every engine alike."""

    def call(self, inputs, training=None):
        split, tag = self._nbdist_split, call_tag(self)
        y = keras.ops.einsum(self.equation, from_replicated(inputs, tag), self.kernel)
        bias_split = split["bias_axis"] is not None
        if self.bias is not None and bias_split:
            y = keras.ops.add(y, self.bias)
        y = gather_last(y, tag, split["output_axis"])
        if self.bias is not None and not bias_split:
            y = keras.ops.add(y, self.bias)
        return self.activation(y) if self.activation is not None else y


class _Heads:
    """An attention layer's query, key or value projection holding this engine's heads: its output stays local
    (the attention of those heads is computed as Keras computes it); its input's gradient summed over the engines."""

    def call(self, inputs, training=None):
        y = keras.ops.einsum(self.equation, from_replicated(inputs, call_tag(self)), self.kernel)
        return keras.ops.add(y, self.bias) if self.bias is not None else y


class _SummedProjection:
    """An attention layer's output projection over this engine's heads: its partial product summed over the engines
    (Megatron-LM's row split), then its bias added once."""

    def call(self, inputs, training=None):
        y = reduce_sum(keras.ops.einsum(self.equation, inputs, self.kernel), call_tag(self))
        return keras.ops.add(y, self.bias) if self.bias is not None else y


_MIXINS = {"column": _Column, "row": _Row, "embedding": _Embedding, "conv": _Conv, "einsum": _Einsum,
           "head_projection": _Heads, "summed_projection": _SummedProjection}
_CLASSES: dict = {}
