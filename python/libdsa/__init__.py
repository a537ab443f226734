"""libdsa: DeepSeek Sparse Attention (GLM-5.x, DeepSeek-V3.2) kernels for Hopper, as PyTorch ops.

    import libdsa
    plan = libdsa.plan(cu_seqlens, total_key_tokens, query_start=..., num_queries=..., device="cuda")
    idx, lengths = libdsa.indexer_topk(index_q, index_k, head_weights, plan, topk=2048)
    out = libdsa.sparse_attention(q, kv, idx, softmax_scale, topk_length=lengths, attn_sink=sink)
    out.float().square().sum().backward()        # dq, dkv, dsink from libdsa's backward

Every op is a torch custom op (torch.ops.libdsa.*) with a fake implementation, so torch.compile
and CUDA graph capture work (make one call before capturing: the first call creates libdsa's
context). CUDA tensors run libdsa's kernels on the current stream; CPU tensors run libdsa's CPU
reference (exact and slow: for tests). The import loads libdsa.so and checks the CUDA versions it
needs (see _loader.py); nothing of torch is inside libdsa itself.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _capi, _loader
from ._capi import DSAError, DSAInvalidArgument, DSAUnsupported
from ._loader import library
from .ops import Plan

__all__ = ["plan", "Plan", "indexer_topk", "sparse_attention", "sparse_attention_backward", "topk",
           "slot_target", "indexer_slot_scores", "indexer_kl_loss",
           "compact_indices", "pad_heads", "padded_head_count", "set_option", "get_option", "library",
           "version", "DSAError",
           "DSAInvalidArgument", "DSAUnsupported", "ENGINE_DEFAULT", "ENGINE_CUBLAS", "ENGINE_FUSED"]

ENGINE_DEFAULT = _capi.DSA_INDEXER_ENGINE_DEFAULT
ENGINE_CUBLAS = _capi.DSA_INDEXER_ENGINE_CUBLAS
ENGINE_FUSED = _capi.DSA_INDEXER_ENGINE_FUSED


def version() -> str:
    """The version string of the loaded libdsa.so."""
    return library().version


def plan(cu_seqlens, total_key_tokens: int, *, max_seqlen=None, query_indices=None,
         query_start: Optional[int] = None, num_queries: Optional[int] = None, cu_seqlens_padded=None,
         padding_mask=None, device=None) -> Plan:
    """The packed metadata of one step (Plan's docstring); mirrors prepare_cudnn_dsa_packed_metadata."""
    return Plan(cu_seqlens, total_key_tokens, max_seqlen=max_seqlen, query_indices=query_indices,
                query_start=query_start, num_queries=num_queries, cu_seqlens_padded=cu_seqlens_padded,
                padding_mask=padding_mask, device=device)


def indexer_topk(index_q: Tensor, index_k: Tensor, head_weights: Tensor, plan: Plan, topk: int,
                 engine: int = ENGINE_DEFAULT) -> Tuple[Tensor, Tensor]:
    """score[t, s] = sum_h w[t, h] * ReLU(q[t, h] . k[s]) over the keys query t sees (plan), then its
    `topk` best keys: (indices [T_q, topk] int32, ascending valid prefix in global storage rows then -1;
    lengths [T_q] int32 = min(topk, visible keys)). Mirrors cudnn_indexer_topk; head_weights arrive
    already scaled. lengths is what sparse_attention takes as topk_length."""
    return torch.ops.libdsa.indexer_topk(index_q, index_k, head_weights, plan.id, int(topk), int(engine))


def sparse_attention(q: Tensor, kv: Tensor, topk_indices: Tensor, softmax_scale: float,
                     topk_length: Optional[Tensor] = None, attn_sink: Optional[Tensor] = None,
                     deterministic: bool = False, return_lse: bool = False):
    """Sparse MLA attention: out [T, H, 512] bf16 (and lse [T, H] fp32, natural log without the sink,
    when return_lse). Differentiable in q, kv and attn_sink (libdsa's backward; `deterministic` makes
    dkv bitwise reproducible). lse is not differentiable. Mirrors cudnn_sparse_attention."""
    out, lse, _ = torch.ops.libdsa.sparse_attn_fwd(q, kv, topk_indices, topk_length, attn_sink,
                                                   float(softmax_scale), bool(deterministic))
    return (out, lse) if return_lse else out


def sparse_attention_backward(q, kv, topk_indices, softmax_scale, out, dout, lse, topk_length=None,
                              attn_sink=None, deterministic=False):
    """The backward alone: (dq, dkv [T_kv, D], dsink [H])."""
    return torch.ops.libdsa.sparse_attn_bwd(q, kv, topk_indices, topk_length, attn_sink, out, dout, lse,
                                            float(softmax_scale), bool(deterministic))


def slot_target(q: Tensor, kv: Tensor, topk_indices: Tensor, lse: Tensor, softmax_scale: float,
                topk_length: Optional[Tensor] = None, attn_sink: Optional[Tensor] = None) -> Tensor:
    """a [T, K] fp32: the attention's probability of each selected key summed over the heads, with
    the forward's lse (unnormalised: tensor-parallel ranks sum theirs). Not differentiable."""
    return torch.ops.libdsa.slot_target(q, kv, topk_indices, topk_length, attn_sink, lse, float(softmax_scale))


def indexer_slot_scores(index_q: Tensor, index_k: Tensor, head_weights: Tensor, topk_indices: Tensor,
                        lengths: Optional[Tensor] = None, deterministic: bool = False) -> Tensor:
    """z [T, K] fp32: the indexer's score at each selected key; differentiable in index_q, index_k and
    head_weights (libdsa's indexer backward; `deterministic` makes d index_k bitwise reproducible)."""
    return torch.ops.libdsa.indexer_slot_scores(index_q, index_k, head_weights, topk_indices, lengths,
                                                bool(deterministic))


def indexer_kl_loss(target: Tensor, index_q: Tensor, index_k: Tensor, head_weights: Tensor,
                    topk_indices: Tensor, lengths: Optional[Tensor] = None, coeff: float = 1.0,
                    deterministic: bool = False) -> Tensor:
    """The indexer's training loss (docs/indexer-training.md): coeff / N * sum_t KL(target_t || softmax(z_t))
    over the rows with a valid slot and a positive target, z the indexer's slot scores; its gradient
    flows into the indexer's inputs only (target, e.g. slot_target's, gets none)."""
    z = indexer_slot_scores(index_q, index_k, head_weights, topk_indices, lengths, deterministic)
    loss, _ = torch.ops.libdsa.indexer_loss(target, z, topk_indices, lengths, int(index_k.shape[0]),
                                            float(coeff))
    return loss


def topk(scores: Tensor, k: int, lengths: Optional[Tensor] = None) -> Tensor:
    """Radix top-k of fp32 rows: the k best columns, ascending, then -1 (deterministic ties)."""
    return torch.ops.libdsa.topk(scores, lengths, int(k))


def compact_indices(indices: Tensor, key_count: int) -> Tuple[Tensor, Tensor]:
    """Canonical indices: per row the entries in [0, key_count) ascending, then -1; and their count."""
    return torch.ops.libdsa.compact_indices(indices, int(key_count))


def pad_heads(q: Tensor, attn_sink: Optional[Tensor], padded_heads: int) -> Tuple[Tensor, Tensor]:
    """q padded with zero heads and the sink with -inf to padded_heads (interop with peers)."""
    return torch.ops.libdsa.pad_heads(q, attn_sink, int(padded_heads))


def padded_head_count(num_heads: int) -> int:
    """The head count the reference module pads to on SM90 (-1 where it rejects H)."""
    return int(library().so.dsa_padded_head_count(int(num_heads)))


def set_option(name: str, value: int, device=None) -> None:
    """Sets a tuning option (include/dsa_tune.h: fwd_kernel, bwd_kernel, topk_kernel, fwd_kv_l2_hint,
    indexer_fused_kernel, ...; values as there) on the libdsa context of a CUDA device (default: the
    current one). Options are per device context here, for research and A/B runs."""
    from .ops import _ctx_stream
    _require_option(name)
    ctx, _ = _ctx_stream(torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda"))
    lib = library()
    lib.check(lib.so.dsa_context_set_option(ctx, _capi.OPTIONS[name], int(value)), "dsa_context_set_option")


def get_option(name: str, device=None) -> int:
    """The value of a tuning option on the libdsa context of a CUDA device."""
    import ctypes
    from .ops import _ctx_stream
    _require_option(name)
    ctx, _ = _ctx_stream(torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda"))
    lib = library()
    v = ctypes.c_int64(0)
    lib.check(lib.so.dsa_context_get_option(ctx, _capi.OPTIONS[name], ctypes.byref(v)), "dsa_context_get_option")
    return v.value


def _require_option(name):
    if name not in _capi.OPTIONS:
        raise DSAInvalidArgument(f"unknown option {name!r}; options: {', '.join(_capi.OPTIONS)}",
                                 _capi.DSA_ERROR_INVALID_ARGUMENT)


_loader.load_at_import()
