"""How a shard turns one gradient into an update: the user's optimizer, or a delay-compensated rule.

An updater owns the optimizer state of the shard's variables (slots, velocity, each
worker's w_bak and MS) and reports, per push, what it did in the fields of DESIGN.md
section 8: outcome, gamma, the momentum used, the compensation norm.
"""

from __future__ import annotations

import math

import numpy as np

from . import delay, rules


class OptimizerUpdater:
    """The optimizer compiled in the cell (SGD, momentum, Nesterov, Adam), as Keras applies it."""

    def __init__(self, spec: rules.OptimizerSpec, variables: dict[str, np.ndarray], saved: dict):
        self.spec = spec
        self.slots = {}
        for name, value in variables.items():
            fresh = rules.new_state(spec, value.shape, value.dtype)
            self.slots[name] = {s: np.array(saved.get(f"{name}:{s}", fresh[s]), value.dtype) for s in fresh}

    def sent(self, worker: int, variables: dict[str, np.ndarray]) -> None:
        """The weights `worker` computes its next gradient on (unused by this rule)."""

    def apply(self, variables: dict, grads: dict, worker: int, tau: int, version: int, lr_scale: float = 1.0) -> dict:
        lr = rules.learning_rate(self.spec, version) * lr_scale
        for name, gradient in grads.items():
            rules.apply(self.spec, variables[name], gradient, self.slots[name], lr, version)
        return {"outcome": "applied", "gamma": None, "momentum": self.spec.momentum or None, "comp_norm": None,
                "lr": lr}

    def state(self) -> dict[str, np.ndarray]:
        return {f"{name}:{s}": np.array(v) for name, slots in self.slots.items() for s, v in slots.items()}


class DelayUpdater:
    """`dc-asgd`, `dc-asgd-a`, `dc-asgdk`, `ddc-asgd` (nbdist/ps/delay.py), eta from the cell's optimizer."""

    def __init__(self, params: delay.DelayParams, spec: rules.OptimizerSpec, variables: dict[str, np.ndarray],
                 saved: dict):
        self.params, self.spec = params, spec
        self.velocity = {n: np.array(saved.get(f"{n}:v", np.zeros_like(v)), v.dtype) for n, v in variables.items()}
        self.tau_bar = float(saved.get("tau_bar", np.zeros(())).item()) if "tau_bar" in saved else 0.0
        self.workers: dict[int, dict[str, dict[str, np.ndarray]]] = {}

    def _worker(self, worker: int, variables: dict) -> dict:
        if worker not in self.workers:
            self.workers[worker] = {n: delay.new_worker_state(v.shape, v.dtype) for n, v in variables.items()}
        return self.workers[worker]

    def sent(self, worker: int, variables: dict[str, np.ndarray]) -> None:
        for name, state in self._worker(worker, variables).items():
            np.copyto(state["w_bak"], variables[name])

    def apply(self, variables: dict, grads: dict, worker: int, tau: int, version: int, lr_scale: float = 1.0) -> dict:
        decision = delay.decide(self.params, self.tau_bar, tau)
        self.tau_bar = decision.tau_bar
        lr = rules.learning_rate(self.spec, version) * lr_scale
        states = self._worker(worker, variables)
        comp_sq = sum(delay.apply(self.params, decision, variables[n], g, self.velocity[n], states[n], lr)
                      for n, g in grads.items())
        return {"outcome": "dropped" if decision.dropped else "applied", "gamma": round(decision.gamma, 6),
                "momentum": round(decision.momentum, 6), "comp_norm": round(math.sqrt(comp_sq), 9), "lr": lr}

    def state(self) -> dict[str, np.ndarray]:
        return {**{f"{n}:v": np.array(v) for n, v in self.velocity.items()}, "tau_bar": np.array(self.tau_bar)}


class CommitUpdater:
    """ADSP (Hu et al., AAAI 2020): a push is a worker's accumulated local update, w <- w + delta/N."""

    def __init__(self, workers: int):
        self.workers = workers

    def sent(self, worker: int, variables: dict[str, np.ndarray]) -> None:
        """Workers keep their own copy of what they pulled; nothing to remember here."""

    def apply(self, variables: dict, grads: dict, worker: int, tau: int, version: int, lr_scale: float = 1.0) -> dict:
        scale = lr_scale / self.workers
        for name, delta in grads.items():
            variables[name] += scale * delta
        return {"outcome": "applied", "gamma": None, "momentum": None, "comp_norm": None, "lr": None}

    def state(self) -> dict[str, np.ndarray]:
        return {}


def make_updater(rule: dict | None, spec: rules.OptimizerSpec, variables: dict, saved: dict):
    """The updater a shard's config names: None (the cell's optimizer), {"preset": "adsp"} (commits),
    or a delay-compensation preset {"preset", "workers", "overrides"}; mu = the user's momentum (0.9 if none)."""
    if not rule:
        return OptimizerUpdater(spec, variables, saved)
    if rule["preset"] == "adsp":
        return CommitUpdater(rule["workers"])
    params = delay.preset(rule["preset"], spec.momentum or 0.9, rule["workers"], **rule.get("overrides", {}))
    return DelayUpdater(params, spec, variables, saved)
