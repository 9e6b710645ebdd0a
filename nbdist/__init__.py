"""nbdist: train an unchanged Keras notebook on a cluster of ipyparallel engines.

    %load_ext nbdist
    %dist start -n 2
    %%distribute define      (model and data cells, replayed on every engine)
    %%distribute --strategy local
"""

from __future__ import annotations

from .errors import NbdistError
from .notebook.session import SESSIONS as _sessions
from .notebook.session import Session, get_session

RANDOM_STATES_KEPT = 1000  # cells whose random state before they ran is kept, for replaying them on the engines

__version__ = "0.1.0"
__all__ = ["NbdistError", "Session", "get_session", "load_ipython_extension", "unload_ipython_extension"]

def load_ipython_extension(shell) -> None:
    """`%load_ext nbdist`: register the magics on this shell, with a Session of its own, and keep this
    kernel's TensorFlow off the GPUs the engines use (`%dist start --kernel-gpu` gives them back)."""
    from .host import gpus
    from .magics import NbdistMagics, async_dashboard_cells

    if id(shell) in _sessions:
        return
    if gpus.hide_from_kernel() == "in use":  # the engines need the GPUs; TensorFlow here took them first
        print("nbdist: TensorFlow already holds the GPUs in this kernel, so engines on this host may run out of "
              "GPU memory; restart the kernel and run %load_ext nbdist before importing TensorFlow.")
    session = Session(shell)
    _sessions[id(shell)] = session

    def remember_cell_id(info):
        from .keras_semantics.keras_globals import random_state

        session.current_cell_id = getattr(info, "cell_id", None)
        try:
            session.random_before[shell.execution_count] = random_state()
        except Exception:  # noqa: BLE001 (never in the way of the user's cell: its replay then draws its own)
            session.random_before.pop(shell.execution_count, None)
        session.random_before.pop(shell.execution_count - RANDOM_STATES_KEPT, None)

    session.cell_hook = remember_cell_id
    shell.events.register("pre_run_cell", remember_cell_id)
    shell.register_magics(NbdistMagics(shell, session))
    shell.input_transformers_cleanup.append(async_dashboard_cells)
    if getattr(shell, "kernel", None) is not None:  # a Jupyter kernel: the JupyterLab sidebar's comm
        from .notebook.lab_comm import LabChannel

        session.lab = LabChannel(session).start()


def unload_ipython_extension(shell) -> None:
    """`%unload_ext nbdist`: stop a cluster nbdist started and forget the session."""
    session = _sessions.pop(id(shell), None)
    if session is not None:
        from .magics import async_dashboard_cells

        shell.events.unregister("pre_run_cell", session.cell_hook)
        if session.lab is not None:
            session.lab.stop()
        if async_dashboard_cells in shell.input_transformers_cleanup:
            shell.input_transformers_cleanup.remove(async_dashboard_cells)
        session.stop()


def _jupyter_labextension_paths():
    """Where the prebuilt JupyterLab extension lives (for `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "nbdist"}]


def __getattr__(name):
    if name == "last_run":  # nbdist.last_run: the last Run of this shell's session
        session = get_session()
        return session.last_run if session else None
    raise AttributeError(f"module 'nbdist' has no attribute {name!r}")
