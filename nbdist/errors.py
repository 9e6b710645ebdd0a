"""Errors nbdist raises; each renders in a notebook as the message alone, not an nbdist traceback."""

from __future__ import annotations


class NbdistError(Exception):
    """Base class: a problem the user can act on, shown as one line."""

    def _render_traceback_(self):  # IPython shows this instead of a Python traceback
        return [f"{type(self).__name__}: {self}"]


class OptionError(NbdistError):
    """A magic option or fit argument that nbdist refuses."""


class ClusterError(NbdistError):
    """No cluster, too few engines, or a cluster that cannot be reached."""


class NoFitCall(NbdistError):
    """The training cell would train nothing: no `fit` call and no optimizer step of its own."""


class RunInterrupted(NbdistError):
    """The user interrupted a run; every engine was stopped."""


class EngineFailure(NbdistError):
    """Code failed on an engine: names the engine and carries the remote traceback."""

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback

    def _render_traceback_(self):
        lines = [f"{type(self).__name__}: {self}"]
        if self.remote_traceback:
            lines += ["", "Remote traceback:", *self.remote_traceback.rstrip().splitlines()]
        return lines


class DefinitionFailed(EngineFailure):
    """A recorded `%%distribute define` cell failed on an engine."""


class EngineDied(EngineFailure):
    """An engine process died (or stopped answering) during a run."""


# what an engine's death with no error of its own usually means
KILLED_FROM_OUTSIDE = ("its process ended with no error from it (the usual cause: the out-of-memory killer, when the "
                       "host's memory or the engine's memory limit ran out; `dmesg` on that host says)")


class CollectiveStalled(EngineFailure):
    """A synchronous step waited past --stall-timeout for ranks that never submitted their tensors."""


class RunStalled(NbdistError):
    """Every live worker of a parameter-server run went without progress past --stall-timeout; names what each
    waited for."""


class ParameterServerFailed(NbdistError):
    """A parameter-server shard died or stopped answering; the last checkpoint's weights are kept."""
