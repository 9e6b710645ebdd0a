"""Parameter-server checkpoints: every shard's variables and optimizer slots in one `.npz`.

Written atomically (temporary file, then rename) so a crash never leaves half a
checkpoint; no pickle, so loading one cannot run code.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

META = "__meta__"


def save(directory: str | os.PathLike, run_id: int, state: dict) -> Path:
    """Write `state` ({"arrays", "version", "layout", "optimizer"}) as run-<id>.npz; return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{run_id}.npz"
    meta = {k: state[k] for k in ("version", "layout", "optimizer", "tables") if k in state} | {"saved_at": time.time(),
                                                                                         "run": run_id}
    tmp = path.with_suffix(".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez(f, **{META: np.frombuffer(json.dumps(meta).encode(), np.uint8)}, **state["arrays"])
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike) -> dict:
    """{"arrays", "version", "layout", "optimizer", "saved_at", "path"} from a checkpoint file."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files if name != META}
        meta = json.loads(data[META].tobytes())
    return {**meta, "arrays": arrays, "path": str(path)}


def latest(directory: str | os.PathLike) -> Path | None:
    """The most recently written checkpoint in `directory`, if any."""
    files = sorted(Path(directory).glob("run-*.npz"), key=lambda p: p.stat().st_mtime)
    files = [f for f in files if not f.name.endswith(".tmp.npz")]
    return files[-1] if files else None


def model_weights(state: dict) -> list[np.ndarray]:
    """The arrays in `model.get_weights()` order (the layout the first worker sent)."""
    return [state["arrays"][name] for name in state.get("layout") or [] if name in state["arrays"]]
