"""`local`: one engine, plain Keras `fit`; the reference every other strategy is tested against."""

from __future__ import annotations

from .base import Strategy, Worker


class LocalWorker(Worker):
    def fit(self, request):
        reporter = self.make_reporter(request.samples_per_step)
        return request.run_plain(callbacks=[*self.user_callbacks(request), reporter], verbose=0)


class LocalStrategy(Strategy):
    name = "local"
    summary = "one engine, plain Keras fit: the reference for every other strategy"
    worker_class = LocalWorker
    max_workers = 1
    default_workers = 1
