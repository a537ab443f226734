"""libdsa.megatron against Megatron-Core 0.16.1's own DSA code (megatron/core/transformer/
experimental_attention_variant/dsa.py) on the same inputs: unfused_dsa_fn, DSAIndexer.
_compute_index_scores with its causal top-k, compute_dsa_indexer_loss(sparse_loss=True), and a
DSAttention built from Megatron's spec against the same module with libdsa's classes. Outputs and
gradients (q, the kv latent, the indexer's q / k / weights and parameters) within the tolerances
below; the semantic differences python/README.md states, each shown to be the only one. CPU (libdsa's
CPU reference behind the ops) and, where a GPU exists, CUDA. Skips without megatron-core.

Tolerances are max |libdsa - Megatron| / max |Megatron| per tensor. Megatron's unfused attention
rounds its probabilities to bf16 before P V (relative 2^-9) and runs its backward through bf16 matmuls,
libdsa accumulates in fp32 (double on the CPU): 1e-2 for the output, 2e-2 for dq and dkv. Index
scores are fp32 sums of exact bf16 products: 1e-5. The loss: 1e-4 relative; its gradients into the
indexer (bf16 d_index_q / d_index_k, fp32 d_weights): 1e-2."""
import importlib.util
import os
import time

import pytest
import torch

pytest.importorskip("megatron.core.transformer.experimental_attention_variant.dsa",
                    reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
import libdsa  # noqa: E402

if importlib.util.find_spec("libdsa.megatron") is None:
    pytest.skip(f"the libdsa package under test ({os.path.dirname(libdsa.__file__)}) has no libdsa.megatron: "
                "pip install ./python again", allow_module_level=True)

from megatron.core.transformer.experimental_attention_variant import dsa  # noqa: E402

from libdsa import megatron as M  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def seeded(name):
    seed = int(os.environ.get("DSA_TEST_SEED", time.time_ns() % 2**31))
    print(f"{name}: seed {seed} (replay with DSA_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(torch.bfloat16)


def rel_err(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert not torch.isnan(a).any(), "NaN in libdsa's result"
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


class _TP1:
    """A pg_collection whose tensor-parallel group has one rank (what compute_dsa_indexer_loss reads)."""
    class tp:
        @staticmethod
        def size():
            return 1


class _TP2:
    class tp:
        @staticmethod
        def size():
            return 2


def causal_mask(sq, device):
    return torch.triu(torch.full((sq, sq), float("-inf"), device=device), diagonal=1)


def inputs(g, device, sq=24, b=2, np_=4, h_idx=4, topk=8):
    """Absorbed-MLA attention tensors (q, the kv latent leaf [sq, b, 1, 576]), indexer tensors, and
    Megatron's own top-k of Megatron's own index scores under the causal mask (its early rows hold
    future positions, as DSAttention's do)."""
    x = dict(q=rnd(g, sq, b, np_, 576, scale=0.5), kv=rnd(g, sq, b, 1, 576, scale=0.5),
             iq=rnd(g, sq, b, h_idx, 128), ik=rnd(g, sq, b, 128), w=rnd(g, sq, b, h_idx, scale=0.1),
             dout=rnd(g, sq, b, np_ * 512))
    x = {k: v.to(device) for k, v in x.items()}
    scores = dsa.DSAIndexer._compute_index_scores(None, x["iq"], x["w"], x["ik"]) + causal_mask(sq, device)
    x["topk"] = scores.topk(min(topk, sq), dim=-1)[1]
    x.update(sq=sq, b=b, np=np_, scale=0.07)
    return x


def megatron_kv(kv, np_):
    """The per-head key / value Megatron's unfused_dsa_fn takes, expanded from the latent."""
    return kv.expand(-1, -1, np_, -1), kv[..., :512].expand(-1, -1, np_, -1)


def leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


# ---- attention ----------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,np_", [(1, 4), (3, 2)])
def test_attention_matches_unfused_dsa_fn(device, b, np_):
    x = inputs(seeded("attention"), device, b=b, np_=np_)
    q, kv = leaves(x["q"], x["kv"])
    ref = dsa.unfused_dsa_fn(q, *megatron_kv(kv, np_), x["topk"], x["scale"])
    ref.backward(x["dout"])
    ref_dq, ref_dkv = q.grad, kv.grad
    # Megatron's per-head expanded key / value, and the latent itself with value a view of it
    for key_of, value_of in ((lambda t: megatron_kv(t, np_)[0], lambda t: megatron_kv(t, np_)[1]),
                             (lambda t: t, lambda t: t[..., :512])):
        q, kv = leaves(x["q"], x["kv"])
        out = M.dsa_fn(q, key_of(kv), value_of(kv), x["topk"], x["scale"])
        assert out.shape == ref.shape and out.dtype == ref.dtype
        out.backward(x["dout"])
        assert rel_err(out, ref) < 1e-2
        assert rel_err(q.grad, ref_dq) < 2e-2
        assert rel_err(kv.grad, ref_dkv) < 2e-2
    # value as a separate copy of the latent (what MLASelfAttention's .contiguous() makes) and int32
    # indices: the same result
    q, kv = leaves(x["q"], x["kv"])
    again = M.dsa_fn(q, kv, kv[..., :512].contiguous(), x["topk"].int(), x["scale"])
    assert torch.equal(again, out)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_rows_without_keys_and_duplicates(device):
    """The stated differences: a row with no visible slot is NaN in Megatron and 0 in libdsa; a key
    listed twice counts twice in libdsa (two slots) and once in Megatron (one mask entry); with the
    duplicate replaced by a masked future position the two agree again."""
    x = inputs(seeded("edge_rows"), device, b=1)
    sq, np_ = x["sq"], x["np"]
    topk = x["topk"].clone()
    topk[0, 0] = torch.arange(1, topk.shape[2] + 1)                 # row 0: only future positions
    row = 20
    dup = topk.clone()
    dup[0, row, 1] = dup[0, row, 0]                                 # row 20: a key twice
    fixed = dup.clone()
    fixed[0, row, 1] = sq - 1                                       # a future position of row 20
    key, value = megatron_kv(x["kv"], np_)
    ref = dsa.unfused_dsa_fn(x["q"], key, value, dup, x["scale"])
    out_dup = M.dsa_fn(x["q"], key, value, dup, x["scale"])
    out_fixed = M.dsa_fn(x["q"], key, value, fixed, x["scale"])
    assert torch.isnan(ref[0]).all() and bool((out_dup[0] == 0).all())
    assert rel_err(out_fixed[1:], ref[1:]) < 1e-2
    assert float((out_dup[row] - ref[row]).abs().max()) > 10 * float((out_fixed[row] - ref[row]).abs().max())


# ---- indexer ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_index_scores_match_compute_index_scores(device):
    g = seeded("index_scores")
    x = inputs(g, device, sq=20, b=2)
    upstream = torch.randn(x["b"], x["sq"], x["sq"], generator=g).to(device)
    got, want = [], []
    for impl, grads in ((lambda *t: M.compute_index_scores(*t), got),
                        (lambda *t: dsa.DSAIndexer._compute_index_scores(None, *t), want)):
        iq, w, ik = leaves(x["iq"], x["w"], x["ik"])
        s = impl(iq, w, ik)
        (s * upstream).sum().backward()
        grads += [s, iq.grad, w.grad, ik.grad]
    assert got[0].shape == want[0].shape and got[0].dtype == torch.float32
    assert rel_err(got[0], want[0]) < 1e-5
    for a, b in zip(got[1:], want[1:]):
        assert rel_err(a, b) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_index_topk_selects_megatrons_keys(device):
    x = inputs(seeded("index_topk"), device, sq=40, b=2, topk=12)
    sq, K = x["sq"], 12
    mine = M.index_topk(x["iq"], x["w"], x["ik"], K)
    ref = x["topk"]
    assert mine.shape == ref.shape and mine.dtype == ref.dtype == torch.int64
    scores = dsa.DSAIndexer._compute_index_scores(None, x["iq"], x["w"], x["ik"]).cpu()
    mine, ref = mine.cpu(), ref.cpu()
    pos = torch.arange(sq).view(1, sq, 1)
    for bi in range(x["b"]):
        for s in range(sq):
            a, r = mine[bi, s], ref[bi, s]
            assert torch.equal(a, a.sort()[0]), "ascending rows"
            a, r = a[a <= s], r[r <= s]
            assert a.numel() == r.numel() == min(K, s + 1)
            # the same keys up to ties: the same multiset of scores (up to fp32 rounding, where the
            # GPU's sums in another order may swap two keys whose scores agree to a few ulps)
            sa, sr = scores[bi, s, a].sort()[0], scores[bi, s, r].sort()[0]
            assert torch.allclose(sa, sr, rtol=1e-5, atol=1e-6 * float(scores[bi, s, :s + 1].abs().max()))
    short = (pos.squeeze(-1) + 1 < K).view(sq)
    assert torch.equal(mine[:, short], torch.arange(K).expand(x["b"], int(short.sum()), K))
    # a drop-in for Megatron's own attention: its output on libdsa's top-k is Megatron's on its own
    # (equal sets give equal masks) wherever the sets agree exactly
    key, value = megatron_kv(x["kv"], x["np"])
    a = dsa.unfused_dsa_fn(x["q"], key, value, mine.to(device), x["scale"])
    b = dsa.unfused_dsa_fn(x["q"], key, value, ref.to(device), x["scale"])
    same = torch.tensor([[set(mine[bi, s][mine[bi, s] <= s].tolist()) == set(ref[bi, s][ref[bi, s] <= s].tolist())
                          for bi in range(x["b"])] for s in range(sq)])
    assert bool(same.float().mean() > 0.9)
    assert torch.equal(a[same.to(device)], b[same.to(device)])


# ---- indexer loss -------------------------------------------------------------------------------
def megatron_loss(x, coeff, iq, w, ik):
    s = dsa.DSAIndexer._compute_index_scores(None, iq, w, ik) + causal_mask(x["sq"], iq.device)
    key, _ = megatron_kv(x["kv"], x["np"])
    return dsa.compute_dsa_indexer_loss(s, x["topk"], x["q"], key, x["scale"], coeff, True, _TP1())


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_loss_matches_compute_dsa_indexer_loss(device):
    x = inputs(seeded("loss"), device, b=2)
    coeff = 0.3
    iq, w, ik = leaves(x["iq"], x["w"], x["ik"])
    ref = megatron_loss(x, coeff, iq, w, ik)
    ref.backward()
    want = (iq.grad, w.grad, ik.grad)
    # slot scores + sparse loss (what LibdsaDSAttention runs), with the lse recomputed or dsa_fn's
    _, lse = M.dsa_fn(x["q"], x["kv"], None, x["topk"], x["scale"], return_lse=True)
    losses = []
    for lse_arg in (None, lse):
        iq, w, ik = leaves(x["iq"], x["w"], x["ik"])
        z = M.index_slot_scores(iq, w, ik, x["topk"])
        loss = M.sparse_indexer_loss(z, x["topk"], x["q"], x["kv"], x["scale"], coeff, lse=lse_arg)
        loss.backward()
        losses.append(loss.detach())
        assert abs(float(loss.detach()) - float(ref.detach())) < 1e-4 * abs(float(ref.detach()))
        for a, b in zip((iq.grad, w.grad, ik.grad), want):
            assert rel_err(a, b) < 1e-2
    assert torch.equal(losses[0], losses[1])
    # the drop-in on dense scores (libdsa's, mask added as Megatron's indexer does)
    iq, w, ik = leaves(x["iq"], x["w"], x["ik"])
    s = M.compute_index_scores(iq, w, ik) + causal_mask(x["sq"], device)
    key, _ = megatron_kv(x["kv"], x["np"])
    loss = M.compute_dsa_indexer_loss(s, x["topk"], x["q"], key, x["scale"], coeff, True, _TP1())
    loss.backward()
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-4 * abs(float(ref.detach()))
    for a, b in zip((iq.grad, w.grad, ik.grad), want):
        assert rel_err(a, b) < 1e-2


def loss_terms_float64(x, z):
    """(target, log p) [b, sq, K] in float64 at the slots 0 <= idx <= s (target 0 and log p -inf
    elsewhere), z [b, sq, K]."""
    sq, b, np_ = x["sq"], x["b"], x["np"]
    q, kv = x["q"].double().cpu(), x["kv"].double().cpu()[:, :, 0]
    idx = x["topk"].cpu()
    valid = idx <= torch.arange(sq).view(1, sq, 1)
    keys = torch.stack([kv[idx[bi], bi] for bi in range(b)])          # [b, sq, K, 576]
    logits = x["scale"] * torch.einsum("sbhd,bskd->bshk", q, keys)
    logits = logits.masked_fill(~valid[:, :, None, :], float("-inf"))
    a = torch.softmax(logits, -1).sum(2)
    tgt = a / a.sum(-1, keepdim=True)
    return tgt, torch.log_softmax(z.double().cpu().masked_fill(~valid, float("-inf")), -1)


@pytest.mark.parametrize("device", DEVICES)
def test_loss_differs_only_by_the_1e10_terms(device):
    """Index weights 300x larger make p underflow far below 1e-10 at some selected slots, where
    Megatron's log(p + 1e-10) differs from log p. libdsa's loss is the exact KL of the float64 terms;
    Megatron's is the same expression with its 1e-10 terms; nothing else differs."""
    x = inputs(seeded("loss_1e10"), device, b=2)
    x["w"] = (x["w"].double() * 300).to(torch.bfloat16)
    coeff = 1.0
    iq, w, ik = leaves(x["iq"], x["w"], x["ik"])
    ref = megatron_loss(x, coeff, iq, w, ik)
    iq, w, ik = leaves(x["iq"], x["w"], x["ik"])
    z = M.index_slot_scores(iq, w, ik, x["topk"])
    zl = z.detach().clone().requires_grad_()
    loss = M.sparse_indexer_loss(zl, x["topk"], x["q"], x["kv"], x["scale"], coeff)
    loss.backward()
    tgt, logp = loss_terms_float64(x, z.detach())
    p, eps = logp.exp(), 1e-10
    pos = tgt > 0
    exact = torch.where(pos, tgt * (torch.log(tgt) - logp), torch.zeros_like(tgt)).sum(-1).mean()
    with_eps = (tgt * (torch.log(tgt + eps) - torch.log(p + eps))).sum(-1).mean()
    assert float(exact - with_eps) > 1e-3 * float(exact), "the inputs do not reach p < 1e-10"
    assert abs(float(loss.detach()) - float(exact)) < 1e-4 * float(exact)
    assert abs(float(ref.detach()) - float(with_eps)) < 1e-4 * float(with_eps)
    # the gradient is that of the exact KL: (p - tgt) / rows at the valid slots
    valid = x["topk"].cpu() <= torch.arange(x["sq"]).view(1, -1, 1)
    want = torch.where(valid, (p - tgt) / (x["b"] * x["sq"]), torch.zeros_like(p))
    assert rel_err(zl.grad, want) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_deterministic_mode_is_bitwise():
    """deterministic=True: dkv and the indexer's d k bitwise identical run to run on the GPU."""
    x = inputs(seeded("deterministic"), "cuda", sq=64, b=2, topk=16)
    runs = []
    for _ in range(2):
        q, kv, iq, w, ik = leaves(x["q"], x["kv"], x["iq"], x["w"], x["ik"])
        out, lse = M.dsa_fn(q, kv, None, x["topk"], x["scale"], deterministic=True, return_lse=True)
        z = M.index_slot_scores(iq, w, ik, x["topk"], deterministic=True)
        loss = M.sparse_indexer_loss(z, x["topk"], q, kv, x["scale"], 1.0, lse=lse)
        (out.float().mul(x["dout"].float()).sum() + loss).backward()
        runs.append((out, loss, q.grad, kv.grad, iq.grad, w.grad, ik.grad))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# ---- bad input ----------------------------------------------------------------------------------
def test_bad_input_raises_clear_errors():
    x = inputs(seeded("bad_input"), "cpu", b=2)
    q, kv, topk, scale, np_ = x["q"], x["kv"], x["topk"], x["scale"], x["np"]
    key, value = megatron_kv(kv, np_)
    bad = lambda what: pytest.raises(libdsa.DSAInvalidArgument, match=what)
    per_head = key.clone()
    per_head[:, :, 1, :128] += 1                                   # Megatron's per-head k_nope
    with bad("differs across heads"):
        M.dsa_fn(q, per_head, per_head[..., :512], topk, scale)
    with bad("576"):                                               # MLASelfAttention's 192-wide heads
        M.dsa_fn(q[..., :192].contiguous(), key[..., :192].contiguous(), value[..., :128].contiguous(), topk, scale)
    with bad("value must equal key"):
        M.dsa_fn(q, key, value + 1, topk, scale)
    with bad("value must be"):
        M.dsa_fn(q, key, value[..., :128], topk, scale)
    with bad("key must be"):
        M.dsa_fn(q, kv[:, :1], None, topk, scale)
    with bad("bfloat16"):
        M.dsa_fn(q.float(), key, value, topk, scale)
    with bad("integer"):
        M.dsa_fn(q, key, value, topk.float(), scale)
    with bad("topk_indices must be"):
        M.dsa_fn(q, key, value, topk[:1], scale)
    with bad("softmax_scale"):
        M.dsa_fn(q, key, value, topk, -1.0)
    with bad("index head dim must be 128"):
        M.index_topk(x["iq"][..., :64], x["w"], x["ik"][..., :64], 4)
    with bad("weights must be"):
        M.index_topk(x["iq"], x["w"][:, :1], x["ik"], 4)
    with bad("slot_scores must be torch.float32"):
        M.sparse_indexer_loss(torch.zeros(topk.shape, dtype=torch.bfloat16), topk, q, kv, scale, 1.0)
    with pytest.raises(libdsa.DSAUnsupported, match="sparse_loss=False"):
        M.compute_dsa_indexer_loss(torch.zeros(2, x["sq"], x["sq"]), topk, q, key, scale, 1.0, False, _TP1())
    with pytest.raises(libdsa.DSAUnsupported, match="tensor parallelism"):
        M.sparse_indexer_loss(torch.zeros(topk.shape), topk, q, kv, scale, 1.0, pg_collection=_TP2())
    # check_layout=False trusts the caller (head 0 of key is the latent)
    M.dsa_fn(q, per_head, per_head[..., :512], topk, scale, check_layout=False)


# ---- a DSAttention built from Megatron's spec ---------------------------------------------------
@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-rank gloo group for the indexer's tp / cp groups."""
    import torch.distributed as dist
    own = not dist.is_initialized()
    if own:
        path = tmp_path_factory.mktemp("pg") / "init"
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD
    if own:
        dist.destroy_process_group()


def layer_config():
    """A small GLM-like MLA + DSA config (Megatron's MLATransformerConfig). 32 index heads make an
    exact tie of index scores at 0 (every head's ReLU at 0) improbable: ties are the one place
    where torch.topk and libdsa may select different keys."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    return MLATransformerConfig(
        num_layers=1, hidden_size=256, num_attention_heads=4, q_lora_rank=128, kv_lora_rank=512,
        qk_head_dim=64, qk_pos_emb_head_dim=64, v_head_dim=64, multi_latent_attention=True,
        experimental_attention_variant="dsa", dsa_indexer_n_heads=32, dsa_indexer_head_dim=128,
        dsa_indexer_topk=8, dsa_indexer_loss_coeff=0.5, dsa_indexer_use_sparse_loss=True,
        params_dtype=torch.bfloat16, bf16=True, rope_type="rope", normalization="RMSNorm",
        add_bias_linear=False)


@pytest.mark.parametrize("device", DEVICES)
def test_dsattention_from_megatrons_spec(device, process_group, monkeypatch):
    """Megatron's DSAttention and the same module with libdsa's classes (libdsa_dsa_spec), the same
    weights and inputs, training: output, indexer loss, and the gradients of q, the kv latent and
    every indexer parameter (through the loss Megatron's DSAIndexerLossAutoScaler attaches)."""
    from megatron.core.transformer.enums import AttnMaskType
    if device == "cpu":
        # Megatron's RoPE module places its frequencies on torch.cuda.current_device()
        monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    if dsa.hadamard_transform is None:
        # fast_hadamard_transform is not installed: Megatron's rotation takes libdsa's torch transform
        monkeypatch.setattr(dsa, "hadamard_transform", M.hadamard_transform)
    monkeypatch.setattr(dsa.DSAIndexerLossLoggingHelper, "tracker", {})
    monkeypatch.setattr(dsa.DSAIndexerLossAutoScaler, "main_loss_backward_scale", None)
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_dsa_module_spec_for_backend
    from megatron.core.process_groups_config import ProcessGroupCollection
    pg = ProcessGroupCollection()
    pg.tp, pg.cp = process_group, process_group
    cfg = layer_config()
    torch.manual_seed(1)
    ref_mod = M.build_dsattention(cfg, pg, use_libdsa=False).to(device)
    lib_mod = M.build_dsattention(cfg, pg).to(device)
    assert type(ref_mod) is dsa.DSAttention and type(ref_mod.indexer) is dsa.DSAIndexer
    assert type(lib_mod) is M.LibdsaDSAttention and type(lib_mod.indexer) is M.LibdsaDSAIndexer
    spec = get_dsa_module_spec_for_backend(cfg, M.torch_backend())
    swapped = M.libdsa_dsa_spec(spec)
    assert swapped.submodules.core_attention.submodules.indexer.module is M.LibdsaDSAIndexer
    assert spec.submodules.core_attention.module is dsa.DSAttention, "the input spec is left as it was"
    lib_mod.load_state_dict(ref_mod.state_dict())
    g = seeded("dsattention")
    sq, b, np_ = 24, 2, 4
    x = rnd(g, sq, b, 256).to(device)
    qr = rnd(g, sq, b, 128).to(device)
    q0, kv0, dout = rnd(g, sq, b, np_, 576, scale=0.5), rnd(g, sq, b, 1, 576, scale=0.5), rnd(g, sq, b, np_ * 512)
    results = []
    for mod in (ref_mod, lib_mod):
        mod.train()
        dsa.DSAIndexerLossLoggingHelper.clean_loss_in_tracker()
        q, kv = leaves(q0.to(device), kv0.to(device))
        key, value = megatron_kv(kv, np_)
        out = mod(q, key, value, None, x, qr, attn_mask_type=AttnMaskType.causal)
        loss = dsa.DSAIndexerLossLoggingHelper.tracker["values"][0].clone()
        out.backward(dout.to(device))
        results.append((out, loss, q.grad, kv.grad, {n: p.grad for n, p in mod.named_parameters()}))
    (ref_out, ref_loss, ref_dq, ref_dkv, ref_grads), (out, loss, dq, dkv, grads) = results
    assert rel_err(out, ref_out) < 1e-2
    assert abs(float(loss) - float(ref_loss)) < 1e-4 * abs(float(ref_loss))
    assert rel_err(dq, ref_dq) < 2e-2 and rel_err(dkv, ref_dkv) < 2e-2
    assert set(grads) == set(ref_grads) and len(grads) == 5
    for name in grads:
        assert grads[name] is not None, name
        assert rel_err(grads[name], ref_grads[name]) < 2e-2, name
    # evaluation: no loss, and the same output
    lib_mod.eval()
    ref_mod.eval()
    with torch.no_grad():
        key, value = megatron_kv(kv0.to(device), np_)
        a = lib_mod(q0.to(device), key, value, None, x, qr, attn_mask_type=AttnMaskType.causal)
        r = ref_mod(q0.to(device), key, value, None, x, qr, attn_mask_type=AttnMaskType.causal)
    assert rel_err(a, r) < 1e-2
    with pytest.raises(libdsa.DSAUnsupported, match="causal"):
        lib_mod(q0.to(device), key, value, None, x, qr, attn_mask_type=None)
