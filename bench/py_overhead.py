"""py_overhead.py - host time per call of the PyTorch ops against the C API underneath them.

    python3 bench/py_overhead.py [--device cpu|cuda] [--calls N]

For each op, on zero-size work (T = 0: libdsa validates and returns; no kernel, no reference work),
so the time is the host path alone: (a) the C entry point called through ctypes with a params
struct built once (the floor: what a C caller pays plus one ctypes call), (b) the same call with the
struct filled per call from tensors, (c) the torch custom op end to end (dispatch, argument checks,
output allocation, struct, call). Median over N calls, microseconds.
"""
import argparse
import ctypes as C
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402

import libdsa  # noqa: E402
from libdsa import _capi as D  # noqa: E402
from libdsa import ops  # noqa: E402


def median_us(fn, calls):
    for _ in range(min(100, calls)):
        fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    dev = torch.device(a.device)
    lib = libdsa.library()
    T, H, Dh, Tkv, K = 0, 64, 576, 16, 64
    q = torch.zeros(T, H, Dh, dtype=torch.bfloat16, device=dev)
    kv = torch.zeros(Tkv, Dh, dtype=torch.bfloat16, device=dev)
    idx = torch.zeros(T, K, dtype=torch.int32, device=dev)
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)

    def fill():
        return D.AttnFwdParams(num_tokens=T, num_heads=H, head_dim=Dh, num_kv=Tkv, topk=K, softmax_scale=0.04,
                               q=q.data_ptr(), kv=kv.data_ptr(), indices=idx.data_ptr(), out=out.data_ptr(),
                               lse=lse.data_ptr())

    p = fill()
    if dev.type == "cuda":
        ctx, stream = ops._ctx_stream(dev)
        c_fixed = lambda: lib.so.dsa_sparse_attn_fwd(ctx, C.byref(p), stream)
        c_filled = lambda: lib.so.dsa_sparse_attn_fwd(ctx, C.byref(fill()), stream)
    else:
        c_fixed = lambda: lib.so.dsa_ref_sparse_attn_fwd(C.byref(p))
        c_filled = lambda: lib.so.dsa_ref_sparse_attn_fwd(C.byref(fill()))
    assert c_fixed() == 0
    op = lambda: libdsa.sparse_attention(q, kv, idx, 0.04)
    rows = [("sparse fwd: C API through ctypes, struct built once", median_us(c_fixed, a.calls)),
            ("sparse fwd: C API through ctypes, struct filled per call", median_us(c_filled, a.calls)),
            ("sparse fwd: torch op libdsa.sparse_attention", median_us(op, a.calls))]
    qg = q.clone().requires_grad_()
    rows.append(("sparse fwd + autograd record: torch op on a q that requires grad",
                 median_us(lambda: libdsa.sparse_attention(qg, kv, idx, 0.04), a.calls)))
    print(f"libdsa {libdsa.version()}, torch {torch.__version__}, device {dev}, "
          f"{a.calls} calls each, zero-size work (host path only), median:")
    for name, us in rows:
        print(f"  {us:8.2f} us  {name}")


if __name__ == "__main__":
    main()
