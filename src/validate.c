/*
 * validate.c - the argument checks of top-k, the indexer and sparse attention forward/backward,
 * shared by each GPU op and its dsa_ref_ twin (one contract for both). Pure host code: pointers
 * are compared and their alignment tested, never dereferenced (except the plan view struct of the
 * indexer, which is a host struct in both cases). Each check writes a copy of the params with
 * every 0 (= contiguous default) stride filled in.
 *
 * Rules common to all four:
 *  - Counts are >= 0, token/row counts <= INT32_MAX, key counts < 2^31 - 1, K in 1..2048.
 *  - Zero-size work (no token / no row) is valid and then no pointer is checked (any may be NULL;
 *    the indexer's plan struct is always required, it carries T_q). With num_kv = 0, kv and dkv
 *    may be NULL (every slot is invalid); with columns = 0, top-k's scores may be NULL.
 *  - A row stride is >= the row length. A [T, H, D] tensor with two strides may be token-major or
 *    head-major: the smaller stride is >= D and the larger >= smaller * (extent of the smaller's
 *    dimension), so no two rows overlap. Negative strides are rejected.
 *  - bf16 tensors the kernels read with 16-byte vectors (q, kv, out, dout, dq, dkv, index_q,
 *    index_k) are 16-byte aligned with strides that are multiples of 8 elements; fp32 and int32
 *    tensors are 4-byte aligned.
 *  - The byte extent of every tensor fits int64 (checked multiplication).
 *  - No output overlaps an input or another output: their byte ranges [ptr, ptr + extent) are
 *    compared (docs/contract.md section 13.3); inputs may alias each other.
 *  - Enum-like fields hold one of their values (weights_dtype, engine, deterministic, and the plan
 *    view's all_rows_nonempty); the indexer's plan view gets the checks of contract section 5.
 */
#include <limits.h>
#include <math.h>
#include "internal.h"

#define DSA_MAX_ROWS ((int64_t)INT32_MAX)          /* tokens / rows: int32 row ids */
#define DSA_MAX_KEYS ((int64_t)INT32_MAX - 1)      /* keys < 2^31 - 1 */

static dsa_status fail(const char *fn, const char *what) {
  return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s", fn, what);
}

static dsa_status check_range(const char *fn, const char *name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is outside %lld..%lld", fn, name,
                    (long long)v, (long long)lo, (long long)hi);
  return DSA_SUCCESS;
}

static dsa_status check_ptr(const char *fn, const char *name, const void *ptr, size_t align) {
  if (ptr == NULL) return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
  if ((uintptr_t)ptr % align != 0)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s is not %zu-byte aligned", fn, name, align);
  return DSA_SUCCESS;
}

/* An optional pointer: NULL is fine, otherwise it must be aligned. */
static dsa_status check_opt_ptr(const char *fn, const char *name, const void *ptr, size_t align) {
  if (ptr != NULL && (uintptr_t)ptr % align != 0)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s is not %zu-byte aligned", fn, name, align);
  return DSA_SUCCESS;
}

/* Stride of a vector-accessed bf16 tensor: a multiple of 8 elements (16 bytes). */
static dsa_status check_vec_stride(const char *fn, const char *name, int64_t stride) {
  if (stride % 8 != 0)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is not a multiple of 8", fn, name,
                    (long long)stride);
  return DSA_SUCCESS;
}

/* Resolves a row stride (0 -> def) and checks it against the row length. */
static dsa_status resolve_row_stride(const char *fn, const char *name, int64_t *stride,
                                     int64_t row_len, int64_t def) {
  if (*stride < 0)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is negative", fn, name,
                    (long long)*stride);
  if (*stride == 0) *stride = def;
  if (*stride < row_len)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is below the row length %lld", fn,
                    name, (long long)*stride, (long long)row_len);
  return DSA_SUCCESS;
}

/* Resolves the two strides of a [T, H, D] tensor (0 -> H*D and D) and checks that no two rows
 * overlap, in token-major or head-major order. */
static dsa_status resolve_3d_strides(const char *fn, const char *st_name, const char *sh_name,
                                     int64_t T, int64_t H, int64_t D, int64_t *st, int64_t *sh) {
  int64_t need;
  if (*st < 0)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is negative", fn, st_name,
                    (long long)*st);
  if (*sh < 0)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is negative", fn, sh_name,
                    (long long)*sh);
  if (*st == 0) *st = H * D;
  if (*sh == 0) *sh = D;
  if (*sh <= *st) { /* head-major inside a token: heads are the inner rows */
    if (*sh < D)
      return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is below the row length %lld", fn,
                      sh_name, (long long)*sh, (long long)D);
    if (__builtin_mul_overflow(*sh, H, &need) || *st < need)
      return dsa_fail(DSA_ERROR_INVALID_ARGUMENT,
                      "%s: %s = %lld is below %s * num_heads = %lld * %lld (rows overlap)", fn,
                      st_name, (long long)*st, sh_name, (long long)*sh, (long long)H);
  } else { /* token-inner layout: tokens are the inner rows */
    if (*st < D)
      return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: %s = %lld is below the row length %lld", fn,
                      st_name, (long long)*st, (long long)D);
    if (__builtin_mul_overflow(*st, T, &need) || *sh < need)
      return dsa_fail(DSA_ERROR_INVALID_ARGUMENT,
                      "%s: %s = %lld is below %s * num_tokens = %lld * %lld (rows overlap)", fn,
                      sh_name, (long long)*sh, st_name, (long long)*st, (long long)T);
  }
  return DSA_SUCCESS;
}

/* The byte extent of a tensor, ((e0-1)*s0 + (e1-1)*s1 + inner) * elem, must fit int64. */
static dsa_status check_extent(const char *fn, const char *name, int64_t e0, int64_t s0, int64_t e1,
                               int64_t s1, int64_t inner, int64_t elem) {
  int64_t a = 0, b = 0, t;
  if (e0 <= 0 || e1 <= 0 || inner <= 0) return DSA_SUCCESS;
  if (__builtin_mul_overflow(e0 - 1, s0, &a) || __builtin_mul_overflow(e1 - 1, s1, &b) ||
      __builtin_add_overflow(a, b, &t) || __builtin_add_overflow(t, inner, &t) ||
      __builtin_mul_overflow(t, elem, &t))
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: the byte size of %s overflows int64", fn,
                    name);
  return DSA_SUCCESS;
}

/* ---- aliasing (docs/contract.md section 13.3) -------------------------------------------------- */
/* The byte range [lo, hi) a tensor covers; lo == hi for an absent or empty tensor. */
typedef struct {
  const char *name;
  uintptr_t lo, hi;
} span;

/* The span of a tensor whose extent check_extent has already accepted (so the byte count fits
 * int64): ((e0 - 1) * s0 + (e1 - 1) * s1 + inner) * elem bytes from ptr. */
static span span_of(const char *name, const void *ptr, int64_t e0, int64_t s0, int64_t e1, int64_t s1,
                    int64_t inner, int64_t elem) {
  span r;
  r.name = name;
  r.lo = r.hi = (uintptr_t)ptr;
  if (ptr == NULL || e0 <= 0 || e1 <= 0 || inner <= 0) return r;
  {
    const uint64_t bytes = ((uint64_t)(e0 - 1) * (uint64_t)s0 + (uint64_t)(e1 - 1) * (uint64_t)s1 +
                            (uint64_t)inner) * (uint64_t)elem;
    r.hi = bytes > UINTPTR_MAX - r.lo ? UINTPTR_MAX : r.lo + (uintptr_t)bytes;
  }
  return r;
}
/* A 1-D array of n elements. */
static span span_1d(const char *name, const void *ptr, int64_t n, int64_t elem) {
  return span_of(name, ptr, 1, 0, 1, 0, n, elem);
}

static int spans_overlap(const span *a, const span *b) {
  return a->lo < a->hi && b->lo < b->hi && a->lo < b->hi && b->lo < a->hi;
}

/* Every output against every input and every other output. */
static dsa_status check_no_alias(const char *fn, const span *outs, int nout, const span *ins, int nin) {
  for (int i = 0; i < nout; ++i) {
    for (int j = 0; j < nin; ++j)
      if (spans_overlap(&outs[i], &ins[j]))
        return dsa_fail(DSA_ERROR_INVALID_ARGUMENT,
                        "%s: output %s [%p, %p) overlaps input %s [%p, %p): an output may not alias "
                        "an input", fn, outs[i].name, (void *)outs[i].lo, (void *)outs[i].hi,
                        ins[j].name, (void *)ins[j].lo, (void *)ins[j].hi);
    for (int j = i + 1; j < nout; ++j)
      if (spans_overlap(&outs[i], &outs[j]))
        return dsa_fail(DSA_ERROR_INVALID_ARGUMENT,
                        "%s: output %s [%p, %p) overlaps output %s [%p, %p): outputs may not alias "
                        "each other", fn, outs[i].name, (void *)outs[i].lo, (void *)outs[i].hi,
                        outs[j].name, (void *)outs[j].lo, (void *)outs[j].hi);
  }
  return DSA_SUCCESS;
}

static dsa_status check_scale(const char *fn, float scale) {
  if (!isfinite(scale) || !(scale > 0.0f))
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: softmax_scale = %g is not finite and > 0", fn,
                    (double)scale);
  return DSA_SUCCESS;
}

static dsa_status check_head_dim(const char *fn, int32_t d) {
  if (d != 576 && d != 512)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: head_dim = %d is not 576 or 512", fn, (int)d);
  return DSA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * top-k
 * ------------------------------------------------------------------------------------------- */
dsa_status dsa_check_topk(const dsa_topk_params *p, const char *fn, dsa_topk_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_topk_params c = *p;
  DSA_TRY(check_range(fn, "rows", c.rows, 0, DSA_MAX_ROWS));
  DSA_TRY(check_range(fn, "columns", c.columns, 0, DSA_MAX_ROWS));
  DSA_TRY(check_range(fn, "k", c.k, 1, DSA_MAX_TOPK));
  DSA_TRY(resolve_row_stride(fn, "scores_stride", &c.scores_stride, c.columns, c.columns));
  DSA_TRY(resolve_row_stride(fn, "indices_stride", &c.indices_stride, c.k, c.k));
  DSA_TRY(check_extent(fn, "scores", c.rows, c.scores_stride, 1, 0, c.columns, 4));
  DSA_TRY(check_extent(fn, "indices", c.rows, c.indices_stride, 1, 0, c.k, 4));
  if (c.rows > 0) {
    if (c.columns > 0) DSA_TRY(check_ptr(fn, "scores", c.scores, 4));
    DSA_TRY(check_opt_ptr(fn, "lengths", c.lengths, 4));
    DSA_TRY(check_ptr(fn, "indices", c.indices, 4));
    const span ins[] = {span_of("scores", c.scores, c.rows, c.scores_stride, 1, 0, c.columns, 4),
                        span_1d("lengths", c.lengths, c.rows, 4)};
    const span outs[] = {span_of("indices", c.indices, c.rows, c.indices_stride, 1, 0, c.k, 4)};
    DSA_TRY(check_no_alias(fn, outs, 1, ins, 2));
  }
  *r = c;
  return DSA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * indexer
 * ------------------------------------------------------------------------------------------- */
dsa_status dsa_check_indexer(const dsa_indexer_params *p, const char *fn, dsa_indexer_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_indexer_params c = *p;
  const int64_t D = DSA_INDEX_HEAD_DIM;
  DSA_TRY(dsa_check_plan_view(c.plan, -1, -1, fn)); /* contract section 5 */
  const int64_t Tq = c.plan->num_queries, Tk = c.plan->total_key_tokens;
  DSA_TRY(check_range(fn, "num_heads", c.num_heads, 1, 64));
  DSA_TRY(check_range(fn, "topk", c.topk, 1, DSA_MAX_TOPK));
  if (c.weights_dtype != DSA_DTYPE_F32 && c.weights_dtype != DSA_DTYPE_BF16)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: weights_dtype = %d is not F32 or BF16", fn,
                    (int)c.weights_dtype);
  if (c.engine != DSA_INDEXER_ENGINE_DEFAULT && c.engine != DSA_INDEXER_ENGINE_CUBLAS &&
      c.engine != DSA_INDEXER_ENGINE_FUSED)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: engine = %d is not a dsa_indexer_engine", fn,
                    (int)c.engine);
  const int64_t H = c.num_heads, K = c.topk;
  const int64_t wsize = c.weights_dtype == DSA_DTYPE_F32 ? 4 : 2;
  DSA_TRY(resolve_3d_strides(fn, "q_stride_token", "q_stride_head", Tq, H, D, &c.q_stride_token,
                             &c.q_stride_head));
  DSA_TRY(check_vec_stride(fn, "q_stride_token", c.q_stride_token));
  DSA_TRY(check_vec_stride(fn, "q_stride_head", c.q_stride_head));
  DSA_TRY(resolve_row_stride(fn, "k_stride", &c.k_stride, D, D));
  DSA_TRY(check_vec_stride(fn, "k_stride", c.k_stride));
  DSA_TRY(resolve_row_stride(fn, "weights_stride", &c.weights_stride, H, H));
  DSA_TRY(resolve_row_stride(fn, "indices_stride", &c.indices_stride, K, K));
  DSA_TRY(check_extent(fn, "index_q", Tq, c.q_stride_token, H, c.q_stride_head, D, 2));
  DSA_TRY(check_extent(fn, "index_k", Tk, c.k_stride, 1, 0, D, 2));
  DSA_TRY(check_extent(fn, "weights", Tq, c.weights_stride, 1, 0, H, wsize));
  DSA_TRY(check_extent(fn, "indices", Tq, c.indices_stride, 1, 0, K, 4));
  if (Tq > 0) {
    DSA_TRY(check_ptr(fn, "index_q", c.index_q, 16));
    if (Tk > 0) DSA_TRY(check_ptr(fn, "index_k", c.index_k, 16));
    DSA_TRY(check_ptr(fn, "weights", c.weights, (size_t)wsize));
    DSA_TRY(check_ptr(fn, "indices", c.indices, 4));
    DSA_TRY(check_ptr(fn, "lengths", c.lengths, 4));
    const span ins[] = {span_of("index_q", c.index_q, Tq, c.q_stride_token, H, c.q_stride_head, D, 2),
                        span_of("index_k", c.index_k, Tk, c.k_stride, 1, 0, D, 2),
                        span_of("weights", c.weights, Tq, c.weights_stride, 1, 0, H, wsize),
                        span_1d("plan->starts", c.plan->starts, Tq, 4),
                        span_1d("plan->causal_lengths", c.plan->causal_lengths, Tq, 4)};
    const span outs[] = {span_of("indices", c.indices, Tq, c.indices_stride, 1, 0, K, 4),
                         span_1d("lengths", c.lengths, Tq, 4)};
    DSA_TRY(check_no_alias(fn, outs, 2, ins, 5));
  }
  *r = c;
  return DSA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * sparse attention
 * ------------------------------------------------------------------------------------------- */
/* An fp32 [T, K] slot tensor: stride resolved (0: K), extent checked, pointer 4-aligned when
 * required (optional: NULL accepted). */
static dsa_status check_slot_tensor(const char *fn, const char *name, const char *stride_name,
                                    const void *ptr, int64_t T, int64_t K, int64_t *stride,
                                    int optional) {
  DSA_TRY(resolve_row_stride(fn, stride_name, stride, K, K));
  DSA_TRY(check_extent(fn, name, T, *stride, 1, 0, K, 4));
  if (T > 0) {
    if (optional) DSA_TRY(check_opt_ptr(fn, name, ptr, 4));
    else DSA_TRY(check_ptr(fn, name, ptr, 4));
  }
  return DSA_SUCCESS;
}

/* The checks forward and backward share: sizes, scale, q / kv / indices. */
static dsa_status check_attn_common(const char *fn, int64_t T, int32_t H, int32_t Dh, int64_t Tkv,
                                    int32_t K, float scale, int64_t *q_st, int64_t *q_sh,
                                    int64_t *kv_stride, int64_t *idx_stride) {
  DSA_TRY(check_range(fn, "num_tokens", T, 0, DSA_MAX_ROWS));
  DSA_TRY(check_range(fn, "num_heads", H, 1, DSA_MAX_HEADS));
  DSA_TRY(check_head_dim(fn, Dh));
  DSA_TRY(check_range(fn, "num_kv", Tkv, 0, DSA_MAX_KEYS));
  DSA_TRY(check_range(fn, "topk", K, 1, DSA_MAX_ATTN_TOPK));
  DSA_TRY(check_scale(fn, scale));
  DSA_TRY(resolve_3d_strides(fn, "q_stride_token", "q_stride_head", T, H, Dh, q_st, q_sh));
  DSA_TRY(check_vec_stride(fn, "q_stride_token", *q_st));
  DSA_TRY(check_vec_stride(fn, "q_stride_head", *q_sh));
  DSA_TRY(resolve_row_stride(fn, "kv_stride", kv_stride, Dh, Dh));
  DSA_TRY(check_vec_stride(fn, "kv_stride", *kv_stride));
  DSA_TRY(resolve_row_stride(fn, "indices_stride", idx_stride, K, K));
  DSA_TRY(check_extent(fn, "q", T, *q_st, H, *q_sh, Dh, 2));
  DSA_TRY(check_extent(fn, "kv", Tkv, *kv_stride, 1, 0, Dh, 2));
  DSA_TRY(check_extent(fn, "indices", T, *idx_stride, 1, 0, K, 4));
  DSA_TRY(check_extent(fn, "lse", T, H, 1, 0, 1, 4));
  return DSA_SUCCESS;
}

/* The pointers forward, backward and slot target read alike: q, kv (when there are keys), indices,
 * and the optional topk_length and sink. */
static dsa_status check_attn_inputs(const char *fn, const void *q, int64_t num_kv, const void *kv,
                                    const int32_t *indices, const int32_t *topk_length, const float *sink) {
  DSA_TRY(check_ptr(fn, "q", q, 16));
  if (num_kv > 0) DSA_TRY(check_ptr(fn, "kv", kv, 16));
  DSA_TRY(check_ptr(fn, "indices", indices, 4));
  DSA_TRY(check_opt_ptr(fn, "topk_length", topk_length, 4));
  DSA_TRY(check_opt_ptr(fn, "sink", sink, 4));
  return DSA_SUCCESS;
}

/* A [T, H, 512] bf16 tensor (out, dout): strides resolved, vector-aligned. */
static dsa_status check_value_tensor(const char *fn, const char *name, const char *st_name,
                                     const char *sh_name, int64_t T, int64_t H, int64_t *st,
                                     int64_t *sh) {
  DSA_TRY(resolve_3d_strides(fn, st_name, sh_name, T, H, DSA_VALUE_DIM, st, sh));
  DSA_TRY(check_vec_stride(fn, st_name, *st));
  DSA_TRY(check_vec_stride(fn, sh_name, *sh));
  DSA_TRY(check_extent(fn, name, T, *st, H, *sh, DSA_VALUE_DIM, 2));
  return DSA_SUCCESS;
}

dsa_status dsa_check_attn_fwd(const dsa_attn_fwd_params *p, const char *fn,
                              dsa_attn_fwd_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_attn_fwd_params c = *p;
  DSA_TRY(check_attn_common(fn, c.num_tokens, c.num_heads, c.head_dim, c.num_kv, c.topk,
                            c.softmax_scale, &c.q_stride_token, &c.q_stride_head, &c.kv_stride,
                            &c.indices_stride));
  DSA_TRY(check_value_tensor(fn, "out", "out_stride_token", "out_stride_head", c.num_tokens,
                             c.num_heads, &c.out_stride_token, &c.out_stride_head));
  if (c.num_tokens > 0) {
    DSA_TRY(check_attn_inputs(fn, c.q, c.num_kv, c.kv, c.indices, c.topk_length, c.sink));
    DSA_TRY(check_ptr(fn, "out", c.out, 16));
    DSA_TRY(check_ptr(fn, "lse", c.lse, 4));
    DSA_TRY(check_opt_ptr(fn, "max_logits", c.max_logits, 4));
    const int64_t T = c.num_tokens, H = c.num_heads;
    const span ins[] = {span_of("q", c.q, T, c.q_stride_token, H, c.q_stride_head, c.head_dim, 2),
                        span_of("kv", c.kv, c.num_kv, c.kv_stride, 1, 0, c.head_dim, 2),
                        span_of("indices", c.indices, T, c.indices_stride, 1, 0, c.topk, 4),
                        span_1d("topk_length", c.topk_length, T, 4), span_1d("sink", c.sink, H, 4)};
    const span outs[] = {span_of("out", c.out, T, c.out_stride_token, H, c.out_stride_head,
                                 DSA_VALUE_DIM, 2),
                         span_1d("lse", c.lse, T * H, 4), span_1d("max_logits", c.max_logits, T * H, 4)};
    DSA_TRY(check_no_alias(fn, outs, 3, ins, 5));
  }
  *r = c;
  return DSA_SUCCESS;
}

dsa_status dsa_check_attn_bwd(const dsa_attn_bwd_params *p, const char *fn,
                              dsa_attn_bwd_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_attn_bwd_params c = *p;
  DSA_TRY(check_attn_common(fn, c.num_tokens, c.num_heads, c.head_dim, c.num_kv, c.topk,
                            c.softmax_scale, &c.q_stride_token, &c.q_stride_head, &c.kv_stride,
                            &c.indices_stride));
  if (c.deterministic != 0 && c.deterministic != 1)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: deterministic = %d is not 0 or 1", fn,
                    (int)c.deterministic);
  DSA_TRY(check_value_tensor(fn, "out", "out_stride_token", "out_stride_head", c.num_tokens,
                             c.num_heads, &c.out_stride_token, &c.out_stride_head));
  DSA_TRY(check_value_tensor(fn, "dout", "dout_stride_token", "dout_stride_head", c.num_tokens,
                             c.num_heads, &c.dout_stride_token, &c.dout_stride_head));
  DSA_TRY(resolve_3d_strides(fn, "dq_stride_token", "dq_stride_head", c.num_tokens, c.num_heads,
                             c.head_dim, &c.dq_stride_token, &c.dq_stride_head));
  DSA_TRY(check_vec_stride(fn, "dq_stride_token", c.dq_stride_token));
  DSA_TRY(check_vec_stride(fn, "dq_stride_head", c.dq_stride_head));
  DSA_TRY(check_extent(fn, "dq", c.num_tokens, c.dq_stride_token, c.num_heads, c.dq_stride_head,
                       c.head_dim, 2));
  DSA_TRY(resolve_row_stride(fn, "dkv_stride", &c.dkv_stride, c.head_dim, c.head_dim));
  DSA_TRY(check_vec_stride(fn, "dkv_stride", c.dkv_stride));
  DSA_TRY(check_extent(fn, "dkv", c.num_kv, c.dkv_stride, 1, 0, c.head_dim, 2));
  DSA_TRY(check_slot_tensor(fn, "slot_target", "slot_target_stride", c.slot_target, c.num_tokens, c.topk,
                            &c.slot_target_stride, 1));
  if (c.num_tokens > 0) {
    DSA_TRY(check_attn_inputs(fn, c.q, c.num_kv, c.kv, c.indices, c.topk_length, c.sink));
    DSA_TRY(check_ptr(fn, "out", c.out, 16));
    DSA_TRY(check_ptr(fn, "dout", c.dout, 16));
    DSA_TRY(check_ptr(fn, "lse", c.lse, 4));
    DSA_TRY(check_ptr(fn, "dq", c.dq, 16));
    if (c.num_kv > 0) DSA_TRY(check_ptr(fn, "dkv", c.dkv, 16));
    DSA_TRY(check_opt_ptr(fn, "dsink", c.dsink, 4));
  } else {
    /* no tokens still writes the gradients (dkv = 0, dsink = 0) through the pointers given */
    if (c.num_kv > 0) DSA_TRY(check_opt_ptr(fn, "dkv", c.dkv, 16));
    DSA_TRY(check_opt_ptr(fn, "dsink", c.dsink, 4));
  }
  {
    /* with no tokens nothing is read: only the two written gradients are compared */
    const int64_t T = c.num_tokens, H = c.num_heads, Tr = c.num_tokens > 0 ? c.num_tokens : 0;
    const span ins[] = {span_of("q", c.q, Tr, c.q_stride_token, H, c.q_stride_head, c.head_dim, 2),
                        span_of("kv", c.kv, Tr > 0 ? c.num_kv : 0, c.kv_stride, 1, 0, c.head_dim, 2),
                        span_of("indices", c.indices, Tr, c.indices_stride, 1, 0, c.topk, 4),
                        span_1d("topk_length", c.topk_length, Tr, 4),
                        span_1d("sink", c.sink, Tr > 0 ? H : 0, 4),
                        span_of("out", c.out, Tr, c.out_stride_token, H, c.out_stride_head,
                                DSA_VALUE_DIM, 2),
                        span_of("dout", c.dout, Tr, c.dout_stride_token, H, c.dout_stride_head,
                                DSA_VALUE_DIM, 2),
                        span_1d("lse", c.lse, Tr * H, 4)};
    const span outs[] = {span_of("dq", c.dq, T, c.dq_stride_token, H, c.dq_stride_head, c.head_dim, 2),
                         span_of("dkv", c.dkv, c.num_kv, c.dkv_stride, 1, 0, c.head_dim, 2),
                         span_1d("dsink", c.dsink, H, 4),
                         span_of("slot_target", c.slot_target, Tr, c.slot_target_stride, 1, 0, c.topk, 4)};
    DSA_TRY(check_no_alias(fn, outs, 4, ins, 8));
  }
  *r = c;
  return DSA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * indexer training (docs/indexer-training.md)
 * ------------------------------------------------------------------------------------------- */
dsa_status dsa_check_slot_target(const dsa_slot_target_params *p, const char *fn,
                                 dsa_slot_target_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_slot_target_params c = *p;
  DSA_TRY(check_attn_common(fn, c.num_tokens, c.num_heads, c.head_dim, c.num_kv, c.topk,
                            c.softmax_scale, &c.q_stride_token, &c.q_stride_head, &c.kv_stride,
                            &c.indices_stride));
  DSA_TRY(check_slot_tensor(fn, "target", "target_stride", c.target, c.num_tokens, c.topk,
                            &c.target_stride, 0));
  if (c.num_tokens > 0) {
    DSA_TRY(check_attn_inputs(fn, c.q, c.num_kv, c.kv, c.indices, c.topk_length, c.sink));
    DSA_TRY(check_ptr(fn, "lse", c.lse, 4));
  }
  {
    const int64_t T = c.num_tokens, H = c.num_heads;
    const span ins[] = {span_of("q", c.q, T, c.q_stride_token, H, c.q_stride_head, c.head_dim, 2),
                        span_of("kv", c.kv, T > 0 ? c.num_kv : 0, c.kv_stride, 1, 0, c.head_dim, 2),
                        span_of("indices", c.indices, T, c.indices_stride, 1, 0, c.topk, 4),
                        span_1d("topk_length", c.topk_length, T, 4), span_1d("sink", c.sink, T > 0 ? H : 0, 4),
                        span_1d("lse", c.lse, T * H, 4)};
    const span outs[] = {span_of("target", c.target, T, c.target_stride, 1, 0, c.topk, 4)};
    DSA_TRY(check_no_alias(fn, outs, 1, ins, 6));
  }
  *r = c;
  return DSA_SUCCESS;
}

/* The inputs the indexer's slot scores and its backward share, as spans for the aliasing check. */
static int indexer_slot_spans(const char *fn, int64_t T, int64_t Tk, int32_t H, int32_t K, const void *q,
                              int64_t q_st, int64_t q_sh, const void *k, int64_t k_stride, const void *w,
                              dsa_dtype w_dtype, int64_t w_stride, const int32_t *idx, int64_t idx_stride,
                              const int32_t *lengths, span *ins) {
  (void)fn;
  const int64_t D = DSA_INDEX_HEAD_DIM, wsize = w_dtype == DSA_DTYPE_F32 ? 4 : 2;
  ins[0] = span_of("index_q", q, T, q_st, H, q_sh, D, 2);
  ins[1] = span_of("index_k", k, T > 0 ? Tk : 0, k_stride, 1, 0, D, 2);
  ins[2] = span_of("weights", w, T, w_stride, 1, 0, H, wsize);
  ins[3] = span_of("indices", idx, T, idx_stride, 1, 0, K, 4);
  ins[4] = span_1d("lengths", lengths, T, 4);
  return 5;
}

/* What the indexer's slot scores and its backward share: sizes, index_q / index_k / weights /
 * indices strides and pointers. */
static dsa_status check_indexer_slots(const char *fn, int64_t T, int64_t Tk, int32_t H, int32_t K,
                                      const void *q, int64_t *q_st, int64_t *q_sh, const void *k,
                                      int64_t *k_stride, const void *w, dsa_dtype w_dtype,
                                      int64_t *w_stride, const int32_t *idx, int64_t *idx_stride,
                                      const int32_t *lengths) {
  const int64_t D = DSA_INDEX_HEAD_DIM;
  DSA_TRY(check_range(fn, "num_tokens", T, 0, DSA_MAX_ROWS));
  DSA_TRY(check_range(fn, "num_keys", Tk, 0, DSA_MAX_KEYS));
  DSA_TRY(check_range(fn, "num_heads", H, 1, 64));
  DSA_TRY(check_range(fn, "topk", K, 1, DSA_MAX_TOPK));
  if (w_dtype != DSA_DTYPE_F32 && w_dtype != DSA_DTYPE_BF16)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: weights_dtype = %d is not F32 or BF16", fn,
                    (int)w_dtype);
  const int64_t wsize = w_dtype == DSA_DTYPE_F32 ? 4 : 2;
  DSA_TRY(resolve_3d_strides(fn, "q_stride_token", "q_stride_head", T, H, D, q_st, q_sh));
  DSA_TRY(check_vec_stride(fn, "q_stride_token", *q_st));
  DSA_TRY(check_vec_stride(fn, "q_stride_head", *q_sh));
  DSA_TRY(resolve_row_stride(fn, "k_stride", k_stride, D, D));
  DSA_TRY(check_vec_stride(fn, "k_stride", *k_stride));
  DSA_TRY(resolve_row_stride(fn, "weights_stride", w_stride, H, H));
  DSA_TRY(resolve_row_stride(fn, "indices_stride", idx_stride, K, K));
  DSA_TRY(check_extent(fn, "index_q", T, *q_st, H, *q_sh, D, 2));
  DSA_TRY(check_extent(fn, "index_k", Tk, *k_stride, 1, 0, D, 2));
  DSA_TRY(check_extent(fn, "weights", T, *w_stride, 1, 0, H, wsize));
  DSA_TRY(check_extent(fn, "indices", T, *idx_stride, 1, 0, K, 4));
  if (T > 0) {
    DSA_TRY(check_ptr(fn, "index_q", q, 16));
    if (Tk > 0) DSA_TRY(check_ptr(fn, "index_k", k, 16));
    DSA_TRY(check_ptr(fn, "weights", w, (size_t)wsize));
    DSA_TRY(check_ptr(fn, "indices", idx, 4));
    DSA_TRY(check_opt_ptr(fn, "lengths", lengths, 4));
  }
  return DSA_SUCCESS;
}

dsa_status dsa_check_indexer_slot_scores(const dsa_indexer_slot_scores_params *p, const char *fn,
                                         dsa_indexer_slot_scores_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_indexer_slot_scores_params c = *p;
  DSA_TRY(check_indexer_slots(fn, c.num_tokens, c.num_keys, c.num_heads, c.topk, c.index_q,
                              &c.q_stride_token, &c.q_stride_head, c.index_k, &c.k_stride,
                              c.weights, c.weights_dtype, &c.weights_stride, c.indices,
                              &c.indices_stride, c.lengths));
  DSA_TRY(check_slot_tensor(fn, "scores", "scores_stride", c.scores, c.num_tokens, c.topk,
                            &c.scores_stride, 0));
  {
    span ins[5];
    const int n = indexer_slot_spans(fn, c.num_tokens, c.num_keys, c.num_heads, c.topk, c.index_q,
                                     c.q_stride_token, c.q_stride_head, c.index_k, c.k_stride, c.weights,
                                     c.weights_dtype, c.weights_stride, c.indices, c.indices_stride,
                                     c.lengths, ins);
    const span outs[] = {span_of("scores", c.scores, c.num_tokens, c.scores_stride, 1, 0, c.topk, 4)};
    DSA_TRY(check_no_alias(fn, outs, 1, ins, n));
  }
  *r = c;
  return DSA_SUCCESS;
}

dsa_status dsa_check_indexer_loss(const dsa_indexer_loss_params *p, const char *fn,
                                  dsa_indexer_loss_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_indexer_loss_params c = *p;
  DSA_TRY(check_range(fn, "num_tokens", c.num_tokens, 0, DSA_MAX_ROWS));
  DSA_TRY(check_range(fn, "topk", c.topk, 1, DSA_MAX_TOPK));
  DSA_TRY(check_range(fn, "num_keys", c.num_keys, 0, DSA_MAX_KEYS));
  if (!isfinite(c.coeff))
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: coeff = %g is not finite", fn, (double)c.coeff);
  DSA_TRY(resolve_row_stride(fn, "indices_stride", &c.indices_stride, c.topk, c.topk));
  DSA_TRY(check_extent(fn, "indices", c.num_tokens, c.indices_stride, 1, 0, c.topk, 4));
  DSA_TRY(check_slot_tensor(fn, "target", "target_stride", c.target, c.num_tokens, c.topk,
                            &c.target_stride, 0));
  DSA_TRY(check_slot_tensor(fn, "scores", "scores_stride", c.scores, c.num_tokens, c.topk,
                            &c.scores_stride, 0));
  DSA_TRY(check_slot_tensor(fn, "grad", "grad_stride", c.grad, c.num_tokens, c.topk,
                            &c.grad_stride, 1));
  /* the loss is written for any T (0 when no row counts) */
  DSA_TRY(check_ptr(fn, "loss", c.loss, 4));
  DSA_TRY(check_opt_ptr(fn, "grad_loss", c.grad_loss, 4));
  if (c.num_tokens > 0) {
    DSA_TRY(check_ptr(fn, "indices", c.indices, 4));
    DSA_TRY(check_opt_ptr(fn, "lengths", c.lengths, 4));
  }
  {
    const int64_t T = c.num_tokens, K = c.topk;
    const span ins[] = {span_of("indices", c.indices, T, c.indices_stride, 1, 0, K, 4),
                        span_1d("lengths", c.lengths, T, 4),
                        span_of("target", c.target, T, c.target_stride, 1, 0, K, 4),
                        span_of("scores", c.scores, T, c.scores_stride, 1, 0, K, 4),
                        span_1d("grad_loss", c.grad_loss, 1, 4)};
    const span outs[] = {span_1d("loss", c.loss, 1, 4), span_of("grad", c.grad, T, c.grad_stride, 1, 0, K, 4)};
    DSA_TRY(check_no_alias(fn, outs, 2, ins, 5));
  }
  *r = c;
  return DSA_SUCCESS;
}

dsa_status dsa_check_indexer_bwd(const dsa_indexer_bwd_params *p, const char *fn,
                                 dsa_indexer_bwd_params *r) {
  if (p == NULL) return fail(fn, "p is NULL");
  dsa_indexer_bwd_params c = *p;
  const int64_t D = DSA_INDEX_HEAD_DIM;
  DSA_TRY(check_indexer_slots(fn, c.num_tokens, c.num_keys, c.num_heads, c.topk, c.index_q,
                              &c.q_stride_token, &c.q_stride_head, c.index_k, &c.k_stride,
                              c.weights, c.weights_dtype, &c.weights_stride, c.indices,
                              &c.indices_stride, c.lengths));
  if (c.deterministic != 0 && c.deterministic != 1)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: deterministic = %d is not 0 or 1", fn,
                    (int)c.deterministic);
  DSA_TRY(check_slot_tensor(fn, "grad", "grad_stride", c.grad, c.num_tokens, c.topk,
                            &c.grad_stride, 0));
  DSA_TRY(resolve_3d_strides(fn, "dq_stride_token", "dq_stride_head", c.num_tokens, c.num_heads, D,
                             &c.dq_stride_token, &c.dq_stride_head));
  DSA_TRY(check_vec_stride(fn, "dq_stride_token", c.dq_stride_token));
  DSA_TRY(check_vec_stride(fn, "dq_stride_head", c.dq_stride_head));
  DSA_TRY(check_extent(fn, "d_index_q", c.num_tokens, c.dq_stride_token, c.num_heads,
                       c.dq_stride_head, D, 2));
  DSA_TRY(resolve_row_stride(fn, "dw_stride", &c.dw_stride, c.num_heads, c.num_heads));
  DSA_TRY(check_extent(fn, "d_weights", c.num_tokens, c.dw_stride, 1, 0, c.num_heads, 4));
  DSA_TRY(resolve_row_stride(fn, "dk_stride", &c.dk_stride, D, D));
  DSA_TRY(check_vec_stride(fn, "dk_stride", c.dk_stride));
  DSA_TRY(check_extent(fn, "d_index_k", c.num_keys, c.dk_stride, 1, 0, D, 2));
  if (c.num_tokens > 0) {
    DSA_TRY(check_ptr(fn, "d_index_q", c.d_index_q, 16));
    DSA_TRY(check_ptr(fn, "d_weights", c.d_weights, 4));
  }
  /* d_index_k is written (zeros) even when there are no tokens */
  if (c.num_keys > 0) DSA_TRY(check_ptr(fn, "d_index_k", c.d_index_k, 16));
  {
    span ins[6];
    const int n = indexer_slot_spans(fn, c.num_tokens, c.num_keys, c.num_heads, c.topk, c.index_q,
                                     c.q_stride_token, c.q_stride_head, c.index_k, c.k_stride, c.weights,
                                     c.weights_dtype, c.weights_stride, c.indices, c.indices_stride,
                                     c.lengths, ins);
    ins[n] = span_of("grad", c.grad, c.num_tokens, c.grad_stride, 1, 0, c.topk, 4);
    const span outs[] = {span_of("d_index_q", c.d_index_q, c.num_tokens, c.dq_stride_token, c.num_heads,
                                 c.dq_stride_head, D, 2),
                         span_of("d_weights", c.d_weights, c.num_tokens, c.dw_stride, 1, 0, c.num_heads, 4),
                         span_of("d_index_k", c.d_index_k, c.num_keys, c.dk_stride, 1, 0, D, 2)};
    DSA_TRY(check_no_alias(fn, outs, 3, ins, n + 1));
  }
  *r = c;
  return DSA_SUCCESS;
}
