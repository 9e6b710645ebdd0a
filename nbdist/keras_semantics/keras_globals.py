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
    """This process's random state, as a cell leaves it: Python's and NumPy's generators, TensorFlow's global seed
    with the generator of its ops' seeds, and Keras' global seed generator (what initializers without a seed,
    `keras.random` calls and layers' own draws take next)."""
    import random

    import numpy as np
    from keras.src.backend.common import global_state
    from tensorflow.python.eager import context

    keras_generator = global_state.get_global_attribute("global_seed_generator")
    return {"python": random.getstate(), "numpy": np.random.get_state(), "tf_seed": context.global_seed(),
            "tf_ops": context.context()._rng.getstate() if context.context()._rng is not None else None,
            "keras": None if keras_generator is None else np.asarray(keras_generator.state.numpy())}


def set_random_state(state: dict) -> None:
    """Make this process's random state `state` (`random_state` of another process): the notebook's after a
    training cell is rank 0's, so the cells after it draw what they would after a local run."""
    import random

    import numpy as np
    import tensorflow as tf
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import global_seed_generator
    from tensorflow.python.eager import context

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state["tf_seed"] is not None:
        tf.random.set_seed(state["tf_seed"])
    if state["tf_ops"] is not None and context.context()._rng is not None:
        context.context()._rng.setstate(state["tf_ops"])
    if state["keras"] is None:
        global_state.set_global_attribute("global_seed_generator", None)
    else:
        global_seed_generator().state.assign(state["keras"])
