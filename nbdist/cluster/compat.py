"""Whether the engines can run what the notebook defines: versions against the notebook's, Horovod's build (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from ..horovod import INSTALL_COMMAND as HOROVOD_INSTALL


@dataclass(frozen=True)
class Problem:
    """One thing engines of one host lack, and the command that fixes it there."""

    host: str
    engines: tuple[int, ...]
    what: str
    command: str

    @property
    def key(self) -> str:
        """Identifies the problem across `%dist status` calls, so it is reported once."""
        return f"{self.host}|{self.engines}|{self.what}"

    def text(self) -> str:
        ids = ", ".join(map(str, self.engines))
        return (f"nbdist: warning: engine{'s' if len(self.engines) > 1 else ''} {ids} on {self.host}: {self.what}. "
                f"On {self.host} run: {self.command}")


def problems(notebook: dict, engines: list) -> list[Problem]:
    """What `engines` (EngineInfo) lack compared with `notebook` (`nbdist.host.facts.versions()` in the kernel).

    nbdist, TensorFlow and Keras must have the notebook's versions (the cells run in both places);
    an engine with GPUs needs a Horovod built with NCCL for `hfdt` to reduce on the GPU, and an
    engine without a working Horovod cannot run `hfdt` when the notebook has it.
    """
    found: dict[tuple, list[int]] = {}
    for info in engines:
        if info.host.startswith("?"):  # not probed: its row already says why
            continue
        for what, command in _lacks(notebook, info):
            found.setdefault((info.host, what, command), []).append(info.id)
    return [Problem(host, tuple(sorted(ids)), what, command) for (host, what, command), ids in found.items()]


def _lacks(notebook: dict, info) -> list[tuple[str, str]]:
    python = info.python or "python"
    pip = f"{python} -m pip install"
    has_gpu = bool(info.gpus or info.gpu)
    out = []
    for package, name in (("nbdist", "nbdist"), ("tensorflow", "TensorFlow"), ("keras", "Keras")):
        want, have = notebook.get(package), getattr(info, package)
        if want is None or have == want:
            continue
        spec = {"nbdist": f"nbdist=={want}", "keras": f"keras=={want}",
                "tensorflow": f"'tensorflow[and-cuda]=={want}'" if has_gpu else f"tensorflow-cpu=={want}"}[package]
        command = f"{pip} {spec}"
        if package == "tensorflow" and info.horovod:  # Horovod is compiled against one TensorFlow
            command += f", then {python} -m nbdist.horovod install"
        out.append((f"{name} {have or 'is missing'}{' (the notebook has ' + want + ')' if have else ''}", command))
    built = info.horovod_built
    if notebook.get("horovod") and (info.horovod is None or (built and "error" in built)):
        reason = "no Horovod" if info.horovod is None else f"a Horovod that does not load ({built['error'][:80]})"
        out.append((f"{reason}, which --strategy hfdt needs", f"{python} -m nbdist.horovod install --force"
                    if info.horovod else f"{python} {HOROVOD_INSTALL.removeprefix('python ')}"))
    elif has_gpu and built and "error" not in built and not built.get("nccl"):
        out.append(("GPUs, but a Horovod built without NCCL: hfdt would reduce GPU gradients through the CPU",
                    f"{python} {HOROVOD_INSTALL.removeprefix('python ')} (with the CUDA toolkit and NCCL installed)"))
    return out
