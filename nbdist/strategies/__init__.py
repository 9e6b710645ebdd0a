"""Strategy registry and the `%%distribute` options each strategy reads."""

from __future__ import annotations

from ..errors import OptionError
from .base import Option, Strategy, Worker
from .hfdt import HfdtStrategy
from .local import LocalStrategy
from .adsp import AdspStrategy
from .ashl import AshlStrategy
from .asgd import (AsgdStrategy, DcAsgdAdaptiveStrategy, DcAsgdKStrategy, DcAsgdStrategy,
                   DdcAsgdStrategy, SsgdStrategy)
from .nfdt import NfdtStrategy

# Options every strategy reads; the magic shows them first.
COMMON_OPTIONS = (
    Option(("--strategy",), "how the engines train (see the table in README.md)",
           (("default", "local"), ("metavar", "NAME"))),
    Option(("--workers",), "number of engines to train on (default: the strategy's; all idle engines for "
           "multi-worker strategies)", (("type", int), ("metavar", "N"))),
    Option(("--targets",), "comma-separated engine ids to train on, instead of --workers",
           (("metavar", "IDS"),)),
    Option(("--seed",), "seed Python, NumPy and TensorFlow on every worker (keras.utils.set_random_seed) "
           "so a run is reproducible", (("type", int), ("metavar", "S"))),
    Option(("--progress",), "how the run shows itself: a live dashboard (widgets), a text progress line, "
           "or nothing; auto (the default) picks the dashboard when a widget front end is connected",
           (("default", "auto"), ("choices", ("auto", "dashboard", "text", "none")))),
    Option(("--background",), "return at once with the Run (nbdist.last_run) while training goes on; "
           "%%dist wait blocks until it ends and installs the model", (("action", "store_true"), ("default", False))),
)

# Options only some strategies read: name -> Option. Strategies list the names they read.
STRATEGY_OPTIONS: dict[str, Option] = {
    "compression": Option(("--compression",), "gradient compression on the allreduce: none or fp16",
                          (("default", "none"), ("choices", ("none", "fp16")))),
    "scale_lr": Option(("--scale-lr",), "multiply the learning rate by the number of workers (linear, "
                       "the default) or leave it (none)", (("default", "linear"), ("choices", ("linear", "none")))),
    "warmup_epochs": Option(("--warmup-epochs",), "ramp the scaled learning rate up over this many epochs "
                            "(default 0: scaled from the first step)", (("type", float), ("default", 0.0),
                                                                       ("metavar", "E"))),
    "ps_shards": Option(("--ps-shards",), "number of parameter-server shards; variables are spread over them "
                        "balanced by size (default 1)", (("type", int), ("default", 1), ("metavar", "S"))),
    "ps_on": Option(("--ps-on",), "where the parameter-server shards run: notebook (this host, the default) or "
                    "engines (one per worker host, round robin: for multi-host scale)",
                    (("default", "notebook"), ("choices", ("notebook", "engines")))),
    "max_staleness": Option(("--max-staleness",), "stale-synchronous bound: a worker whose pushed steps would "
                            "lead the slowest live worker's by more than max(s, 1) waits; 0 is lock-step "
                            "(default: unbounded)", (("type", int), ("metavar", "s"))),
    "checkpoint_every": Option(("--checkpoint-every",), "save the parameter server's weights and optimizer "
                               "state every this many seconds, and at the end (default 30)",
                               (("type", float), ("default", 30.0), ("metavar", "SECONDS"))),
    "checkpoint_dir": Option(("--checkpoint-dir",), "where checkpoints go, as run-N.npz (default "
                             "nbdist-checkpoints, next to the notebook)",
                             (("default", "nbdist-checkpoints"), ("metavar", "DIR"))),
    "resume": Option(("--resume",), "start from the newest checkpoint in --checkpoint-dir (or from PATH) "
                     "instead of the model's initial weights", (("nargs", "?"), ("const", "latest"),
                                                                 ("metavar", "PATH"))),
    "simulate": Option(("--simulate",), "make workers slower to study heterogeneity on one machine: "
                       "'speed=1,1,0.5,0.25; bandwidth=1g,1g,100m,10m; latency=0,0,5ms,20ms' (one value per "
                       "worker, or one for all)", (("metavar", "SPEC"),)),
    "momentum": Option(("--momentum",), "the momentum mu the PS uses instead of the cell optimizer's "
                       "(asgd:momentum=0 in comparisons; the delay rules' mu, default the optimizer's or 0.9)",
                       (("type", float), ("metavar", "MU"))),
    "lam": Option(("--lam",), "dc-asgd's constant compensation strength lambda (default 0.04)",
                  (("type", float), ("metavar", "LAMBDA"))),
    "lam0": Option(("--lam0",), "adaptive compensation: lambda_t = lam0/sqrt(MS_k + 1e-7) (default 2)",
                   (("type", float), ("metavar", "LAMBDA0"))),
    "p": Option(("--p",), "ddc-asgd: gamma = ((tau_bar+1)/(tau+1))**p (default 1; 0 turns it off)",
                (("type", float), ("metavar", "P"))),
    "gamma_min": Option(("--gamma-min",), "ddc-asgd: the smallest step scale gamma (default 0.1)",
                        (("type", float), ("metavar", "G"))),
    "kappa": Option(("--kappa",), "ddc-asgd: the compensation is clipped to kappa*|g| (default 1; inf: no clip)",
                    (("type", float), ("metavar", "K"))),
    "tau_drop": Option(("--tau-drop",), "ddc-asgd: drop a push with tau > tau_drop*(tau_bar+1) (default 8; "
                       "inf: never)", (("type", float), ("metavar", "T"))),
    "rho": Option(("--rho",), "ddc-asgd: decay of the running mean delay tau_bar (default 0.9)",
                  (("type", float), ("metavar", "RHO"))),
}

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (LocalStrategy, HfdtStrategy, NfdtStrategy, AsgdStrategy, DcAsgdStrategy,
                                                             DcAsgdAdaptiveStrategy, DcAsgdKStrategy, DdcAsgdStrategy,
                                                             SsgdStrategy, AdspStrategy, AshlStrategy)}


def strategy_names() -> list[str]:
    return sorted(REGISTRY)


def option_line(options: dict) -> str:
    """The `%%distribute` line that gives these option values (dest -> value), quoted for the magic."""
    import shlex

    flags = {o.dest: o.flags[-1] for o in (*COMMON_OPTIONS, *STRATEGY_OPTIONS.values())}
    parts = []
    for dest, value in options.items():
        if dest not in flags:
            raise OptionError(f"no %%distribute option for {dest!r}")
        parts.append(f"{flags[dest]} {shlex.quote(str(value))}")
    return " ".join(parts)


def make_strategy(options: dict) -> Strategy:
    """The strategy named by `options['strategy']`, after checking it reads every option given."""
    name = options.get("strategy")
    if name not in REGISTRY:
        raise OptionError(f"Unknown strategy {name!r}. Choose one of: {', '.join(strategy_names())}.")
    cls = REGISTRY[name]
    for key, option in STRATEGY_OPTIONS.items():
        if key not in cls.options and options.get(option.dest) not in (None, option.default):
            readers = [n for n, c in REGISTRY.items() if key in c.options]
            raise OptionError(
                f"{option.flags[-1]} applies to {', '.join(readers) or 'no strategy'}, not to --strategy {name}."
            )
    return cls(options)


__all__ = ["COMMON_OPTIONS", "STRATEGY_OPTIONS", "Option", "REGISTRY", "Strategy", "Worker",
           "make_strategy", "option_line", "strategy_names"]
