"""A shard's variables laid out in one contiguous array per dtype, each variable a view into it.

A push is then one buffer per dtype (one tag, one finiteness check, one update over the
whole array) instead of one per variable, and a reply one buffer the worker splits with
views. Worker and shard lay the same variables out alike: by name, grouped by dtype, and
the layout's digest travels with each flat message so a difference is refused, not applied.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable

import numpy as np

PREFIX = "flat:"  # a flat buffer's name on the wire: flat:<dtype>


def is_flat(arrays: dict) -> bool:
    """Whether `arrays` are flat buffers (every key one of `PREFIX`'s)."""
    return bool(arrays) and all(key.startswith(PREFIX) for key in arrays)


class FlatLayout:
    """Where each variable lives in its dtype's flat array.

    Args:
        specs: (name, shape, dtype) of each variable; the views keep this order.
    """

    def __init__(self, specs: Iterable[tuple[str, tuple, object]]):
        specs = [(name, tuple(int(d) for d in shape), np.dtype(dtype)) for name, shape, dtype in specs]
        self.names = [name for name, _, _ in specs]
        self.places: dict[str, tuple[str, int, int, tuple]] = {}  # name -> (flat key, start, stop, shape)
        self.sizes: dict[str, int] = {}  # flat key -> elements
        self.dtypes: dict[str, np.dtype] = {}
        for name, shape, dtype in sorted(specs, key=lambda spec: spec[0]):
            key = PREFIX + dtype.name
            start = self.sizes.get(key, 0)
            self.places[name] = (key, start, start + math.prod(shape), shape)
            self.sizes[key], self.dtypes[key] = start + math.prod(shape), dtype
        described = ";".join(f"{n}={k}[{a}:{b}]{list(s)}" for n, (k, a, b, s) in sorted(self.places.items()))
        self.digest = zlib.crc32(described.encode())

    @classmethod
    def of(cls, arrays: dict) -> FlatLayout:
        """The layout of these arrays (name -> array)."""
        return cls((name, np.shape(a), np.asarray(a).dtype) for name, a in arrays.items())

    def zeros(self) -> dict[str, np.ndarray]:
        return {key: np.zeros(size, self.dtypes[key]) for key, size in self.sizes.items()}

    def pack(self, arrays: dict) -> dict[str, np.ndarray]:
        """New flat arrays holding `arrays` (name -> array, every name of the layout)."""
        flat = {key: np.empty(size, self.dtypes[key]) for key, size in self.sizes.items()}
        for name, (key, start, stop, _) in self.places.items():
            flat[key][start:stop] = np.asarray(arrays[name]).reshape(-1)
        return flat

    def read(self, arrays: dict) -> dict[str, np.ndarray]:
        """`arrays` as flat arrays only to be read: a dtype's only variable is itself (no copy), others packed."""
        alone = {key: name for name, (key, start, stop, _) in self.places.items() if stop - start == self.sizes[key]}
        if len(alone) < len(self.sizes):
            return self.pack(arrays)
        return {key: np.ascontiguousarray(np.asarray(arrays[name]).reshape(-1), self.dtypes[key])
                for key, name in alone.items()}

    def views(self, flat: dict) -> dict[str, np.ndarray]:
        """Each variable as a view into `flat` (key -> array), in the layout's order."""
        out = {}
        for name in self.names:
            key, start, stop, shape = self.places[name]
            out[name] = flat[key][start:stop].reshape(shape)
        return out

    def expected(self) -> dict[str, tuple[tuple, str]]:
        """Flat buffers' shapes and dtypes, as `wire.check_arrays` takes them."""
        return {key: ((size,), self.dtypes[key].name) for key, size in self.sizes.items()}

    def state(self, slots: Iterable[str], initial: Callable[[str, str], object]) -> dict[str, dict[str, np.ndarray]]:
        """Optimizer state kept flat: {flat key or variable name -> {slot -> array}}, a name's arrays views of its
        key's; `initial(name, slot)` is a saved value, or None for zeros."""
        state: dict[str, dict[str, np.ndarray]] = {key: {} for key in [*self.sizes, *self.names]}
        for slot in slots:
            flat = self.zeros()
            for key, array in flat.items():
                state[key][slot] = array
            for name, view in self.views(flat).items():
                value = initial(name, slot)
                if value is not None:
                    view[...] = value
                state[name][slot] = view
        return state


def layout_digest(shapes: dict) -> str:
    """A short digest of variables' names and shapes: what a shard holds, or a worker's part of it."""
    import hashlib

    text = "|".join(f"{name}:{tuple(int(d) for d in shape)}" for name, shape in sorted(shapes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
