"""The live dashboard (ipywidgets + plotly); only the magics import it."""

from .dashboard import Dashboard

__all__ = ["Dashboard"]
