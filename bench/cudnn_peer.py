#!/usr/bin/env python3
"""cudnn_peer.py - libdsa and cuDNN Frontend (and torch.topk) in ONE process on the SAME inputs.

A ratio is only a same-run ratio. This program loads build/libdsa.so with ctypes
(python/libdsa/_capi.py) and times libdsa and its peers on the same torch CUDA tensors:

  sparse bwd    libdsa dsa_sparse_attn_bwd det0 / det1  vs  cuDNN FE SparseAttentionBackward (SM90),
                GLM shapes on two index distributions: uniform causal subsets (rows det0 / det1)
                and the indices dsa_indexer_topk chooses (rows det0,indexer / det1,indexer);
                bwd-tp-h16 also against cuDNN on q padded to 64 heads (zero heads, -inf sinks)
  indexer+topk  libdsa dsa_indexer_topk (engine DEFAULT)  vs  cuDNN indexer_forward_wrapper + IndexerTopK
  topk          libdsa dsa_topk  vs  cuDNN IndexerTopK (deterministic False and True; causal lengths)
                and vs torch.topk (full rows)
  indexer train (opt-in: --shapes all, or --shapes train-glm-4k,..., as bench/full_run.sh's train step runs them;
                not in the default run, see below) on the idx-glm-4k / idx-glm-cp8 / idx-32k shapes, indices from
                dsa_indexer_topk (H_idx = 32, bf16 weights), attention q [T, 64, 576] / kv random:
    slot target libdsa dsa_attn_slot_target  vs  cuDNN sparse_attn_score_recompute_wrapper (SM90;
                cuDNN's target is L1-normalised: compared after dividing libdsa's a by its row sum)
    indexer bwd libdsa dsa_indexer_bwd det0 / det1 at H_idx = 32  vs  cuDNN indexer_backward_wrapper
                on index_q / weights padded with zero heads 32 -> 64 (its SM90 kernel asserts
                heads >= 64), fed libdsa's normalised target and softmax(z) so that its score
                gradient equals libdsa's g from dsa_indexer_loss; padded heads' outputs dropped
                (DSA_TRAIN_KERNEL=N in the environment sets libdsa's DSA_OPTION_TRAIN_KERNEL: 1 forces
                the CUDA-core kernels, 2 the sm_90a ones; the default on an H200 runs the sm_90a ones,
                in det1 with the deterministic d_index_k from slot rows)

Timing, the same for every implementation: one warm-up call (for cuDNN it compiles: its host time,
synchronised, is "peer_compile_s"), one untimed probe call (its host time sizes the spin), then
per rep: write an L2 flush buffer (2 x L2), queue a GPU spin (torch.cuda._sleep, >= 1 ms) so the
host work of the call happens while the GPU is busy, record an event, call, record an event.
Each implementation runs its own loop of reps (alternating them rep by rep biases the result).
Median of --reps. Ceilings in the same process: bf16 GEMM 8192^3 (torch.matmul) and a 1 GiB
device-to-device copy (read + write bytes).

The train-* shapes are opt-in because their cuDNN kernels compile on first use (estimate: 2-3
minutes for the three shapes, most of it compiling): `--shapes all` runs every shape, the train-*
ones after the rest; bench/full_run.sh runs them in a step and a process of their own.

Rows follow dsa_bench's JSON schema plus: process, peer_same_run, peer_compile_s,
peer_max_rel_diff / peer_agreement, peer_workspace_bytes, workspace_bytes, peer_status,
first_call_s, host_ms, peer_host_ms, spin_ms. The file is rewritten after every row.

  python3 bench/cudnn_peer.py [--lib build/libdsa.so] [--out FILE] [--shapes a,b] [--reps N]
                              [--quick] [--skip-check] [--list] [--self-test]
  python3 bench/cudnn_peer.py --cpu-dry-run [--fe-src WHEEL_OR_DIR]

--cpu-dry-run runs the train-* section on tiny sizes on the CPU, without a GPU or cuDNN: every libdsa
call goes to its dsa_ref_* CPU reference (same params structs, host pointers), cuDNN's two calls to
a torch model of the SM90 kernels' math as read in the FE 1.32 sources, whose argument lists are
bound against the real signatures parsed from the FE wheel (~/.cache/dsa-peers/cudnn/*.whl or
--fe-src); it fails unless every row is ok and every comparison is within 3e-2.
"""
import argparse
import ctypes as C
import datetime
import gc
import glob
import inspect
import json
import math
import os
import subprocess
import sys
import time
import traceback
import zipfile

# The ctypes binding of dsa.h lives in the Python package; loaded by path, so that the package's torch
# ops are not imported (--self-test runs without torch).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "libdsa"))
import _capi as D  # noqa: E402

# name, op, sizes. GLM bwd / idx shapes with more keys than queries are the last context-parallel
# rank: query row t is global position g = keys - T + t and sees keys 0..g.
SHAPES = [
    dict(name="bwd-glm-4k", op="bwd", T=4096, H=64, K=2048, S=4096, v32=False),
    dict(name="bwd-glm-16k", op="bwd", T=4096, H=64, K=2048, S=16384, v32=False),
    dict(name="bwd-glm-32k", op="bwd", T=4096, H=64, K=2048, S=32768, v32=False),
    dict(name="bwd-tp-h16", op="bwd", T=4096, H=16, K=2048, S=32768, v32=False),
    dict(name="bwd-v32-8k", op="bwd", T=4096, H=128, K=2048, S=8192, v32=True),
    dict(name="idx-glm-4k", op="idx", T=4096, H=32, K=2048, S=4096),
    dict(name="idx-glm-cp8", op="idx", T=4096, H=32, K=2048, S=32768),
    dict(name="idx-32k", op="idx", T=32768, H=32, K=2048, S=32768),
    dict(name="idx-32k-h64", op="idx", T=32768, H=64, K=2048, S=32768),
    dict(name="topk-32k", op="topk", T=4096, K=2048, S=32768),
    dict(name="topk-128k", op="topk", T=4096, K=2048, S=131072),
    # opt-in (not in the default run): the idx shapes' indexer (H_idx = H) with Ha attention heads
    dict(name="train-glm-4k", op="train", T=4096, H=32, K=2048, S=4096, Ha=64, opt_in=True),
    dict(name="train-glm-cp8", op="train", T=4096, H=32, K=2048, S=32768, Ha=64, opt_in=True),
    dict(name="train-32k", op="train", T=32768, H=32, K=2048, S=32768, Ha=64, opt_in=True),
]
OP_NAMES = {"bwd": "sparse bwd", "idx": "indexer+topk", "topk": "topk", "train": "indexer train"}
# --cpu-dry-run sizes of the train shapes (K stays a multiple of 128, as cuDNN requires)
DRY_SIZES = {"train-glm-4k": dict(T=160, S=160, K=128), "train-glm-cp8": dict(T=64, S=320, K=128),
             "train-32k": dict(T=256, S=256, K=128)}
FE = "cuDNN FE"  # completed with the installed version at start

torch = None  # imported in main(), so --list and --self-test run without torch
DEV = "cuda"  # every tensor's device (a CPU test of the host logic can set "cpu")
RUN = {}      # card, commit, date, reps, ceilings, lib, ctx, stream, flush, cycles_per_ms
ROWS = []


def log(msg, end="\n"):
    print(msg, end=end, flush=True)


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------
def sync():
    if DEV != "cpu":
        torch.cuda.synchronize()


def calibrate_spin():
    """GPU clock cycles per millisecond of torch.cuda._sleep (measured, not read from a table)."""
    torch.cuda._sleep(100000)
    sync()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 20_000_000
    a.record()
    torch.cuda._sleep(n)
    b.record()
    sync()
    return n / a.elapsed_time(b)


def time_call(fn, reps, setup_s=0.0):
    """The bench's method (see the header). Returns a dict: ms (median), first_s (setup_s, the
    caller's plan construction and compile(), plus the warm-up call, host, synchronised), host_ms
    (median host time between the two events), host_max_ms, spin_ms."""
    if DEV == "cpu":  # --cpu-dry-run: host times of the CPU stand-ins, only to exercise the rows
        t0 = time.perf_counter()
        fn()
        first_s = setup_s + time.perf_counter() - t0
        ms = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
        ms.sort()
        return dict(ms=ms[len(ms) // 2], first_s=first_s, host_ms=ms[len(ms) // 2], host_max_ms=0.0,
                    spin_ms=0.0)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first_s = setup_s + time.perf_counter() - t0
    t0 = time.perf_counter()
    fn()
    probe_ms = (time.perf_counter() - t0) * 1e3  # host time of a call, GPU not waited for
    sync()
    spin_ms = min(20.0, max(1.0, 2.0 * probe_ms))
    cycles = int(spin_ms * RUN["cycles_per_ms"])
    flush = RUN["flush"]
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    host = []
    for i in range(reps):
        flush.fill_(i & 0xFF)
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        ev[i][0].record()
        fn()
        ev[i][1].record()
        host.append((time.perf_counter() - t0) * 1e3)
    sync()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    med = ms[reps // 2] if reps % 2 else 0.5 * (ms[reps // 2 - 1] + ms[reps // 2])
    host.sort()
    return dict(ms=med, first_s=first_s, host_ms=host[len(host) // 2], host_max_ms=host[-1],
                spin_ms=spin_ms)


def measure_ceilings(reps):
    n = 8192
    a = torch.empty(n, n, dtype=torch.bfloat16, device=DEV).uniform_(-1, 1)
    b = torch.empty(n, n, dtype=torch.bfloat16, device=DEV).uniform_(-1, 1)
    c = torch.empty(n, n, dtype=torch.bfloat16, device=DEV)
    gemm = 2.0 * n ** 3 / (time_call(lambda: torch.matmul(a, b, out=c), reps)["ms"] * 1e-3) / 1e12
    del a, b, c
    src = torch.full((1 << 30,), 0x3C, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    copy = 2.0 * (1 << 30) / (time_call(lambda: dst.copy_(src), reps)["ms"] * 1e-3) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return gemm, copy


# ------------------------------------------------------------------------------------------------
# Rows and the JSON file
# ------------------------------------------------------------------------------------------------
def clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    return v


def write_json():
    tmp = RUN["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump([clean(r) for r in ROWS], f, indent=1)
        f.write("\n")
    os.replace(tmp, RUN["out"])


def add_row(sh, variant, work, is_bytes, note, t=None, status="ok", ws=None, op=None):
    """A libdsa row (t: time_call's dict, None when libdsa failed); the peer is filled later.
    op: the row's op when it is not the shape's (the train shapes hold two ops)."""
    ms = t["ms"] if t else None
    rate = work / (ms * 1e-3) / (1e9 if is_bytes else 1e12) if ms else None
    ceil = RUN.get("copy_gbps") if is_bytes else RUN.get("gemm_tflops")
    row = dict(shape=sh["name"], op=op or OP_NAMES[sh["op"]], variant=variant, ms=ms,
               tflops=None if is_bytes else rate, gbps=rate if is_bytes else None,
               unit="GB/s" if is_bytes else "TFLOP/s", work=work,
               ceiling_ratio=rate / ceil if rate and ceil else None,
               gemm_ceiling_tflops=RUN.get("gemm_tflops"), copy_ceiling_gbps=RUN.get("copy_gbps"),
               peer=None, peer_ms=None, peer_rate=None, peer_same_run=False, peer_ratio=None,
               note=note, reps=RUN["reps"], card=RUN["card"], commit=RUN["commit"],
               date=RUN["date"], status=status, process="bench/cudnn_peer.py",
               peer_status="not run", peer_compile_s=None, workspace_bytes=ws,
               peer_workspace_bytes=None, first_call_s=t["first_s"] if t else None,
               host_ms=t["host_ms"] if t else None, peer_host_ms=None,
               spin_ms=t["spin_ms"] if t else None)
    if t and t["host_max_ms"] > t["spin_ms"]:
        row["note"] += f"; libdsa host time {t['host_max_ms']:.2f} ms exceeded the spin in a rep"
    ROWS.append(row)
    msg = f"{ms:.3f} ms, {rate:.1f} {row['unit']}" if ms else status
    log(f"  libdsa {sh['name']} {row['op']} {variant}: {msg}")
    write_json()
    return row


def set_peer(row, name, pt=None, error=None, ws=None, check=None, check_key="peer_max_rel_diff"):
    """Fills a row's peer from time_call's dict pt (or its error) and rewrites the file."""
    row["peer"] = name
    row["peer_workspace_bytes"] = ws
    if check is not None:
        row[check_key] = check
    if pt is None:
        row.update(peer_ms=None, peer_rate=None, peer_ratio=None, peer_same_run=False)
        row["peer_status"] = error or "not run"
        log(f"  peer {name}: {row['peer_status']}")
    else:
        row.update(peer_ms=pt["ms"], peer_same_run=row["ms"] is not None, peer_status="ok",
                   peer_compile_s=pt["first_s"], peer_host_ms=pt["host_ms"])
        scale = 1e9 if row["unit"] == "GB/s" else 1e12
        row["peer_rate"] = row["work"] / (pt["ms"] * 1e-3) / scale
        row["peer_ratio"] = pt["ms"] / row["ms"] if row["ms"] else None
        if pt["host_max_ms"] > pt["spin_ms"]:
            row["note"] += f"; peer host time {pt['host_max_ms']:.2f} ms exceeded the spin in a rep"
        r = f", x{row['peer_ratio']:.2f} (peer_ms / ms)" if row["peer_ratio"] else ""
        log(f"  peer {name}: {pt['ms']:.3f} ms, first call {pt['first_s']:.2f} s{r}")
    write_json()


def copy_row(row, variant, note):
    """A second row for the same libdsa measurement against another peer: the peer fields reset."""
    row = dict(row)
    row.update(variant=variant, note=note, peer=None, peer_ms=None, peer_rate=None, peer_ratio=None,
               peer_same_run=False, peer_status="not run", peer_compile_s=None, peer_host_ms=None,
               peer_workspace_bytes=None)
    row.pop("peer_max_rel_diff", None)
    row.pop("peer_agreement", None)
    ROWS.append(row)
    return row


def error_text(e):
    return f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def rel_diff(a, b):
    """max |a - b| / max |b| (the absolute max |a - b| when b is all zero, marked 'abs')."""
    a, b = a.float(), b.float()
    d = (a - b).abs().max().item()
    m = b.abs().max().item()
    return d / m if m > 0 else f"abs {d:.3g}"


def set_agreement(a, b):
    """a, b: [rows, K] int32 index sets padded with -1, any order. Returns the fraction of rows whose
    sets are equal and the fraction of b's valid entries that a also selected."""
    a = torch.sort(a, dim=1).values.contiguous()
    b = torch.sort(b.to(a.dtype), dim=1).values.contiguous()
    rows = (a == b).all(dim=1).float().mean().item()
    pos = torch.searchsorted(a, b).clamp_(max=a.shape[1] - 1)
    hit = (a.gather(1, pos) == b) & (b >= 0)
    return dict(rows_equal=rows, overlap=hit.sum().item() / max((b >= 0).sum().item(), 1))


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
def uniform(shape, lo, hi, dtype, gen):
    return torch.empty(shape, dtype=dtype, device=DEV).uniform_(lo, hi, generator=gen)


def causal_indices(T, S, K, gen):
    """Row t (global g = S - T + t): min(g + 1, K) distinct ascending keys from 0..g (all of 0..g
    when g + 1 <= K), then -1. Random scores masked to [0, g], top-K, sorted; in row chunks."""
    idx = torch.empty(T, K, dtype=torch.int32, device=DEV)
    cols = torch.arange(S, device=DEV)
    slot = torch.arange(K, device=DEV)
    g_all = torch.arange(S - T, S, device=DEV)
    lengths = torch.clamp(g_all + 1, max=K).to(torch.int32)
    step = max(1, (64 << 20) // (4 * S))
    for r0 in range(0, T, step):
        g = g_all[r0:r0 + step]
        sc = torch.rand(g.numel(), S, device=DEV, generator=gen)
        sc.masked_fill_(cols[None, :] > g[:, None], -1.0)  # rand is >= 0: masked keys lose
        kk = min(K, S)
        top = torch.topk(sc, kk, dim=1).indices.sort(dim=1).values
        # the masked keys are > g, so after the sort the valid keys are the first min(g+1, K)
        top.masked_fill_(slot[None, :kk] >= lengths[r0:r0 + step, None], -1)
        idx[r0:r0 + step, :kk] = top.to(torch.int32)
        idx[r0:r0 + step, kk:] = -1
    return idx, lengths


def random_distinct_indices(T, S, K, gen):
    """K distinct random keys of [0, S) per row, unsorted (top-K of random scores)."""
    idx = torch.empty(T, K, dtype=torch.int32, device=DEV)
    step = max(1, (64 << 20) // (4 * S))
    for r0 in range(0, T, step):
        n = min(step, T - r0)
        sc = torch.rand(n, S, device=DEV, generator=gen)
        idx[r0:r0 + n] = torch.topk(sc, K, dim=1, sorted=True).indices.to(torch.int32)
    return idx


def ptr(t):
    return t.data_ptr() if t is not None else None


# ------------------------------------------------------------------------------------------------
# Sparse backward
# ------------------------------------------------------------------------------------------------
def dsa_fwd(q, kv, idx, lengths, sink, scale, K):
    T, H, Dh = q.shape
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(T, H, dtype=torch.float32, device=DEV)
    p = D.AttnFwdParams(num_tokens=T, num_heads=H, head_dim=Dh, num_kv=kv.shape[0], topk=K,
                        softmax_scale=scale, q=ptr(q), kv=ptr(kv), indices=ptr(idx),
                        topk_length=ptr(lengths), sink=ptr(sink), out=ptr(out), lse=ptr(lse))
    lib = RUN["lib"]
    if DEV == "cpu":  # --cpu-dry-run
        lib.check(lib.so.dsa_ref_sparse_attn_fwd(C.byref(p)), "dsa_ref_sparse_attn_fwd")
    else:
        lib.check(lib.so.dsa_sparse_attn_fwd(RUN["ctx"], C.byref(p), RUN["stream"]), "dsa_sparse_attn_fwd")
    sync()
    return out, lse


def cudnn_bwd(q, kv, out, dout, lse, sink, idx, lengths, scale):
    """A SparseAttentionBackward plan and a closure running everything its execute does."""
    import cudnn
    dq = torch.empty_like(q)
    dkv = torch.empty_like(kv)
    dsink = torch.empty_like(sink)
    obj = cudnn.DSA.SparseAttentionBackward(q, kv, out, dout, lse, sink, idx,
                                            sample_topk_length=lengths, softmax_scale=scale)
    obj.check_support()
    obj.compile()
    ws_bytes = obj.scratch_workspace_bytes()
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=DEV)

    def run():
        obj.execute(q, kv, out, dout, lse, sink, idx, dq, dkv, topk_length=lengths,
                    softmax_scale=scale, workspace=ws, d_sink=dsink)
    return run, ws_bytes, (dq, dkv, dsink)


def bench_bwd(sh, check):
    """Both index distributions of a GLM shape, each against cuDNN in this process: rows det0 / det1
    on uniform causal indices (a random ascending K-subset of 0..g per row, as cuDNN's and FlashMLA's
    tests draw them), rows det0,indexer / det1,indexer on the indices dsa_indexer_topk chooses
    (H_idx = 32, random inputs, as dsa_bench's rows). V3.2 shapes: random distinct indices only."""
    T, H, K, S = sh["T"], sh["H"], sh["K"], sh["S"]
    gen = torch.Generator(device=DEV)
    gen.manual_seed(0xD5A0 + S + H)
    log(f"[setup] {sh['name']}: T={T} H={H} K={K} s_kv={S} ...", end=" ")
    q = uniform((T, H, 576), -1, 1, torch.bfloat16, gen)
    kv = uniform((S, 576), -1, 1, torch.bfloat16, gen)
    dout = uniform((T, H, 512), -1, 1, torch.bfloat16, gen)
    if sh["v32"]:
        idx, lengths = random_distinct_indices(T, S, K, gen), None
        sink = uniform((H,), -1, 1, torch.float32, gen)
        scale = 576 ** -0.5
        note = "random distinct indices (unsorted), random sink, scale 576^-0.5"
    else:
        idx, lengths = causal_indices(T, S, K, gen)
        sink = None  # libdsa: no sink; cuDNN requires one: -inf
        scale = 0.0625
        note = "uniform causal indices (torch), topk_length, no sink (cuDNN: -inf), scale 0.0625"
    log("done")
    bwd_one_distribution(sh, check, q, kv, dout, sink, scale, idx, lengths, note, "")
    if not sh["v32"]:
        try:
            log(f"[setup] {sh['name']}: indices from dsa_indexer_topk ...", end=" ")
            ig = torch.Generator(device=DEV)
            ig.manual_seed(0x1D0 + S + 32)
            iq = uniform((T, 32, 128), -1, 1, torch.bfloat16, ig)
            ik = uniform((S, 128), -1, 1, torch.bfloat16, ig)
            sw = (32 * 128) ** -0.5
            w = uniform((T, 32), -sw, sw, torch.float32, ig)
            iidx, ilen = dsa_indexer_indices(iq, ik, w, T, S, 32, K)
            del iq, ik, w
            log("done")
            bwd_one_distribution(sh, check, q, kv, dout, sink, scale, iidx, ilen,
                                 "indices from dsa_indexer_topk (H_idx=32, random inputs), topk_length, "
                                 "no sink (cuDNN: -inf), scale 0.0625", ",indexer")
        except Exception as e:
            traceback.print_exc()
            add_row(sh, "det0,indexer", 0.0, False, "indices from dsa_indexer_topk", status=error_text(e))


def bwd_one_distribution(sh, check, q, kv, dout, sink, scale, idx, lengths, note, suffix):
    """libdsa det0 / det1 and cuDNN on one set of indices; rows det0<suffix>, det1<suffix> (and, for
    H < 64 on the uniform set, det0,peer-pad64)."""
    T, H, K, S = sh["T"], sh["H"], sh["K"], sh["S"]
    slots = float(T * K) if lengths is None else float(lengths.double().sum().item())
    out, lse = dsa_fwd(q, kv, idx, lengths, sink, scale, K)
    note += "; out, lse from dsa_sparse_attn_fwd"
    work = 2.0 * H * slots * 2752
    lib, ctx, stream = RUN["lib"], RUN["ctx"], RUN["stream"]

    rows, results = [], {}
    for det in (0, 1):
        variant = f"det{det}{suffix}"
        log(f"[{sh['name']}] libdsa {variant} ...")
        dq = torch.empty_like(q)
        dkv = torch.empty_like(kv)
        dsink = torch.zeros(H, dtype=torch.float32, device=DEV)  # stays 0 without a sink
        p = D.AttnBwdParams(num_tokens=T, num_heads=H, head_dim=576, num_kv=S, topk=K,
                            softmax_scale=scale, deterministic=det, q=ptr(q), kv=ptr(kv),
                            indices=ptr(idx), topk_length=ptr(lengths), sink=ptr(sink),
                            out=ptr(out), dout=ptr(dout), lse=ptr(lse), dq=ptr(dq),
                            dkv=ptr(dkv), dsink=ptr(dsink))
        try:
            ws_bytes = lib.bwd_ws(ctx, p, stream)
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=DEV)
            nb, pref, f = C.c_size_t(ws_bytes), C.byref(p), lib.so.dsa_sparse_attn_bwd

            def run(ws_ptr=ws.data_ptr(), nref=C.byref(nb)):
                s = f(ctx, pref, ws_ptr, nref, stream)
                if s:
                    lib.check(s, "dsa_sparse_attn_bwd")
            t = time_call(run, RUN["reps"])
            del ws
            rows.append(add_row(sh, variant, work, False, note, t, ws=ws_bytes))
            results[det] = (dq, dkv, dsink)
        except Exception as e:
            rows.append(add_row(sh, variant, work, False, note, status=error_text(e)))

    # cuDNN, native head count (and the same for the det1 row: no deterministic mode on SM90)
    name = f"{FE} SparseAttentionBackward (SM90)"
    csink = sink if sink is not None else torch.full((H,), -math.inf, device=DEV)
    log(f"[{sh['name']}] {name} ...")
    try:
        t0 = time.perf_counter()
        run, ws_bytes, grads = cudnn_bwd(q, kv, out, dout, lse, csink, idx, lengths, scale)
        pt = time_call(run, RUN["reps"], time.perf_counter() - t0)
        for det, row in enumerate(rows):
            diff = None
            if check and det in results:
                diff = {k: rel_diff(a, b) for k, a, b in zip(("dq", "dkv", "dsink"), grads, results[det])}
            if det == 1:
                row["note"] += "; peer: cuDNN has no deterministic mode on SM90, its non-deterministic time"
            set_peer(row, name + (", native H=%d" % H if H < 64 else ""), pt, ws=ws_bytes, check=diff)
        del run, grads
    except Exception as e:
        traceback.print_exc()
        for row in rows:
            set_peer(row, name, error=error_text(e))

    if H < 64 and 0 in results and not suffix:
        # cuDNN on q padded to 64 heads: zero q and dout heads, -inf sinks; out / lse of the padded
        # heads from libdsa's forward on the padded q. Credited with the useful heads' FLOP only.
        # libdsa's det0 measurement, shown against the padded peer
        row = copy_row(rows[0], "det0,peer-pad64",
                       rows[0]["note"] + f"; libdsa ms = the det0 row's; peer on q padded {H} -> 64 "
                       "heads (zero heads, -inf sinks), credited with the useful FLOP only")
        name = f"{FE} SparseAttentionBackward (SM90), q padded {H}->64 heads"
        log(f"[{sh['name']}] {name} ...")
        try:
            qp = torch.zeros(T, 64, 576, dtype=torch.bfloat16, device=DEV)
            qp[:, :H] = q
            dp = torch.zeros(T, 64, 512, dtype=torch.bfloat16, device=DEV)
            dp[:, :H] = dout
            outp, lsep = dsa_fwd(qp, kv, idx, lengths, None, scale, K)
            sinkp = torch.full((64,), -math.inf, device=DEV)
            t0 = time.perf_counter()
            run, ws_bytes, (dq, dkv, dsink) = cudnn_bwd(qp, kv, outp, dp, lsep, sinkp, idx, lengths, scale)
            pt = time_call(run, RUN["reps"], time.perf_counter() - t0)
            diff = None
            if check:
                diff = {k: rel_diff(a, b) for k, a, b in
                        zip(("dq", "dkv", "dsink"), (dq[:, :H], dkv, dsink[:H]), results[0])}
            set_peer(row, name, pt, ws=ws_bytes, check=diff)
        except Exception as e:
            traceback.print_exc()
            set_peer(row, name, error=error_text(e))


# ------------------------------------------------------------------------------------------------
# Indexer + top-k
# ------------------------------------------------------------------------------------------------
def bench_idx(sh, check):
    Tq, Tk, H, K = sh["T"], sh["S"], sh["H"], sh["K"]
    qs = Tk - Tq
    gen = torch.Generator(device=DEV)
    gen.manual_seed(0x1D0 + Tk + H)
    log(f"[setup] {sh['name']}: T_q={Tq} T_k={Tk} H_idx={H} K={K} ...", end=" ")
    iq = uniform((Tq, H, 128), -1, 1, torch.bfloat16, gen)
    ik = uniform((Tk, 128), -1, 1, torch.bfloat16, gen)
    s = (H * 128) ** -0.5
    w = uniform((Tq, H), -s, s, torch.float32, gen)
    pairs = float(sum(range(qs + 1, Tk + 1)))  # query g sees g + 1 keys
    work = 2.0 * H * 128 * pairs
    lib, ctx, stream = RUN["lib"], RUN["ctx"], RUN["stream"]
    log("done")
    note = "one causal sequence, random bf16 q/k, fp32 weights uniform(+-(H_idx*128)^-0.5)"

    log(f"[{sh['name']}] libdsa dsa_indexer_topk (DEFAULT) ...")
    idx_l = torch.empty(Tq, K, dtype=torch.int32, device=DEV)
    len_l = torch.empty(Tq, dtype=torch.int32, device=DEV)
    plan = None
    try:
        cu = (C.c_int32 * 2)(0, Tk)
        desc = D.PlanDesc(cu_seqlens=C.addressof(cu), num_seqs=1, total_key_tokens=Tk,
                          query_start=qs, num_queries=Tq)
        plan = lib.plan_create(desc)
        nplan = lib.plan_upload_size(ctx, plan, stream)
        plan_buf = torch.empty(nplan, dtype=torch.uint8, device=DEV)
        view = lib.plan_upload(ctx, plan, plan_buf.data_ptr(), nplan, stream)
        sync()  # the upload reads the host plan
        p = D.IndexerParams(plan=C.addressof(view), num_heads=H, topk=K, index_q=ptr(iq),
                            index_k=ptr(ik), weights=ptr(w), weights_dtype=D.DSA_DTYPE_F32,
                            indices=ptr(idx_l), lengths=ptr(len_l),
                            engine=D.DSA_INDEXER_ENGINE_DEFAULT)
        ws_bytes = lib.indexer_ws(ctx, p, stream)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=DEV)
        nb, pref, f = C.c_size_t(ws_bytes), C.byref(p), lib.so.dsa_indexer_topk

        def run(ws_ptr=ws.data_ptr(), nref=C.byref(nb)):
            st = f(ctx, pref, ws_ptr, nref, stream)
            if st:
                lib.check(st, "dsa_indexer_topk")
        t = time_call(run, RUN["reps"])
        del ws
        row = add_row(sh, "default", work, False,
                      note + f"; libdsa workspace {ws_bytes / 2**20:.1f} MiB", t, ws=ws_bytes)
        ok = True
    except Exception as e:
        row = add_row(sh, "default", work, False, note, status=error_text(e))
        ok = False

    name = f"{FE} indexer_forward_wrapper + IndexerTopK"
    log(f"[{sh['name']}] {name} ...")
    try:
        import cudnn
        q4, k4, w3 = iq.unsqueeze(0), ik.view(1, Tk, 1, 128), w.unsqueeze(0)
        scores = torch.empty(1, Tq, Tk, dtype=torch.float32, device=DEV)
        scores2 = scores.view(Tq, Tk)
        offs = torch.tensor([qs], dtype=torch.int32, device=DEV)
        seq_lens = torch.arange(qs + 1, Tk + 1, dtype=torch.int32, device=DEV)
        t0 = time.perf_counter()
        topk = cudnn.DSA.IndexerTopK(scores2, seq_lens, K, next_n=1, return_val=False,
                                     deterministic=False)
        topk.check_support()
        topk.compile()
        tws_bytes = topk.scratch_workspace_bytes()
        tws = torch.empty(tws_bytes, dtype=torch.uint8, device=DEV)
        idx_c = torch.empty(Tq, K, dtype=torch.int32, device=DEV)
        fwd = cudnn.DSA.indexer_forward_wrapper

        def run():
            fwd(q4, k4, w3, ratio=1, sm_scale=1.0, out=scores, q_causal_offsets=offs)
            topk.execute(scores2, seq_lens, out_indices=idx_c, workspace=tws)
        pt = time_call(run, RUN["reps"], time.perf_counter() - t0)
        agree = set_agreement(idx_c, idx_l) if (check and ok) else None  # local ids = global (start 0)
        peer_ws = tws_bytes + scores.numel() * 4
        row["note"] += (f"; cuDNN scratch {peer_ws / 2**30:.2f} GiB (dense fp32 scores "
                        f"{scores.numel() * 4 / 2**30:.2f} GiB + top-k workspace)")
        set_peer(row, name, pt, ws=peer_ws, check=agree, check_key="peer_agreement")
    except Exception as e:
        traceback.print_exc()
        set_peer(row, name, error=error_text(e))
    if plan is not None:
        lib.so.dsa_plan_destroy(plan)


# ------------------------------------------------------------------------------------------------
# Top-k alone
# ------------------------------------------------------------------------------------------------
def bench_topk(sh, check):
    rows, cols, K = sh["T"], sh["S"], sh["K"]
    gen = torch.Generator(device=DEV)
    gen.manual_seed(0x70C + cols)
    log(f"[setup] {sh['name']}: {rows} x {cols} fp32, K={K} ...", end=" ")
    scores = uniform((rows, cols), -1, 1, torch.float32, gen)
    lengths = torch.arange(cols - rows + 1, cols + 1, dtype=torch.int32, device=DEV)
    work = float(rows * cols * 4)
    lib, ctx, stream = RUN["lib"], RUN["ctx"], RUN["stream"]
    log("done")

    for variant in ("causal", "full"):
        log(f"[{sh['name']}] libdsa dsa_topk {variant} ...")
        idx_l = torch.empty(rows, K, dtype=torch.int32, device=DEV)
        lens = lengths if variant == "causal" else None
        note = ("random fp32 scores; row r has length columns - rows + r + 1; bytes = rows*columns*4"
                if lens is not None else "random fp32 scores, every column valid")
        try:
            p = D.TopkParams(rows=rows, columns=cols, k=K, scores=ptr(scores), lengths=ptr(lens),
                             indices=ptr(idx_l))
            ws_bytes = lib.topk_ws(ctx, p, stream)
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=DEV)
            nb, pref, f = C.c_size_t(ws_bytes), C.byref(p), lib.so.dsa_topk

            def run(ws_ptr=ws.data_ptr(), nref=C.byref(nb)):
                st = f(ctx, pref, ws_ptr, nref, stream)
                if st:
                    lib.check(st, "dsa_topk")
            t = time_call(run, RUN["reps"])
            del ws
            row = add_row(sh, variant, work, True, note, t, ws=ws_bytes)
            ok = True
        except Exception as e:
            row = add_row(sh, variant, work, True, note, status=error_text(e))
            ok = False

        if variant == "causal":
            for det in (False, True):
                if det:  # a second row: libdsa's same measurement against the deterministic peer
                    row = copy_row(row, "causal,peer-det", note + "; libdsa ms = the causal row's")
                name = f"{FE} IndexerTopK" + (" deterministic=True" if det else "")
                log(f"[{sh['name']}] {name} ...")
                try:
                    import cudnn
                    t0 = time.perf_counter()
                    obj = cudnn.DSA.IndexerTopK(scores, lengths, K, next_n=1, return_val=False,
                                                deterministic=det)
                    obj.check_support()
                    obj.compile()
                    tws_bytes = obj.scratch_workspace_bytes()
                    tws = torch.empty(tws_bytes, dtype=torch.uint8, device=DEV)
                    idx_c = torch.empty(rows, K, dtype=torch.int32, device=DEV)

                    def prun(obj=obj, idx_c=idx_c, tws=tws):
                        obj.execute(scores, lengths, out_indices=idx_c, workspace=tws)
                    pt = time_call(prun, RUN["reps"], time.perf_counter() - t0)
                    agree = set_agreement(idx_c, idx_l) if (check and ok) else None
                    set_peer(row, name, pt, ws=tws_bytes, check=agree, check_key="peer_agreement")
                    del tws, idx_c, obj
                except Exception as e:
                    traceback.print_exc()
                    set_peer(row, name, error=error_text(e))
        else:
            name = "torch.topk (sorted=False)"
            log(f"[{sh['name']}] {name} ...")
            try:
                tv = torch.empty(rows, K, dtype=torch.float32, device=DEV)
                ti = torch.empty(rows, K, dtype=torch.int64, device=DEV)

                def prun():
                    torch.topk(scores, K, dim=1, largest=True, sorted=False, out=(tv, ti))
                pt = time_call(prun, RUN["reps"])
                agree = set_agreement(ti.to(torch.int32), idx_l) if (check and ok) else None
                row["note"] += "; torch.topk with sorted=False (libdsa and cuDNN do not sort by value)"
                set_peer(row, name, pt, ws=0, check=agree, check_key="peer_agreement")
            except Exception as e:
                traceback.print_exc()
                set_peer(row, name, error=error_text(e))


# ------------------------------------------------------------------------------------------------
# Indexer training: slot target and indexer backward
# ------------------------------------------------------------------------------------------------
def fe_dsa():
    """cuDNN FE's DSA namespace (cudnn.DSA), or --cpu-dry-run's stand-in."""
    if "fe_dsa" in RUN:
        return RUN["fe_dsa"]
    import cudnn
    return cudnn.DSA


def dsa_runner(name, p, ws=None, ws_bytes=0):
    """A closure running libdsa's dsa_<name> on params p (ws: the workspace tensor of a two-phase
    op); under --cpu-dry-run its CPU reference dsa_ref_<name> on the same params (host pointers)."""
    lib, ctx, stream = RUN["lib"], RUN["ctx"], RUN["stream"]
    pref = C.byref(p)
    if DEV == "cpu":
        f = getattr(lib.so, "dsa_ref_" + name)

        def run():
            lib.check(f(pref), "dsa_ref_" + name)
        return run
    f = getattr(lib.so, "dsa_" + name)
    if ws is None:
        def run():
            st = f(ctx, pref, stream)
            if st:
                lib.check(st, "dsa_" + name)
        return run
    nb = C.c_size_t(ws_bytes)

    def run(ws_ptr=ws.data_ptr(), nref=C.byref(nb)):
        st = f(ctx, pref, ws_ptr, nref, stream)
        if st:
            lib.check(st, "dsa_" + name)
    return run


def dsa_ws_size(name, p):
    """The size query of a two-phase op (0 on the CPU: the references take no workspace)."""
    if DEV == "cpu":
        return 0
    lib = RUN["lib"]
    n = C.c_size_t(0)
    lib.check(getattr(lib.so, "dsa_" + name)(RUN["ctx"], C.byref(p), None, C.byref(n), RUN["stream"]),
              f"dsa_{name} (size)")
    return n.value


def dsa_workspace(name, p):
    n = dsa_ws_size(name, p)
    return torch.empty(max(n, 1), dtype=torch.uint8, device=DEV), n


def dsa_indexer_indices(iq, ik, w, Tq, Tk, H, K):
    """libdsa's own top-k indices of one causal sequence (the last Tq of Tk queries), as the idx
    section makes them (engine DEFAULT); bf16 weights. Returns indices [Tq, K] and lengths [Tq]."""
    lib = RUN["lib"]
    idx = torch.empty(Tq, K, dtype=torch.int32, device=DEV)
    lens = torch.empty(Tq, dtype=torch.int32, device=DEV)
    cu = (C.c_int32 * 2)(0, Tk)
    desc = D.PlanDesc(cu_seqlens=C.addressof(cu), num_seqs=1, total_key_tokens=Tk, query_start=Tk - Tq,
                      num_queries=Tq)
    plan = lib.plan_create(desc)
    try:
        kw = dict(num_heads=H, topk=K, index_q=ptr(iq), index_k=ptr(ik), weights=ptr(w),
                  weights_dtype=D.DSA_DTYPE_BF16, indices=ptr(idx), lengths=ptr(lens),
                  engine=D.DSA_INDEXER_ENGINE_DEFAULT)
        if DEV == "cpu":
            p = D.IndexerParams(plan=C.cast(lib.so.dsa_plan_host_view(plan), C.c_void_p).value, **kw)
            lib.check(lib.so.dsa_ref_indexer_topk(C.byref(p)), "dsa_ref_indexer_topk")
        else:
            nplan = lib.plan_upload_size(RUN["ctx"], plan, RUN["stream"])
            plan_buf = torch.empty(nplan, dtype=torch.uint8, device=DEV)
            view = lib.plan_upload(RUN["ctx"], plan, plan_buf.data_ptr(), nplan, RUN["stream"])
            sync()
            p = D.IndexerParams(plan=C.addressof(view), **kw)
            ws = torch.empty(max(lib.indexer_ws(RUN["ctx"], p, RUN["stream"]), 1), dtype=torch.uint8,
                             device=DEV)
            nb = C.c_size_t(ws.numel())
            lib.check(lib.so.dsa_indexer_topk(RUN["ctx"], C.byref(p), ws.data_ptr(), C.byref(nb),
                                              RUN["stream"]), "dsa_indexer_topk")
            sync()
            del ws, plan_buf
    finally:
        lib.so.dsa_plan_destroy(plan)
    return idx, lens


def bench_train(sh, check):
    Tq, Tk, H, K, Ha = sh["T"], sh["S"], sh["H"], sh["K"], sh["Ha"]
    HP = max(64, H)  # cuDNN's SM90 indexer backward: heads >= 64
    reps = RUN["reps"]
    gen = torch.Generator(device=DEV)
    gen.manual_seed(0x7A1 + Tk + Tq + H)
    log(f"[setup] {sh['name']}: T_q={Tq} T_k={Tk} H_idx={H} H={Ha} K={K} ...", end=" ")
    iq = uniform((Tq, H, 128), -1, 1, torch.bfloat16, gen)
    ik = uniform((Tk, 128), -1, 1, torch.bfloat16, gen)
    s = (H * 128) ** -0.5
    w = uniform((Tq, H), -s, s, torch.float32, gen).to(torch.bfloat16)  # cuDNN takes bf16 weights
    idx, lens = dsa_indexer_indices(iq, ik, w, Tq, Tk, H, K)
    q = uniform((Tq, Ha, 576), -1, 1, torch.bfloat16, gen)
    kv = uniform((Tk, 576), -1, 1, torch.bfloat16, gen)
    scale = 0.0625
    out, lse = dsa_fwd(q, kv, idx, lens, None, scale, K)
    del out
    slots = float(lens.double().sum().item())
    col = torch.arange(K, device=DEV)
    valid = (col[None, :] < lens[:, None]) & (idx >= 0) & (idx < Tk)
    log("done")
    base = (f"the idx-{sh['name'][6:]} shape: one causal sequence, T_q={Tq} T_k={Tk}, K={K}; indices and "
            f"lengths from dsa_indexer_topk (H_idx={H}, bf16 index q/k random, bf16 weights "
            f"uniform(+-(H_idx*128)^-0.5)); ")

    # ---- slot target ----
    note = (base + f"attention q [T,{Ha},576] / kv random bf16, lse from dsa_sparse_attn_fwd (no sink, "
            f"scale {scale}), topk_length given to both; FLOP = 2*H*576*sum(lengths)")
    work = 2.0 * Ha * slots * 576
    a = torch.empty(Tq, K, dtype=torch.float32, device=DEV)
    log(f"[{sh['name']}] libdsa dsa_attn_slot_target ...")
    ok_t = False
    try:
        pt_ = D.SlotTargetParams(num_tokens=Tq, num_heads=Ha, head_dim=576, num_kv=Tk, topk=K,
                                 softmax_scale=scale, q=ptr(q), kv=ptr(kv), indices=ptr(idx),
                                 topk_length=ptr(lens), sink=None, lse=ptr(lse), target=ptr(a))
        t = time_call(dsa_runner("attn_slot_target", pt_), reps)
        row = add_row(sh, "target", work, False, note, t, ws=0, op="slot target")
        ok_t = True
    except Exception as e:
        traceback.print_exc()
        row = add_row(sh, "target", work, False, note, status=error_text(e), op="slot target")
    name = f"{FE} sparse_attn_score_recompute_wrapper (SM90)"
    log(f"[{sh['name']}] {name} ...")
    try:
        f_rc = fe_dsa().sparse_attn_score_recompute_wrapper
        q4, kv3, lse3 = q.unsqueeze(0), kv.unsqueeze(0), lse.unsqueeze(0)
        idx3, len2 = idx.unsqueeze(0), lens.unsqueeze(0)
        tc = torch.empty(1, Tq, K, dtype=torch.float32, device=DEV)

        def prun():
            f_rc(q4, kv3, lse3, idx3, scale, qhead_per_kv_head=Ha, topk_length=len2,
                 topk_indices_global=False, out=tc)
        pt = time_call(prun, reps)
        diff = None
        if check and ok_t:
            rs = a.double().sum(1, keepdim=True)
            an = torch.where(rs > 0, a.double() / rs.clamp(min=1e-300), torch.zeros_like(rs))
            diff = dict(target=rel_diff(tc[0], an),
                        libdsa_rowsum_over_H_minus_1=(rs / Ha - 1).abs().max().item())
        row["note"] += ("; cuDNN's target is L1-normalised over the slots (sum_h P / (sum_j sum_h P + "
                        "1e-10)), libdsa's a = sum_h P is not: peer_max_rel_diff.target compares cuDNN's "
                        "with a / rowsum(a); libdsa_rowsum_over_H_minus_1 = max |rowsum(a) / H - 1|")
        set_peer(row, name, pt, ws=0, check=diff)
        del tc
    except Exception as e:
        traceback.print_exc()
        set_peer(row, name, error=error_text(e))

    # ---- indexer backward ----
    note = (base + f"g from dsa_indexer_loss (coeff 1) on libdsa's target a and dsa_indexer_slot_scores "
            f"z; FLOP = 6*H_idx*128*sum(lengths) (x = q.k recomputed, d_index_q, d_index_k; "
            f"H_idx = {H}, the padded peer credited with the same)")
    work = 6.0 * H * 128 * slots
    log(f"[{sh['name']}] libdsa slot scores and loss (the backward's g) ...", end=" ")
    try:
        if not ok_t:
            raise RuntimeError("no slot target (dsa_attn_slot_target failed)")
        z = torch.empty(Tq, K, dtype=torch.float32, device=DEV)
        ps = D.IndexerSlotScoresParams(num_tokens=Tq, num_keys=Tk, num_heads=H, topk=K, index_q=ptr(iq),
                                       index_k=ptr(ik), weights=ptr(w), weights_dtype=D.DSA_DTYPE_BF16,
                                       indices=ptr(idx), lengths=ptr(lens), scores=ptr(z))
        dsa_runner("indexer_slot_scores", ps)()
        g = torch.empty(Tq, K, dtype=torch.float32, device=DEV)
        loss = torch.zeros(1, dtype=torch.float32, device=DEV)
        pl = D.IndexerLossParams(num_tokens=Tq, topk=K, num_keys=Tk, indices=ptr(idx), lengths=ptr(lens),
                                 target=ptr(a), scores=ptr(z), coeff=1.0, grad_loss=None, loss=ptr(loss),
                                 grad=ptr(g))
        wsl, nl = dsa_workspace("indexer_loss", pl)
        dsa_runner("indexer_loss", pl, wsl, nl)()
        sync()
        # cuDNN's inputs for the same g: the normalised target and softmax(z) over the valid slots,
        # 0 elsewhere and on rows that do not count (libdsa's g is 0 there; cuDNN's then is too)
        av = torch.where(valid, a, torch.zeros_like(a))
        rs = av.sum(1, keepdim=True)
        counted = valid.any(1, keepdim=True) & (rs > 0)
        tgt = torch.where(counted & valid, av / rs.clamp(min=1e-30), torch.zeros_like(a))
        pz = torch.softmax(z.masked_fill(~valid, -math.inf), dim=1)
        pz = torch.where(counted & valid, pz, torch.zeros_like(pz)).contiguous()
        n_counted = int(counted.sum().item())
        loss_v = loss.item()
        del wsl
        log(f"loss {loss_v:.6g}, {n_counted} of {Tq} rows counted")
        note += f"; loss {loss_v:.6g}"
        ok_g = True
    except Exception as e:
        traceback.print_exc()
        ok_g, err_g = False, error_text(e)

    rows, results = [], {}
    for det in (0, 1):
        variant = f"det{det}"
        if not ok_g:
            rows.append(add_row(sh, variant, work, False, note, status=err_g, op="indexer bwd"))
            continue
        log(f"[{sh['name']}] libdsa dsa_indexer_bwd {variant} ...")
        try:
            diq = torch.empty_like(iq)
            dw = torch.empty(Tq, H, dtype=torch.float32, device=DEV)
            dik = torch.empty_like(ik)
            pb = D.IndexerBwdParams(num_tokens=Tq, num_keys=Tk, num_heads=H, topk=K, deterministic=det,
                                    index_q=ptr(iq), index_k=ptr(ik), weights=ptr(w),
                                    weights_dtype=D.DSA_DTYPE_BF16, indices=ptr(idx), lengths=ptr(lens),
                                    grad=ptr(g), d_index_q=ptr(diq), d_weights=ptr(dw), d_index_k=ptr(dik))
            ws, nb = dsa_workspace("indexer_bwd", pb)
            t = time_call(dsa_runner("indexer_bwd", pb, ws, nb), reps)
            del ws
            rows.append(add_row(sh, variant, work, False,
                                note + f"; libdsa workspace {nb / 2**20:.1f} MiB", t, ws=nb, op="indexer bwd"))
            results[det] = (diq, dw, dik)
        except Exception as e:
            traceback.print_exc()
            rows.append(add_row(sh, variant, work, False, note, status=error_text(e), op="indexer bwd"))

    name = f"{FE} indexer_backward_wrapper (SM90), index_q/weights padded {H}->{HP} heads"
    if not ok_g:
        for row in rows:
            set_peer(row, name, error="not run: " + err_g)
        return
    log(f"[{sh['name']}] {name} ...")
    try:
        ns = fe_dsa()
        iqp = torch.zeros(1, Tq, HP, 128, dtype=torch.bfloat16, device=DEV)
        iqp[0, :, :H] = iq
        wp = torch.zeros(1, Tq, HP, dtype=torch.bfloat16, device=DEV)
        wp[0, :, :H] = w
        ik3, idx3 = ik.unsqueeze(0), idx.unsqueeze(0)
        attn = tgt.unsqueeze(0).clone()  # overwritten in place with cuDNN's score gradient
        isc = pz.unsqueeze(0)
        gl = torch.ones(1, dtype=torch.float32, device=DEV)
        diqp = torch.empty(1, Tq, HP, 128, dtype=torch.bfloat16, device=DEV)
        dwp = torch.empty(1, Tq, HP, dtype=torch.bfloat16, device=DEV)  # bf16: the SM90 kernel's dW store
        dikp = torch.empty(1, Tk, 128, dtype=torch.bfloat16, device=DEV)
        coeff = Tq / max(n_counted, 1)  # cuDNN's grad_scale = loss_coeff / (B * S_q); libdsa's 1 / N
        t0 = time.perf_counter()
        # the wrapper's own plan class, built here only to size the reusable workspace (its
        # constructor touches no device memory); the wrapper then builds, checks and compiles its own
        plan = ns.IndexerBackward(sample_index_q=iqp, sample_weights=wp, sample_index_k=ik3,
                                  sample_d_index_q=diqp, sample_d_weights=dwp, sample_d_index_k=dikp,
                                  sample_attn_score=attn, sample_index_score=isc, sample_topk_indices=idx3,
                                  sm_scale=1.0, block_I=128, topk_indices_global=False, backend="default",
                                  deterministic=False)
        wsb = plan.scratch_workspace_bytes()
        wsc = torch.empty(max(wsb, 1), dtype=torch.uint8, device=DEV)
        f_bwd = ns.indexer_backward_wrapper

        def prun():
            f_bwd(iqp, wp, ik3, attn, isc, idx3, gl, sm_scale=1.0, loss_coeff=coeff, block_I=128,
                  topk_indices_global=False, d_index_q=diqp, d_weights=dwp, d_index_k=dikp,
                  backend="default", workspace=wsc, deterministic=False)
        pt = time_call(prun, reps, time.perf_counter() - t0)
        diffs = {}
        if check:
            attn.copy_(tgt.unsqueeze(0))  # the reps left cuDNN's gradient of its gradient in there
            prun()
            sync()
            pad = max(diqp[0, :, H:].float().abs().max().item() if HP > H else 0.0,
                      dwp[0, :, H:].float().abs().max().item() if HP > H else 0.0)
            for det, (diq, dw, dik) in results.items():
                diffs[det] = dict(d_index_k=rel_diff(dikp[0], dik), d_index_q=rel_diff(diqp[0, :, :H], diq),
                                  d_weights=rel_diff(dwp[0, :, :H], dw), g=rel_diff(attn[0], g),
                                  pad_heads_max_abs=pad)
        for det, row in enumerate(rows):
            row["note"] += (f"; peer fed target a/rowsum(a) and softmax(z) over the valid slots, "
                            f"loss_coeff {coeff:.6g}, grad_loss 1, so its score gradient is libdsa's g "
                            f"(check 'g'); its reps overwrite attn_score in place (no restore inside the "
                            f"timing); peer d_weights bf16; peer workspace reused across calls")
            if det == 1:
                row["note"] += ("; peer: cuDNN's deterministic=True needs SM100/SM103, its "
                                "non-deterministic time")
            set_peer(row, name, pt, ws=wsb, check=diffs.get(det) if check else None)
        del wsc, plan
    except Exception as e:
        traceback.print_exc()
        for row in rows:
            set_peer(row, name, error=error_text(e))


# ------------------------------------------------------------------------------------------------
# --cpu-dry-run: cuDNN's two calls modelled on the CPU, their argument lists bound to the real ones
# ------------------------------------------------------------------------------------------------
FE_SIGS = [("score_recompute/api.py", "sparse_attn_score_recompute_wrapper", None),
           ("indexer_backward/api.py", "indexer_backward_wrapper", None),
           ("indexer_backward/api.py", "IndexerBackward", "__init__"),
           ("indexer_backward/api.py", "IndexerBackward", "execute")]


def fe_signatures(src):
    """inspect.Signature of each FE_SIGS entry, parsed (never imported) from the FE 1.32 sources: a
    wheel (zip) or an unpacked directory; src None: ~/.cache/dsa-peers/cudnn/nvidia_cudnn_frontend-*.whl.
    Literal defaults keep their values, others read as the string '<expr>'."""
    import ast
    if src is None:
        found = sorted(glob.glob(os.path.expanduser("~/.cache/dsa-peers/cudnn/nvidia_cudnn_frontend-*.whl")))
        if not found:
            return {}, "no FE wheel found"
        src = found[-1]

    def read(rel):
        path = "cudnn/deepseek_sparse_attention/" + rel
        if os.path.isdir(src):
            with open(os.path.join(src, path)) as fh:
                return fh.read()
        with zipfile.ZipFile(src) as z:
            return z.read(path).decode()
    sigs = {}
    for rel, name, method in FE_SIGS:
        tree = ast.parse(read(rel))
        node = next(n for n in tree.body if getattr(n, "name", None) == name)
        if method:
            node = next(n for n in node.body if getattr(n, "name", None) == method)
        a = node.args

        def dflt(d):
            try:
                return ast.literal_eval(d)
            except ValueError:
                return "<expr>"
        params = []
        pos = a.posonlyargs + a.args
        pd = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
        for i, (arg, d) in enumerate(zip(pos, pd)):
            if method and i == 0:
                continue  # self
            params.append(inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=inspect.Parameter.empty if d is None else dflt(d)))
        if a.vararg:
            params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
        for arg, d in zip(a.kwonlyargs, a.kw_defaults):
            params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY,
                                            default=inspect.Parameter.empty if d is None else dflt(d)))
        if a.kwarg:
            params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
        sigs[name + ("." + method if method else "")] = inspect.Signature(params)
    return sigs, src


CLIP_PROB_MIN = math.exp(-100.0)  # indexer_backward_sm90.py's clip of the target and the predict


class FakeIndexerBackward:
    """IndexerBackward's SM90 default path as read in indexer_backward_sm90.py, in torch on the CPU:
    kernel 1 (the score gradient, in place in attn_score), kernel 2 (dW, dQ, dK with dS rounded to
    bf16 before the two gradient GEMMs, dW stored bf16), the fp32 dK accumulator in the workspace."""

    def __init__(self, fake, *args, **kwargs):
        self.a = fake.bind("IndexerBackward.__init__", args, kwargs)
        a = self.a
        b, s_q, h, d = a["sample_index_q"].shape
        self.b, self.s_q, self.h, self.d = b, s_q, h, d
        self.s_k, self.topk = a["sample_index_k"].shape[1], a["sample_topk_indices"].shape[-1]
        self.checked = False

    def check_support(self):
        a = self.a
        assert self.h >= 64, "IndexerBackwardSm90: assert heads >= 64"
        assert self.topk % a["block_I"] == 0, "IndexerBackwardSm90: topk % block_I == 0"
        assert not a["deterministic"], "deterministic IndexerBackward requires SM100/SM103"
        for k in ("sample_index_q", "sample_weights", "sample_index_k", "sample_d_index_q", "sample_d_weights"):
            assert a[k].dtype == torch.bfloat16, f"{k} must be bf16"
        assert a["sample_d_index_k"].dtype in (torch.bfloat16, torch.float32)
        for k in ("sample_attn_score", "sample_index_score"):
            assert a[k].dtype == torch.float32 and tuple(a[k].shape) == (self.b, self.s_q, self.topk), k
        assert a["sample_topk_indices"].dtype == torch.int32
        assert tuple(a["sample_weights"].shape) == (self.b, self.s_q, self.h)
        assert tuple(a["sample_d_index_q"].shape) == tuple(a["sample_index_q"].shape)
        assert tuple(a["sample_d_weights"].shape) == tuple(a["sample_weights"].shape)
        assert tuple(a["sample_d_index_k"].shape) == tuple(a["sample_index_k"].shape)
        assert all(a[k].is_contiguous() for k in a if k.startswith("sample_")), "contiguous tensors"
        self.checked = True
        return True

    def compile(self):
        assert self.checked

    def scratch_workspace_bytes(self):
        n = self.b * self.s_k * self.d * 4
        return 0 if self.a["sample_d_index_k"].dtype == torch.float32 else -(-n // 128) * 128

    def execute(self, fake, *args, **kwargs):
        e = fake.bind("IndexerBackward.execute", args, kwargs)
        for k in ("index_q", "weights", "index_k", "d_index_q", "d_weights", "d_index_k", "attn_score",
                  "index_score", "topk_indices"):
            ref = self.a["sample_" + k]
            assert e[k].dtype == ref.dtype and e[k].shape == ref.shape and e[k].stride() == ref.stride(), k
        gl = e["grad_loss"]
        assert torch.is_tensor(gl) and gl.numel() == 1 and gl.dtype == torch.float32, "grad_loss"
        nws = self.scratch_workspace_bytes()
        assert nws == 0 or (e["workspace"] is not None and e["workspace"].numel() >= nws), "workspace"
        s = float(e["loss_coeff"]) / (self.b * self.s_q) * gl.item()
        att, pr = e["attn_score"], e["index_score"]
        gi = -att.clamp(min=CLIP_PROB_MIN) * (pr >= CLIP_PROB_MIN).float() * s  # kernel 1
        att.copy_(gi - pr * gi.sum(-1, keepdim=True))
        for bi in range(self.b):  # kernel 2 (sm_scale multiplies x, dK and dQ)
            sm = self.a["sm_scale"]
            q = e["index_q"][bi].float()
            k = e["index_k"][bi].float()
            ind = e["topk_indices"][bi].long()
            ok = (ind >= 0) & (ind < self.s_k)
            kg = torch.where(ok[..., None], k[ind.clamp(0, self.s_k - 1)], torch.zeros(()))
            x = torch.einsum("thd,tjd->thj", q, kg) * sm
            pos = x > 0
            gs = att[bi][:, None, :]
            w = e["weights"][bi].float()[:, :, None]
            ds = torch.where(pos, gs * w, torch.zeros(())).to(torch.bfloat16).float()
            e["d_weights"][bi].copy_(torch.where(pos, gs * x, torch.zeros(())).sum(-1))
            e["d_index_q"][bi].copy_(torch.einsum("thj,tjd->thd", ds, kg) * sm)
            contrib = (torch.einsum("thj,thd->tjd", ds, q) * sm)[ok]
            dk = torch.zeros(self.s_k, self.d).index_add_(0, ind[ok], contrib)
            e["d_index_k"][bi].copy_(dk)


class FakeDSA:
    """--cpu-dry-run's cudnn.DSA: each call's arguments are bound to the real signature (parsed
    from the FE sources) before its math runs."""

    def __init__(self, sigs):
        self.sigs = sigs
        self.calls = {}

    def bind(self, name, args, kwargs):
        b = self.sigs[name].bind(*args, **kwargs)
        b.apply_defaults()
        self.calls[name] = self.calls.get(name, 0) + 1
        return b.arguments

    def sparse_attn_score_recompute_wrapper(self, *args, **kwargs):
        """score_recompute/_interface_sm90.py's sparse_attn_score_recompute: P = exp(scale q.k - LSE)
        at each slot j < topk_length with a valid index, summed over the heads, L1-normalised."""
        a = self.bind("sparse_attn_score_recompute_wrapper", args, kwargs)
        q, k, lse, ind, out = a["q_attn"], a["k_attn"], a["lse"], a["topk_indices"], a["out"]
        b, s_q, h, d = q.shape
        s_k, topk = k.shape[1], ind.shape[-1]
        assert q.dtype == k.dtype == torch.bfloat16 and lse.dtype == torch.float32 and k.ndim == 3
        assert tuple(lse.shape) == (b, s_q, h) and ind.dtype == torch.int32 and ind.is_contiguous()
        assert a["qhead_per_kv_head"] in (None, h) and h > 1 and h % 64 == 0, "MQA, tile_m 64"
        assert topk % 128 == 0, "SM90 target kernel: topk_max // 128 elements per thread"
        assert out is not None and out.dtype == torch.float32 and tuple(out.shape) == (b, s_q, topk)
        assert out.is_contiguous()
        tl = a["topk_length"]
        for bi in range(b):
            ii = ind[bi].long()
            ok = (ii >= 0) & (ii < s_k)
            if tl is not None:
                assert tl.dtype == torch.int32 and tuple(tl.shape) == (b, s_q)
                ok &= torch.arange(topk)[None, :] < tl[bi].long()[:, None]
            kg = k[bi].double()[ii.clamp(0, s_k - 1)]
            sc = torch.einsum("thd,tjd->thj", q[bi].double(), kg) * a["softmax_scale"]
            p = torch.exp(sc - lse[bi].double()[:, :, None]).sum(1) * ok
            out[bi].copy_(p / (p.sum(1, keepdim=True) + 1e-10))
        return dict(target=out)

    def IndexerBackward(self, *args, **kwargs):
        plan = FakeIndexerBackward(self, *args, **kwargs)
        ex = plan.execute
        plan.execute = lambda *a, **k: ex(self, *a, **k)
        return plan

    def indexer_backward_wrapper(self, *args, **kwargs):
        a = self.bind("indexer_backward_wrapper", args, kwargs)
        a.update({k: torch.empty_like(a[r]) for k, r in (("d_index_q", "index_q"), ("d_weights", "weights"),
                                                         ("d_index_k", "index_k")) if a[k] is None})
        key = tuple((tuple(a[k].shape), a[k].dtype) for k in ("index_q", "weights", "index_k", "d_weights",
                                                               "d_index_k", "topk_indices"))
        key += (a["sm_scale"], a["block_I"], a["backend"], a["deterministic"])
        cache = self.__dict__.setdefault("bwd_cache", {})
        if key not in cache:
            assert a["backend"] == "default"
            plan = self.IndexerBackward(sample_index_q=a["index_q"], sample_weights=a["weights"],
                                        sample_index_k=a["index_k"], sample_d_index_q=a["d_index_q"],
                                        sample_d_weights=a["d_weights"], sample_d_index_k=a["d_index_k"],
                                        sample_attn_score=a["attn_score"], sample_index_score=a["index_score"],
                                        sample_topk_indices=a["topk_indices"], sm_scale=a["sm_scale"],
                                        block_I=a["block_I"], topk_indices_global=a["topk_indices_global"],
                                        backend=a["backend"], deterministic=a["deterministic"])
            assert plan.check_support()
            plan.compile()
            cache[key] = plan
        plan = cache[key]
        ws = a["workspace"]
        if ws is None and plan.scratch_workspace_bytes():
            ws = torch.empty(plan.scratch_workspace_bytes(), dtype=torch.uint8)
        plan.execute(a["index_q"], a["weights"], a["index_k"], a["d_index_q"], a["d_weights"], a["d_index_k"],
                     a["attn_score"], a["index_score"], a["topk_indices"], loss_coeff=a["loss_coeff"],
                     grad_loss=a["grad_loss"], current_stream=a["stream"], workspace=ws)
        return dict(d_index_q=a["d_index_q"], d_weights=a["d_weights"], d_index_k=a["d_index_k"])


def cpu_dry_run(a, sel):
    """The train section on tiny sizes on the CPU (see the header); returns the exit status."""
    global DEV, FE
    DEV = "cpu"
    sigs, src = fe_signatures(a.fe_src)
    if len(sigs) != len(FE_SIGS):
        log(f"cannot read cuDNN FE's signatures ({src}): pass --fe-src WHEEL_OR_DIR")
        return 1
    FE = "cuDNN FE (CPU model)"
    fake = FakeDSA(sigs)
    lib = D.Lib(a.lib)
    RUN.update(lib=lib, ctx=None, stream=None, reps=a.reps or 1, card="cpu (dry run)", commit=commit_id(),
               date=datetime.date.today().isoformat(), fe_dsa=fake, gemm_tflops=None, copy_gbps=None,
               out=a.out or "/tmp/cudnn_peer_cpu_dry_run.json")
    log(f"CPU dry run: libdsa {lib.version} ({a.lib}) references, cuDNN's calls bound to the signatures "
        f"of {src}")
    shapes = [dict(s, **DRY_SIZES[s["name"]]) for s in SHAPES if s["op"] == "train" and s["name"] in sel]
    if not shapes:
        log("--cpu-dry-run runs the train-* shapes only")
        return 1
    for sh in shapes:
        log(f"=== {sh['name']} (CPU sizes T={sh['T']} S={sh['S']} K={sh['K']})")
        bench_train(sh, True)
    print_table()
    bad = [f"{r['shape']} {r['op']} {r['variant']}: {r['status']} / peer {r['peer_status']}"
           for r in ROWS if r["status"] != "ok" or r["peer_status"] != "ok"]
    for r in ROWS:
        chk = r.get("peer_max_rel_diff")
        vals = chk.items() if isinstance(chk, dict) else [("peer_max_rel_diff", chk)]
        for k, v in vals:
            if not isinstance(v, float) or not v <= 3e-2:
                bad.append(f"{r['shape']} {r['op']} {r['variant']}: {k} = {v}")
    log(f"calls bound to cuDNN's signatures: {fake.calls}")
    log(f"wrote {RUN['out']} ({len(ROWS)} rows)")
    if bad:
        log("CPU dry run FAILED:\n  " + "\n  ".join(bad))
        return 1
    log("CPU dry run passed")
    return 0


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------
def quick_shape(sh):
    """--quick: the same code paths on small sizes (K stays 2048, so cuDNN compiles the same kernels)."""
    sh = dict(sh)
    if sh["op"] == "bwd":
        sh["T"], sh["S"] = 512, max(sh["S"] // 8, 2 * sh["K"])
    elif sh["op"] in ("idx", "train"):
        sh["T"], sh["S"] = sh["T"] // 8, max(sh["S"] // 8, 2 * sh["K"])
    else:
        sh["T"], sh["S"] = 512, sh["S"] // 8
    return sh


def commit_id():
    env = os.environ.get("DSA_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def print_table():
    log(f"\n{'shape':<14} {'op':<13} {'variant':<16} {'ms':>8} {'rate':>8} {'unit':<7} {'peer_ms':>8} "
        f"{'x peer':>7} {'compile':>7}  peer / check / status")
    for r in ROWS:
        f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) and v is not None else "-"
        rate = r["tflops"] if r["unit"] == "TFLOP/s" else r["gbps"]
        chk = r.get("peer_max_rel_diff", r.get("peer_agreement"))
        if isinstance(chk, dict):
            chk = " ".join(f"{k}={v:.2g}" if isinstance(v, float) else f"{k}={v}" for k, v in chk.items())
        log(f"{r['shape']:<14} {r['op']:<13} {r['variant']:<16} {f(r['ms'], '%.3f'):>8} {f(rate, '%.1f'):>8} "
            f"{r['unit']:<7} {f(r['peer_ms'], '%.3f'):>8} {f(r['peer_ratio'], '%.2fx'):>7} "
            f"{f(r['peer_compile_s'], '%.1fs'):>7}  {r['peer'] or '-'} | {chk or '-'} | "
            f"{r['status']}{'' if r['peer_status'] == 'ok' else ' / peer: ' + r['peer_status']}")
    if RUN.get("gemm_tflops") is not None:
        log(f"ceilings (same run): bf16 GEMM 8192^3 {RUN['gemm_tflops']:.1f} TFLOP/s, D2D copy "
            f"{RUN['copy_gbps']:.1f} GB/s; card {RUN['card']}, commit {RUN['commit']}")
    log("x peer = peer_ms / ms (> 1: libdsa faster); compile = the peer's first call (host, synced)")


def main():
    global torch, FE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libdsa.so")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/DATE-CARD-cudnn-peer.json)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (see --list), or all: "
                    "every shape, the opt-in train-* ones included")
    ap.add_argument("--reps", type=int, default=None, help="reps per implementation (default 20; "
                    "--cpu-dry-run: 1)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--skip-check", action="store_true", help="no comparison of the outputs")
    ap.add_argument("--quick", action="store_true", help="small sizes, to validate the pipeline")
    ap.add_argument("--self-test", action="store_true", help="CPU only: the ctypes binding vs dsa_ref_*")
    ap.add_argument("--cpu-dry-run", action="store_true", help="CPU only: the train-* section on tiny sizes "
                    "with dsa_ref_* and a CPU model of cuDNN's calls (see the header)")
    ap.add_argument("--fe-src", default=None, help="--cpu-dry-run: cuDNN FE 1.32's wheel or unpacked "
                    "directory, for the real signatures (default ~/.cache/dsa-peers/cudnn/*.whl)")
    a = ap.parse_args()
    if a.list:
        for sh in SHAPES:
            log(f"{sh['name']:<14} {OP_NAMES[sh['op']]:<13} " +
                " ".join(f"{k}={v}" for k, v in sh.items() if k not in ("name", "op", "opt_in")) +
                ("  (opt-in: --shapes all, or by name; not in the default run)" if sh.get("opt_in") else ""))
        return 0
    if a.self_test:
        D._self_test(a.lib)
        return 0
    if a.reps is not None and a.reps < 1:
        ap.error("--reps must be >= 1")
    names = [s["name"] for s in SHAPES]
    default = [s["name"] for s in SHAPES if not s.get("opt_in")]  # the train-* shapes: --shapes only
    sel = default if not a.shapes else names if a.shapes == "all" else [s for s in a.shapes.split(",") if s]
    bad = [s for s in sel if s not in names]
    if bad:
        ap.error(f"unknown shape(s) {bad}; see --list")
    if a.cpu_dry_run:
        import torch as _torch
        torch = _torch
        return cpu_dry_run(a, sel if a.shapes and a.shapes != "all" else [s["name"] for s in SHAPES if s["op"] == "train"])
    a.reps = a.reps or 20
    shapes = [quick_shape(s) if a.quick else s for s in SHAPES if s["name"] in sel]

    import torch as _torch
    torch = _torch
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to benchmark")
        return 0
    torch.cuda.init()
    try:
        import cudnn
        FE = f"cuDNN FE {getattr(cudnn, '__version__', '?')}"
    except Exception as e:
        log(f"warning: import cudnn failed ({error_text(e)}): the peer rows will carry the error")
    # libdsa is loaded after torch on purpose: its NEEDED libcudart.so.13 / libcublas.so.13 then
    # resolve to the copies torch already loaded (same sonames), whatever LD_LIBRARY_PATH says.
    try:
        lib = D.Lib(a.lib)
    except OSError as e:
        log(f"cannot load {a.lib}: {e}\n(build it with make build/libdsa.so; if a CUDA library is "
            "missing, add /usr/local/cuda/lib64 to LD_LIBRARY_PATH)")
        return 1
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
    RUN.update(lib=lib, ctx=lib.context_create(0), stream=torch.cuda.current_stream().cuda_stream,
               reps=a.reps, card=torch.cuda.get_device_name(0), commit=commit_id(),
               date=datetime.date.today().isoformat(),
               flush=torch.empty(2 * l2, dtype=torch.uint8, device=DEV))
    if os.environ.get("DSA_TRAIN_KERNEL"):  # DSA_OPTION_TRAIN_KERNEL (13): 0 auto, 1 portable, 2 sm_90a
        v = int(os.environ["DSA_TRAIN_KERNEL"])
        lib.check(lib.so.dsa_context_set_option(RUN["ctx"], 13, v), "dsa_context_set_option")
        log(f"DSA_OPTION_TRAIN_KERNEL {v} (DSA_TRAIN_KERNEL)")
    card_file = RUN["card"].replace(" ", "-").replace("/", "-")
    RUN["out"] = a.out or f"bench/results/{RUN['date']}-{card_file}-cudnn-peer.json"
    os.makedirs(os.path.dirname(os.path.abspath(RUN["out"])), exist_ok=True)
    RUN["cycles_per_ms"] = calibrate_spin()
    log(f"libdsa {lib.version} ({a.lib}) vs {FE}, torch {torch.__version__}, on {RUN['card']}, "
        f"commit {RUN['commit']}, {a.reps} reps (median), L2 flush {2 * l2 / 2**20:.0f} MiB, "
        f"spin {RUN['cycles_per_ms'] / 1e6:.2f} Mcycles/ms{', QUICK sizes' if a.quick else ''}")
    log("ceilings: ", end="")
    RUN["gemm_tflops"], RUN["copy_gbps"] = measure_ceilings(a.reps)
    log(f"bf16 GEMM 8192^3 {RUN['gemm_tflops']:.1f} TFLOP/s, D2D copy {RUN['copy_gbps']:.1f} GB/s")

    t0 = time.perf_counter()
    for i, sh in enumerate(shapes):
        log(f"=== [{i + 1}/{len(shapes)}] {sh['name']} ({time.perf_counter() - t0:.0f} s so far)")
        try:
            {"bwd": bench_bwd, "idx": bench_idx, "topk": bench_topk,
             "train": bench_train}[sh["op"]](sh, not a.skip_check)
        except Exception as e:  # inputs or the libdsa forward failed: one row says so
            traceback.print_exc()
            add_row(sh, "setup", 0.0, sh["op"] == "topk", "", status=error_text(e))
        gc.collect()
        try:
            sync()
            torch.cuda.empty_cache()
        except Exception as e:
            log(f"the CUDA context is broken ({error_text(e)}): stopping; rerun the rest with --shapes")
            break
    print_table()
    log(f"wrote {RUN['out']} ({len(ROWS)} rows) in {time.perf_counter() - t0:.0f} s")
    lib.so.dsa_context_destroy(RUN["ctx"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
