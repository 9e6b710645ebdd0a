"""The parameter server of one run, seen from the kernel: its shards, their health, checkpoints."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass

from ..errors import NbdistError
from ..limits import LIMITS
from . import checkpoint, launcher, wire
from .client import PsClient, PsUnavailable, merged
from .shard import CONTROLLER

NON_TRAINABLE = "n"  # the prefix of a non-trainable variable's name (strategies.parameter_server.variable_names)

MONITOR_INTERVAL_S = 1.0


@dataclass
class ShardProcess:
    index: int
    host: str
    pid: int
    address: str  # tcp://ip:port
    engine: int | None = None  # the engine whose host runs it; None: the notebook host
    incarnation: int = 0  # restarts so far


class PsService:
    """Starts the shards, watches them, checkpoints them, and stops them.

    Args:
        run_id: the run's number (names the checkpoint file).
        shards: how many shards to start.
        workers: the number of workers the shards will serve.
        settings: what every shard applies: max_staleness (None: unbounded), rule (None: the
            cell's optimizer; see updaters.make_updater), synchronous (ssgd rounds).
        checkpoint_dir / checkpoint_every_s: where and how often the PS state is saved.
        restarts: how many times a shard on this host that dies is restarted from the last
            checkpoint (on the same port, so workers reconnect) before the run fails.
    """

    def __init__(self, run_id: int, shards: int, workers: int, settings: dict,
                 checkpoint_dir: str, checkpoint_every_s: float, restarts: int = 0):
        self.run_id, self.count, self.workers = run_id, shards, workers
        self.restarts_left = restarts
        self.restarts: list[dict] = []  # shard_restarted events, for the run
        self._bind: str | None = None
        self.settings = settings
        self.checkpoint_dir, self.checkpoint_every_s = checkpoint_dir, checkpoint_every_s
        self.key = wire.new_key()
        self.shards: list[ShardProcess] = []
        self.failure: str | None = None
        self.last_checkpoint: dict | None = None  # {"path", "version", "saved_at"}
        self.log_dir = tempfile.mkdtemp(prefix=f"nbdist-ps-run{run_id}-")
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._log_seen = 0  # push-log entries `recent` has returned
        self._telemetry: PsClient | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, bind: str, cluster=None, engines: list[int] | None = None) -> None:
        """Start the shards on this host (engines None) or round-robin on the hosts of `engines`."""
        self._bind = bind
        for i in range(self.count):
            config = {**self.settings, "shard": i, "workers": self.workers, "log_path": self.push_log_path(i)}
            if engines:
                eid = engines[i % len(engines)]
                started = cluster.client[eid].apply_async(launcher.start_shard_towards, config, self.key, bind)
                info = started.get(timeout=LIMITS.shard_engine_call_s)
            else:
                eid = None
                info = launcher.start_shard({**config, "bind": bind}, self.key, self.shard_log(i))
                info["ip"] = bind
            self.shards.append(ShardProcess(i, info["host"], info["pid"], f"tcp://{info['ip']}:{info['port']}", eid))
        self._monitor = threading.Thread(target=self._watch, name=f"nbdist-ps-monitor-{self.run_id}", daemon=True)
        self._monitor.start()

    def shard_log(self, shard: int) -> str:
        """Where a shard on this host writes its stderr."""
        return os.path.join(self.log_dir, f"shard-{shard}.log")

    def push_log_path(self, shard: int) -> str:
        """Where shard `shard` streams its whole push log: beside the run's checkpoint."""
        return os.path.abspath(os.path.join(self.checkpoint_dir, f"run-{self.run_id}.pushlog-{shard}.jsonl"))

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.shards]

    def restore(self, state: dict) -> None:
        """Hand every shard a checkpoint; each takes its own variables from it when the model arrives."""
        with self._client() as client:
            client.request("restore", [state["arrays"]] * len(self.shards), version=int(state.get("version", 0)))

    def control(self, action: str, value=None) -> list[dict]:
        """Send one control to every shard; returns each shard's control state (the acknowledgement)."""
        with self._client() as client:
            return [reply.header for reply in client.request("control", action=action, value=value)]

    def admit(self, worker: int, epochs: int) -> dict:
        """Take worker `worker` into the running fit on every shard: {"admitted", "first_epoch"} or
        {"admitted": False, "reason"}. A shard that refuses (a fit ended there first) refuses for all."""
        with self._client() as client:
            answers = [r.header for r in client.request("admit", worker_id=worker, epochs=epochs)]
            refused = next((a for a in answers if not a.get("admitted")), None)
            if refused is not None:
                if any(a.get("admitted") for a in answers):
                    client.request("drop", worker_id=worker)
                return refused
        self.workers = max(self.workers, worker + 1)  # a restarted shard serves the newcomer too
        return answers[0]

    def drop(self, worker: int) -> None:
        """The kernel saw `worker`'s engine die: no shard waits for it any more (its heartbeat would stop
        only after LIMITS.shard_worker_silence_s, and one that never talked would be waited for at the epoch's end)."""
        with self._client() as client:
            client.request("drop", worker_id=worker)

    def recent(self) -> dict:
        """Shard 0's push-log entries since the last call, and every shard's control state.

        Called twice a second by the dashboard, always from the run's own thread, so it keeps one
        client (closed by `stop`, in that thread too) instead of a new ZeroMQ context per call.
        """
        if self._telemetry is None:
            self._telemetry = self._client()
        try:
            replies = self._telemetry.request("stats", since=self._log_seen)
        except NbdistError:  # a late answer must not be read as the next call's: start afresh
            self._telemetry.close()
            self._telemetry = None
            raise
        first = replies[0].header
        self._log_seen = first["since"] + len(first["log"])
        return {"log_fields": first["log_fields"], "log": first["log"], "version": first["version"],
                "control": [r.header["control"] for r in replies], "workers": first["workers"],
                "coordination": first.get("coordination"), "events": first["events"]}

    def stop(self, cluster=None) -> dict:
        """Final checkpoint (when the PS still answers), the shards' logs, then stop them; returns the stats."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=15)
        if self._telemetry is not None:
            self._telemetry.close()
            self._telemetry = None
        stats: list[dict] = []
        if self.failure is None:
            try:
                with self._client() as client:
                    self._checkpoint(client)
                    stats = [m.header for m in client.request("stats")]
                    client.request("stop")
            except (PsUnavailable, NbdistError) as exc:
                self.failure = str(exc)
        self._stop_processes(cluster)
        placed = [{"engine": s.engine, "host": s.host, "pid": s.pid, "address": s.address} for s in self.shards]
        stats = [{**placed[i], **shard} for i, shard in enumerate(stats)]
        return {"shards": stats, "failure": self.failure, "checkpoint": self.last_checkpoint}

    def _stop_processes(self, cluster) -> None:
        for shard in self.shards:
            if shard.engine is None:
                launcher.stop_shard(shard.pid)
            elif cluster is not None and shard.engine in cluster.ids():
                try:
                    cluster.client[shard.engine].apply_async(launcher.stop_shard, shard.pid).get(
                        timeout=LIMITS.shard_engine_call_s)
                except Exception:  # the engine died with its shard: nothing left to stop
                    pass

    # -- health and checkpoints ------------------------------------------------------------
    def _client(self, ps_timeout_s: float = LIMITS.ps_reply_s) -> PsClient:
        return PsClient(self.addresses, self.key, CONTROLLER, heartbeat=False, ps_timeout_s=ps_timeout_s)

    def _watch(self) -> None:
        next_checkpoint = time.time() + self.checkpoint_every_s
        client = self._client(LIMITS.ps_monitor_s)
        try:
            while not self._stop.wait(MONITOR_INTERVAL_S):
                self._check_processes()  # restarts a dead shard, or raises
                try:
                    client.request("heartbeat")
                    if self.last_checkpoint is None or time.time() >= next_checkpoint:  # the first: at once
                        self._checkpoint(client)
                        next_checkpoint = time.time() + self.checkpoint_every_s
                except PsUnavailable:
                    if not self._exited():
                        raise
                    client.close()  # the shard died while asked: the next round restarts it
                    client = self._client(LIMITS.ps_monitor_s)
        except (PsUnavailable, NbdistError) as exc:
            self.failure = self.failure or str(exc)
        finally:
            client.close()

    def _exited(self) -> list[tuple[ShardProcess, int]]:
        """The shards on this host whose process has exited, with its code."""
        codes = [(s, launcher.exit_code(s.pid) if s.engine is None else None) for s in self.shards]
        return [(s, code) for s, code in codes if code is not None]

    def _check_processes(self) -> None:
        for shard, code in self._exited():
            died = (f"parameter-server shard {shard.index} (pid {shard.pid} on {shard.host}) exited with code "
                    f"{code}")
            if self.restarts_left <= 0 or self.last_checkpoint is None:
                why = "no checkpoint had been saved yet" if self.last_checkpoint is None else "no restarts left"
                raise PsUnavailable(f"{died}; not restarted: {why} (--ps-restarts)")
            self._restart(shard, died)

    def _restart(self, shard: ShardProcess, died: str) -> None:
        """A new process for `shard` on its old port, given its part of the last checkpoint."""
        started = time.time()
        self.restarts_left -= 1
        shard.incarnation += 1
        launcher.stop_shard(shard.pid)  # reaped, and its same-host files removed
        config = {**self.settings, "shard": shard.index, "workers": self.workers, "bind": self._bind,
                  "log_path": self.push_log_path(shard.index), "port": int(shard.address.rsplit(":", 1)[1]),
                  "start_barrier": False, "incarnation": shard.incarnation}
        shard.pid = launcher.start_shard(config, self.key, self.shard_log(shard.index))["pid"]
        saved, part = checkpoint.load(self.last_checkpoint["path"]), self.last_checkpoint["shards"][shard.index]
        frozen = [k for k in part["keys"] if k not in part["names"] and k.startswith(NON_TRAINABLE)]
        state = {k: saved["arrays"][k] for k in part["keys"] if k not in frozen}
        model = {k: saved["arrays"][k] for k in (*part["names"], *frozen)}
        tables = saved.get("tables") or {}
        with PsClient([shard.address], self.key, 0, heartbeat=False) as client:  # as rank 0 gave the model first
            client.request("restore", [state], version=part["version"], tables=tables)
            client.request("init", [model], optimizer=saved["optimizer"], trainable=part["names"], layout=saved["layout"])
            for index, table in tables.items():  # the further optimizers' tables (`ps.tables`)
                mine = table["shards"].get(str(shard.index)) or []
                if int(index) and mine:
                    prefix = f"o{index}/"
                    client.request("init", [{n: saved["arrays"][prefix + n] for n in mine}], table=int(index),
                                   optimizer=table["optimizer"], trainable=mine, layout=table["layout"])
        self.restarts.append({"t": time.time(), "event": "shard_restarted", "shard": shard.index, "pid": shard.pid,
                            "version": part["version"], "checkpoint": self.last_checkpoint["path"],
                            "recovery_s": round(time.time() - started, 3), "cause": died,
                            "restarts_left": self.restarts_left})

    def _checkpoint(self, client: PsClient) -> None:
        replies = client.request("state")
        if not all(r.header.get("names") for r in replies):
            return  # no model yet: nothing worth saving
        first = replies[0].header
        state = {"arrays": merged(replies), "version": first["version"], "layout": first["layout"],
                 "optimizer": first["optimizer"], "tables": _tables(replies)}
        path = checkpoint.save(self.checkpoint_dir, self.run_id, state)
        self.last_checkpoint = {"path": str(path), "version": first["version"], "saved_at": time.time(),
                                "shards": [{"names": r.header["names"], "version": r.header["version"],
                                            "keys": list(r.arrays)} for r in replies]}

    def checkpoint_weights(self) -> list:
        """The last checkpoint's weights in `model.get_weights()` order (empty when none was saved)."""
        if self.last_checkpoint is None:
            return []
        return checkpoint.model_weights(checkpoint.load(self.last_checkpoint["path"]))


def _tables(replies) -> dict:
    """Each table's optimizer, layout and the names every shard holds of it (`ps.tables`), for restarts."""
    tables: dict = {}
    for i, reply in enumerate(replies):
        for index, table in (reply.header.get("tables") or {}).items():
            entry = tables.setdefault(index, {"optimizer": table["optimizer"], "layout": table["layout"],
                                              "shards": {}})
            entry["shards"][str(i)] = table["names"]
    return tables
