/* test_alias.c - contract section 13.3: no output may overlap an input or another output. For each
 * op, outputs placed on (or partly over) each input and each other output are rejected with
 * DSA_ERROR_INVALID_ARGUMENT by the CPU reference and by the GPU entry point (ctx = NULL: the
 * checks run first), the message names both tensors, and nothing is written; tensors that only
 * touch (one ends where the other begins) are accepted, as is compaction's in-place mode. The
 * tensors live in one host arena, so the reference could run on every accepted case. CPU only. */
#include "test_common.h"

#define ARENA_BYTES ((size_t)1 << 20)

typedef struct {
  unsigned char *base;
  size_t used;
} arena;

static void arena_init(arena *a) {
  a->base = aligned_alloc(256, ARENA_BYTES);
  cr_assert_not_null(a->base);
  memset(a->base, 0, ARENA_BYTES);
  a->used = 0;
}
/* The next `bytes` of the arena, 256-byte aligned, zeroed. */
static void *take(arena *a, size_t bytes) {
  void *p = a->base + a->used;
  a->used = (a->used + bytes + 255) / 256 * 256;
  cr_assert(a->used <= ARENA_BYTES);
  return p;
}
static void *at(const void *p, size_t bytes) { return (void *)((const char *)p + bytes); }

/* The whole arena is poisoned before a call that must fail and checked after it: inputs and
 * outputs alike must be untouched. */
static void arena_poison(arena *a) { memset(a->base, 0x5C, a->used); }
static void arena_expect_untouched(const arena *a, const char *what) {
  for (size_t i = 0; i < a->used; ++i)
    cr_assert_eq(a->base[i], 0x5C, "%s: byte %zu of the arena was written by a failed call", what, i);
}

/* The message names the output and the other tensor ("output X ... overlaps input Y"). */
static void expect_names(const char *fn, const char *out, const char *other) {
  const char *m = dsa_last_error_message();
  char want[96];
  cr_assert(strncmp(m, fn, strlen(fn)) == 0, "message \"%s\" does not start with %s", m, fn);
  snprintf(want, sizeof want, "%s [", out);
  cr_assert(strstr(m, want) != NULL, "message \"%s\" does not name %s", m, out);
  snprintf(want, sizeof want, "%s [", other);
  cr_assert(strstr(m, want) != NULL, "message \"%s\" does not name %s", m, other);
  cr_assert(strstr(m, "overlaps") != NULL, "message \"%s\"", m);
}

/* ---- forward ------------------------------------------------------------------------------------ */
/* T = 2, H = 2, D = 576, T_kv = 4, K = 2 */
typedef struct {
  arena a;
  dsa_attn_fwd_params p;
} fwd_fix;
static void fwd_init(fwd_fix *f) {
  arena_init(&f->a);
  dsa_attn_fwd_params *p = &f->p;
  memset(p, 0, sizeof *p);
  p->num_tokens = 2, p->num_heads = 2, p->head_dim = 576, p->num_kv = 4, p->topk = 2;
  p->softmax_scale = 0.0625f;
  p->q = take(&f->a, 2 * 2 * 576 * 2);
  p->kv = take(&f->a, 4 * 576 * 2);
  int32_t *idx = take(&f->a, 2 * 2 * 4);
  idx[0] = 0, idx[1] = 1, idx[2] = 2, idx[3] = 3;
  p->indices = idx;
  int32_t *len = take(&f->a, 2 * 4);
  len[0] = 1, len[1] = 2;
  p->topk_length = len;
  p->sink = take(&f->a, 2 * 4);
  p->out = take(&f->a, 2 * 2 * 512 * 2);
  p->lse = take(&f->a, 2 * 2 * 4);
  p->max_logits = take(&f->a, 2 * 2 * 4);
}
static void fwd_bad(fwd_fix *f, const dsa_attn_fwd_params *p, const char *out, const char *other) {
  arena_poison(&f->a);
  TC_FAILS(dsa_ref_sparse_attn_fwd(p), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  expect_names("dsa_ref_sparse_attn_fwd", out, other);
  TC_FAILS(dsa_sparse_attn_fwd(NULL, p, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  expect_names("dsa_sparse_attn_fwd", out, other);
  arena_expect_untouched(&f->a, "dsa_sparse_attn_fwd");
}

Test(alias, forward_outputs_on_inputs) {
  fwd_fix f;
  fwd_init(&f);
  dsa_attn_fwd_params p;
  p = f.p, p.out = (uint16_t *)p.q;
  fwd_bad(&f, &p, "out", "q");
  p = f.p, p.out = (uint16_t *)at(p.kv, 4 * 576 * 2 - 16); /* the last 16 bytes of kv */
  fwd_bad(&f, &p, "out", "kv");
  p = f.p, p.lse = (float *)p.indices;
  fwd_bad(&f, &p, "lse", "indices");
  p = f.p, p.lse = (float *)p.topk_length;
  fwd_bad(&f, &p, "lse", "topk_length");
  p = f.p, p.max_logits = (float *)p.sink;
  fwd_bad(&f, &p, "max_logits", "sink");
  p = f.p, p.max_logits = (float *)at(p.lse, 4); /* outputs on each other */
  fwd_bad(&f, &p, "lse", "max_logits");
  p = f.p, p.lse = (float *)at(p.out, 16);
  fwd_bad(&f, &p, "out", "lse");
  /* touching is fine: q, out, lse and max_logits back to back in one block */
  p = f.p;
  unsigned char *blk = take(&f.a, 4608 + 4096 + 16 + 16);
  p.q = (const uint16_t *)blk;
  p.out = (uint16_t *)(blk + 4608);
  p.lse = (float *)(blk + 4608 + 4096);
  p.max_logits = (float *)(blk + 4608 + 4096 + 16);
  TC_OK(dsa_ref_sparse_attn_fwd(&p));
  TC_FAILS(dsa_sparse_attn_fwd(NULL, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  p.lse = (float *)(blk + 4608 + 4096 - 4); /* one element into out */
  fwd_bad(&f, &p, "out", "lse");
  /* inputs may alias each other */
  p = f.p, p.sink = (const float *)p.topk_length;
  TC_OK(dsa_ref_sparse_attn_fwd(&p));
  free(f.a.base);
}

/* ---- backward ----------------------------------------------------------------------------------- */
typedef struct {
  arena a;
  dsa_attn_bwd_params p;
} bwd_fix;
static void bwd_init(bwd_fix *f) {
  fwd_fix g;
  fwd_init(&g);
  f->a = g.a;
  dsa_attn_bwd_params *b = &f->p;
  memset(b, 0, sizeof *b);
  b->num_tokens = 2, b->num_heads = 2, b->head_dim = 576, b->num_kv = 4, b->topk = 2;
  b->softmax_scale = 0.0625f;
  b->q = g.p.q, b->kv = g.p.kv, b->indices = g.p.indices, b->topk_length = g.p.topk_length;
  b->sink = g.p.sink, b->out = g.p.out, b->lse = g.p.lse;
  b->dout = take(&f->a, 2 * 2 * 512 * 2);
  b->dq = take(&f->a, 2 * 2 * 576 * 2);
  b->dkv = take(&f->a, 4 * 576 * 2);
  b->dsink = take(&f->a, 2 * 4);
}
static void bwd_bad(bwd_fix *f, const dsa_attn_bwd_params *p, const char *out, const char *other) {
  char ws[64];
  size_t bytes = 777;
  arena_poison(&f->a);
  TC_FAILS(dsa_ref_sparse_attn_bwd(p), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  expect_names("dsa_ref_sparse_attn_bwd", out, other);
  TC_FAILS(dsa_sparse_attn_bwd(NULL, p, NULL, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  expect_names("dsa_sparse_attn_bwd", out, other);
  TC_FAILS(dsa_sparse_attn_bwd(NULL, p, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  cr_assert_eq(bytes, 777, "the size was written on failure");
  arena_expect_untouched(&f->a, "dsa_sparse_attn_bwd");
}

Test(alias, backward_gradients_on_inputs) {
  bwd_fix f;
  bwd_init(&f);
  dsa_attn_bwd_params p;
  p = f.p, p.dq = (uint16_t *)p.q;
  bwd_bad(&f, &p, "dq", "q");
  p = f.p, p.dq = (uint16_t *)p.out; /* the forward output the backward reads */
  bwd_bad(&f, &p, "dq", "out");
  p = f.p, p.dkv = (uint16_t *)p.kv;
  bwd_bad(&f, &p, "dkv", "kv");
  p = f.p, p.dq = take(&f.a, 2 * 2 * 576 * 2), p.dkv = (uint16_t *)at(p.dout, 16); /* dkv runs past
                                                                                   dout's end */
  bwd_bad(&f, &p, "dkv", "dout");
  p = f.p, p.dsink = (float *)p.lse;
  bwd_bad(&f, &p, "dsink", "lse");
  p = f.p, p.dsink = (float *)p.sink;
  bwd_bad(&f, &p, "dsink", "sink");
  p = f.p, p.dsink = (float *)p.indices;
  bwd_bad(&f, &p, "dsink", "indices");
  p = f.p, p.dsink = (float *)p.topk_length;
  bwd_bad(&f, &p, "dsink", "topk_length");
  p = f.p, p.dkv = (uint16_t *)at(p.dq, 2 * 2 * 576 * 2 - 16); /* gradients on each other */
  bwd_bad(&f, &p, "dq", "dkv");
  p = f.p, p.slot_target = (float *)p.lse; /* the optional slot target is an output like the others */
  bwd_bad(&f, &p, "slot_target", "lse");
  p = f.p, p.slot_target = (float *)at(p.dsink, 4);
  bwd_bad(&f, &p, "dsink", "slot_target");
  /* no tokens: nothing is read, but dkv and dsink are still written: only they are compared */
  p = f.p, p.num_tokens = 0, p.dsink = (float *)p.dkv;
  bwd_bad(&f, &p, "dkv", "dsink");
  p = f.p, p.num_tokens = 0, p.dkv = (uint16_t *)p.kv;
  TC_OK(dsa_ref_sparse_attn_bwd(&p));
  free(f.a.base);
}

/* ---- top-k -------------------------------------------------------------------------------------- */
Test(alias, topk_indices_on_scores_or_lengths) {
  arena a;
  arena_init(&a);
  dsa_topk_params p = {0}, q;
  p.rows = 3, p.columns = 8, p.k = 2;
  p.scores = take(&a, 3 * 8 * 4);
  int32_t *len = take(&a, 3 * 4);
  len[0] = len[1] = len[2] = 8;
  p.lengths = len;
  p.indices = take(&a, 3 * 2 * 4);
  char ws[8];
  size_t bytes = 777;
  q = p, q.indices = (int32_t *)at(p.scores, 4 * 8);
  arena_poison(&a);
  TC_FAILS(dsa_ref_topk(&q), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  expect_names("dsa_ref_topk", "indices", "scores");
  TC_FAILS(dsa_topk(NULL, &q, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  TC_FAILS(dsa_topk(NULL, &q, NULL, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  cr_assert_eq(bytes, 777);
  arena_expect_untouched(&a, "dsa_topk");
  q = p, q.indices = (int32_t *)p.lengths;
  TC_FAILS(dsa_topk(NULL, &q, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  expect_names("dsa_topk", "indices", "lengths");
  /* a scores row stride that reaches past the indices: the range counts, not the elements */
  q = p, q.scores_stride = 64, q.indices = (int32_t *)at(p.scores, 4 * 16);
  TC_FAILS(dsa_ref_topk(&q), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
  /* touching ranges are accepted */
  for (int r = 0; r < 3; ++r) len[r] = 8;
  q = p, q.indices = (int32_t *)at(p.scores, 3 * 8 * 4);
  q.lengths = (const int32_t *)at(q.indices, 3 * 2 * 4);
  memset((void *)q.lengths, 0, 12);
  TC_OK(dsa_ref_topk(&q));
  free(a.base);
}

/* ---- indexer ------------------------------------------------------------------------------------ */
Test(alias, indexer_outputs_on_inputs) {
  arena a;
  arena_init(&a);
  int32_t *starts = take(&a, 3 * 4), *causal = take(&a, 3 * 4);
  uint8_t *valid = take(&a, 3);
  for (int t = 0; t < 3; ++t) starts[t] = 0, causal[t] = t + 1, valid[t] = 1;
  dsa_plan_view v = {0};
  v.num_queries = 3, v.total_key_tokens = 3;
  v.starts = starts, v.causal_lengths = causal, v.query_valid = valid;
  tc_view_complete(&v);
  dsa_indexer_params p = {0}, q;
  p.plan = &v, p.num_heads = 2, p.topk = 2;
  p.index_q = take(&a, 3 * 2 * 128 * 2);
  p.index_k = take(&a, 3 * 128 * 2);
  p.weights = take(&a, 3 * 2 * 4);
  p.indices = take(&a, 3 * 2 * 4);
  p.lengths = take(&a, 3 * 4);
  TC_OK(dsa_ref_indexer_topk(&p));
  const struct {
    const char *out, *other;
    size_t out_field;
    const void *where;
  } cases[] = {
      {"indices", "index_q", offsetof(dsa_indexer_params, indices), p.index_q},
      {"indices", "index_k", offsetof(dsa_indexer_params, indices), at(p.index_k, 3 * 128 * 2 - 4)},
      {"lengths", "weights", offsetof(dsa_indexer_params, lengths), p.weights},
      {"lengths", "plan->starts", offsetof(dsa_indexer_params, lengths), starts},
      {"indices", "plan->causal_lengths", offsetof(dsa_indexer_params, indices), causal},
      {"indices", "lengths", offsetof(dsa_indexer_params, lengths), at(p.indices, 8)},
  };
  char ws[8];
  size_t bytes = 777;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    q = p;
    memcpy((char *)&q + cases[i].out_field, &cases[i].where, sizeof(void *));
    arena_poison(&a);
    TC_FAILS(dsa_ref_indexer_topk(&q), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
    expect_names("dsa_ref_indexer_topk", cases[i].out, cases[i].other);
    TC_FAILS(dsa_indexer_topk(NULL, &q, NULL, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
    TC_FAILS(dsa_indexer_topk(NULL, &q, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps");
    expect_names("dsa_indexer_topk", cases[i].out, cases[i].other);
    cr_assert_eq(bytes, 777);
    arena_expect_untouched(&a, cases[i].other);
  }
  free(a.base);
}

/* ---- compaction and head padding ---------------------------------------------------------------- */
Test(alias, compact_in_place_allowed_lengths_not) {
  arena a;
  arena_init(&a);
  dsa_compact_params p = {0}, q;
  p.rows = 2, p.k = 4, p.key_count = 10;
  int32_t *idx = take(&a, 2 * 4 * 4);
  for (int i = 0; i < 8; ++i) idx[i] = 7 - i;
  p.indices = idx;
  p.out = idx; /* in place */
  p.lengths = take(&a, 2 * 4);
  TC_OK(dsa_ref_compact_indices(&p));
  TC_FAILS(dsa_compact_indices(NULL, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  q = p, q.lengths = idx + 2;
  arena_poison(&a);
  TC_FAILS(dsa_ref_compact_indices(&q), DSA_ERROR_INVALID_ARGUMENT, "lengths");
  TC_FAILS(dsa_compact_indices(NULL, &q, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps indices");
  arena_expect_untouched(&a, "dsa_compact_indices");
  q = p, q.out = take(&a, 2 * 4 * 4), q.lengths = q.out + 7;
  TC_FAILS(dsa_compact_indices(NULL, &q, 0), DSA_ERROR_INVALID_ARGUMENT, "lengths");
  cr_assert(strstr(dsa_last_error_message(), "overlaps out"), "%s", dsa_last_error_message());
  free(a.base);
}

Test(alias, pad_heads_sink_out) {
  arena a;
  arena_init(&a);
  dsa_pad_heads_params p = {0}, q;
  p.num_tokens = 2, p.num_heads = 2, p.padded_heads = 4, p.head_dim = 64;
  p.q = take(&a, 2 * 2 * 64 * 2);
  p.q_out = take(&a, 2 * 4 * 64 * 2);
  p.sink = take(&a, 2 * 4);
  p.sink_out = take(&a, 4 * 4);
  TC_OK(dsa_ref_pad_heads(&p));
  q = p, q.sink_out = (float *)p.sink;
  arena_poison(&a);
  TC_FAILS(dsa_ref_pad_heads(&q), DSA_ERROR_INVALID_ARGUMENT, "sink_out");
  TC_FAILS(dsa_pad_heads(NULL, &q, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps sink");
  arena_expect_untouched(&a, "dsa_pad_heads");
  q = p, q.sink_out = (float *)at(p.q_out, 64);
  TC_FAILS(dsa_pad_heads(NULL, &q, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps q_out");
  q = p, q.sink_out = (float *)p.q;
  TC_FAILS(dsa_pad_heads(NULL, &q, 0), DSA_ERROR_INVALID_ARGUMENT, "overlaps q");
  q = p, q.sink = (const float *)at(p.q_out, 128);
  TC_FAILS(dsa_pad_heads(NULL, &q, 0), DSA_ERROR_INVALID_ARGUMENT, "q_out");
  /* with no tokens the sink is still copied: sink_out on sink is rejected there too */
  q = p, q.num_tokens = 0, q.sink_out = (float *)p.sink;
  TC_FAILS(dsa_ref_pad_heads(&q), DSA_ERROR_INVALID_ARGUMENT, "overlaps sink");
  free(a.base);
}
