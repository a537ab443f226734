#!/usr/bin/env python3
"""cudnn_peer.py - libdsa and cuDNN Frontend (and torch.topk) in ONE process on the SAME inputs.

Issue 16: a ratio is only a same-run ratio. This program loads build/libdsa.so with ctypes
(bench/dsa_ctypes.py) and times libdsa and its peers on the same torch CUDA tensors:

  sparse bwd    libdsa dsa_sparse_attn_bwd det0 / det1  vs  cuDNN FE SparseAttentionBackward (SM90);
                bwd-tp-h16 also against cuDNN on q padded to 64 heads (zero heads, -inf sinks)
  indexer+topk  libdsa dsa_indexer_topk (engine DEFAULT)  vs  cuDNN indexer_forward_wrapper + IndexerTopK
  topk          libdsa dsa_topk  vs  cuDNN IndexerTopK (deterministic False and True; causal lengths)
                and vs torch.topk (full rows)

Timing, the same for every implementation: one warm-up call (for cuDNN it compiles: its host time,
synchronised, is "peer_compile_s"), one untimed probe call (its host time sizes the spin), then
per rep: write an L2 flush buffer (2 x L2), queue a GPU spin (torch.cuda._sleep, >= 1 ms) so the
host work of the call happens while the GPU is busy, record an event, call, record an event.
Each implementation runs its own loop of reps (alternating them rep by rep biases the result).
Median of --reps. Ceilings in the same process: bf16 GEMM 8192^3 (torch.matmul) and a 1 GiB
device-to-device copy (read + write bytes).

Rows follow dsa_bench's JSON schema plus: process, peer_same_run, peer_compile_s,
peer_max_rel_diff / peer_agreement, peer_workspace_bytes, workspace_bytes, peer_status,
first_call_s, host_ms, peer_host_ms, spin_ms. The file is rewritten after every row.

  python3 bench/cudnn_peer.py [--lib build/libdsa.so] [--out FILE] [--shapes a,b] [--reps N]
                              [--quick] [--skip-check] [--list] [--self-test]
"""
import argparse
import ctypes as C
import datetime
import gc
import json
import math
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsa_ctypes as D  # noqa: E402

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
]
OP_NAMES = {"bwd": "sparse bwd", "idx": "indexer+topk", "topk": "topk"}
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


def add_row(sh, variant, work, is_bytes, note, t=None, status="ok", ws=None):
    """A libdsa row (t: time_call's dict, None when libdsa failed); the peer is filled later."""
    ms = t["ms"] if t else None
    rate = work / (ms * 1e-3) / (1e9 if is_bytes else 1e12) if ms else None
    ceil = RUN["copy_gbps"] if is_bytes else RUN["gemm_tflops"]
    row = dict(shape=sh["name"], op=OP_NAMES[sh["op"]], variant=variant, ms=ms,
               tflops=None if is_bytes else rate, gbps=rate if is_bytes else None,
               unit="GB/s" if is_bytes else "TFLOP/s", work=work,
               ceiling_ratio=rate / ceil if rate and ceil else None,
               gemm_ceiling_tflops=RUN["gemm_tflops"], copy_ceiling_gbps=RUN["copy_gbps"],
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
    log(f"  libdsa {sh['name']} {variant}: {msg}")
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
        scale, slots = 576 ** -0.5, float(T * K)
        note = "random distinct indices (unsorted), random sink, scale 576^-0.5"
    else:
        idx, lengths = causal_indices(T, S, K, gen)
        sink = None  # libdsa: no sink; cuDNN requires one: -inf
        scale, slots = 0.0625, float(lengths.double().sum().item())
        note = "random causal indices (torch), topk_length, no sink (cuDNN: -inf), scale 0.0625"
    out, lse = dsa_fwd(q, kv, idx, lengths, sink, scale, K)
    note += "; out, lse from dsa_sparse_attn_fwd"
    log("done")
    work = 2.0 * H * slots * 2752
    lib, ctx, stream = RUN["lib"], RUN["ctx"], RUN["stream"]

    rows, results = [], {}
    for det in (0, 1):
        variant = f"det{det}"
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

    if H < 64 and 0 in results:
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
# Driver
# ------------------------------------------------------------------------------------------------
def quick_shape(sh):
    """--quick: the same code paths on small sizes (K stays 2048, so cuDNN compiles the same kernels)."""
    sh = dict(sh)
    if sh["op"] == "bwd":
        sh["T"], sh["S"] = 512, max(sh["S"] // 8, 2 * sh["K"])
    elif sh["op"] == "idx":
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
    log(f"\n{'shape':<14} {'variant':<16} {'ms':>8} {'rate':>8} {'unit':<7} {'peer_ms':>8} "
        f"{'x peer':>7} {'compile':>7}  peer / check / status")
    for r in ROWS:
        f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) and v is not None else "-"
        rate = r["tflops"] if r["unit"] == "TFLOP/s" else r["gbps"]
        chk = r.get("peer_max_rel_diff", r.get("peer_agreement"))
        if isinstance(chk, dict):
            chk = " ".join(f"{k}={v:.2g}" if isinstance(v, float) else f"{k}={v}" for k, v in chk.items())
        log(f"{r['shape']:<14} {r['variant']:<16} {f(r['ms'], '%.3f'):>8} {f(rate, '%.1f'):>8} "
            f"{r['unit']:<7} {f(r['peer_ms'], '%.3f'):>8} {f(r['peer_ratio'], '%.2fx'):>7} "
            f"{f(r['peer_compile_s'], '%.1fs'):>7}  {r['peer'] or '-'} | {chk or '-'} | "
            f"{r['status']}{'' if r['peer_status'] == 'ok' else ' / peer: ' + r['peer_status']}")
    log(f"ceilings (same run): bf16 GEMM 8192^3 {RUN['gemm_tflops']:.1f} TFLOP/s, D2D copy "
        f"{RUN['copy_gbps']:.1f} GB/s; card {RUN['card']}, commit {RUN['commit']}")
    log("x peer = peer_ms / ms (> 1: libdsa faster); compile = the peer's first call (host, synced)")


def main():
    global torch, FE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libdsa.so")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/DATE-CARD-cudnn-peer.json)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (see --list)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--skip-check", action="store_true", help="no comparison of the outputs")
    ap.add_argument("--quick", action="store_true", help="small sizes, to validate the pipeline")
    ap.add_argument("--self-test", action="store_true", help="CPU only: the ctypes binding vs dsa_ref_*")
    a = ap.parse_args()
    if a.list:
        for sh in SHAPES:
            log(f"{sh['name']:<14} {OP_NAMES[sh['op']]:<13} " +
                " ".join(f"{k}={v}" for k, v in sh.items() if k not in ("name", "op")))
        return 0
    if a.self_test:
        D._self_test(a.lib)
        return 0
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    names = [s["name"] for s in SHAPES]
    sel = names if not a.shapes else [s for s in a.shapes.split(",") if s]
    bad = [s for s in sel if s not in names]
    if bad:
        ap.error(f"unknown shape(s) {bad}; see --list")
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
            {"bwd": bench_bwd, "idx": bench_idx, "topk": bench_topk}[sh["op"]](sh, not a.skip_check)
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
