"""A parameter-server worker's optimizer steps routed by the step seam (DESIGN.md section 13): every optimizer the
cell steps itself (each of a hand-written loop's; under `fit`, those its own `train_step` steps besides the
model's, a GAN's two) has a table of its own on the shards (`ps.tables`), made at its first step: rank 0 hands
the shards its variables and its state, every worker pulls them, and from then on each step of that optimizer
is one push-pull with its table (a `tf.numpy_function` in a traced step), the shards applying that optimizer's
own rule. When a statement that stepped ends, each table's end barrier waits for every worker's last push and
the final weights and optimizer state come back to every worker; a later step opens the table again.
"""

from __future__ import annotations

import numpy as np

from ..keras_semantics import optimizer_state
from ..host.hetero import Profile, Slowdown
from ..ps.client import merged
from ..ps.exchange import PushPull
from ..ps.partition import partition


class TableClient:
    """A worker's connection to the shards (`PsClient`), each request naming one table."""

    def __init__(self, client, table: int):
        self.client, self.table = client, table

    def request(self, kind, per_shard=None, fields_per_shard=None, only=None, **fields):
        return self.client.request(kind, per_shard, fields_per_shard, only, table=self.table, **fields)

    def __getattr__(self, name):
        return getattr(self.client, name)


class Table:
    """One optimizer's table, as one worker uses it."""

    def __init__(self, optimizer, variables: list, exchange: PushPull, names: list[str]):
        self.optimizer, self.variables, self.exchange, self.names = optimizer, variables, exchange, names
        self.ended = False  # its end barrier was passed: the next push opens it again

    def push(self, *grads):
        if self.ended:
            self.exchange.pull()  # (the shard counts this worker training again; the push's reply has the weights)
            self.ended = False
        return self.exchange.push(*grads)


class OptimizerTables:
    """The tables of one worker: `step` routes a step of the cell's optimizer number `index` to table
    `first + index` (`first` 1 under fit, whose model's optimizer is table 0)."""

    def __init__(self, worker, client, first: int = 0, batch: int | None = None):
        self.worker, self.client, self.first, self.batch = worker, client, first, batch
        self.tables: dict[int, Table] = {}

    def step(self, index: int, optimizer, grads: list, variables: list) -> None:
        import tensorflow as tf

        table = self.tables.get(index)
        if table is None:
            with tf.init_scope():  # eagerly, also while a tf.function traces its first step
                table = self.tables[index] = self._open(index, optimizer, variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        new = tf.numpy_function(table.push, grads, [v.dtype for v in variables], stateful=True,
                                name=f"nbdist_push_pull_{index}")
        for variable, value in zip(variables, new):
            variable.assign(tf.ensure_shape(value, variable.shape))
        optimizer.iterations.assign_add(1)  # as a local step counts (the shards' count comes back at the end)

    def _open(self, index: int, optimizer, variables: list) -> Table:
        worker = self.worker
        if not optimizer.built:
            optimizer.build(variables)
        spec = worker.optimizer_spec(optimizer)  # refuses, before any step, an optimizer the rule cannot apply
        names = [f"t{i:04d}:{v.name}" for i, v in enumerate(variables)]
        plan = partition({n: int(np.prod(v.shape)) for n, v in zip(names, variables)}, len(worker.config["shards"]))
        client = TableClient(self.client, self.first + index)
        worker.silence.tables[self.first + index] = optimizer_label(optimizer)
        exchange = PushPull(client, plan, names, self.batch, Slowdown(worker.simulated))
        if worker.virtual_step is not None:
            from .virtual_clock import VirtualClock

            exchange.virtual = VirtualClock(worker.simulated or Profile(), worker.virtual_step, self.batch or 32)
        if worker.rank == 0:
            values = dict(zip(names, (np.asarray(v.numpy()) for v in variables)))
            slots, iterations = optimizer_state.export(optimizer, variables, names)
            per_shard = [{n: values[n] for n in shard} | {k: a for k, a in slots.items() if k.rsplit(":", 1)[0] in shard}
                         for shard in plan]
            client.request("init", per_shard, optimizer=_as_dict(spec), trainable=names, layout=names,
                           iterations=iterations)
        for variable, value in zip(variables, exchange.pull()):
            variable.assign(value)
        return Table(optimizer, variables, exchange, names)

    def stop_asked(self) -> bool:
        return any(t.exchange.stop_asked for t in self.tables.values())

    def metrics(self) -> dict:
        """The first table's fields of a metrics record (staleness, bytes sent)."""
        first = self.tables.get(0)
        return first.exchange.metrics() if first is not None else {}

    def end(self) -> None:
        """Every table's end barrier: its final weights and optimizer state into this worker's variables."""
        for table in self.tables.values():
            if table.ended:
                continue
            for variable, value in zip(table.variables, table.exchange.done()):
                variable.assign(value)
            state = merged(table.exchange.client.request("state"))
            step = state.get(optimizer_state.ITERATIONS)
            optimizer_state.load(table.optimizer, table.variables, table.names, state,
                                 None if step is None else int(step))
            table.ended = True

    def abandon(self) -> None:
        for table in self.tables.values():
            table.exchange.abandon()


def optimizer_label(optimizer) -> str:
    """An optimizer as a message names it: its class and its name."""
    return f"{type(optimizer).__name__} '{optimizer.name}'"


def _as_dict(spec) -> dict:
    from dataclasses import asdict

    return asdict(spec)
