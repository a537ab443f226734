#!/usr/bin/env python3
"""det_grid_model.py - a numerical model of a deterministic backward by exact fp32 reductions on a
per-key grid (docs/bwd-sm90-v3.md part VIII): every term a CTA reduces into key row k, chunk c (64
dims) is first rounded, by (x + c) - c with c = 1.5 2^(e + 23), to a multiple of a step 2^e[k, c]
chosen so that the terms' bounds sum below 2^(e + 24) with room for the roundings; then every
partial sum, in whatever order the L2 adds them, is a multiple of 2^e below 2^(e + 24) in
magnitude, so each fp32 addition is exact and the result is the same bits in every order. The
bounds come from a pass before the backward that computes P and dS (S and dP, two of the five
products) and adds, per key row and chunk and in a fixed order, over the row's slots:
  ||dS[., slot]|| max_d ||q[t, ., d]|| + ||P[., slot]|| max_d ||dO[t, ., d]||   (norms over the heads)
(--bound tri: the triangle inequality instead; --bound nodp: |dS| bounded without dP; --bsum fixed:
the sums in integers, no order to fix; --steps row: one step per key row instead of per chunk).

    python3 dev/det_grid_model.py [--tokens T] [--topk K] [--keys S] [--heads 64|128] [--seed N]
                                  [--bound cs|tri|nodp] [--causal] [--bsum float|fixed] [--steps chunk|row]
    python3 dev/det_grid_model.py --op indexer [...]   # the indexer backward's d_index_k (H_idx 32, D 128)
    python3 dev/det_grid_model.py --self-test        # small sizes, both ops; exit 1 unless the sums are exact

Inputs as the bench draws them (bf16 q, kv, dO uniform in [-1, 1]; K distinct random keys per
token out of S, so that each key has about T K / S contributors; scale 576^-0.5); one CTA's term per
(slot, head block of 64) as the kernel computes it: dS^T q + P^T dO from bf16 P and dS, fp32 sums.
--op indexer: the indexer's q (bf16, 32 heads of 128) and weights as the bench draws them, g the KL
loss's gradient of the slot scores against a random target; one term per slot, sum_h G q with G =
g w [x > 0] in bf16; the bound needs no product, since [x > 0] only shrinks it.
Tokens run in two orders (ascending and descending) for each of: plain fp32 sums (today's
non-deterministic mode: the order is the L2's), and the grid's sums. Printed: whether the grid's
two orders agree bit for bit and equal the exact (float64) sum of the rounded terms; the bound's
looseness (the grid's bound over the tightest bound the terms allow, per key row and chunk); and
the relative Frobenius error against the float64 sum of the unrounded terms, in fp32 and after the
bf16 rounding of the output (the measure the GPU suites use), for both modes.
"""
import argparse
import sys
from dataclasses import dataclass

import numpy as np

CH = 64
FIX = 40   # --bsum fixed: fractional bits of the integer bound sums, relative to the largest slot bound


@dataclass(frozen=True)
class Cfg:
    """One run's operation and options; D, DV and NCH follow from op."""
    op: str = "attn"       # "attn" (dkv, D 576) or "indexer" (d_index_k, D 128)
    bound: str = "cs"      # "cs", "tri" or "nodp" (the attention's bound; the indexer has one)
    causal: bool = False
    bsum: str = "float"    # the bounds' sums per key row: "float" (in a fixed order) or "fixed" (integers)
    steps: str = "chunk"   # one step per key row and chunk, or per key row ("row": the largest)

    @property
    def D(self):
        return 576 if self.op == "attn" else 128

    @property
    def DV(self):
        return 512 if self.op == "attn" else 0

    @property
    def NCH(self):
        return self.D // CH


def bf16(x):
    """Round to bf16 (nearest even) and return the value as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def pick(cfg, rng, t, T, K, S):
    """Token t's keys: K distinct random ones out of S, or with --causal (token t at global position
    g = S - T + t) min(g + 1, K) out of 0..g, as the GLM shapes draw them."""
    if not cfg.causal:
        return rng.choice(S, K, replace=False)
    g = S - T + t
    return rng.choice(g + 1, min(g + 1, K), replace=False)


def token_terms(cfg, t, T, seed, kv, H, K, S, scale):
    """Token t's key indices, its terms x[hb][K, D] (fp32, one per head block of 64) and the
    bounds bnd[hb][K, NCH] of |x| per chunk."""
    D, DV, NCH = cfg.D, cfg.DV, cfg.NCH
    rng = np.random.default_rng([seed, t])
    idx = pick(cfg, rng, t, T, K, S)
    K = len(idx)
    q = bf16(rng.uniform(-1, 1, (H, D)))
    do = bf16(rng.uniform(-1, 1, (H, DV)))
    ks = kv[idx]                                      # [K, D]; V = its first DV columns
    s = (q @ ks.T).astype(np.float64) * scale         # [H, K]
    m = s.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(s - m).sum(axis=1, keepdims=True))
    p = np.exp(s - lse).astype(np.float32)
    o = bf16(p @ ks[:, :DV])
    delta = (do.astype(np.float64) * o).sum(axis=1, keepdims=True)
    dp = (do @ ks[:, :DV].T).astype(np.float64)
    ds = (p * (dp - delta) * scale).astype(np.float32)
    pb, dsb = bf16(p), bf16(ds)
    terms, bnds = [], []
    for h0 in range(0, H, 64):
        hs = slice(h0, h0 + 64)
        x = dsb[hs].T @ q[hs]                         # [K, D]
        x[:, :DV] += pb[hs].T @ do[hs]
        q64, do64 = q[hs].astype(np.float64), do[hs].astype(np.float64)
        domax = np.zeros(NCH)
        if cfg.bound == "tri":    # |sum_h u_h v_h| <= sum_h |u_h| max_h |v_h|
            qmax = np.abs(q64).reshape(-1, NCH, CH).max(axis=(0, 2))          # [NCH]
            domax[:DV // CH] = np.abs(do64).reshape(-1, DV // CH, CH).max(axis=(0, 2))
            a = np.abs(dsb[hs]).astype(np.float64).sum(axis=0)                 # [K]
            b = pb[hs].astype(np.float64).sum(axis=0)
        else:                 # Cauchy-Schwarz over the 64 heads: <= ||u|| ||v||
            qmax = np.sqrt((q64 ** 2).sum(axis=0)).reshape(NCH, CH).max(axis=1)
            domax[:DV // CH] = np.sqrt((do64 ** 2).sum(axis=0)).reshape(-1, CH).max(axis=1)
            if cfg.bound == "cs":
                dsabs = np.abs(dsb[hs]).astype(np.float64)
            else:             # "nodp": without dP, |dS| <= scale P (||dO_h|| ||V_j|| + |Delta_h|) (Cauchy-Schwarz over the 512 dims)
                von = np.sqrt((ks[:, :DV].astype(np.float64) ** 2).sum(axis=1))            # [K]
                don = np.sqrt((do64 ** 2).sum(axis=1))                                     # [64]
                dsabs = scale * pb[hs] * (don[:, None] * von[None, :] + np.abs(delta[hs]))
                dsabs *= 1 + 2.0 ** -8   # bf16 rounding of dS
            a = np.sqrt((dsabs ** 2).sum(axis=0))
            b = np.sqrt((pb[hs].astype(np.float64) ** 2).sum(axis=0))
        bnd = a[:, None] * qmax[None, :] + b[:, None] * domax[None, :]     # [K, NCH]
        terms.append(x.astype(np.float32))
        bnds.append(bnd)
    return idx, terms, bnds


def indexer_terms(cfg, t, T, seed, kv, H, K, S, scale):
    """The indexer backward's d_index_k terms of token t (one per slot: its H heads in one head
    block), G = g w [x > 0] in bf16 as the sm_90a kernel feeds it to the tensor cores, and the bound
    |g| min(max_d sum_h |w_h| |q[h, d]|, ||w|| max_d ||q[., d]||) per chunk (no product needed:
    [x > 0] only shrinks it)."""
    D, NCH = cfg.D, cfg.NCH
    rng = np.random.default_rng([seed, t])
    idx = pick(cfg, rng, t, T, K, S)
    K = len(idx)
    q = bf16(rng.uniform(-1, 1, (H, D)))
    w = rng.uniform(-1, 1, H).astype(np.float32) * np.float32((H * 128) ** -0.5)
    ks = kv[idx]
    x = q @ ks.T                                       # [H, K]
    z = (w[:, None] * np.maximum(x, 0)).sum(axis=0).astype(np.float64)
    pz = np.exp(z - z.max()); pz /= pz.sum()
    tgt = rng.uniform(0, 1, K); tgt /= tgt.sum()
    g = (pz - tgt).astype(np.float32)   # the KL loss's gradient up to its constant factor, which scales terms and bounds alike
    G = bf16(g[None, :] * w[:, None] * (x > 0))        # [H, K]
    term = G.T @ q                                     # [K, D]
    q64, w64 = q.astype(np.float64), np.abs(w.astype(np.float64))
    tri = (w64[:, None] * np.abs(q64)).sum(axis=0).reshape(NCH, CH).max(axis=1)
    cs = np.linalg.norm(w64) * np.sqrt((q64 ** 2).sum(axis=0)).reshape(NCH, CH).max(axis=1)
    bnd = np.abs(g.astype(np.float64))[:, None] * np.minimum(tri, cs)[None, :] * (1 + 2.0 ** -8)
    return idx, [term.astype(np.float32)], [bnd]


def run(cfg, T, K, S, H, seed, log=print, e_shift=0):
    D, NCH = cfg.D, cfg.NCH
    scale = D ** -0.5
    kv = bf16(np.random.default_rng([seed, 1 << 30]).uniform(-1, 1, (S, D)))
    make = token_terms if cfg.op == "attn" else indexer_terms

    def terms_of(t):
        return make(cfg, t, T, seed, kv, H, K, S, scale)
    order = list(range(T))
    slot_bounds = []             # --bsum fixed: every (keys, bounds) of pass 1, summed once M is known
    # pass 1: the bounds (the pre-pass), the float64 truth, the tightest chunk bound, plain fp32 ascending
    bound = np.zeros((S, NCH))
    count = np.zeros(S)
    bmax = np.zeros((S, NCH))
    absum = np.zeros((S, D))
    truth = np.zeros((S, D))
    f32_up = np.zeros((S, D), np.float32)
    over = 0                     # terms above their bound: must stay 0
    for t in order:
        idx, terms, bnds = terms_of(t)
        for x, bnd in zip(terms, bnds):
            over += int(np.sum(np.abs(x).reshape(len(idx), NCH, CH).max(axis=2) > bnd))
            bound[idx] += bnd
            if cfg.bsum == "fixed":
                slot_bounds.append((idx, bnd))
            count[idx] += 1
            bmax[idx] = np.maximum(bmax[idx], bnd)
            absum[idx] += np.abs(x)
            truth[idx] += x
            f32_up[idx] = f32_up[idx] + x
    if cfg.bsum == "fixed":
        # the bounds as integers: M = the largest slot bound (an integer max of fp32 bits, order-free),
        # each bound rounded up to a multiple of 2^-FIX M and the multiples summed in u64 (exact in
        # any order while a key row has fewer than 2^(64 - FIX) terms)
        assert count.max() < 2.0 ** (64 - FIX)
        bmax_all = max(float(b.max()) for _, b in slot_bounds)
        unit = bmax_all * 2.0 ** -FIX if bmax_all > 0 else 1.0
        bsum_int = np.zeros((S, NCH), np.uint64)
        for idx, bnd in slot_bounds:
            bsum_int[idx] += np.ceil(bnd / unit).astype(np.uint64)
        fixed = bsum_int.astype(np.float64) * unit
        assert np.all(fixed >= bound)
        bound = fixed
    margin = 1 + 2.0 ** -12      # covers the fp32 rounding of the terms and of the bound's own sum
    bound *= margin
    # e: the smallest with bound + n 2^(e - 1) < 2^(e + 24) (n terms, each rounded by at most half a
    # step), so that no partial sum in any order reaches 2^(e + 24); step 2^e, never below the
    # smallest normal. The kernel rounds by (x + c) - c with c = 1.5 2^(e + 23), which is exact only
    # for |x| <= 2^(e + 22): the largest single term's bound, times 4, joins the maximum.
    need_sum = bound / (1 - count[:, None] * 2.0 ** -25)
    need_one = 4 * bmax * margin
    need = np.maximum(need_sum, need_one)
    e = np.floor(np.log2(np.maximum(need, 1e-300))) + 1 - 24 + e_shift
    if cfg.steps == "row":
        e = np.repeat(e.max(axis=1, keepdims=True), NCH, axis=1)
    step = np.exp2(np.maximum(e, -126))                                   # [S, NCH]
    stepd = np.repeat(step, CH, axis=1)                                   # [S, D]
    tight = absum.reshape(S, NCH, CH).max(axis=2)
    loose = bound / np.maximum(tight, 1e-300)
    # pass 2 (descending) and pass 3 (ascending): the grid's sums, and plain fp32 descending
    f32_down = np.zeros((S, D), np.float32)
    grid = {}
    gexact = np.zeros((S, D))
    for name, seq in (("down", order[::-1]), ("up", order)):
        acc = np.zeros((S, D), np.float32)
        for t in seq:
            idx, terms, _ = terms_of(t)
            for x in terms:
                st = stepd[idx]
                c = np.float32(1.5) * (st * 2.0 ** 23).astype(np.float32)
                qx = (x + c) - c                                  # fp32, round to nearest even
                acc[idx] = acc[idx] + qx
                if name == "down":
                    f32_down[idx] = f32_down[idx] + x
                    gexact[idx] += qx
        grid[name] = acc
    same = np.array_equal(grid["up"].view(np.uint32), grid["down"].view(np.uint32))
    exact = np.array_equal(grid["up"].astype(np.float64), gexact)

    def rel(a):
        return float(np.linalg.norm(a.astype(np.float64) - truth) / np.linalg.norm(truth))

    n = count.mean()
    log(f"{cfg.op}{', causal' if cfg.causal else ''}: T {T}, K {K}, keys {S}, H {H}: {n:.1f} terms per key row on average"
        f" (largest {count.max():.0f}), seed {seed}")
    log(f"  grid: two orders bitwise equal: {same}; equal to the exact sum of the rounded terms: {exact};"
        f" terms above their bound: {over}")
    q = np.quantile(loose[count > 0], [0.5, 0.9, 0.99])
    log(f"  bound / tightest chunk bound: median {q[0]:.1f}, p90 {q[1]:.1f}, p99 {q[2]:.1f};"
        f" rows and chunks whose step the largest term sets: {np.mean(need_one > need_sum):.2%}")
    f32_diff = np.mean(bf16(f32_up) != bf16(f32_down))
    log(f"  fp32 sums (today's det0), ascending / descending: rel err {rel(f32_up):.2e} / {rel(f32_down):.2e};"
        f" bf16 {rel(bf16(f32_up)):.3e} / {rel(bf16(f32_down)):.3e}; bf16 outputs that differ between the orders {f32_diff:.2%}")
    log(f"  grid sums: rel err {rel(grid['up']):.2e}; bf16 {rel(bf16(grid['up'])):.3e}")
    f32_same = np.array_equal(f32_up.view(np.uint32), f32_down.view(np.uint32))
    return same and exact and over == 0, rel(bf16(grid["up"])), rel(bf16(f32_up)), f32_same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--topk", type=int, default=128)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--heads", type=int, default=64, choices=(32, 64, 128), help="64 or 128 (attn), 32 (indexer)")
    ap.add_argument("--op", default="attn", choices=("attn", "indexer"),
                    help="the attention backward's dkv (D 576) or the indexer backward's d_index_k (D 128, H_idx 32)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bound", default="cs", choices=("tri", "cs", "nodp"),
                    help="a term's bound: the triangle inequality over heads (tri), Cauchy-Schwarz (cs), "
                    "or Cauchy-Schwarz with |dS| bounded without dP (nodp: the pre-pass computes S only)")
    ap.add_argument("--causal", action="store_true", help="causal rows (the GLM shapes) instead of random keys")
    ap.add_argument("--bsum", default="float", choices=("float", "fixed"),
                    help="the bounds' sums per key row: float64 in a fixed order (after a sort by key) or "
                    "integers (u64 multiples of 2^-40 of the largest slot bound: order-free, no sort)")
    ap.add_argument("--steps", default="chunk", choices=("chunk", "row"),
                    help="a step per key row and 64-dim chunk, or one per key row (the largest of its chunks')")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    cfg = Cfg(a.op, a.bound, a.causal, a.bsum, a.steps)
    if a.op == "indexer":
        a.heads = 32
    if a.self_test:
        ok = True
        attn = Cfg("attn", a.bound)
        # many contributors per key; 128 heads; keys with 0, 1 or 2 contributors (one term sets the step)
        for T, K, S, H in ((64, 32, 64, 64), (48, 16, 40, 128), (8, 4, 64, 64)):
            good, g, f, f32_same = run(attn, T, K, S, H, a.seed)
            ok &= good and g < 1.01 * f
            ok &= T < 64 or not f32_same   # the comparison has teeth: plain fp32 sums differ by order
        good, g, f, _ = run(Cfg("indexer"), 64, 32, 48, 32, a.seed)   # the indexer backward's d_index_k
        ok &= good and g < 1.01 * f
        # integer bound sums (no sort) and one step per key row: still exact in any order
        good, g, f, _ = run(Cfg("attn", a.bound, bsum="fixed", steps="row"), 64, 32, 64, 64, a.seed)
        ok &= good and g < 1.01 * f
        # the check has teeth: a grid 6 bits finer than the bound allows loses exactness
        good, _, _, _ = run(attn, 64, 32, 64, 64, a.seed, log=lambda *_: None, e_shift=-6)
        print("grid 6 bits too fine: caught" if not good else "grid 6 bits too fine: NOT caught")
        ok &= not good
        print("self-test:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    good, _, _, _ = run(cfg, a.tokens, a.topk, a.keys, a.heads, a.seed)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
