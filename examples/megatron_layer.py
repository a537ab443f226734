"""megatron_layer.py - a Megatron-Core DSA layer on libdsa, checked against Megatron's own.

    python3 examples/megatron_layer.py                    # a GPU when there is one, else a small CPU case
    python3 examples/megatron_layer.py --seq 4096 --batch 1 --heads 64 --topk 2048 --time

Needs megatron-core 0.16.1 (pip install --no-deps megatron-core==0.16.1; it needs torch, numpy,
packaging). The layer is the core attention of Megatron's DSA spec, get_dsa_module_spec_for_backend:
DSAttention with its DSAIndexer (projections, RoPE, Hadamard rotation, top-k, the KL indexer loss).
It is built twice, with the same weights: as Megatron builds it (the unfused reference: dense
[b, np, sq, sk] scores) and with libdsa's classes put into the same spec by
libdsa.megatron.libdsa_dsa_spec (LibdsaDSAttention, LibdsaDSAIndexer). Both take the attention
inputs in the absorbed MLA layout libdsa's kernel runs: q [sq, b, np, 576] = [q_nope W_UK | q_pe],
the latent kv [sq, b, 1, 576] = [c_kv | k_pe] (Megatron's reference gets it expanded to every head)
and value = its first 512 dims. One training step each (forward with the indexer loss attached by
Megatron's DSAIndexerLossAutoScaler, backward from the same output gradient); the output, the loss
and the gradients of q, kv and every indexer parameter are compared (max |a - b| / max |b|), then
the verdict: PASS, or FAIL with the fields over their tolerance (exit 1). --time adds the median
step time of each on the GPU (bench/megatron_peer.py writes those as bench rows).

Without a GPU the CPU case runs libdsa's CPU reference; Megatron's RoPE places its tables on
torch.cuda.current_device(), which this example points at the CPU there. Without
fast_hadamard_transform (a CUDA extension) Megatron's rotation takes libdsa.megatron.hadamard_transform,
the same transform in torch, as LibdsaDSAIndexer does.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist

from libdsa import megatron as M

# (max relative difference) per compared field: Megatron's unfused attention rounds its
# probabilities to bf16 and runs its backward in bf16 matmuls; python/tests/test_megatron.py states why
TOLERANCE = {"out": 1e-2, "loss": 1e-4, "dq": 2e-2, "dkv": 2e-2, "indexer grads": 2e-2}


def make_config(args):
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    return MLATransformerConfig(
        num_layers=1, hidden_size=args.hidden, num_attention_heads=args.heads, q_lora_rank=args.q_lora,
        kv_lora_rank=512, qk_head_dim=args.qk_head_dim, qk_pos_emb_head_dim=64, v_head_dim=args.qk_head_dim,
        multi_latent_attention=True, experimental_attention_variant="dsa",
        dsa_indexer_n_heads=args.index_heads, dsa_indexer_head_dim=128, dsa_indexer_topk=args.topk,
        dsa_indexer_loss_coeff=0.01, dsa_indexer_use_sparse_loss=True, params_dtype=torch.bfloat16,
        bf16=True, rope_type="rope", normalization="RMSNorm", add_bias_linear=False)


def process_groups():
    """One-rank tensor- and context-parallel groups (gloo), which Megatron's DSAIndexer asks for."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    if not dist.is_initialized():
        path = os.path.join(tempfile.mkdtemp(prefix="megatron_layer_"), "pg")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    pg = ProcessGroupCollection()
    pg.tp = pg.cp = dist.group.WORLD
    return pg


def make_inputs(args, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16).to(device)
    sq, b, np_ = args.seq, args.batch, args.heads
    return dict(q=r(sq, b, np_, 576, scale=0.5), kv=r(sq, b, 1, 576, scale=0.5), x=r(sq, b, args.hidden),
                qr=r(sq, b, args.q_lora), dout=r(sq, b, np_ * 512))


def step(module, inp, backward=True):
    """One training step: (output, indexer loss, dq, dkv, {parameter: grad})."""
    from megatron.core.transformer.experimental_attention_variant import dsa
    from megatron.core.transformer.enums import AttnMaskType
    module.train()
    dsa.DSAIndexerLossLoggingHelper.clean_loss_in_tracker()
    for p in module.parameters():
        p.grad = None
    q = inp["q"].detach().requires_grad_()
    kv = inp["kv"].detach().requires_grad_()
    np_ = q.shape[2]
    key, value = kv.expand(-1, -1, np_, -1), kv[..., :512].expand(-1, -1, np_, -1)
    out = module(q, key, value, None, inp["x"], inp["qr"], attn_mask_type=AttnMaskType.causal)
    loss = dsa.DSAIndexerLossLoggingHelper.tracker["values"][0].clone()
    if backward:
        out.backward(inp["dout"])
    return out, loss, q.grad, kv.grad, {n: p.grad for n, p in module.named_parameters()}


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def compare(mine, ref):
    """{field: max relative difference} of libdsa's step against Megatron's."""
    diffs = {"out": rel(mine[0], ref[0]), "loss": rel(mine[1], ref[1]), "dq": rel(mine[2], ref[2]),
             "dkv": rel(mine[3], ref[3])}
    diffs["indexer grads"] = max(rel(mine[4][n], ref[4][n]) for n in ref[4])
    return diffs


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def run_case(args, device):
    """Builds both layers, compares one step, and with args.time times them: a dict of results."""
    from megatron.core.transformer.experimental_attention_variant import dsa
    if dsa.hadamard_transform is None:
        dsa.hadamard_transform = M.hadamard_transform
    cfg, pg = make_config(args), process_groups()
    torch.manual_seed(args.seed)
    ref_mod = M.build_dsattention(cfg, pg, use_libdsa=False).to(device)
    lib_mod = M.build_dsattention(cfg, pg).to(device)
    lib_mod.load_state_dict(ref_mod.state_dict())
    inp = make_inputs(args, device, args.seed)
    res = {"diffs": compare(step(lib_mod, inp), step(ref_mod, inp))}
    if args.time and device.type == "cuda":
        for name, mod in (("libdsa", lib_mod), ("megatron", ref_mod)):
            for _ in range(2):
                step(mod, inp)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            res[name + "_fwd_ms"] = median_ms(lambda: step(mod, inp, backward=False), args.reps)
            res[name + "_step_ms"] = median_ms(lambda: step(mod, inp), args.reps)
            res[name + "_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return res


def parse(argv=None):
    gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if gpu else "cpu")
    ap.add_argument("--seq", type=int, default=1024 if gpu else 32, help="sq = sk")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=64 if gpu else 4, help="attention heads np")
    ap.add_argument("--index-heads", type=int, default=32)
    ap.add_argument("--topk", type=int, default=256 if gpu else 8)
    ap.add_argument("--hidden", type=int, default=2048 if gpu else 256)
    ap.add_argument("--q-lora", type=int, default=1024 if gpu else 128)
    ap.add_argument("--qk-head-dim", type=int, default=192 if gpu else 64,
                    help="qk_head_dim (= v_head_dim): only the default softmax scale depends on it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time", action="store_true", help="median step times on the GPU")
    ap.add_argument("--reps", type=int, default=10)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.cuda.current_device = lambda: "cpu"  # Megatron's RoPE tables (see the top of this file)
    res = run_case(args, device)
    print(f"DSAttention from Megatron's spec, sq = sk = {args.seq}, b = {args.batch}, np = {args.heads}, "
          f"index heads {args.index_heads}, topk {args.topk}, on {device}")
    for field, d in res["diffs"].items():
        print(f"  {field:14s} max rel diff {d:.3g} (tolerance {TOLERANCE[field]:g})")
    if "libdsa_step_ms" in res:
        for what in ("fwd", "step"):
            lib, ref = res[f"libdsa_{what}_ms"], res[f"megatron_{what}_ms"]
            print(f"  {what:5s} libdsa {lib:8.2f} ms, Megatron unfused {ref:8.2f} ms ({ref / lib:.1f}x)")
        print(f"  peak memory: libdsa {res['libdsa_peak_mib']:.0f} MiB, Megatron {res['megatron_peak_mib']:.0f} MiB")
    bad = [f for f, d in res["diffs"].items() if not d <= TOLERANCE[f]]
    print("PASS" if not bad else "FAIL: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
