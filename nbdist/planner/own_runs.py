"""A run the planner makes for itself (the profile, a short run, a probe): the cell's common options without
auto's own, nothing shown, waited for."""

from __future__ import annotations

AUTO_ONLY = ("plan_only", "target_accuracy", "plan_seeds")  # options only `--strategy auto` reads


def refuse_auto_only(options: dict) -> None:
    """Raise an OptionError naming the options of `--strategy auto` that `options` sets for another strategy."""
    from ..errors import OptionError
    from ..strategies import COMMON_OPTIONS

    given = [o.flag for o in COMMON_OPTIONS if o.name in AUTO_ONLY and options.get(o.name, o.default) != o.default]
    if given:
        raise OptionError(f"{', '.join(given)}: options of --strategy auto (its plan); add --strategy auto, or leave "
                          "them out.")


def auto_defaults() -> dict:
    """Auto's own options at their defaults: what the runs it makes (and the one it chooses) are given."""
    from ..strategies import COMMON_OPTIONS

    return {o.name: o.default for o in COMMON_OPTIONS if o.name in AUTO_ONLY}


def planner_run(session, cell: str, options: dict, made_by=None, **values):
    """Run `cell` with the common options of `options` (auto's own at their defaults) updated by `values`; wait
    for it and return the Run (its error raised). `made_by`: a Strategy class not in the registry (the profile)."""
    from ..strategies import COMMON_OPTIONS

    given = {o.name: options.get(o.name, o.default) for o in COMMON_OPTIONS}
    given.update(**auto_defaults(), progress="none", background=True, **values)
    run = session.distribute(cell, given, strategy=made_by(given) if made_by is not None else None)
    thread, run.thread = run.thread, None
    thread.join()
    thread.reraise()
    return run
