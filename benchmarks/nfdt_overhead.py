"""What `--strategy nfdt` with one worker costs against plain `model.fit`, side by side in one run.

One worker, one parameter-server shard on the notebook host: every step pushes the
gradient and receives the weights over ZeroMQ (signed, checked), and the PS applies the
optimizer in numpy. Prints a table, then:
    RESULT nfdt1_vs_fit=<nbdist samples/s over plain fit samples/s, steady-state epochs>

    .venv/bin/python benchmarks/nfdt_overhead.py [--samples 20000 --epochs 4 --rounds 3]
"""

from __future__ import annotations

from common import against_plain_fit_parser, alternate_with_plain_fit, one_engine, print_rounds


def main() -> None:
    args = against_plain_fit_parser(__doc__).parse_args()
    with one_engine(args.samples, args.epochs) as (ip, session):
        rounds = alternate_with_plain_fit(ip, session, "--strategy nfdt --workers 1", args.samples, args.epochs,
                                          args.rounds)
        pushes = session.last_run.ps[0]["counts"]["applied"]
    ratio = print_rounds("nbdist nfdt x1", rounds)
    print(f"pushes applied by the PS in the last round: {pushes}")
    print(f"RESULT nfdt1_vs_fit={ratio:.3f}")


if __name__ == "__main__":
    main()
