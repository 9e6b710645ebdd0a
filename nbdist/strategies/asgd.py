"""The asynchronous PS rules of DESIGN.md section 5 as strategies: asgd, dc-asgd, dc-asgd-a,
dc-asgdk, ddc-asgd, and the synchronous ssgd. All run NFDT's workers and parameter server;
they differ only in what the shards do with a push."""

from __future__ import annotations

from typing import ClassVar

from .nfdt import NfdtStrategy

# %%distribute option -> DelayParams field (nbdist/ps/delay.py)
_DELAY_OPTIONS = {"lam": "lam", "lam0": "lam0", "p": "p", "gamma_min": "gamma_min", "kappa": "kappa",
                  "tau_drop": "tau_drop", "rho": "rho", "momentum": "momentum"}
_PS_OPTIONS = NfdtStrategy.options


class AsgdStrategy(NfdtStrategy):
    name = "asgd"
    summary = "asynchronous SGD through the parameter server with the cell's own optimizer (the NFDT engine)"


class DelayCompensatedStrategy(NfdtStrategy):
    """A preset of the delay-compensated rule; `options` adds the hyper-parameters it reads."""

    preset: ClassVar[str] = ""

    def shard_settings(self, workers: int) -> dict:
        reads = type(self).options  # the option names (self.options holds their values)
        overrides = {field: self.options.get(option) for option, field in _DELAY_OPTIONS.items()
                     if option in reads and self.options.get(option) is not None}
        return {**super().shard_settings(workers), "momentum": None,
                "rule": {"preset": self.preset, "workers": workers, "overrides": overrides}}


class DcAsgdStrategy(DelayCompensatedStrategy):
    name = preset = "dc-asgd"
    summary = "DC-ASGD with constant lambda (Zheng et al., 2017): g + lam*g*g*(w - w_bak)"
    options = (*_PS_OPTIONS[:-1], "lam")


class DcAsgdAdaptiveStrategy(DelayCompensatedStrategy):
    name = preset = "dc-asgd-a"
    summary = "DC-ASGD with adaptive lambda lam0/sqrt(MS_k)"
    options = (*_PS_OPTIONS[:-1], "lam0")


class DcAsgdKStrategy(DelayCompensatedStrategy):
    name = preset = "dc-asgdk"
    summary = "DC-ASGD-a with heavy-ball momentum reduced by the worker count K: max(0, mu - (1 - 1/K))"
    options = (*_PS_OPTIONS, "lam0")


class DdcAsgdStrategy(DelayCompensatedStrategy):
    name = preset = "ddc-asgd"
    summary = "dynamic delay compensation: momentum and step scaled by each push's measured delay"
    options = (*_PS_OPTIONS, "lam0", "p", "gamma_min", "kappa", "tau_drop", "rho")


class SsgdStrategy(NfdtStrategy):
    name = "ssgd"
    summary = "synchronous SGD on the parameter server: one batch-weighted mean gradient per round"
    options = tuple(o for o in _PS_OPTIONS if o != "max_staleness")

    def shard_settings(self, workers: int) -> dict:
        return {**super().shard_settings(workers), "max_staleness": None, "synchronous": True}
