"""`hfdt` survives a dead rank: the survivors leave the Horovod job and re-form it (DESIGN.md section 10).

A rank that dies makes the next collective fail on the others (at once for its ring neighbours, after
Gloo's timeout for the rest), so each survivor's train step raises. `elastic` catches that around
Keras' compiled train function, waits for the job the kernel re-formed over the survivors (a new
rendezvous, announced on the control bus), joins it, takes the new rank 0's weights and optimizer
state, scales the learning rate for the new size and carries on in the same `fit`: History,
callbacks and the progress line see one run. The survivors count the units of collectives they
completed (train calls, epoch-end averagings); one may have completed the unit that failed on
another, and the one behind then skips it instead of running it again, so every rank's next
collective is the same. With batches on demand (`--data dynamic`) the survivors that run a failed unit again
draw its samples again from the epoch's order, split over the new size (`schedule`), so none is lost; with
static shards the batches a failed call had drawn are not trained on, and the dead rank's shard is not
dealt out again: each survivor keeps its own.

The job grows the same way, at an epoch's end: once every rank has seen the kernel announce a larger
job (an engine joined the run, `nbdist.strategies.newcomers`), all leave for it together, and the newcomer,
waiting for them, takes rank 0's weights, optimizer state and the next epoch (`join_grown_job`).
"""

from __future__ import annotations

import time

from ..host.interrupt_guard import interrupted
from ..limits import LIMITS

COLLECTIVE_MARKS = ("Horovod", "/gloo/", "nbdist_gradients")  # in the error of a step whose collective broke
LEFT_KEY = "nbdist_left"  # in a worker's published data: the job generation it waits for


def is_collective_failure(exc: BaseException) -> bool:
    """Whether a train step failed because the Horovod job broke (not the cell's own error)."""
    import tensorflow as tf

    text = str(exc)  # Horovod's "has been shut down", or Gloo's own ("Read error ... Connection reset by peer")
    return (isinstance(exc, tf.errors.OpError) and not isinstance(exc, tf.errors.OutOfRangeError)
            and any(mark in text for mark in COLLECTIVE_MARKS))


class Survivor:
    """A rank's side of surviving a dead peer: guards the units of collectives, re-forms, resumes
    (and marks each unit for the stall watch, elastic or not).

    Args:
        control: the run's `ControlPoint` (the kernel announces each new job there).
        join: `join(reform)` leaves the broken job and joins the new one (Horovod re-initialised).
        resized: `resized(size)` after each join (the learning rate follows the new number of ranks).
        left: `left(generation)` tells the kernel this rank has left the broken job and waits for job
            `generation`: the kernel announces it once every survivor has, so that no survivor waits
            in the new job's rendezvous for one still stuck in the old (Gloo's timeout counts there too).
    """

    def __init__(self, hvd, model, control, join, resized, left, watch=None, recover: bool = True):
        self.hvd, self.model, self.control = hvd, model, control
        self.join, self.resized, self.left = join, resized, left
        self.watch, self.recover = watch, recover  # a `StallWatch` marks each unit; recover: elastic
        self.done = 0  # collective units completed (train calls, epoch-end averagings): equal on every rank
        self.logs = {}  # the last train call's logs
        self.generation = 0
        self.recoveries: list[dict] = []  # what each re-forming cost, for the run's events
        self.abandoned = False
        self.traced = False  # the train step ran once in the current job (its first call traces it)
        self._train = self._guarded = None
        self.schedule = None  # --data dynamic: the epoch's `SyncSchedule` (mark / rewind around a unit run again)

    def install(self) -> None:
        """Guard Keras' compiled train function (once `fit` has made it)."""
        self._train = self.model.train_function

        def train(iterator):
            if self.schedule is not None:
                self.schedule.mark()
            self.logs = self._survive(lambda: self._train(iterator), skipped=lambda: self.logs)
            return self.logs

        self._guarded = self.model.train_function = train

    def guard(self, callback, method: str) -> None:
        """A callback's hook that runs collectives (the epoch-end averaging) survives a dead rank too."""
        original = getattr(callback, method)
        setattr(callback, method, lambda *args, **kwargs: self._survive(lambda: original(*args, **kwargs)))

    def _survive(self, unit, skipped=lambda: None):
        """Run one unit of collectives; after a dead rank, re-form and run it again, unless another
        survivor had completed it (the ranks are then one unit apart: this one skips it)."""
        while True:
            if self.abandoned:  # the job fell below --min-workers: no collective will complete again
                return skipped()
            if self.watch is not None:  # the first unit of a job waits for every rank's tracing: not a stall
                self.watch.entering(self.done, timed=self.traced)
            try:
                result = unit()
            except Exception as exc:
                if interrupted():  # the interrupt, taken inside an op, can read as that op's failure
                    raise KeyboardInterrupt from None
                if not self.recover or not is_collective_failure(exc):
                    raise
                if self._recover(exc):
                    continue
                return skipped()
            finally:
                if self.watch is not None:
                    self.watch.left()
            self.done += 1
            self.traced = True
            if self.recoveries and "resumed_at" not in self.recoveries[-1]:
                self.recoveries[-1]["resumed_at"] = time.time()
            return result

    def _recover(self, exc: BaseException) -> bool:
        """Join the re-formed job; whether the unit that failed here is to run again."""
        failed_at = time.time()
        self.left(self.generation + 1)
        reform = self._await(exc)
        if reform.get("abandon"):  # too few ranks left: the fit ends here, its weights go back to the kernel
            self.abandoned = self.model.stop_training = True
            return False
        done = self._enter(reform, {"failed_at": failed_at})
        again, self.done = self.done == done, done
        if again and self.schedule is not None:  # its samples are drawn again, split over the new size
            self.schedule.rewind()
        return again

    def grow(self, epoch: int, last: bool) -> None:
        """At the end of `epoch`: when every rank has seen the kernel announce a larger job, all leave for it
        (the newcomers wait there) and go on from the next epoch; nothing at the last epoch's end."""
        if not self.recover:
            return
        job = self.control.reform()
        announced = bool(job and job.get("grow") and job["generation"] > self.generation and not last)
        seen = job["generation"] if announced else self.generation
        if min(self.hvd.allgather_object(seen, name="nbdist_grow_check")) <= self.generation:
            return
        self.left(job["generation"])
        self._enter(job, {"grown": True, "epoch": epoch + 1})
        self.hvd.broadcast_object(epoch + 1, root_rank=0, name=f"nbdist_grow_epoch_{job['generation']}")

    def _enter(self, job: dict, account: dict) -> int:
        """Join `job`, take rank 0's weights and optimizer state, rescale, trace the train step anew;
        returns the most units of collectives any rank of the new job had completed."""
        from .horovod_ops import broadcast_model

        hvd, model = self.hvd, self.model
        self.join(job)
        self.generation = job["generation"]
        done = max(hvd.allgather_object(self.done, name=f"nbdist_elastic_done_{self.generation}"))
        broadcast_model(hvd, model)
        self.resized(hvd.size())
        self.recoveries.append({"generation": self.generation, "size": hvd.size(), "rank": hvd.rank(),
                                "step": int(model.optimizer.iterations.numpy()), "joined_at": time.time(), **account})
        model.make_train_function(force=True)  # traced anew: Horovod's ops now run in the new job
        self.traced = False
        self._train, model.train_function = model.train_function, self._guarded
        return done

    def _await(self, exc: BaseException) -> dict:
        deadline = time.time() + LIMITS.reform_s
        while time.time() < deadline and not self.control.state["stop"] and not interrupted():
            reform = self.control.reform()
            if reform and reform["generation"] > self.generation and not reform.get("grow"):
                return reform
            time.sleep(0.05)  # polling the control bus, bounded by the deadline
        if interrupted():
            raise KeyboardInterrupt from None
        raise exc


def join_grown_job(hvd_join, control, model, job: dict, left) -> dict | None:
    """A newcomer's side of growing: say it is ready (`left`), wait until the ranks have left for `job`
    (the kernel says go), join it (`hvd_join(job)` returns Horovod), and mirror `Survivor.grow`. Returns
    {"hvd", "generation", "done", "initial_epoch"}, or None when the kernel gave the join up (the run
    ended, or a rank died first)."""
    from .horovod_ops import broadcast_model

    generation = job["generation"]
    left(generation)
    deadline = time.time() + LIMITS.join_s
    while True:
        current = control.reform() or {}
        if current.get("generation", 0) > generation or (current.get("generation") == generation
                                                         and current.get("abandon")) or control.state["stop"] \
                or interrupted():
            return None
        if current.get("generation") == generation and current.get("go"):
            break
        if time.time() > deadline:
            return None
        time.sleep(0.05)  # polling the control bus, bounded by the deadline
    from ..keras_semantics.learning_rate import schedule_of

    hvd = hvd_join(job)
    optimizer = model.optimizer
    own_rate = float(optimizer.learning_rate) if schedule_of(optimizer) is None else None
    done = max(hvd.allgather_object(0, name=f"nbdist_elastic_done_{generation}"))
    broadcast_model(hvd, model, optimizer)
    if own_rate is not None:  # rank 0's rate is scaled for its job; this rank's scaler starts from the cell's
        optimizer.learning_rate = own_rate
    epoch = hvd.broadcast_object(None, root_rank=0, name=f"nbdist_grow_epoch_{generation}")
    return {"hvd": hvd, "generation": generation, "done": done + 1, "initial_epoch": int(epoch)}


def elastic(survivor: Survivor):
    """The Keras callback that puts `survivor`'s guard on the fit's train function (and stops its watch)."""
    import keras

    class Elastic(keras.callbacks.Callback):
        fused_steps_safe = True  # it counts calls of the train function, whatever a call's steps

        def on_train_begin(self, logs=None):
            survivor.install()

        def on_epoch_end(self, epoch, logs=None):
            survivor.grow(epoch, last=epoch + 1 >= (self.params or {}).get("epochs", 0))

        def on_train_end(self, logs=None):
            if survivor.watch is not None:
                survivor.watch.stop()

    return Elastic()
