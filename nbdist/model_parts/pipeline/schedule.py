"""The order of micro-batch work on each pipeline stage, and what that order costs in theory.

A schedule is a list of ("F", m) and ("B", m) steps: the forward or the backward of micro-batch
m. Stage s's forward of m needs stage s-1's forward of m; its backward of m needs stage s+1's
backward of m (the last stage's backward needs only its own forward). Pure functions, no I/O.
"""

from __future__ import annotations

FORWARD, BACKWARD = "F", "B"
KINDS = ("1f1b", "gpipe")


def gpipe(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """All forwards, then all backwards: every stage keeps all M micro-batches' activations."""
    return [(FORWARD, m) for m in range(micro)] + [(BACKWARD, m) for m in range(micro)]


def one_f_one_b(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """PipeDream-flush 1F1B: K-s-1 warm-up forwards, then one forward and one backward in turn,
    then the remaining backwards; stage s keeps at most K-s micro-batches of activations."""
    warm = min(stages - stage - 1, micro)
    steps = [(FORWARD, m) for m in range(warm)]
    for m in range(warm, micro):
        steps += [(FORWARD, m), (BACKWARD, m - warm)]
    steps += [(BACKWARD, m) for m in range(micro - warm, micro)]
    return steps


def make(kind: str, stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """The schedule `kind` ("1f1b" or "gpipe") for one stage."""
    return {"1f1b": one_f_one_b, "gpipe": gpipe}[kind](stage, stages, micro)


def theoretical_bubble(stages: int, micro: int) -> float:
    """The idle fraction of each stage with equal stage times: (K-1)/(M+K-1)."""
    return (stages - 1) / (micro + stages - 1)


def most_in_flight(steps: list[tuple[str, int]]) -> int:
    """The most micro-batches whose forward has run and backward has not, at any point."""
    held = most = 0
    for kind, _ in steps:
        held += 1 if kind == FORWARD else -1
        most = max(most, held)
    return most


def simulate(kind: str, stages: int, micro: int, forward_s: float = 1.0, backward_s: float = 2.0) -> dict:
    """Run every stage's schedule on ideal links; returns the makespan, the idle fraction and each
    stage's timeline (`steps[s]`: (kind, m, start, end) in order).

    Raises ValueError if the schedules deadlock (a step waits on one that can never run).
    """
    plans = [make(kind, s, stages, micro) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, m) -> finish time
    position, clock = [0] * stages, [0.0] * stages
    timeline: list[list[tuple]] = [[] for _ in range(stages)]
    while any(p < len(plan) for p, plan in zip(position, plans)):
        progressed = False
        for s, plan in enumerate(plans):
            if position[s] == len(plan):
                continue
            kind_, m = plan[position[s]]
            need = ((FORWARD, s - 1, m) if s > 0 else None) if kind_ == FORWARD else \
                ((BACKWARD, s + 1, m) if s < stages - 1 else (FORWARD, s, m))
            if need is not None and need not in done:
                continue
            start = max(clock[s], done[need] if need else 0.0)
            clock[s] = done[(kind_, s, m)] = start + (forward_s if kind_ == FORWARD else backward_s)
            timeline[s].append((kind_, m, start, clock[s]))
            position[s] += 1
            progressed = True
        if not progressed:
            raise ValueError(f"{kind} with {stages} stages and {micro} micro-batches deadlocks")
    makespan = max(clock)
    busy = micro * (forward_s + backward_s)
    return {"makespan": makespan, "bubble": 1 - busy / makespan, "steps": timeline}
