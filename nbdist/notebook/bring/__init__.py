"""Bringing what a training cell uses to the engines, so an unchanged notebook needs no marks (issue 19).

`plan` finds what the cell needs (`names`: ast and symtable over the notebook's own cells)
and how each part travels; `send` gives the engines only what they lack. Marked
definition cells (`%%distribute define`) are replayed first and win; `--no-bring` turns
this off; `%dist push NAME ...` sends named values explicitly.
"""

from .plan import Item, plan
from .send import send

__all__ = ["Item", "plan", "send"]
