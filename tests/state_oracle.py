"""The state oracle (DESIGN.md section 15): the same cells run plain in one kernel and under nbdist in another, both
namespaces walked with nbdist's own state walk (`nbdist.keras_semantics.state_walk`), the two captures compared by
the strategy's rule (docs/keras-semantics.md, "What each object holds afterwards"). It is an assertion, not a report:
`assert_state_matches` fails naming every address that differs beyond its strategy's rule.

The rules, one per strategy (`RULES`):

- every strategy: the same Keras objects at the same addresses, of the same classes, built alike; the same variables
  at the same addresses and shapes; every value finite; and what a plain run leaves non-zero (an optimizer's slots
  and step count, a metric's totals) is non-zero (nothing came back empty or unbuilt);
- `local`: every value equal to the plain run's (`LOCAL_RTOL`, `LOCAL_ATOL`: see there how they were measured);
- `tensor`, `pipeline`: one model trained on every batch, so every optimizer's step count equals plain's;
- `hfdt` (N ranks): an optimizer's step count is the synchronous steps, plain's over N (each rank trains 1/N of
  every epoch); a metric's totals are rank 0's;
- the parameter-server strategies: an optimizer's step count is every worker's steps, plain's.

A step count may differ from its rule by the batches the shards' rounding leaves out: `ITERATIONS_SLACK`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nbdist.keras_semantics.state_walk import State, differences, relative_gap

# `local` with a seed is plain Keras: both kernels seed keras (Python, NumPy, TensorFlow) the same way at the same
# points and TensorFlow's op determinism is on in both. Measured (make acceptance, 2026-12-07, every example):
# the largest relative difference of any variable between a seeded local run and its plain run; see each example's
# module for its own figure. The tolerance allows the one cause that keeps them from bit-equal (docs/strategies/
# local.md): the engine runs TensorFlow on its own thread pools (its share of the host's cores), whose reductions
# may split sums differently from the notebook's.
LOCAL_RTOL = 1e-4
LOCAL_ATOL = 1e-5
ITERATIONS_SLACK = 0.1  # a step count within 10% (and 2 steps) of its rule: the shards' and ranks' rounding

CAPTURE = '''
def _nbdist_oracle_capture(path, names):
    import pickle
    from nbdist.keras_semantics import state_walk
    names = names or [n for n in list(globals()) if not n.startswith("_")]
    with open(path, "wb") as f:
        pickle.dump(state_walk.capture(state_walk.keras_roots(names, globals())), f)
_nbdist_oracle_capture({path!r}, {names!r})
del _nbdist_oracle_capture
'''


def capture(kernel, path: Path, names: list[str] | None = None) -> State:
    """The state walk's capture of every Keras object the kernel's names (or `names`) reach."""
    kernel.run(CAPTURE.format(path=str(path), names=names), timeout=120).check()
    with open(path, "rb") as f:
        return pickle.load(f)


@dataclass(frozen=True)
class Rule:
    """What a strategy's run leaves against a plain run: `equal` values (to rtol/atol), and the step count of an
    optimizer as `steps(plain, workers)` expects it."""

    equal: bool
    steps: str  # "plain" (every batch stepped once), "per_rank" (plain / workers)
    rtol: float = 0.0
    atol: float = 0.0

    def expected_steps(self, plain: int, workers: int) -> float:
        return plain / workers if self.steps == "per_rank" else plain


PS = Rule(equal=False, steps="plain")
RULES = {
    "local": Rule(equal=True, steps="plain", rtol=LOCAL_RTOL, atol=LOCAL_ATOL),
    # a local run whose values are known to differ from plain's, for a cause the example names (`LOCAL_DIFFERS`):
    # the same objects, built-ness and step counts, not the same values
    "local, values differ": Rule(equal=False, steps="plain"),
    "hfdt": Rule(equal=False, steps="per_rank"),
    "tensor": Rule(equal=False, steps="plain"),
    "pipeline": Rule(equal=False, steps="plain"),
    **{name: PS for name in ("nfdt", "asgd", "ssgd", "dc-asgd", "dc-asgd-a", "dc-asgdk", "ddc-asgd", "adsp")},
}


def is_step_count(address: str) -> bool:
    return address.endswith("/_iterations")


def mismatches(plain: State, run: State, strategy: str, workers: int, ignore=()) -> list[str]:
    """Every way `run` differs from `plain` beyond `strategy`'s rule, one line each; `ignore`: address prefixes the
    example's own text leaves out (a name the training cell binds only in one kernel)."""
    rule = RULES[strategy]

    def skipped(address):
        return any(address.startswith(prefix) for prefix in ignore)

    plain, run = _without(plain, skipped), _without(run, skipped)
    out = differences(plain, run, rule.rtol, rule.atol, ignore=lambda a: not rule.equal or is_step_count(a))
    for address in sorted(set(plain.values) & set(run.values)):
        a, b = plain.values[address], run.values[address]
        if a.shape != b.shape:
            continue
        if not np.all(np.isfinite(b.astype(np.float64))):
            out.append(f"{address}: not finite after the run")
        elif is_step_count(address):
            expected = rule.expected_steps(int(a), workers)
            slack = max(2.0, ITERATIONS_SLACK * expected)
            if abs(int(b) - expected) > slack:
                out.append(f"{address}: {int(b)} steps, the rule says {expected:g} (plain {int(a)}, {workers} "
                           f"workers, {strategy})")
        elif not rule.equal and np.any(a != 0) and not np.any(b != 0):
            out.append(f"{address}: all zero after the run, where plain's is not (it came back empty)")
    return out


def _without(state: State, skipped) -> State:
    return State(state.roots, {a: f for a, f in state.objects.items() if not skipped(a)},
                 {a: v for a, v in state.values.items() if not skipped(a)}, state.left)


def largest_gap(plain: State, run: State) -> tuple[float, str]:
    """The largest relative difference (`relative_gap`) of any variable both captures hold, and where."""
    gaps = [(relative_gap(plain.values[a], run.values[a]), a) for a in set(plain.values) & set(run.values)
            if plain.values[a].shape == run.values[a].shape and plain.values[a].dtype.kind == "f"]
    return max(gaps, default=(0.0, ""))


def assert_state_matches(plain: State, run: State, strategy: str, workers: int, ignore=()) -> None:
    """The oracle's verdict: `run` is what a plain run leaves, by `strategy`'s rule (see the module docstring)."""
    found = mismatches(plain, run, strategy, workers, ignore)
    gap, where = largest_gap(plain, run)
    print(f"state oracle, {strategy}: {len(run.values)} variables, {len(found)} differing beyond the rule, largest "
          f"relative gap to plain {gap:.3g} at {where}")
    assert not found, (f"the notebook's state after the {strategy} run differs from a plain run's at "
                       f"{len(found)} address(es) (largest relative gap {gap:.3g} at {where}):\n  " +
                       "\n  ".join(found[:40]))
