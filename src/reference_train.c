/*
 * reference_train.c - the CPU oracle of the indexer-training ops (docs/indexer-training.md): the
 * attention's slot target, the indexer's scores at the slots, the KL loss with its score gradient,
 * and the indexer backward. Host pointers; each function runs the same dsa_check_* its GPU twin
 * will; accumulation in double; bf16 inputs converted exactly; every output is written from the
 * double value once (bf16 rounded to nearest even). Nothing is written before the scratch is in
 * hand. Slot validity is the attention's: j < clamp(lengths[t], 0, K) (lengths given) and
 * 0 <= indices[t, j] < the key count; invalid slots get 0 in every [T, K] output.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static double bfd(uint16_t x) { return (double)dsa_bf16_to_f32(x); }

static double logaddexp(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  const double m = a > b ? a : b;
  return m + log1p(exp(-fabs(a - b)));
}

/* The valid slots of row t: valid[j] = 1 or 0 for j < K; returns their count. */
static int32_t slot_mask(const int32_t *indices, int64_t stride, const int32_t *lengths, int32_t K,
                         int64_t num_keys, int64_t t, uint8_t *valid) {
  int32_t lim = K, n = 0;
  if (lengths) {
    lim = lengths[t];
    lim = lim < 0 ? 0 : lim > K ? K : lim;
  }
  const int32_t *row = indices + t * stride;
  for (int32_t j = 0; j < K; ++j) {
    valid[j] = j < lim && row[j] >= 0 && (int64_t)row[j] < num_keys;
    n += valid[j];
  }
  return n;
}

static dsa_status oom(const char *fn) {
  return dsa_fail(DSA_ERROR_OUT_OF_HOST_MEMORY, "%s: host scratch allocation failed", fn);
}

DSA_API dsa_status dsa_ref_attn_slot_target(const dsa_slot_target_params *p_in) {
  const char *fn = "dsa_ref_attn_slot_target";
  dsa_slot_target_params p;
  DSA_TRY(dsa_check_slot_target(p_in, fn, &p));
  const int64_t T = p.num_tokens, H = p.num_heads, D = p.head_dim;
  const int32_t K = p.topk;
  if (T == 0) return DSA_SUCCESS;
  uint8_t *valid = (uint8_t *)malloc((size_t)K);
  double *acc = (double *)malloc(sizeof(double) * (size_t)K);
  double *qd = (double *)malloc(sizeof(double) * (size_t)D);
  if (!valid || !acc || !qd) {
    free(valid);
    free(acc);
    free(qd);
    return oom(fn);
  }
  const double scale = (double)p.softmax_scale;
  for (int64_t t = 0; t < T; ++t) {
    slot_mask(p.indices, p.indices_stride, p.topk_length, K, p.num_kv, t, valid);
    memset(acc, 0, sizeof(double) * (size_t)K);
    for (int64_t h = 0; h < H; ++h) {
      const double lse = (double)p.lse[t * H + h];
      if (lse == INFINITY) continue; /* a row without valid slots: no probability anywhere */
      const double Lp = logaddexp(lse, p.sink ? (double)p.sink[h] : -INFINITY);
      const uint16_t *q = p.q + t * p.q_stride_token + h * p.q_stride_head;
      for (int64_t d = 0; d < D; ++d) qd[d] = bfd(q[d]);
      for (int32_t j = 0; j < K; ++j) {
        if (!valid[j]) continue;
        const uint16_t *kv = p.kv + (int64_t)p.indices[t * p.indices_stride + j] * p.kv_stride;
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d) s += qd[d] * bfd(kv[d]);
        acc[j] += exp(scale * s - Lp);
      }
    }
    for (int32_t j = 0; j < K; ++j) p.target[t * p.target_stride + j] = valid[j] ? (float)acc[j] : 0.0f;
  }
  free(valid);
  free(acc);
  free(qd);
  return DSA_SUCCESS;
}

static double relu(double x) { return isnan(x) ? x : (x > 0.0 ? x : 0.0); }

static double weight_at(const void *w, dsa_dtype dtype, int64_t stride, int64_t t, int64_t h) {
  return dtype == DSA_DTYPE_F32 ? (double)((const float *)w)[t * stride + h]
                                : bfd(((const uint16_t *)w)[t * stride + h]);
}

/* q_idx[t, h] . k_idx[row] in double. */
static double idx_dot(const uint16_t *q, const uint16_t *k) {
  double s = 0.0;
  for (int d = 0; d < DSA_INDEX_HEAD_DIM; ++d) s += bfd(q[d]) * bfd(k[d]);
  return s;
}

DSA_API dsa_status dsa_ref_indexer_slot_scores(const dsa_indexer_slot_scores_params *p_in) {
  const char *fn = "dsa_ref_indexer_slot_scores";
  dsa_indexer_slot_scores_params p;
  DSA_TRY(dsa_check_indexer_slot_scores(p_in, fn, &p));
  const int32_t K = p.topk;
  if (p.num_tokens == 0) return DSA_SUCCESS;
  uint8_t *valid = (uint8_t *)malloc((size_t)K);
  if (!valid) return oom(fn);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    slot_mask(p.indices, p.indices_stride, p.lengths, K, p.num_keys, t, valid);
    for (int32_t j = 0; j < K; ++j) {
      double z = 0.0;
      if (valid[j]) {
        const uint16_t *k = p.index_k + (int64_t)p.indices[t * p.indices_stride + j] * p.k_stride;
        for (int64_t h = 0; h < p.num_heads; ++h)
          z += weight_at(p.weights, p.weights_dtype, p.weights_stride, t, h) *
               relu(idx_dot(p.index_q + t * p.q_stride_token + h * p.q_stride_head, k));
      }
      p.scores[t * p.scores_stride + j] = (float)z;
    }
  }
  free(valid);
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_ref_indexer_loss(const dsa_indexer_loss_params *p_in) {
  const char *fn = "dsa_ref_indexer_loss";
  dsa_indexer_loss_params p;
  DSA_TRY(dsa_check_indexer_loss(p_in, fn, &p));
  const int64_t T = p.num_tokens;
  const int32_t K = p.topk;
  const size_t rows = (size_t)(T > 0 ? T : 1);
  uint8_t *valid = (uint8_t *)malloc((size_t)K * rows);
  uint8_t *counted = (uint8_t *)malloc(rows);
  /* per row: the KL term, log sum_V exp(z), sum_V a */
  double *row_loss = (double *)malloc(sizeof(double) * rows);
  double *row_lz = (double *)malloc(sizeof(double) * rows);
  double *row_sum_a = (double *)malloc(sizeof(double) * rows);
  if (!valid || !counted || !row_loss || !row_lz || !row_sum_a) {
    free(valid);
    free(counted);
    free(row_loss);
    free(row_lz);
    free(row_sum_a);
    return oom(fn);
  }
  /* Pass 1: which rows count (a valid slot and a positive target sum), and each one's KL term in
   * log-softmax form: log p_j = z_j - lz, lz = m + log sum_i exp(z_i - m), m the row's largest score. */
  int64_t N = 0;
  for (int64_t t = 0; t < T; ++t) {
    uint8_t *v = valid + t * K;
    const float *a = p.target + t * p.target_stride, *z = p.scores + t * p.scores_stride;
    const int32_t n = slot_mask(p.indices, p.indices_stride, p.lengths, K, p.num_keys, t, v);
    double sum_a = 0.0, m = -INFINITY;
    for (int32_t j = 0; j < K; ++j)
      if (v[j]) {
        sum_a += (double)a[j];
        m = fmax(m, (double)z[j]);
      }
    counted[t] = n > 0 && sum_a > 0.0;
    row_loss[t] = 0.0;
    if (!counted[t]) continue;
    ++N;
    double se = 0.0;
    for (int32_t j = 0; j < K; ++j)
      if (v[j]) se += exp((double)z[j] - m);
    const double lz = m + log(se);
    row_lz[t] = lz;
    row_sum_a[t] = sum_a;
    for (int32_t j = 0; j < K; ++j) {
      if (!v[j]) continue;
      const double tgt = (double)a[j] / sum_a;
      if (tgt > 0.0) row_loss[t] += tgt * (log(tgt) - ((double)z[j] - lz));
      else if (tgt != 0.0) row_loss[t] = NAN; /* a negative target has no KL term */
    }
  }
  const double gl = p.grad_loss ? (double)p.grad_loss[0] : 1.0;
  const double f = N > 0 ? (double)p.coeff / (double)N : 0.0;
  double loss = 0.0;
  for (int64_t t = 0; t < T; ++t) loss += row_loss[t];
  /* Pass 2: g = grad_loss * coeff / N * (p - tgt) on counted rows, 0 elsewhere. */
  if (p.grad)
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t *v = valid + t * K;
      const float *a = p.target + t * p.target_stride, *z = p.scores + t * p.scores_stride;
      float *g = p.grad + t * p.grad_stride;
      for (int32_t j = 0; j < K; ++j)
        g[j] = counted[t] && v[j]
                   ? (float)(gl * f * (exp((double)z[j] - row_lz[t]) - (double)a[j] / row_sum_a[t]))
                   : 0.0f;
    }
  p.loss[0] = (float)(f * loss);
  free(valid);
  free(counted);
  free(row_loss);
  free(row_lz);
  free(row_sum_a);
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_ref_indexer_bwd(const dsa_indexer_bwd_params *p_in) {
  const char *fn = "dsa_ref_indexer_bwd";
  dsa_indexer_bwd_params p;
  DSA_TRY(dsa_check_indexer_bwd(p_in, fn, &p));
  const int64_t T = p.num_tokens, Tk = p.num_keys, H = p.num_heads, D = DSA_INDEX_HEAD_DIM;
  const int32_t K = p.topk;
  uint8_t *valid = (uint8_t *)malloc((size_t)K);
  double *dk = (double *)calloc(Tk > 0 ? (size_t)(Tk * D) : 1, sizeof(double));
  double *dq = (double *)malloc(sizeof(double) * (size_t)D);
  if (!valid || !dk || !dq) {
    free(valid);
    free(dk);
    free(dq);
    return oom(fn);
  }
  for (int64_t t = 0; t < T; ++t) {
    slot_mask(p.indices, p.indices_stride, p.lengths, K, Tk, t, valid);
    const float *g = p.grad + t * p.grad_stride;
    for (int64_t h = 0; h < H; ++h) {
      const uint16_t *q = p.index_q + t * p.q_stride_token + h * p.q_stride_head;
      const double w = weight_at(p.weights, p.weights_dtype, p.weights_stride, t, h);
      double dw = 0.0;
      memset(dq, 0, sizeof(double) * (size_t)D);
      for (int32_t j = 0; j < K; ++j) {
        if (!valid[j]) continue;
        const int64_t s = p.indices[t * p.indices_stride + j];
        const uint16_t *k = p.index_k + s * p.k_stride;
        const double x = idx_dot(q, k), gj = (double)g[j];
        dw += gj * relu(x);
        if (!(x > 0.0)) continue; /* ReLU' = [x > 0]: 0 at x = 0 and for NaN */
        for (int64_t d = 0; d < D; ++d) {
          dq[d] += gj * w * bfd(k[d]);
          dk[s * D + d] += gj * w * bfd(q[d]);
        }
      }
      uint16_t *dq_out = p.d_index_q + t * p.dq_stride_token + h * p.dq_stride_head;
      for (int64_t d = 0; d < D; ++d) dq_out[d] = dsa_ref_double_to_bf16(dq[d]);
      p.d_weights[t * p.dw_stride + h] = (float)dw;
    }
  }
  for (int64_t s = 0; s < Tk; ++s)
    for (int64_t d = 0; d < D; ++d) p.d_index_k[s * p.dk_stride + d] = dsa_ref_double_to_bf16(dk[s * D + d]);
  free(valid);
  free(dk);
  free(dq);
  return DSA_SUCCESS;
}
