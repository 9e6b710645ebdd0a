"""`local`: one engine, plain Keras `fit`; the reference every other strategy is tested against."""

from __future__ import annotations

from ..host.hetero import Profile, StepCost
from .base import Strategy, Worker
from .control_step import acting_on
from .options import SIMULATE


class LocalWorker(Worker):
    """Keras' own `fit` on one engine; Pause and Stop act between steps."""

    def fit(self, request):
        model, control = request.model, self.control_point()
        reporter = self.make_reporter(request.samples_per_step)
        try:
            self._virtual_time(reporter, request)
            return request.run_plain(callbacks=[*self.user_callbacks(request), acting_on(control), reporter],
                                     verbose=0)
        finally:
            control.close()

    def _virtual_time(self, reporter, request) -> None:
        """On the virtual clock the records' time is the run's start plus steps x t(b) / speed."""
        virtual = self.config.get("virtual")
        if virtual is None:
            return
        from ..keras_semantics.keras_bridge import build_for_training
        from .virtual_clock import measure_step_cost

        batch = request.samples_per_step or 32
        if virtual.get("step"):
            step = StepCost(**virtual["step"]).at(batch)
        else:
            build_for_training(request.model, request.x)
            step = measure_step_cost(request.model, {"x": request.x, "y": request.y}, batch)
        self.virtual_step = step
        seconds = step.seconds(batch) / Profile(**self.config["simulate"][0]).speed
        start = self.spec.get("cell_start") or 0.0
        reporter.clock = lambda: start + reporter.steps * seconds


class LocalStrategy(Strategy):
    """One engine, plain Keras `fit`: the reference for every other strategy."""

    name = "local"
    summary = "one engine, plain Keras fit: the reference for every other strategy"
    reads = (SIMULATE,)
    worker_class = LocalWorker
    max_workers = 1
    default_workers = 1
    loop_refusal = None

    def prepare(self, run, cluster) -> dict:
        return self.clock_config(1)
