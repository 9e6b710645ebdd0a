"""A lifeline: what nbdist started on this host stops once the process that started it is gone, however it went.

`Lifeline.start` spawns a small watcher (``python -m nbdist.cluster.lifeline``) in a session of its own,
so neither the kernel's process-group kill (jupyter_client's restart, ``kill -9``) nor a
terminal's Ctrl-C reaches it. The watcher reads commands on a pipe from the kernel and
checks every `POLL_S` that the kernel is still its parent. When the pipe closes without
``release`` or the kernel is gone, it stops the cluster through ipyparallel's own API
(``Cluster.from_file(...)``, as ``ipcluster stop`` does, then `halt`: the launchers' signals
and ``stop_cluster``, so SSH, Slurm or PBS engines are stopped by their launchers), kills the
shard processes it was told about (and the shared-memory segments and socket directory of each:
`nbdist.ps.same_host`), and exits. For a cluster nbdist only connected to, it stops nothing: it releases the
engines (`namespace.release`) and exits. A normal `%dist stop` sends ``release``: the watcher
exits without touching anything.

Clusters nbdist starts also get a record, ``nbdist-<cluster id>.json`` next to ipyparallel's
connection files, naming the kernel and the notebook; `stale_clusters` reads them, so a new
kernel can say that a previous one left a cluster running (its watcher died with it).
"""

from __future__ import annotations

import argparse
import atexit
import glob
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref

from ..limits import LIMITS
from ..ps import same_host, started

POLL_S = 0.2
RECORD_GLOB = "profile_*/security/nbdist-*.json"

_active: weakref.WeakSet = weakref.WeakSet()  # the lifelines of this process
_sigterm_installed = False
_exit_hook_installed = False
_warned = False  # in a watcher: whether its log has something worth keeping


def notebook_id() -> str:
    """What identifies "this notebook" across kernel restarts: Jupyter's session path, else the working directory."""
    return os.environ.get("JPY_SESSION_NAME") or os.getcwd()


def record_path(profile_dir: str, cluster_id: str) -> str:
    """Where nbdist keeps its record of a cluster it started (next to ipyparallel's connection files)."""
    return os.path.join(profile_dir, "security", f"nbdist-{cluster_id}.json")


class Lifeline:
    """The watcher of one cluster, seen from the process it watches over. `stop()` is idempotent.

    Args:
        process: the watcher's Popen (its stdin is the command pipe).
        record: the path of the cluster's nbdist record, or None (a connected cluster has none).
        on_sigterm: what stops the cluster when this process gets SIGTERM or exits with it running, or None.
    """

    def __init__(self, process: subprocess.Popen, record: str | None = None, on_sigterm=None, log: str | None = None):
        self.process = process
        self.record = record
        self.log = log  # the watcher's stderr, kept after it exits only when something went wrong
        self.on_sigterm = on_sigterm
        self._lock = threading.Lock()
        _active.add(self)

    @classmethod
    def start(cls, *, cluster_file: str | None = None, record: dict | None = None,
              release: dict | None = None, log: str | None = None, on_sigterm=None) -> "Lifeline":
        """Start a watcher that stops the cluster of `cluster_file` (or releases the engines of the
        cluster `release` connects to: Client keyword arguments) once this process is gone.

        `record` (written to ``record["path"]`` with the watcher's pid) marks a cluster nbdist started.
        """
        # `python -m nbdist.cluster.lifeline`, less runpy's warning that nbdist imported the module already
        argv = [sys.executable, "-c", "from nbdist.cluster.lifeline import main; main()", "--pid", str(os.getpid())]
        if log:
            argv += ["--log", log]
        if cluster_file:
            argv += ["--cluster-file", cluster_file]
        if record:
            argv += ["--record", record["path"]]
            record = {**record, "log": log}
        if release is not None:
            argv += ["--release", json.dumps(release)]
        stderr = open(log, "ab") if log else subprocess.DEVNULL
        try:
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr,
                                       start_new_session=True)  # out of the kernel's process group
        finally:
            if log:
                stderr.close()
        if record:
            watcher = {"watcher_pid": process.pid, "watcher_started": _started(process.pid)}
            _write_json(record["path"], {**record, **watcher})
        if on_sigterm is not None:
            _install_exit_hook()
            _install_sigterm_handler()
        return cls(process, record["path"] if record else None, on_sigterm, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    def track(self, pid: int) -> None:
        """Have the watcher kill process `pid` (a PS shard) too, should this process die first."""
        self._send(f"track {pid}")

    def untrack(self, pid: int) -> None:
        """Forget process `pid` (it was stopped normally)."""
        self._send(f"untrack {pid}")

    def running(self, engines, busy: bool = True) -> None:
        """Tell the watcher these engines run (or no longer run) this process's training: should this
        process die, the watcher interrupts them before releasing a connected cluster."""
        if engines:
            self._send(f"{'busy' if busy else 'idle'} {','.join(map(str, engines))}")

    def stop(self) -> None:
        """Release the watcher (it exits and touches nothing) and remove the record."""
        _active.discard(self)
        self.on_sigterm = None
        if self.process.stdin is not None and not self.process.stdin.closed:
            self._send("release")
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(LIMITS.lifeline_release_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(LIMITS.lifeline_release_s)
        if self.record:
            _remove(self.record)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def _send(self, line: str) -> None:
        with self._lock:
            try:
                self.process.stdin.write(f"{line}\n".encode())
                self.process.stdin.flush()
            except (OSError, ValueError):  # the watcher is gone or released: nothing to tell it
                pass


def track(pid: int) -> None:
    """Tell every lifeline of this process about a child process to kill if this process dies (no-op without one)."""
    for line in list(_active):
        line.track(pid)


def untrack(pid: int) -> None:
    """Forget a child process `track` named (it was stopped normally)."""
    for line in list(_active):
        line.untrack(pid)


started.listen(track, untrack)  # the parameter-server shards this process starts


def _install_sigterm_handler() -> None:
    """SIGTERM stops the clusters this process started, then terminates it as SIGTERM would have.

    Only over the default action and only from the main thread (where Python allows it); a
    process with a handler of its own keeps it, and the watcher still stops the cluster.
    """
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True


def _install_exit_hook() -> None:
    """At interpreter exit (a script's end, an uncaught KeyboardInterrupt from SIGINT) the clusters this
    process started stop the fast way, all processes signalled at once; registered after ipyparallel's own
    exit hook, so it runs first and that hook, which waits on each process in turn, finds them gone."""
    global _exit_hook_installed
    if not _exit_hook_installed:
        atexit.register(_stop_clusters, "at exit")
        _exit_hook_installed = True


def _stop_clusters(why: str) -> None:
    for line in list(_active):
        callback, line.on_sigterm = line.on_sigterm, None
        if callback is not None:
            try:
                callback()
            except Exception as exc:  # still go on: the watcher finishes what this could not
                print(f"nbdist: stopping the cluster {why}: {exc}", file=sys.stderr)


def _on_sigterm(signum, frame):
    _stop_clusters("on SIGTERM")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# -- records of clusters nbdist started ------------------------------------------------------
def stale_clusters(notebook: str | None = None) -> list[dict]:
    """Clusters nbdist started for `notebook` (default: this one) whose kernel is gone but which still run.

    Records of clusters that no longer run are removed on the way.
    """
    from IPython.paths import get_ipython_dir

    notebook = notebook or notebook_id()
    found = []
    for path in sorted(glob.glob(os.path.join(get_ipython_dir(), RECORD_GLOB))):
        record = _read_json(path)
        if record is None or _alive(record.get("kernel_pid"), record.get("kernel_started")):
            continue
        if not _cluster_running(record.get("cluster_file")):
            _remove(path, record.get("log"))
        elif record.get("notebook") == notebook:
            found.append({**record, "path": path})
    return found


def stop_stale(records: list[dict]) -> list[str]:
    """Stop the clusters of stale records (and their watchers, should one still run); the ids stopped."""
    stopped = []
    for record in records:
        _kill(record.get("watcher_pid"), record.get("watcher_started"))
        _stop_cluster(record.get("cluster_file"))
        _remove(record["path"], record.get("log"))
        stopped.append(record["cluster_id"])
    return stopped


def adoptable(records: list[dict], client_file: str) -> dict | None:
    """The stale record whose cluster `client_file` connects to, if any."""
    target = os.path.realpath(client_file)
    return next((r for r in records if os.path.realpath(r.get("client_file", "")) == target), None)


def describe_stale(records: list[dict]) -> str:
    """What `%dist status` says about clusters previous kernels of this notebook left running."""
    lines = []
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.get("started_at", 0)))
        lines.append(f"nbdist: a cluster a previous kernel of this notebook started is still running: "
                     f"cluster id {r['cluster_id']} ({r.get('n', '?')} {r.get('engines', '?')} engine(s), "
                     f"started {when} by kernel pid {r.get('kernel_pid')}, which is gone). "
                     f"Use it with `%dist connect --file {r['client_file']}`, or stop it with `%dist stop --stale`.")
    return "\n".join(lines)


def _cluster_running(cluster_file: str | None) -> bool:
    """Whether any process of the cluster file is alive (ipyparallel removes the file once all stopped)."""
    data = _read_json(cluster_file) if cluster_file else None
    if not data:
        return False
    controller = data.get("controller") or {}
    engines = data.get("engines") or {}
    parts = [(controller.get("class"), [(controller.get("state") or {}).get("pid")])] if controller else []
    for engine_set in (engines.get("sets") or {}).values():
        pids = [e.get("pid") for e in (engine_set.get("engines") or {}).values()] or [engine_set.get("pid")]
        parts.append((engines.get("class"), pids))
    # a launcher that is not local (SSH, batch jobs) holds pids of other hosts: running while listed
    return any(kind != "local" or any(pid and pid > 0 and _alive(pid) for pid in pids) for kind, pids in parts)


def _alive(pid, started: float | None = None) -> bool:
    import psutil

    if not pid:
        return False
    try:
        process = psutil.Process(pid)
        if started is not None and abs(process.create_time() - started) > 1.0:
            return False  # the pid was reused
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _started(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _kill(pid, started: float | None = None, sig=signal.SIGKILL) -> None:
    if _alive(pid, started):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_after_config():
    """Launcher config: a process that ignores SIGTERM is killed after `LIMITS.launcher_kill_after_s`."""
    from traitlets.config import Config

    return Config({"LocalProcessLauncher": {"stop_seconds_until_kill": LIMITS.launcher_kill_after_s,
                                            "stop_timeout": LIMITS.launcher_reap_s}})


def halt(cluster) -> None:
    """Stop an `ipyparallel.Cluster` now, engines in the middle of a task included.

    `stop_cluster` stops one engine after another, each given the kill delay, and a busy
    engine ignores SIGTERM until its task ends: n busy engines would take n delays. So first
    every engine gets SIGINT (which interrupts a task; an idle engine ignores it) and SIGTERM
    at once, those on this host are killed together after one delay, and only then is the
    controller stopped (a dying engine's nanny still reaches it and exits at once).
    """
    import psutil

    launchers = []  # one per engine: a local engine set holds one launcher per engine, others are one
    for engine_set in list(cluster.engines.values()):
        launchers += list((getattr(engine_set, "launchers", None) or {0: engine_set}).values())
    local = [p for p in (getattr(launcher, "process", None) for launcher in launchers) if isinstance(p, psutil.Process)]
    local += [child for p in local for child in _children(p)]  # nannies, shards on the engines
    for sig in (signal.SIGINT, signal.SIGTERM):
        for launcher in launchers:
            try:
                launcher.signal(sig)
            except Exception:  # gone already; stop_cluster deals with the rest
                pass
    deadline = time.time() + LIMITS.launcher_kill_after_s
    while time.time() < deadline and any(_alive(p.pid, p.create_time()) for p in local):
        time.sleep(0.05)
    for process in local:
        _kill(process.pid, process.create_time())
    cluster.stop_cluster_sync()


def _children(process) -> list:
    import psutil

    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def _stop_cluster(cluster_file: str | None) -> None:
    """`ipcluster stop` for one cluster file, quietly; nothing if the file is gone."""
    import logging

    if not cluster_file or not os.path.exists(cluster_file):
        return
    from ipyparallel.cluster import Cluster

    log = logging.getLogger("nbdist.cluster.lifeline")
    log.setLevel(logging.CRITICAL)  # dead engines' exit codes and output are not news here
    try:
        halt(Cluster.from_file(cluster_file, log=log, config=kill_after_config()))
    except Exception as exc:
        _warn(f"stopping {cluster_file}: {exc!r}")


def _write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _remove(*paths: str | None) -> None:
    for path in paths:
        try:
            if path:
                os.remove(path)
        except FileNotFoundError:
            pass


# -- the watcher process -----------------------------------------------------------------------
def _warn(message: str) -> None:
    global _warned
    _warned = True
    print(f"nbdist lifeline: {message}", file=sys.stderr, flush=True)


def watch(parent: int, cluster_file: str | None, record: str | None, release: dict | None,
          commands: int = 0) -> str:
    """Wait until `parent` is gone (or releases us); then clean up. Returns what happened."""
    tracked: dict[int, float] = {}  # pid -> create time, so a reused pid is never killed
    busy: set[int] = set()  # engines running the parent's training
    pending = b""
    while True:
        readable, _, _ = select.select([commands], [], [], POLL_S)
        if readable:
            chunk = os.read(commands, 4096)
            if not chunk:
                break  # the pipe closed without "release": the parent died (or dropped us)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                verb, _, arg = line.decode().partition(" ")
                if verb == "release":
                    return "released"
                if verb == "track":
                    started = _started(int(arg))
                    if started is not None:  # gone already: nothing to kill later
                        tracked[int(arg)] = started
                elif verb == "untrack":
                    tracked.pop(int(arg), None)
                elif verb in ("busy", "idle"):
                    engines = {int(e) for e in arg.split(",") if e}
                    busy = busy | engines if verb == "busy" else busy - engines
        if os.getppid() != parent:  # reparented: the parent is gone, even if a fork still holds the pipe
            break
    for pid, started in tracked.items():
        _kill(pid, started, signal.SIGTERM)
    if cluster_file:
        _stop_cluster(cluster_file)
    if release is not None:
        _release_engines(release, sorted(busy))
    deadline = time.time() + LIMITS.shard_term_grace_s
    while any(_alive(pid, started) for pid, started in tracked.items()) and time.time() < deadline:
        time.sleep(POLL_S)
    for pid, started in tracked.items():
        _kill(pid, started)
        same_host.remove_leftovers(pid)  # what a shard killed before it could clean up leaves in /dev/shm
    if record:
        _remove(record)
    return "cleaned up"


def _release_engines(where: dict, busy: list[int] = ()) -> None:
    """Interrupt the dead kernel's training on the engines `busy`, then clear nbdist's objects from a
    connected cluster's engines; never stop them (another client may use them next)."""
    import ipyparallel as ipp

    from ..host import namespace

    try:
        client = ipp.Client(timeout=LIMITS.watcher_release_s, **{k: v for k, v in where.items() if v})
    except Exception as exc:
        _warn(f"could not reach the cluster to release it: {exc!r}")
        return
    interrupted: list[int] = []  # (named in the warning, whatever failed)
    try:
        interrupted = [eid for eid in busy if eid in client.ids]
        if interrupted:  # a training cell of a kernel that is gone would otherwise hold them to its end
            client.send_signal(signal.SIGINT, targets=interrupted, block=True)
        if client.ids:
            client[:].apply_async(namespace.release).get(timeout=LIMITS.watcher_release_s)
    except Exception as exc:  # a busy engine runs the release when its task ends
        _warn(f"releasing the engines: {exc!r}; interrupted {interrupted}; {_queues(client)}")
    finally:
        client.close()


def _queues(client) -> str:
    """What the hub holds for each engine, for the log of a release that did not complete. Asked from a thread of
    its own and waited for a bounded time: ipyparallel's `queue_status` waits for ever for a hub that is gone."""
    answer: list = []

    def ask():
        try:
            answer.append(client.queue_status(verbose=True))
        except Exception as exc:
            answer.append(exc)

    asking = threading.Thread(target=ask, name="nbdist-lifeline-queues", daemon=True)
    asking.start()
    asking.join(LIMITS.watcher_release_s)
    if not answer:
        return f"the hub did not say what it holds within {LIMITS.watcher_release_s:g} s"
    return f"the hub's queues: {answer[0]!r}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nbdist.cluster.lifeline", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the process to watch (our parent)")
    parser.add_argument("--cluster-file", help="ipyparallel cluster file of the cluster to stop")
    parser.add_argument("--record", help="nbdist's record of the cluster, removed after")
    parser.add_argument("--release", type=json.loads, help="Client keyword arguments (JSON) of a cluster to release")
    parser.add_argument("--log", help="where stderr goes; removed at the end unless something went wrong")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the parent's death or "release" ends a watcher
    # imported now, so that cleaning up after a death does not wait for the import
    if args.cluster_file:
        import ipyparallel.cluster  # noqa: F401
    if args.release is not None:
        import ipyparallel  # noqa: F401
    outcome = watch(args.pid, args.cluster_file, args.record, args.release, sys.stdin.fileno())
    if args.log and not _warned:
        _remove(args.log)
    else:
        print(f"nbdist lifeline of pid {args.pid}: {outcome}", file=sys.stderr)


if __name__ == "__main__":
    main()
