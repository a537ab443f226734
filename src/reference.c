/*
 * reference.c - the CPU oracle for top-k, the indexer and sparse attention forward/backward
 * (docs/contract.md sections 6, 7, 9.2, 9.3, with this project's rules). Every GPU kernel is tested
 * against these. Host pointers; each function runs the same dsa_check_* as its GPU twin first;
 * accumulation in double; bf16 inputs converted exactly; each bf16 output rounded once, from the
 * double value, to nearest even. Slow by design.
 *
 * Choices this file pins down (docs/design.md repeats them):
 *
 *  Top-k (dsa_ref_topk). Per row, L = lengths ? clamp(lengths[r], 0, columns) : columns. If L <= k
 *    the output is 0..L-1 then -1. Otherwise the k best columns of [0, L) by (score descending,
 *    column ascending), where NaN ranks below every number (-inf included) and NaNs among
 *    themselves by column ascending; -0 and +0 are equal. The selected columns are written
 *    ascending, then -1 up to k.
 *
 *  Indexer (dsa_ref_indexer_scores / _topk). For local query t with plan starts[t] = s0 and
 *    causal_lengths[t] = n: score[c] = sum_h w[t,h] * ReLU(sum_d q[t,h,d] * k[s0 + c, d]) for
 *    c < n, in double, weights used exactly as given (bf16 converted exactly, no extra scaling).
 *    ReLU(x) = x for x > 0, 0 for x <= 0, and NaN stays NaN. Selection: if n <= K every visible
 *    key is taken (no scoring: the "select all" shortcut of docs/contract.md section 6); otherwise the K best by
 *    (score descending, key ascending, NaN lowest). Output: global keys s0 + c ascending, then -1
 *    up to K; lengths[t] = min(K, n), 0 for invalid queries (n = 0) whose row is all -1.
 *    The reference reads the host plan, so it also rejects a window [s0, s0 + n) outside [0, T_k).
 *
 *  Attention forward. Slot j of row t is valid iff (topk_length == NULL || j < clamp(topk_length[t],
 *    0, K)) && 0 <= idx < num_kv. s_j = scale * q[t,h,:D] . kv[idx,:D]. lse = ln sum_valid exp(s_j)
 *    (sink excluded), max_logits = max_valid s_j (same scaled natural-log units),
 *    out = sum_valid exp(s_j - lse) kv[idx,:512] / (1 + exp(sink[h] - lse)); sink NULL acts as
 *    -inf (factor 1), +inf gives factor 0 (out = 0). Duplicate slots are separate terms. A row
 *    with no valid slot: out = 0, lse = +inf, max_logits = -inf.
 *
 *  Attention backward. Delta = sum_{d<512} out * dout (the bf16 forward output as given).
 *    L' = logaddexp(lse, sink[h]) (sink NULL: L' = lse). Per valid slot: P = exp(s_j - L'),
 *    dP = dout . kv[idx,:512], dS = P (dP - Delta); dq = scale sum_j dS kv[idx,:D];
 *    dkv[idx,:D] += scale dS q[t,h,:D]; dkv[idx,:512] += P dout[t,h,:]. A row with no valid slot,
 *    or lse = +inf, gets dq = 0 and contributes nothing. dsink[h] = -sum over contributing rows of
 *    exp(sink[h] - L') Delta; dsink[h] = 0 when sink is NULL or sink[h] = +-inf. Every row of dkv
 *    is written (rows never referenced get 0), and all of dq.
 *
 *  Zero-size work (num_tokens / rows == 0) writes nothing, except the backward, whose gradients are
 *  still defined: dkv = 0 on every row and dsink = 0 (pointers given), like the GPU op.
 *  Host scratch is allocated before any output is written, so an allocation failure
 *  (DSA_ERROR_OUT_OF_HOST_MEMORY) leaves the outputs untouched too.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Exact bf16 -> double (same as dsa_bf16_to_f32, inlined: the oracle converts a lot). */
static inline double bf(uint16_t x) {
  const uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return (double)f;
}

/* Rounds a double to bf16 once (round to nearest even). Going through float could double-round a
 * value that lands exactly on a bf16 tie in float; nudging the float one ulp toward the true value
 * breaks such a tie the right way. */
DSA_HIDDEN uint16_t dsa_ref_double_to_bf16(double x) {
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0xFFFFu) == 0x8000u && isfinite(f) && (double)f != x)
    f = nextafterf(f, x > (double)f ? INFINITY : -INFINITY);
  return dsa_f32_to_bf16(f);
}

/* sum a[i] * b[i] in double; four partial sums keep the oracle fast (the order is irrelevant at
 * double precision for these lengths). */
static double dot(const double *a, const double *b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

static dsa_status oom(const char *fn) {
  return dsa_fail(DSA_ERROR_OUT_OF_HOST_MEMORY, "%s: host scratch allocation failed", fn);
}

/* ---------------------------------------------------------------------------------------------
 * Ranking shared by top-k and the indexer: (score desc, column asc), NaN below every number.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  double score;
  int32_t col;
} ranked;

static int rank_cmp(const void *pa, const void *pb) {
  const ranked *a = (const ranked *)pa, *b = (const ranked *)pb;
  int na = isnan(a->score), nb = isnan(b->score);
  if (na != nb) return na ? 1 : -1;
  if (!na && a->score != b->score) return a->score > b->score ? -1 : 1;
  return (a->col > b->col) - (a->col < b->col);
}

static int i32_cmp(const void *pa, const void *pb) {
  int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
  return (a > b) - (a < b);
}

/* Sorts r[0..n) by rank, keeps the first k, writes their columns + base ascending to out[0..k)
 * (cols is scratch of k entries). */
static void select_best(ranked *r, int64_t n, int32_t k, int32_t base, int32_t *cols,
                        int32_t *out) {
  qsort(r, (size_t)n, sizeof *r, rank_cmp);
  for (int32_t i = 0; i < k; ++i) cols[i] = r[i].col;
  qsort(cols, (size_t)k, sizeof *cols, i32_cmp);
  for (int32_t i = 0; i < k; ++i) out[i] = base + cols[i];
}

/* ---------------------------------------------------------------------------------------------
 * top-k
 * ------------------------------------------------------------------------------------------- */
DSA_API dsa_status dsa_ref_topk(const dsa_topk_params *p_in) {
  const char *fn = "dsa_ref_topk";
  dsa_topk_params p;
  DSA_TRY(dsa_check_topk(p_in, fn, &p));
  if (p.rows == 0) return DSA_SUCCESS;
  ranked *r = (ranked *)malloc(sizeof(ranked) * (size_t)(p.columns > 0 ? p.columns : 1));
  int32_t *cols = (int32_t *)malloc(sizeof(int32_t) * (size_t)p.k);
  if (r == NULL || cols == NULL) {
    free(r);
    free(cols);
    return oom(fn);
  }
  for (int64_t row = 0; row < p.rows; ++row) {
    int64_t L = p.columns;
    if (p.lengths) {
      L = p.lengths[row];
      if (L < 0) L = 0;
      if (L > p.columns) L = p.columns;
    }
    int32_t *out = p.indices + row * p.indices_stride;
    int32_t n;
    if (L <= p.k) {
      n = (int32_t)L;
      for (int32_t i = 0; i < n; ++i) out[i] = i;
    } else {
      const float *s = p.scores + row * p.scores_stride;
      for (int64_t c = 0; c < L; ++c) {
        r[c].score = (double)s[c];
        r[c].col = (int32_t)c;
      }
      n = p.k;
      select_best(r, L, p.k, 0, cols, out);
    }
    for (int32_t i = n; i < p.k; ++i) out[i] = -1;
  }
  free(r);
  free(cols);
  return DSA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * indexer
 * ------------------------------------------------------------------------------------------- */
static double relu(double x) { return isnan(x) ? x : (x > 0.0 ? x : 0.0); }

static double idx_weight(const dsa_indexer_params *p, int64_t t, int64_t h) {
  if (p->weights_dtype == DSA_DTYPE_F32)
    return (double)((const float *)p->weights)[t * p->weights_stride + h];
  return bf(((const uint16_t *)p->weights)[t * p->weights_stride + h]);
}

static int64_t visible(const dsa_plan_view *v, int64_t t) {
  int64_t n = v->causal_lengths[t];
  return n < 0 ? 0 : n;
}

/* Scores of row t (resolved params) into out[0..causal_lengths[t]). */
static void indexer_row_scores(const dsa_indexer_params *p, int64_t t, double *out) {
  enum { D = DSA_INDEX_HEAD_DIM };
  const int64_t n = visible(p->plan, t), s0 = p->plan->starts[t];
  const int64_t H = p->num_heads;
  double qd[64][D], w[64], kd[D];
  for (int64_t h = 0; h < H; ++h) {
    const uint16_t *q = p->index_q + t * p->q_stride_token + h * p->q_stride_head;
    for (int d = 0; d < D; ++d) qd[h][d] = bf(q[d]);
    w[h] = idx_weight(p, t, h);
  }
  for (int64_t c = 0; c < n; ++c) {
    const uint16_t *k = p->index_k + (s0 + c) * p->k_stride;
    for (int d = 0; d < D; ++d) kd[d] = bf(k[d]);
    double acc = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      acc += w[h] * relu(dot(qd[h], kd, D));
    }
    out[c] = acc;
  }
}

/* The reference reads the host plan's arrays: each visible window must lie inside [0, T_k). */
static dsa_status check_plan_rows(const dsa_plan_view *v, int64_t t0, int64_t t1, const char *fn) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t s0 = v->starts[t], n = v->causal_lengths[t];
    if (n > 0 && (s0 < 0 || s0 + n > v->total_key_tokens))
      return dsa_fail(DSA_ERROR_INVALID_ARGUMENT,
                      "%s: plan row %lld sees keys [%lld, %lld), outside 0..plan->total_key_tokens "
                      "= %lld",
                      fn, (long long)t, (long long)s0, (long long)(s0 + n),
                      (long long)v->total_key_tokens);
  }
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_ref_indexer_scores(const dsa_indexer_params *p_in, int64_t row,
                                          double *score_out) {
  const char *fn = "dsa_ref_indexer_scores";
  dsa_indexer_params p;
  DSA_TRY(dsa_check_indexer(p_in, fn, &p));
  if (row < 0 || row >= p.plan->num_queries)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: row = %lld is outside 0..%lld", fn,
                    (long long)row, (long long)p.plan->num_queries - 1);
  DSA_TRY(check_plan_rows(p.plan, row, row + 1, fn));
  if (visible(p.plan, row) == 0) return DSA_SUCCESS;
  if (score_out == NULL) return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: score_out is NULL", fn);
  indexer_row_scores(&p, row, score_out);
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_ref_indexer_topk(const dsa_indexer_params *p_in) {
  const char *fn = "dsa_ref_indexer_topk";
  dsa_indexer_params p;
  DSA_TRY(dsa_check_indexer(p_in, fn, &p));
  const int64_t Tq = p.plan->num_queries;
  const int32_t K = p.topk;
  if (Tq == 0) return DSA_SUCCESS;
  DSA_TRY(check_plan_rows(p.plan, 0, Tq, fn));
  int64_t max_n = 1;
  for (int64_t t = 0; t < Tq; ++t)
    if (visible(p.plan, t) > max_n) max_n = visible(p.plan, t);
  double *sc = (double *)malloc(sizeof(double) * (size_t)max_n);
  ranked *r = (ranked *)malloc(sizeof(ranked) * (size_t)max_n);
  int32_t *cols = (int32_t *)malloc(sizeof(int32_t) * (size_t)K);
  if (sc == NULL || r == NULL || cols == NULL) {
    free(sc);
    free(r);
    free(cols);
    return oom(fn);
  }
  for (int64_t t = 0; t < Tq; ++t) {
    const int64_t n = visible(p.plan, t);
    const int32_t s0 = p.plan->starts[t];
    int32_t *out = p.indices + t * p.indices_stride;
    int32_t len;
    if (n <= K) { /* select all: no scoring */
      len = (int32_t)n;
      for (int32_t i = 0; i < len; ++i) out[i] = s0 + i;
    } else {
      indexer_row_scores(&p, t, sc);
      for (int64_t c = 0; c < n; ++c) {
        r[c].score = sc[c];
        r[c].col = (int32_t)c;
      }
      len = K;
      select_best(r, n, K, s0, cols, out);
    }
    for (int32_t i = len; i < K; ++i) out[i] = -1;
    p.lengths[t] = len;
  }
  free(sc);
  free(r);
  free(cols);
  return DSA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * sparse attention
 * ------------------------------------------------------------------------------------------- */
/* Where the forward reads q, kv and sink: the bf16/fp32 tensors of the params, or (for the
 * finite-difference test) contiguous double copies. */
typedef struct {
  const double *q, *kv, *sink; /* NULL: use the params' tensors */
} fwd_src;

static double q_at(const dsa_attn_fwd_params *p, const fwd_src *s, int64_t t, int64_t h,
                   int64_t d) {
  if (s->q) return s->q[(t * p->num_heads + h) * p->head_dim + d];
  return bf(p->q[t * p->q_stride_token + h * p->q_stride_head + d]);
}
static double kv_at(const dsa_attn_fwd_params *p, const fwd_src *s, int64_t row, int64_t d) {
  if (s->kv) return s->kv[row * p->head_dim + d];
  return bf(p->kv[row * p->kv_stride + d]);
}

/* The valid slots of row t: their kv rows into rows[], returns the count. */
static int32_t valid_slots(const int32_t *indices, int64_t stride, const int32_t *topk_length,
                           int32_t K, int64_t num_kv, int64_t t, int32_t *rows) {
  int32_t lim = K, n = 0;
  if (topk_length) {
    lim = topk_length[t];
    if (lim < 0) lim = 0;
    if (lim > K) lim = K;
  }
  const int32_t *ix = indices + t * stride;
  for (int32_t j = 0; j < lim; ++j)
    if (ix[j] >= 0 && (int64_t)ix[j] < num_kv) rows[n++] = ix[j];
  return n;
}

/* Gathers the n valid kv rows of a token as doubles: g[j * D + d]. */
static void gather_kv(const dsa_attn_fwd_params *p, const fwd_src *src, const int32_t *rows,
                      int32_t n, double *g) {
  const int64_t D = p->head_dim;
  for (int32_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) g[j * D + d] = kv_at(p, src, rows[j], d);
}

/* The double-precision forward behind dsa_ref_sparse_attn_fwd: out_d [T, H, 512], lse_d and
 * max_d [T, H], all contiguous (each optional). p is resolved. */
static dsa_status fwd_core(const dsa_attn_fwd_params *p, const fwd_src *src, double *out_d,
                           double *lse_d, double *max_d, const char *fn) {
  const int64_t T = p->num_tokens, H = p->num_heads, D = p->head_dim, V = DSA_VALUE_DIM;
  const int32_t K = p->topk;
  int32_t *rows = (int32_t *)malloc(sizeof(int32_t) * (size_t)K);
  double *s = (double *)malloc(sizeof(double) * (size_t)K);
  double *qd = (double *)malloc(sizeof(double) * (size_t)D);
  double *g = (double *)malloc(sizeof(double) * (size_t)K * (size_t)D);
  if (rows == NULL || s == NULL || qd == NULL || g == NULL) {
    free(rows);
    free(s);
    free(qd);
    free(g);
    return oom(fn);
  }
  const double scale = (double)p->softmax_scale;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t n = valid_slots(p->indices, p->indices_stride, p->topk_length, K, p->num_kv, t,
                                  rows);
    gather_kv(p, src, rows, n, g);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t th = t * H + h;
      double *o = out_d ? out_d + th * V : NULL;
      if (n == 0) {
        if (o) memset(o, 0, sizeof(double) * (size_t)V);
        if (lse_d) lse_d[th] = INFINITY;
        if (max_d) max_d[th] = -INFINITY;
        continue;
      }
      for (int64_t d = 0; d < D; ++d) qd[d] = q_at(p, src, t, h, d);
      double m = -INFINITY;
      for (int32_t j = 0; j < n; ++j) {
        const double *kv = g + j * D;
        s[j] = scale * dot(qd, kv, D);
        if (s[j] > m) m = s[j];
      }
      double sum = 0.0;
      for (int32_t j = 0; j < n; ++j) sum += exp(s[j] - m);
      const double lse = m + log(sum);
      if (lse_d) lse_d[th] = lse;
      if (max_d) max_d[th] = m;
      if (o) {
        const double sink = src->sink ? src->sink[h] : p->sink ? (double)p->sink[h] : -INFINITY;
        const double factor = 1.0 / (1.0 + exp(sink - lse));
        memset(o, 0, sizeof(double) * (size_t)V);
        for (int32_t j = 0; j < n; ++j) {
          const double w = exp(s[j] - lse) * factor;
          const double *kv = g + j * D;
          for (int64_t d = 0; d < V; ++d) o[d] += w * kv[d];
        }
      }
    }
  }
  free(rows);
  free(s);
  free(qd);
  free(g);
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_ref_sparse_attn_fwd(const dsa_attn_fwd_params *p_in) {
  const char *fn = "dsa_ref_sparse_attn_fwd";
  dsa_attn_fwd_params p;
  DSA_TRY(dsa_check_attn_fwd(p_in, fn, &p));
  const int64_t T = p.num_tokens, H = p.num_heads, V = DSA_VALUE_DIM;
  if (T == 0) return DSA_SUCCESS;
  const size_t rows = (size_t)(T * H);
  double *out_d = (double *)malloc(sizeof(double) * rows * V);
  double *lse_d = (double *)malloc(sizeof(double) * rows);
  double *max_d = (double *)malloc(sizeof(double) * rows);
  const fwd_src src = {NULL, NULL, NULL};
  dsa_status st = DSA_SUCCESS;
  if (out_d == NULL || lse_d == NULL || max_d == NULL)
    st = oom(fn);
  else
    st = fwd_core(&p, &src, out_d, lse_d, max_d, fn);
  if (st == DSA_SUCCESS) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t th = t * H + h;
        uint16_t *o = p.out + t * p.out_stride_token + h * p.out_stride_head;
        for (int64_t d = 0; d < V; ++d) o[d] = dsa_ref_double_to_bf16(out_d[th * V + d]);
        p.lse[th] = (float)lse_d[th];
        if (p.max_logits) p.max_logits[th] = (float)max_d[th];
      }
  }
  free(out_d);
  free(lse_d);
  free(max_d);
  return st;
}

DSA_HIDDEN dsa_status dsa_ref_attn_fwd_f64(const dsa_attn_fwd_params *p_in, const double *q,
                                           const double *kv, const double *sink, double *out,
                                           double *lse, double *max_logits) {
  const char *fn = "dsa_ref_attn_fwd_f64";
  dsa_attn_fwd_params p;
  DSA_TRY(dsa_check_attn_fwd(p_in, fn, &p));
  if (p.num_tokens == 0) return DSA_SUCCESS;
  const fwd_src src = {q, kv, sink};
  return fwd_core(&p, &src, out, lse, max_logits, fn);
}

static double logaddexp(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  const double m = a > b ? a : b;
  return m + log1p(exp(-fabs(a - b)));
}

DSA_API dsa_status dsa_ref_sparse_attn_bwd(const dsa_attn_bwd_params *p_in) {
  const char *fn = "dsa_ref_sparse_attn_bwd";
  dsa_attn_bwd_params p;
  DSA_TRY(dsa_check_attn_bwd(p_in, fn, &p));
  const int64_t T = p.num_tokens, H = p.num_heads, D = p.head_dim, V = DSA_VALUE_DIM;
  const int64_t Tkv = p.num_kv;
  const int32_t K = p.topk;
  /* No tokens still defines the gradients: dkv = 0 on every row and dsink = 0 (as the GPU op). */
  const double scale = (double)p.softmax_scale;
  /* all scratch first: nothing is written unless everything is in hand */
  double *dkv = (double *)calloc(Tkv > 0 ? (size_t)(Tkv * D) : 1, sizeof(double));
  double *dsink = (double *)calloc((size_t)H, sizeof(double));
  int32_t *rows = (int32_t *)malloc(sizeof(int32_t) * (size_t)K);
  double *kvg = (double *)malloc(sizeof(double) * (size_t)K * (size_t)D);
  double *qd = (double *)malloc(sizeof(double) * (size_t)D);
  double *dqr = (double *)malloc(sizeof(double) * (size_t)D);
  double *dod = (double *)malloc(sizeof(double) * (size_t)V);
  if (!dkv || !dsink || !rows || !kvg || !qd || !dqr || !dod) {
    free(dkv);
    free(dsink);
    free(rows);
    free(kvg);
    free(qd);
    free(dqr);
    free(dod);
    return oom(fn);
  }
  dsa_status st = DSA_SUCCESS;
  if (p.slot_target != NULL && T > 0) { /* the optional output, by the slot target's own reference */
    const dsa_slot_target_params sp = dsa_slot_target_of_bwd(&p);
    st = dsa_ref_attn_slot_target(&sp);
  }
  for (int64_t t = 0; t < T && st == DSA_SUCCESS; ++t) {
    const int32_t n = valid_slots(p.indices, p.indices_stride, p.topk_length, K, Tkv, t, rows);
    for (int32_t j = 0; j < n; ++j) {
      const uint16_t *kv = p.kv + (int64_t)rows[j] * p.kv_stride;
      for (int64_t d = 0; d < D; ++d) kvg[j * D + d] = bf(kv[d]);
    }
    for (int64_t h = 0; h < H; ++h) {
      const double lse = (double)p.lse[t * H + h];
      uint16_t *dq_out = p.dq + t * p.dq_stride_token + h * p.dq_stride_head;
      memset(dqr, 0, sizeof(double) * (size_t)D);
      if (n > 0 && lse != INFINITY) {
        const double sink = p.sink ? (double)p.sink[h] : -INFINITY;
        const double Lp = logaddexp(lse, sink);
        const uint16_t *q = p.q + t * p.q_stride_token + h * p.q_stride_head;
        const uint16_t *o = p.out + t * p.out_stride_token + h * p.out_stride_head;
        const uint16_t *g = p.dout + t * p.dout_stride_token + h * p.dout_stride_head;
        double delta = 0.0;
        for (int64_t d = 0; d < V; ++d) {
          dod[d] = bf(g[d]);
          delta += bf(o[d]) * dod[d];
        }
        for (int64_t d = 0; d < D; ++d) qd[d] = bf(q[d]);
        for (int32_t j = 0; j < n; ++j) {
          const double *kv = kvg + j * D;
          const double dp = dot(dod, kv, V);
          const double P = exp(scale * dot(qd, kv, D) - Lp);
          const double dS = P * (dp - delta);
          double *acc = dkv + (int64_t)rows[j] * D;
          for (int64_t d = 0; d < D; ++d) {
            dqr[d] += dS * kv[d];
            acc[d] += scale * dS * qd[d];
          }
          for (int64_t d = 0; d < V; ++d) acc[d] += P * dod[d];
        }
        if (isfinite(sink)) dsink[h] -= exp(sink - Lp) * delta;
      }
      for (int64_t d = 0; d < D; ++d) dq_out[d] = dsa_ref_double_to_bf16(scale * dqr[d]);
    }
  }
  if (p.dkv != NULL && st == DSA_SUCCESS)
    for (int64_t r = 0; r < Tkv; ++r)
      for (int64_t d = 0; d < D; ++d)
        p.dkv[r * p.dkv_stride + d] = dsa_ref_double_to_bf16(dkv[r * D + d]);
  if (p.dsink && st == DSA_SUCCESS)
    for (int64_t h = 0; h < H; ++h) p.dsink[h] = (float)dsink[h];
  free(dkv);
  free(dsink);
  free(rows);
  free(kvg);
  free(qd);
  free(dqr);
  free(dod);
  return st;
}
