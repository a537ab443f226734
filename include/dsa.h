/*
 * dsa.h - libdsa: DeepSeek Sparse Attention (DSA) kernels for Hopper, public C99 API.
 *
 * This header is the manual. Everything public starts with dsa_ / DSA_.
 *
 * Conventions shared by every op
 *  - A context (one per device) comes first, the CUDA stream comes last.
 *  - Tensors are raw device pointers (host pointers for dsa_ref_* and the planner) with sizes and
 *    strides counted in ELEMENTS. The innermost dimension is always contiguous. A stride of 0 means
 *    "the contiguous default" for that tensor, written next to each stride field.
 *  - bf16 tensors are passed as uint16_t storage (the raw bf16 bit pattern).
 *  - Ops that need scratch memory follow CUB's two-phase contract: call with workspace == NULL and
 *    the size is written to *workspace_bytes (always >= 1) and DSA_SUCCESS is returned, nothing else
 *    happens; call again with a workspace of at least that many bytes (any alignment is accepted).
 *    workspace == NULL is a size query and ctx may be NULL for it, in every op (dsa_topk,
 *    dsa_indexer_topk, dsa_sparse_attn_bwd, dsa_indexer_loss, dsa_indexer_bwd, dsa_plan_upload).
 *    The size with ctx == NULL is valid on any device and equals the size with a context, except
 *    for dsa_indexer_topk with DSA_INDEXER_ENGINE_DEFAULT, where it is the larger engine's (>= the
 *    size with any context; docs/contract.md section 13.2). The workspace must not overlap any
 *    tensor of the call.
 *  - Outputs may not alias inputs, nor each other: every op compares the byte ranges
 *    [ptr, ptr + extent) of its tensors (extent from sizes and strides) and rejects an overlap
 *    with DSA_ERROR_INVALID_ARGUMENT naming both. Inputs may alias each other. The one exception
 *    is dsa_compact_indices' in-place mode (out == indices with equal strides). docs/contract.md
 *    section 13.3 lists the pairs per op.
 *  - Enum-like fields must hold one of their values (a dsa_dtype, a dsa_indexer_engine,
 *    deterministic 0 / 1, a plan view's all_rows_nonempty 0 / 1); anything else is
 *    DSA_ERROR_INVALID_ARGUMENT.
 *  - The hot path never allocates, synchronises, queries the device or prints. All work is enqueued
 *    on the caller's stream. Zero-size work succeeds without a launch.
 *  - A failed call returns a status, writes nothing to any output, and leaves a message naming the
 *    argument and the offending value in dsa_last_error_message() (thread-local).
 *
 * What every op computes, its coordinates, edge cases and errors: docs/contract.md (the contract,
 * cited below by section). How the kernels meet it: docs/design.md.
 */
#ifndef DSA_H
#define DSA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA stream type, declared without including the CUDA headers (which are not strict-C99
 * clean): dsa_stream_t is the same type as cudaStream_t, so a cudaStream_t (or 0) passes as is. */
struct CUstream_st;
typedef struct CUstream_st *dsa_stream_t;

#if defined(_WIN32)
#define DSA_API
#else
#define DSA_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define DSA_VERSION_MAJOR 0
#define DSA_VERSION_MINOR 1
#define DSA_VERSION_PATCH 0
#define DSA_VERSION_NUMBER (DSA_VERSION_MAJOR * 10000 + DSA_VERSION_MINOR * 100 + DSA_VERSION_PATCH)
DSA_API const char *dsa_version_string(void); /* "0.1.0" */
DSA_API int dsa_version_number(void);         /* DSA_VERSION_NUMBER of the built library */

/* ---------------------------------------------------------------------------------------------
 * Status codes. The values are pinned: they never change between versions.
 * One list generates both the enum and dsa_status_string().
 * ------------------------------------------------------------------------------------------- */
#define DSA_STATUS_MAP(X)                                                                    \
  X(DSA_SUCCESS, 0, "success")                                                               \
  X(DSA_ERROR_INVALID_ARGUMENT, 1, "invalid argument")                                       \
  X(DSA_ERROR_UNSUPPORTED, 2, "unsupported device, architecture or feature")                 \
  X(DSA_ERROR_WORKSPACE_TOO_SMALL, 3, "workspace too small")                                 \
  X(DSA_ERROR_CUDA, 4, "CUDA runtime error")                                                 \
  X(DSA_ERROR_CUBLAS, 5, "cuBLAS error")                                                     \
  X(DSA_ERROR_NO_DEVICE, 6, "no CUDA device")                                                \
  X(DSA_ERROR_OUT_OF_HOST_MEMORY, 7, "host memory allocation failed")

typedef enum dsa_status {
#define DSA_STATUS_ENUM_(name, value, text) name = value,
  DSA_STATUS_MAP(DSA_STATUS_ENUM_)
#undef DSA_STATUS_ENUM_
  DSA_STATUS_COUNT_ = 8
} dsa_status;

DSA_API const char *dsa_status_string(dsa_status status);
/* The message of the last failed call on this thread ("" if none). It names the argument and the
 * value that was wrong, e.g. "dsa_sparse_attn_fwd: topk = 0 is outside 1..4096". */
DSA_API const char *dsa_last_error_message(void);

/* Element types where an op accepts more than one. */
typedef enum dsa_dtype {
  DSA_DTYPE_F32 = 0,
  DSA_DTYPE_BF16 = 1
} dsa_dtype;

/* Fixed dimensions of the model family (docs/contract.md section 1). */
#define DSA_INDEX_HEAD_DIM 128  /* indexer q / k dimension */
#define DSA_HEAD_DIM 576        /* attention q / kv dimension: 512 latent + 64 rope */
#define DSA_VALUE_DIM 512       /* value = the first 512 dims of each kv row */
#define DSA_MAX_TOPK 2048       /* largest K the top-k, the indexer and compaction select */
#define DSA_MAX_ATTN_TOPK 4096  /* largest K of the sparse attention (forward, backward, slot target):
                                 * index rows from any selector, e.g. a pooled indexer's 2051 keys */
#define DSA_MAX_HEADS 128       /* largest attention head count */

/* ---------------------------------------------------------------------------------------------
 * Context: one per device. Caches device attributes; creates the cuBLAS handle when first needed.
 * Not thread-safe: use one context per host thread (they are cheap).
 * ------------------------------------------------------------------------------------------- */
typedef struct dsa_context dsa_context;

/* Returns DSA_ERROR_NO_DEVICE when the machine has no CUDA device (never crashes),
 * DSA_ERROR_INVALID_ARGUMENT for a device ordinal out of range, and DSA_ERROR_UNSUPPORTED for a
 * device this build has no device code for (the message names its compute capability and the
 * architectures the library was built for; the default build runs on compute capability 9.0 and
 * newer). Selects nothing on the caller's thread beyond what cudaSetDevice does inside each call. */
DSA_API dsa_status dsa_context_create(dsa_context **ctx, int device);
DSA_API void dsa_context_destroy(dsa_context *ctx); /* NULL is a no-op */
/* Compute capability and SM count of the context's device (for callers choosing variants). */
DSA_API dsa_status dsa_context_device_info(const dsa_context *ctx, int *cc_major, int *cc_minor,
                                           int *sm_count);

/* ---------------------------------------------------------------------------------------------
 * Packed-sequence metadata (docs/contract.md section 4): planned once on the host, uploaded once,
 * reused by every layer.
 *
 * Coordinates: keys are rows of the padded storage [0, T_k). Document d occupies [P[d], P[d+1])
 * with P = cu_seqlens_padded (or cu_seqlens); its real tokens are [P[d], P[d] + R[d]),
 * R[d] = cu_seqlens[d+1] - cu_seqlens[d]. Local query row i is global position g = query_start + i.
 * ------------------------------------------------------------------------------------------- */
typedef struct dsa_plan_desc {
  const int32_t *cu_seqlens;        /* [num_seqs + 1] host; real lengths, cu[0] = 0 */
  const int32_t *cu_seqlens_padded; /* [num_seqs + 1] host; optional (NULL: = cu_seqlens) */
  int64_t num_seqs;                 /* S >= 1 */
  int64_t total_key_tokens;         /* T_k, 0 < T_k < 2^31 - 1 */
  int64_t query_start;              /* global position of local query row 0 (context parallel) */
  int64_t num_queries;              /* T_q; -1 means all of 0..T_k-1 (query_start must be 0) */
  const uint8_t *padding_mask;      /* [T_q] host; optional; nonzero marks a padding query */
  int64_t max_seqlen;               /* optional check against max(R); <= 0 means not given */
} dsa_plan_desc;

/* A view of a plan: the same struct describes the host plan and its uploaded device copy. An op
 * handed a view checks its scalars and the presence of its arrays (docs/contract.md section 5:
 * with num_queries > 0, e.g. max_seqlen_k in 1..total_key_tokens, num_segments in 1..num_queries,
 * all_rows_nonempty 0 or 1 and consistent with valid_row_indices / num_valid); a device view's
 * arrays are never read on the host, so their contents are the caller's (views from
 * dsa_plan_upload are always consistent). */
typedef struct dsa_plan_view {
  int64_t num_queries;      /* T_q */
  int64_t total_key_tokens; /* T_k */
  int64_t query_start;      /* global position of local query row 0 */
  int64_t num_segments;     /* runs of consecutive queries in one document */
  int64_t num_valid;        /* number of valid queries */
  int64_t num_key_sources;  /* sum(key_counts); 0 when key_source_indices is NULL (identity) */
  int32_t max_seqlen_q;     /* max query count of a segment */
  int32_t max_seqlen_k;     /* max key count of a segment */
  int32_t all_rows_nonempty; /* 1 iff every query is valid */
  int32_t reserved_;
  const int32_t *starts;             /* [T_q] P[doc] of each query */
  const int32_t *causal_lengths;     /* [T_q] visible keys, 0 for invalid queries */
  const uint8_t *query_valid;        /* [T_q] 1 valid, 0 invalid */
  const int64_t *valid_row_indices;  /* [num_valid]; NULL when all_rows_nonempty */
  const int32_t *segment_cu_q;       /* [num_segments + 1] */
  const int32_t *segment_cu_k;       /* [num_segments + 1] */
  const int32_t *q_causal_offsets;   /* [num_segments] */
  const int64_t *key_source_indices; /* [num_key_sources]; NULL in the identity case */
} dsa_plan_view;

typedef struct dsa_plan dsa_plan; /* opaque host plan, one allocation */

/* Plans on the host from host arrays; every check of docs/contract.md section 4 is a status with a
 * message. Allocates host memory once (this is not a hot-path call). */
DSA_API dsa_status dsa_plan_create(const dsa_plan_desc *desc, dsa_plan **plan);
DSA_API void dsa_plan_destroy(dsa_plan *plan); /* NULL is a no-op */
/* The host view: pointers into the plan, valid until dsa_plan_destroy. */
DSA_API const dsa_plan_view *dsa_plan_host_view(const dsa_plan *plan);
/* Uploads the plan into caller device memory with one cudaMemcpyAsync on `stream`.
 * Two-phase: device_buffer == NULL writes the size to *buffer_bytes and returns.
 * On success *device_view points into device_buffer (valid while the buffer lives). The host plan
 * must stay alive until the copy has completed (the copy reads it asynchronously). */
DSA_API dsa_status dsa_plan_upload(dsa_context *ctx, const dsa_plan *plan, void *device_buffer,
                                   size_t *buffer_bytes, dsa_plan_view *device_view,
                                   dsa_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Index compaction (docs/contract.md section 8) and head padding (section 3).
 * ------------------------------------------------------------------------------------------- */
/* Per row: keep entries with 0 <= idx < key_count (stable), sort them ascending, fill the rest
 * with -1; lengths[r] = number kept. Duplicates are kept. out may equal indices (in place) when
 * the strides are equal (rows interleaved with equal strides are allowed where no element is shared);
 * any other overlap of out with indices, and any overlap of lengths with either, is rejected.
 * lengths may be NULL. */
typedef struct dsa_compact_params {
  int64_t rows;
  int32_t k;                /* row width, 1..DSA_MAX_TOPK */
  int64_t key_count;        /* valid range is [0, key_count) */
  const int32_t *indices;   /* [rows, k], row stride indices_stride (0: k) */
  int64_t indices_stride;
  int32_t *out;             /* [rows, k], row stride out_stride (0: k) */
  int64_t out_stride;
  int32_t *lengths;         /* [rows] optional */
} dsa_compact_params;
DSA_API dsa_status dsa_compact_indices(dsa_context *ctx, const dsa_compact_params *p,
                                       dsa_stream_t stream);

/* Copies q [T, H, D] into q_out [T, Hp, D] (contiguous) with heads H..Hp-1 zero, and sink [H]
 * into sink_out [Hp] with the padded heads -inf (sink NULL: all -inf; sink_out NULL: skipped).
 * Hp >= H. The reverse (slicing back) needs no copy: use strides. */
typedef struct dsa_pad_heads_params {
  int64_t num_tokens;       /* T */
  int32_t num_heads;        /* H, 1..DSA_MAX_HEADS */
  int32_t padded_heads;     /* Hp >= H */
  int32_t head_dim;         /* D (576 or 512, any positive value is accepted) */
  const uint16_t *q;        /* [T, H, D] bf16; strides in elements (0: H*D and D) */
  int64_t q_stride_token, q_stride_head;
  uint16_t *q_out;          /* [T, Hp, D] bf16, contiguous */
  const float *sink;        /* [H] optional */
  float *sink_out;          /* [Hp] optional */
} dsa_pad_heads_params;
DSA_API dsa_status dsa_pad_heads(dsa_context *ctx, const dsa_pad_heads_params *p,
                                 dsa_stream_t stream);
/* The head count the reference would pad to on SM90 (docs/contract.md section 3): H if H % 64 == 0,
 * else 64 if 64 % H == 0; otherwise -1 (the reference rejects it). Interop helper only: libdsa
 * runs every H natively. */
DSA_API int dsa_padded_head_count(int num_heads);

/* ---------------------------------------------------------------------------------------------
 * Top-k (standalone radix select) and the lightning indexer with segmented causal top-k.
 * Ties: higher score first, equal scores by the smaller column; NaN ranks below every number.
 * Output per row: the selected columns ascending, then -1 up to K.
 * ------------------------------------------------------------------------------------------- */
typedef struct dsa_topk_params {
  int64_t rows;
  int64_t columns;          /* allocated columns per row (upper bound of lengths) */
  int32_t k;                /* 1..DSA_MAX_TOPK */
  const float *scores;      /* [rows, columns], row stride scores_stride (0: columns) */
  int64_t scores_stride;
  const int32_t *lengths;   /* [rows] valid columns of each row (clamped to [0, columns]); NULL: all */
  int32_t *indices;         /* [rows, k] out, row stride indices_stride (0: k) */
  int64_t indices_stride;
} dsa_topk_params;
/* workspace == NULL: a size query (always 1 byte); ctx may be NULL. Output indices may not overlap
 * scores or lengths. */
DSA_API dsa_status dsa_topk(dsa_context *ctx, const dsa_topk_params *p, void *workspace,
                            size_t *workspace_bytes, dsa_stream_t stream);

typedef enum dsa_indexer_engine {
  DSA_INDEXER_ENGINE_DEFAULT = 0, /* the faster engine on this device */
  DSA_INDEXER_ENGINE_CUBLAS = 1,  /* cuBLAS bf16 GEMMs over query chunks + a reduction kernel */
  DSA_INDEXER_ENGINE_FUSED = 2    /* fused tensor-core scoring, scores never leave the chip */
} dsa_indexer_engine;

/* score[t, s] = sum_h w[t, h] * ReLU(q[t, h, :] . k[s, :]) over the keys visible to query t
 * (plan), then its K best keys in global storage coordinates. */
typedef struct dsa_indexer_params {
  const dsa_plan_view *plan; /* device view (dsa_plan_upload) for the GPU, host view for dsa_ref_;
                                checked as docs/contract.md section 5 says */
  int32_t num_heads;         /* H_idx, 1..64 */
  int32_t topk;              /* K, 1..DSA_MAX_TOPK */
  const uint16_t *index_q;   /* [T_q, H_idx, 128] bf16; strides (0: H_idx*128 and 128) */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *index_k;   /* [T_k, 128] bf16; row stride (0: 128) */
  int64_t k_stride;
  const void *weights;       /* [T_q, H_idx], fp32 or bf16 (weights_dtype), already scaled */
  dsa_dtype weights_dtype;
  int64_t weights_stride;    /* row stride (0: H_idx) */
  int32_t *indices;          /* [T_q, K] out: ascending valid prefix, then -1; stride (0: K) */
  int64_t indices_stride;
  int32_t *lengths;          /* [T_q] out: min(K, causal_length), 0 for invalid queries */
  dsa_indexer_engine engine;
} dsa_indexer_params;
/* workspace == NULL: a size query; ctx may be NULL. With a context the size is that of the engine
 * that runs on its device; with ctx == NULL it is valid on any device: the same size for
 * DSA_INDEXER_ENGINE_CUBLAS / _FUSED, the larger engine's (cuBLAS) for _DEFAULT. The outputs
 * (indices, lengths) may not overlap index_q, index_k, weights, the plan's starts / causal_lengths,
 * or each other. */
DSA_API dsa_status dsa_indexer_topk(dsa_context *ctx, const dsa_indexer_params *p,
                                    void *workspace, size_t *workspace_bytes,
                                    dsa_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Sparse MLA attention (docs/contract.md section 9, with this project's rules):
 * slot j of row t counts iff (topk_length == NULL || j < topk_length[t]) && 0 <= idx < T_kv.
 * Duplicate slots are separate softmax terms. Rows with no valid slot: out = 0, lse = +inf,
 * max_logits = -inf, dq = 0.
 * ------------------------------------------------------------------------------------------- */
typedef struct dsa_attn_fwd_params {
  int64_t num_tokens;        /* T */
  int32_t num_heads;         /* H, 1..128 */
  int32_t head_dim;          /* D: 576 (or 512) */
  int64_t num_kv;            /* T_kv */
  int32_t topk;              /* K, 1..DSA_MAX_ATTN_TOPK */
  float softmax_scale;       /* finite, > 0 */
  const uint16_t *q;         /* [T, H, D] bf16; strides (0: H*D and D) */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *kv;        /* [T_kv, D] bf16; value = first 512 dims; row stride (0: D) */
  int64_t kv_stride;
  const int32_t *indices;    /* [T, K] int32, global storage rows; row stride (0: K) */
  int64_t indices_stride;
  const int32_t *topk_length; /* [T] optional */
  const float *sink;         /* [H] optional; +-inf allowed */
  uint16_t *out;             /* [T, H, 512] bf16 out; strides (0: H*512 and 512) */
  int64_t out_stride_token, out_stride_head;
  float *lse;                /* [T, H] fp32 out, natural log, sink excluded; contiguous */
  float *max_logits;         /* [T, H] fp32 out, optional; contiguous */
} dsa_attn_fwd_params;
/* out, lse and max_logits may not overlap q, kv, indices, topk_length, sink, or each other. */
DSA_API dsa_status dsa_sparse_attn_fwd(dsa_context *ctx, const dsa_attn_fwd_params *p,
                                       dsa_stream_t stream);

typedef struct dsa_attn_bwd_params {
  int64_t num_tokens;        /* T */
  int32_t num_heads;         /* H, 1..128 */
  int32_t head_dim;          /* D: 576 (or 512) */
  int64_t num_kv;            /* T_kv */
  int32_t topk;              /* K, 1..DSA_MAX_ATTN_TOPK */
  float softmax_scale;
  int32_t deterministic;     /* 0: fp32 atomics (dkv's low bits, and dq's where T_kv's accumulator
                                exceeds half the L2, vary run to run); 1: dq, dkv and dsink bitwise
                                identical run to run; other values are rejected */
  const uint16_t *q;         /* [T, H, D] bf16; strides (0: H*D and D) */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *kv;        /* [T_kv, D] bf16; row stride (0: D) */
  int64_t kv_stride;
  const int32_t *indices;    /* [T, K]; row stride (0: K) */
  int64_t indices_stride;
  const int32_t *topk_length; /* [T] optional */
  const float *sink;         /* [H] optional */
  const uint16_t *out;       /* [T, H, 512] bf16 forward output; strides (0: H*512 and 512) */
  int64_t out_stride_token, out_stride_head;
  const uint16_t *dout;      /* [T, H, 512] bf16; strides (0: H*512 and 512) */
  int64_t dout_stride_token, dout_stride_head;
  const float *lse;          /* [T, H] fp32 from the forward; contiguous */
  uint16_t *dq;              /* [T, H, D] bf16 out; strides (0: H*D and D) */
  int64_t dq_stride_token, dq_stride_head;
  uint16_t *dkv;             /* [T_kv, D] bf16 out; row stride (0: D) */
  int64_t dkv_stride;
  float *dsink;              /* [H] fp32 out, optional */
  /* Optional [T, K] fp32 out: the slot target of dsa_attn_slot_target (below) for these inputs,
   * a[t, j] = sum_h P[t, h, j], computed from the P the backward recomputes (NULL: not computed).
   * Row stride slot_target_stride (0: K). Bitwise reproducible in both modes. */
  float *slot_target;
  int64_t slot_target_stride;
} dsa_attn_bwd_params;
/* workspace == NULL: a size query; ctx may be NULL (the deterministic size needs a CUDA device
 * for CUB's sort scratch: DSA_ERROR_NO_DEVICE without one). dq, dkv, dsink and slot_target may not
 * overlap any input (q, kv, indices, topk_length, sink, out, dout, lse) or each other. */
DSA_API dsa_status dsa_sparse_attn_bwd(dsa_context *ctx, const dsa_attn_bwd_params *p,
                                       void *workspace, size_t *workspace_bytes,
                                       dsa_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Indexer training (docs/indexer-training.md has the math and the edge cases): the slot target
 * the attention gives each selected key, the indexer's scores at the same slots, the KL loss that
 * teaches the indexer to follow the attention and its gradient, and the indexer backward.
 * Slot j of row t is valid iff (lengths == NULL || j < clamp(lengths[t], 0, K)) and
 * 0 <= indices[t, j] < the key count; invalid slots read nothing and get 0 in every [T, K] output.
 * Each op has a GPU entry point (below, next to its params; kernels in cuda/indexer_train/) and a
 * CPU reference (dsa_ref_*, the oracle) running the same argument checks. fp32 accumulation on the
 * GPU; every [T, K] output element and every row of d_index_q / d_weights / d_index_k is written.
 * ------------------------------------------------------------------------------------------- */
/* a[t, j] = sum_h P[t, h, j], P = exp(scale * q[t, h] . kv[s_j] - L'[t, h]) the probabilities the
 * forward used (L' = logaddexp(lse, sink[h]) with a sink; rows with lse = +inf give 0). fp32. */
typedef struct dsa_slot_target_params {
  int64_t num_tokens;        /* T */
  int32_t num_heads;         /* H, 1..DSA_MAX_HEADS (the heads this rank holds: ranks sum a) */
  int32_t head_dim;          /* D: 576 (or 512) */
  int64_t num_kv;            /* T_kv */
  int32_t topk;              /* K, 1..DSA_MAX_ATTN_TOPK */
  float softmax_scale;       /* finite, > 0 */
  const uint16_t *q;         /* [T, H, D] bf16; strides (0: H*D and D) */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *kv;        /* [T_kv, D] bf16; row stride (0: D) */
  int64_t kv_stride;
  const int32_t *indices;    /* [T, K]; row stride (0: K) */
  int64_t indices_stride;
  const int32_t *topk_length; /* [T] optional */
  const float *sink;         /* [H] optional; +-inf allowed */
  const float *lse;          /* [T, H] fp32 from the forward, natural log, sink excluded; contiguous */
  float *target;             /* [T, K] fp32 out; row stride target_stride (0: K) */
  int64_t target_stride;
} dsa_slot_target_params;
/* No workspace. Bitwise reproducible (each a[t, j] sums its heads in a fixed order). The backward
 * computes the same a as an optional output (dsa_attn_bwd_params.slot_target), without a second
 * gather of the keys. */
DSA_API dsa_status dsa_attn_slot_target(dsa_context *ctx, const dsa_slot_target_params *p,
                                        dsa_stream_t stream);

/* z[t, j] = sum_h w[t, h] * ReLU(q_idx[t, h] . k_idx[s_j]) at the slots (the score the indexer ranked). */
typedef struct dsa_indexer_slot_scores_params {
  int64_t num_tokens;        /* T */
  int64_t num_keys;          /* T_k: rows of index_k */
  int32_t num_heads;         /* H_idx, 1..64 */
  int32_t topk;              /* K, 1..DSA_MAX_TOPK */
  const uint16_t *index_q;   /* [T, H_idx, 128] bf16; strides (0: H_idx*128 and 128) */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *index_k;   /* [T_k, 128] bf16; row stride (0: 128) */
  int64_t k_stride;
  const void *weights;       /* [T, H_idx] fp32 or bf16 (weights_dtype); row stride (0: H_idx) */
  dsa_dtype weights_dtype;
  int64_t weights_stride;
  const int32_t *indices;    /* [T, K] global rows of index_k; row stride (0: K) */
  int64_t indices_stride;
  const int32_t *lengths;    /* [T] optional */
  float *scores;             /* [T, K] fp32 out; row stride scores_stride (0: K) */
  int64_t scores_stride;
} dsa_indexer_slot_scores_params;
/* No workspace. Bitwise reproducible. */
DSA_API dsa_status dsa_indexer_slot_scores(dsa_context *ctx, const dsa_indexer_slot_scores_params *p,
                                           dsa_stream_t stream);

/* Per row with a counted target (a valid slot and sum_j a > 0): tgt = a / sum_j a,
 * p = softmax_j(z) over the valid slots; loss = coeff / N * sum_t sum_j tgt (log tgt - log p)
 * (tgt log tgt = 0 where tgt = 0), N = the number of counted rows (loss 0 when N = 0);
 * grad[t, j] = grad_loss * coeff / N * (p - tgt), 0 on rows not counted and at invalid slots. */
typedef struct dsa_indexer_loss_params {
  int64_t num_tokens;        /* T */
  int32_t topk;              /* K, 1..DSA_MAX_TOPK */
  int64_t num_keys;          /* slot valid iff 0 <= indices[t, j] < num_keys (and j < lengths[t]) */
  const int32_t *indices;    /* [T, K]; row stride (0: K) */
  int64_t indices_stride;
  const int32_t *lengths;    /* [T] optional */
  const float *target;       /* [T, K] fp32 a >= 0 (unnormalised); row stride (0: K) */
  int64_t target_stride;
  const float *scores;       /* [T, K] fp32 z; row stride (0: K) */
  int64_t scores_stride;
  float coeff;               /* finite */
  const float *grad_loss;    /* [1] optional incoming gradient of the loss (NULL: 1) */
  float *loss;               /* [1] fp32 out */
  float *grad;               /* [T, K] fp32 out, optional; row stride grad_stride (0: K) */
  int64_t grad_stride;
} dsa_indexer_loss_params;
/* Two-phase workspace (ctx may be NULL for the size query, which needs no device):
 * 4 * align256(4 T) + 512 bytes (per-row terms, then the scalars; 256 bytes of alignment slack).
 * The loss is a fixed-order reduction of the per-row terms: bitwise reproducible, like g. T = 0
 * writes loss = 0. */
DSA_API dsa_status dsa_indexer_loss(dsa_context *ctx, const dsa_indexer_loss_params *p,
                                    void *workspace, size_t *workspace_bytes, dsa_stream_t stream);

/* The indexer backward for a score gradient g [T, K] (fp32 accumulation; duplicates are separate slots):
 *   d_weights[t, h] = sum_j g * ReLU(q_idx[t, h] . k_idx[s_j])
 *   d_index_q[t, h] = sum_j g * w[t, h] * [q_idx[t, h] . k_idx[s_j] > 0] * k_idx[s_j]
 *   d_index_k[s]    = sum over (t, j) with s_j = s of g * sum_h w[t, h] * [q_idx[t, h] . k_idx[s] > 0] * q_idx[t, h]
 * Every row of d_index_q, d_weights and d_index_k is written (0 where nothing contributes). */
typedef struct dsa_indexer_bwd_params {
  int64_t num_tokens;        /* T */
  int64_t num_keys;          /* T_k */
  int32_t num_heads;         /* H_idx, 1..64 */
  int32_t topk;              /* K, 1..DSA_MAX_TOPK */
  int32_t deterministic;     /* 0 or 1: d_index_k bitwise identical run to run */
  const uint16_t *index_q;   /* [T, H_idx, 128] bf16; strides (0: H_idx*128 and 128) */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *index_k;   /* [T_k, 128] bf16; row stride (0: 128) */
  int64_t k_stride;
  const void *weights;       /* [T, H_idx] fp32 or bf16 (weights_dtype); row stride (0: H_idx) */
  dsa_dtype weights_dtype;
  int64_t weights_stride;
  const int32_t *indices;    /* [T, K]; row stride (0: K) */
  int64_t indices_stride;
  const int32_t *lengths;    /* [T] optional */
  const float *grad;         /* [T, K] fp32 g; row stride (0: K) */
  int64_t grad_stride;
  uint16_t *d_index_q;       /* [T, H_idx, 128] bf16 out; strides (0: H_idx*128 and 128) */
  int64_t dq_stride_token, dq_stride_head;
  float *d_weights;          /* [T, H_idx] fp32 out; row stride (0: H_idx) */
  int64_t dw_stride;
  uint16_t *d_index_k;       /* [T_k, 128] bf16 out; row stride (0: 128) */
  int64_t dk_stride;
} dsa_indexer_bwd_params;
/* Two-phase workspace (ctx may be NULL for the size query); 256-byte aligned regions plus 256
 * bytes of slack, no [T, T_k] term:
 *   deterministic = 0: align256(T_k * 128 * 4) + 256 (the fp32 d_index_k accumulator: atomics);
 *   deterministic = 1: 4 * align256(4 T K) + align256(8 (T_k + 1)) + align256(CUB radix-sort temp
 *     for T K pairs) + 256 (the slot list sorted by key; T K <= 2^31 - 1, else
 *     DSA_ERROR_UNSUPPORTED), and when T K > 0 also align256(512 min(T, 264) K) + align256(8 T_k) +
 *     align256(512 T_k) (the slot rows of up to 264 tokens at a time and their per-key sums).
 *     CUB sizes its temp from the current device: that query needs a CUDA device
 *     (DSA_ERROR_NO_DEVICE without one). d_index_k is then bitwise identical run to run.
 * d_weights and d_index_q are bitwise reproducible in both modes. */
DSA_API dsa_status dsa_indexer_bwd(dsa_context *ctx, const dsa_indexer_bwd_params *p,
                                   void *workspace, size_t *workspace_bytes, dsa_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * CPU reference (the oracle): host pointers, double accumulation, exact round-to-nearest-even
 * bf16 conversions. Same params structs as the GPU ops; the context, stream and workspace are not
 * used. Slow by design; every GPU kernel is tested against these.
 * ------------------------------------------------------------------------------------------- */
DSA_API uint16_t dsa_f32_to_bf16(float x); /* round to nearest even; NaN stays NaN */
DSA_API float dsa_bf16_to_f32(uint16_t x);

DSA_API dsa_status dsa_ref_compact_indices(const dsa_compact_params *p);
DSA_API dsa_status dsa_ref_pad_heads(const dsa_pad_heads_params *p);
DSA_API dsa_status dsa_ref_topk(const dsa_topk_params *p);
/* Indexer scores of one query row over its visible keys (score_out[c] for key starts[t] + c,
 * c < causal_lengths[t]), fp64: the values dsa_ref_indexer_topk ranks. */
DSA_API dsa_status dsa_ref_indexer_scores(const dsa_indexer_params *p, int64_t row,
                                          double *score_out);
DSA_API dsa_status dsa_ref_indexer_topk(const dsa_indexer_params *p);
DSA_API dsa_status dsa_ref_sparse_attn_fwd(const dsa_attn_fwd_params *p);
DSA_API dsa_status dsa_ref_sparse_attn_bwd(const dsa_attn_bwd_params *p);
DSA_API dsa_status dsa_ref_attn_slot_target(const dsa_slot_target_params *p);
DSA_API dsa_status dsa_ref_indexer_slot_scores(const dsa_indexer_slot_scores_params *p);
DSA_API dsa_status dsa_ref_indexer_loss(const dsa_indexer_loss_params *p);
DSA_API dsa_status dsa_ref_indexer_bwd(const dsa_indexer_bwd_params *p);

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* DSA_H */
