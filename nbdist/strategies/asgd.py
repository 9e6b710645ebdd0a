"""The asynchronous PS rules of DESIGN.md section 5 as strategies: asgd, dc-asgd, dc-asgd-a,
dc-asgdk, ddc-asgd, and the synchronous ssgd. All run the parameter-server family's workers and
shards; they differ only in what the shards do with a push."""

from __future__ import annotations

from typing import ClassVar

from . import options as opt
from .base import Option, Reports
from .nfdt import NfdtStrategy
from .parameter_server import PS_EVENTS, PsStrategy

LAM = Option("--lam", "dc-asgd's constant compensation strength lambda (default 0.04)", type=float, metavar="LAMBDA")
P = Option("--p", "ddc-asgd: gamma = ((tau_bar+1)/(tau+1))**p (default 1; 0 turns it off)", type=float, metavar="P")
GAMMA_MIN = Option("--gamma-min", "ddc-asgd: the smallest step scale gamma (default 0.1)", type=float, metavar="G")
KAPPA = Option("--kappa", "ddc-asgd: the compensation is clipped to kappa*|g| (default 1; inf: no clip)", type=float,
               metavar="K")
TAU_DROP = Option("--tau-drop", "ddc-asgd: drop a push with tau > tau_drop*(tau_bar+1) (default 8; inf: never)",
                  type=float, metavar="T")
RHO = Option("--rho", "ddc-asgd: decay of the running mean delay tau_bar (default 0.9)", type=float, metavar="RHO")
DDC_OPTIONS = (opt.LAM0, P, GAMMA_MIN, KAPPA, TAU_DROP, RHO)

# the option names that are DelayParams fields (nbdist/ps/delay.py)
_DELAY_FIELDS = ("lam", "lam0", "p", "gamma_min", "kappa", "tau_drop", "rho", "momentum")
DELAY_REPORTS = Reports(panels=("loss", "throughput", "staleness", "staleness distribution", "gamma",
                                "compensation"), controls=PsStrategy.reports.controls, events=PS_EVENTS)


class AsgdStrategy(NfdtStrategy):
    """ASGD with the cell's own optimizer (the NFDT engine under the name the comparisons use)."""

    name = "asgd"
    summary = "asynchronous SGD through the parameter server with the cell's own optimizer (the NFDT engine)"


class DelayCompensatedStrategy(PsStrategy):
    """A preset of the delay-compensated rule; `reads` adds the hyper-parameters it takes."""

    preset: ClassVar[str] = ""
    reports = DELAY_REPORTS

    def shard_settings(self, workers: int) -> dict:
        own = {o.name for o in type(self).reads}
        overrides = {name: self.value(name) for name in _DELAY_FIELDS if name in own and self.value(name) is not None}
        return {**super().shard_settings(workers), "momentum": None,
                "rule": {"preset": self.preset, "workers": workers, "overrides": overrides}}


class DcAsgdStrategy(DelayCompensatedStrategy):
    """DC-ASGD with a constant lambda (Zheng et al., 2017)."""

    name = preset = "dc-asgd"
    summary = "DC-ASGD with constant lambda (Zheng et al., 2017): g + lam*g*g*(w - w_bak)"
    reads = (*opt.PARAMETER_SERVER, LAM, opt.OVERLAP, opt.DATA, *opt.ELASTIC)


class DcAsgdAdaptiveStrategy(DelayCompensatedStrategy):
    """DC-ASGD with the adaptive lambda lam0/sqrt(MS_k)."""

    name = preset = "dc-asgd-a"
    summary = "DC-ASGD with adaptive lambda lam0/sqrt(MS_k)"
    reads = (*opt.PARAMETER_SERVER, opt.LAM0, opt.OVERLAP, opt.DATA, *opt.ELASTIC)


class DcAsgdKStrategy(DelayCompensatedStrategy):
    """DC-ASGD-a with heavy-ball momentum reduced by the worker count K (the thesis's baseline)."""

    name = preset = "dc-asgdk"
    summary = "DC-ASGD-a with heavy-ball momentum reduced by the worker count K: max(0, mu - (1 - 1/K))"
    reads = (*opt.PARAMETER_SERVER, opt.MOMENTUM, opt.LAM0, opt.OVERLAP, opt.DATA, *opt.ELASTIC)


class DdcAsgdStrategy(DelayCompensatedStrategy):
    """The seed's dynamic delay compensation: momentum and step scaled by each push's measured delay."""

    name = preset = "ddc-asgd"
    summary = "dynamic delay compensation: momentum and step scaled by each push's measured delay"
    reads = (*opt.PARAMETER_SERVER, opt.MOMENTUM, *DDC_OPTIONS, opt.OVERLAP, opt.DATA, *opt.ELASTIC)


class SsgdStrategy(PsStrategy):
    """Synchronous SGD on the parameter server: one batch-weighted mean gradient per round."""

    name = "ssgd"
    summary = "synchronous SGD on the parameter server: one batch-weighted mean gradient per round"
    reads = (*(o for o in (*opt.PARAMETER_SERVER, opt.MOMENTUM) if o not in (opt.MAX_STALENESS, opt.DATA_SHARDS)),
             opt.DATA)
    reports = Reports(panels=("loss", "throughput"), controls=("pause", "resume", "stop", "lr_scale", "evict"),
                      events=PS_EVENTS)

    def shard_settings(self, workers: int) -> dict:
        return {**super().shard_settings(workers), "max_staleness": None, "synchronous": True}
