"""Execute a notebook headless (as `make demo` does), printing each cell's output as it finishes."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow start-up chatter is not demo output
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def output_text(output) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type in ("execute_result", "display_data"):
        return output.get("data", {}).get("text/plain", "") + "\n"
    if output.output_type == "error":
        return ANSI.sub("", "\n".join(output.traceback)) + "\n"
    return ""


os.environ.setdefault("NBDIST_PROGRESS", "text")  # headless: a progress line, not widgets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args()

    notebook = nbformat.read(args.notebook, as_version=4)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    started = time.time()

    def on_cell_executed(cell, cell_index, **_):
        number = code_cells.index(cell) + 1 if cell in code_cells else "?"
        first = cell.source.splitlines()[0] if cell.source else ""
        print(f"\n[{number}/{len(code_cells)}] {first}   ({time.time() - started:.0f} s)", flush=True)
        for output in cell.get("outputs", []):
            text = output_text(output)
            # tqdm redraws with carriage returns: keep only the last state of each line
            print("\n".join(line.split("\r")[-1] for line in text.rstrip("\n").split("\n")), flush=True)

    client = NotebookClient(notebook, timeout=args.timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(args.notebook.parent)}},
                            on_cell_executed=on_cell_executed)
    print(f"Running {args.notebook} headless (a local cluster starts inside it) ...", flush=True)
    failed = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    args.output.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, args.output)
    print(f"\nExecuted notebook written to {args.output} ({time.time() - started:.0f} s)")
    if failed is not None:
        print(f"A cell failed; see above and {args.output}.", file=sys.stderr)
        return 1
    text = "".join(output_text(o) for c in code_cells for o in c.get("outputs", []))
    match = re.search(r"test accuracy: ([0-9.]+)", text)
    if match:
        print(f"Final test accuracy: {match.group(1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
