"""`nfdt`: asynchronous data parallel training through nbdist's parameter server.

Keras' own `fit` runs on every worker over its shard; the optimizer's `apply_gradients`
is replaced by one push-pull with the PS: the gradient goes to the shards, which apply the
user's optimizer, and the reply carries the new weights the next step computes on. The
machinery is the parameter-server family's (`strategies/parameter_server.py`); NFDT is its
plainest member, and warns when the cell's momentum plus asynchrony's risks divergence.
"""

from __future__ import annotations

from . import options as opt
from .parameter_server import PsStrategy

DIVERGENCE_RISK = 0.95


def momentum_note(run) -> str | None:
    """For the cell's own optimizer on several async workers: the effective momentum, explicit plus
    about tau_bar/(tau_bar+1) from asynchrony (Mitliagkas et al., 2016), with a warning above 0.95."""
    if not run.ps or len(run.workers) < 2 or run.ps[0].get("rule"):
        return None
    optimizer = run.ps[0].get("optimizer") or {}
    mu = float(optimizer.get("momentum") or 0.0)
    staleness = [r["staleness"] for r in run.push_records if r["applied"]]
    if optimizer.get("kind", optimizer.get("name")) != "SGD" or mu <= 0 or not staleness:
        return None
    tau_bar = sum(staleness) / len(staleness)
    effective = mu + tau_bar / (tau_bar + 1)
    note = (f"nbdist: effective momentum ~ {effective:.2f} (momentum {mu:g} of the optimizer plus "
            f"{tau_bar / (tau_bar + 1):.2f} from asynchrony at mean staleness {tau_bar:.1f}).")
    if effective > DIVERGENCE_RISK:
        keep = max(0.0, mu - tau_bar / (tau_bar + 1))
        note += (f" Above {DIVERGENCE_RISK} training may diverge: --momentum {keep:.2f} keeps it at your {mu:g} (the "
                 "shards' momentum instead of the optimizer's), or use --strategy ddc-asgd, which reduces the momentum "
                 "by the measured delay.")
    return note


class NfdtStrategy(PsStrategy):
    """Asynchronous data parallel training: every worker's gradient goes to the PS, which applies the
    cell's own optimizer; no worker waits for another."""

    name = "nfdt"
    summary = "asynchronous data parallel through nbdist's parameter server (the user's optimizer)"
    reads = (*PsStrategy.reads, opt.OVERLAP, opt.DATA, *opt.ELASTIC)

    def finish(self, run) -> None:
        super().finish(run)
        overlap = next((f.timings.get("overlap") for f in run.fits), None) or ""
        if overlap.startswith("off:") and self.value("overlap") == "auto":
            run.note(f"nbdist: --overlap auto was {overlap}.")
        note = momentum_note(run)
        if note:
            run.note(note)
