"""`hfdt`: synchronous data parallel training with Horovod ring-allreduce (Keras 3 safe core ops), the
kernel's half: options, the rendezvous, and the job's membership (deaths and re-forming, engines that join,
stalled ranks). The worker half, one Horovod rank on each engine, is `hfdt_worker`.
"""

from __future__ import annotations

import signal
import time

from ..errors import CollectiveStalled, EngineDied, OptionError
from ..limits import LIMITS
from .rendezvous import Rendezvous, host_plan, require_horovod
from .base import Option, Reports, Strategy
from .hfdt_elastic import LEFT_KEY
from .hfdt_worker import HfdtWorker
from .options import DATA, ELASTIC, SIMULATE, STALL_TIMEOUT, data_config
from .stall_watch import missing_ranks, stall_timeout, stalled

COMPRESSION = Option("--compression", "gradient compression on the allreduce: none or fp16", default="none",
                     choices=("none", "fp16"))
SCALE_LR = Option("--scale-lr", "multiply the learning rate by the number of workers (linear, the default) or "
                  "leave it (none)", default="linear", choices=("linear", "none"))
BALANCE = Option("--balance", "none (every rank the cell's batch) or auto: profile every rank and give it a "
                 "batch and a share of the data in proportion to its speed, so a slow GPU does not set everyone's "
                 "pace", default="none", choices=("none", "auto"))
ON_FAILURE = Option("--on-failure", "what a dead engine does to the run: continue (the survivors re-form the Horovod "
                    "job and train on, down to --min-workers; the default) or fail (the run stops with an error "
                    "naming the engine)", default="continue", choices=("continue", "fail"))
MIN_WORKERS = Option("--min-workers", "the fewest ranks a run continues with after engines die (default 1); one "
                     "death more and the run fails, the weights of its last completed step in nbdist.last_run.weights",
                     type=int, default=1, metavar="W", minimum=1)
WARMUP_EPOCHS = Option("--warmup-epochs", "ramp the scaled learning rate up over this many epochs (default 0: "
                       "scaled from the first step)", type=float, default=0.0, metavar="E", minimum=0)












class HfdtStrategy(Strategy):
    """Synchronous data parallel training over Horovod's ring-allreduce (Gloo), one rank per engine.

    Elastic by default: when an engine dies, the survivors re-form the job (`hfdt_elastic`) over a new
    rendezvous this side opens once every survivor has left the broken one."""

    name = "hfdt"
    summary = "synchronous data parallel, Horovod ring-allreduce over Gloo"
    reads = (COMPRESSION, SCALE_LR, WARMUP_EPOCHS, BALANCE, ON_FAILURE, MIN_WORKERS, *ELASTIC, STALL_TIMEOUT,
             SIMULATE, DATA)
    reports = Reports(panels=("loss", "throughput"), controls=("pause", "resume", "stop"), events={
        "recovered": lambda e, run: (f"the survivors re-formed the Horovod job with {e['size']} rank(s) at step "
                                     f"{e['step']}, training again {e['recovery_s']:.1f} s after engine "
                                     f"{e['engine']} died"),
        "stalled_rank_killed": lambda e, run: (f"rank {e['rank']} (engine {e['engine']}, host {e['host']}) did not "
                                               f"reach a step the others waited in for {e['stall_timeout']:g} s "
                                               "(--stall-timeout): treated as dead, its engine killed"),
        "grown": lambda e, run: (f"the Horovod job grew to {e['size']} ranks at the start of epoch {e['epoch'] + 1} "
                                 f"(step {e['step']})")})
    worker_class = HfdtWorker
    loop_refusal = None

    def __init__(self, values):
        super().__init__(values)
        self.rendezvous: Rendezvous | None = None
        self.address: str | None = None
        self.generation = 0
        self.reforming: dict | None = None  # the job announced once every survivor has left the broken one
        self.ranks: list[int] = []  # the engines in rank order of the current job
        self.abandoned: dict | None = None  # below --min-workers: the survivors end their fit, then the run fails
        self.growing: dict | None = None  # the larger job a newcomer waits for, until the ranks leave for it
        self.shards: dict[int, int] = {}  # engine -> the shard of the data it trains on (of the first job's N)
        self.first_size = 0
        self.cluster = None
        self.killed: set[int] = set()  # engines of stalled ranks this run killed (treated as dead)
        self.reformed_after: dict[int, int] = {}  # job generation -> the dead engine it was re-formed after

    def array_shards(self) -> bool:
        return self.value("balance") != "auto" and self.value("data") != "dynamic"  # dynamic: every rank any sample

    @property
    def elastic(self) -> bool:
        """Whether survivors re-form the job (--balance auto sized every rank's batch for the first job; a loop of
        the cell's own has no epoch to resume from: a death fails it, naming the engine)."""
        return self.value("on_failure") == "continue" and self.value("balance") != "auto" and not self.loop

    def refuse_loop(self) -> None:
        if self.value("balance") == "auto":
            raise OptionError("--balance auto sizes fit's batches by each rank's speed; a training loop of the "
                              "cell's own takes its batches as it iterates them. Leave --balance out.")
        super().refuse_loop()

    def prepare(self, run, cluster) -> dict:
        require_horovod()
        self.cluster = cluster
        order, slots = host_plan([cluster.info(eid).host for eid in run.workers])
        run.workers[:] = [run.workers[i] for i in order]  # rank order
        self.address = cluster.address_towards(run.workers)
        self.rendezvous = Rendezvous(self.address)
        port = self.rendezvous.start(slots)
        self.ranks = list(run.workers)
        self.shards = {eid: rank for rank, eid in enumerate(run.workers)}
        self.first_size = len(run.workers)
        return {"address": self.address, "port": port, **self.clock_config(len(run.workers)),
                "slots": [_slot(s) for s in slots], "elastic": self.elastic,
                "data": data_config(self, run, self.value("balance") != "auto")}

    @property
    def takes_newcomers(self) -> bool:
        return self.elastic and not self.value("simulate")

    def newcomer_shard(self, run, rank: int) -> tuple[int, int]:
        """A shard as large as every rank's, so all make the same steps: a dead rank's that no live engine
        took over, else rank (rank mod N)'s of the first job's N (then trained on twice per epoch)."""
        size = self.first_size
        dead = {run.workers[r] for r in run.dead_ranks()}
        held = {k for eid, k in self.shards.items() if eid not in dead}
        free = sorted({self.shards[eid] for eid in dead if eid in self.shards} - held)
        return (free[0] if free else rank % size), size

    def admit(self, run, eid: int, rank: int, config: dict) -> dict:
        """A larger job over the current ranks and engine `eid`, opened now; the ranks leave for it at an
        epoch's end once the newcomer waits for it (`check`). Not in the run's last epoch."""
        from .newcomers import Refused

        if self.reforming or self.abandoned or self.growing:
            raise Refused("the Horovod job is changing", retry=True)
        latest = [p for p in run.progress.values() if p.get("epochs")]
        if not latest:
            raise Refused("the run has not reported its first step yet", retry=True)
        epochs, epoch = latest[0]["epochs"], max((p.get("record") or {}).get("epoch") or 0 for p in latest)
        if epoch + 1 >= epochs:
            raise Refused("the run is in its last epoch; a Horovod job grows at an epoch's end")
        members = list(self.ranks)
        hosts = [run.hosts.get(e, {}).get("host") or "localhost" for e in members]
        order, slots = host_plan([*hosts, run.hosts[eid]["host"]])
        rendezvous = Rendezvous(self.address)
        port = rendezvous.start(slots)
        self.generation += 1
        engines = [*members, eid]
        ranked = [engines[order[r]] for r in range(len(slots))]
        index = {e: (rank if e == eid else run.workers.index(e)) for e in engines}
        job = {"generation": self.generation, "port": port, "grow": True,
               "slots": {str(index[e]): _slot(slot) for e, slot in zip(ranked, slots)}}
        self.growing = {"job": job, "members": members, "newcomer": eid, "ranks": ranked, "rendezvous": rendezvous,
                        "announced": False}
        self.shards[eid] = self.newcomer_shard(run, rank)[0]
        return {**config, "joining": job, "shard": [self.shards[eid], self.first_size], "simulate": None,
                "virtual": None}

    def continues_without(self, run, cluster, dead: int, survivors: list[int]) -> bool:
        """Re-form the job over the survivors, when elastic and at least --min-workers are left (a newcomer
        not yet in the job is given up: the run goes on without it)."""
        if not self.elastic or self.bus is None:
            return False
        if self.growing is not None:
            newcomer = self.growing["newcomer"]
            self._give_up_growth()
            if dead == newcomer:
                return True
        survivors = [e for e in survivors if e in self.ranks]  # not a newcomer that never got into the job
        if not survivors:
            return False
        self.generation += 1
        self.reformed_after[self.generation] = dead
        if len(survivors) < self.value("min_workers"):  # the survivors end their fit and send its weights
            self.abandoned = {"survivors": survivors, "since": time.time(), "dead": cluster.info(dead).label()}
            self.bus.send("reform", {"generation": self.generation, "abandon": True})
            return True
        order, slots = host_plan([cluster.info(eid).host for eid in survivors])
        self.rendezvous.stop()
        self.rendezvous = Rendezvous(self.address)
        port = self.rendezvous.start(slots)
        self.ranks = [survivors[order[r]] for r in range(len(slots))]
        ranks = {str(run.workers.index(eid)): _slot(slot) for eid, slot in zip(self.ranks, slots)}
        self.reforming = {"job": {"generation": self.generation, "port": port, "slots": ranks},
                          "survivors": survivors, "since": time.time()}
        return True

    def check(self, run) -> None:
        """Name a stalled step's missing ranks; announce a re-formed job once every survivor has left the
        broken one (bounded)."""
        if self.abandoned is not None:
            gone = self.abandoned
            left = all(e in run.results for e in gone["survivors"])
            if left or time.time() - gone["since"] > LIMITS.reform_s:
                raise EngineDied(f"{gone['dead']} died during run {run.id}, leaving fewer ranks than --min-workers "
                                 f"{self.value('min_workers')}; the run was stopped. nbdist.last_run.weights holds "
                                 "the weights of its last completed step (model.set_weights(nbdist.last_run.weights) "
                                 "keeps them); a lower --min-workers lets a run go on with fewer.")
        if self.reforming is None and self.growing is None:
            self._check_stall(run)
        self._grow(run)
        pending = self.reforming
        if pending is None:
            return
        waiting = [e for e in pending["survivors"]
                   if (run.progress.get(e) or {}).get(LEFT_KEY, 0) < pending["job"]["generation"]]
        if not waiting:
            self.bus.send("reform", pending["job"])
            self.reforming = None
        elif time.time() - pending["since"] > LIMITS.reform_s:
            raise EngineDied(f"engine(s) {waiting} did not leave the broken Horovod job within {LIMITS.reform_s} s "
                             "of a rank's death (stuck in the cell's own code?); the run was stopped. See %dist "
                             "status; --on-failure fail stops a run at the first death instead.")

    def _check_stall(self, run) -> None:
        """A rank the others waited for past --stall-timeout: treated as dead when elastic and enough ranks
        are left without it (its engine is killed, the others re-form), else the run fails naming it."""
        timeout = stall_timeout(self.values, LIMITS.collective_stall_s)
        missing = [self.ranks[r] for r in missing_ranks(run, self.ranks, timeout)]
        if not missing or set(missing) <= self.killed:
            return
        if not self.elastic or len(self.ranks) - len(missing) < self.value("min_workers") or self.cluster is None:
            raise CollectiveStalled(stalled(run, self.ranks, timeout))
        for eid in missing:
            if eid not in self.killed:
                run.record("stalled_rank_killed", engine=eid, rank=run.workers.index(eid),
                           host=self.cluster.info(eid).host, stall_timeout=timeout)
        self.killed |= set(missing)
        self.cluster.signal(missing, signal.SIGKILL)  # the others' collective then fails: they re-form

    def _grow(self, run) -> None:
        """Announce the larger job once its newcomer waits for it; say go to the newcomer once every rank
        left for it; give it up when the ranks ended their fit first."""
        growing = self.growing
        if growing is None:
            return
        job, generation = growing["job"], growing["job"]["generation"]

        def left(eid):
            return (run.progress.get(eid) or {}).get(LEFT_KEY, 0) >= generation

        if not growing["announced"] and left(growing["newcomer"]):
            self.bus.send("reform", job)
            growing["announced"] = True
        elif growing["announced"] and all(left(e) for e in growing["members"]):
            self.bus.send("reform", {**job, "go": True})
            self.rendezvous.stop()
            self.rendezvous, self.ranks, self.growing = growing["rendezvous"], growing["ranks"], None
        elif all(e in run.results for e in growing["members"]):
            self._give_up_growth()

    def _give_up_growth(self) -> None:
        growing, self.growing = self.growing, None
        growing["rendezvous"].stop()
        self.bus.send("reform", {**growing["job"], "abandon": True})

    def finish(self, run) -> None:
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None
        if self.growing is not None:
            self.growing["rendezvous"].stop()
            self.growing = None
        for event in recovered_events(run, self.reformed_after):
            run.record(event.pop("event"), **event)





SLOT_FIELDS = ("hostname", "rank", "local_rank", "cross_rank", "size", "local_size", "cross_size")


def _slot(slot) -> dict:
    return {k: getattr(slot, k) for k in SLOT_FIELDS}


def recovered_events(run, reformed_after: dict[int, int]) -> list[dict]:
    """From the account of each new job's rank 0: one `recovered` event per job re-formed after a death (the
    step it resumed at, the new size, the seconds from the kernel seeing the engine die to the next
    completed step) and one `grown` event per job grown by engines that joined (its size, step, epoch)."""
    deaths = {e["engine"]: e for e in run.events_of("worker_died")}
    entries = {entry["generation"]: entry for results in run.results.values() for fit in results or ()
               for entry in (fit.timings or {}).get("recoveries") or [] if entry["rank"] == 0}
    events = []
    for generation, entry in sorted(entries.items()):
        t = entry.get("resumed_at") or entry["joined_at"]
        if entry.get("grown"):
            events.append({"t": t, "event": "grown", "size": entry["size"], "step": entry["step"],
                           "epoch": entry["epoch"]})
            continue
        death = deaths.get(reformed_after.get(generation))
        if death is not None:
            events.append({"t": t, "event": "recovered", "engine": death["engine"], "rank": death["rank"],
                           "size": entry["size"], "step": entry["step"], "recovery_s": round(t - death["t"], 2)})
    return sorted(events, key=lambda e: e["t"])
