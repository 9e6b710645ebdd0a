"""Build, cache and check Horovod 0.28.1 for this environment's TensorFlow: `python -m nbdist.horovod`.

    python -m nbdist.horovod install           # build once (minutes), cache the wheel, install it
    python -m nbdist.horovod install --check   # what the installed Horovod was built with, and what this host offers
    python -m nbdist.horovod build             # only build (or find) the cached wheel and print its path

Gloo is always built in; MPI when an MPI implementation is installed (`mpicc` and `mpirun`
on PATH); NCCL for GPU operations when the CUDA toolkit (nvcc) and NCCL are present.
scripts/setup.sh calls `install`, so `make setup` and a user's own environment share this recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.28.1"
INSTALL_COMMAND = "python -m nbdist.horovod install"
DEPENDENCIES = ["cloudpickle", "psutil", "pyyaml", "packaging"]  # the wheel's own requirements
BUILD_TIMEOUT_S = 3600
PIP_NOISE = "is ignored: it is neither"  # this machine's pip config names local indexes that may be absent


@dataclass(frozen=True)
class HostFeatures:
    """What this host offers Horovod's build: an MPI implementation, the CUDA toolkit and NCCL."""

    mpi: str | None = None  # e.g. "Open MPI 4.1.4", None without mpicc + mpirun
    cuda_home: str | None = None  # a directory with bin/nvcc
    nccl_home: str | None = None  # a directory with include/nccl.h and lib/libnccl.so (or lib64)

    @property
    def nccl(self) -> bool:
        return self.cuda_home is not None and self.nccl_home is not None

    def extras(self) -> list[str]:
        """The optional parts a build for this host includes, besides Gloo and TensorFlow."""
        return [name for name, present in (("mpi", self.mpi), ("nccl", self.nccl)) if present]


def cache_root(environ=os.environ) -> Path:
    """Where built wheels are kept: $NBDIST_CACHE, else $XDG_CACHE_HOME/nbdist, else ~/.cache/nbdist."""
    if environ.get("NBDIST_CACHE"):
        return Path(environ["NBDIST_CACHE"])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nbdist"


def wheel_dir(root: Path, tf_version: str, python: str, features: HostFeatures) -> Path:
    """The cache folder of one build; a Gloo-only build keeps the name scripts/setup.sh always used."""
    name = f"horovod-{VERSION}-tf{tf_version}-py{python}"
    return root / "-".join([name, *features.extras()])


def detect(environ=os.environ, without: tuple[str, ...] = ()) -> HostFeatures:
    """Look for MPI (mpicc + mpirun on PATH) and for CUDA + NCCL (the usual places, or
    HOROVOD_CUDA_HOME / CUDA_HOME and HOROVOD_NCCL_HOME); `without` drops "mpi" or "nccl"."""
    path = environ.get("PATH", os.defpath)
    mpi = None
    if "mpi" not in without and shutil.which("mpicc", path=path) and shutil.which("mpirun", path=path):
        mpi = _mpi_name(shutil.which("mpirun", path=path))
    cuda_home = nccl_home = None
    if "nccl" not in without:
        nvcc = shutil.which("nvcc", path=path)
        candidates = [environ.get("HOROVOD_CUDA_HOME"), environ.get("CUDA_HOME"), environ.get("CUDA_PATH"),
                      str(Path(nvcc).resolve().parent.parent) if nvcc else None, "/usr/local/cuda"]
        cuda_home = next((c for c in candidates if c and _is_cuda_home(Path(c))), None)
        homes = [environ.get("HOROVOD_NCCL_HOME"), cuda_home, "/usr", "/usr/local"]
        nccl_home = next((h for h in homes if h and _has_nccl(Path(h))), None) if cuda_home else None
    return HostFeatures(mpi, cuda_home, nccl_home)


def _is_cuda_home(home: Path) -> bool:
    """A CUDA toolkit: nvcc and the runtime headers (not just a wrapper script that calls nvcc elsewhere)."""
    return (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists()


def _has_nccl(home: Path) -> bool:
    headers = [home / "include" / "nccl.h", *home.glob("include/*-linux-gnu/nccl.h")]
    libraries = [p for d in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")
                 for p in (home / d / "libnccl.so", home / d / "libnccl_static.a")]
    return any(h.exists() for h in headers) and any(lib.exists() for lib in libraries)


def _mpi_name(mpirun: str) -> str:
    try:
        first = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "MPI"
    match = re.search(r"\((Open MPI|HYDRA|Intel\(R\) MPI[^)]*)\)\s*([\d.]+)?", first)
    if match:
        return " ".join(part for part in (match.group(1).replace("HYDRA", "MPICH"), match.group(2)) if part)
    return (first.splitlines() or ["MPI"])[0].strip()


def build_environment(features: HostFeatures, jobs: int | None = None) -> dict[str, str]:
    """The variables Horovod's setup.py reads for a TensorFlow build with what `features` offers."""
    env = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_GLOO": "1",
           "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1",
           "MAKEFLAGS": f"-j{jobs or os.cpu_count() or 2}",
           # pip's cmake 4.x rejects Gloo's old cmake_minimum_required; the system's 3.25 does not care
           "CMAKE_POLICY_VERSION_MINIMUM": "3.5"}
    env["HOROVOD_WITH_MPI" if features.mpi else "HOROVOD_WITHOUT_MPI"] = "1"
    if features.nccl:
        env.update({"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": features.cuda_home,
                    "HOROVOD_NCCL_HOME": features.nccl_home})
    return env


def patch_source(src: Path) -> None:
    """The one-line fix: TF 2.21 moved the XLA headers xla_mpi_ops.cc includes, and nbdist does not use XLA ops."""
    cmake_lists = src / "horovod" / "tensorflow" / "CMakeLists.txt"
    lines = cmake_lists.read_text().splitlines(keepends=True)
    cmake_lists.write_text("".join(line for line in lines if "xla_mpi_ops.cc" not in line))


def tensorflow_version() -> str:
    """The version of this environment's TensorFlow (the tensorflow, tensorflow-cpu or tf-nightly package)."""
    from importlib import metadata

    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit("TensorFlow is not installed in this environment; install it first "
                     "(pip install tensorflow-cpu==2.21.0, or 'tensorflow[and-cuda]==2.21.0' on a GPU host).")


def missing_tools(environ=os.environ) -> list[str]:
    """What Horovod's build needs and this host lacks (Debian package names)."""
    import sysconfig

    path = environ.get("PATH", os.defpath)
    missing = [pkg for tool, pkg in (("cmake", "cmake"), ("g++", "g++"), ("make", "make"))
               if not shutil.which(tool, path=path)]
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        missing.append("python3-dev")
    return missing


def build(features: HostFeatures, root: Path | None = None, force: bool = False, say=print) -> Path:
    """The cached wheel for this environment and `features`, built first when missing (or `force`)."""
    target = wheel_dir(root or cache_root(), tensorflow_version(), f"{sys.version_info[0]}{sys.version_info[1]}",
                       features)
    found = sorted(target.glob("horovod-*.whl"))
    if found and not force:
        return found[-1]
    if missing_tools():
        raise SystemExit(f"nbdist: building Horovod needs {', '.join(missing_tools())}: "
                         f"apt-get install {' '.join(missing_tools())} (or your system's equivalent), then rerun.")
    with_what = ", ".join(["Gloo", *(features.mpi and [features.mpi] or []), *(features.nccl and ["NCCL"] or [])])
    say(f"nbdist: building Horovod {VERSION} against TensorFlow {tensorflow_version()} with {with_what} "
        "(about 4 minutes on 2 cores, once)")
    target.mkdir(parents=True, exist_ok=True)
    for old in found:
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="nbdist-horovod-") as work:
        src = _unpacked_source(Path(work), (root or cache_root()) / "sdist")
        patch_source(src)
        env = {**os.environ, **build_environment(features)}
        if Path("/usr/bin/cmake").exists():  # ahead of a pip-installed cmake 4.x in the environment
            env["PATH"] = "/usr/bin" + os.pathsep + env.get("PATH", "")
        log = target / "build.log"
        _pip(["wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(target)], env=env, log=log,
             timeout=BUILD_TIMEOUT_S)
    return sorted(target.glob("horovod-*.whl"))[-1]


def _unpacked_source(work: Path, sdist_cache: Path) -> Path:
    """Horovod's sdist, downloaded once into the cache, unpacked into `work`."""
    archive = sdist_cache / f"horovod-{VERSION}.tar.gz"
    if not archive.exists():
        sdist_cache.mkdir(parents=True, exist_ok=True)
        _pip(["download", "--no-deps", "--no-binary", ":all:", f"horovod=={VERSION}", "-d", str(sdist_cache)],
             timeout=600)
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(work)
    return work / f"horovod-{VERSION}"


def install(features: HostFeatures, root: Path | None = None, force: bool = False, say=print) -> Path:
    """Build (or find) the wheel for `features` and install it into this environment."""
    wheel = build(features, root, force, say)
    say(f"nbdist: installing {wheel}")
    _pip(["install", "--no-deps", "--force-reinstall", str(wheel)], timeout=600)
    _pip(["install", *DEPENDENCIES], timeout=600)
    return wheel


def _pip(args: list[str], env=None, log: Path | None = None, timeout: float = 600) -> None:
    """Run this environment's pip; on failure raise SystemExit with the end of its output."""
    command = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    output = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if PIP_NOISE not in line)
    if log is not None:
        log.write_text(output)
    if done.returncode != 0:
        where = f" (full log: {log})" if log else ""
        raise SystemExit(f"nbdist: pip {args[0]} failed{where}:\n{output[-4000:]}")


def built_with() -> dict | None:
    """What the Horovod importable here was built with, or None without Horovod; {"error": ...} if it
    is installed but does not load (this imports TensorFlow)."""
    from importlib import metadata

    try:
        version = metadata.version("horovod")
    except metadata.PackageNotFoundError:
        return None
    try:
        import horovod.tensorflow as hvd
    except Exception as exc:  # a wheel built for another TensorFlow fails here with an undefined symbol
        return {"version": version, "error": f"{type(exc).__name__}: {exc}"}
    return {"version": version, "gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built()),
            "nccl": int(hvd.nccl_built() or 0), "cuda": bool(hvd.cuda_built()), "rocm": bool(hvd.rocm_built())}


def built_with_in(python: str = sys.executable, timeout: float = 120) -> dict | None:
    """`built_with()` in a fresh interpreter (what a new process would load after an install)."""
    code = "import json; from nbdist.horovod import built_with; print(json.dumps(built_with()))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode != 0:
        return {"version": "?", "error": (done.stderr.strip().splitlines() or ["the check crashed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def mpi_world(environ=os.environ) -> tuple[int, int] | None:
    """(rank, size) of this process in the job mpiexec started (Open MPI, MPICH / Intel MPI, PMIx), else None:
    an engine of `%dist start --engines mpi` knows its MPI rank before anything imports MPI."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                       ("PMIX_RANK", "PMIX_SIZE")):
        if environ.get(rank) is not None and environ.get(size) is not None:
            return int(environ[rank]), int(environ[size])
    return None


def init_over_mpi(world_ranks: list[int]):
    """`hvd.init` over MPI (controller and CPU operations) for the processes with these MPI ranks, given
    in Horovod rank order; every listed process calls it, no rendezvous is needed. MPI is initialised
    through mpi4py first, so `hvd.shutdown()` leaves it running and a later job can init again."""
    try:
        from mpi4py import MPI  # noqa: F401  (initialises MPI for the process, not for Horovod)
    except ImportError:
        pass
    import horovod.tensorflow as hvd

    if not hvd.mpi_built():
        raise RuntimeError(f"this Horovod was built without MPI; run `{INSTALL_COMMAND}` with MPI installed")
    if hvd.is_initialized():
        hvd.shutdown()
    os.environ.update({"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"})
    hvd.init(comm=list(world_ranks))
    return hvd


def check_report(built: dict | None, host: HostFeatures) -> tuple[str, bool]:
    """The text of `--check`, and whether the installed Horovod loads and has everything this host offers."""
    def yes(flag):
        return "yes" if flag else "no"

    offers = f"this host offers: Gloo, MPI {host.mpi or 'no'}, NCCL {yes(host.nccl)}" + (
        f" (CUDA {host.cuda_home}, NCCL {host.nccl_home})" if host.nccl else "")
    if built is None:
        return f"Horovod is not installed in {sys.prefix}; run `{INSTALL_COMMAND}`.\n{offers}", False
    if "error" in built:
        return (f"Horovod {built['version']} is installed but does not load: {built['error']}\n"
                f"Rebuild it for this TensorFlow: `{INSTALL_COMMAND} --force`.\n{offers}"), False
    nccl = f"yes (NCCL {built['nccl']})" if built["nccl"] else "no"
    lines = [f"Horovod {built['version']} in {sys.prefix}, built with: Gloo {yes(built['gloo'])}, "
             f"MPI {yes(built['mpi'])}, NCCL {nccl}, CUDA {yes(built['cuda'])}", offers]
    missing = [name for name, offered, has in (("MPI", host.mpi, built["mpi"]), ("NCCL", host.nccl, built["nccl"]))
               if offered and not has]
    if missing:
        lines.append(f"the installed build lacks {' and '.join(missing)}, which this host has: run `{INSTALL_COMMAND}`")
    return "\n".join(lines), built["gloo"] and not missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbdist.horovod", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["install", "build", "check"])
    parser.add_argument("--check", action="store_true", help="report what the installed Horovod was built with")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached wheel exists")
    parser.add_argument("--without-mpi", action="store_true", help="leave MPI out even when it is installed")
    parser.add_argument("--without-nccl", action="store_true", help="leave NCCL out even with CUDA and NCCL present")
    args = parser.parse_args(argv)
    without = tuple(name for name, flag in (("mpi", args.without_mpi), ("nccl", args.without_nccl)) if flag)
    features = detect(without=without)
    if args.action == "build":
        print(build(features, force=args.force))
        return 0
    if not (args.check or args.action == "check"):
        install(features, force=args.force)
    built = built_with_in()
    print(check_report(built, features)[0])
    return 0 if built is not None and "error" not in built else 1


if __name__ == "__main__":
    sys.exit(main())
