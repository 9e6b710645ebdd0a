"""The ipyparallel cluster nbdist trains on: start or connect, inventory, liveness, signals."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field, fields

from ..host import gpus, facts as host, namespace
from . import lifeline, memory_caps
from ..errors import ClusterError
from ..limits import LIMITS
from .memory_caps import MemoryCaps

# The hub unregisters an engine that misses LIMITS.hub_heartbeat_misses (5) 1 s heartbeats, so a dead engine
# is named within seconds rather than ipyparallel's default 30 s (clusters nbdist starts only).
HEARTBEAT_ARGS = ["--HeartMonitor.period=1000",
                  f"--HeartMonitor.max_heartmonitor_misses={LIMITS.hub_heartbeat_misses}"]
# ... and an engine shuts itself down after 5 checks (every period + 0.5 s) without the hub's ping,
# so engines on other hosts go within 7.5 s of their controller (ipyparallel's default: 50 checks).
# An engine runs the check between tasks: one in the middle of a task goes when the task ends.
ENGINE_ARGS = [f"--IPEngine.max_heartbeat_misses={LIMITS.engine_heartbeat_misses}"]


@dataclass
class EngineInfo:
    """One engine as `%dist status` shows it."""

    id: int
    host: str = "?"
    pid: int | None = None
    boot_id: str | None = None
    cpus: int | None = None
    gpus: list = field(default_factory=list)
    tensorflow: str | None = None
    keras: str | None = None
    horovod: str | None = None
    nbdist: str | None = None
    net_ns: int | None = None  # its network namespace (an engine in a container or netns has its own)
    python: str | None = None  # the engine's interpreter: where to install what it lacks
    gpu: str | None = None  # the host GPU it was pinned to (nbdist.host.gpus), * when shared
    threads: str | None = None  # its TensorFlow intra/inter-op threads, read back there (nbdist.host.threads)
    threads_how: str | None = None  # how they were set ("environment", "tf.config", "off", "not applied: ...")
    local_rank: int | None = None  # its index among the engines of its machine (the GPU it got)
    horovod_built: dict | None = None  # what its Horovod was built with (nbdist.horovod.built_with)

    def label(self) -> str:
        return f"engine {self.id} (host {self.host}, pid {self.pid})"


class ClusterHandle:
    """A client connection to an ipyparallel cluster, plus the cluster itself when nbdist started it."""

    def __init__(self, client, cluster=None, watcher: lifeline.Lifeline | None = None,
                 threads: int | str | None = None):
        self.client = client
        self.cluster = cluster  # an ipyparallel.Cluster when nbdist started it, else None
        self.lifeline = watcher  # stops (or releases) the cluster should this process die
        self.threads = threads  # --threads: None (each engine's share of its host), a number, or "off"
        self._info: dict[int, EngineInfo] = {}
        self._local_boot_id = host.boot_id()
        self._local_net_ns = host.network_namespace()
        self._local_machine = host.machine()
        self.warned: set[str] = set()  # compatibility warnings shown for this connection (once each)
        self.stopping: dict[int, object] = {}  # engine -> the task an interrupt has not ended yet (AsyncResult)
        self.caps = MemoryCaps()  # `%dist cap`: engines capped as smaller hosts

    @classmethod
    def start(cls, n: int, engines: str = "local", profile: str | None = None,
              threads: int | str | None = None) -> "ClusterHandle":
        """Start a cluster through `ipyparallel.Cluster` (any of its engine launchers) and wait for it;
        `threads`: each engine's TensorFlow threads (`nbdist.host.threads.share`'s override)."""
        import ipyparallel as ipp

        kwargs = {"n": n, "engines": engines, "controller_args": list(HEARTBEAT_ARGS),
                  "log_level": logging.WARNING, "engine_timeout": LIMITS.engine_start_s}
        if profile:
            kwargs["profile"] = profile
        cluster = ipp.Cluster(**kwargs)
        launcher_config = cluster.config.EngineLauncher
        launcher_config.engine_args = [*launcher_config.get("engine_args", []), *ENGINE_ARGS]
        cluster.config.merge(lifeline.kill_after_config())
        watcher = _watch(cluster, n, engines)  # before the first process, so none can outlive us unseen
        try:
            client = cluster.start_and_connect_sync()
        except Exception as exc:
            _stop_quietly(cluster)
            watcher.stop()
            raise ClusterError(f"could not start {n} {engines} engine(s): {exc}") from None
        return cls(client, cluster, watcher, threads)

    @classmethod
    def connect(cls, profile: str | None = None, cluster_id: str | None = None,
                file: str | None = None, timeout: float = 10, threads: int | str | None = None) -> "ClusterHandle":
        """Connect to a running cluster by profile, cluster id or connection file; `threads` as in `start`
        (engines whose TensorFlow started before keep their threads)."""
        import ipyparallel as ipp

        kwargs: dict = {"timeout": timeout}
        if file:
            kwargs["connection_info"] = file
        if profile:
            kwargs["profile"] = profile
        if cluster_id:
            kwargs["cluster_id"] = cluster_id
        try:
            client = ipp.Client(**kwargs)
        except (OSError, TimeoutError, ValueError) as exc:
            where = file or f"profile {profile or 'default'}" + (f", cluster id {cluster_id}" if cluster_id else "")
            raise ClusterError(
                f"could not connect to the cluster ({where}): {exc}. Is it running? "
                "Start one with `ipcluster start -n 4` or use %dist start."
            ) from None
        stale = lifeline.adoptable(lifeline.stale_clusters(), file or _client_file(profile, cluster_id))
        if stale is not None:  # nbdist started it for this notebook, in a kernel now gone: ours again
            return cls(client, *_adopt(stale), threads)
        where = {"connection_info": file, "profile": profile, "cluster_id": cluster_id}
        return cls(client, None, lifeline.Lifeline.start(release=where, log=_connected_log(client)), threads)

    def add(self, n: int, wait: bool = True) -> list[int]:
        """Start `n` more engines through the launcher of the cluster nbdist started; their ids (with `wait`
        False, [] at once: they register when they are up)."""
        if self.cluster is None:
            raise ClusterError("%dist add starts engines on a cluster nbdist started (%dist start). On a connected "
                               "cluster start them where it runs (ipcluster engines, or ipengine --file "
                               "ipcontroller-engine.json on another host): they register, and a running run "
                               "takes them in by itself.")
        self._require_client()
        before = set(self.client.ids)
        try:
            self.cluster.start_engines_sync(n)
            if not wait:
                return []
            self.client.wait_for_engines(len(before) + n, timeout=LIMITS.engine_start_s, block=True)
        except Exception as exc:  # the launcher's or the wait's: say which engines came
            came = sorted(set(self.client.ids) - before)
            raise ClusterError(f"could not add {n} engine(s): {exc}; registered: {came or 'none'} "
                               "(see %dist status)") from None
        return sorted(set(self.client.ids) - before)

    def running(self, engines, busy: bool = True) -> None:
        """Note that this kernel's training runs (or stopped running) on these engines (see `Lifeline.running`)."""
        if self.lifeline is not None:
            self.lifeline.running(engines, busy)

    @property
    def owned(self) -> bool:
        return self.cluster is not None

    def stop(self) -> None:
        """Stop the cluster if nbdist started it (its data caches removed on every host), else release its
        engines and disconnect. Idempotent."""
        if self.cluster is not None and self.client is not None:
            self._remove_caches()
        self.caps.release()
        client, cluster, watcher = self.client, self.cluster, self.lifeline
        self.client = self.cluster = self.lifeline = None
        if client is not None:
            if cluster is None:
                _release(client)
            client.close()
        if cluster is not None:
            _stop_quietly(cluster)
        if watcher is not None:
            watcher.stop()

    def cache_holdings(self) -> dict[str, dict]:
        """What this cluster's data cache holds on each host of its engines: {host: {"files", "bytes"}}."""
        from ..datasets import host_cache

        key, machines = self.cache_key, {}
        for eid in self.ids():
            machines.setdefault(self.machine_of(eid), eid)
        held = {}
        for eid in machines.values():
            try:
                held[self.info(eid).host] = (host_cache.holds(key) if self.is_local(eid) else
                                             self.client[eid].apply_sync(host_cache.holds, key))
            except Exception:  # noqa: BLE001 - an engine that cannot answer: its host is left out
                continue
        return held

    def _remove_caches(self) -> None:
        """The data this cluster placed on each host (`host_cache`): this host's here, another's by one of its
        engines (best effort: a cache left behind is bounded, and named by the cluster)."""
        from ..datasets import host_cache

        key = self.cache_key
        host_cache.remove(key)
        remote = {}
        for eid in self.ids():
            if eid in self._info and not self.is_local(eid):  # a cache is placed through probed engines only
                remote.setdefault(self.machine_of(eid), eid)
        calls = [self.client[eid].apply_async(host_cache.remove, key) for eid in remote.values()]
        deadline = time.monotonic() + LIMITS.engine_release_s  # best effort: a stop must not wait on a lost hub
        for call in calls:
            try:
                call.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - an engine that cannot answer now leaves a bounded cache
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- engines -------------------------------------------------------------------------
    def ids(self) -> list[int]:
        """Engine ids the hub considers alive."""
        self._require_client()
        return sorted(self.client.ids)

    def busy(self) -> set[int]:
        """Engines with work queued or running (by any client).

        Right after a result arrives the hub can still count its task for a few milliseconds; when this
        client waits for nothing itself, the hub is asked again (bounded) before an engine reads as busy.
        """
        ids = self.ids()
        if not ids:
            return set()
        deadline = time.time() + LIMITS.hub_settle_s
        while True:
            status = self.client.queue_status(targets=ids)
            busy = {eid for eid in ids if status.get(eid, {}).get("queue", 0) or status.get(eid, {}).get("tasks", 0)}
            if not busy or self.client.outstanding or time.time() > deadline:
                return busy
            time.sleep(0.01)

    def settle(self, timeout: float) -> list[int]:
        """Wait (at most `timeout` s in all) for the tasks a stopped run left ending (`stopping`); the engines
        whose task still runs."""
        deadline = time.time() + timeout
        for eid, task in list(self.stopping.items()):
            try:
                task.wait(max(0.0, deadline - time.time()))
            except Exception:  # the interrupt ends the task with an error: expected
                pass
            if task.ready() or eid not in self.ids():
                del self.stopping[eid]
        return sorted(self.stopping)

    def info(self, eid: int) -> EngineInfo:
        return self._info.get(eid) or EngineInfo(eid)

    def probed(self, eid: int) -> bool:
        """Whether engine `eid` has been probed (its host, pid, CPUs and GPUs known; a failed probe counts)."""
        return eid in self._info

    def known_ids(self) -> list[int]:
        """Engines alive or probed before, from what this client already holds (no round trip to the hub)."""
        return sorted(set(self.client.ids if self.client else ()) | set(self._info))

    def refresh(self, ids: list[int] | None = None) -> None:
        """Probe idle engines not yet known (imports TensorFlow there, warming them up), after pinning
        their GPU and their TensorFlow threads (engines probed before keep theirs)."""
        busy = self.busy()
        todo = [e for e in (ids if ids is not None else self.ids()) if e not in self._info and e not in busy]
        if not todo:
            return
        slots = self._gpu_slots(todo)
        results = {eid: self.client[eid].apply_async(_pin_then_probe, slots.get(eid), self.threads) for eid in todo}
        known = {f.name for f in fields(EngineInfo)}  # an engine with another nbdist may report more or less
        for eid, ar in results.items():
            try:
                probed = ar.get(timeout=LIMITS.engine_probe_s)
                self._info[eid] = EngineInfo(eid, **{k: v for k, v in probed.items() if k in known and k != "id"})
            except Exception as exc:  # a broken engine still gets a row, marked by its error
                self._info[eid] = EngineInfo(eid, host=f"? ({type(exc).__name__})")

    def _gpu_slots(self, todo: list[int]) -> dict[int, tuple]:
        """(local rank, local size, shares the kernel's GPUs) of each new engine on its machine, so its
        GPU (nbdist.host.gpus) and its share of the machine's cores (nbdist.host.threads) are pinned before its
        TensorFlow starts."""
        calls = {eid: self.client[eid].apply_async(_call, "nbdist.host.facts.machine") for eid in todo}
        machines = {}
        for eid, ar in calls.items():
            try:
                machines[eid] = ar.get(timeout=LIMITS.engine_probe_s)
            except Exception:  # probed next without a slot, and its row says what failed
                continue
        alive = set(self.ids())
        ranked = {eid: i for eid, i in self._info.items() if eid in alive and i.local_rank is not None}
        machines.update({eid: i.boot_id or i.host for eid, i in ranked.items()})
        slots = gpus.local_ranks(machines, {eid: i.local_rank for eid, i in ranked.items()})
        kernel = gpus.kernel_uses_gpus()
        return {eid: (*slots[eid], kernel and machines[eid] == self._local_machine) for eid in todo if eid in slots}

    def inventory(self) -> list[tuple[EngineInfo, str]]:
        """(info, state) for every engine seen: idle, busy or dead."""
        self.refresh()
        alive = set(self.ids())
        busy = self.busy()
        rows = []
        for eid in sorted(alive | set(self._info)):
            state = "dead" if not self.is_alive(eid, alive) else ("busy" if eid in busy else "idle")
            rows.append((self.info(eid), state))
        return rows

    def is_alive(self, eid: int, alive: set[int] | None = None) -> bool:
        """Registered with the hub and, for an engine on this machine, its process still running."""
        if eid not in (alive if alive is not None else set(self.ids())):
            return False
        if not self.is_local(eid) or self._info[eid].pid is None:
            return True
        return _process_running(self._info[eid].pid)

    def machine_of(self, eid: int) -> str:
        """Which machine the engine runs on (its boot id, else its host name): engines of one share its cache."""
        info = self._info.get(eid)
        return (info.boot_id or info.host) if info is not None else f"engine {eid}"

    @property
    def cache_key(self) -> str:
        """The name of this cluster's data cache on each host (`host_cache`): its id when nbdist started it,
        else a digest of the key its clients sign with (the same for every kernel that connects to it)."""
        if self.cluster is not None:
            return self.cluster.cluster_id
        return hashlib.sha256(self.client.session.key).hexdigest()[:16]

    def cap_memory(self, nbytes: int | None, ids: list[int] | None = None) -> list[int]:
        """`%dist cap`: cap each engine of `ids` (default: every engine) at `nbytes` of memory from now on
        (`nbdist.cluster.memory_caps`; None lifts the cap); returns the engines capped."""
        why = memory_caps.why_unavailable()
        ids = sorted(ids if ids is not None else self.ids())
        if nbytes is None:
            for eid in [e for e in ids if e in self.caps.groups]:
                self.caps.lift(eid)
            return []
        if why:
            raise ClusterError(f"%dist cap cannot cap engines' memory here: {why}.")
        self.refresh(ids)  # (probed first: TensorFlow's import is not counted)
        far = [eid for eid in ids if eid not in self.ids() or not self.is_local(eid) or self.info(eid).pid is None]
        if far:
            raise ClusterError(f"%dist cap caps engines on this machine only; engine(s) {far} run elsewhere or are "
                               f"not running (engines: {self.ids()}).")
        for call in [self.client[eid].apply_async(_call, "nbdist.cluster.memory_caps.small_pages") for eid in ids]:
            call.get(timeout=LIMITS.engine_probe_s)
        for eid in ids:
            self.caps.cap(eid, self.info(eid).pid, nbytes)
        return ids

    def is_local(self, eid: int) -> bool:
        """Whether the engine runs on this machine (same boot id as the kernel)."""
        info = self._info.get(eid)
        return info is not None and info.boot_id is not None and info.boot_id == self._local_boot_id

    def shares_network(self, eid: int) -> bool:
        """Whether the engine reaches this kernel's loopback: same machine and same network namespace."""
        info = self._info.get(eid)
        return self.is_local(eid) and info.net_ns is not None and info.net_ns == self._local_net_ns

    def address_towards(self, engines: list[int]) -> str:
        """The kernel's address the engines reach its services at (a run's PS, rendezvous, control bus):
        loopback when every one shares this kernel's network, else its address towards the cluster."""
        from ..host.netroute import address_towards_cluster

        return address_towards_cluster(self.client, all(self.shares_network(e) for e in engines))

    def signal(self, ids: list[int], sig: int = signal.SIGINT) -> None:
        """Send `sig` to the engines' processes (SIGINT raises KeyboardInterrupt in running code)."""
        live = [e for e in ids if e in set(self.ids())]
        if live:
            self.client.send_signal(sig, targets=live, block=False)

    def _require_client(self):
        if self.client is None:
            raise ClusterError("the cluster was stopped; use %dist start or %dist connect")


def _call(path: str, *args):
    """Runs on an engine: its own installed nbdist's function `path` (not this kernel's copy of the code)."""
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(*args)


def _pin_then_probe(slot, threads=None):
    """Runs on an engine: pin its GPU and its TensorFlow threads when its nbdist can (`slot` from
    `_gpu_slots`, `threads` the override of `nbdist.host.threads.share`), then probe it."""
    import importlib

    if slot is not None:
        for module, args in (("nbdist.host.gpus", slot), ("nbdist.host.threads", (slot[1], threads))):
            try:
                importlib.import_module(module).pin(*args)
            except ImportError:  # an engine with an older nbdist: probed as it is
                pass
    return importlib.import_module("nbdist.engine.engine").probe()


def _process_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _connected_log(client) -> str:
    """Where the watcher of a connected cluster writes what went wrong releasing it: the client's profile's log
    folder (the system's temporary folder when the client has no profile)."""
    profile = getattr(client, "_profile_dir", None)  # (ipyparallel keeps it private)
    folder = getattr(profile, "log_dir", None) or tempfile.gettempdir()
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"nbdist-lifeline-connected-{os.getpid()}.log")


def _watch(cluster, n: int, engines: str) -> lifeline.Lifeline:
    """The lifeline of a cluster this process starts, with the record a later kernel finds it by."""
    import psutil

    security = os.path.join(cluster.profile_dir, "security")
    record = {"path": lifeline.record_path(cluster.profile_dir, cluster.cluster_id),
              "cluster_id": cluster.cluster_id, "profile_dir": cluster.profile_dir,
              "cluster_file": cluster.cluster_file,
              "client_file": os.path.join(security, f"ipcontroller-{cluster.cluster_id}-client.json"),
              "kernel_pid": os.getpid(), "kernel_started": psutil.Process().create_time(),
              "notebook": lifeline.notebook_id(), "started_at": time.time(), "n": n, "engines": engines}
    log = os.path.join(cluster.profile_dir, "log", f"nbdist-lifeline-{cluster.cluster_id}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    return lifeline.Lifeline.start(cluster_file=cluster.cluster_file, record=record, log=log,
                                   on_sigterm=lambda: _stop_quietly(cluster))


def _adopt(record: dict):
    """(cluster, lifeline) for a cluster a previous kernel of this notebook started."""
    from ipyparallel.cluster import Cluster

    cluster = Cluster.from_file(record["cluster_file"], log=logging.getLogger("nbdist.adopted"),
                                config=lifeline.kill_after_config())
    return cluster, _watch(cluster, record.get("n", 0), record.get("engines", "local"))


def _client_file(profile: str | None, cluster_id: str | None) -> str:
    """The connection file `ipp.Client(profile=..., cluster_id=...)` reads."""
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir

    try:
        security = ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile or "default").security_dir
    except ProfileDirError:
        return ""
    name = f"ipcontroller-{cluster_id}-client.json" if cluster_id else "ipcontroller-client.json"
    return os.path.join(security, name)


def _release(client) -> None:
    """Clear what nbdist's cells left on a connected cluster's engines (they keep running)."""
    try:
        if client.ids:
            client[:].apply_async(namespace.release).get(timeout=LIMITS.engine_release_s)
    except Exception as exc:  # a busy engine releases when its task ends; the disconnect goes on
        logging.getLogger("nbdist").info("releasing the engines: %s", exc)


def _stop_quietly(cluster) -> None:
    # Engines exit non-zero on SIGTERM, and ipyparallel then logs their whole output as a warning.
    for launcher in [cluster, cluster.controller, *cluster.engines.values()]:
        if launcher is not None and getattr(launcher, "log", None) is not None:
            launcher.log.setLevel(logging.ERROR)
    try:
        lifeline.halt(cluster)
    except Exception as exc:  # stopping must not hide the error that led here
        logging.getLogger("nbdist").warning("stopping the cluster: %s", exc)

