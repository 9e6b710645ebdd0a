"""One copy of the data per host (`nbdist.datasets.host_cache`): placed once by digest, mapped copy-on-write, bounded."""

from __future__ import annotations

import numpy as np

from nbdist.datasets import host_cache


def test_an_array_is_placed_once_and_every_mapping_reads_that_one_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_HOST_CACHE", str(tmp_path))
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    first = host_cache.place("c1", "d1", data)
    written = (tmp_path / "nbdist-c1" / "d1.npy").stat().st_mtime_ns
    second = host_cache.place("c1", "d1", data * 0)  # the same digest: already there, not written again
    assert (tmp_path / "nbdist-c1" / "d1.npy").stat().st_mtime_ns >= written
    np.testing.assert_array_equal(second, data)
    assert first.filename == second.filename == str(tmp_path / "nbdist-c1" / "d1.npy")
    second[0, 0] = -1  # copy on write: an engine that changes its array changes its own pages only
    np.testing.assert_array_equal(host_cache.mapped("c1", "d1"), data)
    assert host_cache.mapped("c1", "absent") is None
    assert host_cache.holds("c1") == {"files": 1, "bytes": (tmp_path / "nbdist-c1" / "d1.npy").stat().st_size}
    host_cache.remove("c1")
    assert not (tmp_path / "nbdist-c1").exists() and host_cache.holds("c1") == {"files": 0, "bytes": 0}


def test_placing_past_the_bound_removes_the_least_recently_used_arrays(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("NBDIST_HOST_CACHE", str(tmp_path))
    stats = os.statvfs(tmp_path)
    size = 1000  # bytes of each array's data
    monkeypatch.setattr(host_cache, "MAX_FRACTION", 2.5 * (size + 128) / (stats.f_blocks * stats.f_frsize))
    for digest in ("a", "b"):
        host_cache.place("c2", digest, np.zeros(size, np.uint8))
    old = tmp_path / "nbdist-c2" / "a.npy"
    os.utime(old, (1, 1))  # placed long ago, never used since
    host_cache.place("c2", "c", np.zeros(size, np.uint8))
    assert sorted(p.name for p in (tmp_path / "nbdist-c2").glob("*.npy")) == ["b.npy", "c.npy"]
