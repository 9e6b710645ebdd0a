#!/usr/bin/env bash
# On a machine with a GPU: install the CUDA build of TensorFlow (and the rest), then measure
# HFDT on 1 GPU against plain model.fit on the same GPU, same model, data and batch
# (`RESULT hfdt_gpu_vs_fit=<ratio>`), then the speed ratios of the CPU benchmarks on this host
# (ps_bandwidth, nfdt_overhead, hfdt_vs_horovodrun: their RESULT lines). Record them in docs/benchmarks.md.
#
#     bash benchmarks/gpu_check.sh [--samples 60000 --epochs 4]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_check: no GPU visible (nvidia-smi)" >&2; exit 1; }
NBDIST_TF='tensorflow[and-cuda]==2.21.0' bash scripts/setup.sh
cd benchmarks
../.venv/bin/python - "$@" <<'PY'
import argparse, statistics, sys
from common import DEFINITION, notebook_shell, print_table, steady_samples_per_s
from local_overhead import TRAIN, plain_fit

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=60000)
parser.add_argument("--epochs", type=int, default=4)
args = parser.parse_args()

ip, session = notebook_shell()
ip.run_line_magic("dist", "start -n 1")
try:
    gpus = session.cluster.info(session.cluster.ids()[0]).gpus
    if not gpus:
        sys.exit("gpu_check: the engine's TensorFlow sees no GPU (is the CUDA build installed?)")
    ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
    ip.run_cell_magic("distribute", "--strategy hfdt --workers 1", TRAIN.format(epochs=args.epochs))
    seconds = session.cluster.client[session.last_run.workers[0]].pull("timer.seconds", block=True)
finally:
    ip.run_line_magic("dist", "stop")
hfdt = steady_samples_per_s(seconds, args.samples)
plain = steady_samples_per_s(plain_fit(args.samples, args.epochs)["epochs"], args.samples)
print_table(["samples/s (median epoch 2+)", "nbdist hfdt, 1 GPU", "plain fit, 1 GPU", "ratio"],
            [[f"GPU {gpus[0]}", f"{hfdt:,.0f}", f"{plain:,.0f}", f"{hfdt / plain:.3f}"]])
print(f"RESULT hfdt_gpu_vs_fit={hfdt / plain:.3f}")
PY
for bench in ps_bandwidth.py nfdt_overhead.py hfdt_vs_horovodrun.py; do
  echo "== $bench"
  ../.venv/bin/python "$bench"
done
