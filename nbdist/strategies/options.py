"""The `%%distribute` options several strategies read, declared once (each strategy lists the ones it reads;
options only one strategy reads are declared in its own module)."""

from __future__ import annotations

import os

from ..limits import Limits
from .base import Option

SIMULATE = Option("--simulate", "make workers slower to study heterogeneity on one machine: 'speed=1,1,0.5,0.25; "
                  "bandwidth=1g,1g,100m,10m; latency=0,0,5ms,20ms' (one value per worker, or one for all); add "
                  "'clock=virtual' (and optionally 'step=12ms') for a virtual clock that never sleeps and orders "
                  "pushes by simulated time", metavar="SPEC")

STALL_TIMEOUT = Option("--stall-timeout", "seconds a run may make no progress before it fails naming who waits for "
                       "what: under hfdt (and tensor), a step waiting for ranks that have not submitted their gradients "
                       f"(default {Limits.collective_stall_s:g}); under the parameter-server strategies, every live worker "
                       "without a step, a request to the parameter server or a reply, outside its start, validation "
                       f"and an epoch's end (default {Limits.ps_silence_s:g})", type=float,
                       metavar="S", minimum=1)

# the parameter server
PS_SHARDS = Option("--ps-shards", "number of parameter-server shards; variables are spread over them balanced "
                   "by size (default 1)", type=int, default=1, metavar="S", minimum=1)
PS_ON = Option("--ps-on", "where the parameter-server shards run: notebook (this host, the default) or engines "
               "(one per worker host, round robin: for multi-host scale)", default="notebook",
               choices=("notebook", "engines"))
MAX_STALENESS = Option("--max-staleness", "stale-synchronous bound: a worker whose pushed steps would lead the "
                       "slowest live worker's by more than max(s, 1) waits; 0 is lock-step (default: unbounded)",
                       type=int, metavar="s", minimum=0)
CHECKPOINT_EVERY = Option("--checkpoint-every", "save the parameter server's weights and optimizer state every "
                          "this many seconds, and at the end (default 30)", type=float, default=30.0,
                          metavar="SECONDS", minimum=0.1)
CHECKPOINT_DIR = Option("--checkpoint-dir", "where checkpoints go, as run-N.npz (default nbdist-checkpoints, next "
                        "to the notebook)", default="nbdist-checkpoints", metavar="DIR")
PS_RESTARTS = Option("--ps-restarts", "how many times a parameter-server shard on the notebook host that dies is "
                     "restarted from the last checkpoint, workers reconnecting, before the run fails (default 3; "
                     "0: fail at once)", type=int, default=3, metavar="R", minimum=0)
RESUME = Option("--resume", "start from the newest checkpoint in --checkpoint-dir (or from PATH) instead of the "
                "model's initial weights", optional_value="latest", metavar="PATH")
MOMENTUM = Option("--momentum", "the momentum mu the PS uses instead of the cell optimizer's (asgd:momentum=0 in "
                  "comparisons; the delay rules' mu, default the optimizer's or 0.9)", type=float, metavar="MU")
LAM0 = Option("--lam0", "adaptive compensation: lambda_t = lam0/sqrt(MS_k + 1e-7) (default 2)", type=float,
              metavar="LAMBDA0")
DATA_SHARDS = Option("--shards", "how the data is split over the workers: equal (the default) or speed (each "
                     "worker's share in proportion to its --simulate speed, so a slow worker does not train alone "
                     "at the end of every epoch)", default="equal", choices=("equal", "speed"))

DATA = Option("--data", "how the workers get their batches: dynamic (the default wherever the cell fits on numpy "
              "arrays without steps_per_epoch: one order of the samples per epoch, each batch handed to whichever "
              "worker is ready, so a fast worker trains more, a dead worker's batches are trained by the others and "
              "every sample once an epoch) or static (each worker one fixed shard; a tf.data pipeline, a generator "
              "or a PyDataset always is)", default="dynamic", choices=("dynamic", "static"))

OVERLAP = Option("--overlap", "on: the next step computes while the push-pull is in flight, on weights one exchange "
                 "older (one more version of staleness, which the delay rules compensate); off: wait for each reply "
                 "(exact sequential SGD with one worker); auto (the default): on, except for the cell's own SGD "
                 "with momentum above 0.45 under nfdt/asgd, where that delay would push the effective momentum past "
                 "0.95. --max-staleness and the virtual clock turn it off", default="auto", choices=("auto", "on", "off"))
MAX_WORKERS = Option("--max-workers", "the most live workers a run grows to when engines register while it trains "
                     "(added to the cluster, or an ipengine started by hand on another host); each joins at once, "
                     "from the next epoch. Default: no cap; equal to --workers: none joins",
                     type=int, metavar="M", minimum=1)
RESTART_ENGINES = Option("--restart-engines", "on a cluster nbdist started: a worker's engine that dies is replaced "
                         "by a new one through ipyparallel's launcher, which joins the run like any engine that "
                         "registers while it trains (on, the default) or not (off)", default="on",
                         choices=("on", "off"))
ELASTIC = (MAX_WORKERS, RESTART_ENGINES)  # read by the strategies whose runs take engines in while they train
PARAMETER_SERVER = (PS_SHARDS, PS_ON, MAX_STALENESS, CHECKPOINT_EVERY, CHECKPOINT_DIR, RESUME, PS_RESTARTS, SIMULATE,
                    DATA_SHARDS, STALL_TIMEOUT)


def data_config(strategy, run, applies: bool = True) -> dict | None:
    """`--data` as the workers apply it: {"mode": "dynamic", "seed": s} (every process computes each epoch's
    order from the run's --seed, or one drawn here), or None for static shards."""
    if not applies or not any(o is DATA for o in strategy.reads) or strategy.value("data") != "dynamic":
        return None
    seed = run.options.get("seed")
    return {"mode": "dynamic", "seed": int(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))}

