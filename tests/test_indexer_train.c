/* test_indexer_train.c - the indexer-training references against hand-computed cases: the slot
 * target (probabilities by hand, sink, invalid and empty rows, topk_length), the indexer's slot
 * scores (ReLU, weights), the KL loss (a hand value, rows that do not count, coeff and grad_loss,
 * finite differences of the loss against its gradient), the indexer backward (a hand case with a
 * duplicate slot; d_weights as the exact derivative of sum g z through the slot scores), and the
 * argument checks; and the GPU entry points' checks that run before the context (suite
 * indexer_train_entry: size queries with ctx = NULL, bad arguments named). CPU only. */
#include <math.h>
#include "test_common.h"

#define TC_FAILS_INVALID(call, word) TC_FAILS(call, DSA_ERROR_INVALID_ARGUMENT, word)

static uint16_t B(double x) { return dsa_f32_to_bf16((float)x); }
static double F(uint16_t x) { return (double)dsa_bf16_to_f32(x); }
static void *zalloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  cr_assert_not_null(p);
  memset(p, 0, (bytes + 63) / 64 * 64);
  return p;
}

/* =============================================================================================
 * slot target
 * =========================================================================================== */
Test(reference_indexer_train, slot_target_by_hand) {
  enum { T = 3, H = 2, D = 576, NKV = 3, K = 4 };
  uint16_t *q = zalloc(sizeof(uint16_t) * T * H * D), *kv = zalloc(sizeof(uint16_t) * NKV * D);
  for (int i = 0; i < NKV * D; ++i) kv[i] = B(0.25 * ((i % 7) - 3)); /* any values: q is 0 */
  /* row 0: every valid slot has logit 0; row 1: topk_length 2; row 2: lse = +inf (no valid slot) */
  const int32_t idx[T * K] = {0, 2, -1, 1, 1, 1, 0, 2, -1, -1, -1, -1};
  const int32_t len[T] = {4, 2, 0};
  const float sink[H] = {-INFINITY, (float)log(3.0)};
  float lse[T * H] = {(float)log(3.0), (float)log(3.0), (float)log(2.0), (float)log(2.0), INFINITY, INFINITY};
  float target[T * K];
  for (int i = 0; i < T * K; ++i) target[i] = NAN;
  dsa_slot_target_params p = {0};
  p.num_tokens = T;
  p.num_heads = H;
  p.head_dim = D;
  p.num_kv = NKV;
  p.topk = K;
  p.softmax_scale = 0.0625f;
  p.q = q;
  p.kv = kv;
  p.indices = idx;
  p.topk_length = len;
  p.sink = sink;
  p.lse = lse;
  p.target = target;
  TC_OK(dsa_ref_attn_slot_target(&p));
  /* row 0: head 0 P = exp(0 - ln 3) = 1/3; head 1 L' = logaddexp(ln 3, ln 3) = ln 6, P = 1/6 */
  const double w0[K] = {0.5, 0.5, 0.0, 0.5};
  /* row 1: head 0 P = 1/2; head 1 L' = logaddexp(ln 2, ln 3) = ln 5, P = 1/5; slots 2, 3 past length */
  const double w1[K] = {0.7, 0.7, 0.0, 0.0};
  for (int j = 0; j < K; ++j) {
    cr_assert_float_eq(target[j], w0[j], 1e-6, "row 0 slot %d: %g", j, (double)target[j]);
    cr_assert_float_eq(target[K + j], w1[j], 1e-6, "row 1 slot %d: %g", j, (double)target[K + j]);
    cr_assert_eq(target[2 * K + j], 0.0f, "an empty row has no target");
  }
  /* a nonzero logit: q[0, 0] = e0, kv[0] = 2 e0, scale 0.5 -> s = 1; lse = 1 -> P = 1 */
  memset(kv, 0, sizeof(uint16_t) * NKV * D);
  kv[0] = B(2.0);
  q[0] = B(1.0);
  p.softmax_scale = 0.5f;
  p.sink = NULL;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.q_stride_token = H * D; /* head 0 of each token */
  lse[0] = 1.0f;
  TC_OK(dsa_ref_attn_slot_target(&p));
  cr_assert_float_eq(target[0], 1.0, 1e-6);                 /* slot 0 -> kv row 0: s = 1 */
  cr_assert_float_eq(target[1], exp(-1.0), 1e-6);           /* slot 1 -> kv row 2: s = 0 */
  cr_assert_eq(target[2], 0.0f);
  free(q);
  free(kv);
}

/* =============================================================================================
 * indexer slot scores
 * =========================================================================================== */
static void idx_inputs(uint16_t **q, uint16_t **k, int T, int H, int Tk) {
  *q = zalloc(sizeof(uint16_t) * T * H * 128);
  *k = zalloc(sizeof(uint16_t) * Tk * 128);
}

Test(reference_indexer_train, slot_scores_by_hand) {
  enum { T = 1, H = 2, TK = 2, K = 3 };
  uint16_t *q, *k;
  idx_inputs(&q, &k, T, H, TK);
  q[0] = B(1.0);             /* head 0: e0 */
  q[128] = B(-1.0);          /* head 1: -e0 */
  k[0] = B(2.0);             /* key 0: 2 e0 -> x = 2, -2 */
  k[128 + 1] = B(-1.0);      /* key 1: -e1 -> x = 0, 0 */
  const float w[T * H] = {0.5f, 3.0f};
  const int32_t idx[K] = {0, 1, 7}; /* 7 is out of range */
  float z[K] = {NAN, NAN, NAN};
  dsa_indexer_slot_scores_params p = {0};
  p.num_tokens = T;
  p.num_keys = TK;
  p.num_heads = H;
  p.topk = K;
  p.index_q = q;
  p.index_k = k;
  p.weights = w;
  p.weights_dtype = DSA_DTYPE_F32;
  p.indices = idx;
  p.scores = z;
  TC_OK(dsa_ref_indexer_slot_scores(&p));
  cr_assert_float_eq(z[0], 1.0, 1e-7, "0.5 * ReLU(2) + 3 * ReLU(-2)");
  cr_assert_eq(z[1], 0.0f);
  cr_assert_eq(z[2], 0.0f, "an invalid slot scores 0");
  free(q);
  free(k);
}

/* =============================================================================================
 * loss
 * =========================================================================================== */
static dsa_indexer_loss_params loss_params(int64_t T, int32_t K, int64_t num_keys, const int32_t *idx,
                                           const float *a, const float *z, float *loss, float *g) {
  dsa_indexer_loss_params p = {0};
  p.num_tokens = T;
  p.topk = K;
  p.num_keys = num_keys;
  p.indices = idx;
  p.target = a;
  p.scores = z;
  p.coeff = 1.0f;
  p.loss = loss;
  p.grad = g;
  return p;
}

Test(reference_indexer_train, loss_by_hand) {
  enum { T = 3, K = 2 };
  /* row 0 counts; row 1 has no valid slot; row 2's target sums to 0 */
  const int32_t idx[T * K] = {0, 1, -1, -1, 0, 1};
  const float a[T * K] = {1, 3, 5, 5, 0, 0};
  const float z[T * K] = {0, 0, 1, 2, 1, 2};
  float loss = NAN, g[T * K];
  for (int i = 0; i < T * K; ++i) g[i] = NAN;
  dsa_indexer_loss_params p = loss_params(T, K, 2, idx, a, z, &loss, g);
  TC_OK(dsa_ref_indexer_loss(&p));
  /* tgt = (1/4, 3/4), p = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2); N = 1 */
  const double kl = 0.25 * log(0.5) + 0.75 * log(1.5);
  cr_assert_float_eq(loss, kl, 1e-6, "loss %g, want %g", (double)loss, kl);
  cr_assert_float_eq(g[0], 0.25, 1e-7);
  cr_assert_float_eq(g[1], -0.25, 1e-7);
  for (int i = 2; i < T * K; ++i) cr_assert_eq(g[i], 0.0f, "rows that do not count get g = 0");
  /* coeff and the incoming gradient scale g; coeff alone scales the loss */
  const float gl = 0.5f;
  p.coeff = 2.0f;
  p.grad_loss = &gl;
  TC_OK(dsa_ref_indexer_loss(&p));
  cr_assert_float_eq(loss, 2 * kl, 1e-6);
  cr_assert_float_eq(g[0], 0.25, 1e-7, "2 * 0.5 * (p - tgt)");
  /* no row counts: loss 0, g 0 */
  p.num_keys = 0;
  TC_OK(dsa_ref_indexer_loss(&p));
  cr_assert_eq(loss, 0.0f);
  cr_assert_eq(g[0], 0.0f);
  /* zero tokens: the loss is still written */
  loss = NAN;
  p.num_tokens = 0;
  TC_OK(dsa_ref_indexer_loss(&p));
  cr_assert_eq(loss, 0.0f);
}

Test(reference_indexer_train, loss_gradient_matches_finite_differences) {
  enum { T = 4, K = 6 };
  tc_rng r = tc_seed("loss_gradient_matches_finite_differences");
  const unsigned long long seed = (unsigned long long)r.s;
  int32_t idx[T * K], len[T] = {6, 4, 1, 6};
  float a[T * K], z[T * K], g[T * K], loss;
  for (int i = 0; i < T * K; ++i) {
    idx[i] = (int32_t)(tc_next(&r) % 5) - (i % 5 == 3); /* some -1, duplicates */
    a[i] = (float)(tc_uniform(&r) * 2.0);
    z[i] = (float)(tc_uniform(&r) * 4.0 - 2.0);
  }
  dsa_indexer_loss_params p = loss_params(T, K, 5, idx, a, z, &loss, g);
  p.lengths = len;
  p.coeff = 0.7f;
  TC_OK(dsa_ref_indexer_loss(&p));
  float gref[T * K];
  memcpy(gref, g, sizeof g);
  const float h = 1e-2f;
  p.grad = NULL;
  for (int i = 0; i < T * K; ++i) {
    const float z0 = z[i];
    float lp, lm;
    z[i] = z0 + h;
    p.loss = &lp;
    TC_OK(dsa_ref_indexer_loss(&p));
    z[i] = z0 - h;
    p.loss = &lm;
    TC_OK(dsa_ref_indexer_loss(&p));
    z[i] = z0;
    const double fd = ((double)lp - (double)lm) / (2.0 * h);
    cr_assert(fabs(fd - (double)gref[i]) < 2e-4, "seed %llu slot %d: finite difference %g, gradient %g",
              seed, i, fd, (double)gref[i]);
  }
}

/* =============================================================================================
 * indexer backward
 * =========================================================================================== */
static dsa_indexer_bwd_params bwd_params(int64_t T, int64_t Tk, int32_t H, int32_t K, const uint16_t *q,
                                         const uint16_t *k, const float *w, const int32_t *idx,
                                         const float *g, uint16_t *dq, float *dw, uint16_t *dk) {
  dsa_indexer_bwd_params p = {0};
  p.num_tokens = T;
  p.num_keys = Tk;
  p.num_heads = H;
  p.topk = K;
  p.index_q = q;
  p.index_k = k;
  p.weights = w;
  p.weights_dtype = DSA_DTYPE_F32;
  p.indices = idx;
  p.grad = g;
  p.d_index_q = dq;
  p.d_weights = dw;
  p.d_index_k = dk;
  return p;
}

Test(reference_indexer_train, indexer_bwd_by_hand_with_duplicate) {
  enum { T = 1, H = 1, TK = 3, K = 4 };
  uint16_t *q, *k;
  idx_inputs(&q, &k, T, H, TK);
  q[0] = B(1.0);         /* q = e0 */
  k[0] = B(2.0);         /* key 0 = 2 e0: x = 2 */
  k[128] = B(-1.0);      /* key 1 = -e0: x = -1 (ReLU' = 0) */
  const float w[1] = {0.5f};
  const int32_t idx[K] = {0, 1, 0, -1};
  const float g[K] = {0.25f, 1.0f, 0.5f, 9.0f};
  uint16_t *dq = zalloc(sizeof(uint16_t) * 128), *dk = zalloc(sizeof(uint16_t) * TK * 128);
  float dw = NAN;
  for (int i = 0; i < TK * 128; ++i) dk[i] = 0x7FC0; /* NaN poison */
  dsa_indexer_bwd_params p = bwd_params(T, TK, H, K, q, k, w, idx, g, dq, &dw, dk);
  TC_OK(dsa_ref_indexer_bwd(&p));
  cr_assert_float_eq(dw, 1.5, 1e-7, "(0.25 + 0.5) * ReLU(2)");
  cr_assert_float_eq(F(dq[0]), 0.75, 1e-7, "(0.25 + 0.5) * 0.5 * 2");
  for (int d = 1; d < 128; ++d) cr_assert_eq(F(dq[d]), 0.0);
  cr_assert_float_eq(F(dk[0]), 0.375, 1e-7, "key 0: (0.25 + 0.5) * 0.5 * q");
  for (int i = 1; i < TK * 128; ++i) cr_assert_eq(F(dk[i]), 0.0, "dk[%d]: nothing else contributes", i);
  /* no tokens: d_index_k is still written, all zeros */
  for (int i = 0; i < TK * 128; ++i) dk[i] = 0x7FC0;
  p.num_tokens = 0;
  TC_OK(dsa_ref_indexer_bwd(&p));
  for (int i = 0; i < TK * 128; ++i) cr_assert_eq(dk[i], 0);
  free(q);
  free(k);
  free(dq);
  free(dk);
}

/* d_weights is the exact derivative of sum_j g z: z is linear in w, so one step of an exactly
 * representable size recovers it through dsa_ref_indexer_slot_scores. */
Test(reference_indexer_train, d_weights_is_the_derivative_of_the_slot_scores) {
  enum { T = 3, H = 4, TK = 9, K = 5 };
  tc_rng r = tc_seed("d_weights_is_the_derivative_of_the_slot_scores");
  const unsigned long long seed = (unsigned long long)r.s;
  uint16_t *q, *k;
  idx_inputs(&q, &k, T, H, TK);
  for (int i = 0; i < T * H * 128; ++i) q[i] = B(tc_uniform(&r) * 2 - 1);
  for (int i = 0; i < TK * 128; ++i) k[i] = B(tc_uniform(&r) * 2 - 1);
  float w[T * H], g[T * K], z0[T * K], z1[T * K], dw[T * H];
  int32_t idx[T * K];
  for (int i = 0; i < T * H; ++i) w[i] = (float)(tc_uniform(&r) - 0.5);
  for (int i = 0; i < T * K; ++i) {
    g[i] = (float)(tc_uniform(&r) - 0.5);
    idx[i] = (int32_t)(tc_next(&r) % (TK + 1)) - 1; /* -1 .. TK - 1 */
  }
  uint16_t *dq = zalloc(sizeof(uint16_t) * T * H * 128), *dk = zalloc(sizeof(uint16_t) * TK * 128);
  dsa_indexer_bwd_params p = bwd_params(T, TK, H, K, q, k, w, idx, g, dq, dw, dk);
  TC_OK(dsa_ref_indexer_bwd(&p));
  dsa_indexer_slot_scores_params s = {0};
  s.num_tokens = T;
  s.num_keys = TK;
  s.num_heads = H;
  s.topk = K;
  s.index_q = q;
  s.index_k = k;
  s.weights = w;
  s.weights_dtype = DSA_DTYPE_F32;
  s.indices = idx;
  s.scores = z0;
  TC_OK(dsa_ref_indexer_slot_scores(&s));
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const float w0 = w[t * H + h];
      w[t * H + h] = w0 + 0.25f;
      s.scores = z1;
      TC_OK(dsa_ref_indexer_slot_scores(&s));
      w[t * H + h] = w0;
      double d = 0;
      for (int j = 0; j < K; ++j) d += (double)g[t * K + j] * ((double)z1[t * K + j] - (double)z0[t * K + j]) / 0.25;
      cr_assert(fabs(d - (double)dw[t * H + h]) < 1e-5 * (1 + fabs(d)), "seed %llu t %d h %d: %g vs %g",
                seed, t, h, d, (double)dw[t * H + h]);
    }
  free(q);
  free(k);
  free(dq);
  free(dk);
}

/* =============================================================================================
 * argument checks
 * =========================================================================================== */
Test(reference_indexer_train, bad_arguments_named) {
  uint16_t *q, *k;
  idx_inputs(&q, &k, 1, 1, 1);
  const float w[1] = {1}, g[1] = {1};
  const int32_t idx[1] = {0};
  uint16_t *dq = zalloc(256), *dk = zalloc(256);
  float dw = 0, loss = 0, z[1] = {0}, a[1] = {1};
  dsa_indexer_bwd_params b = bwd_params(1, 1, 1, 1, q, k, w, idx, g, dq, &dw, dk);
  b.deterministic = 7;
  TC_FAILS_INVALID(dsa_ref_indexer_bwd(&b), "deterministic");
  b.deterministic = 0;
  b.weights_dtype = (dsa_dtype)99;
  TC_FAILS_INVALID(dsa_ref_indexer_bwd(&b), "weights_dtype");
  b.weights_dtype = DSA_DTYPE_F32;
  b.num_heads = 65;
  TC_FAILS_INVALID(dsa_ref_indexer_bwd(&b), "num_heads");
  b.num_heads = 1;
  b.d_index_k = NULL;
  TC_FAILS_INVALID(dsa_ref_indexer_bwd(&b), "d_index_k");
  dsa_indexer_loss_params l = loss_params(1, 1, 1, idx, a, z, &loss, NULL);
  l.coeff = NAN;
  TC_FAILS_INVALID(dsa_ref_indexer_loss(&l), "coeff");
  l.coeff = 1;
  l.loss = NULL;
  TC_FAILS_INVALID(dsa_ref_indexer_loss(&l), "loss");
  l.loss = &loss;
  l.topk = 0;
  TC_FAILS_INVALID(dsa_ref_indexer_loss(&l), "topk");
  dsa_slot_target_params st = {0};
  TC_FAILS_INVALID(dsa_ref_attn_slot_target(&st), "num_heads");
  TC_FAILS_INVALID(dsa_ref_attn_slot_target(NULL), "p is NULL");
  free(q);
  free(k);
  free(dq);
  free(dk);
}

/* =============================================================================================
 * the GPU entry points' checks that run before the context: bad params are named with the op's
 * name, size queries need no context (ctx NULL) and report the documented sizes, failures write
 * nothing (not the size either)
 * =========================================================================================== */
static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

Test(indexer_train_entry, size_queries_without_a_context) {
  /* buffers of the sizes the params describe (the checks compare their byte ranges for aliasing) */
  float *a = zalloc(37 * 77 * 4), *z = zalloc(37 * 77 * 4);
  int32_t *idx = zalloc(37 * 77 * 4);
  float loss = 0;
  dsa_indexer_loss_params l = loss_params(37, 77, 50, idx, a, z, &loss, NULL);
  size_t bytes = 0, again = 0;
  TC_OK(dsa_indexer_loss(NULL, &l, NULL, &bytes, 0));
  TC_OK(dsa_indexer_loss(NULL, &l, NULL, &again, 0));
  cr_assert_eq(bytes, 4 * align256(4 * 37) + 512);
  cr_assert_eq(again, bytes);
  l.num_tokens = 0;
  TC_OK(dsa_indexer_loss(NULL, &l, NULL, &bytes, 0));
  cr_assert_eq(bytes, 512, "T = 0 still has a size >= 1 (the loss is written)");

  uint16_t *q, *k;
  idx_inputs(&q, &k, 37, 7, 301);
  float *w = zalloc(37 * 7 * 4), *g = zalloc(37 * 77 * 4), *dw = zalloc(37 * 7 * 4);
  uint16_t *dq = zalloc(37 * 7 * 128 * 2), *dk = zalloc(301 * 128 * 2);
  dsa_indexer_bwd_params b = bwd_params(37, 301, 7, 77, q, k, w, idx, g, dq, dw, dk);
  TC_OK(dsa_indexer_bwd(NULL, &b, NULL, &bytes, 0));
  cr_assert_eq(bytes, align256(301 * 128 * 4) + 256, "the fp32 d_index_k accumulator plus slack");
  b.num_keys = 0;
  TC_OK(dsa_indexer_bwd(NULL, &b, NULL, &bytes, 0));
  cr_assert_eq(bytes, 256);
  /* deterministic: CUB sizes its sort scratch from the device (DSA_ERROR_NO_DEVICE without one) */
  b.num_keys = 301;
  b.deterministic = 1;
  bytes = 777;
  const dsa_status s = dsa_indexer_bwd(NULL, &b, NULL, &bytes, 0);
  if (!tc_have_gpu()) {
    cr_assert_eq(s, DSA_ERROR_NO_DEVICE, "deterministic size without a device: %d (%s)", (int)s,
                 dsa_last_error_message());
    cr_assert(strstr(dsa_last_error_message(), "dsa_indexer_bwd") &&
              strstr(dsa_last_error_message(), "needs a CUDA device"), "%s", dsa_last_error_message());
    cr_assert_eq(bytes, 777, "a failed size query wrote the size");
  } else {
    cr_assert_eq(s, DSA_SUCCESS, "%s", dsa_last_error_message());
    const size_t n = 37 * 77;
    cr_assert_geq(bytes, 4 * align256(4 * n) + align256(8 * 302) + 256);
  }
  /* without tokens there is nothing to sort: no device needed */
  b.num_tokens = 0;
  TC_OK(dsa_indexer_bwd(NULL, &b, NULL, &bytes, 0));
  cr_assert_eq(bytes, align256(8 * 302) + 256);
  free(q);
  free(k);
  free(dq);
  free(dk);
  free(a);
  free(z);
  free(idx);
  free(w);
  free(g);
  free(dw);
}

Test(indexer_train_entry, bad_arguments_named_before_the_context) {
  uint16_t *q, *k;
  idx_inputs(&q, &k, 1, 1, 1);
  const float w[1] = {1}, g[1] = {1}, a[1] = {1}, z[1] = {0}, lse[1] = {0};
  const int32_t idx[1] = {0};
  uint16_t *dq = zalloc(256), *dk = zalloc(256);
  float dw = 0, loss = 0, out[1] = {0};
  size_t bytes = 555;
  /* slot target: the op's name and the argument */
  dsa_slot_target_params st = {0};
  st.num_tokens = 1;
  st.num_heads = 1;
  st.head_dim = 500;
  st.num_kv = 1;
  st.topk = 1;
  st.softmax_scale = 1.0f;
  st.q = q;
  st.kv = k;
  st.indices = idx;
  st.lse = lse;
  st.target = out;
  TC_FAILS_INVALID(dsa_attn_slot_target(NULL, &st, 0), "dsa_attn_slot_target");
  TC_FAILS_INVALID(dsa_attn_slot_target(NULL, &st, 0), "head_dim");
  st.head_dim = 576;
  TC_FAILS_INVALID(dsa_attn_slot_target(NULL, &st, 0), "ctx is NULL"); /* valid params: the context */
  TC_FAILS_INVALID(dsa_attn_slot_target(NULL, NULL, 0), "p is NULL");
  /* slot scores */
  dsa_indexer_slot_scores_params ss = {0};
  ss.num_tokens = 1;
  ss.num_keys = 1;
  ss.num_heads = 1;
  ss.topk = 1;
  ss.index_q = q;
  ss.index_k = k;
  ss.weights = w;
  ss.weights_dtype = (dsa_dtype)7;
  ss.indices = idx;
  ss.scores = out;
  TC_FAILS_INVALID(dsa_indexer_slot_scores(NULL, &ss, 0), "dsa_indexer_slot_scores: weights_dtype");
  ss.weights_dtype = DSA_DTYPE_F32;
  ss.scores = NULL;
  TC_FAILS_INVALID(dsa_indexer_slot_scores(NULL, &ss, 0), "scores");
  ss.scores = out;
  TC_FAILS_INVALID(dsa_indexer_slot_scores(NULL, &ss, 0), "ctx is NULL");
  /* loss */
  dsa_indexer_loss_params l = loss_params(1, 1, 1, idx, a, z, &loss, NULL);
  TC_FAILS_INVALID(dsa_indexer_loss(NULL, &l, NULL, NULL, 0), "dsa_indexer_loss: workspace_bytes is NULL");
  l.coeff = NAN;
  TC_FAILS_INVALID(dsa_indexer_loss(NULL, &l, NULL, &bytes, 0), "coeff");
  cr_assert_eq(bytes, 555, "a failed size query wrote the size");
  l.coeff = 1.0f;
  TC_FAILS_INVALID(dsa_indexer_loss(NULL, &l, (void *)&bytes, &bytes, 0), "ctx is NULL");
  /* backward */
  dsa_indexer_bwd_params b = bwd_params(1, 1, 1, 1, q, k, w, idx, g, dq, &dw, dk);
  b.deterministic = 2;
  TC_FAILS_INVALID(dsa_indexer_bwd(NULL, &b, NULL, &bytes, 0), "dsa_indexer_bwd: deterministic");
  cr_assert_eq(bytes, 555);
  b.deterministic = 0;
  b.dk_stride = 130;
  TC_FAILS_INVALID(dsa_indexer_bwd(NULL, &b, NULL, &bytes, 0), "dk_stride");
  b.dk_stride = 0;
  TC_FAILS_INVALID(dsa_indexer_bwd(NULL, &b, NULL, NULL, 0), "workspace_bytes is NULL");
  TC_FAILS_INVALID(dsa_indexer_bwd(NULL, &b, (void *)&bytes, &bytes, 0), "ctx is NULL");
  cr_assert_eq(bytes, 555);
  free(q);
  free(k);
  free(dq);
  free(dk);
}

/* Outputs that overlap an input or another output are rejected, naming both (docs/contract.md
 * section 13.3), before anything is written. */
Test(indexer_train_entry, outputs_may_not_alias) {
  enum { T = 3, K = 4, TK = 5, H = 2 };
  float *buf = zalloc(4096 * 4);
  int32_t *idx = zalloc(T * K * 4);
  dsa_indexer_loss_params l = loss_params(T, K, TK, idx, buf, buf + 64, buf + 128, buf + 192);
  TC_OK(dsa_ref_indexer_loss(&l));
  l.grad = buf + 64; /* g over the scores */
  TC_FAILS_INVALID(dsa_ref_indexer_loss(&l), "output grad");
  l.grad = buf + 192;
  l.loss = buf + 192; /* loss inside g */
  TC_FAILS_INVALID(dsa_ref_indexer_loss(&l), "overlaps output grad");
  uint16_t *q, *k;
  idx_inputs(&q, &k, T, H, TK);
  uint16_t *dq = zalloc(T * H * 128 * 2), *dk = zalloc(TK * 128 * 2);
  float *w = zalloc(T * H * 4), *g = zalloc(T * K * 4), *dw = zalloc(T * H * 4);
  dsa_indexer_bwd_params b = bwd_params(T, TK, H, K, q, k, w, idx, g, dq, dw, dk);
  TC_OK(dsa_ref_indexer_bwd(&b));
  b.d_index_k = k; /* in place over index_k */
  TC_FAILS_INVALID(dsa_ref_indexer_bwd(&b), "overlaps input index_k");
  b.d_index_k = dk;
  b.d_weights = w;
  TC_FAILS_INVALID(dsa_ref_indexer_bwd(&b), "overlaps input weights");
  free(buf); free(idx); free(q); free(k); free(dq); free(dk); free(w); free(g); free(dw);
}
