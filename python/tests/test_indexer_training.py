"""The indexer-training ops (docs/indexer-training.md) against plain-torch float64 formulas: the
slot target, the indexer's slot scores, the KL loss and its gradients into the indexer through
autograd. CPU (libdsa's CPU reference behind the ops) and, where a GPU exists, CUDA."""
import os
import time

import pytest
import torch

import libdsa
import reference as ref

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def seeded(name):
    seed = int(os.environ.get("DSA_TEST_SEED", time.time_ns() % 2**31))
    print(f"{name}: seed {seed} (replay with DSA_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


def bf16(g, *shape):
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1).to(torch.bfloat16)


def rel_err(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert not torch.isnan(a).any(), "NaN in libdsa's result"
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def slots(g, T, K, Tk):
    """Random slots with -1, out-of-range and duplicate entries, and lengths (one row empty)."""
    idx = torch.randint(0, Tk, (T, K), generator=g, dtype=torch.int32)
    idx[0, 1] = -1
    idx[1, 0] = Tk + 3
    idx[2, 2] = idx[2, 1]
    lengths = torch.randint(0, K + 1, (T,), generator=g, dtype=torch.int32)
    lengths[3] = 0
    lengths[4] = K
    return idx, lengths


def valid_mask(idx, lengths, Tk):
    K = idx.shape[1]
    return (idx >= 0) & (idx < Tk) & (torch.arange(K)[None, :] < lengths[:, None])


def z_formula(q, k, w, idx, valid):
    x = torch.einsum("thd,tkd->thk", q.double(), k.double()[idx.long().clamp(0, k.shape[0] - 1)])
    z = (w.double()[:, :, None] * torch.relu(x)).sum(1)
    return torch.where(valid, z, torch.zeros_like(z))


def kl_formula(a, z, valid, coeff):
    a = torch.where(valid, a.double(), torch.zeros_like(a.double()))
    sa = a.sum(1)
    counted = valid.any(1) & (sa > 0)
    logp = torch.log_softmax(z.masked_fill(~valid, float("-inf")), dim=1)
    tgt = a / sa.clamp_min(1e-300)[:, None]
    term = torch.where(valid & (tgt > 0), tgt * (torch.log(tgt.clamp_min(1e-300)) - logp), torch.zeros_like(tgt))
    n = int(counted.sum())
    return coeff / max(n, 1) * term[counted].sum() if n else torch.zeros((), dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
def test_slot_target_matches_the_attention_probabilities(device):
    g = seeded("slot_target")
    T, H, D, Tkv, K = 6, 4, 576, 40, 9
    q, kv = bf16(g, T, H, D), bf16(g, Tkv, D)
    idx, lengths = slots(g, T, K, Tkv)
    sink = torch.tensor([0.5, float("-inf"), float("inf"), -1.0])
    dev = lambda t: t.to(device)
    _, lse = libdsa.sparse_attention(dev(q), dev(kv), dev(idx), 0.05, topk_length=dev(lengths),
                                     attn_sink=dev(sink), return_lse=True)
    a = libdsa.slot_target(dev(q), dev(kv), dev(idx), lse, 0.05, topk_length=dev(lengths), attn_sink=dev(sink))
    valid = valid_mask(idx, lengths, Tkv)
    s = 0.05 * torch.einsum("thd,tkd->thk", q.double(), kv.double()[idx.long().clamp(0, Tkv - 1)])
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    den = torch.logaddexp(torch.logsumexp(s, -1), sink.double()[None, :])
    P = torch.exp(s - den[..., None]).nan_to_num(0.0)
    want = torch.where(valid, P.sum(1), torch.zeros_like(P.sum(1)))
    assert rel_err(a, want) < 1e-4
    assert bool((a.cpu()[~valid] == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_kl_loss_and_its_gradients_into_the_indexer(device):
    g = seeded("kl_loss")
    T, H, Tk, K = 8, 4, 30, 7
    q, k = bf16(g, T, H, 128), bf16(g, Tk, 128)
    w = (torch.rand(T, H, generator=g) - 0.5) * 0.2
    idx, lengths = slots(g, T, K, Tk)
    a = torch.rand(T, K, generator=g)
    a[5] = 0  # a row whose target sums to 0 does not count
    dev = lambda t: t.to(device).clone()
    qd, kd, wd = dev(q).requires_grad_(), dev(k).requires_grad_(), dev(w).requires_grad_()
    loss = libdsa.indexer_kl_loss(dev(a), qd, kd, wd, dev(idx), dev(lengths), coeff=0.3)
    loss.backward()
    valid = valid_mask(idx, lengths, Tk)
    q64, k64, w64 = q.double().requires_grad_(), k.double().requires_grad_(), w.double().requires_grad_()
    want = kl_formula(a, z_formula(q64, k64, w64, idx, valid), valid, 0.3)
    want.backward()
    assert abs(float(loss.detach()) - float(want.detach())) < 1e-5 * (1 + abs(float(want.detach())))
    assert rel_err(wd.grad, w64.grad) < 1e-4
    assert rel_err(qd.grad, q64.grad) < 1e-2
    assert rel_err(kd.grad, k64.grad) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_slot_scores_and_compile(device):
    g = seeded("slot_scores")
    T, H, Tk, K = 5, 3, 20, 6
    q, k = bf16(g, T, H, 128), bf16(g, Tk, 128)
    w = (torch.rand(T, H, generator=g) - 0.5).to(torch.bfloat16)
    idx, lengths = slots(g, T, K, Tk)
    dev = lambda t: t.to(device)
    z = libdsa.indexer_slot_scores(dev(q), dev(k), dev(w), dev(idx), dev(lengths))
    assert rel_err(z, z_formula(q, k, w, idx, valid_mask(idx, lengths, Tk))) < 1e-5
    f = torch.compile(lambda *t: libdsa.indexer_slot_scores(*t).sum(), backend="aot_eager", fullgraph=True)
    assert torch.equal(f(dev(q), dev(k), dev(w), dev(idx), dev(lengths)), z.sum())
