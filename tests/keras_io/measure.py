"""Measure an example's spread: its MEASURE after plain runs and after runs under each strategy, seeds 1..N, from which
its BOUNDS are set (harness.Bound: the mean less three standard deviations; plus, for a lower-is-better measure).

    .venv/bin/python -m tests.keras_io.measure test_mnist_convnet hfdt nfdt pipeline tensor --seeds 5

One plain kernel and one nbdist kernel on a cluster of its own (2 engines), each seed run as the acceptance test runs
seed 1 (harness.plain_determinism: an engine's thread pools in both kernels; RESEED; the strategy's line with
`--seed <s>`). Prints one line per strategy and the `Bound(...)` to paste, and writes build/bounds/<module>.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from tests.keras_io import harness
from tests.keras_io.harness import LINES, NotebookKernel


def seeded(text: str, seed: int) -> str:
    return text.replace(f"set_random_seed({harness.SEED})", f"set_random_seed({seed})")


def run_cells(kernel, module, seed: int, strategy: str | None) -> float:
    """The example's RUN cells (plain, or under `strategy`) with `seed`; its MEASURE."""
    kernel.run(seeded(harness.RESEED, seed)).check()
    for pattern in getattr(module, "FILES", ()):
        for path in Path(kernel.folder).glob(pattern):
            path.unlink()
    for cell in module.RUN:
        if callable(cell):
            continue
        if strategy is None:
            code = seeded(harness.plain_cell(cell), seed)
        else:
            code = cell.replace("%%distribute {line}", "%%distribute " + LINES[strategy].replace(
                f"--seed {harness.SEED}", f"--seed {seed}"), 1)
        reply = kernel.run(code, timeout=harness.CELL_TIMEOUT_S)
        assert reply.status == "ok", harness.brief(reply)
    return float(kernel.value(module.MEASURE.expression))


def kernel_for(module, folder: Path, cluster: bool):
    kernel = NotebookKernel(cwd=str(folder))
    kernel.folder = folder
    kernel.run("%load_ext nbdist\nimport nbdist").check()
    if cluster:
        kernel.run("%dist start -n 2", timeout=240).check()
    # both kernels on an engine's thread pools, as the acceptance test's (conftest: `harness.plain_determinism`)
    from nbdist.host.threads import engine_cores, share

    pools = share(engine_cores(), 2)
    kernel.run(harness.plain_determinism({"intra": pools.intra, "inter": pools.inter})).check()
    for cell in module.SETUP:
        kernel.run(cell, timeout=300).check()
    return kernel


def summary(values: list[float], higher: bool) -> dict:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"values": values, "mean": mean, "sd": sd, "bound": mean - 3 * sd if higher else mean + 3 * sd}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("strategies", nargs="+")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    module = importlib.import_module(f"tests.keras_io.{args.module}")
    higher = module.MEASURE.higher
    seeds = range(1, args.seeds + 1)
    results: dict[str, dict] = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as dist_dir:
        plain = kernel_for(module, Path(plain_dir), cluster=False)
        try:
            results["plain"] = summary([run_cells(plain, module, s, None) for s in seeds], higher)
        finally:
            plain.stop()
        dist = kernel_for(module, Path(dist_dir), cluster=True)
        try:
            for strategy in args.strategies:
                results[strategy] = summary([run_cells(dist, module, s, strategy) for s in seeds], higher)
        finally:
            dist.run("%dist stop", timeout=120)
            dist.stop()
    plain_mean = results["plain"]["mean"]
    for name, r in results.items():
        values = ", ".join(f"{v:.4f}" for v in r["values"])
        print(f"{name:>9}: {values}; mean {r['mean']:.4f} sd {r['sd']:.4f} -> bound {r['bound']:.4f}; "
              f"gap to plain's mean {r['mean'] - plain_mean:+.4f}")
    when = time.strftime("%Y-%m-%d")
    for strategy in args.strategies:
        r = results[strategy]
        print(f'    "{strategy}": Bound({r["bound"]:.4f}, "seeds 1-{args.seeds}: '
              f'{", ".join(f"{v:.3f}" for v in r["values"])}; mean {r["mean"]:.3f} sd {r["sd"]:.3f}; plain '
              f'{plain_mean:.3f} sd {results["plain"]["sd"]:.3f} (gap {r["mean"] - plain_mean:+.3f}); {when}"),')
    out = Path("build/bounds")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.module}.json").write_text(json.dumps(results, indent=1))
    print(f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
