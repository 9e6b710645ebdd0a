"""How a shard turns one gradient into an update: the user's optimizer, or a delay-compensated rule.

An updater owns the optimizer state of the shard's variables (slots, velocity, each
worker's w_bak and MS) and reports, per push, what it did in the fields of DESIGN.md
section 8: outcome, gamma, the momentum used, the compensation norm.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..keras_semantics.optimizer_state import ITERATIONS
from . import delay, rules
from .flat_layout import FlatLayout


class OptimizerUpdater:
    """The optimizer compiled in the cell (SGD, momentum, Nesterov, Adam) in numpy, as Keras applies it.

    `saved` holds slots named as Keras names them (``<variable>:momentum``) and `iterations`
    the optimizer's step count, so a run continues from the notebook's optimizer state.
    The slots are flat (`FlatLayout.state`): `apply` takes the variables and gradients by
    name or as the shard's flat arrays, the same elementwise arithmetic either way."""

    def __init__(self, spec: rules.OptimizerSpec, variables: dict[str, np.ndarray], saved: dict,
                 iterations: int = 0):
        self.spec = spec
        self.iterations = int(iterations)
        self.names = list(variables)
        self.slots = FlatLayout.of(variables).state(rules.new_state(spec, ()), lambda n, s: saved.get(f"{n}:{s}"))

    def sent(self, worker: int, variables: dict[str, np.ndarray]) -> None:
        """The weights `worker` computes its next gradient on (unused by this rule)."""

    def apply(self, variables: dict, grads: dict, worker: int, tau: int, version: int, lr_scale: float = 1.0) -> dict:
        lr = rules.learning_rate(self.spec, self.iterations) * lr_scale
        for name, gradient in grads.items():
            rules.apply(self.spec, variables[name], gradient, self.slots[name], lr, self.iterations)
        self.iterations += 1
        return {"outcome": "applied", "gamma": None, "momentum": self.spec.momentum or None, "comp_norm": None,
                "lr": lr}

    def set_learning_rate(self, value: float) -> None:
        """The cell's callbacks changed the learning rate (a constant one; a schedule is followed by step)."""
        self.spec = replace(self.spec, learning_rate=value)

    def state(self) -> dict[str, np.ndarray]:
        slots = {f"{name}:{s}": np.array(v) for name in self.names for s, v in self.slots[name].items()}
        return {**slots, ITERATIONS: np.array(self.iterations, np.int64)}


class DelayUpdater:
    """`dc-asgd`, `dc-asgd-a`, `dc-asgdk`, `ddc-asgd` (nbdist/ps/delay.py), eta from the cell's optimizer."""

    def __init__(self, params: delay.DelayParams, spec: rules.OptimizerSpec, variables: dict[str, np.ndarray],
                 saved: dict, iterations: int = 0):
        self.params, self.spec = params, spec
        self.iterations = int(iterations)
        self.names, self.layout = list(variables), FlatLayout.of(variables)
        # the velocity plays the part of SGD's momentum slot (what the notebook's optimizer receives)
        velocity = self.layout.state(["momentum"], lambda n, s: saved.get(f"{n}:momentum"))
        self.velocity = {key: slots["momentum"] for key, slots in velocity.items()}
        self.tau_bar = float(saved.get("tau_bar", np.zeros(())).item()) if "tau_bar" in saved else 0.0
        self.workers: dict[int, dict[str, dict[str, np.ndarray]]] = {}

    def _worker(self, worker: int) -> dict:
        if worker not in self.workers:  # w_bak and MS, flat like the velocity
            self.workers[worker] = self.layout.state(delay.new_worker_state(()), lambda n, s: None)
        return self.workers[worker]

    def sent(self, worker: int, variables: dict[str, np.ndarray]) -> None:
        states = self._worker(worker)
        for key, value in variables.items():
            np.copyto(states[key]["w_bak"], value)

    def apply(self, variables: dict, grads: dict, worker: int, tau: int, version: int, lr_scale: float = 1.0) -> dict:
        decision = delay.decide(self.params, self.tau_bar, tau)
        self.tau_bar = decision.tau_bar
        lr = rules.learning_rate(self.spec, self.iterations) * lr_scale
        self.iterations += not decision.dropped
        states = self._worker(worker)
        comp_sq = sum(delay.apply(self.params, decision, variables[n], g, self.velocity[n], states[n], lr)
                      for n, g in grads.items())
        return {"outcome": "dropped" if decision.dropped else "applied", "gamma": round(decision.gamma, 6),
                "momentum": round(decision.momentum, 6), "comp_norm": round(math.sqrt(comp_sq), 9), "lr": lr}

    def set_learning_rate(self, value: float) -> None:
        self.spec = replace(self.spec, learning_rate=value)

    def state(self) -> dict[str, np.ndarray]:
        return {**{f"{n}:momentum": np.array(self.velocity[n]) for n in self.names}, "tau_bar": np.array(self.tau_bar),
                ITERATIONS: np.array(self.iterations, np.int64)}


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

    def set_learning_rate(self, value: float) -> None:
        """Workers apply their own optimizer here; the PS has no learning rate."""

    def state(self) -> dict[str, np.ndarray]:
        return {}


def make_updater(rule: dict | None, spec: rules.OptimizerSpec, variables: dict, saved: dict, iterations: int = 0,
                 backend: str = "auto"):
    """The updater a shard's config names: None (the cell's optimizer), {"preset": "adsp"} (commits),
    or a delay-compensation preset {"preset", "workers", "overrides"}; mu = the user's momentum (0.9 if none).

    The cell's optimizer runs on the numpy rules when they implement it (SGD, Adam) unless
    `backend` is "keras"; every other optimizer runs on Keras itself.
    """
    if not rule:
        if spec.name == rules.KERAS or backend == "keras":
            from .keras_updater import KerasUpdater  # imports TensorFlow: only where it is needed

            return KerasUpdater(spec.keras, variables, saved, iterations)
        return OptimizerUpdater(spec, variables, saved, iterations)
    if rule["preset"] == "adsp":
        return CommitUpdater(rule["workers"])
    params = delay.preset(rule["preset"], spec.momentum or 0.9, rule["workers"], **rule.get("overrides", {}))
    return DelayUpdater(params, spec, variables, saved, iterations)
