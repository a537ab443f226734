/* test_plan.c - the host planner (docs/contract.md sections 2, 4, 5): the four worked examples of
 * section 4 field by field, every validation error, random layouts against a naive per-query
 * recomputation written independently here, and the upload's size query and argument errors
 * (all without a GPU). */
#include "test_common.h"
#include "dsa_testing.h" /* dsa_check_plan_view */

/* ---- helpers ---------------------------------------------------------------------------------- */
static dsa_plan_desc desc_of(const int32_t *cu, const int32_t *padded, int64_t S, int64_t tk,
                             int64_t qs, int64_t nq) {
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu;
  d.cu_seqlens_padded = padded;
  d.num_seqs = S;
  d.total_key_tokens = tk;
  d.query_start = qs;
  d.num_queries = nq;
  return d;
}

static dsa_plan *make_plan(const dsa_plan_desc *d) {
  dsa_plan *p = NULL;
  TC_OK(dsa_plan_create(d, &p));
  cr_assert_not_null(p);
  cr_assert_not_null(dsa_plan_host_view(p));
  return p;
}

#define EXPECT_ARRAY(got, exp, n, name)                                                         \
  do {                                                                                          \
    cr_assert_not_null((got), "%s is NULL", name);                                              \
    for (int64_t i_ = 0; i_ < (int64_t)(n); ++i_)                                               \
      cr_assert_eq((int64_t)(got)[i_], (int64_t)(exp)[i_], "%s[%lld] = %lld, expected %lld", name, \
                   (long long)i_, (long long)(got)[i_], (long long)(exp)[i_]);                  \
  } while (0)

static void expect_scalars(const dsa_plan_view *v, int64_t tq, int64_t tk, int64_t qs, int64_t nseg,
                           int64_t nvalid, int64_t nks, int32_t mq, int32_t mk, int32_t all) {
  cr_assert_eq(v->num_queries, tq, "num_queries = %lld", (long long)v->num_queries);
  cr_assert_eq(v->total_key_tokens, tk);
  cr_assert_eq(v->query_start, qs);
  cr_assert_eq(v->num_segments, nseg, "num_segments = %lld", (long long)v->num_segments);
  cr_assert_eq(v->num_valid, nvalid, "num_valid = %lld", (long long)v->num_valid);
  cr_assert_eq(v->num_key_sources, nks, "num_key_sources = %lld", (long long)v->num_key_sources);
  cr_assert_eq(v->max_seqlen_q, mq, "max_seqlen_q = %d", v->max_seqlen_q);
  cr_assert_eq(v->max_seqlen_k, mk, "max_seqlen_k = %d", v->max_seqlen_k);
  cr_assert_eq(v->all_rows_nonempty, all);
  if (all) cr_assert_null(v->valid_row_indices);
  if (nks == 0) cr_assert_null(v->key_source_indices);
}

/* Layout of the blob as the host view shows it: every present array 16-byte aligned, no two
 * overlapping, all inside one window of `bytes` (the upload size). */
static void check_layout(const dsa_plan_view *v, size_t bytes) {
  struct { const void *p; size_t n; } a[8] = {
      {v->starts, (size_t)v->num_queries * 4},
      {v->causal_lengths, (size_t)v->num_queries * 4},
      {v->query_valid, (size_t)v->num_queries},
      {v->valid_row_indices, (size_t)v->num_valid * 8},
      {v->segment_cu_q, (size_t)(v->num_segments + 1) * 4},
      {v->segment_cu_k, (size_t)(v->num_segments + 1) * 4},
      {v->q_causal_offsets, (size_t)v->num_segments * 4},
      {v->key_source_indices, (size_t)v->num_key_sources * 8},
  };
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < 8; ++i) {
    if (a[i].p == NULL) continue;
    uintptr_t s = (uintptr_t)a[i].p, e = s + a[i].n;
    cr_assert_eq(s % 16, 0, "array %d at %p is not 16-byte aligned", i, a[i].p);
    if (s < lo) lo = s;
    if (e > hi) hi = e;
    for (int j = 0; j < i; ++j) {
      if (a[j].p == NULL || a[i].n == 0 || a[j].n == 0) continue;
      uintptr_t s2 = (uintptr_t)a[j].p, e2 = s2 + a[j].n;
      cr_assert(e <= s2 || e2 <= s, "arrays %d and %d overlap", i, j);
    }
  }
  cr_assert(hi - lo <= bytes, "arrays span %zu bytes, more than the upload size %zu",
            (size_t)(hi - lo), bytes);
}

/* Section 5 check, layout check and upload size: every plan must pass them. */
static void check_plan_contract(const dsa_plan *p) {
  const dsa_plan_view *v = dsa_plan_host_view(p);
  size_t bytes = 0, again = 0;
  TC_OK(dsa_check_plan_view(v, v->num_queries, v->total_key_tokens, "test"));
  TC_OK(dsa_plan_upload(NULL, p, NULL, &bytes, NULL, 0));
  TC_OK(dsa_plan_upload(NULL, p, NULL, &again, NULL, 0));
  cr_assert(bytes >= 1);
  cr_assert_eq(bytes, again, "size query not stable: %zu then %zu", bytes, again);
  check_layout(v, bytes);
}

/* ---- the worked examples of section 4 ---------------------------------------------------------- */
static const int32_t A_cu[] = {0, 3, 7, 9}, A_P[] = {0, 4, 9, 12};

Test(plan, example_a_cp_slice_with_padded_documents) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 8);
  dsa_plan *p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  static const int32_t scq[] = {0, 2, 7, 8}, qco[] = {2, 0, 0}, sck[] = {0, 4, 9, 10};
  static const int32_t starts[] = {0, 0, 4, 4, 4, 4, 4, 9}, causal[] = {3, 0, 1, 2, 3, 4, 0, 1};
  static const uint8_t valid[] = {1, 0, 1, 1, 1, 1, 0, 1};
  static const int64_t vri[] = {0, 2, 3, 4, 5, 7}, ksi[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  expect_scalars(v, 8, 12, 2, 3, 6, 10, 5, 5, 0);
  EXPECT_ARRAY(v->segment_cu_q, scq, 4, "segment_cu_q");
  EXPECT_ARRAY(v->q_causal_offsets, qco, 3, "q_causal_offsets");
  EXPECT_ARRAY(v->segment_cu_k, sck, 4, "segment_cu_k");
  EXPECT_ARRAY(v->key_source_indices, ksi, 10, "key_source_indices");
  EXPECT_ARRAY(v->starts, starts, 8, "starts");
  EXPECT_ARRAY(v->query_valid, valid, 8, "query_valid");
  EXPECT_ARRAY(v->causal_lengths, causal, 8, "causal_lengths");
  EXPECT_ARRAY(v->valid_row_indices, vri, 6, "valid_row_indices");
  check_plan_contract(p);
  dsa_plan_destroy(p);
}

Test(plan, example_b_padding_mask) {
  static const int32_t cu[] = {0, 3, 8};
  static const uint8_t mask[] = {0, 0, 0, 0, 0, 1, 1, 1};
  dsa_plan_desc d = desc_of(cu, NULL, 2, 8, 0, -1);
  d.padding_mask = mask;
  dsa_plan *p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  static const int32_t causal[] = {1, 2, 3, 1, 2, 0, 0, 0}, starts[] = {0, 0, 0, 3, 3, 3, 3, 3};
  static const uint8_t valid[] = {1, 1, 1, 1, 1, 0, 0, 0};
  static const int64_t vri[] = {0, 1, 2, 3, 4};
  static const int32_t scq[] = {0, 3, 8}, sck[] = {0, 3, 8}, qco[] = {0, 0};
  expect_scalars(v, 8, 8, 0, 2, 5, 0, 5, 5, 0);
  EXPECT_ARRAY(v->causal_lengths, causal, 8, "causal_lengths");
  EXPECT_ARRAY(v->starts, starts, 8, "starts");
  EXPECT_ARRAY(v->query_valid, valid, 8, "query_valid");
  EXPECT_ARRAY(v->valid_row_indices, vri, 5, "valid_row_indices");
  EXPECT_ARRAY(v->segment_cu_q, scq, 3, "segment_cu_q");
  EXPECT_ARRAY(v->segment_cu_k, sck, 3, "segment_cu_k");
  EXPECT_ARRAY(v->q_causal_offsets, qco, 2, "q_causal_offsets");
  cr_assert_null(v->key_source_indices);
  check_plan_contract(p);
  dsa_plan_destroy(p);
}

Test(plan, example_c_identity_two_documents) {
  static const int32_t cu[] = {0, 2, 5};
  dsa_plan_desc d = desc_of(cu, NULL, 2, 5, 0, -1);
  d.max_seqlen = 3; /* the right value passes */
  dsa_plan *p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  static const int32_t starts[] = {0, 0, 2, 2, 2}, causal[] = {1, 2, 1, 2, 3};
  static const uint8_t valid[] = {1, 1, 1, 1, 1};
  static const int32_t scq[] = {0, 2, 5}, sck[] = {0, 2, 5}, qco[] = {0, 0};
  expect_scalars(v, 5, 5, 0, 2, 5, 0, 3, 3, 1);
  EXPECT_ARRAY(v->starts, starts, 5, "starts");
  EXPECT_ARRAY(v->causal_lengths, causal, 5, "causal_lengths");
  EXPECT_ARRAY(v->query_valid, valid, 5, "query_valid");
  EXPECT_ARRAY(v->segment_cu_q, scq, 3, "segment_cu_q");
  EXPECT_ARRAY(v->segment_cu_k, sck, 3, "segment_cu_k");
  EXPECT_ARRAY(v->q_causal_offsets, qco, 2, "q_causal_offsets");
  cr_assert_null(v->key_source_indices);
  cr_assert_null(v->valid_row_indices);
  check_plan_contract(p);
  dsa_plan_destroy(p);
}

Test(plan, example_d_cp_rank_1) {
  static const int32_t cu[] = {0, 64, 128};
  dsa_plan_desc d = desc_of(cu, NULL, 2, 128, 96, 32);
  dsa_plan *p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  int32_t starts[32], causal[32];
  uint8_t valid[32];
  int64_t ksi[64];
  static const int32_t scq[] = {0, 32}, sck[] = {0, 64}, qco[] = {32};
  for (int i = 0; i < 32; ++i) starts[i] = 64, causal[i] = 33 + i, valid[i] = 1;
  for (int i = 0; i < 64; ++i) ksi[i] = 64 + i;
  expect_scalars(v, 32, 128, 96, 1, 32, 64, 32, 64, 1);
  EXPECT_ARRAY(v->q_causal_offsets, qco, 1, "q_causal_offsets");
  EXPECT_ARRAY(v->segment_cu_q, scq, 2, "segment_cu_q");
  EXPECT_ARRAY(v->segment_cu_k, sck, 2, "segment_cu_k");
  EXPECT_ARRAY(v->key_source_indices, ksi, 64, "key_source_indices");
  EXPECT_ARRAY(v->causal_lengths, causal, 32, "causal_lengths");
  EXPECT_ARRAY(v->starts, starts, 32, "starts");
  EXPECT_ARRAY(v->query_valid, valid, 32, "query_valid");
  cr_assert_null(v->valid_row_indices);
  check_plan_contract(p);
  dsa_plan_destroy(p);
}

Test(plan, single_document_identity) {
  static const int32_t cu[] = {0, 7};
  dsa_plan_desc d = desc_of(cu, NULL, 1, 7, 0, -1);
  dsa_plan *p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  static const int32_t starts[] = {0, 0, 0, 0, 0, 0, 0}, causal[] = {1, 2, 3, 4, 5, 6, 7};
  static const int32_t scq[] = {0, 7}, sck[] = {0, 7}, qco[] = {0};
  expect_scalars(v, 7, 7, 0, 1, 7, 0, 7, 7, 1);
  EXPECT_ARRAY(v->starts, starts, 7, "starts");
  EXPECT_ARRAY(v->causal_lengths, causal, 7, "causal_lengths");
  EXPECT_ARRAY(v->segment_cu_q, scq, 2, "segment_cu_q");
  EXPECT_ARRAY(v->segment_cu_k, sck, 2, "segment_cu_k");
  EXPECT_ARRAY(v->q_causal_offsets, qco, 1, "q_causal_offsets");
  check_plan_contract(p);
  dsa_plan_destroy(p);
}

/* The identity query set given explicitly (query_start 0, num_queries T_k) is the identity too. */
Test(plan, explicit_full_query_set_is_identity) {
  static const int32_t cu[] = {0, 2, 5};
  dsa_plan_desc d = desc_of(cu, NULL, 2, 5, 0, 5);
  dsa_plan *p = make_plan(&d);
  cr_assert_null(dsa_plan_host_view(p)->key_source_indices);
  cr_assert_eq(dsa_plan_host_view(p)->num_key_sources, 0);
  dsa_plan_destroy(p);
  /* example A's layout with every query: identity, and pad rows 3, 8, 11 are invalid */
  d = desc_of(A_cu, A_P, 3, 12, 0, 12);
  p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  static const int64_t vri[] = {0, 1, 2, 4, 5, 6, 7, 9, 10};
  static const int32_t sck[] = {0, 4, 9, 12}, causal[] = {1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 0};
  expect_scalars(v, 12, 12, 0, 3, 9, 0, 5, 5, 0);
  EXPECT_ARRAY(v->valid_row_indices, vri, 9, "valid_row_indices");
  EXPECT_ARRAY(v->segment_cu_k, sck, 4, "segment_cu_k");
  EXPECT_ARRAY(v->causal_lengths, causal, 12, "causal_lengths");
  check_plan_contract(p);
  dsa_plan_destroy(p);
  /* one query short of the identity is not the identity */
  d = desc_of(cu, NULL, 2, 5, 0, 4);
  p = make_plan(&d);
  static const int64_t ksi[] = {0, 1, 2, 3};
  cr_assert_eq(dsa_plan_host_view(p)->num_key_sources, 4);
  EXPECT_ARRAY(dsa_plan_host_view(p)->key_source_indices, ksi, 4, "key_source_indices");
  dsa_plan_destroy(p);
}

/* Every query masked: valid_row_indices is present but empty, the plan still passes section 5. */
Test(plan, all_queries_masked) {
  static const int32_t cu[] = {0, 2, 5};
  static const uint8_t mask[] = {1, 1, 1, 1, 1};
  dsa_plan_desc d = desc_of(cu, NULL, 2, 5, 0, -1);
  d.padding_mask = mask;
  dsa_plan *p = make_plan(&d);
  const dsa_plan_view *v = dsa_plan_host_view(p);
  static const int32_t zero[] = {0, 0, 0, 0, 0};
  expect_scalars(v, 5, 5, 0, 2, 0, 0, 3, 3, 0);
  cr_assert_not_null(v->valid_row_indices);
  EXPECT_ARRAY(v->causal_lengths, zero, 5, "causal_lengths");
  EXPECT_ARRAY(v->query_valid, zero, 5, "query_valid");
  check_plan_contract(p);
  dsa_plan_destroy(p);
}

/* ---- validation: one test per error, each naming the argument ---------------------------------- */
/* Expects dsa_plan_create(d) to fail with invalid argument naming `word`, and *plan set to NULL. */
static void expect_create_fails(const dsa_plan_desc *d, const char *word) {
  dsa_plan *p = (dsa_plan *)0x1;
  TC_FAILS(dsa_plan_create(d, &p), DSA_ERROR_INVALID_ARGUMENT, word);
  cr_assert_null(p, "*plan not cleared on failure");
}

Test(plan_errors, null_desc_and_null_plan) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 8);
  dsa_plan *p = (dsa_plan *)0x1;
  TC_FAILS(dsa_plan_create(NULL, &p), DSA_ERROR_INVALID_ARGUMENT, "desc");
  cr_assert_null(p);
  TC_FAILS(dsa_plan_create(&d, NULL), DSA_ERROR_INVALID_ARGUMENT, "plan is NULL");
  dsa_plan_destroy(NULL); /* no-op */
  cr_assert_null(dsa_plan_host_view(NULL));
}

Test(plan_errors, null_cu_seqlens) {
  dsa_plan_desc d = desc_of(NULL, A_P, 3, 12, 2, 8);
  expect_create_fails(&d, "cu_seqlens is NULL");
}

Test(plan_errors, num_seqs_below_1) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 0, 12, 2, 8);
  expect_create_fails(&d, "num_seqs = 0");
  d.num_seqs = -3;
  expect_create_fails(&d, "num_seqs = -3");
}

Test(plan_errors, total_key_tokens_out_of_range) {
  static const int32_t cu[] = {0, 5};
  dsa_plan_desc d = desc_of(cu, NULL, 1, 0, 0, -1);
  expect_create_fails(&d, "total_key_tokens = 0");
  d.total_key_tokens = -5;
  expect_create_fails(&d, "total_key_tokens = -5");
  d.total_key_tokens = 2147483647;
  expect_create_fails(&d, "total_key_tokens = 2147483647");
  d.total_key_tokens = (int64_t)1 << 40;
  expect_create_fails(&d, "total_key_tokens");
}

Test(plan_errors, cu_seqlens_not_starting_at_zero) {
  static const int32_t cu[] = {1, 3, 7, 9};
  dsa_plan_desc d = desc_of(cu, A_P, 3, 12, 2, 8);
  expect_create_fails(&d, "cu_seqlens[0] = 1");
}

Test(plan_errors, empty_or_negative_sequence) {
  static const int32_t neg[] = {0, 7, 5, 9}, empty[] = {0, 3, 3, 9};
  dsa_plan_desc d = desc_of(neg, A_P, 3, 12, 2, 8);
  expect_create_fails(&d, "cu_seqlens[2] = 5 is below cu_seqlens[1] = 7 (empty or negative sequence 1)");
  d.cu_seqlens = empty;
  expect_create_fails(&d, "cu_seqlens[2] = 3");
}

Test(plan_errors, padded_not_starting_at_zero) {
  static const int32_t P[] = {1, 4, 9, 12};
  dsa_plan_desc d = desc_of(A_cu, P, 3, 12, 2, 8);
  expect_create_fails(&d, "cu_seqlens_padded[0] = 1");
}

Test(plan_errors, padded_length_not_positive) {
  static const int32_t P0[] = {0, 4, 4, 12}, Pneg[] = {0, 9, 4, 12};
  dsa_plan_desc d = desc_of(A_cu, P0, 3, 12, 2, 8);
  expect_create_fails(&d, "cu_seqlens_padded[2] = 4");
  d.cu_seqlens_padded = Pneg;
  expect_create_fails(&d, "cu_seqlens_padded[2] = 4 is below");
}

Test(plan_errors, padded_length_below_real_length) {
  static const int32_t P[] = {0, 4, 7, 12}; /* doc1: padded 3 < real 4 */
  dsa_plan_desc d = desc_of(A_cu, P, 3, 12, 2, 8);
  expect_create_fails(&d, "below its real length 4");
  expect_create_fails(&d, "cu_seqlens_padded");
}

Test(plan_errors, padded_end_differs_from_total_key_tokens) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 13, 2, 8);
  expect_create_fails(&d, "cu_seqlens_padded[3] = 12 differs from total_key_tokens = 13");
  /* no padded offsets: cu must cover every key */
  d = desc_of(A_cu, NULL, 3, 12, 2, 8);
  expect_create_fails(&d, "cu_seqlens[3] = 9 differs from total_key_tokens = 12");
}

Test(plan_errors, num_queries_zero_or_below_minus_1) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 0);
  expect_create_fails(&d, "num_queries = 0");
  d.num_queries = -2;
  expect_create_fails(&d, "num_queries = -2");
}

Test(plan_errors, all_queries_with_nonzero_start) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, -1);
  expect_create_fails(&d, "query_start = 2");
}

Test(plan_errors, query_range_outside_keys) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, -1, 4);
  expect_create_fails(&d, "query_start");
  d.query_start = 12, d.num_queries = 1;
  expect_create_fails(&d, "query_start");
  d.query_start = 5, d.num_queries = 8; /* ends at 13 > 12 */
  expect_create_fails(&d, "num_queries");
  d.query_start = 5, d.num_queries = INT64_MAX; /* no overflow */
  expect_create_fails(&d, "num_queries");
  d.query_start = INT64_MAX, d.num_queries = 1;
  expect_create_fails(&d, "query_start");
  d.query_start = 4, d.num_queries = 8; /* ends exactly at 12: fine */
  dsa_plan *p = make_plan(&d);
  dsa_plan_destroy(p);
}

Test(plan_errors, max_seqlen_differs) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 8);
  d.max_seqlen = 5;
  expect_create_fails(&d, "max_seqlen = 5");
  d.max_seqlen = 3;
  expect_create_fails(&d, "max_seqlen = 3");
  d.max_seqlen = 4; /* max real length: fine; <= 0 means not given */
  dsa_plan_destroy(make_plan(&d));
  d.max_seqlen = -7;
  dsa_plan_destroy(make_plan(&d));
}

/* ---- random layouts against a naive recomputation ----------------------------------------------- */
#define MAX_S 9
#define MAX_T 400

typedef struct naive {
  int64_t tq, nseg, nvalid, nks;
  int32_t starts[MAX_T], causal[MAX_T];
  uint8_t valid[MAX_T];
  int64_t vri[MAX_T];
  int32_t scq[MAX_T + 1], sck[MAX_T + 1], qco[MAX_T];
  int64_t ksi[MAX_T * 2];
  int32_t mq, mk;
} naive;

/* Recomputes section 2/4 the slow way: the document of each query and of each key by a linear scan,
 * and the visible keys of each query counted one by one. */
static void naive_plan(const int32_t *cu, const int32_t *P, int64_t S, int64_t T, int64_t qs,
                       int64_t tq, const uint8_t *mask, naive *n) {
  int64_t doc_of_key[MAX_T], qdoc[MAX_T];
  memset(n, 0, sizeof *n);
  n->tq = tq;
  for (int64_t k = 0; k < T; ++k) {
    int64_t d = 0;
    while (!(P[d] <= k && k < P[d + 1])) ++d;
    doc_of_key[k] = d;
  }
  for (int64_t i = 0; i < tq; ++i) {
    int64_t g = qs + i, d = doc_of_key[g], real = cu[d + 1] - cu[d];
    int ok = (g - P[d] < real) && !(mask && mask[i]);
    int64_t seen = 0;
    for (int64_t k = 0; k < T && ok; ++k) /* a key is visible: same document, real, not after g */
      if (doc_of_key[k] == d && k <= g && k - P[d] < real) ++seen;
    qdoc[i] = d;
    n->starts[i] = P[d];
    n->valid[i] = (uint8_t)ok;
    n->causal[i] = (int32_t)seen;
    if (ok) n->vri[n->nvalid++] = i;
  }
  n->scq[0] = n->sck[0] = 0;
  for (int64_t i = 0; i < tq; ++i) {
    if (i > 0 && qdoc[i] == qdoc[i - 1]) continue;
    int64_t e = i;
    while (e + 1 < tq && qdoc[e + 1] == qdoc[i]) ++e;
    int64_t qc = e - i + 1, first_g = qs + i, kc = qs + e + 1 - P[qdoc[i]];
    n->qco[n->nseg] = (int32_t)(first_g - P[qdoc[i]]);
    n->scq[n->nseg + 1] = n->scq[n->nseg] + (int32_t)qc;
    n->sck[n->nseg + 1] = n->sck[n->nseg] + (int32_t)kc;
    for (int64_t k = 0; k < kc; ++k) n->ksi[n->nks++] = P[qdoc[i]] + k;
    if (qc > n->mq) n->mq = (int32_t)qc;
    if (kc > n->mk) n->mk = (int32_t)kc;
    n->nseg++;
  }
}

Test(plan, random_layouts_match_naive_recomputation) {
  tc_rng r = tc_seed("plan random layouts");
  static naive n;
  for (int iter = 0; iter < 400; ++iter) {
    int32_t cu[MAX_S + 1], P[MAX_S + 1];
    int64_t R[MAX_S], pad[MAX_S];
    uint8_t mask[MAX_T];
    int64_t S = 1 + tc_below(&r, MAX_S), cp = 1 + tc_below(&r, 4), T = 0, maxr = 0;
    int padded = tc_below(&r, 3) != 0;
    for (int64_t s = 0; s < S; ++s) {
      R[s] = 1 + tc_below(&r, tc_below(&r, 4) == 0 ? 40 : 9);
      pad[s] = padded ? tc_below(&r, 5) : 0;
      T += R[s] + pad[s];
    }
    /* make T_k a multiple of the CP size: pad the last document (or lengthen it when unpadded) */
    int64_t extra = (cp - T % cp) % cp;
    if (padded) pad[S - 1] += extra;
    else R[S - 1] += extra;
    T += extra;
    cu[0] = P[0] = 0;
    for (int64_t s = 0; s < S; ++s) {
      cu[s + 1] = cu[s] + (int32_t)R[s];
      P[s + 1] = P[s] + (int32_t)(R[s] + pad[s]);
      if (R[s] > maxr) maxr = R[s];
    }
    cr_assert(T <= MAX_T);
    int64_t qs, nq, tq;
    switch (tc_below(&r, 3)) {
      case 0: /* the whole stream */
        qs = 0, nq = tc_below(&r, 2) ? -1 : T;
        break;
      case 1: { /* CP rank r of cp */
        int64_t L = T / cp, rank = tc_below(&r, cp);
        qs = rank * L, nq = L;
        break;
      }
      default: /* any contiguous interval */
        qs = tc_below(&r, T), nq = 1 + tc_below(&r, T - qs);
        break;
    }
    tq = nq == -1 ? T : nq;
    int use_mask = tc_below(&r, 2) != 0;
    for (int64_t i = 0; i < tq; ++i) mask[i] = use_mask && tc_uniform(&r) < 0.25;
    dsa_plan_desc d = desc_of(cu, padded || tc_below(&r, 2) ? P : NULL, S, T, qs, nq);
    d.padding_mask = use_mask ? mask : NULL;
    d.max_seqlen = tc_below(&r, 2) ? maxr : 0;

    dsa_plan *p = make_plan(&d);
    const dsa_plan_view *v = dsa_plan_host_view(p);
    naive_plan(cu, P, S, T, qs, tq, d.padding_mask, &n);
    int identity = qs == 0 && tq == T;
    cr_assert_eq(v->num_queries, tq);
    cr_assert_eq(v->total_key_tokens, T);
    cr_assert_eq(v->query_start, qs);
    cr_assert_eq(v->num_segments, n.nseg, "iter %d: num_segments %lld vs %lld", iter,
                 (long long)v->num_segments, (long long)n.nseg);
    cr_assert_eq(v->num_valid, n.nvalid);
    cr_assert_eq(v->all_rows_nonempty, n.nvalid == tq);
    cr_assert_eq(v->max_seqlen_q, n.mq);
    cr_assert_eq(v->max_seqlen_k, n.mk);
    EXPECT_ARRAY(v->starts, n.starts, tq, "starts");
    EXPECT_ARRAY(v->causal_lengths, n.causal, tq, "causal_lengths");
    EXPECT_ARRAY(v->query_valid, n.valid, tq, "query_valid");
    EXPECT_ARRAY(v->segment_cu_q, n.scq, n.nseg + 1, "segment_cu_q");
    EXPECT_ARRAY(v->segment_cu_k, n.sck, n.nseg + 1, "segment_cu_k");
    EXPECT_ARRAY(v->q_causal_offsets, n.qco, n.nseg, "q_causal_offsets");
    if (n.nvalid == tq) cr_assert_null(v->valid_row_indices);
    else EXPECT_ARRAY(v->valid_row_indices, n.vri, n.nvalid, "valid_row_indices");
    if (identity) {
      cr_assert_null(v->key_source_indices);
      cr_assert_eq(v->num_key_sources, 0);
    } else {
      cr_assert_eq(v->num_key_sources, n.nks);
      EXPECT_ARRAY(v->key_source_indices, n.ksi, n.nks, "key_source_indices");
    }
    /* structural invariants (section 4 step 4 and section 2) */
    for (int64_t i = 0; i < tq; ++i) {
      int64_t g = qs + i;
      cr_assert(v->starts[i] <= g);
      cr_assert(v->query_valid[i] ? v->causal_lengths[i] >= 1 && v->causal_lengths[i] <= g - v->starts[i] + 1
                                  : v->causal_lengths[i] == 0);
    }
    for (int64_t j = 0; j < v->num_segments; ++j) {
      int64_t qc = v->segment_cu_q[j + 1] - v->segment_cu_q[j];
      int64_t kc = v->segment_cu_k[j + 1] - v->segment_cu_k[j];
      cr_assert(qc >= 1 && kc >= qc);
      cr_assert_eq(kc, v->q_causal_offsets[j] + qc, "key_count = q_causal_offset + query_count");
    }
    cr_assert_eq(v->segment_cu_q[v->num_segments], tq);
    check_plan_contract(p);
    dsa_plan_destroy(p);
  }
}

/* ---- section 5 checks of a view ------------------------------------------------------------------ */
Test(plan, check_plan_view_rejects_broken_views) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 8);
  dsa_plan *p = make_plan(&d);
  dsa_plan_view v = *dsa_plan_host_view(p), b;
  TC_OK(dsa_check_plan_view(&v, 8, 12, "op"));
  TC_OK(dsa_check_plan_view(&v, -1, -1, "op"));
  TC_FAILS(dsa_check_plan_view(NULL, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "plan is NULL");
  TC_FAILS(dsa_check_plan_view(&v, 9, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "plan->num_queries");
  TC_FAILS(dsa_check_plan_view(&v, 8, 11, "op"), DSA_ERROR_INVALID_ARGUMENT, "plan->total_key_tokens");
  b = v, b.all_rows_nonempty = 1;
  TC_FAILS(dsa_check_plan_view(&b, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "valid_row_indices");
  b = v, b.valid_row_indices = NULL;
  TC_FAILS(dsa_check_plan_view(&b, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "valid_row_indices");
  b = v, b.max_seqlen_k = 0;
  TC_FAILS(dsa_check_plan_view(&b, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "max_seqlen");
  b = v, b.segment_cu_q = NULL;
  TC_FAILS(dsa_check_plan_view(&b, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "segment_cu_q");
  b = v, b.key_source_indices = NULL;
  TC_FAILS(dsa_check_plan_view(&b, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "key_source_indices");
  b = v, b.num_segments = 0;
  TC_FAILS(dsa_check_plan_view(&b, 8, 12, "op"), DSA_ERROR_INVALID_ARGUMENT, "num_segments");
  dsa_plan_destroy(p);
}

/* ---- upload without a GPU: the size query and the argument errors ------------------------------ */
Test(plan_upload, size_query_needs_no_context) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 8);
  dsa_plan *p = make_plan(&d);
  size_t a = 0, b = 12345;
  TC_OK(dsa_plan_upload(NULL, p, NULL, &a, NULL, 0));
  TC_OK(dsa_plan_upload(NULL, p, NULL, &b, NULL, 0));
  cr_assert(a >= 1);
  cr_assert_eq(a, b);
  /* every array of example A fits: 8*(4+4+1) + 6*8 + 2*4*4 + 3*4 + 10*8 bytes at least */
  cr_assert(a >= 8 * 9 + 48 + 32 + 12 + 80, "size %zu too small for the arrays", a);
  dsa_plan_destroy(p);
}

Test(plan_upload, argument_errors) {
  dsa_plan_desc d = desc_of(A_cu, A_P, 3, 12, 2, 8);
  dsa_plan *p = make_plan(&d);
  size_t need = 0, bytes;
  dsa_plan_view dv, untouched;
  memset(&dv, 0xAB, sizeof dv);
  untouched = dv;
  TC_OK(dsa_plan_upload(NULL, p, NULL, &need, NULL, 0));
  bytes = need;
  TC_FAILS(dsa_plan_upload(NULL, NULL, NULL, &bytes, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "plan");
  TC_FAILS(dsa_plan_upload(NULL, p, NULL, NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "buffer_bytes");
  TC_FAILS(dsa_plan_upload(NULL, p, (void *)0x1000, &bytes, NULL, 0), DSA_ERROR_INVALID_ARGUMENT,
           "device_view");
  /* a real upload needs a context; the params are checked first, so this runs without a GPU */
  TC_FAILS(dsa_plan_upload(NULL, p, (void *)0x1000, &bytes, &dv, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  TC_FAILS(dsa_plan_upload(NULL, p, (void *)0x1001, &bytes, &dv, 0), DSA_ERROR_INVALID_ARGUMENT,
           "device_buffer");
  TC_FAILS(dsa_plan_upload(NULL, p, (void *)0x1008, &bytes, &dv, 0), DSA_ERROR_INVALID_ARGUMENT,
           "device_buffer");
  bytes = need - 1;
  TC_FAILS(dsa_plan_upload(NULL, p, (void *)0x1000, &bytes, &dv, 0), DSA_ERROR_WORKSPACE_TOO_SMALL,
           "buffer_bytes");
  cr_assert_eq(bytes, need - 1, "buffer_bytes written on failure");
  cr_assert(memcmp(&dv, &untouched, sizeof dv) == 0, "device_view written on failure");
  dsa_plan_destroy(p);
}
