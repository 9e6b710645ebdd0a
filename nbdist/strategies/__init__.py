"""The strategy registry: every strategy nbdist knows, and the `%%distribute` options they read.

Adding a strategy: its module (a `Strategy` subclass with its `Worker`), its docs page, and
one line in `STRATEGIES` below (or `register(cls)` from elsewhere). The magic's parser and
help, README's options table, the sidebar's list and the dashboard's panels follow.
"""

from __future__ import annotations

from ..errors import OptionError  # noqa: F401  (strategies.OptionError, for callers)
from .base import Option, Reports, Strategy, Worker

# Options every strategy reads; the magic shows them first.
COMMON_OPTIONS = (
    Option("--strategy", "how the engines train (see the table in README.md)", default="local", metavar="NAME"),
    Option("--workers", "number of engines to train on (default: the strategy's; all idle engines for "
           "multi-worker strategies)", type=int, metavar="N", minimum=1),
    Option("--targets", "comma-separated engine ids to train on, instead of --workers", metavar="IDS"),
    Option("--seed", "seed Python, NumPy and TensorFlow on every worker (keras.utils.set_random_seed) "
           "so a run is reproducible", type=int, metavar="S"),
    Option("--progress", "how the run shows itself: a live dashboard (widgets), a text progress line, "
           "or nothing; auto (the default) picks the dashboard when a widget front end is connected",
           default="auto", choices=("auto", "dashboard", "text", "none")),
    Option("--no-bring", "do not bring what the cell uses from the notebook to the engines (modules, functions, "
           "data); only marked %%distribute define cells reach them", flag_only=True, default=False),
    Option("--background", "return at once with the Run (nbdist.last_run) while training goes on; "
           "%%dist wait blocks until it ends and installs the model", flag_only=True, default=False),
    Option("--plan-only", "with --strategy auto: measure the engines on the cell's model and print the plan "
           "(every strategy's predicted epoch time, ranked, with why), and train nothing", flag_only=True,
           default=False),
    Option("--target-accuracy", "with --strategy auto: the accuracy the plan ranks strategies by time to "
           "(default: the best of its short local run less a point)", type=float, metavar="A", minimum=0),
    Option("--plan-seeds", "with --strategy auto: seeds of each short run the plan makes (the time to target "
           "then shows their range; each seed is one more short run of every strategy)", type=int, default=1,
           metavar="N", minimum=1),
)

REGISTRY: dict[str, type[Strategy]] = {}
INTERNAL: dict[str, type[Strategy]] = {}  # what nbdist runs for itself (the profile, virtual workers), never listed
_listeners: list = []  # called with the class when one is registered (the magic rebuilds its parser)


def register(cls: type[Strategy]) -> type[Strategy]:
    """Make `cls` a strategy of `%%distribute --strategy <cls.name>` (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    REGISTRY[cls.name] = cls
    for listener in list(_listeners):
        listener(cls)
    return cls


def unregister(name: str) -> None:
    """Forget a strategy (tests that register their own)."""
    REGISTRY.pop(name, None)
    for listener in list(_listeners):
        listener(None)


def on_register(listener) -> None:
    _listeners.append(listener)


def strategy_class(name: str) -> type[Strategy]:
    """The class of a run's strategy: a registered one, or one nbdist runs for itself."""
    return REGISTRY.get(name) or INTERNAL[name]


def strategy_names() -> list[str]:
    return sorted(REGISTRY)


def strategy_options() -> dict[str, Option]:
    """Every option some strategy reads, by name, in the order strategies declare them."""
    options: dict[str, Option] = {}
    for cls in REGISTRY.values():
        for option in cls.reads:
            options.setdefault(option.name, option)
    return options


def readers(name: str) -> list[str]:
    """The strategies that read option `name`, in registry order."""
    return [n for n, cls in REGISTRY.items() if any(o.name == name for o in cls.reads)]


def option_line(values: dict) -> str:
    """The `%%distribute` line that gives these option values (name -> value), quoted for the magic."""
    import shlex

    flags = {o.name: o.flag for o in (*COMMON_OPTIONS, *strategy_options().values())}
    parts = []
    for name, value in values.items():
        if name not in flags:
            raise OptionError(f"no %%distribute option for {name!r}")
        parts.append(f"{flags[name]} {shlex.quote(str(value))}")
    return " ".join(parts)


def make_strategy(values: dict) -> Strategy:
    """The strategy named by `values['strategy']`, after checking it reads every option given.

    The instance's `values` holds the common options and every option it reads, defaults filled in.
    """
    name = values.get("strategy")
    if name not in REGISTRY:
        raise OptionError(f"Unknown strategy {name!r}. Choose one of: {', '.join(strategy_names())}.")
    cls = REGISTRY[name]
    own = {o.name for o in cls.reads}
    for option in strategy_options().values():
        if option.name not in own and values.get(option.name) not in (None, option.default):
            raise OptionError(f"{option.flag} applies to {', '.join(readers(option.name)) or 'no strategy'}, "
                              f"not to --strategy {name}.")
    for option in (*COMMON_OPTIONS, *cls.reads):
        option.check(values.get(option.name))
    filled = {o.name: values.get(o.name, o.default) for o in (*COMMON_OPTIONS, *cls.reads)}
    filled.update({k: v for k, v in values.items() if k not in filled and k not in strategy_options()})
    return cls(filled)


def _register_builtin() -> None:
    from .adsp import AdspStrategy
    from .asgd import (AsgdStrategy, DcAsgdAdaptiveStrategy, DcAsgdKStrategy, DcAsgdStrategy, DdcAsgdStrategy,
                       SsgdStrategy)
    from .ashl.strategy import AshlStrategy
    from .hfdt import HfdtStrategy
    from .local import LocalStrategy
    from .nfdt import NfdtStrategy
    from .pipeline import PipelineStrategy
    from .profile import ProfileStrategy
    from .tensor import TensorStrategy
    from .virtual_workers import VirtualWorkersStrategy

    STRATEGIES = (LocalStrategy, HfdtStrategy, NfdtStrategy, AsgdStrategy, DcAsgdStrategy, DcAsgdAdaptiveStrategy,
                  DcAsgdKStrategy, DdcAsgdStrategy, SsgdStrategy, AdspStrategy, AshlStrategy, PipelineStrategy,
                  TensorStrategy)
    for cls in STRATEGIES:
        register(cls)
    for cls in (ProfileStrategy, VirtualWorkersStrategy):
        INTERNAL[cls.name] = cls


_register_builtin()

__all__ = ["COMMON_OPTIONS", "Option", "REGISTRY", "Reports", "Strategy", "Worker", "make_strategy", "on_register",
           "option_line", "readers", "register", "strategy_class", "strategy_names", "strategy_options", "unregister"]
