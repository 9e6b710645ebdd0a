"""Delay-compensated update rules (DESIGN.md section 5), pure functions on numpy arrays, in place.

One general rule, ``ddc-asgd``; ``dc-asgd``, ``dc-asgd-a`` and ``dc-asgdk`` are presets of
it. For a push from worker k with gradient g, computed on the weights w_bak[k] it pulled
``tau`` updates ago::

    limit = tau_drop*(tau_bar+1)                            (tau_bar before this push)
    tau_bar <- rho*tau_bar + (1-rho)*min(tau, limit)        (or frozen)
    c     = lam_t * g*g*(w - w_bak[k]), clipped to [-kappa|g|, kappa|g|]
    lam_t = lam (constant) or lam0 / sqrt(MS_k + 1e-7),  MS_k <- m*MS_k + (1-m)*g*g
    gamma = clip(((tau_bar+1)/(tau+1))**p, gamma_min, 1)
    mu_t  = max(0, mu - tau_bar/(tau_bar+1)) * gamma
    tau > limit: dropped, w unchanged
    else: v <- mu_t*v - eta*gamma*(g + c);  w <- w + v
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..errors import OptionError
from .rules import chunks

EPSILON = 1e-7
INF = math.inf


@dataclass(frozen=True)
class DelayParams:
    """Hyper-parameters of the rule; `lam` set means constant lambda, else adaptive (lam0)."""

    lam: float | None = None
    lam0: float = 2.0
    ms_decay: float = 0.95
    kappa: float = 1.0
    p: float = 1.0
    gamma_min: float = 0.1
    rho: float = 0.9
    tau_drop: float = 8.0
    momentum: float = 0.9
    frozen_tau_bar: float | None = None

    def to_json(self) -> dict:
        return {k: (None if v == INF else v) if k in ("kappa", "tau_drop") else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, values: dict) -> "DelayParams":
        return cls(**{k: (INF if v is None and k in ("kappa", "tau_drop") else v) for k, v in values.items()})


PRESETS = ("dc-asgd", "dc-asgd-a", "dc-asgdk", "ddc-asgd")


def preset(name: str, momentum: float, workers: int, **overrides) -> DelayParams:
    """The parameters of strategy `name` (user's momentum `momentum`, `workers` workers), then `overrides`."""
    presets = {
        "dc-asgd": DelayParams(lam=0.04, p=0, kappa=INF, tau_drop=INF, momentum=0.0),
        "dc-asgd-a": DelayParams(p=0, kappa=INF, tau_drop=INF, momentum=0.0),
        "dc-asgdk": DelayParams(p=0, kappa=INF, tau_drop=INF, momentum=momentum, frozen_tau_bar=workers - 1.0),
        "ddc-asgd": DelayParams(momentum=momentum),
    }
    if name not in presets:
        raise OptionError(f"no delay-compensation preset {name!r}; choose one of {', '.join(presets)}")
    return replace(presets[name], **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class StepDecision:
    """What the rule decided for one push (reported per push)."""

    tau: int
    tau_bar: float
    gamma: float
    momentum: float
    dropped: bool


def decide(params: DelayParams, tau_bar: float, tau: int) -> StepDecision:
    """Update the running mean delay with `tau` and derive gamma, the momentum used and the drop.

    DESIGN.md section 5, amended: the drop limit comes from tau_bar *before* this push, and
    tau_bar is fed the delay clipped to that limit, so one ancient gradient cannot lift tau_bar
    by tens and switch momentum off for the pushes after it.
    """
    if params.frozen_tau_bar is not None:
        tau_bar = params.frozen_tau_bar
        limit = params.tau_drop * (tau_bar + 1)
    else:
        limit = params.tau_drop * (tau_bar + 1)
        tau_bar = params.rho * tau_bar + (1 - params.rho) * min(tau, limit)
    gamma = min(1.0, max(params.gamma_min, ((tau_bar + 1) / (tau + 1)) ** params.p))
    momentum = max(0.0, params.momentum - tau_bar / (tau_bar + 1)) * gamma
    return StepDecision(tau, tau_bar, gamma, momentum, dropped=tau > limit)


def new_worker_state(shape, dtype=np.float32) -> dict[str, np.ndarray]:
    """Per worker and variable: the weights it last pulled (w_bak) and MS, the mean square of its gradients."""
    return {"w_bak": np.zeros(shape, dtype), "ms": np.zeros(shape, dtype)}


def apply(params: DelayParams, decision: StepDecision, w: np.ndarray, g: np.ndarray, v: np.ndarray,
          worker: dict[str, np.ndarray], lr: float) -> float:
    """One compensated update of `w` (and velocity `v`, and the worker's MS) in place.

    Returns:
        the squared L2 norm of the compensation term c (0 when dropped).
    """
    if decision.dropped:
        return 0.0
    comp_sq = 0.0
    for w_, g_, v_, bak, ms in chunks([w, g, v, worker["w_bak"], worker["ms"]]):
        g2 = g_ * g_
        if params.lam is None:
            ms *= params.ms_decay
            ms += (1 - params.ms_decay) * g2
            lam = params.lam0 / np.sqrt(ms + EPSILON)
        else:
            lam = params.lam
        c = lam * g2 * (w_ - bak)
        if params.kappa != INF:
            bound = params.kappa * np.abs(g_)
            np.clip(c, -bound, bound, out=c)
        comp_sq += float(np.dot(c.reshape(-1), c.reshape(-1)))
        v_ *= decision.momentum
        v_ -= (lr * decision.gamma) * (g_ + c)
        w_ += v_
    return comp_sq
