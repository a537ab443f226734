"""Plain-torch float64 formulas of the reference module's DSA layer: the oracle of the package tests.
Written from docs/contract.md, independently of libdsa's CPU reference."""
import torch


def attention(q, kv, idx, scale, topk_length=None, sink=None):
    """out [T, H, 512], lse [T, H] (+inf on rows without a valid slot) in float64, differentiable in
    q, kv and sink. q [T, H, D], kv [T_kv, D], idx [T, K] (-1 or out of range: invalid)."""
    T, H, D = q.shape
    Tkv, K = kv.shape[0], idx.shape[1]
    idx = idx.long()
    valid = (idx >= 0) & (idx < Tkv)
    if topk_length is not None:
        valid &= torch.arange(K)[None, :] < topk_length.long()[:, None]
    g = kv[idx.clamp(0, max(Tkv - 1, 0))]                          # [T, K, D]
    s = scale * torch.einsum("thd,tkd->thk", q, g)
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                               # -inf on empty rows
    den = lse if sink is None else torch.logaddexp(lse, sink[None, :].expand_as(lse))
    p = torch.exp(s - den[..., None]).nan_to_num(0.0)              # empty rows: 0
    p = torch.where(valid[:, None, :], p, torch.zeros_like(p))
    out = torch.einsum("thk,tkd->thd", p, g[..., :512])
    lse = torch.where(torch.isinf(lse) & (lse < 0), torch.full_like(lse, float("inf")), lse)
    return out, lse


def attention_backward(q, kv, idx, scale, out, dout, topk_length=None, sink=None):
    """dq [T, H, D], dkv [T_kv, D], dsink [H] in float64 by the contract's formulas (docs/contract.md
    section 9): Delta = sum_d out * dout with `out` the forward output as given (bf16, as libdsa's
    backward takes it), P = exp(s - L'), L' = logaddexp(lse, sink), dS = P (dP - Delta)."""
    q, kv, out, dout = q.double(), kv.double(), out.double(), dout.double()
    T, H, D = q.shape
    Tkv, K = kv.shape[0], idx.shape[1]
    idx = idx.long()
    valid = (idx >= 0) & (idx < Tkv)
    if topk_length is not None:
        valid &= torch.arange(K)[None, :] < topk_length.long()[:, None]
    safe = idx.clamp(0, max(Tkv - 1, 0))
    g = kv[safe]
    s = (scale * torch.einsum("thd,tkd->thk", q, g)).masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    den = lse if sink is None else torch.logaddexp(lse, sink.double()[None, :].expand_as(lse))
    P = torch.where(valid[:, None, :], torch.exp(s - den[..., None]).nan_to_num(0.0), torch.zeros_like(s))
    delta = (out[..., :512] * dout).sum(-1)
    dP = torch.einsum("thd,tkd->thk", dout, g[..., :512])
    dS = P * (dP - delta[..., None])
    dq = scale * torch.einsum("thk,tkd->thd", dS, g)
    dg = scale * torch.einsum("thk,thd->tkd", dS, q)
    dg[..., :512] += torch.einsum("thk,thd->tkd", P, dout)
    dg = dg * valid[..., None]
    dkv = torch.zeros(Tkv, D, dtype=torch.float64).index_add_(0, safe.reshape(-1), dg.reshape(-1, D))
    dsink = torch.zeros(H, dtype=torch.float64)
    if sink is not None:
        sk = sink.double()
        live = torch.isfinite(lse) & torch.isfinite(sk)[None, :]
        dsink = -(torch.where(live, torch.exp(sk[None, :] - den) * delta, torch.zeros_like(delta))).sum(0)
    return dq, dkv, dsink


def indexer_scores(index_q, index_k, weights, starts, causal_lengths):
    """Per local query t: scores over its visible keys starts[t] .. starts[t] + causal_lengths[t] - 1."""
    rows = []
    for t in range(index_q.shape[0]):
        s0, n = int(starts[t]), int(causal_lengths[t])
        k = index_k[s0:s0 + n].double()
        x = torch.relu(index_q[t].double() @ k.T)                 # [H, n]
        rows.append((weights[t].double()[:, None] * x).sum(0))
    return rows


def indexer_topk(index_q, index_k, weights, starts, causal_lengths, K):
    """indices [T, K] (global rows ascending, then -1), lengths [T]: the K best keys (ties: smaller key)."""
    T = index_q.shape[0]
    out = torch.full((T, K), -1, dtype=torch.int32)
    lengths = torch.zeros(T, dtype=torch.int32)
    for t, sc in enumerate(indexer_scores(index_q, index_k, weights, starts, causal_lengths)):
        n = sc.numel()
        if n == 0:
            continue
        if n <= K:
            sel = torch.arange(n)
        else:
            order = sorted(range(n), key=lambda c: (-float(sc[c]), c))
            sel = torch.tensor(sorted(order[:K]))
        out[t, :sel.numel()] = sel.int() + int(starts[t])
        lengths[t] = sel.numel()
    return out, lengths
