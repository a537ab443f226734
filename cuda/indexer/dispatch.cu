/*
 * dispatch.cu - the indexer's dispatch point: dsa_indexer_workspace_size and dsa_launch_indexer
 * (src/kernels.h), dsa_indexer_topk's work after its checks (src/indexer.c): the lightning indexer
 * with segmented causal top-k; two scoring engines (cuBLAS, fused) sharing the chunking and the
 * top-k (cuda/topk/). Here: which engine and which fused kernel a call runs (the params' engine,
 * DSA_OPTION_INDEXER_FUSED_KERNEL, the device) and whether the device runs it, the workspace layout
 * (the budgets below), and the chunk loop.
 *
 * Only host scalars of the plan are read (the device view's pointers are never dereferenced here):
 * a valid query at global position g sees keys [starts, starts + causal_length) with
 * causal_length <= min(g + 1, max_seqlen_k) and starts >= g - max_seqlen_k + 1, so
 *  - queries with min(qs + t + 1, max_seqlen_k) <= K select all their keys: one top-k launch with
 *    no scores (the kernel's L <= K path writes starts + 0..L-1) covers them, no scoring;
 *  - the other queries run in chunks [t0, t1) whose key window is
 *    [max(0, g0 - max_seqlen_k + 1), min(g1, T_k)), at most t1 - t0 + max_seqlen_k - 1 keys.
 * Per chunk: for each GEMM sub-chunk of queries and key tile, cublasGemmEx (bf16 in, fp32 out,
 * CUBLAS_COMPUTE_32F) writes logits[(q, h), s] = q[q, h, :] . k[s, :], the reduction kernel folds
 * the heads (weights, ReLU) into the chunk's fp32 scores [chunk, window], then the top-k
 * (cuda/topk/) selects each row's keys from its own columns (offset starts[t] - window start)
 * and writes global key indices and lengths.
 *
 * Workspace (fixed budget, independent of T_q; DSA_OPTION_INDEXER_SCORES_BUDGET / _LOGITS_BUDGET /
 * _KEY_TILE, defaults below): scores <= 256 MiB, logits <= 64 MiB, plus a packed
 * copy of q for layouts cuBLAS cannot read directly, plus 256 bytes of alignment slack (any
 * workspace alignment is accepted). One scores buffer: every chunk is scored, then selected, on the
 * call's stream. The budget is exceeded only when a single query's visible window is so long that
 * one scores row (window * 4 bytes) or one query's logits for one key tile (H_idx * 32768 * 4 bytes
 * = 8 MiB at H_idx = 64) does not fit. 256 MiB holds 2048 rows of a 32768-key window (idx-32k's
 * 30720 scored queries in 15 chunks); fewer, larger chunks cost fewer launch tails between a
 * chunk's scoring and its top-k (docs/perf.md has the measurements).
 *
 * Fused engine (DSA_INDEXER_ENGINE_FUSED): per chunk one kernel writes
 * the head-summed scores [chunk, window] straight from tensor-core accumulators (no logits, no
 * q packing; workspace = the scores buffer only), then the same top-k. Needs sm_80+.
 * DSA_OPTION_INDEXER_FUSED_KERNEL picks its kernel: DSA_INDEXER_FUSED_MMA_SYNC = idx_fused
 * (cuda/indexer/idx_fused_mma.cu), DSA_INDEXER_FUSED_WGMMA = the sm_90a wgmma kernel
 * (cuda/indexer/idx_fused_wgmma.cu; declined before anything is written off cc 9.0),
 * DSA_INDEXER_FUSED_AUTO = the wgmma kernel on cc 9.0 for H_idx > 16, idx_fused elsewhere (the wgmma
 * kernel pads heads to 32; docs/perf.md has the measurements).
 * DSA_INDEXER_ENGINE_DEFAULT runs the fused engine on sm_80+ (H200: same results as cuBLAS on the
 * tests' exact inputs, and faster on every bench shape), cuBLAS on older devices.
 *
 * Determinism: both engines are bitwise reproducible run to run. The fused engine's per-row
 * scores do not depend on the other rows of the batch; the cuBLAS engine's may (cuBLAS picks its
 * algorithm, hence its fp32 summation order, from the GEMM shape), which matters only when
 * scores differ in their last bits.
 */
#include <cublas_v2.h>
#include "internal.h"
#include "indexer/idx_launch.cuh"

namespace {

/* The budgets (bytes) and the GEMM key tile of a call (its context's options; defaults 256 MiB of fp32
 * scores [chunk, window], 64 MiB of fp32 logits [sub-chunk * H_idx, key tile], 32768 keys per GEMM). */
typedef struct {
  int64_t scores, logits, key_tile;
} idx_budget;
#define IDX_MAX_CHUNK ((int64_t)65535)         /* rows of a chunk (grid.y of the reduction) */
#define IDX_ALIGN ((int64_t)256)

typedef struct {
  int64_t t_skip;      /* queries [0, t_skip) select all their keys (no scoring) */
  int64_t msk;         /* bound on any query's visible key count */
  int64_t cq;          /* queries per scored chunk */
  int64_t scores_ld;   /* row stride of the scores buffer (>= the widest window) */
  int64_t cg;          /* queries per GEMM */
  int64_t key_tile;    /* keys per GEMM */
  int64_t logits_ld;   /* row stride of the logits buffer */
  int pack;            /* q is copied into a plain [cg * H, 128] matrix first */
  int64_t q_ld;        /* leading dimension of q when not packed */
  int64_t scores_off, logits_off, pack_off, total; /* byte layout (after aligning the base) */
} idx_layout;

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Window width bound of a chunk of c queries. */
int64_t window_cap(const idx_layout *l, int64_t tk, int64_t c) {
  return min64(tk, l->msk - 1 + c);
}

/* The largest chunk of at most n queries whose fp32 scores fit `budget` bytes (at least one row). */
int64_t chunk_rows(const idx_layout *l, int64_t tk, int64_t n, int64_t budget) {
  int64_t c = min64(n, IDX_MAX_CHUNK);
  while (c > 1 && c * window_cap(l, tk, c) * 4 > budget) {
    int64_t fit = budget / 4 / window_cap(l, tk, c);
    c = max64(1, min64(c - 1, fit));
  }
  return c;
}

void plan_layout(const dsa_indexer_params *p, int fused, const idx_budget *bud, idx_layout *l) {
  const dsa_plan_view *v = p->plan;
  const int64_t tq = v->num_queries, tk = v->total_key_tokens, qs = v->query_start;
  const int64_t H = p->num_heads, K = p->topk;
  int64_t n_score, c, wcap;
  l->msk = v->max_seqlen_k > 0 ? min64(v->max_seqlen_k, tk) : tk;
  /* tq = 0 is zero-size work whose query_start the view check leaves unchecked: no arithmetic on it */
  if (tq <= 0 || tk <= 0 || l->msk <= K) l->t_skip = tq;
  else l->t_skip = min64(tq, max64(0, K - qs)); /* g + 1 > K  <=>  t >= K - qs; 0 <= qs <= tk - tq */
  n_score = tq - l->t_skip;
  l->cq = l->cg = l->key_tile = l->scores_ld = l->logits_ld = 0;
  l->pack = 0;
  l->q_ld = 0;
  l->scores_off = l->logits_off = l->pack_off = 0;
  l->total = 1;
  if (n_score <= 0) return;
  l->cq = chunk_rows(l, tk, n_score, bud->scores);
  wcap = window_cap(l, tk, l->cq);
  l->scores_ld = round_up(wcap, 4);
  if (fused) { /* scores only: the logits never leave the chip */
    l->total = round_up(l->cq * l->scores_ld * 4, IDX_ALIGN) + IDX_ALIGN;
    return;
  }
  /* largest GEMM sub-chunk whose logits over its own (narrower) window fit the budget */
  c = l->cq;
  while (c > 1 && c * H * round_up(min64(bud->key_tile, window_cap(l, tk, c)), 4) * 4 > bud->logits) {
    int64_t fit = bud->logits / (4 * H * round_up(min64(bud->key_tile, window_cap(l, tk, c)), 4));
    c = max64(1, min64(c - 1, fit));
  }
  l->cg = c;
  l->key_tile = min64(bud->key_tile, window_cap(l, tk, c));
  l->logits_ld = round_up(l->key_tile, 4);
  if (H == 1) {
    l->q_ld = p->q_stride_token;
  } else if (p->q_stride_head <= p->q_stride_token && p->q_stride_token == H * p->q_stride_head) {
    l->q_ld = p->q_stride_head;
  } else {
    l->pack = 1;
    l->q_ld = DSA_INDEX_HEAD_DIM;
  }
  l->scores_off = 0;
  l->logits_off = round_up(l->cq * l->scores_ld * 4, IDX_ALIGN);
  l->pack_off = l->logits_off + round_up(l->cg * H * l->logits_ld * 4, IDX_ALIGN);
  l->total = l->pack_off + (l->pack ? l->cg * H * DSA_INDEX_HEAD_DIM * 2 : 0) + IDX_ALIGN;
}

/* The layout for a context's budgets. */
void plan_layout_ctx(const dsa_context *ctx, const dsa_indexer_params *p, int fused, idx_layout *l) {
  idx_budget bud;
  bud.scores = ctx->options[DSA_OPTION_INDEXER_SCORES_BUDGET];
  bud.logits = ctx->options[DSA_OPTION_INDEXER_LOGITS_BUDGET];
  bud.key_tile = ctx->options[DSA_OPTION_INDEXER_KEY_TILE];
  plan_layout(p, fused, &bud, l);
}

dsa_status cublas_status(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return DSA_SUCCESS;
  return dsa_fail(DSA_ERROR_CUBLAS, "dsa_indexer_topk: %s failed (cuBLAS status %d)", what, (int)s);
}

/* Scores of chunk queries [t0, t1) over the window [wstart, wend) into `scores` (row stride
 * scores_ld) on `stream`: the fused kernel, or per GEMM sub-chunk and key tile cublasGemmEx into the
 * logits and the head reduction (h: the context's cuBLAS handle, bound to stream). */
dsa_status score_chunk(dsa_context *ctx, const dsa_indexer_params *p, const idx_layout *l, int fused,
                       cublasHandle_t h, float *logits, uint16_t *qpack, int64_t t0, int64_t t1,
                       int64_t wstart, int64_t wend, float *scores, cudaStream_t stream) {
  const dsa_plan_view *v = p->plan;
  const int64_t tk = v->total_key_tokens, qs = v->query_start;
  const int64_t H = p->num_heads, K = p->topk;
  const int wbf16 = p->weights_dtype == DSA_DTYPE_BF16;
  const int64_t welem = wbf16 ? 2 : 4;
  const float one = 1.0f, zero = 0.0f;
  if (fused) {
    dsa_indexer_fused_args f;
    f.rows = t1 - t0;
    f.heads = (int32_t)H;
    f.topk = (int32_t)K;
    f.q = p->index_q + t0 * p->q_stride_token;
    f.q_stride_token = p->q_stride_token;
    f.q_stride_head = p->q_stride_head;
    f.k = p->index_k;
    f.k_stride = p->k_stride;
    f.weights = (const char *)p->weights + t0 * p->weights_stride * welem;
    f.weights_bf16 = wbf16;
    f.weights_stride = p->weights_stride;
    f.starts = v->starts + t0;
    f.causal_lengths = v->causal_lengths + t0;
    f.window_start = wstart;
    f.window = wend - wstart;
    f.scores = scores;
    f.scores_ld = l->scores_ld;
    return fused == 2 ? dsa_idx_launch_fused_wgmma(ctx, &f, stream) : dsa_idx_launch_fused_mma(ctx, &f, stream);
  }
  for (int64_t u0 = t0; u0 < t1; u0 += l->cg) {
    const int64_t u1 = min64(t1, u0 + l->cg), nq = u1 - u0;
    const int64_t ks = max64(wstart, qs + u0 - l->msk + 1), ke = min64(qs + u1, tk);
    const uint16_t *B = p->index_q + u0 * p->q_stride_token;
    if (l->pack) {
      DSA_TRY(dsa_idx_launch_pack_q(B, p->q_stride_token, p->q_stride_head, nq, (int32_t)H, qpack, stream));
      B = qpack;
    }
    for (int64_t k0 = ks; k0 < ke; k0 += l->key_tile) {
      const int64_t n = min64(ke, k0 + l->key_tile) - k0;
      /* column-major view: C[s, (q,h)] (n x nq*H, ldc = logits_ld) = K^T Q, i.e. row (q,h) of
       * the row-major logits holds its scores over the tile's keys */
      DSA_TRY(cublas_status(
          cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)(nq * H), DSA_INDEX_HEAD_DIM,
                       &one, p->index_k + k0 * p->k_stride, CUDA_R_16BF, (int)p->k_stride, B,
                       CUDA_R_16BF, (int)l->q_ld, &zero, logits, CUDA_R_32F, (int)l->logits_ld,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx"));
      DSA_TRY(dsa_idx_launch_reduce(
          nq, (int32_t)H, n, logits, l->logits_ld, (const char *)p->weights + u0 * p->weights_stride * welem,
          wbf16, p->weights_stride, scores + (u0 - t0) * l->scores_ld + (k0 - wstart), l->scores_ld, stream));
    }
  }
  return DSA_SUCCESS;
}

dsa_status run_engine(dsa_context *ctx, const dsa_indexer_params *p, const idx_layout *l,
                      int fused, char *ws, cudaStream_t stream) {
  const dsa_plan_view *v = p->plan;
  const int64_t tq = v->num_queries, tk = v->total_key_tokens, qs = v->query_start;
  const int64_t K = p->topk;
  dsa_topk_launch a;
  void *hv;
  cublasHandle_t h = NULL;
  float *scores, *logits;
  uint16_t *qpack;

  if (!fused && l->t_skip < tq && (p->k_stride > 0x7fffffff || l->q_ld > 0x7fffffff))
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "dsa_indexer_topk: k_stride = %lld or the q row stride %lld "
                    "exceeds cuBLAS's int leading dimension", (long long)p->k_stride, (long long)l->q_ld);

  /* queries that take all their keys: no scores read */
  a.columns = K;
  a.k = (int32_t)K;
  a.scores = NULL;
  a.scores_stride = 0;
  a.start_base = 0;
  a.indices_stride = p->indices_stride;
  if (l->t_skip > 0) {
    a.rows = l->t_skip;
    a.lengths = v->causal_lengths;
    a.starts = v->starts;
    a.indices = p->indices;
    a.out_lengths = p->lengths;
    DSA_TRY(dsa_launch_topk(ctx, &a, stream));
  }
  if (l->t_skip >= tq) return DSA_SUCCESS;

  ws = (char *)(((uintptr_t)ws + IDX_ALIGN - 1) / IDX_ALIGN * IDX_ALIGN);
  scores = (float *)(ws + l->scores_off);
  logits = (float *)(ws + l->logits_off);
  qpack = (uint16_t *)(ws + l->pack_off);
  if (!fused) {
    DSA_TRY(dsa_context_cublas(ctx, &hv));
    h = (cublasHandle_t)hv;
    DSA_TRY(cublas_status(cublasSetStream(h, stream), "cublasSetStream"));
  }

  for (int64_t t0 = l->t_skip; t0 < tq; t0 += l->cq) {
    const int64_t t1 = min64(tq, t0 + l->cq);
    const int64_t wstart = max64(0, qs + t0 - l->msk + 1), wend = min64(qs + t1, tk);
    DSA_TRY(score_chunk(ctx, p, l, fused, h, logits, qpack, t0, t1, wstart, wend, scores, stream));
    a.rows = t1 - t0;
    a.columns = wend - wstart;
    a.scores = scores;
    a.scores_stride = l->scores_ld;
    a.lengths = v->causal_lengths + t0;
    a.starts = v->starts + t0;
    a.start_base = wstart;
    a.indices = p->indices + t0 * p->indices_stride;
    a.out_lengths = p->lengths + t0;
    DSA_TRY(dsa_launch_topk(ctx, &a, stream));
  }
  return DSA_SUCCESS;
}

/* The engine and kernel a call on ctx runs (*fused: 0 cuBLAS, 1 the fused engine's mma.sync kernel,
 * 2 its sm_90a wgmma kernel), or DSA_ERROR_UNSUPPORTED where the device does not run a forced one.
 * DEFAULT: the fused engine where it runs (sm_80+; on the H200 it is correct and 1.6-1.9x faster
 * than cuBLAS on every bench shape), else cuBLAS. The wgmma kernel: forced, declined here (before
 * the size query and before anything is written); automatic, only where its check passes, the
 * check's message dropped. */
dsa_status choose_engine(const dsa_context *ctx, const dsa_indexer_params *r, int *fused) {
  const char *fn = "dsa_indexer_topk";
  int f = r->engine == DSA_INDEXER_ENGINE_FUSED || (r->engine == DSA_INDEXER_ENGINE_DEFAULT && ctx->cc_major >= 8);
  if (f && ctx->cc_major < 8)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: engine = DSA_INDEXER_ENGINE_FUSED needs compute capability 8.0 or newer (device has %d.%d)",
                    fn, ctx->cc_major, ctx->cc_minor);
  const int64_t fk = ctx->options[DSA_OPTION_INDEXER_FUSED_KERNEL];
  if (f && fk == DSA_INDEXER_FUSED_WGMMA) {
    DSA_TRY(dsa_idx_fused_wgmma_check(ctx));
    f = 2;
  } else if (f && fk == DSA_INDEXER_FUSED_AUTO && r->num_heads > 16) {
    dsa_saved_message saved;
    dsa_message_save(&saved);
    if (dsa_idx_fused_wgmma_check(ctx) == DSA_SUCCESS) f = 2;
    else dsa_message_restore(&saved);
  }
  *fused = f;
  return DSA_SUCCESS;
}

}  // namespace

extern "C" dsa_status dsa_indexer_layout(const dsa_context *ctx, const dsa_indexer_params *p, int fused,
                                         int64_t *total, int64_t *chunk) {
  dsa_indexer_params r;
  idx_layout l;
  DSA_TRY(dsa_check_indexer(p, "dsa_indexer_layout", &r));
  plan_layout_ctx(ctx, &r, fused, &l);
  *total = l.total;
  *chunk = l.cq;
  return DSA_SUCCESS;
}

extern "C" dsa_status dsa_indexer_workspace_size(const dsa_context *ctx, const dsa_indexer_params *r, size_t *bytes) {
  idx_layout l;
  if (ctx == NULL) {
    /* a size query without a context (docs/contract.md section 13.2): valid on every device. The
     * cuBLAS layout holds the fused one (same scores buffer, plus logits and packed q), so DEFAULT
     * gets the cuBLAS size, CUBLAS and FUSED their own (the same as with a context). */
    idx_budget bud;
    bud.scores = dsa_option_default(DSA_OPTION_INDEXER_SCORES_BUDGET);
    bud.logits = dsa_option_default(DSA_OPTION_INDEXER_LOGITS_BUDGET);
    bud.key_tile = dsa_option_default(DSA_OPTION_INDEXER_KEY_TILE);
    plan_layout(r, r->engine == DSA_INDEXER_ENGINE_FUSED, &bud, &l);
  } else {
    int fused = 0;
    DSA_TRY(choose_engine(ctx, r, &fused));
    plan_layout_ctx(ctx, r, fused, &l);
  }
  *bytes = (size_t)l.total;
  return DSA_SUCCESS;
}

extern "C" dsa_status dsa_launch_indexer(dsa_context *ctx, const dsa_indexer_params *r, void *workspace,
                                         cudaStream_t stream) {
  idx_layout l;
  int fused = 0;
  DSA_TRY(choose_engine(ctx, r, &fused));
  plan_layout_ctx(ctx, r, fused, &l);
  return run_engine(ctx, r, &l, fused, (char *)workspace, stream);
}
