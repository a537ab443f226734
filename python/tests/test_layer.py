"""The package against plain-torch float64 formulas: a small GLM-like DSA layer (packed documents, a
context-parallel slice, H = 64 and 16, indexer then attention), forward and backward; gradients;
torch.compile and CUDA graph capture; bad arguments. Every test runs on the CPU (libdsa's CPU
reference behind the same ops) and, where a CUDA device exists, on the GPU; GPU tests skip cleanly
without one."""
import os
import time

import pytest
import torch

import libdsa
import reference as ref

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
gpu_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def seeded(name):
    seed = int(os.environ.get("DSA_TEST_SEED", time.time_ns() % 2**31))
    print(f"{name}: seed {seed} (replay with DSA_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


def bf16(g, *shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(torch.bfloat16)


def rel_err(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert not torch.isnan(a).any(), "NaN in libdsa's result"
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def layer_inputs(g, H, docs=(13, 9, 18), cp=None, K=16, D=576, H_idx=4):
    """Packed documents (real lengths `docs`); cp = (query_start, num_queries) for a CP slice."""
    cu = torch.tensor([0] + list(torch.tensor(docs).cumsum(0)), dtype=torch.int32)
    Tk = int(cu[-1])
    Tq = Tk if cp is None else cp[1]
    return dict(cu=cu, Tk=Tk, Tq=Tq, cp=cp, K=K, H=H, D=D, H_idx=H_idx,
                index_q=bf16(g, Tq, H_idx, 128), index_k=bf16(g, Tk, 128),
                weights=(torch.rand(Tq, H_idx, generator=g) - 0.5) * (H_idx * 128) ** -0.5,
                q=bf16(g, Tq, H, D), kv=bf16(g, Tk, D), dout=bf16(g, Tq, H, 512),
                sink=torch.rand(H, generator=g) * 2 - 1)


def run_layer(x, device, with_sink, deterministic=False):
    """plan -> indexer_topk -> sparse_attention -> backward through the package on `device`."""
    kw = {} if x["cp"] is None else dict(query_start=x["cp"][0], num_queries=x["cp"][1])
    plan = libdsa.plan(x["cu"], x["Tk"], device=device, **kw)
    dev = lambda t: t.to(device)
    idx, lengths = libdsa.indexer_topk(dev(x["index_q"]), dev(x["index_k"]), dev(x["weights"]), plan, x["K"])
    leaf = lambda t: t.to(device).detach().clone().requires_grad_()  # never x's own tensors
    q, kv = leaf(x["q"]), leaf(x["kv"])
    sink = leaf(x["sink"]) if with_sink else None
    out, lse = libdsa.sparse_attention(q, kv, idx, x["D"] ** -0.5, topk_length=lengths, attn_sink=sink,
                                       deterministic=deterministic, return_lse=True)
    out.backward(dev(x["dout"]))
    return plan, idx, lengths, out, lse, q.grad, kv.grad, (sink.grad if with_sink else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("H,cp,with_sink", [(64, None, False), (16, None, True), (16, (22, 18), False),
                                            (64, (30, 10), True)])
def test_layer_matches_float64_formulas(device, H, cp, with_sink):
    x = layer_inputs(seeded("layer"), H, cp=cp)
    plan, idx, lengths, out, lse, dq, dkv, dsink = run_layer(x, device, with_sink)
    # the indexer against the float64 formula, through the plan's own starts / lengths
    starts, causal = plan.starts.cpu(), plan.causal_lengths.cpu()
    want_idx, want_len = ref.indexer_topk(x["index_q"], x["index_k"], x["weights"], starts, causal, x["K"])
    assert torch.equal(lengths.cpu(), want_len)
    assert (idx.cpu() == want_idx).float().mean() > 0.99  # bf16 ties may swap a rare slot
    # attention forward and backward against the float64 formula on libdsa's own indices
    scale, sink = x["D"] ** -0.5, (x["sink"] if with_sink else None)
    want_out, want_lse = ref.attention(x["q"].double(), x["kv"].double(), idx.cpu(), scale, lengths.cpu(),
                                       None if sink is None else sink.double())
    assert rel_err(out, want_out) < 1e-2
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert float((lse.cpu().double() - want_lse)[finite].abs().max()) < 1e-3
    # the backward's formulas take the forward output as given (libdsa's bf16 out)
    want_dq, want_dkv, want_dsink = ref.attention_backward(x["q"], x["kv"], idx.cpu(), scale, out.cpu(),
                                                           x["dout"], lengths.cpu(), sink)
    assert rel_err(dq, want_dq) < 1e-2
    assert rel_err(dkv, want_dkv) < 1e-2
    if with_sink:
        assert rel_err(dsink, want_dsink) < 1e-2


@gpu_only
def test_gpu_matches_cpu_reference_and_deterministic_is_bitwise():
    x = layer_inputs(seeded("gpu_vs_cpu"), 64, cp=(20, 20))
    cpu = run_layer(x, "cpu", True)
    gpu = run_layer(x, "cuda", True, deterministic=True)
    again = run_layer(x, "cuda", True, deterministic=True)
    assert torch.equal(gpu[1].cpu(), cpu[1]) and torch.equal(gpu[2].cpu(), cpu[2])
    for a, b in zip(gpu[3:], cpu[3:]):
        if b is not None and b.dtype != torch.float32:
            assert rel_err(a, b) < 1e-2
    for a, b in zip(gpu[3:], again[3:]):
        if a is not None:
            assert torch.equal(a, b), "deterministic mode differs between runs"


@pytest.mark.parametrize("device", DEVICES)
def test_edge_slots(device):
    """Duplicates, -1 and out-of-range slots, an empty row, topk_length 0 and K, sinks of +-inf."""
    g = seeded("edge_slots")
    T, H, D, Tkv, K = 4, 3, 576, 7, 5
    q, kv, dout = bf16(g, T, H, D), bf16(g, Tkv, D), bf16(g, T, H, 512)
    idx = torch.tensor([[0, 0, 3, -1, 99], [-1, -1, -1, -1, -1], [6, 5, 4, 3, 2], [1, 2, 1, 2, 1]], dtype=torch.int32)
    tl = torch.tensor([5, 5, 0, 3], dtype=torch.int32)
    sink = torch.tensor([float("inf"), float("-inf"), 0.25])
    qd, kvd = q.to(device).clone().requires_grad_(), kv.to(device).clone().requires_grad_()
    out, lse = libdsa.sparse_attention(qd, kvd, idx.to(device), 0.1, topk_length=tl.to(device),
                                       attn_sink=sink.to(device), return_lse=True)
    out.backward(dout.to(device))
    want, want_lse = ref.attention(q.double(), kv.double(), idx, 0.1, tl, sink.double())
    assert rel_err(out, want) < 1e-2
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(want_lse))
    assert bool((out[1] == 0).all()) and bool((out[2] == 0).all()), "empty rows give out = 0"
    want_dq, want_dkv, _ = ref.attention_backward(q, kv, idx, 0.1, out.detach().cpu(), dout, tl, sink)
    assert rel_err(qd.grad, want_dq) < 1e-2 and rel_err(kvd.grad, want_dkv) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_against_finite_differences(device):
    """A gradcheck-style check on a tiny case, in two steps: the backward formulas of the reference
    against central differences of its float64 forward (directional derivative of sum(out * w)
    along a random direction: the formulas are right), then libdsa's gradients against those
    formulas evaluated with libdsa's own bf16 out (as its backward takes it)."""
    g = seeded("finite_differences")
    T, H, D, Tkv, K = 2, 2, 576, 5, 4
    q, kv, w = bf16(g, T, H, D), bf16(g, Tkv, D), bf16(g, T, H, 512)
    idx = torch.tensor([[0, 2, 4, -1], [1, 3, 3, 0]], dtype=torch.int32)
    dirq = torch.randn(T, H, D, generator=g, dtype=torch.float64)
    dirk = torch.randn(Tkv, D, generator=g, dtype=torch.float64)
    f = lambda a, b: float((ref.attention(a, b, idx, 0.05)[0] * w.double()).sum())
    h = 1e-5
    fd = (f(q.double() + h * dirq, kv.double() + h * dirk) - f(q.double() - h * dirq, kv.double() - h * dirk)) / (2 * h)
    out64 = ref.attention(q.double(), kv.double(), idx, 0.05)[0]
    rq, rk, _ = ref.attention_backward(q, kv, idx, 0.05, out64, w.double())
    an = float((rq * dirq).sum() + (rk * dirk).sum())
    assert abs(fd - an) < 1e-6 * (1 + abs(fd)), (fd, an)
    qd, kvd = q.to(device).clone().requires_grad_(), kv.to(device).clone().requires_grad_()
    out = libdsa.sparse_attention(qd, kvd, idx.to(device), 0.05)
    out.backward(w.to(device))
    want_dq, want_dkv, _ = ref.attention_backward(q, kv, idx, 0.05, out.detach().cpu(), w)
    assert rel_err(qd.grad, want_dq) < 1e-2 and rel_err(kvd.grad, want_dkv) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_and_fake_tensors(device):
    x = layer_inputs(seeded("compile"), 16)
    idx = torch.randint(-1, x["Tk"], (x["Tq"], x["K"]), generator=seeded("compile idx"), dtype=torch.int32)
    q, kv = x["q"].to(device), x["kv"].to(device)

    def f(q, kv, idx):
        return libdsa.sparse_attention(q, kv, idx, 0.04).float().square().sum()

    eager = f(q, kv, idx.to(device))
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, kv, idx.to(device))
    assert torch.equal(eager, compiled)
    torch.library.opcheck(torch.ops.libdsa.sparse_attn_fwd, (q, kv, idx.to(device), None, None, 0.04, False),
                          test_utils=("test_schema", "test_faketensor"))


@gpu_only
def test_cuda_graph_capture():
    x = layer_inputs(seeded("graph"), 64)
    idx = torch.randint(0, x["Tk"], (x["Tq"], x["K"]), generator=seeded("graph idx"), dtype=torch.int32).cuda()
    q, kv = x["q"].cuda(), x["kv"].cuda()
    eager = libdsa.sparse_attention(q, kv, idx, 0.04)  # warm-up: the context exists before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = libdsa.sparse_attention(q, kv, idx, 0.04)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_bad_arguments_raise_with_the_library_message():
    g = seeded("bad_arguments")
    q, kv = bf16(g, 2, 2, 576), bf16(g, 3, 576)
    idx = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="indices must be torch.int32"):
        libdsa.sparse_attention(q, kv, idx.long(), 0.1)
    with pytest.raises(libdsa.DSAInvalidArgument, match="softmax_scale"):
        libdsa.sparse_attention(q, kv, idx, 0.0)
    with pytest.raises(libdsa.DSAInvalidArgument, match="head_dim"):
        libdsa.sparse_attention(bf16(g, 2, 2, 100), bf16(g, 3, 100), idx, 0.1)
    with pytest.raises(libdsa.DSAInvalidArgument, match="topk"):
        libdsa.topk(torch.rand(2, 10), 0)
    with pytest.raises(libdsa.DSAInvalidArgument):
        libdsa.plan(torch.tensor([0, 5, 3], dtype=torch.int32), 8)  # decreasing cu_seqlens
    with pytest.raises(ValueError, match="contiguous"):
        libdsa.plan(torch.tensor([0, 8], dtype=torch.int32), 8, query_indices=torch.tensor([1, 3]))


def test_operand_shapes_are_checked():
    """The C API sees pointers and strides: every operand whose extent the op reads past q's, the
    plan's or the scores' sizes is checked here, with a message naming it, before any call."""
    g = seeded("operand_shapes")
    T, H, Tk, K = 4, 2, 6, 3
    q, kv = bf16(g, T, H, 576), bf16(g, Tk, 576)
    idx = torch.zeros(T, K, dtype=torch.int32)
    tl, sink = torch.full((T,), K, dtype=torch.int32), torch.zeros(H)
    bad = lambda what: pytest.raises(libdsa.DSAInvalidArgument, match=what)
    with bad("attn_sink|sink must be"):
        libdsa.sparse_attention(q, kv, idx, 0.1, attn_sink=torch.zeros(1))
    with bad("topk_length must be"):
        libdsa.sparse_attention(q, kv, idx, 0.1, topk_length=tl[:3])
    with bad("head dim"):
        libdsa.sparse_attention(q, bf16(g, Tk, 512), idx, 0.1)
    out, lse = libdsa.sparse_attention(q, kv, idx, 0.1, topk_length=tl, attn_sink=sink, return_lse=True)
    with bad("dout must be"):
        libdsa.sparse_attention_backward(q, kv, idx, 0.1, out, out[:, :1], lse)
    with bad("lse must be"):
        libdsa.sparse_attention_backward(q, kv, idx, 0.1, out, out, lse[:2])
    with bad("lse must be"):
        libdsa.slot_target(q, kv, idx, lse[:, :1], 0.1)
    with bad("lengths must be"):
        libdsa.topk(torch.rand(8, 10), 2, torch.full((2,), 10, dtype=torch.int32))
    with bad("sink must be"):
        libdsa.pad_heads(q, torch.zeros(H + 1), 64)
    iq, ik, w = bf16(g, T, H, 128), bf16(g, Tk, 128), torch.rand(T, H)
    with bad("weights must be"):
        libdsa.indexer_slot_scores(iq, ik, w[:3], idx)
    with bad("index_k must be"):
        libdsa.indexer_slot_scores(iq, bf16(g, Tk, 64), w, idx)
    with bad("lengths must be"):
        libdsa.indexer_slot_scores(iq, ik, w, idx, torch.zeros(T + 1, dtype=torch.int32))
    plan = libdsa.plan(torch.tensor([0, T], dtype=torch.int32), T)
    with bad("weights must be"):
        libdsa.indexer_topk(iq, bf16(g, T, 128), torch.rand(3, H), plan, 2)
    with bad("index_k"):
        libdsa.indexer_topk(iq, bf16(g, T - 1, 128), w, plan, 2)
    with bad("index_q"):
        libdsa.indexer_topk(bf16(g, T + 1, H, 128), bf16(g, T, 128), torch.rand(T + 1, H), plan, 2)
    z = torch.rand(T, K)
    with bad("target must be"):
        torch.ops.libdsa.indexer_loss(z[:, :2], z, idx, None, Tk, 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_compact_and_pad_heads(device):
    g = seeded("helpers")
    s = torch.rand(3, 50, generator=g)
    lengths = torch.tensor([50, 7, 0], dtype=torch.int32)
    got = libdsa.topk(s.to(device), 8, lengths.to(device)).cpu()
    for r in range(3):
        L = int(lengths[r])
        want = sorted(sorted(range(L), key=lambda c: (-float(s[r, c]), c))[:8])
        assert got[r, :len(want)].tolist() == want and (got[r, len(want):] == -1).all()
    idx = torch.tensor([[5, -1, 2, 9, 2], [7, 7, 0, 1, 3]], dtype=torch.int32)
    out, n = libdsa.compact_indices(idx.to(device), 8)
    assert out.cpu().tolist() == [[2, 2, 5, -1, -1], [0, 1, 3, 7, 7]] and n.cpu().tolist() == [3, 5]
    q, sink = bf16(g, 2, 3, 576), torch.tensor([0.5, -1.0, 2.0])
    qp, sp = libdsa.pad_heads(q.to(device), sink.to(device), 64)
    assert torch.equal(qp[:, :3].cpu(), q) and bool((qp[:, 3:] == 0).all())
    assert torch.equal(sp[:3].cpu(), sink) and bool(torch.isneginf(sp[3:]).all())
    assert libdsa.padded_head_count(16) == 64 and libdsa.padded_head_count(128) == 128


def test_options_are_checked():
    with pytest.raises(libdsa.DSAInvalidArgument, match="unknown option"):
        libdsa.set_option("no_such_option", 1)
    lib = libdsa.library()
    import ctypes
    # the option's value is checked before the context (so no device is needed for this)
    assert lib.so.dsa_context_set_option(None, libdsa._capi.OPTIONS["fwd_kernel"], 99) == 1
    assert "fwd" in lib.so.dsa_last_error_message().decode().lower()


def test_option_table_matches_the_header():
    """_capi.OPTIONS names every dsa_option of include/dsa_tune.h (DSA_OPTION_X = N -> "x": N); skipped
    where the package is installed without the checkout's headers"""
    import re
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "dsa_tune.h")
    if not os.path.exists(header):
        pytest.skip("no include/dsa_tune.h beside the package")
    ids = {m.group(1).lower(): int(m.group(2))
           for m in re.finditer(r"^\s*DSA_OPTION_([A-Z0-9_]+)\s*=\s*(\d+)", open(header).read(), re.M)}
    assert ids and libdsa._capi.OPTIONS == ids


@gpu_only
def test_options_on_the_device_context():
    libdsa.set_option("bwd_kernel", 1)
    assert libdsa.get_option("bwd_kernel") == 1
    libdsa.set_option("bwd_kernel", 0)
