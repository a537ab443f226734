/* test_compact.c - CPU suite for index compaction (docs/contract.md section 8, the section 6 unit-test
 * examples) and head padding (section 3): the references against hand-computed cases,
 * dsa_padded_head_count, and every argument check (for the references and for the public ops with
 * ctx NULL, since params are checked first). */
#include "test_common.h"

/* ---- compaction: section 8 by hand ---- */

static void check_rows(const int32_t *got, const int32_t *want, int rows, int k, int64_t stride,
                       const char *what) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < k; ++j)
      cr_assert_eq(got[r * stride + j], want[r * k + j], "%s: row %d slot %d: got %d want %d", what,
                   r, j, got[r * stride + j], want[r * k + j]);
}

Test(compact, section8_by_hand) {
  /* unsorted; -1 in the middle; out of range (10, 99, INT32_MIN); duplicates kept; all invalid */
  enum { R = 6, K = 5 };
  const int32_t in[R * K] = {
      4, 1, 3, 0, 2,               /* unsorted, all valid */
      7, -1, 2, -1, 5,             /* -1 in the middle */
      10, 3, 99, INT32_MIN, 9,     /* out of range (key_count 10) */
      6, 2, 6, 2, 6,               /* duplicates */
      -1, 10, -5, INT32_MAX, 11,   /* all invalid */
      9, 0, 9, -1, 0,              /* duplicates at both ends of the range */
  };
  const int32_t want[R * K] = {
      0, 1, 2, 3, 4,
      2, 5, 7, -1, -1,
      3, 9, -1, -1, -1,
      2, 2, 6, 6, 6,
      -1, -1, -1, -1, -1,
      0, 0, 9, 9, -1,
  };
  const int32_t want_len[R] = {5, 3, 2, 5, 0, 4};
  int32_t out[R * K], len[R];
  for (int i = 0; i < R * K; ++i) out[i] = TC_POISON_I32;
  for (int i = 0; i < R; ++i) len[i] = TC_POISON_I32;
  dsa_compact_params p = {.rows = R, .k = K, .key_count = 10, .indices = in, .out = out, .lengths = len};
  TC_OK(dsa_ref_compact_indices(&p));
  check_rows(out, want, R, K, K, "out");
  for (int r = 0; r < R; ++r) cr_assert_eq(len[r], want_len[r], "len[%d] = %d", r, len[r]);

  /* lengths NULL; in place with a padded stride: the pad columns are untouched */
  int32_t buf[R * 7];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 7; ++j) buf[r * 7 + j] = j < K ? in[r * K + j] : TC_POISON_I32;
  dsa_compact_params q = {.rows = R, .k = K, .key_count = 10, .indices = buf, .indices_stride = 7,
                          .out = buf, .out_stride = 7};
  TC_OK(dsa_ref_compact_indices(&q));
  check_rows(buf, want, R, K, 7, "in place");
  for (int r = 0; r < R; ++r)
    for (int j = K; j < 7; ++j) cr_assert_eq(buf[r * 7 + j], TC_POISON_I32);

  /* key_count = 0: everything is invalid */
  dsa_compact_params z = {.rows = R, .k = K, .key_count = 0, .indices = in, .out = out, .lengths = len};
  TC_OK(dsa_ref_compact_indices(&z));
  for (int i = 0; i < R * K; ++i) cr_assert_eq(out[i], -1);
  for (int r = 0; r < R; ++r) cr_assert_eq(len[r], 0);
}

/* Section 6 step 5: valid = query_valid & 0 <= local < causal_lengths -> global = local + starts. */
static void map_local(const int32_t *local, const int32_t *starts, const int32_t *causal_lengths,
                      const uint8_t *query_valid, int rows, int k, int32_t *global) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < k; ++j) {
      int32_t c = local[r * k + j];
      int ok = (query_valid == NULL || query_valid[r]) && c >= 0 && c < causal_lengths[r];
      global[r * k + j] = ok ? c + starts[r] : -1;
    }
}

Test(compact, section6_unit_test_layout_c) {
  enum { T = 5, K = 2 };
  const int32_t starts[T] = {0, 0, 2, 2, 2}, cl[T] = {1, 2, 1, 2, 3};
  const int32_t local[T * K] = {0, 2, 1, 0, 0, -1, 1, 0, 2, 0};
  const int32_t want[T * K] = {0, -1, 0, 1, 2, -1, 2, 3, 2, 4};
  int32_t global[T * K], out[T * K], len[T];
  map_local(local, starts, cl, NULL, T, K, global);
  for (int i = 0; i < T * K; ++i) out[i] = TC_POISON_I32;
  dsa_compact_params p = {.rows = T, .k = K, .key_count = 5, .indices = global, .out = out, .lengths = len};
  TC_OK(dsa_ref_compact_indices(&p));
  check_rows(out, want, T, K, K, "layout C");
  for (int r = 0; r < T; ++r) cr_assert_eq(len[r], r == 0 || r == 2 ? 1 : 2);
  for (int r = 0; r < T; ++r) cr_assert_eq(len[r], cl[r] < K ? cl[r] : K, "len = min(K, causal)");
}

Test(compact, section6_example_a) {
  enum { T = 8, K = 2 };
  const int32_t starts[T] = {0, 0, 4, 4, 4, 4, 4, 9}, cl[T] = {3, 0, 1, 2, 3, 4, 0, 1};
  const uint8_t qv[T] = {1, 0, 1, 1, 1, 1, 0, 1};
  const int32_t want[T * K] = {0, 1, -1, -1, 4, -1, 4, 5, 4, 5, 4, 5, -1, -1, 9, -1};
  int32_t local[T * K], global[T * K], out[T * K], len[T];
  for (int i = 0; i < T * K; ++i) local[i] = i % 2;
  map_local(local, starts, cl, qv, T, K, global);
  for (int i = 0; i < T * K; ++i) out[i] = TC_POISON_I32;
  dsa_compact_params p = {.rows = T, .k = K, .key_count = 12, .indices = global, .out = out, .lengths = len};
  TC_OK(dsa_ref_compact_indices(&p));
  check_rows(out, want, T, K, K, "example A");
  for (int r = 0; r < T; ++r) cr_assert_eq(len[r], cl[r] < K ? cl[r] : K);
}

/* ---- head padding by hand ---- */

Test(compact, pad_heads_by_hand) {
  enum { T = 3, H = 2, HP = 4, D = 8, QH = 16, QT = 40 }; /* strided q: head stride 16, token 40 */
  uint16_t q[T * QT] __attribute__((aligned(16))), out[T * HP * D] __attribute__((aligned(16)));
  float sink[H] = {0.5f, -2.0f}, sink_out[HP];
  for (int i = 0; i < T * QT; ++i) q[i] = (uint16_t)(0x1000 + i);
  for (int i = 0; i < T * HP * D; ++i) out[i] = TC_POISON_BF16;
  tc_poison_f32(sink_out, HP);
  dsa_pad_heads_params p = {.num_tokens = T, .num_heads = H, .padded_heads = HP, .head_dim = D,
                            .q = q, .q_stride_token = QT, .q_stride_head = QH, .q_out = out,
                            .sink = sink, .sink_out = sink_out};
  TC_OK(dsa_ref_pad_heads(&p));
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < HP; ++h)
      for (int d = 0; d < D; ++d) {
        uint16_t want = h < H ? (uint16_t)(0x1000 + t * QT + h * QH + d) : 0;
        cr_assert_eq(out[(t * HP + h) * D + d], want, "t %d h %d d %d", t, h, d);
      }
  cr_assert_eq(sink_out[0], 0.5f);
  cr_assert_eq(sink_out[1], -2.0f);
  cr_assert(isinf(sink_out[2]) && sink_out[2] < 0);
  cr_assert(isinf(sink_out[3]) && sink_out[3] < 0);

  /* sink NULL: all -inf; contiguous defaults; Hp == H copies */
  uint16_t qc[T * H * D] __attribute__((aligned(16))), outc[T * H * D] __attribute__((aligned(16)));
  for (int i = 0; i < T * H * D; ++i) qc[i] = (uint16_t)(7 * i + 1), outc[i] = TC_POISON_BF16;
  tc_poison_f32(sink_out, HP);
  dsa_pad_heads_params c = {.num_tokens = T, .num_heads = H, .padded_heads = H, .head_dim = D,
                            .q = qc, .q_out = outc, .sink_out = sink_out};
  TC_OK(dsa_ref_pad_heads(&c));
  cr_assert_arr_eq(outc, qc, sizeof qc);
  cr_assert(isinf(sink_out[0]) && sink_out[0] < 0 && isinf(sink_out[1]) && sink_out[1] < 0);
  cr_assert(isnan(sink_out[2]), "sink_out beyond Hp untouched");

  /* sink_out NULL: sink ignored; T == 0 with a sink_out still fills it */
  c.sink_out = NULL;
  c.sink = sink;
  TC_OK(dsa_ref_pad_heads(&c));
  tc_poison_f32(sink_out, HP);
  dsa_pad_heads_params e = {.num_tokens = 0, .num_heads = H, .padded_heads = HP, .head_dim = D,
                            .sink = sink, .sink_out = sink_out};
  TC_OK(dsa_ref_pad_heads(&e));
  cr_assert_eq(sink_out[1], -2.0f);
  cr_assert(isinf(sink_out[3]) && sink_out[3] < 0);
}

Test(compact, padded_head_count_table) {
  const int h[] = {1, 2, 8, 16, 32, 64, 128, 192, 256, 3, 48, 96, 0, -64, 100, 127};
  const int want[] = {64, 64, 64, 64, 64, 64, 128, 192, 256, -1, -1, -1, -1, -1, -1, -1};
  for (size_t i = 0; i < sizeof h / sizeof h[0]; ++i)
    cr_assert_eq(dsa_padded_head_count(h[i]), want[i], "H = %d -> %d, want %d", h[i],
                 dsa_padded_head_count(h[i]), want[i]);
}

/* ---- validation: every rule, for the reference and the public op (ctx NULL: params first) ---- */

static int32_t g_in[64 * 8], g_out[64 * 8 + 8], g_len[64];

static void poison_outputs(void) {
  for (size_t i = 0; i < sizeof g_out / sizeof g_out[0]; ++i) g_out[i] = TC_POISON_I32;
  for (size_t i = 0; i < sizeof g_len / sizeof g_len[0]; ++i) g_len[i] = TC_POISON_I32;
}
static void assert_outputs_poisoned(void) {
  for (size_t i = 0; i < sizeof g_out / sizeof g_out[0]; ++i) cr_assert_eq(g_out[i], TC_POISON_I32);
  for (size_t i = 0; i < sizeof g_len / sizeof g_len[0]; ++i) cr_assert_eq(g_len[i], TC_POISON_I32);
}

static dsa_compact_params good_compact(void) {
  for (int i = 0; i < 64 * 8; ++i) g_in[i] = i % 11 - 1;
  dsa_compact_params p = {.rows = 4, .k = 8, .key_count = 100, .indices = g_in, .out = g_out,
                          .lengths = g_len};
  return p;
}

#define COMPACT_FAILS(mutate, word)                                                        \
  do {                                                                                     \
    dsa_compact_params p_ = good_compact();                                                \
    mutate;                                                                                \
    poison_outputs();                                                                      \
    TC_FAILS(dsa_ref_compact_indices(&p_), DSA_ERROR_INVALID_ARGUMENT, word);              \
    TC_FAILS(dsa_compact_indices(NULL, &p_, 0), DSA_ERROR_INVALID_ARGUMENT, word);         \
    assert_outputs_poisoned();                                                             \
  } while (0)

Test(compact, compact_validation) {
  TC_FAILS(dsa_ref_compact_indices(NULL), DSA_ERROR_INVALID_ARGUMENT, "p");
  TC_FAILS(dsa_compact_indices(NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "p is NULL");
  COMPACT_FAILS(p_.rows = -1, "rows = -1");
  COMPACT_FAILS(p_.rows = (int64_t)INT32_MAX + 1, "rows = 2147483648");
  COMPACT_FAILS(p_.k = 0, "k = 0");
  COMPACT_FAILS(p_.k = 2049, "k = 2049");
  COMPACT_FAILS(p_.k = -3, "k = -3");
  COMPACT_FAILS(p_.key_count = -1, "key_count = -1");
  COMPACT_FAILS(p_.key_count = INT32_MAX, "key_count = 2147483647");
  COMPACT_FAILS(p_.indices = NULL, "indices is NULL");
  COMPACT_FAILS(p_.out = NULL, "out is NULL");
  COMPACT_FAILS(p_.indices = (const int32_t *)((const char *)g_in + 2), "indices");
  COMPACT_FAILS(p_.out = (int32_t *)((char *)g_out + 1), "out");
  COMPACT_FAILS(p_.lengths = (int32_t *)((char *)g_len + 2), "lengths");
  COMPACT_FAILS(p_.indices_stride = 7, "indices_stride = 7");
  COMPACT_FAILS(p_.out_stride = 5, "out_stride = 5");
  COMPACT_FAILS(p_.indices_stride = INT64_MAX / 2, "indices_stride");
  /* overlaps other than exact in place */
  COMPACT_FAILS(p_.indices = g_out; p_.out = g_out + 1, "out overlaps indices");
  COMPACT_FAILS(p_.indices = g_out; p_.indices_stride = 8; p_.out_stride = 9, "out overlaps indices");
  COMPACT_FAILS(p_.indices = g_out + 8; p_.rows = 3, "out overlaps indices"); /* shifted a row */
  COMPACT_FAILS(p_.indices = g_out + 4; p_.k = 4; p_.indices_stride = 8; p_.out_stride = 8; p_.rows = 4;
                p_.out = g_out + 2, "out overlaps indices"); /* interleaved but touching */

  /* accepted: rows 0 with NULL pointers; in place; disjoint interleaved rows */
  dsa_compact_params z = {.rows = 0, .k = 8, .key_count = 0};
  TC_OK(dsa_ref_compact_indices(&z));
  TC_FAILS(dsa_compact_indices(NULL, &z, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  dsa_compact_params ip = good_compact();
  ip.indices = g_out;
  TC_OK(dsa_ref_compact_indices(&ip));
  dsa_compact_params il = {.rows = 4, .k = 4, .key_count = 9, .indices = g_out, .indices_stride = 8,
                           .out = g_out + 4, .out_stride = 8};
  for (int i = 0; i < 32; ++i) g_out[i] = i % 4 ? 3 - i % 4 : -1;
  TC_OK(dsa_ref_compact_indices(&il));
  for (int r = 0; r < 4; ++r) {
    cr_assert_eq(g_out[r * 8 + 4], 0); /* row [-1, 2, 1, 0] -> [0, 1, 2, -1] */
    cr_assert_eq(g_out[r * 8 + 5], 1);
    cr_assert_eq(g_out[r * 8 + 6], 2);
    cr_assert_eq(g_out[r * 8 + 7], -1);
    cr_assert_eq(g_out[r * 8 + 1], 2, "the input rows are untouched");
  }
}

static uint16_t g_q[4 * 4 * 16 + 64] __attribute__((aligned(16)));
static uint16_t g_qo[4 * 8 * 16 + 64] __attribute__((aligned(16)));
static float g_sink[8], g_sink_out[16];

static void poison_pad(void) {
  for (size_t i = 0; i < sizeof g_qo / sizeof g_qo[0]; ++i) g_qo[i] = TC_POISON_BF16;
  tc_poison_f32(g_sink_out, 16);
}
static void assert_pad_poisoned(void) {
  for (size_t i = 0; i < sizeof g_qo / sizeof g_qo[0]; ++i) cr_assert_eq(g_qo[i], TC_POISON_BF16);
  for (int i = 0; i < 16; ++i) cr_assert(isnan(g_sink_out[i]));
}
static dsa_pad_heads_params good_pad(void) {
  dsa_pad_heads_params p = {.num_tokens = 4, .num_heads = 4, .padded_heads = 8, .head_dim = 16,
                            .q = g_q, .q_out = g_qo, .sink = g_sink, .sink_out = g_sink_out};
  return p;
}

#define PAD_FAILS(mutate, word)                                                \
  do {                                                                         \
    dsa_pad_heads_params p_ = good_pad();                                      \
    mutate;                                                                    \
    poison_pad();                                                              \
    TC_FAILS(dsa_ref_pad_heads(&p_), DSA_ERROR_INVALID_ARGUMENT, word);        \
    TC_FAILS(dsa_pad_heads(NULL, &p_, 0), DSA_ERROR_INVALID_ARGUMENT, word);   \
    assert_pad_poisoned();                                                     \
  } while (0)

Test(compact, pad_heads_validation) {
  TC_FAILS(dsa_ref_pad_heads(NULL), DSA_ERROR_INVALID_ARGUMENT, "p is NULL");
  TC_FAILS(dsa_pad_heads(NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "p is NULL");
  PAD_FAILS(p_.num_tokens = -1, "num_tokens = -1");
  PAD_FAILS(p_.num_heads = 0, "num_heads = 0");
  PAD_FAILS(p_.num_heads = 129; p_.padded_heads = 256, "num_heads = 129");
  PAD_FAILS(p_.padded_heads = 3, "padded_heads = 3");
  PAD_FAILS(p_.padded_heads = 1025, "padded_heads = 1025");
  PAD_FAILS(p_.head_dim = 0, "head_dim = 0");
  PAD_FAILS(p_.head_dim = 12, "head_dim = 12");
  PAD_FAILS(p_.head_dim = 1 << 30, "head_dim");
  PAD_FAILS(p_.q = NULL, "q is NULL");
  PAD_FAILS(p_.q_out = NULL, "q_out is NULL");
  PAD_FAILS(p_.q = g_q + 1, "q = ");
  PAD_FAILS(p_.q_out = g_qo + 4, "q_out = ");
  PAD_FAILS(p_.sink_out = (float *)((char *)g_sink_out + 2), "sink_out");
  PAD_FAILS(p_.sink = (const float *)((const char *)g_sink + 1), "sink");
  PAD_FAILS(p_.q_stride_head = 12, "q_stride_head = 12");
  PAD_FAILS(p_.q_stride_token = -64, "q_stride_token = -64");
  PAD_FAILS(p_.q_stride_head = 8, "q_stride_head = 8");   /* below head_dim */
  PAD_FAILS(p_.q_stride_token = 48, "q_stride_token = 48"); /* heads overlap: 48 < 16 * 4 */
  /* token stride the smaller one: it must cover D, and the head stride all T tokens */
  PAD_FAILS(p_.q_stride_token = 8; p_.q_stride_head = 200, "q_stride_token = 8");
  PAD_FAILS(p_.q_stride_token = 16; p_.q_stride_head = 48, "q_stride_head = 48");
  PAD_FAILS(p_.q_stride_token = (INT64_MAX / 16) & ~(int64_t)7, "too large for num_tokens");
  PAD_FAILS(p_.q_out = (uint16_t *)g_q, "overlaps q");

  /* accepted: token-minor layout, T == 0 with NULL q / q_out, sink NULL / sink_out NULL */
  dsa_pad_heads_params ok = good_pad();
  ok.q_stride_token = 16;
  ok.q_stride_head = 64;
  TC_OK(dsa_ref_pad_heads(&ok));
  for (int t = 0; t < 4; ++t)
    for (int h = 0; h < 8; ++h)
      for (int d = 0; d < 16; ++d)
        cr_assert_eq(g_qo[(t * 8 + h) * 16 + d], h < 4 ? g_q[t * 16 + h * 64 + d] : 0);
  dsa_pad_heads_params z = {.num_tokens = 0, .num_heads = 3, .padded_heads = 3, .head_dim = 8};
  TC_OK(dsa_ref_pad_heads(&z));
  TC_FAILS(dsa_pad_heads(NULL, &z, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx");
}
