"""What `--strategy nfdt` with one worker costs against plain `model.fit`, side by side in one run.

One worker, one parameter-server shard on the notebook host: every step pushes the
gradient and receives the weights over ZeroMQ (signed, checked), and the PS applies the
optimizer in numpy. With `--overlap on` (the default `auto` for this cell) the next step computes
while the exchange is in flight; `--overlap off` waits for it. Both run, each round alternating
with plain `fit`. The cell compiles Adam (1e-3): `auto` keeps the overlap off for SGD with
momentum above 0.45, which a one-step delay would push past 0.95 (it diverges).
Prints the tables, then:
    RESULT nfdt1_vs_fit=<nbdist samples/s over plain fit samples/s, steady-state epochs, default options>
    RESULT nfdt1_no_overlap_vs_fit=<the same with --overlap off>
    RESULT nfdt_exposed_exchange_fraction=<time steps waited for their exchange / the exchanges' own time>
    RESULT nfdt2_vs_fit=<2 workers' cluster samples/s (a fresh 2-engine cluster) over plain fit samples/s>

    .venv/bin/python benchmarks/nfdt_overhead.py [--samples 20000 --epochs 4 --rounds 3]
"""

from __future__ import annotations

import statistics

from common import against_plain_fit_parser, alternate_with_plain_fit, benchmark_cluster, print_rounds

ADAM = "keras.optimizers.Adam(1e-3)"


def main() -> None:
    args = against_plain_fit_parser(__doc__).parse_args()
    exposed, accuracy = [], []
    with benchmark_cluster(args.samples, args.epochs) as (ip, session):
        overlapped, waiting = [], []
        for _ in range(args.rounds):  # the two variants alternate too, so drift hits both alike
            overlapped += alternate_with_plain_fit(ip, session, "--strategy nfdt --workers 1", args.samples,
                                                   args.epochs, 1, ADAM)
            exposed.append(session.last_run.fits[0].timings["exposed_exchange_fraction"])
            accuracy.append(session.last_run.final_metrics.get("accuracy"))
            waiting += alternate_with_plain_fit(ip, session, "--strategy nfdt --workers 1 --overlap off",
                                                args.samples, args.epochs, 1, ADAM)
        pushes = session.last_run.ps[0]["counts"]["applied"]
    with benchmark_cluster(args.samples, args.epochs, engines=2) as (ip, session):
        two = alternate_with_plain_fit(ip, session, "--strategy nfdt --workers 2", args.samples, args.epochs,
                                       args.rounds, ADAM)
    ratio = print_rounds("nbdist nfdt x1 (overlap, the default)", overlapped)
    plain_ratio = print_rounds("nbdist nfdt x1 --overlap off", waiting)
    two_ratio = print_rounds("nbdist nfdt x2, cluster", two)
    print(f"training accuracy at the end, by round (overlap): {accuracy}")
    print(f"pushes applied by the PS in the last round: {pushes}; exposed exchange fraction by round (overlap): "
          f"{', '.join(f'{e:.3f}' for e in exposed)} (without overlap a step waits for its whole exchange: 1.0)")
    print(f"RESULT nfdt1_vs_fit={ratio:.3f}")
    print(f"RESULT nfdt1_no_overlap_vs_fit={plain_ratio:.3f}")
    print(f"RESULT nfdt_exposed_exchange_fraction={statistics.median(exposed):.3f}")
    print(f"RESULT nfdt2_vs_fit={two_ratio:.3f}")


if __name__ == "__main__":
    main()
