"""The `compare` command: its arguments and presets, and the files it writes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cells import DEFAULT_STRATEGIES, MODELS, QUICK, SETUPS
from .grid import parse_rows, run_grid
from .tables import ddc_result_lines, markdown, result_lines, summarise, write_html


def parse_args(argv: list[str] | None):
    """The `compare` command's arguments, presets filled in."""
    parser = argparse.ArgumentParser(prog="python -m nbdist.experiments compare", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist"])
    parser.add_argument("--workers", type=int)
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--samples", type=int, help="training samples (default: all 60,000)")
    parser.add_argument("--simulate", help="as %%%%distribute --simulate, for every multi-worker row")
    parser.add_argument("--target-accuracy", type=float,
                        help="report each row's time to this validation accuracy, and ASHL's ratios to the others")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--hidden", type=int, default=128, help="the MLP's hidden units")
    parser.add_argument("--out", default="build/experiments", help="folder for results.md, results.json, curves.html")
    parser.add_argument("--quick", action="store_true", help=f"small preset (<10 min on 2 cores): {QUICK}")
    parser.add_argument("--setup", choices=sorted(SETUPS), help="a named set-up of docs/results.md (workers' speeds, lr)")
    parser.add_argument("--clock", default="real", choices=["real", "virtual"],
                        help="virtual: every row on the virtual clock, with one step cost for all (DESIGN.md section 7)")
    parser.add_argument("--step", help="the virtual clock's step cost (default: measured once, e.g. 1.2ms+30us/sample)")
    args = parser.parse_args(argv)
    for key, value in (SETUPS.get(args.setup) or {}).items():
        if getattr(args, key) in (None, parser.get_default(key)):
            setattr(args, key, value)
    defaults = QUICK if args.quick else {"workers": 8, "samples": None, "epochs": 4, "seeds": 3, "simulate": None}
    if args.workers is None and args.simulate:  # one simulated profile per worker
        args.workers = max(len(part.split(",")) for part in args.simulate.split(";"))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def compare(argv: list[str] | None = None) -> list[dict]:
    """`python -m nbdist.experiments compare ...`: run the grid, write results.md / .json / curves.html."""
    args = parse_args(argv)
    rows = parse_rows(args.strategies)
    command = "python -m nbdist.experiments compare " + " ".join(_quote(a) for a in (argv or sys.argv[2:]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run_grid(args, rows)
    summary = summarise(results, args.target_accuracy)
    table = markdown(summary, command, args)
    suffix = "_h2" if args.setup == "H2" else ""  # docs/results.md reads H1's lines unsuffixed
    results_line = (result_lines(summary, suffix=suffix) if args.target_accuracy else []) + ddc_result_lines(summary)
    (out / "results.md").write_text(table + "".join(f"\n{line}" for line in results_line) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))
    write_html(results, out / "curves.html")
    print()
    print(table)
    print(f"Wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'curves.html'}")
    for line in results_line:  # the headline figures end the output
        print(line)
    return summary


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(c in arg for c in " ;") else arg


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plan-check":
        from .plan_check import plan_check

        return plan_check(argv[1:])
    if not argv or argv[0] != "compare":
        print("usage: python -m nbdist.experiments compare|plan-check [options]; see compare --help", file=sys.stderr)
        raise SystemExit(2)
    compare(argv[1:])


if __name__ == "__main__":
    main()
