"""`hfdt` survives a dead rank: the survivors leave the Horovod job and re-form it (DESIGN.md section 10).

A rank that dies makes the next collective fail on the others (at once for its ring neighbours, after
Gloo's timeout for the rest), so each survivor's train step raises. `elastic` catches that around
Keras' compiled train function, waits for the job the kernel re-formed over the survivors (a new
rendezvous, announced on the control bus), joins it, aligns the steps made (a rank may have finished
the step that failed on another), takes the new rank 0's weights and optimizer state, scales the
learning rate for the new size and carries on in the same `fit`: History, callbacks and the progress
line see one run. The batch a failed step had drawn is not trained on, and the dead rank's share of
the data is not dealt out again: each survivor keeps its own shard.
"""

from __future__ import annotations

import time

GLOO_TIMEOUT_S = 5  # how long a survivor waits on a dead peer before its collective fails (Gloo's default: 30)
REFORM_WAIT_S = 60  # how long a survivor waits for the kernel's new job before failing as before
LEFT_KEY = "nbdist_left"  # in a worker's published data: the job generation it waits for


def is_collective_failure(exc: BaseException) -> bool:
    """Whether a train step failed because the Horovod job broke (not the cell's own error)."""
    import tensorflow as tf

    return (isinstance(exc, tf.errors.OpError) and not isinstance(exc, tf.errors.OutOfRangeError)
            and "Horovod" in str(exc))


def elastic(hvd, model, control, join, resized, left):
    """The callback that keeps a fit going across re-formed jobs.

    Args:
        control: the run's `ControlPoint` (the kernel announces each new job there).
        join: `join(reform)` leaves the broken job and joins the new one (Horovod re-initialised).
        resized: `resized(size)` after each join (the learning rate follows the new number of ranks).
        left: `left(generation)` tells the kernel this rank has left the broken job and waits for job
            `generation`: the kernel announces it once every survivor has, so that no survivor waits
            in the new job's rendezvous for one still stuck in the old (Gloo's timeout counts there too).
    """
    import keras

    from .horovod_ops import broadcast_from_rank0

    class Elastic(keras.callbacks.Callback):
        fused_steps_safe = True  # it counts calls of the train function, whatever a call's steps

        def __init__(self):
            super().__init__()
            self.calls = 0  # completed calls of the train function: the same on every rank after a join
            self.generation = 0
            self.recoveries: list[dict] = []  # what each re-forming cost, for the run's events

        def on_train_begin(self, logs=None):
            self._inner = model.train_function

            def guarded(iterator):
                while True:
                    try:
                        logs = self._inner(iterator)
                    except Exception as exc:
                        if not is_collective_failure(exc):
                            raise
                        self._recover(exc, iterator)
                        continue
                    self.calls += 1
                    if self.recoveries and "resumed_at" not in self.recoveries[-1]:
                        self.recoveries[-1]["resumed_at"] = time.time()
                    return logs

            self._guarded = model.train_function = guarded

        def guard(self, callback, method: str) -> None:
            """A callback's hook that runs collectives (the epoch-end averaging) survives a dead rank too."""
            original = getattr(callback, method)

            def guarded(*args, **kwargs):
                while True:
                    try:
                        return original(*args, **kwargs)
                    except Exception as exc:
                        if not is_collective_failure(exc):
                            raise
                        self._recover(exc, None)

            setattr(callback, method, guarded)

        def _recover(self, exc: BaseException, iterator) -> None:
            failed_at = time.time()
            left(self.generation + 1)
            reform = self._await(exc)
            join(reform)
            self.generation = reform["generation"]
            done = hvd.allgather_object(self.calls, name=f"nbdist_elastic_calls_{self.generation}")
            broadcast_from_rank0(hvd, list(model.variables) + list(model.optimizer.variables))
            resized(hvd.size())
            self.recoveries.append({"generation": self.generation, "size": hvd.size(), "rank": hvd.rank(),
                                    "calls": max(done), "steps_per_call": int(model.steps_per_execution or 1),
                                    "failed_at": failed_at, "joined_at": time.time()})
            model.make_train_function(force=True)  # traced anew: Horovod's ops now run in the new job
            self._inner, model.train_function = model.train_function, self._guarded
            behind, self.calls = max(done) - self.calls, max(done)
            for _ in range(behind * int(model.steps_per_execution or 1) if iterator is not None else 0):
                next(iterator)  # the steps a rank ahead completed: drawn here too, so every rank stays aligned

        def _await(self, exc: BaseException) -> dict:
            deadline = time.time() + REFORM_WAIT_S
            while time.time() < deadline and not control.state["stop"]:
                reform = control.reform()
                if reform and reform["generation"] > self.generation:
                    return reform
                time.sleep(0.05)  # polling the control bus, bounded by the deadline
            raise exc

    return Elastic()
