"""One shard process's tables: one `Shard` per optimizer the cell steps (DESIGN.md section 13).

Table 0 is the run's first optimizer (under `fit`, the model's); a cell that steps more optimizers (a GAN's
discriminator and generator, a loop's own) has a table more for each, each with its own variables, update rule
(that optimizer's), version and release policy, made when its first message arrives. A message names its table
in the header (`table`, 0 when absent). What concerns the worker or the run rather than one optimizer goes to
every table (heartbeats, controls, deaths, newcomers, the stop); where a worker is in its fit (waiting for a batch
of shard 0's dealer, at an epoch's end) is table 0's, and every table reads it there, so no table's round or
staleness bound waits for a worker that pushes nothing more until table 0 answers it; on the virtual clock a worker
whose push waits at one table pushes to no other before that push's time. A message to one table lets every other
answer what it can then. The push log and the zero-copy bookkeeping are shared, so the dashboard sees every table's
pushes. A checkpoint holds every table: table k's arrays under
``o<k>/``, its optimizer and names in the state's header (`tables`).
"""

from __future__ import annotations

from . import wire
from .shard import Shard

MAX_TABLES = 64  # a cell with more optimizers than this is not a cell we serve
EVERY_TABLE = ("heartbeat", "control", "drop", "stop", "admit")
PREFIX = "o{}/"


class ShardTables:
    """The tables of one shard process; `handle` maps a decoded message to its replies, as `Shard.handle` does."""

    def __init__(self, config: dict):
        self.config = config
        self.tables: dict[int, Shard] = {0: Shard(config)}
        self.first.tables = self.tables

    @property
    def first(self) -> Shard:
        return self.tables[0]

    # what the server loop reads of its shard
    @property
    def stopping(self) -> bool:
        return any(t.stopping for t in self.tables.values())

    @property
    def max_bytes(self) -> int:
        return self.first.max_bytes

    @property
    def shared(self):
        return self.first.shared

    @property
    def log(self):
        return self.first.log

    def reject(self, reason: str, detail: str, worker=None) -> None:
        self.first.reject(reason, detail, worker)

    def check_heartbeats(self, now: float) -> list:
        return [reply for table in list(self.tables.values()) for reply in table.check_heartbeats(now)]

    def table(self, message: wire.Message) -> Shard:
        """The table a message names (made on its first message)."""
        index = message.header.get("table", 0)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_TABLES:
            raise wire.Rejected("malformed", f"table {index!r} (a shard serves tables 0 to {MAX_TABLES - 1})")
        return self._table_at(index)

    def _table_at(self, index: int) -> Shard:
        if index not in self.tables:
            table = Shard({**self.config, "log_path": None, "data": None})  # shard 0's dealer is table 0's
            table.log, table.shared, table.tables = self.first.log, self.first.shared, self.tables
            for worker, state in self.first.workers.items():  # newcomers admitted meanwhile, the dead
                table.workers[worker].alive = state.alive
            self.tables[index] = table
        return self.tables[index]

    def handle(self, ident: bytes, message: wire.Message) -> list:
        kind = message.kind
        if kind in EVERY_TABLE:
            replies = self.first.handle(ident, message)
            for table in list(self.tables.values())[1:]:  # their own answer to `ident` is table 0's
                replies += [r for r in table.handle(ident, message) if r[0] != ident]
            return replies
        if kind == "state" and "table" not in message.header:
            return [self._state(ident, message)]
        if kind == "restore" and "table" not in message.header:
            return self._restore(ident, message)
        table = self.table(message)
        return table.handle(ident, message) + self._released_elsewhere(table)

    def _released_elsewhere(self, changed: Shard) -> list:
        """What the tables but `changed` can answer now: a message may have changed where a worker is (waiting for
        a batch or at an epoch's end, at table 0; a push of its held at `changed`), which their policies read."""
        return [reply for table in list(self.tables.values()) if table is not changed
                for reply in [*table.policy.complete_round(table), *table.release()]]

    def _state(self, ident: bytes, message: wire.Message) -> tuple:
        """Every table's arrays (table k's under o<k>/) and table 0's summary, with each table's own."""
        _, kind, arrays, fields = self.first.handle(ident, message)[0]
        arrays = dict(arrays or {})
        tables = {}
        for index, table in self.tables.items():
            if index:
                arrays.update({PREFIX.format(index) + k: v for k, v in table.state_arrays().items()})
            summary = table.summary()
            tables[str(index)] = {k: summary[k] for k in ("version", "names", "layout", "optimizer")}
        return ident, kind, arrays, {**fields, "tables": tables}

    def _restore(self, ident: bytes, message: wire.Message) -> list:
        """A checkpoint for every table: table k takes the arrays under o<k>/ (version from `tables`)."""
        tables = message.header.get("tables") or {}
        by_table: dict[int, dict] = {}
        for key, array in message.arrays.items():
            index, name = _split(key)
            by_table.setdefault(index, {})[name] = array
        for index, arrays in by_table.items():
            version = (tables.get(str(index)) or {}).get("version", message.header.get("version", 0))
            self._table_at(index).handle(ident, wire.Message({**message.header, "version": version}, arrays))
        return [(ident, "ok", None, {})]


def _split(key: str) -> tuple[int, str]:
    """(table, name) of a checkpoint array's key."""
    if key.startswith("o") and "/" in key:
        head, name = key.split("/", 1)
        if head[1:].isdigit():
            return int(head[1:]), name
    return 0, key
