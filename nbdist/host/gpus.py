"""GPUs shared on one host: which GPU each engine uses (pure), pinning it on the engine before TensorFlow
takes the GPUs, and keeping the notebook kernel's TensorFlow off them while nbdist drives the cluster.

Each engine of a host gets one GPU by its local rank, round robin; when a host has more engines
than GPUs (or the kernel uses the GPUs too, `%dist start --kernel-gpu`), memory growth is on, so
no process takes nearly all of a GPU's memory as TensorFlow does by default.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

GPUS_ENV = "NBDIST_GPUS"  # the GPU ids this host's engines share, comma-separated (default: all the host has)
BEFORE_ENV = "NBDIST_CUDA_VISIBLE_DEVICES"  # CUDA_VISIBLE_DEVICES before nbdist changed it, inherited by engines
UNSET = "<unset>"
GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"  # TensorFlow's own switch for memory growth, read when it starts


@dataclass(frozen=True)
class Placement:
    """The GPU(s) one engine sees, in the host's numbering, and whether memory growth is on."""

    devices: tuple[str, ...] = ()
    memory_growth: bool = False

    def environment(self) -> dict[str, str]:
        """The variables that give this placement to a TensorFlow not yet started in the process."""
        if not self.devices:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices), GROWTH_ENV: "true" if self.memory_growth else "false"}

    def label(self) -> str:
        """What `%dist status` shows: the GPU id, with * when memory growth is on (a shared GPU)."""
        return ",".join(self.devices) + ("*" if self.memory_growth else "") if self.devices else ""


def placement(local_rank: int, local_size: int, host_gpus: list[str], kernel_shares: bool = False) -> Placement:
    """The GPU of the engine with `local_rank` among `local_size` engines on a host with `host_gpus`.

    Args:
        local_rank: the engine's index among the engines of its host (0-based).
        local_size: how many engines the host runs.
        host_gpus: the host's GPU ids as CUDA names them (e.g. ["0", "1"]).
        kernel_shares: the notebook kernel on this host uses the GPUs too.
    """
    if not host_gpus:
        return Placement()
    if not 0 <= local_rank < max(local_size, 1):
        raise ValueError(f"local_rank must be in [0, local_size). Received: local_rank={local_rank}, "
                         f"local_size={local_size}")
    return Placement((host_gpus[local_rank % len(host_gpus)],), local_size > len(host_gpus) or kernel_shares)


def host_plan(local_size: int, host_gpus: list[str], kernel_shares: bool = False) -> list[Placement]:
    """`placement` for every engine of a host, by local rank."""
    return [placement(rank, local_size, host_gpus, kernel_shares) for rank in range(local_size)]


def visible_indices(chosen: Placement, seen: list[str]) -> list[int]:
    """Indices into TensorFlow's physical GPU list for `chosen`, when TensorFlow started seeing `seen`
    (the ids CUDA_VISIBLE_DEVICES held then); GPUs it never saw cannot be given to it."""
    return [seen.index(d) for d in chosen.devices if d in seen]


def local_ranks(machines: dict[int, str], known: dict[int, int] | None = None) -> dict[int, tuple[int, int]]:
    """(local rank, local size) of every engine, grouping engines by machine; engines already ranked
    (`known`: engine id -> rank) keep theirs, new ones take the lowest ranks free on their machine."""
    known = known or {}
    out: dict[int, tuple[int, int]] = {}
    for machine in sorted(set(machines.values())):
        engines = sorted(e for e, m in machines.items() if m == machine)
        taken = {known[e] for e in engines if e in known}
        free = (r for r in range(len(engines) + len(taken)) if r not in taken)
        ranks = {e: known[e] if e in known else next(free) for e in engines}
        size = max(len(engines), max(ranks.values()) + 1)
        out.update({e: (r, size) for e, r in ranks.items()})
    return out


# -- on an engine -----------------------------------------------------------------------
_pinned: tuple[Placement, str, int] | None = None  # this process's placement, how it was applied, its local rank


def host_gpus(environ=os.environ) -> list[str]:
    """The GPU ids this host's engines share: $NBDIST_GPUS, else CUDA_VISIBLE_DEVICES as it was before
    nbdist changed it (the kernel's, for engines it started), else every GPU the NVIDIA driver lists."""
    for value in (environ.get(GPUS_ENV), environ.get(BEFORE_ENV), environ.get("CUDA_VISIBLE_DEVICES")):
        if value is not None and value != UNSET:
            return [d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1"]
        if value == UNSET:
            break
    return [str(i) for i in range(_driver_gpu_count())]


def _driver_gpu_count() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def pin(local_rank: int, local_size: int, kernel_shares: bool = False) -> Placement:
    """Give this engine its GPU: by environment when TensorFlow has not started here, else with
    `tf.config.set_visible_devices` and memory growth while TensorFlow has not initialised its GPUs.

    Call it before the engine's first TensorFlow work. The first placement applied stays: TensorFlow
    cannot change its GPUs afterwards, so a later call returns that placement and changes nothing.
    """
    global _pinned
    if _pinned is not None and not _pinned[1].startswith("not applied"):
        return _pinned[0]
    chosen = placement(local_rank, local_size, host_gpus(), kernel_shares)
    if not chosen.devices:
        how = "no GPU"
    elif "tensorflow" not in sys.modules:
        os.environ.setdefault(BEFORE_ENV, os.environ.get("CUDA_VISIBLE_DEVICES", UNSET))
        os.environ.update(chosen.environment())
        how = "environment"
    else:
        how = _pin_tensorflow(chosen)
    _pinned = (chosen, how, local_rank)
    return chosen


def _pin_tensorflow(chosen: Placement) -> str:
    import tensorflow as tf

    started_with = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = host_gpus() if started_with is None else [d.strip() for d in started_with.split(",") if d.strip()]
    physical = tf.config.list_physical_devices("GPU")
    devices = [physical[i] for i in visible_indices(chosen, seen) if i < len(physical)]
    if not devices:
        return f"not applied: TensorFlow here sees GPUs {seen}, not {list(chosen.devices)}"
    try:
        tf.config.set_visible_devices(devices, "GPU")
        for device in devices:
            tf.config.experimental.set_memory_growth(device, chosen.memory_growth)
    except RuntimeError as exc:  # TensorFlow already created its GPU devices in this process
        return f"not applied: {exc}"
    return "tf.config"


def device_scope():
    """Where an engine's training computes: the first GPU it sees (the one `pin` gave it; Horovod's local rank
    may differ from the pin), else the CPU."""
    import contextlib

    import tensorflow as tf

    return tf.device("/GPU:0") if tf.config.get_visible_devices("GPU") else contextlib.nullcontext()


def pinned() -> dict | None:
    """This process's placement for `%dist status`: {"gpu": label, "how", "local_rank"}, None if never pinned."""
    if _pinned is None:
        return None
    chosen, how, local_rank = _pinned
    return {"gpu": chosen.label() if not how.startswith("not applied") else "unpinned", "how": how,
            "local_rank": local_rank}


# -- in the notebook kernel ---------------------------------------------------------------
_kernel: str | None = None  # how the kernel's GPUs were hidden ("environment", "tf.config") or given back


def hide_from_kernel() -> str:
    """Keep this process's TensorFlow off the GPUs (`%load_ext nbdist`); returns how."""
    global _kernel
    if "tensorflow" not in sys.modules:
        os.environ.setdefault(BEFORE_ENV, os.environ.get("CUDA_VISIBLE_DEVICES", UNSET))
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        _kernel = "environment"
        return _kernel
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
        _kernel = "tf.config"
    except RuntimeError:  # TensorFlow already holds the GPUs in this kernel
        _kernel = "in use" if tf.config.list_physical_devices("GPU") else "tf.config"
    return _kernel


def give_to_kernel() -> str:
    """Undo `hide_from_kernel` (`%dist start --kernel-gpu`); returns what happened, for the user when it could not."""
    global _kernel
    if _kernel == "environment" and "tensorflow" not in sys.modules:
        before = os.environ.pop(BEFORE_ENV, UNSET)
        if before == UNSET:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
        _kernel = "given"
        return ""
    if _kernel in ("environment", "tf.config"):
        import tensorflow as tf

        try:
            if _kernel == "environment":
                raise RuntimeError("TensorFlow started here with the GPUs hidden")
            tf.config.set_visible_devices(tf.config.list_physical_devices("GPU"), "GPU")
            for device in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(device, True)
        except RuntimeError:
            return ("nbdist: TensorFlow already started in this kernel without the GPUs; to use them here, restart "
                    "the kernel and run `%dist start --kernel-gpu` before any cell imports TensorFlow.")
    _kernel = "given"
    return ""


def kernel_uses_gpus() -> bool:
    """Whether this kernel's TensorFlow may use the GPUs (so engines on its host share them with it)."""
    return _kernel not in ("environment", "tf.config")
