"""Training data: `fit`'s data as Keras takes it (`structures`), split between workers (`sharding`), batches on
demand (`batches`, `dynamic_data`), one copy per host (`host_cache`); and here, the real datasets available
offline (Debian's data packages): `from nbdist.datasets import fashion_mnist`."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

FASHION_MNIST_DIR = Path(os.environ.get("NBDIST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike, limit: int | None = None) -> np.ndarray:
    """Read an idx (optionally gzipped) file into a numpy array, keeping the first `limit` items."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file (bad magic number {data[:4]!r})")
    dtype, ndim = np.dtype(_IDX_DTYPES[data[2]]), data[3]
    dims = np.frombuffer(data, ">u4", count=ndim, offset=4).astype(int)
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - offset != expected:
        raise ValueError(f"{path}: header says {tuple(dims)} but holds {len(data) - offset} bytes of data")
    array = np.frombuffer(data, dtype, offset=offset).reshape(tuple(dims))
    if limit is not None:
        array = array[:limit]
    return array.astype(dtype.newbyteorder("="), copy=True)


def fashion_mnist(limit: int | None = None):
    """Fashion-MNIST from the Debian package `dataset-fashion-mnist`.

    Args:
        limit: keep only the first `limit` training and test examples (None: all
            60,000 / 10,000).

    Returns:
        ((x_train, y_train), (x_test, y_test)): uint8 images of shape (n, 28, 28)
        and uint8 labels 0-9, in the order of the Keras loader.
    """
    if limit is not None and (not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"Expected `limit` to be a positive int or None. Received: limit={limit!r}")
    names = {
        "x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
        "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz",
    }
    missing = [n for n in names.values() if not (FASHION_MNIST_DIR / n).exists()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST is not installed ({FASHION_MNIST_DIR / missing[0]} is missing). "
            "Install it with: sudo apt-get install dataset-fashion-mnist"
        )
    arrays = {key: read_idx(FASHION_MNIST_DIR / name, limit) for key, name in names.items()}
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])
