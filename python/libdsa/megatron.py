"""megatron.py - libdsa behind Megatron-Core 0.16.1's DeepSeek Sparse Attention
(megatron/core/transformer/experimental_attention_variant/dsa.py).

Functions with Megatron's signatures and layouts ([s, b, heads, dim] activations, batch b >= 1,
topk_indices [b, sq, K] of local key positions), each backed by libdsa's ops with autograd:

    dsa_fn(query, key, value, topk_indices, softmax_scale)     for unfused_dsa_fn
    compute_index_scores(q, weights, k)                        for DSAIndexer._compute_index_scores
    index_topk(q, weights, k, topk)                            for its scores + causal mask + topk
    index_slot_scores(q, weights, k, topk_indices)             those scores at the selected slots
    compute_dsa_indexer_loss(index_scores, topk_indices, query, key, softmax_scale, loss_coeff,
                             sparse_loss, pg_collection)       for compute_dsa_indexer_loss
    sparse_indexer_loss(slot_scores, topk_indices, query, key, softmax_scale, loss_coeff)
                                                               the same loss from slot scores

and two modules for Megatron's DSA spec (built on first access: importing this file does not import
Megatron): LibdsaDSAttention (a DSAttention whose forward runs the three libdsa steps, no dense
[b, sq, sk] tensor anywhere) and LibdsaDSAIndexer (a DSAIndexer whose _compute_index_scores is
libdsa's); libdsa_dsa_spec(spec) puts them into a spec from Megatron's get_dsa_module_spec_for_backend,
build_dsattention(config, pg_collection) builds that spec's core attention as MLASelfAttention does,
torch_backend() is a spec backend without Transformer Engine.

Layout (python/README.md, "Megatron-Core"). libdsa's attention kernel is MLA in its absorbed form:
one latent row per key shared by every head, kv [T_kv, 576] = [c_kv (512) | k_pe (64)], value = its
first 512 dims, q [T, H, 576] = [q_nope W_UK (512) | q_pe (64)]. Megatron's DSAttention takes
per-head key [skv, b, np, hn] and value [skv, b, np, hnv]; dsa_fn accepts them exactly when they are
that latent: hn = 576 (or 512), key identical across heads (size 1 or stride 0 there, else checked),
value = key[..., :512]. Anything else raises DSAInvalidArgument; in particular the per-head keys
Megatron-Core 0.16.1's MLASelfAttention builds for training (k_nope of the head | k_pe,
qk_head_dim + qk_pos_emb_head_dim wide, different per head) cannot be represented by the kernel.

Token rows. The attention and the loss take token (s, b) as row s * b + b_i, the memory order of
[s, b, ...], so q, kv, lse and the output are views (no copy); topk_indices become global key rows
idx * b + b_i, with every entry outside 0 <= idx <= s (Megatron's causal mask) an invalid slot
(-1). The indexer's top-k runs as b packed sequences of sq tokens (a libdsa plan with cu_seqlens =
0, sq, 2 sq, ..., cached per shape and device) on batch-major copies of its inputs.

Differences from Megatron's functions, all tested in python/tests/test_megatron.py:
- the loss has no 1e-10 terms: KL(tgt || p) with log(tgt), log p exact (log-softmax), where
  Megatron takes log(tgt + 1e-10) - log(p + 1e-10); they agree where p >> 1e-10;
- rows with no visible slot (only hand-made indices have them) give out = 0, Megatron's NaN;
- a key listed twice in a row counts twice (libdsa's slots), once in Megatron's mask;
- index_topk writes each row's keys ascending (torch.topk: by score), ties to the smaller key;
- a tensor-parallel loss (pg_collection.tp.size() > 1) raises DSAUnsupported: the target would
  need Megatron's all-reduce over the TP group, which is not wired; context parallelism is not
  supported by Megatron's DSAttention either.
"""
import dataclasses
from typing import Optional

import torch
from torch import Tensor

from . import _capi as D
from . import ops
from .ops import _require

MEGATRON_CORE_VERSION = "0.16.1"  # the release whose dsa.py these functions mirror

_MAX_TOPK = 2048  # DSA_MAX_TOPK (include/dsa.h): the widest row of the indexer's ops
_plans = {}  # (b, sq, device) -> ops.Plan: the indexer's packed-batch plan, reused every call


def _unsupported(what: str):
    raise D.DSAUnsupported(what, D.DSA_ERROR_UNSUPPORTED)


def _dims(t: Optional[Tensor], n: int, name: str, fn: str, want: str):
    _require(isinstance(t, Tensor), f"{fn}: {name} must be a tensor {want}")
    _require(t.dim() == n, f"{fn}: {name} must be {want}, got {tuple(t.shape)}")


def _same_device(fn: str, ref: Tensor, **tensors):
    for name, t in tensors.items():
        _require(t.device == ref.device, f"{fn}: {name} is on {t.device}, the first input on {ref.device}")


# ---- the attention: unfused_dsa_fn ----------------------------------------------------------------
def _attn_rows(topk_indices: Tensor, b: int, sq: int, skv: int, fn: str) -> Tensor:
    """Megatron's topk_indices [b, sq, K] (local key positions) as libdsa's indices [sq * b, K] int32
    in the attention's token rows: key row idx * b + b_i, -1 where idx < 0, idx > s or idx >= skv."""
    _dims(topk_indices, 3, "topk_indices", fn, "[b, sq, K]")
    _require(not topk_indices.is_floating_point() and not topk_indices.is_complex()
             and topk_indices.dtype != torch.bool,
             f"{fn}: topk_indices must be an integer tensor, got {topk_indices.dtype}")
    _require(tuple(topk_indices.shape[:2]) == (b, sq),
             f"{fn}: topk_indices must be [b, sq, K] = [{b}, {sq}, K], got {tuple(topk_indices.shape)}")
    dev = topk_indices.device
    s = torch.arange(sq, device=dev).view(1, sq, 1)
    idx = topk_indices.long()
    ok = (idx >= 0) & (idx <= s) & (idx < skv)
    rows = torch.where(ok, idx * b + torch.arange(b, device=dev).view(b, 1, 1), -1)
    return rows.to(torch.int32).transpose(0, 1).reshape(sq * b, topk_indices.shape[2])


def _latent(fn: str, query: Tensor, key: Tensor, value: Optional[Tensor], check_layout: bool) -> Tensor:
    """key as libdsa's kv [skv * b, hn] (a view of head 0), after checking that key and value are the
    shared MLA latent: key the same in every head, value = key[..., :512]."""
    sq, b, np_, hn = query.shape
    _dims(key, 4, "key", fn, "[skv, b, np or 1, hn]")
    skv, kb, nk, khn = key.shape
    _require(kb == b and khn == hn and nk in (1, np_),
             f"{fn}: key must be [skv, {b}, {np_} or 1, {hn}] to match query {tuple(query.shape)}, "
             f"got {tuple(key.shape)}")
    _require(key.dtype == torch.bfloat16, f"{fn}: key must be torch.bfloat16, got {key.dtype}")
    _same_device(fn, query, key=key)
    if nk > 1 and key.stride(2) != 0 and check_layout:
        _require(torch.equal(key, key[:, :, :1].expand_as(key)),
                 f"{fn}: key differs across heads; libdsa's kernel holds one latent row per key "
                 "shared by all heads (MLA absorbed / MQA: key = [c_kv | k_pe] [skv, b, 1, 576]); "
                 "Megatron-Core's MLASelfAttention per-head keys [k_nope_h | k_pe] are not supported")
    if value is not None:
        _dims(value, 4, "value", fn, "[skv, b, np or 1, 512]")
        _require(tuple(value.shape[:2]) == (skv, b) and value.shape[2] in (1, np_) and value.shape[3] == 512,
                 f"{fn}: value must be [{skv}, {b}, {np_} or 1, 512] (the first 512 dims of key), "
                 f"got {tuple(value.shape)}")
        _require(value.dtype == torch.bfloat16, f"{fn}: value must be torch.bfloat16, got {value.dtype}")
        _same_device(fn, query, value=value)
        shared = value.shape[2] == 1 or value.stride(2) == 0 or value.stride(2) == key.stride(2)
        alias = (value.data_ptr() == key.data_ptr() and value.stride(0) == key.stride(0)
                 and value.stride(1) == key.stride(1) and value.stride(3) == 1 and key.stride(3) == 1 and shared)
        if not alias and check_layout:
            _require(torch.equal(value, key[:, :, :1, :512].expand_as(value)),
                     f"{fn}: value must equal key[..., :512] (the latent c_kv: libdsa's value is the first "
                     "512 dims of each kv row), and it does not")
    return key[:, :, 0].reshape(skv * b, hn)


def dsa_fn(query: Tensor, key: Tensor, value: Optional[Tensor], topk_indices: Tensor, softmax_scale: float,
           *, deterministic: bool = False, check_layout: bool = True, return_lse: bool = False):
    """unfused_dsa_fn on libdsa's sparse MLA forward and backward.

    query [sq, b, np, 576 or 512] bf16, key [skv, b, np or 1, hn] bf16 (the same in every head),
    value [skv, b, np or 1, 512] equal to key[..., :512] (None: that), topk_indices [b, sq, K]
    integer local key positions (entries outside 0..s are masked, as Megatron's causal mask does;
    K <= 4096). Returns [sq, b, np * 512] bf16, and with return_lse the natural-log lse [sq, b, np]
    fp32 (not differentiable; +inf on a row without a valid slot) that sparse_indexer_loss takes.

    Gradients: query's, and the latent's through key (libdsa's dkv is the latent's whole gradient,
    its value part included); value receives none, which is exact when value is computed as key's
    first 512 dims (a view or a copy of the same latent). check_layout=False skips the equality
    checks of key across heads and of value against key (each a read of the tensors and, on the
    GPU, a synchronisation; views of one latent pass without them). deterministic makes dkv bitwise
    reproducible."""
    fn = "libdsa.megatron.dsa_fn"
    _dims(query, 4, "query", fn, "[sq, b, np, hn]")
    sq, b, np_, hn = query.shape
    _require(hn in (576, 512), f"{fn}: query's head dim must be 576 (the absorbed MLA layout: 512 latent "
             f"+ 64 rope) or 512, got {hn}")
    _require(query.dtype == torch.bfloat16, f"{fn}: query must be torch.bfloat16, got {query.dtype}")
    kv = _latent(fn, query, key, value, check_layout)
    _same_device(fn, query, topk_indices=topk_indices)
    idx = _attn_rows(topk_indices, b, sq, key.shape[0], fn)
    out, lse, _ = torch.ops.libdsa.sparse_attn_fwd(query.reshape(sq * b, np_, hn), kv, idx, None, None,
                                                   float(softmax_scale), bool(deterministic))
    out = out.reshape(sq, b, np_ * 512)
    return (out, lse.reshape(sq, b, np_)) if return_lse else out


# ---- the indexer: _compute_index_scores, its top-k and its scores at the slots --------------------
def _index_checks(fn: str, q: Tensor, weights: Tensor, k: Tensor):
    _dims(q, 4, "q", fn, "[sq, b, index_n_heads, 128]")
    sq, b, h, d = q.shape
    _require(d == 128, f"{fn}: q's index head dim must be 128 (libdsa's indexer), got {d}")
    _dims(weights, 3, "weights", fn, "[sq, b, index_n_heads]")
    _require(tuple(weights.shape) == (sq, b, h), f"{fn}: weights must be [{sq}, {b}, {h}], got {tuple(weights.shape)}")
    _dims(k, 3, "k", fn, "[sk, b, 128]")
    _require(k.shape[1] == b and k.shape[2] == 128, f"{fn}: k must be [sk, {b}, 128], got {tuple(k.shape)}")
    _same_device(fn, q, weights=weights, k=k)


def compute_index_scores(q: Tensor, weights: Tensor, k: Tensor) -> Tensor:
    """DSAIndexer._compute_index_scores: sum_h weights * ReLU(q . k), fp32 [b, sq, sk], every key of
    the batch element (no mask, as Megatron's), from libdsa's slot-score op over all sk keys (column
    blocks of 2048); differentiable in q, weights and k through libdsa's indexer backward. Dense like
    Megatron's; index_topk and index_slot_scores are the forms that never hold [b, sq, sk]."""
    fn = "libdsa.megatron.compute_index_scores"
    _index_checks(fn, q, weights, k)
    sq, b, h, _ = q.shape
    sk = k.shape[0]
    q2, w2, k2 = q.reshape(sq * b, h, 128), weights.reshape(sq * b, h), k.reshape(sk * b, 128)
    bi = torch.arange(b, device=q.device, dtype=torch.int32).repeat(sq).view(sq * b, 1)
    blocks = []
    for c0 in range(0, sk, _MAX_TOPK):
        cols = torch.arange(c0, min(sk, c0 + _MAX_TOPK), device=q.device, dtype=torch.int32)
        idx = cols.view(1, -1) * b + bi
        z = torch.ops.libdsa.indexer_slot_scores(q2, k2, w2, idx, None, False)
        blocks.append(z.view(sq, b, -1).transpose(0, 1))
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)


def _plan(b: int, sq: int, device: torch.device) -> ops.Plan:
    key = (b, sq, str(device))
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= 16:
            _plans.pop(next(iter(_plans)))
        plan = ops.Plan(torch.arange(b + 1, dtype=torch.int32) * sq, b * sq, device=device)
        _plans[key] = plan
    return plan


def index_topk(q: Tensor, weights: Tensor, k: Tensor, topk: int, *, engine: int = D.DSA_INDEXER_ENGINE_DEFAULT) -> Tensor:
    """What DSAIndexer.forward_with_scores does with _compute_index_scores under DSAttention's causal
    mask, without the [b, sq, sk] scores: topk_indices [b, sq, min(topk, sq)] int64 of local key
    positions, from libdsa's fused indexer top-k (b packed sequences). Each row holds its selected
    keys ascending (Megatron: by score; neither the attention nor the loss depends on the order),
    ties to the smaller key; a row with fewer visible keys than K reads 0, 1, ..., K - 1 (its keys,
    then future positions, which the causal mask drops: Megatron's topk also fills such rows with
    masked positions). No gradient (integers). q [sq, b, H, 128] bf16 (H <= 64), weights [sq, b, H]
    bf16 or fp32 (already scaled, as Megatron's), k [sq, b, 128] bf16."""
    fn = "libdsa.megatron.index_topk"
    _index_checks(fn, q, weights, k)
    sq, b, h, _ = q.shape
    _require(k.shape[0] == sq, f"{fn}: k must have the queries' sequence length {sq}, got {k.shape[0]}")
    _require(int(topk) >= 1, f"{fn}: topk must be at least 1, got {topk}")
    K = min(int(topk), sq)
    plan = _plan(b, sq, q.device)
    bm = lambda t: t.detach().transpose(0, 1).reshape((b * t.shape[0],) + tuple(t.shape[2:]))
    idx, _ = torch.ops.libdsa.indexer_topk(bm(q), bm(k), bm(weights), plan.id, K, int(engine))
    base = (torch.arange(b, device=q.device, dtype=torch.int32) * sq).repeat_interleave(sq).view(b * sq, 1)
    slot = torch.arange(K, device=q.device, dtype=torch.int32).view(1, K)
    return torch.where(idx >= 0, idx - base, slot).view(b, sq, K).long()


def index_slot_scores(q: Tensor, weights: Tensor, k: Tensor, topk_indices: Tensor, *,
                      deterministic: bool = False) -> Tensor:
    """The indexer's scores at the selected slots, [b, sq, K] fp32: compute_index_scores gathered at
    topk_indices where 0 <= idx <= s, and 0 at the other slots (Megatron's masked scores hold -inf
    there). Differentiable in q, weights and k (libdsa's indexer backward; deterministic makes the
    gradient of k bitwise reproducible). This is what sparse_indexer_loss trains."""
    fn = "libdsa.megatron.index_slot_scores"
    _index_checks(fn, q, weights, k)
    sq, b, h, _ = q.shape
    sk = k.shape[0]
    _same_device(fn, q, topk_indices=topk_indices)
    idx = _attn_rows(topk_indices, b, sq, sk, fn)
    z = torch.ops.libdsa.indexer_slot_scores(q.reshape(sq * b, h, 128), k.reshape(sk * b, 128),
                                             weights.reshape(sq * b, h), idx, None, bool(deterministic))
    return z.view(sq, b, -1).transpose(0, 1)


# ---- the indexer loss: compute_dsa_indexer_loss(sparse_loss=True) -----------------------------------
def _check_tp(fn: str, pg_collection):
    tp = getattr(pg_collection, "tp", None) if pg_collection is not None else None
    if tp is not None and tp.size() > 1:
        _unsupported(f"{fn}: tensor parallelism ({tp.size()} ranks) is not covered: the loss target "
                     "(libdsa.slot_target, unnormalised) must be summed over the TP group before the loss, "
                     "as Megatron all-reduces its attention scores")


def sparse_indexer_loss(slot_scores: Tensor, topk_indices: Tensor, query: Tensor, key: Tensor,
                        softmax_scale: float, loss_coeff: float, *, lse: Optional[Tensor] = None,
                        pg_collection=None, check_layout: bool = True) -> Tensor:
    """compute_dsa_indexer_loss(sparse_loss=True) from the indexer's scores at the slots
    (index_slot_scores, [b, sq, K] fp32): loss_coeff * mean over the b * sq rows of
    KL(target || softmax(slot scores)), the target the attention's probabilities at the same slots
    summed over the heads and L1-normalised (libdsa's slot target, loss and gradient). The gradient
    flows into slot_scores only (query and key are used detached, as Megatron passes them). lse
    [sq, b, np] from dsa_fn(return_lse=True) saves the forward that recomputes it otherwise.
    Exact KL, no 1e-10 terms; rows are averaged over those with a valid slot and a positive target
    (every row where Megatron's loss is finite)."""
    fn = "libdsa.megatron.sparse_indexer_loss"
    _check_tp(fn, pg_collection)
    _dims(query, 4, "query", fn, "[sq, b, np, hn]")
    sq, b, np_, hn = query.shape
    _require(query.dtype == torch.bfloat16, f"{fn}: query must be torch.bfloat16, got {query.dtype}")
    kv = _latent(fn, query, key.detach(), None, check_layout)
    _dims(slot_scores, 3, "slot_scores", fn, "[b, sq, K]")
    _require(tuple(slot_scores.shape) == tuple(topk_indices.shape),
             f"{fn}: slot_scores must have topk_indices' shape {tuple(topk_indices.shape)}, got "
             f"{tuple(slot_scores.shape)}")
    _require(slot_scores.dtype == torch.float32, f"{fn}: slot_scores must be torch.float32, got {slot_scores.dtype}")
    _same_device(fn, query, slot_scores=slot_scores, topk_indices=topk_indices)
    idx = _attn_rows(topk_indices, b, sq, key.shape[0], fn)
    q2 = query.detach().reshape(sq * b, np_, hn)
    if lse is None:
        _, lse2, _ = torch.ops.libdsa.sparse_attn_fwd(q2, kv, idx, None, None, float(softmax_scale), False)
    else:
        _require(isinstance(lse, Tensor) and tuple(lse.shape) == (sq, b, np_),
                 f"{fn}: lse must be [{sq}, {b}, {np_}] (dsa_fn's), got {tuple(lse.shape) if isinstance(lse, Tensor) else lse}")
        lse2 = lse.detach().reshape(sq * b, np_)
    target = torch.ops.libdsa.slot_target(q2, kv, idx, None, None, lse2, float(softmax_scale))
    z = slot_scores.transpose(0, 1).reshape(sq * b, -1)
    loss, _ = torch.ops.libdsa.indexer_loss(target, z, idx, None, kv.shape[0], float(loss_coeff))
    return loss


def compute_dsa_indexer_loss(index_scores: Tensor, topk_indices: Tensor, query: Tensor, key: Tensor,
                             softmax_scale: float, loss_coeff: float, sparse_loss: bool, pg_collection=None,
                             *, lse: Optional[Tensor] = None) -> Tensor:
    """compute_dsa_indexer_loss with sparse_loss=True on libdsa: index_scores [b, sq, sk] fp32 (dense,
    as Megatron's indexer returns them, mask added or not: only the slots 0 <= idx <= s are read),
    gathered at topk_indices, then sparse_indexer_loss. Unlike Megatron's it does not add the mask
    into index_scores in place. sparse_loss=False (the dense KL over every causal key) raises
    DSAUnsupported: libdsa computes the sparse loss."""
    fn = "libdsa.megatron.compute_dsa_indexer_loss"
    if not sparse_loss:
        _unsupported(f"{fn}: sparse_loss=False (the KL over every causal key) is not libdsa's; "
                     "set dsa_indexer_use_sparse_loss=True")
    _dims(index_scores, 3, "index_scores", fn, "[b, sq, sk]")
    _dims(topk_indices, 3, "topk_indices", fn, "[b, sq, K]")
    _require(tuple(index_scores.shape[:2]) == tuple(topk_indices.shape[:2]),
             f"{fn}: index_scores [b, sq, sk] and topk_indices [b, sq, K] disagree: "
             f"{tuple(index_scores.shape)}, {tuple(topk_indices.shape)}")
    _same_device(fn, index_scores, topk_indices=topk_indices)
    z = index_scores.float().gather(-1, topk_indices.long().clamp(0, index_scores.shape[2] - 1))
    return sparse_indexer_loss(z, topk_indices, query, key, softmax_scale, loss_coeff, lse=lse,
                               pg_collection=pg_collection)


# ---- modules for Megatron's spec --------------------------------------------------------------------
def _dsa_module():
    try:
        from megatron.core.transformer.experimental_attention_variant import dsa
    except ImportError as e:
        raise ImportError(f"libdsa.megatron's modules need megatron-core {MEGATRON_CORE_VERSION} "
                          f"(pip install megatron-core=={MEGATRON_CORE_VERSION}): {e}") from e
    return dsa


_hadamard = {}


def hadamard_transform(x: Tensor, scale: float = 1.0) -> Tensor:
    """The Walsh-Hadamard transform of x's last dimension (a power of two) times scale, in fp32 (the
    Sylvester matrix), in x's dtype: the transform fast_hadamard_transform computes, in plain torch.
    LibdsaDSAIndexer's rotation uses it where fast_hadamard_transform is not installed."""
    n = x.shape[-1]
    _require(n > 0 and n & (n - 1) == 0, f"libdsa.megatron.hadamard_transform: the last dimension must be a "
             f"power of two, got {n}")
    key = (n, str(x.device))
    h = _hadamard.get(key)
    if h is None:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        h = _hadamard[key] = h.to(x.device)
    return (x.float() @ h * scale).to(x.dtype)


def _rotate(x: Tensor) -> Tensor:
    """Megatron's rotate_activation, with hadamard_transform above where fast_hadamard_transform is
    missing (Megatron asserts there)."""
    dsa = _dsa_module()
    if dsa.hadamard_transform is not None:
        return dsa.rotate_activation(x)
    return hadamard_transform(x, scale=x.shape[-1] ** -0.5)


def index_inputs(indexer, x: Tensor, qr: Tensor):
    """(q [sq, b, H, 128], weights [sq, b, H], k [sq, b, 128]): the tensors a DSAIndexer's
    forward_with_scores hands to _compute_index_scores (its projections, RoPE, rotation and weight
    scale, as in Megatron-Core 0.16.1), for index_topk and index_slot_scores. No packed sequences,
    as Megatron's indexer."""
    dsa = _dsa_module()
    cfg = indexer.config
    rotary_seq_len = indexer.rotary_pos_emb.get_rotary_seq_len(None, None, x, cfg, None)
    if cfg.rope_type == "rope":
        rotary_pos_emb, mscale = indexer.rotary_pos_emb(rotary_seq_len, packed_seq=False), 1.0
    else:
        rotary_pos_emb, mscale = indexer.rotary_pos_emb(rotary_seq_len, packed_seq=False)
    if cfg.sequence_parallel and indexer.pg_collection.tp.size() > 1:
        x = dsa.gather_from_sequence_parallel_region(x, group=indexer.pg_collection.tp)
        qr = dsa.gather_from_sequence_parallel_region(qr, group=indexer.pg_collection.tp)
    seqlen, bsz, _ = x.size()
    q, _ = indexer.linear_wq_b(qr)
    q = q.reshape(seqlen, bsz, indexer.index_n_heads, indexer.index_head_dim)
    q = indexer._apply_rope(q, rotary_pos_emb, mscale)
    k, _ = indexer.linear_wk(x)
    k = indexer.k_norm(k)
    k = k.reshape(seqlen, bsz, 1, indexer.index_head_dim)
    k = indexer._apply_rope(k, rotary_pos_emb, mscale).reshape(seqlen, bsz, indexer.index_head_dim)
    q, k = _rotate(q), _rotate(k)
    weights, _ = indexer.linear_weights_proj(x)
    weights = weights * (indexer.index_n_heads ** -0.5) * indexer.softmax_scale
    return q, weights, k


def _make_modules():
    dsa = _dsa_module()
    from megatron.core.transformer.enums import AttnMaskType

    class LibdsaDSAIndexer(dsa.DSAIndexer):
        """A DSAIndexer whose _compute_index_scores is libdsa's (compute_index_scores): Megatron's own
        forward / forward_with_scores then run on it, dense [b, sq, sk] scores included. The
        rotation falls back to hadamard_transform without fast_hadamard_transform."""

        def _compute_index_scores(self, q, weights, k):
            return compute_index_scores(q, weights, k)

        def forward_topk(self, x, qr):
            """(topk_indices [b, sq, K] under the causal mask, (q, weights, k)) without dense scores."""
            q, weights, k = index_inputs(self, x, qr)
            return index_topk(q, weights, k, self.index_topk), (q, weights, k)

    class LibdsaDSAttention(dsa.DSAttention):
        """DSAttention on libdsa: index_topk (no [b, sq, sk] scores), dsa_fn, and in training the sparse
        indexer loss from the attention's own lse, attached to the output by Megatron's
        DSAIndexerLossAutoScaler and logged by its DSAIndexerLossLoggingHelper, as DSAttention does.
        The indexer may be Megatron's DSAIndexer or LibdsaDSAIndexer. Needs the causal mask type,
        no packed sequences, query / key / value in the shared-latent layout (dsa_fn), and
        dsa_indexer_use_sparse_loss=True when dsa_indexer_loss_coeff > 0 (coeff 0 skips the loss).
        Class attributes: check_layout (dsa_fn's checks), deterministic (libdsa's backwards)."""

        check_layout = True
        deterministic = False

        def forward(self, query, key, value, attention_mask, x, qr, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None):
            fn = "libdsa.megatron.LibdsaDSAttention"
            if packed_seq_params is not None:
                _unsupported(f"{fn}: packed sequences are not supported (Megatron's DSAttention neither)")
            if attn_mask_type != AttnMaskType.causal or attention_bias is not None:
                _unsupported(f"{fn}: only attn_mask_type=AttnMaskType.causal without attention_bias is "
                             f"supported, got {attn_mask_type} and bias {attention_bias is not None}")
            x, qr = x.detach(), qr.detach()
            q_idx, weights, k_idx = index_inputs(self.indexer, x, qr)
            topk_indices = index_topk(q_idx, weights, k_idx, self.indexer.index_topk)
            output, lse = dsa_fn(query, key, value, topk_indices, self.softmax_scale,
                                 deterministic=self.deterministic, check_layout=self.check_layout,
                                 return_lse=True)
            coeff = getattr(self.config, "dsa_indexer_loss_coeff", 0.0) or 0.0
            if self.training and torch.is_grad_enabled() and coeff != 0:
                if not getattr(self.config, "dsa_indexer_use_sparse_loss", False):
                    _unsupported(f"{fn}: dsa_indexer_use_sparse_loss=False (the dense KL loss) is not "
                                 "libdsa's; set it to True")
                z = index_slot_scores(q_idx, weights, k_idx, topk_indices, deterministic=self.deterministic)
                loss = sparse_indexer_loss(z, topk_indices, query.detach(), key.detach(), self.softmax_scale,
                                           coeff, lse=lse, pg_collection=self.indexer.pg_collection,
                                           check_layout=False)
                if coeff > 0:
                    dsa.DSAIndexerLossLoggingHelper.save_loss_to_tracker(
                        loss=loss, layer_number=self.layer_number, num_layers=self.config.num_layers)
                output = dsa.DSAIndexerLossAutoScaler.apply(output, loss)
            return output

    return LibdsaDSAIndexer, LibdsaDSAttention


_modules = None


def __getattr__(name):
    # LibdsaDSAIndexer / LibdsaDSAttention subclass Megatron's classes: built on first access
    global _modules
    if name in ("LibdsaDSAIndexer", "LibdsaDSAttention"):
        if _modules is None:
            _modules = _make_modules()
        return _modules[0] if name == "LibdsaDSAIndexer" else _modules[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def torch_backend():
    """Megatron's LocalSpecProvider plus the linear() its DSA spec asks for (get_dsa_module_spec_for_backend
    takes backend.linear() for the indexer's projections, which only Transformer Engine's provider
    has): a plain torch linear layer, duplicated on every tensor-parallel rank as the spec's
    parallel_mode="duplicated" says. For Megatron's DSA spec without Transformer Engine."""
    from megatron.core.models.backends import LocalSpecProvider

    class DuplicatedLinear(torch.nn.Module):
        def __init__(self, input_size, output_size, *, config, init_method, bias=False, skip_bias_add=False,
                     skip_weight_param_allocation=False, parallel_mode="duplicated", **kwargs):
            super().__init__()
            _require(not bias and not skip_weight_param_allocation and parallel_mode == "duplicated",
                     "libdsa.megatron.torch_backend: its linear layer has no bias, allocates its weight and "
                     "is duplicated across ranks")
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            init_method(self.weight)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight), None

    class TorchSpecProvider(LocalSpecProvider):
        def linear(self):
            return DuplicatedLinear

    return TorchSpecProvider()


def build_dsattention(config, pg_collection, *, backend=None, use_libdsa: bool = True, layer_number=1,
                      softmax_scale: Optional[float] = None):
    """The core attention of Megatron's DSA spec (get_dsa_module_spec_for_backend(config, backend)
    .submodules.core_attention: DSAttention with its DSAIndexer), with libdsa's classes
    (libdsa_dsa_spec) unless use_libdsa is False, built as MLASelfAttention builds it: causal mask,
    softmax_scale (default) mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim). backend: default
    torch_backend(); Transformer Engine's TESpecProvider() works the same way for the swap. With
    config.bf16 the module is cast to bfloat16, as Megatron's Float16Module casts a model: the local
    provider's norms (the indexer's k_norm, a torch.nn.LayerNorm) allocate fp32 weights, which CUDA's
    layer_norm does not take with bf16 inputs."""
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_mscale
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_dsa_module_spec_for_backend
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module
    spec = get_dsa_module_spec_for_backend(config, backend if backend is not None else torch_backend())
    if use_libdsa:
        spec = libdsa_dsa_spec(spec)
    q_head_dim = config.qk_head_dim + config.qk_pos_emb_head_dim
    if softmax_scale is None:
        mscale = _yarn_get_mscale(config.rotary_scaling_factor, config.mscale_all_dim)
        softmax_scale = mscale * mscale / q_head_dim ** 0.5
    mod = build_module(spec.submodules.core_attention, config=config, layer_number=layer_number,
                       attn_mask_type=AttnMaskType.causal, attention_type="self", softmax_scale=softmax_scale,
                       k_channels=q_head_dim, v_channels=config.v_head_dim, pg_collection=pg_collection)
    return mod.bfloat16() if getattr(config, "bf16", False) else mod


def libdsa_dsa_spec(spec):
    """A copy of a Megatron ModuleSpec with DSAttention replaced by LibdsaDSAttention and DSAIndexer
    by LibdsaDSAIndexer, wherever they sit in it (e.g. get_dsa_module_spec_for_backend's
    MLASelfAttention spec, or its submodules.core_attention). The input spec is not modified."""
    dsa = _dsa_module()
    swap = {dsa.DSAttention: __getattr__("LibdsaDSAttention"), dsa.DSAIndexer: __getattr__("LibdsaDSAIndexer")}

    def walk(node):
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            changes = {}
            for f in dataclasses.fields(node):
                v = getattr(node, f.name)
                if f.name == "module" and isinstance(v, type) and v in swap:
                    changes[f.name] = swap[v]
                elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                    changes[f.name] = walk(v)
            return dataclasses.replace(node, **changes) if changes else node
        return node

    return walk(spec)
