"""Keras' process-wide settings that a notebook changes in a plain cell and that decide how a model computes: the
mixed-precision policy (`keras.mixed_precision.set_global_policy("mixed_float16")`: layers compute in float16 and
`compile` wraps the optimizer in a `LossScaleOptimizer`), `floatx`, the image data format, epsilon, and TensorFlow's
op determinism (`tf.config.experimental.enable_op_determinism()`: with a seed, a run computes the same numbers every
time). The engines take the notebook's before its definitions and models reach them, so a model built, compiled and
trained there is the one a local run would have. The engines also take TensorFlow's global seed: a random op's seeds
are the pair (global seed, op seed), fixed where the op is made, so a pipeline a plain cell shuffled with `seed=5`
and that an engine rebuilds from the cell (before `--seed` seeds the run) shuffles as the notebook's does (and with
op determinism on, TensorFlow refuses a random op in a process with no global seed)."""

from __future__ import annotations

import contextlib


def current() -> dict:
    """The notebook's settings (what `apply` sets on an engine)."""
    import keras

    from tensorflow.python.eager import context
    from tensorflow.python.framework import config

    return {"policy": keras.mixed_precision.global_policy().name, "floatx": keras.backend.floatx(),
            "image_data_format": keras.backend.image_data_format(), "epsilon": keras.backend.epsilon(),
            "op_determinism": config.is_op_determinism_enabled(), "global_seed": context.global_seed()}


def apply(settings: dict) -> None:
    """Engine side: make this process's settings the notebook's."""
    import keras
    from tensorflow.python.eager import context
    from tensorflow.python.framework import config

    if config.is_op_determinism_enabled() != settings["op_determinism"]:
        (config.enable_op_determinism if settings["op_determinism"] else config.disable_op_determinism)()
    if settings["global_seed"] is not None and context.global_seed() != settings["global_seed"]:
        import tensorflow as tf

        tf.random.set_seed(settings["global_seed"])
    if keras.backend.floatx() != settings["floatx"]:
        keras.backend.set_floatx(settings["floatx"])
    if keras.mixed_precision.global_policy().name != settings["policy"]:
        keras.mixed_precision.set_global_policy(settings["policy"])
    if keras.backend.image_data_format() != settings["image_data_format"]:
        keras.backend.set_image_data_format(settings["image_data_format"])
    if keras.backend.epsilon() != settings["epsilon"]:
        keras.backend.set_epsilon(settings["epsilon"])



def random_state() -> dict:
    """This process's random state: Python's generator, and where they are loaded NumPy's, TensorFlow's global seed
    with the generator of its ops' seeds, and Keras' global seed generator."""
    import random
    import sys

    state: dict = {"python": random.getstate()}
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if "tensorflow" in sys.modules:
        from tensorflow.python.eager import context

        rng = getattr(context.context(), "_rng", None)  # (made by the first `tf.random.set_seed`)
        state["tensorflow"] = (context.global_seed(), None if rng is None else rng.getstate())
    if "keras" in sys.modules:
        from keras.src.backend.common import global_state

        generator = global_state.get_global_attribute("global_seed_generator")
        state["keras"] = None if generator is None else generator.state.numpy()
    return state


def set_random_state(state: dict) -> None:
    """Make this process's random state `state` (what `random_state` read, here or in another process)."""
    import random

    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "tensorflow" in state:
        import tensorflow as tf
        from tensorflow.python.eager import context

        seed, ops = state["tensorflow"]
        tf.random.set_seed(seed)
        if ops is not None and getattr(context.context(), "_rng", None) is not None:
            context.context()._rng.setstate(ops)
    if "keras" in state:
        from keras.src.backend.common import global_state
        from keras.src.random.seed_generator import global_seed_generator

        if state["keras"] is None:
            global_state.set_global_attribute("global_seed_generator", None)
        else:
            global_seed_generator().state.assign(state["keras"])


@contextlib.contextmanager
def drawing_as(state: dict | None):
    """Within: this process draws from `state` (a notebook cell's random state before it ran, for its replay on an
    engine: `image_dataset_from_directory` draws its shuffle seed from NumPy); after, from its own state again."""
    if state is None:
        yield
        return
    own = random_state()
    set_random_state(state)
    try:
        yield
    finally:
        set_random_state(own)
