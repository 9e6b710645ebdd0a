"""`fit`'s data as Keras takes it: an array, or a nest of lists, tuples and dicts of arrays (`x=[left, right]`,
`y={"priority": ..., "department": ...}`, a dict holding a list), for `x`, `y` and `sample_weight` alike.

Every path of nbdist that cuts, counts, places or signs training data goes through here: a structure is cut leaf
by leaf and keeps the shape the cell gave it. The order of the leaves is Keras' (`keras.tree`): a
dict's values by sorted key, a list's or tuple's in order. Pure Python and numpy: no framework is imported.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import OptionError


def flatten(data) -> list:
    """The leaves of `data`, in Keras' order; [] for None."""
    if data is None:
        return []
    if isinstance(data, dict):
        return [leaf for key in sorted(data) for leaf in flatten(data[key])]
    if isinstance(data, (list, tuple)):
        return [leaf for item in data for leaf in flatten(item)]
    return [data]


def map_leaves(fn: Callable[[Any], Any], data):
    """`data` with `fn` applied to each leaf, the nest kept (a dict's keys, a list or tuple as it was); None stays
    None."""
    if data is None:
        return None
    if isinstance(data, dict):
        return type(data)((key, map_leaves(fn, value)) for key, value in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(map_leaves(fn, item) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_leaves(fn, item) for item in data)
    return fn(data)


def length(data, what: str = "x") -> int:
    """The number of samples of `data` (every leaf's first dimension); an OptionError naming `what` when the
    leaves disagree, as Keras' own check would."""
    sizes = {_rows_of(leaf) for leaf in flatten(data)}
    if not sizes:
        raise OptionError(f"{what} holds no arrays: give fit an array, or a list, tuple or dict of arrays.")
    if len(sizes) > 1:
        raise OptionError(f"the arrays of {what} have different numbers of samples ({sorted(sizes)}); every array "
                          "of a fit must hold one row per sample.")
    return sizes.pop()


def _rows_of(leaf) -> int:
    shape = getattr(leaf, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else len(leaf)


def take(data, index):
    """`data` at `index` (a slice or an index array) in every leaf; None stays None."""
    return map_leaves(lambda leaf: rows(leaf)[index], data)


def rows(leaf):
    """A leaf indexable by sample position: a pandas frame or series as its numpy values, an array as it is (a
    memory map stays one)."""
    import numpy as np

    if hasattr(leaf, "iloc"):
        return leaf.to_numpy()
    return leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf)


def for_tf_data(data):
    """`data` with each list made a tuple: to `tf.data` a Python list is one tensor, a tuple a structure (Keras'
    own adapters do the same before they build a pipeline)."""
    if isinstance(data, dict):
        return {key: for_tf_data(value) for key, value in data.items()}
    if isinstance(data, list) or (isinstance(data, tuple) and not hasattr(data, "_fields")):
        return tuple(for_tf_data(item) for item in data)
    return data


def first_leaf(data):
    """The first leaf of `data` (in Keras' order), None when there is none."""
    leaves = flatten(data)
    return leaves[0] if leaves else None


def describe(data) -> str:
    """A short name of `data`'s structure for messages: 'an array', 'a list of 2', 'a dict of 3 (title, ...)'."""
    if isinstance(data, dict):
        return f"a dict of {len(data)} ({', '.join(map(str, list(data)[:3]))}{', ...' if len(data) > 3 else ''})"
    if isinstance(data, (list, tuple)):
        return f"a {type(data).__name__} of {len(data)}"
    return "an array" if data is not None else "nothing"
