"""ops.py - libdsa's ops as torch custom ops (torch.library), with fake implementations for
torch.compile and autograd for the sparse attention.

Every op runs on the tensors' device: CUDA tensors go to libdsa's GPU kernels on the current stream
(one libdsa context per device, made on first use; workspaces from torch's allocator), CPU tensors
to libdsa's CPU reference (dsa_ref_*: exact, double accumulation, slow by design; what the tests
compare against). Errors raise libdsa's message: DSAInvalidArgument (a ValueError) for bad
arguments, DSAUnsupported for a device or configuration libdsa does not run, DSAError otherwise.

Tensor conventions are libdsa's (docs/contract.md): bf16 q [T, H, 576] (or 512), kv [T_kv, 576] or
[T_kv, 1, 576], int32 indices [T, K] or [T, 1, K] in global storage rows with -1 (or any row outside
[0, T_kv)) for an invalid slot, optional int32 topk_length [T], fp32 sink [H]. Inner dimensions must
be contiguous; token and head strides may be anything libdsa accepts.
"""
import ctypes as C
import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _capi as D
from ._loader import library, require_cuda

_contexts = {}


def _ptr(t: Optional[Tensor]):
    return None if t is None else t.data_ptr()


def _ctx_stream(device: torch.device):
    """The libdsa context of a CUDA device and torch's current stream on it. Before the first context,
    raises DSAUnsupported when the CUDA runtime or driver cannot run libdsa's CUDA ops
    (_loader.cuda_problem), ahead of anything torch.cuda would say."""
    if not _contexts:
        require_cuda(library())
    idx = device.index if device.index is not None else torch.cuda.current_device()
    ctx = _contexts.get(idx)
    if ctx is None:
        ctx = library().context_create(idx)
        _contexts[idx] = ctx
    return ctx, C.c_void_p(torch.cuda.current_stream(idx).cuda_stream)


def _run(name, p, device, workspace=False):
    """Op `name` (dsa_...) on p: on a CUDA device through its context and torch's current stream (a
    workspace op by size query, torch allocation, run: _two_phase), else its CPU reference dsa_ref_..."""
    lib = library()
    if device.type == "cuda":
        ctx, stream = _ctx_stream(device)
        fn = getattr(lib.so, name)
        if workspace:
            _two_phase(lib, fn, name, ctx, p, stream, device)
        else:
            lib.check(fn(ctx, C.byref(p), stream), name)
    else:
        ref = "dsa_ref_" + name[len("dsa_"):]
        lib.check(getattr(lib.so, ref)(C.byref(p)), ref)


def _two_phase(lib, fn, name, ctx, p, stream, device):
    """A GPU op with a workspace: size query, torch allocation, run."""
    n = C.c_size_t(0)
    lib.check(fn(ctx, C.byref(p), None, C.byref(n), stream), f"{name} (workspace size)")
    ws = torch.empty(n.value, dtype=torch.uint8, device=device)
    lib.check(fn(ctx, C.byref(p), C.c_void_p(ws.data_ptr()), C.byref(n), stream), name)


def _require(cond: bool, what: str):
    if not cond:
        raise D.DSAInvalidArgument(what, D.DSA_ERROR_INVALID_ARGUMENT)


def _inner_contiguous(t: Tensor) -> Tensor:
    return t if t.dim() == 0 or t.stride(-1) == 1 else t.contiguous()


def _dtype(t: Optional[Tensor], dtype: torch.dtype, name: str, fn: str):
    _require(t is None or t.dtype == dtype, f"{fn}: {name} must be {dtype}, got {t.dtype if t is not None else None}")


def _shape(t: Optional[Tensor], expect: tuple, name: str, fn: str):
    """t is None or has the shape expect (None: any extent there). The C API sees pointers and
    strides only: an operand shorter than the sizes the op reads would be read past its end."""
    ok = t is None or (t.dim() == len(expect) and all(e is None or n == e for n, e in zip(t.shape, expect)))
    want = "[" + ", ".join("*" if e is None else str(e) for e in expect) + "]"
    _require(ok, f"{fn}: {name} must be {want}, got {tuple(t.shape) if t is not None else None}")


def _same_device(fn: str, ref: Tensor, **tensors):
    for name, t in tensors.items():
        _require(t is None or t.device == ref.device, f"{fn}: {name} is on {t.device if t is not None else ''}, "
                 f"q on {ref.device}")


def _kv2d(kv: Tensor) -> Tensor:
    _require(kv.dim() in (2, 3) and (kv.dim() == 2 or kv.shape[1] == 1),
             f"kv must be [T_kv, D] or [T_kv, 1, D], got {tuple(kv.shape)}")
    return _inner_contiguous(kv.reshape(kv.shape[0], kv.shape[-1]))


def _idx2d(indices: Tensor, T: int) -> Tensor:
    _require(indices.dim() in (2, 3) and indices.shape[0] == T and (indices.dim() == 2 or indices.shape[1] == 1),
             f"indices must be [T, K] or [T, 1, K] with T = {T}, got {tuple(indices.shape)}")
    return _inner_contiguous(indices.reshape(T, indices.shape[-1]))


def _attn_checks(fn, q, kv, indices, topk_length, sink):
    _require(q.dim() == 3, f"{fn}: q must be [T, H, D], got {tuple(q.shape)}")
    _dtype(q, torch.bfloat16, "q", fn)
    _dtype(kv, torch.bfloat16, "kv", fn)
    _dtype(indices, torch.int32, "indices", fn)
    _dtype(topk_length, torch.int32, "topk_length", fn)
    _dtype(sink, torch.float32, "sink", fn)
    _same_device(fn, q, kv=kv, indices=indices, topk_length=topk_length, sink=sink)
    T, H, Dh = q.shape
    _require(kv.shape[-1] == Dh, f"{fn}: kv's last dimension must be q's head dim {Dh}, got {tuple(kv.shape)}")
    _shape(topk_length, (T,), "topk_length", fn)
    _shape(sink, (H,), "sink", fn)


# ---- sparse attention ---------------------------------------------------------------------------
@torch.library.custom_op("libdsa::sparse_attn_fwd", mutates_args=())
def sparse_attn_fwd(q: Tensor, kv: Tensor, indices: Tensor, topk_length: Optional[Tensor],
                    sink: Optional[Tensor], softmax_scale: float,
                    deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """out [T, H, 512] bf16, lse [T, H] fp32 (natural log, sink excluded), max_logits [T, H] fp32.
    `deterministic` is the backward's mode (the forward is always deterministic)."""
    fn = "libdsa.sparse_attention"
    _attn_checks(fn, q, kv, indices, topk_length, sink)
    q = _inner_contiguous(q)
    T, H, Dh = q.shape
    kv2, idx = _kv2d(kv), _idx2d(indices, T)
    tl = None if topk_length is None else topk_length.contiguous()
    sk = None if sink is None else sink.contiguous()
    out = q.new_empty(T, H, 512)
    lse = q.new_empty(T, H, dtype=torch.float32)
    ml = q.new_empty(T, H, dtype=torch.float32)
    p = D.AttnFwdParams(num_tokens=T, num_heads=H, head_dim=Dh, num_kv=kv2.shape[0], topk=idx.shape[1],
                        softmax_scale=softmax_scale, q=q.data_ptr(), q_stride_token=q.stride(0),
                        q_stride_head=q.stride(1), kv=kv2.data_ptr(), kv_stride=kv2.stride(0),
                        indices=idx.data_ptr(), indices_stride=idx.stride(0), topk_length=_ptr(tl),
                        sink=_ptr(sk), out=out.data_ptr(), lse=lse.data_ptr(), max_logits=ml.data_ptr())
    _run("dsa_sparse_attn_fwd", p, q.device)
    return out, lse, ml


@sparse_attn_fwd.register_fake
def _(q, kv, indices, topk_length, sink, softmax_scale, deterministic):
    T, H, _ = q.shape
    return (q.new_empty(T, H, 512), q.new_empty(T, H, dtype=torch.float32),
            q.new_empty(T, H, dtype=torch.float32))


@torch.library.custom_op("libdsa::sparse_attn_bwd", mutates_args=())
def sparse_attn_bwd(q: Tensor, kv: Tensor, indices: Tensor, topk_length: Optional[Tensor],
                    sink: Optional[Tensor], out: Tensor, dout: Tensor, lse: Tensor,
                    softmax_scale: float, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """dq [T, H, D] bf16, dkv [T_kv, D] bf16, dsink [H] fp32 (0 without a sink)."""
    fn = "libdsa.sparse_attention (backward)"
    _attn_checks(fn, q, kv, indices, topk_length, sink)
    _dtype(out, torch.bfloat16, "out", fn)
    _dtype(dout, torch.bfloat16, "dout", fn)
    _dtype(lse, torch.float32, "lse", fn)
    _shape(out, (q.shape[0], q.shape[1], 512), "out", fn)
    _shape(dout, (q.shape[0], q.shape[1], 512), "dout", fn)
    _shape(lse, (q.shape[0], q.shape[1]), "lse", fn)
    _same_device(fn, q, out=out, dout=dout, lse=lse)
    q, out, dout = _inner_contiguous(q), _inner_contiguous(out), _inner_contiguous(dout)
    lse = lse.contiguous()
    T, H, Dh = q.shape
    kv2, idx = _kv2d(kv), _idx2d(indices, T)
    tl = None if topk_length is None else topk_length.contiguous()
    sk = None if sink is None else sink.contiguous()
    dq = q.new_empty(T, H, Dh)
    dkv = kv2.new_empty(kv2.shape[0], Dh)
    dsink = q.new_empty(H, dtype=torch.float32)
    p = D.AttnBwdParams(num_tokens=T, num_heads=H, head_dim=Dh, num_kv=kv2.shape[0], topk=idx.shape[1],
                        softmax_scale=softmax_scale, deterministic=int(deterministic), q=q.data_ptr(),
                        q_stride_token=q.stride(0), q_stride_head=q.stride(1), kv=kv2.data_ptr(),
                        kv_stride=kv2.stride(0), indices=idx.data_ptr(), indices_stride=idx.stride(0),
                        topk_length=_ptr(tl), sink=_ptr(sk), out=out.data_ptr(),
                        out_stride_token=out.stride(0), out_stride_head=out.stride(1),
                        dout=dout.data_ptr(), dout_stride_token=dout.stride(0),
                        dout_stride_head=dout.stride(1), lse=lse.data_ptr(), dq=dq.data_ptr(),
                        dkv=dkv.data_ptr(), dsink=dsink.data_ptr())
    _run("dsa_sparse_attn_bwd", p, q.device, workspace=True)
    return dq, dkv, dsink


@sparse_attn_bwd.register_fake
def _(q, kv, indices, topk_length, sink, out, dout, lse, softmax_scale, deterministic):
    T, H, Dh = q.shape
    return q.new_empty(T, H, Dh), kv.new_empty(kv.shape[0], kv.shape[-1]), q.new_empty(H, dtype=torch.float32)


def _attn_setup_context(ctx, inputs, output):
    q, kv, indices, topk_length, sink, softmax_scale, deterministic = inputs
    out, lse, ml = output
    ctx.save_for_backward(q, kv, indices, topk_length, sink, out, lse)
    ctx.softmax_scale, ctx.deterministic, ctx.kv_shape = softmax_scale, deterministic, kv.shape
    ctx.mark_non_differentiable(lse, ml)


def _attn_backward(ctx, dout, dlse, dml):
    q, kv, indices, topk_length, sink, out, lse = ctx.saved_tensors
    dq, dkv, dsink = sparse_attn_bwd(q, kv, indices, topk_length, sink, out, dout, lse,
                                     ctx.softmax_scale, ctx.deterministic)
    return dq, dkv.reshape(ctx.kv_shape), None, None, (dsink if sink is not None else None), None, None


torch.library.register_autograd("libdsa::sparse_attn_fwd", _attn_backward, setup_context=_attn_setup_context)


# ---- indexer top-k, top-k, compaction, head padding ---------------------------------------------
_plans = weakref.WeakValueDictionary()  # id -> Plan, for the indexer op (it takes the plan by id)


@torch.library.custom_op("libdsa::indexer_topk", mutates_args=())
def indexer_topk_op(index_q: Tensor, index_k: Tensor, weights: Tensor, plan_id: int, topk: int,
                    engine: int) -> Tuple[Tensor, Tensor]:
    """indices [T_q, K] int32 (ascending valid prefix in global storage rows, then -1), lengths [T_q]."""
    fn = "libdsa.indexer_topk"
    plan = _plans.get(plan_id)
    _require(plan is not None, f"{fn}: plan {plan_id} no longer exists")
    _dtype(index_q, torch.bfloat16, "index_q", fn)
    _dtype(index_k, torch.bfloat16, "index_k", fn)
    _require(weights.dtype in (torch.float32, torch.bfloat16), f"{fn}: weights must be float32 or bfloat16")
    _require(index_q.dim() == 3 and index_k.dim() == 2 and weights.dim() == 2,
             f"{fn}: index_q [T_q, H, 128], index_k [T_k, 128], weights [T_q, H] expected")
    _same_device(fn, index_q, index_k=index_k, weights=weights)
    _shape(index_q, (plan.num_queries, None, 128), "index_q (rows: the plan's queries)", fn)
    _shape(index_k, (plan.total_key_tokens, 128), "index_k (rows: the plan's total_key_tokens)", fn)
    _shape(weights, (index_q.shape[0], index_q.shape[1]), "weights", fn)
    q, k, w = _inner_contiguous(index_q), _inner_contiguous(index_k), _inner_contiguous(weights)
    Tq = q.shape[0]
    indices = q.new_empty(Tq, topk, dtype=torch.int32)
    lengths = q.new_empty(Tq, dtype=torch.int32)
    view = plan._view_for(q.device)
    p = D.IndexerParams(plan=C.addressof(view), num_heads=q.shape[1], topk=topk, index_q=q.data_ptr(),
                        q_stride_token=q.stride(0), q_stride_head=q.stride(1), index_k=k.data_ptr(),
                        k_stride=k.stride(0), weights=w.data_ptr(),
                        weights_dtype=D.DSA_DTYPE_F32 if w.dtype == torch.float32 else D.DSA_DTYPE_BF16,
                        weights_stride=w.stride(0), indices=indices.data_ptr(),
                        lengths=lengths.data_ptr(), engine=engine)
    _run("dsa_indexer_topk", p, q.device, workspace=True)
    return indices, lengths


@indexer_topk_op.register_fake
def _(index_q, index_k, weights, plan_id, topk, engine):
    Tq = index_q.shape[0]
    return index_q.new_empty(Tq, topk, dtype=torch.int32), index_q.new_empty(Tq, dtype=torch.int32)


@torch.library.custom_op("libdsa::topk", mutates_args=())
def topk_op(scores: Tensor, lengths: Optional[Tensor], k: int) -> Tensor:
    """indices [rows, k] int32: the k best columns of each row (score descending, smaller column on
    ties, NaN lowest), written ascending, then -1."""
    fn = "libdsa.topk"
    _dtype(scores, torch.float32, "scores", fn)
    _dtype(lengths, torch.int32, "lengths", fn)
    _require(scores.dim() == 2, f"{fn}: scores must be [rows, columns]")
    _shape(lengths, (scores.shape[0],), "lengths", fn)
    _same_device(fn, scores, lengths=lengths)
    s = _inner_contiguous(scores)
    ln = None if lengths is None else lengths.contiguous()
    out = s.new_empty(s.shape[0], k, dtype=torch.int32)
    p = D.TopkParams(rows=s.shape[0], columns=s.shape[1], k=k, scores=s.data_ptr(), scores_stride=s.stride(0),
                     lengths=_ptr(ln), indices=out.data_ptr())
    _run("dsa_topk", p, s.device, workspace=True)
    return out


@topk_op.register_fake
def _(scores, lengths, k):
    return scores.new_empty(scores.shape[0], k, dtype=torch.int32)


@torch.library.custom_op("libdsa::compact_indices", mutates_args=())
def compact_indices_op(indices: Tensor, key_count: int) -> Tuple[Tensor, Tensor]:
    """Per row: entries in [0, key_count) kept (duplicates too), sorted ascending, then -1; lengths."""
    fn = "libdsa.compact_indices"
    _dtype(indices, torch.int32, "indices", fn)
    _require(indices.dim() == 2, f"{fn}: indices must be [rows, k]")
    idx = _inner_contiguous(indices)
    out = torch.empty_like(idx, memory_format=torch.contiguous_format)
    lengths = idx.new_empty(idx.shape[0])
    p = D.CompactParams(rows=idx.shape[0], k=idx.shape[1], key_count=key_count, indices=idx.data_ptr(),
                        indices_stride=idx.stride(0), out=out.data_ptr(), out_stride=out.stride(0),
                        lengths=lengths.data_ptr())
    _run("dsa_compact_indices", p, idx.device)
    return out, lengths


@compact_indices_op.register_fake
def _(indices, key_count):
    return indices.new_empty(indices.shape), indices.new_empty(indices.shape[0])


@torch.library.custom_op("libdsa::pad_heads", mutates_args=())
def pad_heads_op(q: Tensor, sink: Optional[Tensor], padded_heads: int) -> Tuple[Tensor, Tensor]:
    """q [T, Hp, D] with zero heads H..Hp-1, sink [Hp] with -inf there (no sink: all -inf)."""
    fn = "libdsa.pad_heads"
    _dtype(q, torch.bfloat16, "q", fn)
    _dtype(sink, torch.float32, "sink", fn)
    _require(q.dim() == 3, f"{fn}: q must be [T, H, D]")
    _shape(sink, (q.shape[1],), "sink", fn)
    _same_device(fn, q, sink=sink)
    q = _inner_contiguous(q)
    T, H, Dh = q.shape
    q_out = q.new_empty(T, padded_heads, Dh)
    sink_out = q.new_empty(padded_heads, dtype=torch.float32)
    sk = None if sink is None else sink.contiguous()
    p = D.PadHeadsParams(num_tokens=T, num_heads=H, padded_heads=padded_heads, head_dim=Dh, q=q.data_ptr(),
                         q_stride_token=q.stride(0), q_stride_head=q.stride(1), q_out=q_out.data_ptr(),
                         sink=_ptr(sk), sink_out=sink_out.data_ptr())
    _run("dsa_pad_heads", p, q.device)
    return q_out, sink_out


@pad_heads_op.register_fake
def _(q, sink, padded_heads):
    return q.new_empty(q.shape[0], padded_heads, q.shape[2]), q.new_empty(padded_heads, dtype=torch.float32)


# ---- indexer training (docs/indexer-training.md) ------------------------------------------------
def _w_dtype(w: Tensor) -> int:
    return D.DSA_DTYPE_F32 if w.dtype == torch.float32 else D.DSA_DTYPE_BF16


def _idx_train_checks(fn, index_q, index_k, weights, indices, lengths):
    _dtype(index_q, torch.bfloat16, "index_q", fn)
    _dtype(index_k, torch.bfloat16, "index_k", fn)
    _require(weights.dtype in (torch.float32, torch.bfloat16), f"{fn}: weights must be float32 or bfloat16")
    _dtype(indices, torch.int32, "indices", fn)
    _dtype(lengths, torch.int32, "lengths", fn)
    _require(index_q.dim() == 3 and index_k.dim() == 2 and weights.dim() == 2 and indices.dim() == 2,
             f"{fn}: index_q [T, H, 128], index_k [T_k, 128], weights [T, H], indices [T, K] expected")
    _same_device(fn, index_q, index_k=index_k, weights=weights, indices=indices, lengths=lengths)
    T, H = index_q.shape[0], index_q.shape[1]
    _shape(index_q, (T, H, 128), "index_q", fn)
    _shape(index_k, (None, 128), "index_k", fn)
    _shape(weights, (T, H), "weights", fn)
    _shape(indices, (T, None), "indices", fn)
    _shape(lengths, (T,), "lengths", fn)


@torch.library.custom_op("libdsa::slot_target", mutates_args=())
def slot_target_op(q: Tensor, kv: Tensor, indices: Tensor, topk_length: Optional[Tensor],
                   sink: Optional[Tensor], lse: Tensor, softmax_scale: float) -> Tensor:
    """a [T, K] fp32: the attention probability of each selected key, summed over the heads."""
    fn = "libdsa.slot_target"
    _attn_checks(fn, q, kv, indices, topk_length, sink)
    _dtype(lse, torch.float32, "lse", fn)
    _shape(lse, (q.shape[0], q.shape[1]), "lse", fn)
    _same_device(fn, q, lse=lse)
    q = _inner_contiguous(q)
    T, H, Dh = q.shape
    kv2, idx = _kv2d(kv), _idx2d(indices, T)
    tl = None if topk_length is None else topk_length.contiguous()
    sk = None if sink is None else sink.contiguous()
    lse = lse.contiguous()
    a = q.new_empty(T, idx.shape[1], dtype=torch.float32)
    p = D.SlotTargetParams(num_tokens=T, num_heads=H, head_dim=Dh, num_kv=kv2.shape[0], topk=idx.shape[1],
                           softmax_scale=softmax_scale, q=q.data_ptr(), q_stride_token=q.stride(0),
                           q_stride_head=q.stride(1), kv=kv2.data_ptr(), kv_stride=kv2.stride(0),
                           indices=idx.data_ptr(), indices_stride=idx.stride(0), topk_length=_ptr(tl),
                           sink=_ptr(sk), lse=lse.data_ptr(), target=a.data_ptr())
    _run("dsa_attn_slot_target", p, q.device)
    return a


@slot_target_op.register_fake
def _(q, kv, indices, topk_length, sink, lse, softmax_scale):
    return q.new_empty(q.shape[0], indices.shape[-1], dtype=torch.float32)


@torch.library.custom_op("libdsa::indexer_slot_scores", mutates_args=())
def slot_scores_op(index_q: Tensor, index_k: Tensor, weights: Tensor, indices: Tensor,
                   lengths: Optional[Tensor], deterministic: bool) -> Tensor:
    """z [T, K] fp32: sum_h w * ReLU(q_idx . k_idx[s_j]) at the slots (0 at invalid ones).
    `deterministic` is the backward's mode for d_index_k."""
    fn = "libdsa.indexer_slot_scores"
    _idx_train_checks(fn, index_q, index_k, weights, indices, lengths)
    q, k, w, idx = (_inner_contiguous(t) for t in (index_q, index_k, weights, indices))
    ln = None if lengths is None else lengths.contiguous()
    z = q.new_empty(q.shape[0], idx.shape[1], dtype=torch.float32)
    p = D.IndexerSlotScoresParams(num_tokens=q.shape[0], num_keys=k.shape[0], num_heads=q.shape[1],
                                  topk=idx.shape[1], index_q=q.data_ptr(), q_stride_token=q.stride(0),
                                  q_stride_head=q.stride(1), index_k=k.data_ptr(), k_stride=k.stride(0),
                                  weights=w.data_ptr(), weights_dtype=_w_dtype(w), weights_stride=w.stride(0),
                                  indices=idx.data_ptr(), indices_stride=idx.stride(0), lengths=_ptr(ln),
                                  scores=z.data_ptr())
    _run("dsa_indexer_slot_scores", p, q.device)
    return z


@slot_scores_op.register_fake
def _(index_q, index_k, weights, indices, lengths, deterministic):
    return index_q.new_empty(index_q.shape[0], indices.shape[-1], dtype=torch.float32)


@torch.library.custom_op("libdsa::indexer_bwd", mutates_args=())
def indexer_bwd_op(index_q: Tensor, index_k: Tensor, weights: Tensor, indices: Tensor,
                   lengths: Optional[Tensor], grad: Tensor, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(d_index_q [T, H, 128] bf16, d_weights [T, H] fp32, d_index_k [T_k, 128] bf16) for a score
    gradient grad [T, K]."""
    fn = "libdsa.indexer_bwd"
    _idx_train_checks(fn, index_q, index_k, weights, indices, lengths)
    _dtype(grad, torch.float32, "grad", fn)
    _shape(grad, tuple(indices.shape), "grad (the shape of indices)", fn)
    _same_device(fn, index_q, grad=grad)
    q, k, w, idx, g = (_inner_contiguous(t) for t in (index_q, index_k, weights, indices, grad))
    ln = None if lengths is None else lengths.contiguous()
    T, H, _ = q.shape
    dq = q.new_empty(T, H, 128)
    dw = q.new_empty(T, H, dtype=torch.float32)
    dk = k.new_empty(k.shape[0], 128)
    p = D.IndexerBwdParams(num_tokens=T, num_keys=k.shape[0], num_heads=H, topk=idx.shape[1],
                           deterministic=int(deterministic), index_q=q.data_ptr(), q_stride_token=q.stride(0),
                           q_stride_head=q.stride(1), index_k=k.data_ptr(), k_stride=k.stride(0),
                           weights=w.data_ptr(), weights_dtype=_w_dtype(w), weights_stride=w.stride(0),
                           indices=idx.data_ptr(), indices_stride=idx.stride(0), lengths=_ptr(ln),
                           grad=g.data_ptr(), grad_stride=g.stride(0), d_index_q=dq.data_ptr(),
                           d_weights=dw.data_ptr(), d_index_k=dk.data_ptr())
    _run("dsa_indexer_bwd", p, q.device, workspace=True)
    return dq, dw, dk


@indexer_bwd_op.register_fake
def _(index_q, index_k, weights, indices, lengths, grad, deterministic):
    T, H, _ = index_q.shape
    return (index_q.new_empty(T, H, 128), index_q.new_empty(T, H, dtype=torch.float32),
            index_k.new_empty(index_k.shape[0], 128))


def _scores_setup(ctx, inputs, output):
    index_q, index_k, weights, indices, lengths, deterministic = inputs
    ctx.save_for_backward(index_q, index_k, weights, indices, lengths)
    ctx.deterministic = deterministic


def _scores_backward(ctx, grad):
    index_q, index_k, weights, indices, lengths = ctx.saved_tensors
    dq, dw, dk = indexer_bwd_op(index_q, index_k, weights, indices, lengths, grad.float().contiguous(),
                                ctx.deterministic)
    return dq, dk, dw.to(weights.dtype), None, None, None


torch.library.register_autograd("libdsa::indexer_slot_scores", _scores_backward, setup_context=_scores_setup)


@torch.library.custom_op("libdsa::indexer_loss", mutates_args=())
def indexer_loss_op(target: Tensor, scores: Tensor, indices: Tensor, lengths: Optional[Tensor],
                    num_keys: int, coeff: float) -> Tuple[Tensor, Tensor]:
    """(loss [] fp32, g [T, K] fp32 = d loss / d scores): the KL loss of docs/indexer-training.md."""
    fn = "libdsa.indexer_loss"
    _dtype(target, torch.float32, "target", fn)
    _dtype(scores, torch.float32, "scores", fn)
    _dtype(indices, torch.int32, "indices", fn)
    _dtype(lengths, torch.int32, "lengths", fn)
    _require(scores.dim() == 2, f"{fn}: scores must be [T, K], got {tuple(scores.shape)}")
    _shape(target, tuple(scores.shape), "target", fn)
    _shape(indices, tuple(scores.shape), "indices", fn)
    _shape(lengths, (scores.shape[0],), "lengths", fn)
    _same_device(fn, scores, target=target, indices=indices, lengths=lengths)
    a, z, idx = (_inner_contiguous(t) for t in (target, scores, indices))
    ln = None if lengths is None else lengths.contiguous()
    loss = z.new_empty(1, dtype=torch.float32)
    g = z.new_empty(z.shape, dtype=torch.float32)
    p = D.IndexerLossParams(num_tokens=z.shape[0], topk=z.shape[1], num_keys=num_keys, indices=idx.data_ptr(),
                            indices_stride=idx.stride(0), lengths=_ptr(ln), target=a.data_ptr(),
                            target_stride=a.stride(0), scores=z.data_ptr(), scores_stride=z.stride(0),
                            coeff=coeff, loss=loss.data_ptr(), grad=g.data_ptr(), grad_stride=g.stride(0))
    _run("dsa_indexer_loss", p, z.device, workspace=True)
    return loss.reshape(()), g


@indexer_loss_op.register_fake
def _(target, scores, indices, lengths, num_keys, coeff):
    return scores.new_empty((), dtype=torch.float32), scores.new_empty(scores.shape, dtype=torch.float32)


def _loss_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _loss_backward(ctx, dloss, dg):
    (g,) = ctx.saved_tensors
    return None, g * dloss, None, None, None, None  # the target receives no gradient


torch.library.register_autograd("libdsa::indexer_loss", _loss_backward, setup_context=_loss_setup)


# ---- the plan -----------------------------------------------------------------------------------
_VIEW_ARRAYS = (  # (field, dtype, length attribute or None for num_queries)
    ("starts", torch.int32, "num_queries"), ("causal_lengths", torch.int32, "num_queries"),
    ("query_valid", torch.uint8, "num_queries"), ("valid_row_indices", torch.int64, "num_valid"),
    ("segment_cu_q", torch.int32, "segments_plus_one"), ("segment_cu_k", torch.int32, "segments_plus_one"),
    ("q_causal_offsets", torch.int32, "num_segments"), ("key_source_indices", torch.int64, "num_key_sources"))


class Plan:
    """The packed-sequence metadata of one step (libdsa's planner, docs/contract.md section 4), planned
    on the host once and uploaded once to `device`; every indexer call of the step reuses it.

    Mirrors the reference module's prepare_cudnn_dsa_packed_metadata: cu_seqlens (real lengths,
    [S + 1]), total_key_tokens (T_k, rows of the gathered padded key storage), max_seqlen (checked
    when given), query_indices (the local query rows' global padded coordinates, contiguous) or
    query_start / num_queries (a context-parallel query range; neither: every key position is a
    query), cu_seqlens_padded (storage boundaries), padding_mask ([T_q] bool, True = padding query).
    Planning reads the inputs on the host: tensors on the GPU cost one synchronisation, once per step.
    The fields (starts, causal_lengths, query_valid, valid_row_indices, segment_cu_q, segment_cu_k,
    q_causal_offsets, key_source_indices) are tensors on `device`, views of the uploaded plan."""

    def __init__(self, cu_seqlens, total_key_tokens: int, *, max_seqlen=None, query_indices=None,
                 query_start: Optional[int] = None, num_queries: Optional[int] = None,
                 cu_seqlens_padded=None, padding_mask=None, device=None):
        lib = library()
        self._lib = lib
        if device is None:
            device = cu_seqlens.device if isinstance(cu_seqlens, Tensor) else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # "cuda" means the current device; the index makes it compare equal to tensors' cuda:N
            self.device = torch.device("cuda", torch.cuda.current_device())
        host_i32 = lambda x: torch.as_tensor(x).to("cpu", torch.int32).contiguous()
        cu = host_i32(cu_seqlens)
        cup = None if cu_seqlens_padded is None else host_i32(cu_seqlens_padded)
        if query_indices is not None:
            qi = torch.as_tensor(query_indices).to("cpu", torch.int64)
            _require(qi.dim() == 1, "Plan: query_indices must be 1-D")
            if qi.numel() > 0:
                _require(bool((qi == qi[0] + torch.arange(qi.numel())).all()),
                         "Plan: query_indices must be contiguous global coordinates (q[i] = q[0] + i)")
            query_start, num_queries = (int(qi[0]) if qi.numel() else 0), qi.numel()
        elif query_start is None:
            query_start, num_queries = 0, -1
        pm = None if padding_mask is None else torch.as_tensor(padding_mask).to("cpu", torch.uint8).contiguous()
        if isinstance(max_seqlen, Tensor):
            max_seqlen = int(max_seqlen.item())
        desc = D.PlanDesc(cu_seqlens=cu.data_ptr(), cu_seqlens_padded=_ptr(cup), num_seqs=cu.numel() - 1,
                          total_key_tokens=int(total_key_tokens), query_start=int(query_start),
                          num_queries=int(num_queries if num_queries is not None else -1),
                          padding_mask=_ptr(pm), max_seqlen=int(max_seqlen or 0))
        self._plan = lib.plan_create(desc)
        hv = lib.so.dsa_plan_host_view(self._plan).contents
        self._host_view = hv
        for f in ("num_queries", "total_key_tokens", "query_start", "num_segments", "num_valid",
                  "num_key_sources", "max_seqlen_q", "max_seqlen_k"):
            setattr(self, f, int(getattr(hv, f)))
        self.all_rows_nonempty = bool(hv.all_rows_nonempty)
        self.segments_plus_one = self.num_segments + 1
        self._device_view = None
        if self.device.type == "cuda":
            ctx, stream = _ctx_stream(self.device)
            nbytes = lib.plan_upload_size(ctx, self._plan, stream)
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self._device_view = lib.plan_upload(ctx, self._plan, C.c_void_p(self._buffer.data_ptr()), nbytes,
                                                stream)
            # the copy reads the host plan asynchronously; planning is once per step
            torch.cuda.current_stream(self.device).synchronize()
        self.id = id(self)
        _plans[self.id] = self

    def _view_for(self, device: torch.device) -> D.PlanView:
        if device.type == "cuda":
            _require(self._device_view is not None and device == self.device,
                     f"libdsa.indexer_topk: the plan lives on {self.device}, the inputs on {device}")
            return self._device_view
        return self._host_view

    def __getattr__(self, name):
        # the per-query and per-segment arrays, as tensors (views of the device buffer; host copies)
        for field, dtype, length in _VIEW_ARRAYS:
            if name == field:
                view = self._device_view if self._device_view is not None else self._host_view
                addr = getattr(view, field)
                if not addr:
                    return None
                n = getattr(self, length)
                if self._device_view is not None:
                    off = addr - self._buffer.data_ptr()
                    return self._buffer[off:off + n * dtype.itemsize].view(dtype)
                raw = (C.c_uint8 * (n * dtype.itemsize)).from_address(addr)
                return torch.frombuffer(bytearray(raw), dtype=dtype)
        raise AttributeError(name)

    def __del__(self):
        plan, lib = getattr(self, "_plan", None), getattr(self, "_lib", None)
        if plan is not None and lib is not None:
            lib.so.dsa_plan_destroy(plan)
            self._plan = None
