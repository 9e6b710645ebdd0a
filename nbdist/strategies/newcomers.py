"""Engines that register while a run trains, taken into it by strategies that can (DESIGN.md section 10).

An engine is a newcomer when the hub lists it after the run started (`%dist add`, or an
`ipengine` started by hand on another host). `Newcomers.take_in`, called from the run's
wait loop, prepares each once (probe, definition cells, models, its share of the data),
asks the strategy to `admit` it, and starts its training cell as the next rank.
"""

from __future__ import annotations

import time

RETRY_S = 1.0  # a newcomer the strategy cannot take yet is asked about again this often


class Refused(Exception):
    """The strategy does not take a newcomer; `retry`: not yet (the run is not far enough), else never."""

    def __init__(self, reason: str, retry: bool = False):
        super().__init__(reason)
        self.retry = retry


class Newcomers:
    """The newcomers of one run.

    Args:
        prepare(eid, rank, size): gives engine `eid` what the run's workers received before training
            (the session's definition cells, models and its share of the data: shard `rank` of `size`,
            `Strategy.newcomer_shard`).
        start(eid, rank, config): submits the training cell to it; returns its AsyncResult.
        config: what the strategy's `prepare` gave the run's first workers.
    """

    def __init__(self, run, cluster, strategy, config: dict, prepare, start):
        self.run, self.cluster, self.strategy, self.config = run, cluster, strategy, config
        self.prepare, self.start = prepare, start
        self.seen = set(cluster.ids())
        self.waiting: dict[int, float] = {}  # prepared newcomers the strategy could not take yet -> next try
        self.prepared: dict[int, int] = {}  # newcomer -> the rank it was prepared as

    def take_in(self) -> dict:
        """{engine id: AsyncResult} of the newcomers whose training cell started now."""
        new = sorted(set(self.cluster.ids()) - self.seen)
        self.seen.update(new)
        now = time.time()
        started = {}
        for eid in [*new, *(e for e, at in list(self.waiting.items()) if at <= now)]:
            try:
                started[eid] = self._join(eid)
                self.waiting.pop(eid, None)
            except Refused as exc:
                if exc.retry:
                    self.waiting[eid] = time.time() + RETRY_S
                    continue
                self.waiting.pop(eid, None)
                self.run.record("join_refused", engine=eid, reason=str(exc))
        return started

    def replace(self, dead: int) -> None:
        """Worker engine `dead` died and the run goes on: on a cluster nbdist started, with
        --restart-engines on, a new engine is launched; it joins as a newcomer once it registers."""
        if self.strategy.value("restart_engines") != "on" or not self.cluster.owned:
            return
        try:
            self.cluster.add(1, wait=False)
        except Exception as exc:  # the run goes on without a replacement; the event says why
            self.run.record("restart_failed", engine=dead, reason=str(exc))
            return
        self.run.record("engine_restarted", engine=dead)

    def _join(self, eid: int):
        run, cluster = self.run, self.cluster
        rank = self.prepared.get(eid, len(run.workers))
        if rank != len(run.workers):
            raise Refused(f"another engine joined as rank {rank} first")
        self._check_room()
        if eid not in self.prepared:
            cluster.refresh([eid])
            if not cluster.is_alive(eid):
                raise Refused("it died before it could join")
            # busy (a probe of %dist status, another client's task), or busy when `refresh` came, so not probed (its
            # host unknown: Horovod would be told "?"): ask again
            if eid in cluster.busy() or not cluster.probed(eid):
                raise Refused("it is busy", retry=True)
            self.prepare(eid, *self.strategy.newcomer_shard(run, rank))
            self.prepared[eid] = rank
        run.hosts[eid] = {"host": cluster.info(eid).host, "gpus": list(cluster.info(eid).gpus or [])}
        config = self.strategy.admit(run, eid, rank, self.config)
        run.workers.append(eid)
        result = self.start(eid, rank, config)
        cluster.running([eid])
        run.record("worker_joined", engine=eid, rank=rank, host=cluster.info(eid).host,
                   first_epoch=config.get("first_epoch"), after_s=round(time.time() - run.started_at, 2))
        return result

    def _check_room(self) -> None:
        cap = self.strategy.value("max_workers")
        live = len(self.run.workers) - len(self.run.dead_ranks())
        if cap is not None and live >= cap:
            raise Refused(f"the run has --max-workers {cap} live workers already")
