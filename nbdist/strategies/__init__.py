"""Strategy registry and the `%%distribute` options each strategy reads."""

from __future__ import annotations

from ..errors import OptionError
from .base import Option, Strategy, Worker
from .hfdt import HfdtStrategy
from .local import LocalStrategy

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
}

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (LocalStrategy, HfdtStrategy)}


def strategy_names() -> list[str]:
    return sorted(REGISTRY)


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
           "make_strategy", "strategy_names"]
