"""The split layers of `tensor` and the collectives that join their slices (Horovod over Gloo).

Every engine computes on the same batch. An attention layer split by heads computes its heads as Keras does and
sums its output projection's partial products (`reduce_sum`). A column-split layer computes its slice of the output
units; `gather_last` joins the slices (forward: allgather; backward: each engine keeps its own
slice of the gradient, for everything after the gather is computed alike on every engine). A
row-split Dense multiplies its slice of the input by its rows of the kernel; `reduce_sum` adds
the partial products (forward: allreduce; backward: identity). `from_replicated` marks the input
of a split layer (forward: identity; backward: the sum of every engine's partial input gradient).
Each collective has a fixed name (`tag`), outside TensorFlow's name scope: Horovod matches tensors across
engines by name, and the scope (``sequential_3/...``) counts the models an engine built before.
"""

from __future__ import annotations

import keras


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def gather_last(x, tag: str, axis: int = -1):
    """The engines' slices of `x` along `axis` (negative: from the end), concatenated in rank order (on every
    engine)."""
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

        def grad(dy):
            return tf.split(dy, hvd.size(), axis=axis)[hvd.rank()]

        return whole, grad

    return run(x)


def reduce_sum(x, tag: str):
    """The sum of every engine's `x`."""
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        return _hvd().allreduce(x, op=_hvd().Sum, name=f"{tag}_sum", ignore_name_scope=True), lambda dy: dy

    return run(x)


def from_replicated(x, tag: str):
    """`x` as it is; its gradient summed over the engines (each holds the part its slice contributes)."""
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        return tf.identity(x), lambda dy: _hvd().allreduce(dy, op=_hvd().Sum, name=f"{tag}_dx", ignore_name_scope=True)

    return run(x)


class _Split(keras.layers.Layer):
    """What every split layer keeps: the original layer's config, this engine's rank and the size."""

    def __init__(self, original: dict, rank: int, size: int, tag: str, gathers: bool = True, **kwargs):
        super().__init__(name=original.get("name"), dtype=original.get("dtype"), **kwargs)
        self.original, self.rank, self.size, self.tag, self.gathers = original, rank, size, tag, gathers
        self.activation = keras.activations.get(original.get("activation") or "linear")
        self.use_bias = bool(original.get("use_bias", False))

    def get_config(self):
        return {**super().get_config(), "original": self.original, "rank": self.rank, "size": self.size,
                "tag": self.tag, "gathers": self.gathers}

    def _finish(self, y):
        """The gathered (or, handed on to a row-split layer, local) output, activated."""
        if self.gathers:
            y = gather_last(y, self.tag)
        return self.activation(y)


class ColumnParallelDense(_Split):
    """`Dense` holding `units / size` of its output units (kernel columns and bias)."""

    def build(self, input_shape):
        local = self.original["units"] // self.size
        self.kernel = self.add_weight(shape=(input_shape[-1], local), initializer="zeros", name="kernel")
        self.bias = self.add_weight(shape=(local,), initializer="zeros", name="bias") if self.use_bias else None

    def call(self, x):
        y = keras.ops.matmul(from_replicated(x, self.tag), self.kernel)
        return self._finish(y + self.bias if self.bias is not None else y)

    def compute_output_shape(self, input_shape):
        units = self.original["units"] if self.gathers else self.original["units"] // self.size
        return (*input_shape[:-1], units)


class RowParallelDense(_Split):
    """`Dense` holding `inputs / size` of its kernel's rows; its input is the previous layer's slice."""

    def build(self, input_shape):
        units = self.original["units"]
        self.kernel = self.add_weight(shape=(input_shape[-1], units), initializer="zeros", name="kernel")
        self.bias = self.add_weight(shape=(units,), initializer="zeros", name="bias") if self.use_bias else None

    def call(self, x):
        y = reduce_sum(keras.ops.matmul(x, self.kernel), self.tag)
        return self.activation(y + self.bias if self.bias is not None else y)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.original["units"])


class SplitEmbedding(_Split):
    """`Embedding` holding `output_dim / size` of every vector."""

    def build(self, input_shape):
        shape = (self.original["input_dim"], self.original["output_dim"] // self.size)
        self.embeddings = self.add_weight(shape=shape, initializer="zeros", name="embeddings")

    def call(self, ids):
        return gather_last(keras.ops.take(self.embeddings, keras.ops.cast(ids, "int32"), axis=0), self.tag)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.original["output_dim"])


class SplitConv2D(_Split):
    """`Conv2D` holding `filters / size` of its filters (channels-last)."""

    def build(self, input_shape):
        height, width = self.original["kernel_size"]
        local = self.original["filters"] // self.size
        self.kernel = self.add_weight(shape=(height, width, input_shape[-1], local), initializer="zeros",
                                      name="kernel")
        self.bias = self.add_weight(shape=(local,), initializer="zeros", name="bias") if self.use_bias else None

    def call(self, x):
        o = self.original
        y = keras.ops.conv(from_replicated(x, self.tag), self.kernel, strides=o["strides"], padding=o["padding"],
                           dilation_rate=o["dilation_rate"])
        return self._finish(y + self.bias if self.bias is not None else y)

    def compute_output_shape(self, input_shape):
        whole = keras.layers.Conv2D(**{k: v for k, v in self.original.items() if k != "name"})
        return whole.compute_output_shape(input_shape)


class _SummedOutputProjection(keras.layers.EinsumDense):
    """An attention layer's output projection over this engine's heads: its partial product summed over the engines
    (Megatron-LM's row split), then its bias added once; otherwise Keras' `EinsumDense`."""

    tag = ""

    def call(self, inputs, training=None):
        y = reduce_sum(keras.ops.einsum(self.equation, inputs, self.kernel), self.tag)
        return keras.ops.add(y, self.bias) if self.bias is not None else y


class OutputParallelEinsumDense(keras.layers.EinsumDense):
    """`EinsumDense` holding `1 / size` of the output axis its kernel alone gives (`plan.einsum_split`): its kernel's
    slice (and its bias's, where the bias varies along it), the output's slices gathered along that axis; a bias
    that does not vary along it is added after the gather, on every engine alike."""

    def __init__(self, original: dict, rank: int, size: int, tag: str, gathers: bool = True, **kwargs):
        from .plan import einsum_split

        split = einsum_split(original)
        shape = original["output_shape"]
        shape = [shape] if isinstance(shape, int) else list(shape)
        shape[split["shape_index"]] //= size
        super().__init__(**{**original, "output_shape": shape}, **kwargs)
        self.original, self.rank, self.size, self.tag, self.split = original, rank, size, tag, split

    def get_config(self):
        return {"original": self.original, "rank": self.rank, "size": self.size, "tag": self.tag}

    def call(self, inputs, training=None):
        y = keras.ops.einsum(self.equation, from_replicated(inputs, self.tag), self.kernel)
        bias_split = self.split["bias_axis"] is not None
        if self.bias is not None and bias_split:
            y = keras.ops.add(y, self.bias)
        y = gather_last(y, self.tag, self.split["output_axis"])
        if self.bias is not None and not bias_split:
            y = keras.ops.add(y, self.bias)
        return self.activation(y) if self.activation is not None else y

    def compute_output_shape(self, input_shape):
        shape = list(super().compute_output_shape(input_shape))
        axis = self.split["output_axis"]
        shape[axis] = None if shape[axis] is None else shape[axis] * self.size
        return tuple(shape)


class HeadParallelAttention(keras.layers.MultiHeadAttention):
    """`MultiHeadAttention` holding `num_heads / size` of its heads: Keras' own computation for those heads (their
    query, key and value projections, their attention), the output projection's partial products summed over the
    engines. Its inputs' gradients are summed over the engines too (each holds its heads' part)."""

    def __init__(self, original: dict, rank: int, size: int, tag: str, gathers: bool = True, **kwargs):
        super().__init__(**{**original, "num_heads": original["num_heads"] // size}, **kwargs)
        self.original, self.rank, self.size, self.tag = original, rank, size, tag

    def get_config(self):
        return {"original": self.original, "rank": self.rank, "size": self.size, "tag": self.tag}

    def _make_output_dense(self, query_shape, common_kwargs, name=None):
        whole = super()._make_output_dense(query_shape, common_kwargs, name)
        summed = _SummedOutputProjection.from_config(whole.get_config())
        summed.tag = f"{self.tag}_out"
        return summed

    def call(self, query, value, key=None, **kwargs):
        query_in = from_replicated(query, f"{self.tag}_q")
        value_in = from_replicated(value, f"{self.tag}_v")
        key_in = None if key is None else from_replicated(key, f"{self.tag}_k")
        return super().call(query_in, value_in, key_in, **kwargs)


SPLIT_LAYERS = {"column": ColumnParallelDense, "row": RowParallelDense, "embedding": SplitEmbedding,
                "conv": SplitConv2D, "heads": HeadParallelAttention, "einsum": OutputParallelEinsumDense}
