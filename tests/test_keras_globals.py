"""The process-wide random state a notebook cell draws from, read and set again (no engine): what an engine's replay
of a plain cell draws from (`keras_globals.drawing_as`)."""

from __future__ import annotations

import random

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from nbdist.keras_semantics import keras_globals  # noqa: E402


def _draws() -> list[float]:
    return [random.random(), float(np.random.rand()), float(keras.random.uniform(())), float(tf.random.uniform(()))]


def test_a_replay_draws_what_the_cell_drew_and_the_process_goes_on_from_its_own_state():
    keras.utils.set_random_seed(11)
    before_cell = keras_globals.random_state()
    cell = _draws()
    own = keras_globals.random_state()
    expected_next = _draws()
    keras_globals.set_random_state(own)
    with keras_globals.drawing_as(before_cell):
        assert _draws() == cell
    assert _draws() == expected_next


def test_the_random_state_reads_where_tensorflow_has_no_global_seed():
    """(A process that never set one has no generator of op seeds at all: reading it once failed every cell.)"""
    from tensorflow.python.eager import context

    had = context.context().__dict__.pop("_rng", None)
    try:
        state = keras_globals.random_state()
        assert state["tensorflow"] == (context.global_seed(), None)
    finally:
        if had is not None:
            context.context()._rng = had
    tf.random.set_seed(None)
    keras_globals.set_random_state(keras_globals.random_state())
    assert context.global_seed() is None
