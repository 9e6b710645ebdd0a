"""`nbdist.datasets.structures`: fit's data as Keras takes it, any nest of lists, tuples and dicts of arrays."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

from nbdist.datasets import structures
from nbdist.errors import OptionError


def test_a_nest_is_cut_leaf_by_leaf_and_keeps_its_shape():
    Pair = namedtuple("Pair", "left right")
    data = {"b": [np.arange(6).reshape(3, 2), Pair(np.arange(3), np.arange(3) * 10)], "a": np.arange(3) + 100}
    cut = structures.take(data, np.array([2, 0]))
    assert list(cut) == ["b", "a"] and isinstance(cut["b"], list) and isinstance(cut["b"][1], Pair)
    assert cut["b"][0].tolist() == [[4, 5], [0, 1]] and cut["b"][1].right.tolist() == [20, 0]
    assert cut["a"].tolist() == [102, 100]
    assert [leaf.tolist() for leaf in structures.flatten(cut)][0] == [102, 100]  # Keras' order: sorted keys
    assert structures.length(data) == 3 and structures.take(None, slice(0, 1)) is None


def test_leaves_of_different_lengths_are_refused_naming_them():
    with pytest.raises(OptionError, match=r"arrays of y have different numbers of samples \(\[3, 4\]\)"):
        structures.length({"p": np.zeros(3), "q": np.zeros(4)}, "y")
    with pytest.raises(OptionError, match="x holds no arrays"):
        structures.length({})


def test_lists_become_tuples_for_tf_data_and_a_pandas_leaf_is_read_by_position():
    assert structures.for_tf_data({"x": [1, [2, 3]], "y": (4,)}) == {"x": (1, (2, 3)), "y": (4,)}

    class Frame:  # what `rows` needs of a pandas frame: .iloc and .to_numpy()
        iloc = None

        def to_numpy(self):
            return np.arange(4) * 2

    assert structures.take(Frame(), [3, 1]).tolist() == [6, 2]
    assert structures.describe({"title": 1, "body": 2}) == "a dict of 2 (title, body)"
