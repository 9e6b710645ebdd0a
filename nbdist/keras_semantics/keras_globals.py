"""Keras' process-wide settings that a notebook changes in a plain cell and that decide how a model computes: the
mixed-precision policy (`keras.mixed_precision.set_global_policy("mixed_float16")`: layers compute in float16 and
`compile` wraps the optimizer in a `LossScaleOptimizer`), `floatx`, the image data format, epsilon, and TensorFlow's
op determinism (`tf.config.experimental.enable_op_determinism()`: with a seed, a run computes the same numbers every
time). The engines take the notebook's before its definitions and models reach them, so a model built, compiled and
trained there is the one a local run would have. With op determinism on, TensorFlow refuses a random op in a process
with no global seed; an engine with none takes the notebook's (a dataset a plain cell shuffled or augmented is rebuilt
there before `--seed` seeds the run)."""

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
    if settings["op_determinism"] and context.global_seed() is None and settings["global_seed"] is not None:
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
