/* test_reference.c - the CPU oracle against hand-computed cases: top-k ordering rules, the indexer
 * (ReLU, ties, select-all, invalid queries, bf16/fp32 weights), sparse attention forward (softmax by
 * hand, duplicates, invalid slots, topk_length, empty rows, sink, strides) and backward (finite
 * differences of the double forward, duplicate accumulation). CPU only. */
#include <limits.h>
#include "test_common.h"
#include "dsa_testing.h"

static void *ref_alloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  cr_assert_not_null(p);
  return p;
}
static uint16_t B(double x) { return dsa_f32_to_bf16((float)x); }
static double F(uint16_t x) { return (double)dsa_bf16_to_f32(x); }

/* =============================================================================================
 * top-k
 * =========================================================================================== */
static void run_topk(const float *scores, int64_t rows, int64_t columns, const int32_t *lengths,
                     int32_t k, int32_t *out) {
  dsa_topk_params p = {0};
  p.rows = rows;
  p.columns = columns;
  p.k = k;
  p.scores = scores;
  p.lengths = lengths;
  p.indices = out;
  for (int64_t i = 0; i < rows * k; ++i) out[i] = TC_POISON_I32;
  TC_OK(dsa_ref_topk(&p));
}

static void expect_row(const int32_t *got, const int32_t *want, int k) {
  for (int i = 0; i < k; ++i)
    cr_assert_eq(got[i], want[i], "slot %d: got %d, want %d", i, got[i], want[i]);
}

Test(reference_topk, ties_broken_by_smaller_column) {
  const float s[5] = {1, 3, 3, 2, 3};
  int32_t out[4];
  run_topk(s, 1, 5, NULL, 2, out);
  expect_row(out, (const int32_t[]){1, 2}, 2);
  run_topk(s, 1, 5, NULL, 3, out);
  expect_row(out, (const int32_t[]){1, 2, 4}, 3);
  run_topk(s, 1, 5, NULL, 4, out);
  expect_row(out, (const int32_t[]){1, 2, 3, 4}, 4);
  /* -0 and +0 are equal: the smaller column wins */
  const float z[3] = {0.0f, -0.0f, 0.0f};
  run_topk(z, 1, 3, NULL, 1, out);
  cr_assert_eq(out[0], 0);
  const float z2[3] = {-0.0f, -1.0f, 0.0f};
  run_topk(z2, 1, 3, NULL, 2, out);
  expect_row(out, (const int32_t[]){0, 2}, 2);
}

Test(reference_topk, nan_lowest_and_neg_inf_above_nan) {
  const float s[5] = {NAN, -INFINITY, NAN, 0.0f, -1e30f};
  int32_t out[5];
  run_topk(s, 1, 5, NULL, 2, out);
  expect_row(out, (const int32_t[]){3, 4}, 2);
  run_topk(s, 1, 5, NULL, 3, out);
  expect_row(out, (const int32_t[]){1, 3, 4}, 3);
  run_topk(s, 1, 5, NULL, 4, out); /* one NaN enters: the smaller column */
  expect_row(out, (const int32_t[]){0, 1, 3, 4}, 4);
  const float n[3] = {NAN, NAN, NAN};
  run_topk(n, 1, 3, NULL, 2, out);
  expect_row(out, (const int32_t[]){0, 1}, 2);
}

Test(reference_topk, short_rows_and_lengths) {
  /* 4 rows of 4 columns; lengths 2, 9 (clamped to 4), -1 (clamped to 0), 3 */
  const float s[16] = {5, 4, 3, 2, /**/ 1, 9, 8, 7, /**/ 1, 2, 3, 4, /**/ 0, 0, 7, 9};
  const int32_t len[4] = {2, 9, -1, 3};
  int32_t out[12];
  run_topk(s, 4, 4, len, 3, out);
  expect_row(out + 0, (const int32_t[]){0, 1, -1}, 3);     /* L = 2 <= k: 0..L-1 then -1 */
  expect_row(out + 3, (const int32_t[]){1, 2, 3}, 3);      /* L = 4 > k: best three, ascending */
  expect_row(out + 6, (const int32_t[]){-1, -1, -1}, 3);   /* L = 0 */
  expect_row(out + 9, (const int32_t[]){0, 1, 2}, 3);      /* L = 3 == k: all, no scoring */
  /* no lengths, columns < k */
  run_topk(s, 1, 2, NULL, 3, out);
  expect_row(out, (const int32_t[]){0, 1, -1}, 3);
  /* columns = 0 */
  run_topk(NULL, 2, 0, NULL, 2, out);
  expect_row(out, (const int32_t[]){-1, -1, -1, -1}, 4);
}

Test(reference_topk, random_rows_are_the_best_set_ascending) {
  tc_rng rng = tc_seed("reference_topk.random");
  const int64_t rows = 7, cols = 301;
  const int32_t k = 37;
  float *s = ref_alloc(sizeof(float) * rows * cols);
  int32_t *out = ref_alloc(sizeof(int32_t) * rows * k);
  for (int64_t i = 0; i < rows * cols; ++i) /* few distinct values: many ties */
    s[i] = (float)tc_below(&rng, 20) - 10.0f;
  s[3] = NAN;
  s[cols + 5] = INFINITY;
  s[2 * cols + 7] = -INFINITY;
  run_topk(s, rows, cols, NULL, k, out);
  for (int64_t r = 0; r < rows; ++r) {
    const float *sr = s + r * cols;
    const int32_t *o = out + r * k;
    char chosen[301] = {0};
    for (int i = 0; i < k; ++i) {
      cr_assert(o[i] >= 0 && o[i] < cols);
      if (i) cr_assert_lt(o[i - 1], o[i], "row %lld not strictly ascending", (long long)r);
      chosen[o[i]] = 1;
    }
    /* every chosen column ranks ahead of every unchosen one */
    for (int a = 0; a < cols; ++a) {
      if (!chosen[a]) continue;
      for (int b = 0; b < cols; ++b) {
        if (chosen[b]) continue;
        int ahead;
        if (isnan(sr[a]) || isnan(sr[b]))
          ahead = isnan(sr[b]) && (!isnan(sr[a]) || a < b);
        else
          ahead = sr[a] > sr[b] || (sr[a] == sr[b] && a < b);
        cr_assert(ahead, "row %lld: column %d chosen over %d", (long long)r, a, b);
      }
    }
  }
  free(s);
  free(out);
}

Test(reference_topk, strides_leave_padding_untouched) {
  const float s[2 * 6] = {1, 2, 3, 99, 99, 99, /**/ 3, 2, 1, 99, 99, 99};
  int32_t out[2 * 4];
  for (int i = 0; i < 8; ++i) out[i] = TC_POISON_I32;
  dsa_topk_params p = {0};
  p.rows = 2;
  p.columns = 3;
  p.k = 2;
  p.scores = s;
  p.scores_stride = 6;
  p.indices = out;
  p.indices_stride = 4;
  TC_OK(dsa_ref_topk(&p));
  expect_row(out, (const int32_t[]){1, 2, TC_POISON_I32, TC_POISON_I32, 0, 1, TC_POISON_I32,
                                    TC_POISON_I32},
             8);
}

/* =============================================================================================
 * indexer
 * =========================================================================================== */
/* Tiny hand case: H_idx = 2, one document of 3 keys [0, 3) and a second [3, 5).
 * k0 = (1, 0), k1 = (0, 1), k2 = (1, 1), k3 = (1, 0), k4 = (0, 1) in dims 0, 1 (the rest 0).
 * row 0: key 0 only (causal length 1)
 * row 1: q = (1,-1), (-1,2), w = (1, 0.5): key0 = 1*1 + 0.5*ReLU(-1) = 1, key1 = 0 + 0.5*2 = 1 (tie)
 * row 2: q = (2,0), (0,1), w = (0.5, 3): key0 = 1, key1 = 3, key2 = 1 + 3 = 4
 * row 3: invalid query (causal length 0)
 * row 4: document 2, keys 3, 4; q = (-1,0), (0,1), w = (1, 2): key3 = 0 (ReLU), key4 = 2 */
typedef struct {
  dsa_plan_view view;
  int32_t starts[5], causal[5];
  uint8_t valid[5];
  uint16_t *q, *k;
  float wf[10];
  uint16_t wb[10];
  int32_t indices[5 * 4];
  int32_t lengths[5];
  dsa_indexer_params p;
} idx_case;

static void idx_case_init(idx_case *c, int32_t K, int bf16_weights) {
  const int D = DSA_INDEX_HEAD_DIM, H = 2;
  memset(c, 0, sizeof *c);
  const int32_t st[5] = {0, 0, 0, 0, 3}, cl[5] = {1, 2, 3, 0, 2};
  memcpy(c->starts, st, sizeof st);
  memcpy(c->causal, cl, sizeof cl);
  for (int i = 0; i < 5; ++i) c->valid[i] = cl[i] > 0;
  c->view.num_queries = 5;
  c->view.total_key_tokens = 5;
  c->view.starts = c->starts;
  c->view.causal_lengths = c->causal;
  c->view.query_valid = c->valid;
  tc_view_complete(&c->view); /* the segment fields of contract section 5 */
  c->q = ref_alloc(sizeof(uint16_t) * 5 * H * D);
  c->k = ref_alloc(sizeof(uint16_t) * 5 * D);
  memset(c->q, 0, sizeof(uint16_t) * 5 * H * D);
  memset(c->k, 0, sizeof(uint16_t) * 5 * D);
  const double kk[5][2] = {{1, 0}, {0, 1}, {1, 1}, {1, 0}, {0, 1}};
  for (int s = 0; s < 5; ++s)
    for (int d = 0; d < 2; ++d) c->k[s * D + d] = B(kk[s][d]);
  const double qq[5][2][2] = {{{1, 1}, {1, 1}},  {{1, -1}, {-1, 2}}, {{2, 0}, {0, 1}},
                              {{5, 5}, {5, 5}},  {{-1, 0}, {0, 1}}};
  const double ww[5][2] = {{1, 1}, {1, 0.5}, {0.5, 3}, {1, 1}, {1, 2}};
  for (int t = 0; t < 5; ++t)
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < 2; ++d) c->q[(t * H + h) * D + d] = B(qq[t][h][d]);
      c->wf[t * H + h] = (float)ww[t][h];
      c->wb[t * H + h] = B(ww[t][h]);
    }
  for (int i = 0; i < 20; ++i) c->indices[i] = TC_POISON_I32;
  for (int i = 0; i < 5; ++i) c->lengths[i] = TC_POISON_I32;
  c->p.plan = &c->view;
  c->p.num_heads = H;
  c->p.topk = K;
  c->p.index_q = c->q;
  c->p.index_k = c->k;
  c->p.weights = bf16_weights ? (const void *)c->wb : (const void *)c->wf;
  c->p.weights_dtype = bf16_weights ? DSA_DTYPE_BF16 : DSA_DTYPE_F32;
  c->p.indices = c->indices;
  c->p.lengths = c->lengths;
}
static void idx_case_free(idx_case *c) {
  free(c->q);
  free(c->k);
}

Test(reference_indexer, hand_scores_relu_and_ties) {
  for (int wb = 0; wb < 2; ++wb) {
    idx_case c;
    idx_case_init(&c, 1, wb);
    double sc[3] = {-7, -7, -7};
    TC_OK(dsa_ref_indexer_scores(&c.p, 1, sc));
    cr_assert_eq(sc[0], 1.0);
    cr_assert_eq(sc[1], 1.0);
    cr_assert_eq(sc[2], -7.0); /* beyond the causal length: untouched */
    TC_OK(dsa_ref_indexer_scores(&c.p, 2, sc));
    cr_assert_eq(sc[0], 1.0);
    cr_assert_eq(sc[1], 3.0);
    cr_assert_eq(sc[2], 4.0);
    TC_OK(dsa_ref_indexer_scores(&c.p, 4, sc));
    cr_assert_eq(sc[0], 0.0);
    cr_assert_eq(sc[1], 2.0);
    sc[0] = -7;
    TC_OK(dsa_ref_indexer_scores(&c.p, 3, sc)); /* invalid query: writes nothing */
    cr_assert_eq(sc[0], -7.0);
    idx_case_free(&c);
  }
}

Test(reference_indexer, topk_hand_case) {
  idx_case c;
  idx_case_init(&c, 1, 0);
  TC_OK(dsa_ref_indexer_topk(&c.p));
  const int32_t want1[5] = {0, 0, 2, -1, 4};
  const int32_t len1[5] = {1, 1, 1, 0, 1};
  for (int t = 0; t < 5; ++t) {
    cr_assert_eq(c.indices[t], want1[t], "K=1 row %d: %d", t, c.indices[t]);
    cr_assert_eq(c.lengths[t], len1[t]);
  }
  idx_case_free(&c);

  idx_case_init(&c, 2, 0);
  c.p.indices_stride = 4; /* padding columns stay poisoned */
  TC_OK(dsa_ref_indexer_topk(&c.p));
  const int32_t want2[5][2] = {{0, -1}, {0, 1}, {1, 2}, {-1, -1}, {3, 4}};
  const int32_t len2[5] = {1, 2, 2, 0, 2};
  for (int t = 0; t < 5; ++t) {
    for (int j = 0; j < 2; ++j) cr_assert_eq(c.indices[t * 4 + j], want2[t][j], "K=2 row %d", t);
    for (int j = 2; j < 4; ++j) cr_assert_eq(c.indices[t * 4 + j], TC_POISON_I32);
    cr_assert_eq(c.lengths[t], len2[t]);
  }
  idx_case_free(&c);
}

Test(reference_indexer, select_all_does_not_score) {
  idx_case c;
  idx_case_init(&c, 3, 0);
  c.wf[2 * 2 + 0] = NAN; /* row 2 would score NaN everywhere; with n <= K it is never scored */
  c.wf[2 * 2 + 1] = NAN;
  TC_OK(dsa_ref_indexer_topk(&c.p));
  const int32_t want[5][3] = {{0, -1, -1}, {0, 1, -1}, {0, 1, 2}, {-1, -1, -1}, {3, 4, -1}};
  const int32_t len[5] = {1, 2, 3, 0, 2};
  for (int t = 0; t < 5; ++t) {
    for (int j = 0; j < 3; ++j) cr_assert_eq(c.indices[t * 3 + j], want[t][j], "row %d", t);
    cr_assert_eq(c.lengths[t], len[t]);
  }
  /* K = 2 makes row 2 score: all NaN, so the smallest keys win */
  idx_case_free(&c);
  idx_case_init(&c, 2, 0);
  c.wf[2 * 2 + 0] = NAN;
  TC_OK(dsa_ref_indexer_topk(&c.p));
  cr_assert_eq(c.indices[2 * 2 + 0], 0);
  cr_assert_eq(c.indices[2 * 2 + 1], 1);
  idx_case_free(&c);
}

Test(reference_indexer, bf16_weights_are_converted_exactly) {
  idx_case c;
  idx_case_init(&c, 1, 1);
  /* bf16 weight 1 + 2^-7 on head 1 of row 1 breaks the tie toward key 1 */
  c.wb[1 * 2 + 1] = B(0.5 * (1.0 + 1.0 / 128));
  double sc[2];
  TC_OK(dsa_ref_indexer_scores(&c.p, 1, sc));
  cr_assert_eq(sc[0], 1.0);
  cr_assert_eq(sc[1], 2.0 * 0.5 * (1.0 + 1.0 / 128));
  TC_OK(dsa_ref_indexer_topk(&c.p));
  cr_assert_eq(c.indices[1], 1);
  idx_case_free(&c);
  /* fp32 weight 0.5 * (1 + 2^-9) is not a bf16 value: used as given */
  idx_case_init(&c, 1, 0);
  c.wf[1 * 2 + 1] = 0.5f * (1.0f + 1.0f / 512);
  TC_OK(dsa_ref_indexer_scores(&c.p, 1, sc));
  cr_assert_eq(sc[1], 2.0 * (double)(0.5f * (1.0f + 1.0f / 512)));
  TC_OK(dsa_ref_indexer_topk(&c.p));
  cr_assert_eq(c.indices[1], 1);
  idx_case_free(&c);
}

/* =============================================================================================
 * attention forward
 * =========================================================================================== */
typedef struct {
  int64_t T, Tkv;
  int32_t H, D, K;
  uint16_t *q, *kv, *out;
  int32_t *idx, *len;
  float *lse, *mx, *sink;
  dsa_attn_fwd_params p;
} attn_case;

static void attn_init(attn_case *c, int64_t T, int32_t H, int32_t D, int64_t Tkv, int32_t K,
                      float scale) {
  memset(c, 0, sizeof *c);
  c->T = T;
  c->H = H;
  c->D = D;
  c->Tkv = Tkv;
  c->K = K;
  c->q = ref_alloc(sizeof(uint16_t) * T * H * D);
  c->kv = ref_alloc(sizeof(uint16_t) * Tkv * D);
  c->out = ref_alloc(sizeof(uint16_t) * T * H * 512);
  c->idx = ref_alloc(sizeof(int32_t) * T * K);
  c->len = ref_alloc(sizeof(int32_t) * T);
  c->lse = ref_alloc(sizeof(float) * T * H);
  c->mx = ref_alloc(sizeof(float) * T * H);
  c->sink = ref_alloc(sizeof(float) * H);
  memset(c->q, 0, sizeof(uint16_t) * T * H * D);
  memset(c->kv, 0, sizeof(uint16_t) * Tkv * D);
  for (int32_t h = 0; h < H; ++h) c->sink[h] = -INFINITY;
  c->p.num_tokens = T;
  c->p.num_heads = H;
  c->p.head_dim = D;
  c->p.num_kv = Tkv;
  c->p.topk = K;
  c->p.softmax_scale = scale;
  c->p.q = c->q;
  c->p.kv = c->kv;
  c->p.indices = c->idx;
  c->p.out = c->out;
  c->p.lse = c->lse;
  c->p.max_logits = c->mx;
}
static void attn_free(attn_case *c) {
  free(c->q);
  free(c->kv);
  free(c->out);
  free(c->idx);
  free(c->len);
  free(c->lse);
  free(c->mx);
  free(c->sink);
}
static void attn_run(attn_case *c) {
  for (int64_t i = 0; i < c->T * c->H * 512; ++i) c->out[i] = TC_POISON_BF16;
  tc_poison_f32(c->lse, (size_t)(c->T * c->H));
  tc_poison_f32(c->mx, (size_t)(c->T * c->H));
  TC_OK(dsa_ref_sparse_attn_fwd(&c->p));
}

/* The two-slot hand case: q[0] = 1; kv0 = (1, 2, 3, ...), kv1 = (2, 4, -1); scale 1 gives
 * s = (1, 2). Weights w_i = m_i e^{s_i} / sum (m = multiplicity). */
static void two_slot_kv(attn_case *c) {
  c->q[0] = B(1);
  c->kv[0] = B(1);
  c->kv[1] = B(2);
  c->kv[2] = B(3);
  c->kv[c->D + 0] = B(2);
  c->kv[c->D + 1] = B(4);
  c->kv[c->D + 2] = B(-1);
  /* the rope tail (dims 512..575) takes part in the score only */
  if (c->D == 576) {
    c->q[540] = B(0.5);
    c->kv[540] = B(0);
    c->kv[c->D + 540] = B(0);
  }
}
static void expect_two_slot(const attn_case *c, int64_t row, double m0, double m1, double sink) {
  const double e0 = m0 * exp(1.0), e1 = m1 * exp(2.0), Z = e0 + e1;
  const double lse = log(Z), f = 1.0 / (1.0 + exp(sink - lse));
  const double v0[3] = {1, 2, 3}, v1[3] = {2, 4, -1};
  const uint16_t *o = c->out + row * c->H * 512;
  for (int d = 0; d < 3; ++d) {
    const double want = (e0 * v0[d] + e1 * v1[d]) / Z * f;
    cr_assert_eq(o[d], dsa_ref_double_to_bf16(want), "dim %d: got %g want %.9g", d, F(o[d]), want);
  }
  for (int d = 3; d < 512; ++d) cr_assert_eq(o[d], 0, "dim %d not zero", d);
  cr_assert_float_eq(c->lse[row * c->H], (float)lse, 1e-6);
  cr_assert_float_eq(c->mx[row * c->H], m1 > 0 ? 2.0f : 1.0f, 1e-7);
}

Test(reference_attn_fwd, two_slots_by_hand_d576_and_d512) {
  const int32_t dims[2] = {576, 512};
  for (int i = 0; i < 2; ++i) {
    attn_case c;
    attn_init(&c, 1, 1, dims[i], 3, 2, 1.0f);
    two_slot_kv(&c);
    c.idx[0] = 0;
    c.idx[1] = 1;
    attn_run(&c);
    expect_two_slot(&c, 0, 1, 1, -INFINITY);
    /* the slot order does not matter */
    c.idx[0] = 1;
    c.idx[1] = 0;
    attn_run(&c);
    expect_two_slot(&c, 0, 1, 1, -INFINITY);
    attn_free(&c);
  }
}

Test(reference_attn_fwd, scale_is_applied) {
  attn_case c;
  attn_init(&c, 1, 1, 576, 2, 2, 0.5f);
  two_slot_kv(&c);
  c.q[0] = B(2); /* scale 0.5 * q 2 = the scale-1 case */
  c.idx[0] = 0;
  c.idx[1] = 1;
  attn_run(&c);
  expect_two_slot(&c, 0, 1, 1, -INFINITY);
  attn_free(&c);
}

Test(reference_attn_fwd, duplicates_count_twice) {
  attn_case c;
  attn_init(&c, 1, 1, 576, 3, 3, 1.0f);
  two_slot_kv(&c);
  c.idx[0] = 1;
  c.idx[1] = 0;
  c.idx[2] = 1;
  attn_run(&c);
  expect_two_slot(&c, 0, 1, 2, -INFINITY);
  attn_free(&c);
}

/* K above the selectors' 2048 (DSA_MAX_ATTN_TOPK = 4096): a row of 4096 slots whose second half
 * repeats its first half is the same softmax with every term twice: out and max_logits equal the
 * 2048-slot row's, lse is larger by ln 2. */
Test(reference_attn_fwd, topk_4096_is_two_copies_of_2048) {
  enum { T = 2, H = 3, D = 576, NKV = 5003, K = 2048 };
  tc_rng r = tc_seed("reference_attn_fwd/topk_4096");
  attn_case a, b;
  attn_init(&a, T, H, D, NKV, K, 0.04f);
  attn_init(&b, T, H, D, NKV, 2 * K, 0.04f);
  tc_fill_bf16(&r, a.q, (size_t)T * H * D, -1, 1);
  tc_fill_bf16(&r, a.kv, (size_t)NKV * D, -1, 1);
  memcpy(b.q, a.q, sizeof(uint16_t) * T * H * D);
  memcpy(b.kv, a.kv, sizeof(uint16_t) * NKV * D);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      a.idx[t * K + j] = (int32_t)tc_below(&r, NKV);
      b.idx[t * 2 * K + j] = b.idx[t * 2 * K + K + j] = a.idx[t * K + j];
    }
  attn_run(&a);
  attn_run(&b);
  for (int64_t i = 0; i < (int64_t)T * H * 512; ++i)
    cr_assert(fabs(F(a.out[i]) - F(b.out[i])) <= 1e-2 * fabs(F(a.out[i])) + 1e-6, "out[%lld]: %g vs %g",
              (long long)i, F(a.out[i]), F(b.out[i]));
  for (int64_t i = 0; i < (int64_t)T * H; ++i) {
    cr_assert_float_eq(b.lse[i], a.lse[i] + (float)log(2.0), 1e-5, "lse[%lld]", (long long)i);
    cr_assert_eq(b.mx[i], a.mx[i]);
  }
  attn_free(&a);
  attn_free(&b);
}

Test(reference_attn_fwd, invalid_slots_are_skipped) {
  attn_case c;
  attn_init(&c, 1, 1, 576, 3, 7, 1.0f);
  two_slot_kv(&c);
  const int32_t ix[7] = {-1, 0, 3, INT_MIN, 1, INT_MAX, -7};
  memcpy(c.idx, ix, sizeof ix);
  attn_run(&c);
  expect_two_slot(&c, 0, 1, 1, -INFINITY);
  attn_free(&c);
}

Test(reference_attn_fwd, topk_length_limits_and_clamps) {
  attn_case c;
  attn_init(&c, 5, 1, 576, 3, 2, 1.0f);
  for (int t = 0; t < 5; ++t) {
    c.q[t * 576] = B(1);
    c.idx[t * 2 + 0] = 0;
    c.idx[t * 2 + 1] = 1;
  }
  two_slot_kv(&c);
  const int32_t len[5] = {2, 1, 0, 9, -3};
  memcpy(c.len, len, sizeof len);
  c.p.topk_length = c.len;
  attn_run(&c);
  expect_two_slot(&c, 0, 1, 1, -INFINITY); /* K */
  expect_two_slot(&c, 1, 1, 0, -INFINITY); /* slot 0 only */
  expect_two_slot(&c, 3, 1, 1, -INFINITY); /* 9 clamped to K */
  for (int t = 2; t < 5; t += 2) {         /* 0 and -3: empty rows */
    for (int d = 0; d < 512; ++d) cr_assert_eq(c.out[t * 512 + d], 0);
    cr_assert(isinf(c.lse[t]) && c.lse[t] > 0);
    cr_assert(isinf(c.mx[t]) && c.mx[t] < 0);
  }
  attn_free(&c);
}

Test(reference_attn_fwd, empty_rows_and_no_kv) {
  attn_case c;
  attn_init(&c, 2, 3, 576, 3, 2, 1.0f);
  c.idx[0] = -1;
  c.idx[1] = 3;
  c.idx[2] = 0;
  c.idx[3] = -1;
  for (int i = 0; i < 2 * 3 * 576; ++i) c.q[i] = B(0.25);
  attn_run(&c);
  for (int h = 0; h < 3; ++h) {
    for (int d = 0; d < 512; ++d) cr_assert_eq(c.out[h * 512 + d], 0);
    cr_assert(isinf(c.lse[h]) && c.lse[h] > 0);
    cr_assert(isinf(c.mx[h]) && c.mx[h] < 0);
    /* row 1: one slot of an all-zero kv row: s = 0, lse = 0, out = 0 */
    cr_assert_eq(c.lse[3 + h], 0.0f);
    cr_assert_eq(c.mx[3 + h], 0.0f);
  }
  /* num_kv = 0: kv may be NULL, every row is empty; max_logits optional */
  c.p.num_kv = 0;
  c.p.kv = NULL;
  c.p.max_logits = NULL;
  tc_poison_f32(c.mx, 6);
  attn_run(&c);
  for (int i = 0; i < 6; ++i) {
    cr_assert(isinf(c.lse[i]) && c.lse[i] > 0);
    cr_assert(isnan(c.mx[i])); /* untouched */
  }
  attn_free(&c);
}

Test(reference_attn_fwd, sink_factor) {
  attn_case c;
  attn_init(&c, 1, 4, 576, 3, 2, 1.0f);
  two_slot_kv(&c);
  for (int h = 1; h < 4; ++h) c.q[h * 576] = B(1), c.q[h * 576 + 540] = B(0.5);
  c.idx[0] = 0;
  c.idx[1] = 1;
  const double lse = log(exp(1.0) + exp(2.0));
  c.sink[0] = -INFINITY;
  c.sink[1] = INFINITY;
  c.sink[2] = (float)lse;
  c.sink[3] = -1.5f;
  c.p.sink = c.sink;
  attn_run(&c);
  for (int h = 0; h < 4; ++h) {
    const double f = 1.0 / (1.0 + exp((double)c.sink[h] - lse));
    const double v0[3] = {1, 2, 3}, v1[3] = {2, 4, -1};
    for (int d = 0; d < 3; ++d) {
      const double want = (exp(1.0) * v0[d] + exp(2.0) * v1[d]) / exp(lse) * f;
      cr_assert_eq(c.out[h * 512 + d], dsa_ref_double_to_bf16(want), "head %d dim %d", h, d);
    }
    cr_assert_float_eq(c.lse[h], (float)lse, 1e-6, "lse excludes the sink");
  }
  cr_assert_eq(c.out[512 + 0], 0); /* +inf sink: out = 0 */
  attn_free(&c);
}

/* Fills a random case: q/kv in [-1, 1], indices in [-2, Tkv + 1] (some invalid, some repeated). */
static void attn_random(attn_case *c, tc_rng *rng) {
  tc_fill_bf16(rng, c->q, (size_t)(c->T * c->H * c->D), -1, 1);
  tc_fill_bf16(rng, c->kv, (size_t)(c->Tkv * c->D), -1, 1);
  for (int64_t i = 0; i < c->T * c->K; ++i) c->idx[i] = (int32_t)tc_below(rng, c->Tkv + 4) - 2;
  for (int32_t h = 0; h < c->H; ++h) c->sink[h] = (float)tc_range(rng, -2, 2);
}

Test(reference_attn_fwd, strided_layouts_match_contiguous) {
  tc_rng rng = tc_seed("reference_attn_fwd.strided");
  const int64_t T = 5, Tkv = 11;
  const int32_t H = 3, D = 576, K = 6;
  attn_case c;
  attn_init(&c, T, H, D, Tkv, K, 0.07f);
  attn_random(&c, &rng);
  c.p.sink = c.sink;
  attn_run(&c);
  /* token-inner ("head-major") q, padded kv rows, padded out rows, padded index rows */
  const int64_t qsh = T * 584, qst = 584, kvs = 640, ost = H * 520 + 8, osh = 520, is = K + 3;
  uint16_t *q2 = ref_alloc(sizeof(uint16_t) * H * qsh);
  uint16_t *kv2 = ref_alloc(sizeof(uint16_t) * Tkv * kvs);
  uint16_t *o2 = ref_alloc(sizeof(uint16_t) * T * ost);
  int32_t *i2 = ref_alloc(sizeof(int32_t) * T * is);
  float *lse2 = ref_alloc(sizeof(float) * T * H), *mx2 = ref_alloc(sizeof(float) * T * H);
  for (int64_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < H; ++h)
      memcpy(q2 + t * qst + h * qsh, c.q + (t * H + h) * D, sizeof(uint16_t) * D);
  for (int64_t r = 0; r < Tkv; ++r) memcpy(kv2 + r * kvs, c.kv + r * D, sizeof(uint16_t) * D);
  for (int64_t t = 0; t < T; ++t) memcpy(i2 + t * is, c.idx + t * K, sizeof(int32_t) * K);
  for (int64_t i = 0; i < T * ost; ++i) o2[i] = TC_POISON_BF16;
  dsa_attn_fwd_params p = c.p;
  p.q = q2;
  p.q_stride_token = qst;
  p.q_stride_head = qsh;
  p.kv = kv2;
  p.kv_stride = kvs;
  p.indices = i2;
  p.indices_stride = is;
  p.out = o2;
  p.out_stride_token = ost;
  p.out_stride_head = osh;
  p.lse = lse2;
  p.max_logits = mx2;
  TC_OK(dsa_ref_sparse_attn_fwd(&p));
  for (int64_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < H; ++h) {
      cr_assert_eq(memcmp(o2 + t * ost + h * osh, c.out + (t * H + h) * 512, 1024), 0);
      cr_assert_eq(lse2[t * H + h], c.lse[t * H + h]);
      cr_assert_eq(mx2[t * H + h], c.mx[t * H + h]);
      for (int64_t d = 512; d < osh && h + 1 < H; ++d)
        cr_assert_eq(o2[t * ost + h * osh + d], TC_POISON_BF16, "gap written");
    }
  free(q2);
  free(kv2);
  free(o2);
  free(i2);
  free(lse2);
  free(mx2);
  attn_free(&c);
}

Test(reference_attn_fwd, bf16_output_is_the_rounded_double_forward) {
  tc_rng rng = tc_seed("reference_attn_fwd.f64");
  attn_case c;
  attn_init(&c, 4, 2, 576, 9, 5, 0.1f);
  attn_random(&c, &rng);
  c.p.sink = c.sink;
  attn_run(&c);
  double *qd = malloc(sizeof(double) * 4 * 2 * 576), *kvd = malloc(sizeof(double) * 9 * 576);
  double *od = malloc(sizeof(double) * 4 * 2 * 512), *ld = malloc(sizeof(double) * 8);
  for (int i = 0; i < 4 * 2 * 576; ++i) qd[i] = F(c.q[i]);
  for (int i = 0; i < 9 * 576; ++i) kvd[i] = F(c.kv[i]);
  TC_OK(dsa_ref_attn_fwd_f64(&c.p, qd, kvd, NULL, od, ld, NULL));
  for (int i = 0; i < 4 * 2 * 512; ++i) cr_assert_eq(c.out[i], dsa_ref_double_to_bf16(od[i]));
  for (int i = 0; i < 8; ++i) cr_assert_eq(c.lse[i], (float)ld[i]);
  free(qd);
  free(kvd);
  free(od);
  free(ld);
  attn_free(&c);
}

Test(reference_attn_fwd, double_to_bf16_rounds_once) {
  /* 1 + 2^-8 + 2^-40 is above the bf16 tie 1 + 2^-8, but rounds to it in float */
  cr_assert_eq(dsa_ref_double_to_bf16(1.0 + 1.0 / 256 + ldexp(1.0, -40)), 0x3F81);
  cr_assert_eq(dsa_ref_double_to_bf16(-(1.0 + 1.0 / 256 + ldexp(1.0, -40))), 0xBF81);
  cr_assert_eq(dsa_ref_double_to_bf16(1.0 + 1.0 / 256), 0x3F80); /* exact tie: even */
  cr_assert_eq(dsa_ref_double_to_bf16(1.0 + 1.0 / 256 - ldexp(1.0, -40)), 0x3F80);
  cr_assert_eq(dsa_ref_double_to_bf16(0.0), 0);
  cr_assert_eq(dsa_ref_double_to_bf16(INFINITY), 0x7F80);
  cr_assert(isnan(F(dsa_ref_double_to_bf16(NAN))));
}

/* =============================================================================================
 * attention backward
 * =========================================================================================== */
typedef struct {
  uint16_t *dout, *dq, *dkv;
  float *dsink;
  dsa_attn_bwd_params p;
} bwd_bufs;

static void bwd_init(bwd_bufs *b, const attn_case *c) {
  memset(b, 0, sizeof *b);
  b->dout = ref_alloc(sizeof(uint16_t) * c->T * c->H * 512);
  b->dq = ref_alloc(sizeof(uint16_t) * c->T * c->H * c->D);
  b->dkv = ref_alloc(sizeof(uint16_t) * c->Tkv * c->D);
  b->dsink = ref_alloc(sizeof(float) * c->H);
  dsa_attn_bwd_params *p = &b->p;
  p->num_tokens = c->T;
  p->num_heads = c->H;
  p->head_dim = c->D;
  p->num_kv = c->Tkv;
  p->topk = c->K;
  p->softmax_scale = c->p.softmax_scale;
  p->q = c->q;
  p->kv = c->kv;
  p->indices = c->idx;
  p->topk_length = c->p.topk_length;
  p->sink = c->p.sink;
  p->out = c->out;
  p->dout = b->dout;
  p->lse = c->lse;
  p->dq = b->dq;
  p->dkv = b->dkv;
  p->dsink = b->dsink;
}
static void bwd_run(bwd_bufs *b, const attn_case *c) {
  for (int64_t i = 0; i < c->T * c->H * c->D; ++i) b->dq[i] = TC_POISON_BF16;
  for (int64_t i = 0; i < c->Tkv * c->D; ++i) b->dkv[i] = TC_POISON_BF16;
  tc_poison_f32(b->dsink, (size_t)c->H);
  TC_OK(dsa_ref_sparse_attn_bwd(&b->p));
}
static void bwd_free(bwd_bufs *b) {
  free(b->dout);
  free(b->dq);
  free(b->dkv);
  free(b->dsink);
}

/* loss = sum out * G with the double forward */
static double fd_loss(const attn_case *c, const double *qd, const double *kvd, const double *sd,
                      const double *G, double *od) {
  cr_assert_eq(dsa_ref_attn_fwd_f64(&c->p, qd, kvd, sd, od, NULL, NULL), DSA_SUCCESS);
  double l = 0;
  for (int64_t i = 0; i < c->T * c->H * 512; ++i) l += od[i] * G[i];
  return l;
}

/* ||got - want|| / ||want|| < 2e-2 and the largest element error < 2e-2 of max |want|. Not 1e-2 on
 * the norm: the backward (like the GPU's) takes Delta = rowsum(out * dout) from the bf16-rounded out
 * while the finite difference differentiates the exact forward, and dS = P (dP - Delta) cancels, so
 * with 5 keys per row some seeds land at 1.0-1.3e-2 (seen once in ~150 runs: seed 1883216939764130,
 * dq 0.012, worst element 0.5% of the max). */
static void expect_close(const char *what, const double *got, const double *want, int n) {
  double num = 0, den = 0, worst = 0, big = 0;
  for (int i = 0; i < n; ++i) {
    cr_assert(!isnan(got[i]), "%s[%d] is NaN", what, i);
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
    if (fabs(want[i]) > big) big = fabs(want[i]);
    if (fabs(got[i] - want[i]) > worst) worst = fabs(got[i] - want[i]);
  }
  cr_log_info("%s: rel err %.3g, worst %.3g of max %.3g", what, sqrt(num / den), worst, big);
  cr_assert(den > 0, "%s: gradient is all zero", what);
  cr_assert_lt(sqrt(num / den), 2e-2, "%s: relative error %g", what, sqrt(num / den));
  cr_assert_lt(worst, 2e-2 * big, "%s: worst element error %g of %g", what, worst, big);
}

static void finite_difference_case(int with_length, int32_t D) {
  tc_rng rng = tc_seed("reference_attn_bwd.finite_difference");
  const int64_t T = 3, Tkv = 5;
  const int32_t H = 2, K = 5;
  attn_case c;
  attn_init(&c, T, H, D, Tkv, K, 0.15f);
  attn_random(&c, &rng);
  /* row 0: a duplicate and an invalid slot; row 1: all valid; row 2: empty */
  const int32_t ix[15] = {1, 3, 1, -1, 4, 0, 1, 2, 3, 4, -1, 5, -1, 7, -3};
  memcpy(c.idx, ix, sizeof ix);
  c.len[0] = 5;
  c.len[1] = 4; /* slot 4 (key 4) excluded by the length */
  c.len[2] = 5;
  if (with_length) c.p.topk_length = c.len;
  c.sink[0] = 0.3f;
  c.sink[1] = -INFINITY;
  c.p.sink = c.sink;
  attn_run(&c);
  bwd_bufs b;
  bwd_init(&b, &c);
  tc_fill_bf16(&rng, b.dout, (size_t)(T * H * 512), -1, 1);
  bwd_run(&b, &c);

  const int nq = (int)(T * H * D), nkv = (int)(Tkv * D), no = (int)(T * H * 512);
  double *qd = malloc(sizeof(double) * nq), *kvd = malloc(sizeof(double) * nkv);
  double *G = malloc(sizeof(double) * no), *od = malloc(sizeof(double) * no);
  double sd[2] = {c.sink[0], c.sink[1]};
  for (int i = 0; i < nq; ++i) qd[i] = F(c.q[i]);
  for (int i = 0; i < nkv; ++i) kvd[i] = F(c.kv[i]);
  for (int i = 0; i < no; ++i) G[i] = F(b.dout[i]);
  const double eps = 1e-3;
  /* a random sample of q and kv entries (all of them would be slow), every sink */
  enum { NS = 240 };
  double got[NS], want[NS];
  for (int s = 0; s < NS; ++s) {
    int i = (int)tc_below(&rng, nq);
    if (s < 8) i = (int)((4 + s % 2) * D + tc_below(&rng, D)); /* row 2 (empty): dq must be 0 */
    const double keep = qd[i];
    qd[i] = keep + eps;
    const double lp = fd_loss(&c, qd, kvd, sd, G, od);
    qd[i] = keep - eps;
    const double lm = fd_loss(&c, qd, kvd, sd, G, od);
    qd[i] = keep;
    want[s] = (lp - lm) / (2 * eps);
    got[s] = F(b.dq[i]);
    if (s < 8) cr_assert_eq(b.dq[i], 0, "empty row dq");
  }
  expect_close("dq", got, want, NS);
  for (int s = 0; s < NS; ++s) {
    const int i = (int)tc_below(&rng, nkv);
    const double keep = kvd[i];
    kvd[i] = keep + eps;
    const double lp = fd_loss(&c, qd, kvd, sd, G, od);
    kvd[i] = keep - eps;
    const double lm = fd_loss(&c, qd, kvd, sd, G, od);
    kvd[i] = keep;
    want[s] = (lp - lm) / (2 * eps);
    got[s] = F(b.dkv[i]);
  }
  expect_close("dkv", got, want, NS);
  /* every dkv row is written, and a row no valid slot reads is 0 */
  for (int i = 0; i < nkv; ++i) cr_assert_neq(b.dkv[i], TC_POISON_BF16, "dkv[%d] unwritten", i);
  {
    const double keep = sd[0];
    sd[0] = keep + eps;
    const double lp = fd_loss(&c, qd, kvd, sd, G, od);
    sd[0] = keep - eps;
    const double lm = fd_loss(&c, qd, kvd, sd, G, od);
    sd[0] = keep;
    const double ws = (lp - lm) / (2 * eps);
    cr_log_info("dsink[0] = %.6g, finite difference %.6g", (double)b.dsink[0], ws);
    /* the backward's Delta uses the bf16-rounded out (as the GPU does), the finite difference
     * the exact one: allow that rounding (half a bf16 ulp, doubled) on every term */
    double bound = 1e-3 * fabs(ws) + 1e-6;
    for (int64_t t = 0; t < T; ++t) {
      const double lse = c.lse[t * H], sk = c.sink[0];
      if (isinf(lse)) continue;
      const double Lp = (lse > sk ? lse : sk) + log1p(exp(-fabs(lse - sk)));
      double a = 0;
      for (int d = 0; d < 512; ++d) a += fabs(F(c.out[t * H * 512 + d]) * G[t * H * 512 + d]);
      bound += exp(sk - Lp) * a / 256;
    }
    cr_assert(fabs(b.dsink[0] - ws) <= bound, "dsink %g vs %g (bound %g)", b.dsink[0], ws, bound);
  }
  cr_assert_eq(b.dsink[1], 0.0f, "-inf sink has no gradient");
  free(qd);
  free(kvd);
  free(G);
  free(od);
  bwd_free(&b);
  attn_free(&c);
}

Test(reference_attn_bwd, finite_differences_d576) { finite_difference_case(0, 576); }
Test(reference_attn_bwd, finite_differences_d576_topk_length) { finite_difference_case(1, 576); }
Test(reference_attn_bwd, finite_differences_d512) { finite_difference_case(0, 512); }

/* All slots on one kv row: out = kv[0, :512] exactly, dP = Delta, so dS = 0 and dq = 0, while
 * dkv[0, :512] = sum over rows of dout (the P of a row's duplicates add up to 1). */
Test(reference_attn_bwd, duplicates_accumulate_by_hand) {
  tc_rng rng = tc_seed("reference_attn_bwd.duplicates");
  attn_case c;
  attn_init(&c, 2, 1, 576, 3, 3, 0.2f);
  tc_fill_bf16(&rng, c.q, 2 * 576, -1, 1);
  tc_fill_bf16(&rng, c.kv, 3 * 576, -1, 1);
  const int32_t ix[6] = {0, 0, 0, 0, -1, 0};
  memcpy(c.idx, ix, sizeof ix);
  attn_run(&c);
  for (int d = 0; d < 512; ++d) cr_assert_eq(c.out[d], c.kv[d]);
  bwd_bufs b;
  bwd_init(&b, &c);
  /* dout values on a coarse grid so dout0 + dout1 is exact in bf16 */
  for (int i = 0; i < 2 * 512; ++i) b.dout[i] = B((double)(tc_below(&rng, 17) - 8) / 8);
  bwd_run(&b, &c);
  for (int i = 0; i < 2 * 576; ++i) cr_assert_eq(F(b.dq[i]), 0.0, "dq[%d] = %g", i, F(b.dq[i]));
  /* each row's P add up to 1 only within the fp32 lse, so allow a rounding's worth */
  for (int d = 0; d < 512; ++d) {
    const double want = F(b.dout[d]) + F(b.dout[512 + d]);
    cr_assert_leq(fabs(F(b.dkv[d]) - want), 1e-6 + fabs(want) / 256, "dkv[0][%d] = %g, want %g", d,
                  F(b.dkv[d]), want);
  }
  for (int d = 512; d < 576; ++d) cr_assert_eq(F(b.dkv[d]), 0.0);
  for (int i = 576; i < 3 * 576; ++i) cr_assert_eq(b.dkv[i], 0, "unreferenced dkv row not zero");
  cr_assert_eq(b.dsink[0], 0.0f, "no sink: dsink = 0");
  bwd_free(&b);
  attn_free(&c);
}

/* dkv of two rows that share kv rows equals the sum of each row alone (within bf16). */
Test(reference_attn_bwd, dkv_adds_over_rows) {
  tc_rng rng = tc_seed("reference_attn_bwd.additivity");
  attn_case c;
  attn_init(&c, 2, 2, 576, 4, 4, 0.1f);
  attn_random(&c, &rng);
  const int32_t ix[8] = {2, 1, 2, 0, 1, 2, 2, 3};
  memcpy(c.idx, ix, sizeof ix);
  attn_run(&c);
  bwd_bufs b;
  bwd_init(&b, &c);
  tc_fill_bf16(&rng, b.dout, 2 * 2 * 512, -1, 1);
  bwd_run(&b, &c);
  uint16_t both[4 * 576];
  memcpy(both, b.dkv, sizeof both);
  double sum[4 * 576] = {0};
  for (int t = 0; t < 2; ++t) {
    dsa_attn_bwd_params p = b.p;
    p.num_tokens = 1;
    p.q = c.q + t * 2 * 576;
    p.indices = c.idx + t * 4;
    p.out = c.out + t * 2 * 512;
    p.dout = b.dout + t * 2 * 512;
    p.lse = c.lse + t * 2;
    p.dq = b.dq + t * 2 * 576;
    TC_OK(dsa_ref_sparse_attn_bwd(&p));
    for (int i = 0; i < 4 * 576; ++i) sum[i] += F(b.dkv[i]);
  }
  double num = 0, den = 0;
  for (int i = 0; i < 4 * 576; ++i) {
    num += (F(both[i]) - sum[i]) * (F(both[i]) - sum[i]);
    den += sum[i] * sum[i];
  }
  cr_assert_lt(sqrt(num / den), 1e-2);
  bwd_free(&b);
  attn_free(&c);
}

Test(reference_attn_bwd, empty_rows_and_inf_sink) {
  tc_rng rng = tc_seed("reference_attn_bwd.empty");
  attn_case c;
  attn_init(&c, 2, 2, 576, 3, 2, 0.1f);
  attn_random(&c, &rng);
  const int32_t ix[4] = {-1, 9, 0, 1};
  memcpy(c.idx, ix, sizeof ix);
  c.sink[0] = INFINITY; /* head 0: P = 0 everywhere */
  c.sink[1] = 0.5f;
  c.p.sink = c.sink;
  attn_run(&c);
  bwd_bufs b;
  bwd_init(&b, &c);
  tc_fill_bf16(&rng, b.dout, 2 * 2 * 512, -1, 1);
  bwd_run(&b, &c);
  for (int i = 0; i < 2 * 576; ++i) cr_assert_eq(b.dq[i], 0, "empty row 0: dq = 0");
  for (int d = 0; d < 576; ++d) cr_assert_eq(b.dq[2 * 576 + d], 0, "head 0 with +inf sink");
  int nonzero = 0;
  for (int d = 0; d < 576; ++d) nonzero += b.dq[3 * 576 + d] != 0;
  cr_assert_gt(nonzero, 0);
  for (int d = 0; d < 576; ++d) cr_assert_eq(b.dkv[2 * 576 + d], 0, "kv row 2 unreferenced");
  cr_assert_eq(b.dsink[0], 0.0f, "+inf sink: dsink = 0");
  cr_assert(b.dsink[1] != 0.0f && isfinite(b.dsink[1]));
  /* no sink and no dsink */
  c.p.sink = NULL;
  b.p.sink = NULL;
  b.p.dsink = NULL;
  attn_run(&c);
  bwd_run(&b, &c);
  cr_assert(isnan(b.dsink[0]), "dsink NULL: untouched");
  bwd_free(&b);
  attn_free(&c);
}
