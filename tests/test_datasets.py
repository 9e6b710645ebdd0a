"""Fashion-MNIST from the Debian package, and the idx reader on hand-made files."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from nbdist import datasets


def write_idx(path, array, code=0x08):
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(array.dtype.newbyteorder(">")).tobytes())


def test_read_idx_hand_made(tmp_path):
    values = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", values)
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "a.gz"), values)
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "a.gz", limit=1), values[:1])


def test_read_idx_big_endian_int32(tmp_path):
    values = np.array([1, -2, 70000], dtype=np.int32)
    write_idx(tmp_path / "b.gz", values, code=0x0C)
    out = datasets.read_idx(tmp_path / "b.gz")
    assert out.tolist() == [1, -2, 70000] and out.dtype.byteorder in "=<|"


def test_read_idx_rejects_bad_magic_and_truncation(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an idx file"):
        datasets.read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="holds 3 bytes"):
        datasets.read_idx(tmp_path / "short")


def test_fashion_mnist_from_debian_package():
    (x, y), (xt, yt) = datasets.fashion_mnist()
    assert x.shape == (60000, 28, 28) and xt.shape == (10000, 28, 28)
    assert x.dtype == np.uint8 and y.dtype == np.uint8
    # The published split is balanced: 6,000 / 1,000 images per class.
    assert np.bincount(y).tolist() == [6000] * 10
    assert np.bincount(yt).tolist() == [1000] * 10
    assert x.mean() == pytest.approx(72.9403, abs=1e-4)  # the published training set's pixel mean, 0.28604 x 255


def test_fashion_mnist_limit():
    (x, y), (xt, yt) = datasets.fashion_mnist(limit=100)
    assert len(x) == len(y) == len(xt) == len(yt) == 100
    with pytest.raises(ValueError, match="Received: limit=0"):
        datasets.fashion_mnist(limit=0)


def test_missing_package_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets, "FASHION_MNIST_DIR", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        datasets.fashion_mnist()
