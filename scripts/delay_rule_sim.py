"""A numpy model of nbdist's asynchronous schedule on the virtual clock, to try a delay rule in seconds.

The schedule is nbdist's (strided shards, equal or in proportion to speed, per-worker epochs closed by an
epoch-end barrier, step costs 1/speed, ties by rank); the model, data and gradients are the MLP of
../shared/reference/sim_ddc.py. docs/strategies/ddc-asgd.md quotes its numbers. Usage:

    python scripts/delay_rule_sim.py SPEEDS LR "RULE[:key=value...];..." [SEEDS] [EPOCHS]
    python scripts/delay_rule_sim.py 1,1,0.2,0.1 0.05 "seq;asgd0;dc-asgdk;ddc;ddc:share=speed" 0,1,2 3

Rules: seq (one worker), asgd, asgd0 (no momentum), dc-asgd-a, dc-asgdk, ddc (DESIGN.md section 5; p, kappa,
tau_drop, rho, amend, gamma_mom switch its parts), dana, dana-ddc, dana-m, dana-m-ddc, dana-match, la, la-ddc
(the look-ahead candidates of issue 17).
"""
import heapq
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared" / "reference"))
import sim_ddc as S  # noqa: E402

class Rule:
    def __init__(s, kind, K, eta, mu=0.9, lam0=2.0, p=1.0, gmin=0.1, kappa=1.0, tau_drop=8.0, rho=0.9, m=0.95,
                 amend=True, gamma_mom=True, blend=None):
        s.__dict__.update(locals()); s.v = None; s.ms = {}; s.tbar = 0.0; s.drops = 0; s.vk = {}; s.vsum = None
        s.dk = {}; s.muk = {}
    def comp(s, w, g, wbak, k):
        ms = s.ms.get(k); ms = (1-s.m)*g*g if ms is None else s.m*ms + (1-s.m)*g*g; s.ms[k] = ms
        return (s.lam0/np.sqrt(ms + 1e-7))*g*g*(w - wbak)
    def apply(s, w, g, wbak, tau, k):
        if s.v is None: s.v = np.zeros_like(w)
        kind = s.kind
        if kind == "seq" or kind == "asgd":
            s.v = s.mu*s.v - s.eta*g; return w + s.v
        if kind == "asgd0":
            return w - s.eta*g
        c = s.comp(w, g, wbak, k)
        if kind == "dana-m": c = 0*c
        if kind == "dc-asgd-a":
            return w - s.eta*(g + c)
        if kind == "dc-asgdk":
            muK = max(0.0, s.mu - (1 - 1/s.K)); s.v = muK*s.v - s.eta*(g + c); return w + s.v
        if kind == "ddc":
            limit = s.tau_drop*(s.tbar+1)
            s.tbar = s.rho*s.tbar + (1-s.rho)*(min(tau, limit) if s.amend else tau)
            if not s.amend: limit = s.tau_drop*(s.tbar+1)
            if tau > limit: s.drops += 1; return w
            if s.kappa != np.inf: c = np.clip(c, -s.kappa*np.abs(g), s.kappa*np.abs(g))
            gamma = min(1.0, max(s.gmin, ((s.tbar+1)/(tau+1))**s.p))
            mu_t = max(0.0, s.mu - s.tbar/(s.tbar+1)) * (gamma if s.gamma_mom else 1.0)
            s.v = mu_t*s.v - s.eta*gamma*(g + c); return w + s.v
        if kind in ("dana", "dana-ddc"):
            # a momentum vector per worker on the PS; the worker is sent where the others' pending momentum
            # steps will take the weights (look-ahead)
            if s.vsum is None: s.vsum = np.zeros_like(w)
            vk = s.vk.get(k, np.zeros_like(w)); gamma = 1.0
            if kind == "dana-ddc":
                s.tbar = s.rho*s.tbar + (1-s.rho)*tau
                gamma = min(1.0, max(s.gmin, ((s.tbar+1)/(tau+1))**s.p))
            new = s.mu*vk + gamma*g
            s.vsum += new - vk; s.vk[k] = new
            return w - s.eta*new
        if kind == "dana-match":
            # DANA with each worker's momentum matched to its measured push interval (tau + 1 global steps):
            # mu_k = mu^(tau_k+1) keeps a gradient's memory as long, in global steps, as sequential momentum's,
            # and the gradient scaled by (1-mu_k)/(1-mu) keeps the steady step of sequential momentum SGD
            if s.vsum is None: s.vsum = np.zeros_like(w)
            s.dk[k] = tau if k not in s.dk else s.rho*s.dk[k] + (1-s.rho)*tau
            mu_k = s.mu ** (s.dk[k] + 1); s.muk[k] = mu_k
            vk = s.vk.get(k, np.zeros_like(w))
            new = mu_k*vk + (1 - mu_k)/(1 - s.mu)*(g + np.clip(c, -np.abs(g), np.abs(g)))
            s.vsum += new - vk; s.vk[k] = new
            return w - s.eta*new
        if kind in ("dana-m", "dana-m-ddc"):
            # DANA with each worker's momentum decayed per global step: mu_k = mu^(d_k+1), d_k its measured delay
            if s.vsum is None: s.vsum = np.zeros_like(w)
            s.dk[k] = tau if k not in s.dk else s.rho*s.dk[k] + (1-s.rho)*tau
            mu_k = s.mu ** (s.dk[k] + 1); s.muk[k] = mu_k
            vk = s.vk.get(k, np.zeros_like(w)); gamma = 1.0
            if kind == "dana-m-ddc":
                s.tbar = s.rho*s.tbar + (1-s.rho)*tau
                gamma = min(1.0, max(s.gmin, ((s.tbar+1)/(tau+1))**s.p))
                g = g + np.clip(c, -np.abs(g), np.abs(g))
            new = mu_k*vk + gamma*g
            s.vsum += new - vk; s.vk[k] = new
            return w - s.eta*new
        if kind in ("la", "la-ddc"):
            # one velocity; each worker is sent where d_k more momentum steps take the weights, d_k its
            # measured delay (an EMA of its own staleness)
            s.dk[k] = tau if k not in s.dk else s.rho*s.dk[k] + (1-s.rho)*tau
            gamma = 1.0
            if kind == "la-ddc":
                s.tbar = s.rho*s.tbar + (1-s.rho)*tau
                gamma = min(1.0, max(s.gmin, ((s.tbar+1)/(tau+1))**s.p))
                g = g + np.clip(c, -np.abs(g), np.abs(g))
            s.v = s.mu*s.v - s.eta*gamma*g; return w + s.v
        raise ValueError(kind)
    def send(s, w, k=None):
        if s.kind in ("dana-match", "dana-m", "dana-m-ddc") and s.vsum is not None:
            return w - s.eta*sum(s.muk.get(j, s.mu)*v for j, v in s.vk.items())
        if s.kind in ("la", "la-ddc") and s.v is not None and k is not None:
            d = s.dk.get(k, 0.0); mu = s.mu
            return w + s.v * (mu*(1 - mu**d)/(1 - mu) if d > 0 else 0.0)
        if s.kind.startswith("dana") and s.vsum is not None:
            return w - s.eta*s.mu*s.vsum
        return w

def run(kind, speeds, epochs, seed, eta, B=64, n=None, share="equal", **kw):
    K = len(speeds); r = np.random.default_rng(seed)
    X, Y = (S.X, S.Y) if n is None else (S.X[:n], S.Y[:n])
    w = S.init(seed); rule = Rule(kind, K, eta, **kw)
    usable = (len(X)//K)*K
    if share == "equal":
        shards = [np.arange(k, usable, K) for k in range(K)]
    else:  # sizes proportional to speed: every worker's epoch takes the same time
        order = np.arange(len(X)); cuts = np.cumsum([0] + [sp / sum(speeds) for sp in speeds]) * len(X)
        shards = [order[int(cuts[k]):int(cuts[k+1])] for k in range(K)]
    version = 0; T0 = 0.0; taus = []; t_epoch = []
    cost = [1.0/sp for sp in speeds]
    for e in range(epochs):
        batches = []
        for k in range(K):
            idx = r.permutation(shards[k]); batches.append([idx[i:i+B] for i in range(0, len(idx), B)])
        pulled = {k: (w.copy(), version) for k in range(K)}
        ev = [(T0 + cost[k], k, 0) for k in range(K)]; heapq.heapify(ev); last = T0
        while ev:
            t, k, j = heapq.heappop(ev)
            wbak, v0 = pulled[k]
            b = batches[k][j]
            g = S.grad(wbak, X[b], Y[b])
            tau = version - v0; taus.append(tau)
            w = rule.apply(w, g, wbak, tau, k); version += 1
            pulled[k] = (rule.send(w, k).copy(), version)
            last = max(last, t)
            if j + 1 < len(batches[k]): heapq.heappush(ev, (t + cost[k], k, j + 1))
        T0 = last; t_epoch.append(T0)
    return S.acc(w), float(np.mean(taus)), max(taus), rule.drops

if __name__ == "__main__":
    speeds = [float(x) for x in sys.argv[1].split(",")]; eta = float(sys.argv[2]); specs = sys.argv[3].split(";")
    seeds = [int(s) for s in (sys.argv[4] if len(sys.argv) > 4 else "0,1,2").split(",")]
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    for spec in specs:
        name, *kv = spec.split(":"); kw = {}
        for p in kv:
            a, b = p.split("="); kw[a] = (b == "True" if b in ("True", "False") else b if a == "share" else float(b))
        sp = [1.0] if name == "seq" else speeds
        t0 = time.time(); res = [run(name, sp, epochs, s, eta, **kw) for s in seeds]
        a = [x[0] for x in res]
        print(f"{spec:40s} {np.mean(a)*100:.2f} +- {np.std(a)*100:.2f} tau {np.mean([x[1] for x in res]):.2f} max {max(x[2] for x in res)} drops {sum(x[3] for x in res)} ({time.time()-t0:.0f}s)", flush=True)
