"""Reproducible comparisons of strategies on the same engines and data: ``python -m nbdist.experiments``.

    python -m nbdist.experiments compare --setup S3 --clock virtual --seeds 5 --epochs 3 \\
        --strategies local,ssgd,asgd:momentum=0,asgd,dc-asgd-a,dc-asgdk,ddc-asgd

Each row trains the same cell (a small Keras model, SGD with the given learning rate and
momentum) through ``%%distribute`` on one cluster started for the whole comparison, then
evaluates the returned model on the full test set in this process. Writes a markdown
table (final test accuracy mean +- std, wall time, time to a target, staleness, dropped
pushes), a JSON of every run and a plotly HTML of accuracy against epoch and against time.
With ``--clock virtual`` every row runs on the virtual clock with one step cost, measured
once (or given with ``--step``) and recorded with the table.
"""

from __future__ import annotations

from .cells import DATA, MODELS, QUICK, SETUPS, TRAIN
from .cli import compare, main, parse_args
from .grid import Row, epoch_times, notebook_shell, parse_rows, run_grid, run_one, time_to_target
from .tables import ddc_result_lines, markdown, result_lines, summarise

__all__ = ["DATA", "MODELS", "QUICK", "Row", "SETUPS", "TRAIN", "compare", "ddc_result_lines", "epoch_times", "main",
           "markdown", "notebook_shell", "parse_args", "parse_rows", "result_lines", "run_grid", "run_one",
           "summarise", "time_to_target"]
