"""What `--strategy nfdt` with one worker costs against plain `model.fit`, side by side in one run.

One worker, one parameter-server shard on the notebook host: every step pushes the
gradient and receives the weights over ZeroMQ (signed, checked), and the PS applies the
optimizer in numpy. Prints a table, then:
    RESULT nfdt1_vs_fit=<nbdist samples/s over plain fit samples/s, steady-state epochs>

    .venv/bin/python benchmarks/nfdt_overhead.py [--samples 20000 --epochs 4 --rounds 3]
"""

from __future__ import annotations

import argparse

from common import DEFINITION, alternate_with_plain_fit, notebook_shell, print_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating nbdist / plain rounds (this machine is noisy: the ratio is their median)")
    args = parser.parse_args()

    ip, session = notebook_shell()
    print(f"Starting a 1-engine cluster; {args.samples} Fashion-MNIST samples, {args.epochs} epochs, batch 64")
    ip.run_line_magic("dist", "start -n 1")
    try:
        ip.run_cell_magic("distribute", "define", DEFINITION.format(samples=args.samples))
        rounds = alternate_with_plain_fit(ip, session, "--strategy nfdt --workers 1", args.samples, args.epochs,
                                          args.rounds)
        pushes = session.last_run.ps[0]["counts"]["applied"]
    finally:
        ip.run_line_magic("dist", "stop")
    ratio = print_rounds("nbdist nfdt x1", rounds)
    print(f"pushes applied by the PS in the last round: {pushes}")
    print(f"RESULT nfdt1_vs_fit={ratio:.3f}")


if __name__ == "__main__":
    main()
