"""A shard's push log: a bounded window in memory, every entry streamed to a file.

One entry per push (the fields of `LOG_FIELDS`). The dashboard and the
kernel's telemetry read the recent entries by absolute index (`since`); the whole log goes
to a line-delimited JSON file beside the run's checkpoints, so a shard's memory stays flat
however many pushes a run makes, and `Run.push_records` reads the file back afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from pathlib import Path

# batch: [epoch, start, count] of the positions it trained (--data dynamic; a push of local steps:
# [epoch, start, count, start, count, ...]), else None
LOG_FIELDS = ("t", "worker", "step", "version", "staleness", "outcome", "lead", "gamma", "momentum", "comp_norm",
              "lr", "batch")
WINDOW = 20_000  # entries kept in memory: well over what the kernel's telemetry reads between two polls
FLUSH_EVERY_S = 1.0  # the file is at most this far behind the window


class PushLog:
    """Append-only log of push entries (lists of JSON values), `len` = every entry ever appended."""

    def __init__(self, path: str | os.PathLike | None = None, window: int = WINDOW, resume: bool = False):
        """`resume`: a restarted shard carries on its predecessor's file (and its count) instead of starting one."""
        self.window: deque = deque(maxlen=window)
        self.count = 0
        self.path: str | None = None
        self._file = None
        self._flush_at = time.monotonic() + FLUSH_EVERY_S
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                if resume and os.path.exists(path):
                    self.count = _keep_whole_lines(path)
                self._file = open(path, "a" if resume else "w", encoding="utf-8", buffering=1 << 16)
                self.path = str(path)
            except OSError as exc:  # the window still serves the live views; the full log is lost
                print(f"nbdist-ps: cannot write the push log to {path} ({exc}); keeping the last {window} "
                      "entries only", file=sys.stderr, flush=True)

    def append(self, entry: list) -> None:
        self.window.append(entry)
        self.count += 1
        if self._file is not None:
            self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
            if time.monotonic() >= self._flush_at:  # a killed shard loses at most this much of its log
                self.flush()

    def since(self, index: int) -> tuple[int, list[list]]:
        """(first index returned, entries from absolute index `index` on that the window still holds)."""
        first = self.count - len(self.window)
        start = max(int(index), first)
        if start >= self.count:
            return self.count, []
        return start, list(self.window)[start - first:]

    def flush(self) -> None:
        """Make what was appended readable from the file (before a reader looks)."""
        self._flush_at = time.monotonic() + FLUSH_EVERY_S
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.window)


def read(path: str | os.PathLike) -> list[list]:
    """Every entry of a push-log file, in order (a last line cut short by a crash is skipped)."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return entries


def _keep_whole_lines(path: str | os.PathLike, chunk: int = 1 << 20) -> int:
    """The file's complete entries (lines); a last line cut short by a crash is dropped, so appended
    entries start on a line of their own. Reads in chunks: the file may hold millions of entries."""
    lines, end = 0, 0
    with open(path, "rb+") as f:
        while block := f.read(chunk):
            newlines = block.count(b"\n")
            if newlines:
                lines += newlines
                end = f.tell() - len(block) + block.rfind(b"\n") + 1
        f.truncate(end)
    return lines
