"""The notebook's own classes (a layer, a metric, an optimizer a cell defines, not registered with Keras): Keras
looks a class up by name when it rebuilds an object from its config (as unpickling an optimizer does) in its
registry and in the module `__main__`, which is not where a cell's class lives; within `scope(namespace)` it finds
them in `namespace`, on an engine (the classes the notebook brought) as in the notebook."""

from __future__ import annotations

import contextlib


def classes(namespace: dict) -> dict:
    """{name: class} of the classes the notebook's cells defined (module `__main__`) among `namespace`'s values."""
    return {k: v for k, v in namespace.items() if isinstance(v, type) and v.__module__ == "__main__"}


@contextlib.contextmanager
def scope(namespace: dict, extra: dict | None = None):
    """Within: Keras rebuilds objects of `namespace`'s own classes (and of `extra`: the functions a model names)."""
    import keras

    with keras.saving.custom_object_scope({**classes(namespace), **(extra or {})}):
        yield


def used_by(value, namespace: dict) -> list[str]:
    """The names of `namespace`'s own classes that the Keras objects in `value` are instances of (an optimizer of
    a class the notebook defines: Keras rebuilds it by its class's name, so the class must be there first)."""
    from .state_walk import Walk

    own = {cls.__qualname__: name for name, cls in classes(namespace).items()}  # (by name: an object made before
    objects = [value, *Walk({"value": value}).objects.values()]  # its class's cell ran again is of the old class)
    return list(dict.fromkeys(own[type(obj).__qualname__] for obj in objects
                              if type(obj).__module__ == "__main__" and type(obj).__qualname__ in own))


def loads(blob: bytes, namespace: dict):
    """`cloudpickle.loads(blob)`, Keras objects of `namespace`'s own classes included."""
    import cloudpickle

    with scope(namespace):
        return cloudpickle.loads(blob)
