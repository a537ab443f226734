/* test_validation.c - the argument checks of top-k, the indexer and sparse attention fwd/bwd
 * (src/validate.c), through the CPU reference AND the public GPU entry points with ctx = NULL:
 * params are checked before the context, so each bad argument gets its own message, and valid
 * params with a NULL ctx get a message naming ctx. Every failed call must leave the (poisoned)
 * outputs and the workspace size untouched. CPU only: no device is ever touched. */
#include <limits.h>
#include "test_common.h"

static void *val_alloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  cr_assert_not_null(p);
  memset(p, 0, bytes);
  return p;
}
/* A pointer `bytes` past p, for misalignment tests (never dereferenced). */
static void *off(const void *p, size_t bytes) { return (void *)((const char *)p + bytes); }

/* ---- outputs are poisoned before every call and must be unchanged after a failed one ---- */
typedef struct {
  void *ptr[5];
  size_t bytes[5];
  int n;
} outputs;
static void out_add(outputs *o, void *p, size_t bytes) {
  o->ptr[o->n] = p;
  o->bytes[o->n++] = bytes;
}
static void out_poison(const outputs *o) {
  for (int i = 0; i < o->n; ++i) memset(o->ptr[i], 0xA5, o->bytes[i]);
}
static void out_expect_poisoned(const outputs *o, const char *call) {
  for (int i = 0; i < o->n; ++i)
    for (size_t b = 0; b < o->bytes[i]; ++b)
      cr_assert_eq(((const unsigned char *)o->ptr[i])[b], 0xA5,
                   "%s: a failed call wrote output %d (byte %zu)", call, i, b);
}

/* One op: the reference and the GPU entry point (ctx = NULL), the latter with and without a
 * workspace where the op has the two-phase contract. */
typedef struct {
  const char *ref_name, *gpu_name;
  dsa_status (*ref)(const void *p);
  dsa_status (*gpu)(const void *p, int with_workspace, size_t *ws_bytes);
  int two_phase;
} op;

static void expect_prefix(const char *fn) {
  char want[64];
  snprintf(want, sizeof want, "%s: ", fn);
  cr_assert(strncmp(dsa_last_error_message(), want, strlen(want)) == 0,
            "message \"%s\" does not start with \"%s\"", dsa_last_error_message(), want);
}

static void expect_bad(const op *o, const void *p, const outputs *outs, const char *word) {
  out_poison(outs);
  TC_FAILS(o->ref(p), DSA_ERROR_INVALID_ARGUMENT, word);
  expect_prefix(o->ref_name);
  out_expect_poisoned(outs, o->ref_name);
  for (int w = o->two_phase ? 0 : 1; w < 2; ++w) {
    size_t ws = 777;
    TC_FAILS(o->gpu(p, w, &ws), DSA_ERROR_INVALID_ARGUMENT, word);
    expect_prefix(o->gpu_name);
    cr_assert_eq(ws, 777, "%s wrote the workspace size on failure", o->gpu_name);
    out_expect_poisoned(outs, o->gpu_name);
  }
}

/* Valid params: the reference succeeds, the GPU op fails on the NULL ctx (after the checks). */
static void expect_ok(const op *o, const void *p) {
  TC_OK(o->ref(p));
  size_t ws = (size_t)1 << 62;
  TC_FAILS(o->gpu(p, 1, &ws), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  expect_prefix(o->gpu_name);
}

/* =============================================================================================
 * top-k
 * =========================================================================================== */
static dsa_status topk_ref(const void *p) { return dsa_ref_topk((const dsa_topk_params *)p); }
static dsa_status topk_gpu(const void *p, int w, size_t *ws) {
  static char workspace[64];
  return dsa_topk(NULL, (const dsa_topk_params *)p, w ? workspace : NULL, ws, 0);
}
static const op TOPK = {"dsa_ref_topk", "dsa_topk", topk_ref, topk_gpu, 1};

typedef struct {
  float *scores;
  int32_t *lengths, *indices;
  dsa_topk_params p;
  outputs outs;
} topk_fix;

static void topk_init(topk_fix *f) {
  memset(f, 0, sizeof *f);
  f->scores = val_alloc(sizeof(float) * 3 * 10);
  f->lengths = val_alloc(sizeof(int32_t) * 3);
  f->indices = val_alloc(sizeof(int32_t) * 3 * 4);
  for (int i = 0; i < 30; ++i) f->scores[i] = (float)(i % 7);
  for (int i = 0; i < 3; ++i) f->lengths[i] = 5 + i;
  f->p.rows = 3;
  f->p.columns = 10;
  f->p.k = 4;
  f->p.scores = f->scores;
  f->p.lengths = f->lengths;
  f->p.indices = f->indices;
  out_add(&f->outs, f->indices, sizeof(int32_t) * 3 * 4);
}
static void topk_free(topk_fix *f) {
  free(f->scores);
  free(f->lengths);
  free(f->indices);
}

#define TOPK_CASE(word, ...)                 \
  do {                                       \
    topk_fix f;                              \
    topk_init(&f);                           \
    dsa_topk_params p = f.p;                 \
    __VA_ARGS__;                             \
    expect_bad(&TOPK, &p, &f.outs, word);    \
    topk_free(&f);                           \
  } while (0)

Test(validation_topk, null_params) {
  topk_fix f;
  topk_init(&f);
  expect_bad(&TOPK, NULL, &f.outs, "p is NULL");
  topk_free(&f);
}

Test(validation_topk, sizes) {
  TOPK_CASE("rows = -1", p.rows = -1);
  TOPK_CASE("rows = 2147483648", p.rows = (int64_t)INT32_MAX + 1);
  TOPK_CASE("columns = -1", p.columns = -1);
  TOPK_CASE("columns = 2147483648", p.columns = (int64_t)INT32_MAX + 1);
  TOPK_CASE("k = 0 is outside 1..2048", p.k = 0);
  TOPK_CASE("k = 2049", p.k = 2049);
  TOPK_CASE("k = -5", p.k = -5);
}

Test(validation_topk, strides) {
  TOPK_CASE("scores_stride = -1", p.scores_stride = -1);
  TOPK_CASE("scores_stride = 9", p.scores_stride = 9);
  TOPK_CASE("indices_stride = 3", p.indices_stride = 3);
  TOPK_CASE("indices_stride = -4", p.indices_stride = -4);
  TOPK_CASE("byte size of scores overflows",
            p.rows = INT32_MAX; p.scores_stride = INT64_MAX / 8);
  TOPK_CASE("byte size of indices overflows",
            p.rows = INT32_MAX; p.indices_stride = INT64_MAX / 16);
}

Test(validation_topk, pointers) {
  TOPK_CASE("scores is NULL", p.scores = NULL);
  TOPK_CASE("scores is not 4-byte aligned", p.scores = off(p.scores, 2));
  TOPK_CASE("lengths is not 4-byte aligned", p.lengths = off(p.lengths, 1));
  TOPK_CASE("indices is NULL", p.indices = NULL);
  TOPK_CASE("indices is not 4-byte aligned", p.indices = off(p.indices, 2));
}

Test(validation_topk, valid_and_zero_size) {
  topk_fix f;
  topk_init(&f);
  dsa_topk_params p = f.p;
  expect_ok(&TOPK, &p);
  p.lengths = NULL; /* optional */
  p.scores_stride = 10;
  p.indices_stride = 4;
  expect_ok(&TOPK, &p);
  p.columns = 0; /* no columns: scores may be NULL, rows are all -1 */
  p.scores = NULL;
  expect_ok(&TOPK, &p);
  dsa_topk_params z = {0};
  z.k = 1; /* no rows: every pointer may be NULL */
  expect_ok(&TOPK, &z);
  topk_free(&f);
}

/* =============================================================================================
 * indexer
 * =========================================================================================== */
static dsa_status idx_ref(const void *p) { return dsa_ref_indexer_topk((const dsa_indexer_params *)p); }
static dsa_status idx_gpu(const void *p, int w, size_t *ws) {
  static char workspace[64];
  return dsa_indexer_topk(NULL, (const dsa_indexer_params *)p, w ? workspace : NULL, ws, 0);
}
static const op INDEXER = {"dsa_ref_indexer_topk", "dsa_indexer_topk", idx_ref, idx_gpu, 1};

typedef struct {
  dsa_plan_view view;
  int32_t starts[3], causal[3];
  uint8_t valid[3];
  uint16_t *q, *k, *wb;
  float *wf;
  int32_t *indices, *lengths;
  dsa_indexer_params p;
  outputs outs;
} idx_fix;

/* T_q = 3 queries of one document of T_k = 4 keys, H_idx = 2, K = 2. */
static void idx_init(idx_fix *f) {
  memset(f, 0, sizeof *f);
  for (int t = 0; t < 3; ++t) {
    f->starts[t] = 0;
    f->causal[t] = t + 1;
    f->valid[t] = 1;
  }
  f->view.num_queries = 3;
  f->view.total_key_tokens = 4;
  f->view.num_segments = 1;
  f->view.num_valid = 3;
  f->view.max_seqlen_q = 3;
  f->view.max_seqlen_k = 3;
  f->view.all_rows_nonempty = 1;
  f->view.starts = f->starts;
  f->view.causal_lengths = f->causal;
  f->view.query_valid = f->valid;
  tc_view_complete(&f->view); /* the segment fields of contract section 5 */
  f->q = val_alloc(sizeof(uint16_t) * 3 * 2 * 128);
  f->k = val_alloc(sizeof(uint16_t) * 4 * 128);
  f->wf = val_alloc(sizeof(float) * 3 * 2);
  f->wb = val_alloc(sizeof(uint16_t) * 3 * 2);
  f->indices = val_alloc(sizeof(int32_t) * 3 * 2);
  f->lengths = val_alloc(sizeof(int32_t) * 3);
  f->p.plan = &f->view;
  f->p.num_heads = 2;
  f->p.topk = 2;
  f->p.index_q = f->q;
  f->p.index_k = f->k;
  f->p.weights = f->wf;
  f->p.weights_dtype = DSA_DTYPE_F32;
  f->p.indices = f->indices;
  f->p.lengths = f->lengths;
  f->p.engine = DSA_INDEXER_ENGINE_DEFAULT;
  out_add(&f->outs, f->indices, sizeof(int32_t) * 3 * 2);
  out_add(&f->outs, f->lengths, sizeof(int32_t) * 3);
}
static void idx_free(idx_fix *f) {
  free(f->q);
  free(f->k);
  free(f->wf);
  free(f->wb);
  free(f->indices);
  free(f->lengths);
}

#define IDX_CASE(word, ...)                     \
  do {                                          \
    idx_fix f;                                  \
    idx_init(&f);                               \
    dsa_indexer_params p = f.p;                 \
    __VA_ARGS__;                                \
    expect_bad(&INDEXER, &p, &f.outs, word);    \
    idx_free(&f);                               \
  } while (0)

Test(validation_indexer, null_params_and_plan) {
  idx_fix f;
  idx_init(&f);
  expect_bad(&INDEXER, NULL, &f.outs, "p is NULL");
  idx_free(&f);
  IDX_CASE("plan is NULL", p.plan = NULL);
  IDX_CASE("plan->num_queries = -1", f.view.num_queries = -1);
  IDX_CASE("plan->num_queries = 2147483648", f.view.num_queries = (int64_t)INT32_MAX + 1);
  IDX_CASE("plan->total_key_tokens = -1", f.view.total_key_tokens = -1);
  IDX_CASE("plan->total_key_tokens = 2147483647", f.view.total_key_tokens = INT32_MAX);
  IDX_CASE("plan->starts is NULL", f.view.starts = NULL);
  IDX_CASE("plan->causal_lengths is NULL", f.view.causal_lengths = NULL);
}

/* Contract section 5: the view's scalars and arrays, each named in the message; nothing written. */
Test(validation_indexer, plan_view_section_5) {
  static const int64_t vri[3] = {0, 1, 2};
  static const int64_t ksi[4] = {0, 1, 2, 3};
  IDX_CASE("plan->all_rows_nonempty = 2 is not 0 or 1", f.view.all_rows_nonempty = 2);
  IDX_CASE("plan->all_rows_nonempty = -1 is not 0 or 1", f.view.all_rows_nonempty = -1);
  IDX_CASE("plan->max_seqlen_k = 0 is outside 1..4", f.view.max_seqlen_k = 0);
  IDX_CASE("plan->max_seqlen_k = -5 is outside 1..4", f.view.max_seqlen_k = -5);
  IDX_CASE("plan->max_seqlen_k = 5 is outside 1..4", f.view.max_seqlen_k = 5);
  IDX_CASE("plan->max_seqlen_q = 0 is outside 1..3", f.view.max_seqlen_q = 0);
  IDX_CASE("plan->max_seqlen_q = 4 is outside 1..3", f.view.max_seqlen_q = 4);
  IDX_CASE("plan->num_segments = 0 is outside 1..3", f.view.num_segments = 0);
  IDX_CASE("plan->num_segments = 4 is outside 1..3", f.view.num_segments = 4);
  IDX_CASE("plan->query_valid is NULL", f.view.query_valid = NULL);
  IDX_CASE("plan->segment_cu_q is NULL", f.view.segment_cu_q = NULL);
  IDX_CASE("plan->segment_cu_k is NULL", f.view.segment_cu_k = NULL);
  IDX_CASE("plan->q_causal_offsets is NULL", f.view.q_causal_offsets = NULL);
  IDX_CASE("plan->valid_row_indices is set although plan->all_rows_nonempty = 1",
           f.view.valid_row_indices = vri);
  IDX_CASE("plan->num_valid = 2 differs from plan->num_queries = 3", f.view.num_valid = 2);
  IDX_CASE("plan->valid_row_indices is NULL although plan->all_rows_nonempty = 0",
           f.view.all_rows_nonempty = 0);
  IDX_CASE("plan->num_valid = 3 is outside 0..2", f.view.all_rows_nonempty = 0;
           f.view.valid_row_indices = vri);
  IDX_CASE("plan->key_source_indices is NULL but plan->num_key_sources = 4",
           f.view.num_key_sources = 4);
  IDX_CASE("plan->key_source_indices is set but plan->num_key_sources = 0",
           f.view.key_source_indices = ksi);
  IDX_CASE("plan->num_key_sources = -1 is negative", f.view.num_key_sources = -1);
  IDX_CASE("plan->query_start = 2 with plan->num_queries = 3", f.view.query_start = 2);
  IDX_CASE("plan->query_start = -1", f.view.query_start = -1);
  IDX_CASE("plan->total_key_tokens = 0 with plan->num_queries = 3", f.view.total_key_tokens = 0);
  /* the consistent variants are accepted */
  idx_fix f;
  idx_init(&f);
  dsa_indexer_params p = f.p;
  f.view.query_start = 1; /* rows 1..3 of 4 keys */
  f.view.num_key_sources = 4;
  f.view.key_source_indices = ksi;
  expect_ok(&INDEXER, &p);
  f.view.all_rows_nonempty = 0; /* one query invalid */
  f.view.num_valid = 2;
  f.view.valid_row_indices = vri;
  f.valid[1] = 0;
  f.causal[1] = 0;
  expect_ok(&INDEXER, &p);
  /* zero queries: only the scalars' ranges and all_rows_nonempty matter */
  dsa_plan_view z = {0};
  z.total_key_tokens = 9;
  p.plan = &z;
  expect_ok(&INDEXER, &p);
  z.all_rows_nonempty = 3;
  out_poison(&f.outs);
  TC_FAILS(dsa_ref_indexer_topk(&p), DSA_ERROR_INVALID_ARGUMENT, "plan->all_rows_nonempty = 3");
  idx_free(&f);
}

Test(validation_indexer, scalars) {
  IDX_CASE("num_heads = 0 is outside 1..64", p.num_heads = 0);
  IDX_CASE("num_heads = 65", p.num_heads = 65);
  IDX_CASE("topk = 0 is outside 1..2048", p.topk = 0);
  IDX_CASE("topk = 2049", p.topk = 2049);
  IDX_CASE("weights_dtype = 2", p.weights_dtype = (dsa_dtype)2);
  IDX_CASE("weights_dtype = -1", p.weights_dtype = (dsa_dtype)-1);
  IDX_CASE("engine = 3", p.engine = (dsa_indexer_engine)3);
}

Test(validation_indexer, strides) {
  IDX_CASE("q_stride_head = 64", p.q_stride_head = 64);
  IDX_CASE("q_stride_head = -128", p.q_stride_head = -128);
  IDX_CASE("q_stride_token = 128", p.q_stride_token = 128);   /* heads overlap */
  IDX_CASE("q_stride_token = -1", p.q_stride_token = -1);
  IDX_CASE("q_stride_token = 260 is not a multiple of 8", p.q_stride_token = 260);
  IDX_CASE("q_stride_head = 132 is not a multiple of 8", p.q_stride_head = 132;
           p.q_stride_token = 264);
  /* token-inner layout whose head stride does not clear all tokens */
  IDX_CASE("q_stride_head = 256", p.q_stride_token = 128; p.q_stride_head = 256);
  IDX_CASE("k_stride = 100", p.k_stride = 100);
  IDX_CASE("k_stride = 132 is not a multiple of 8", p.k_stride = 132);
  IDX_CASE("weights_stride = 1", p.weights_stride = 1);
  IDX_CASE("weights_stride = -2", p.weights_stride = -2);
  IDX_CASE("indices_stride = 1", p.indices_stride = 1);
  IDX_CASE("byte size of weights overflows", f.view.num_queries = f.view.num_valid = INT32_MAX - 1;
           f.view.total_key_tokens = INT32_MAX - 1; p.weights_stride = INT64_MAX / 4);
  IDX_CASE("byte size of index_k overflows", f.view.total_key_tokens = INT32_MAX - 1;
           p.k_stride = INT64_MAX / 8 / 8 * 8);
}

Test(validation_indexer, pointers) {
  IDX_CASE("index_q is NULL", p.index_q = NULL);
  IDX_CASE("index_q is not 16-byte aligned", p.index_q = off(p.index_q, 8));
  IDX_CASE("index_k is NULL", p.index_k = NULL);
  IDX_CASE("index_k is not 16-byte aligned", p.index_k = off(p.index_k, 2));
  IDX_CASE("weights is NULL", p.weights = NULL);
  IDX_CASE("weights is not 4-byte aligned", p.weights = off(p.weights, 2));
  IDX_CASE("weights is not 2-byte aligned", p.weights_dtype = DSA_DTYPE_BF16;
           p.weights = off(f.wb, 1));
  IDX_CASE("indices is NULL", p.indices = NULL);
  IDX_CASE("indices is not 4-byte aligned", p.indices = off(p.indices, 2));
  IDX_CASE("lengths is NULL", p.lengths = NULL);
  IDX_CASE("lengths is not 4-byte aligned", p.lengths = off(p.lengths, 1));
}

Test(validation_indexer, valid_and_zero_size) {
  idx_fix f;
  idx_init(&f);
  dsa_indexer_params p = f.p;
  expect_ok(&INDEXER, &p);
  p.weights_dtype = DSA_DTYPE_BF16;
  p.weights = off(f.wb, 2); /* bf16 weights need 2-byte alignment only */
  p.engine = DSA_INDEXER_ENGINE_CUBLAS;
  expect_ok(&INDEXER, &p);
  p = f.p;
  p.q_stride_token = 128; /* token-inner q: head stride clears all 3 tokens */
  p.q_stride_head = 384;
  p.k_stride = 128;
  p.weights_stride = 2;
  p.indices_stride = 2;
  expect_ok(&INDEXER, &p);
  /* no queries: every pointer but the plan may be NULL */
  dsa_indexer_params z = {0};
  f.view.num_queries = 0;
  f.view.starts = NULL;
  f.view.causal_lengths = NULL;
  z.plan = &f.view;
  z.num_heads = 1;
  z.topk = 1;
  expect_ok(&INDEXER, &z);
  /* zero-size work leaves query_start unchecked: the size query must do no arithmetic on it (the
   * fuzzer found K - query_start overflowing at INT64_MIN; the ASan / UBSan build runs this) */
  static const int64_t extremes[] = {INT64_MIN, -1, INT64_MAX};
  for (int i = 0; i < 3; ++i) {
    f.view.query_start = extremes[i];
    size_t bytes = 0;
    TC_OK(dsa_indexer_topk(NULL, &z, NULL, &bytes, 0));
    cr_assert(bytes >= 1, "query_start %lld: size %zu", (long long)extremes[i], bytes);
  }
  idx_free(&f);
}

/* =============================================================================================
 * attention forward
 * =========================================================================================== */
static dsa_status fwd_ref(const void *p) {
  return dsa_ref_sparse_attn_fwd((const dsa_attn_fwd_params *)p);
}
static dsa_status fwd_gpu(const void *p, int w, size_t *ws) {
  return dsa_sparse_attn_fwd(NULL, (const dsa_attn_fwd_params *)p, 0);
}
static const op FWD = {"dsa_ref_sparse_attn_fwd", "dsa_sparse_attn_fwd", fwd_ref, fwd_gpu, 0};

/* T = 2, H = 2, D = 576, T_kv = 5, K = 3; buffers large enough for a token-inner q. */
typedef struct {
  uint16_t *q, *kv, *out, *dout, *dq, *dkv;
  int32_t *idx, *len;
  float *sink, *lse, *mx, *dsink, *tgt;
  dsa_attn_fwd_params p;
  dsa_attn_bwd_params b;
  outputs outs, bouts;
} attn_fix;

static void attn_fix_init(attn_fix *f) {
  memset(f, 0, sizeof *f);
  f->q = val_alloc(sizeof(uint16_t) * 2 * 2 * 576);
  f->kv = val_alloc(sizeof(uint16_t) * 5 * 576);
  f->out = val_alloc(sizeof(uint16_t) * 2 * 2 * 512);
  f->dout = val_alloc(sizeof(uint16_t) * 2 * 2 * 512);
  f->dq = val_alloc(sizeof(uint16_t) * 2 * 2 * 576);
  f->dkv = val_alloc(sizeof(uint16_t) * 5 * 576);
  f->idx = val_alloc(sizeof(int32_t) * 2 * 3);
  f->len = val_alloc(sizeof(int32_t) * 2);
  f->sink = val_alloc(sizeof(float) * 2);
  f->lse = val_alloc(sizeof(float) * 4);
  f->mx = val_alloc(sizeof(float) * 4);
  f->dsink = val_alloc(sizeof(float) * 2);
  f->tgt = val_alloc(sizeof(float) * 2 * 8); /* the backward's slot target: 2 rows of stride <= 8 */
  for (int i = 0; i < 6; ++i) f->idx[i] = i % 5;
  f->len[0] = 3;
  f->len[1] = 2;
  dsa_attn_fwd_params *p = &f->p;
  p->num_tokens = 2;
  p->num_heads = 2;
  p->head_dim = 576;
  p->num_kv = 5;
  p->topk = 3;
  p->softmax_scale = 0.0416666f;
  p->q = f->q;
  p->kv = f->kv;
  p->indices = f->idx;
  p->topk_length = f->len;
  p->sink = f->sink;
  p->out = f->out;
  p->lse = f->lse;
  p->max_logits = f->mx;
  out_add(&f->outs, f->out, sizeof(uint16_t) * 2 * 2 * 512);
  out_add(&f->outs, f->lse, sizeof(float) * 4);
  out_add(&f->outs, f->mx, sizeof(float) * 4);
  dsa_attn_bwd_params *b = &f->b;
  b->num_tokens = 2;
  b->num_heads = 2;
  b->head_dim = 576;
  b->num_kv = 5;
  b->topk = 3;
  b->softmax_scale = 0.0416666f;
  b->q = f->q;
  b->kv = f->kv;
  b->indices = f->idx;
  b->topk_length = f->len;
  b->sink = f->sink;
  b->out = f->out;
  b->dout = f->dout;
  b->lse = f->lse; /* zeros: finite */
  b->dq = f->dq;
  b->dkv = f->dkv;
  b->dsink = f->dsink;
  out_add(&f->bouts, f->dq, sizeof(uint16_t) * 2 * 2 * 576);
  out_add(&f->bouts, f->dkv, sizeof(uint16_t) * 5 * 576);
  out_add(&f->bouts, f->dsink, sizeof(float) * 2);
  out_add(&f->bouts, f->tgt, sizeof(float) * 2 * 8);
}
static void attn_fix_free(attn_fix *f) {
  free(f->q);
  free(f->kv);
  free(f->out);
  free(f->dout);
  free(f->dq);
  free(f->dkv);
  free(f->idx);
  free(f->len);
  free(f->sink);
  free(f->lse);
  free(f->mx);
  free(f->dsink);
  free(f->tgt);
}

#define FWD_CASE(word, ...)                  \
  do {                                       \
    attn_fix f;                              \
    attn_fix_init(&f);                       \
    dsa_attn_fwd_params p = f.p;             \
    __VA_ARGS__;                             \
    expect_bad(&FWD, &p, &f.outs, word);     \
    attn_fix_free(&f);                       \
  } while (0)

Test(validation_attn_fwd, null_params) {
  attn_fix f;
  attn_fix_init(&f);
  expect_bad(&FWD, NULL, &f.outs, "p is NULL");
  attn_fix_free(&f);
}

Test(validation_attn_fwd, scalars) {
  FWD_CASE("num_tokens = -1", p.num_tokens = -1);
  FWD_CASE("num_tokens = 2147483648", p.num_tokens = (int64_t)INT32_MAX + 1);
  FWD_CASE("num_heads = 0 is outside 1..128", p.num_heads = 0);
  FWD_CASE("num_heads = 129", p.num_heads = 129);
  FWD_CASE("head_dim = 128 is not 576 or 512", p.head_dim = 128);
  FWD_CASE("head_dim = 575", p.head_dim = 575);
  FWD_CASE("num_kv = -1", p.num_kv = -1);
  FWD_CASE("num_kv = 2147483647", p.num_kv = INT32_MAX);
  FWD_CASE("topk = 0 is outside 1..4096", p.topk = 0);
  FWD_CASE("topk = 4097", p.topk = 4097);
  FWD_CASE("softmax_scale = 0", p.softmax_scale = 0.0f);
  FWD_CASE("softmax_scale = -1", p.softmax_scale = -1.0f);
  FWD_CASE("softmax_scale", p.softmax_scale = NAN);
  FWD_CASE("softmax_scale = inf", p.softmax_scale = INFINITY);
}

Test(validation_attn_fwd, strides) {
  FWD_CASE("q_stride_head = 500", p.q_stride_head = 500);
  FWD_CASE("q_stride_head = -576", p.q_stride_head = -576);
  FWD_CASE("q_stride_token = 576", p.q_stride_token = 576); /* the two heads overlap */
  FWD_CASE("q_stride_token = -8", p.q_stride_token = -8);
  FWD_CASE("q_stride_token = 1156 is not a multiple of 8", p.q_stride_token = 1156);
  FWD_CASE("q_stride_head = 580 is not a multiple of 8", p.q_stride_head = 580;
           p.q_stride_token = 1160);
  FWD_CASE("q_stride_head = 1024", p.q_stride_token = 576; p.q_stride_head = 1024);
  FWD_CASE("kv_stride = 100", p.kv_stride = 100);
  FWD_CASE("kv_stride = -1", p.kv_stride = -1);
  FWD_CASE("kv_stride = 580 is not a multiple of 8", p.kv_stride = 580);
  FWD_CASE("indices_stride = 2", p.indices_stride = 2);
  FWD_CASE("indices_stride = -3", p.indices_stride = -3);
  FWD_CASE("out_stride_head = 256", p.out_stride_head = 256);
  FWD_CASE("out_stride_token = 512", p.out_stride_token = 512);
  FWD_CASE("out_stride_token = 1028 is not a multiple of 8", p.out_stride_token = 1028);
  FWD_CASE("byte size of q overflows", p.num_tokens = INT32_MAX;
           p.q_stride_token = INT64_MAX / 4 / 8 * 8);
  FWD_CASE("byte size of kv overflows", p.num_kv = INT32_MAX - 1;
           p.kv_stride = INT64_MAX / 8 / 8 * 8);
  FWD_CASE("byte size of indices overflows", p.num_tokens = INT32_MAX;
           p.indices_stride = INT64_MAX / 8);
}

Test(validation_attn_fwd, pointers) {
  FWD_CASE("q is NULL", p.q = NULL);
  FWD_CASE("q is not 16-byte aligned", p.q = off(p.q, 2));
  FWD_CASE("kv is NULL", p.kv = NULL);
  FWD_CASE("kv is not 16-byte aligned", p.kv = off(p.kv, 8));
  FWD_CASE("indices is NULL", p.indices = NULL);
  FWD_CASE("indices is not 4-byte aligned", p.indices = off(p.indices, 2));
  FWD_CASE("topk_length is not 4-byte aligned", p.topk_length = off(p.topk_length, 1));
  FWD_CASE("sink is not 4-byte aligned", p.sink = off(p.sink, 2));
  FWD_CASE("out is NULL", p.out = NULL);
  FWD_CASE("out is not 16-byte aligned", p.out = off(p.out, 4));
  FWD_CASE("lse is NULL", p.lse = NULL);
  FWD_CASE("lse is not 4-byte aligned", p.lse = off(p.lse, 2));
  FWD_CASE("max_logits is not 4-byte aligned", p.max_logits = off(p.max_logits, 1));
}

Test(validation_attn_fwd, valid_layouts_and_zero_size) {
  attn_fix f;
  attn_fix_init(&f);
  dsa_attn_fwd_params p = f.p;
  expect_ok(&FWD, &p);
  p.topk_length = NULL; /* the optional ones */
  p.sink = NULL;
  p.max_logits = NULL;
  expect_ok(&FWD, &p);
  p = f.p;
  p.q_stride_token = 576; /* token-inner ("head-major") q */
  p.q_stride_head = 2 * 576;
  p.out_stride_token = 512;
  p.out_stride_head = 1024;
  p.kv_stride = 576;
  p.indices_stride = 3;
  p.kv = off(f.kv, 16); /* any 16-byte aligned start; rows 0..3 only */
  p.num_kv = 4;
  expect_ok(&FWD, &p);
  p = f.p;
  p.head_dim = 512;
  expect_ok(&FWD, &p);
  p = f.p;
  p.num_kv = 0; /* no keys: kv may be NULL, every row empty */
  p.kv = NULL;
  expect_ok(&FWD, &p);
  dsa_attn_fwd_params z = {0}; /* no tokens: every pointer may be NULL */
  z.num_heads = 128;
  z.head_dim = 576;
  z.num_kv = 7;
  z.topk = 2048;
  z.softmax_scale = 1.0f;
  expect_ok(&FWD, &z);
  attn_fix_free(&f);
}

/* =============================================================================================
 * attention backward
 * =========================================================================================== */
static dsa_status bwd_ref(const void *p) {
  return dsa_ref_sparse_attn_bwd((const dsa_attn_bwd_params *)p);
}
static dsa_status bwd_gpu(const void *p, int w, size_t *ws) {
  static char workspace[64];
  return dsa_sparse_attn_bwd(NULL, (const dsa_attn_bwd_params *)p, w ? workspace : NULL, ws, 0);
}
static const op BWD = {"dsa_ref_sparse_attn_bwd", "dsa_sparse_attn_bwd", bwd_ref, bwd_gpu, 1};

#define BWD_CASE(word, ...)                  \
  do {                                       \
    attn_fix f;                              \
    attn_fix_init(&f);                       \
    dsa_attn_bwd_params p = f.b;             \
    __VA_ARGS__;                             \
    expect_bad(&BWD, &p, &f.bouts, word);    \
    attn_fix_free(&f);                       \
  } while (0)

Test(validation_attn_bwd, null_params) {
  attn_fix f;
  attn_fix_init(&f);
  expect_bad(&BWD, NULL, &f.bouts, "p is NULL");
  attn_fix_free(&f);
}

Test(validation_attn_bwd, scalars) {
  BWD_CASE("num_tokens = -1", p.num_tokens = -1);
  BWD_CASE("num_tokens = 2147483648", p.num_tokens = (int64_t)INT32_MAX + 1);
  BWD_CASE("num_heads = 0 is outside 1..128", p.num_heads = 0);
  BWD_CASE("num_heads = 129", p.num_heads = 129);
  BWD_CASE("head_dim = 64 is not 576 or 512", p.head_dim = 64);
  BWD_CASE("num_kv = -1", p.num_kv = -1);
  BWD_CASE("num_kv = 2147483647", p.num_kv = INT32_MAX);
  BWD_CASE("topk = 0 is outside 1..4096", p.topk = 0);
  BWD_CASE("topk = 4097", p.topk = 4097);
  BWD_CASE("softmax_scale = 0", p.softmax_scale = 0.0f);
  BWD_CASE("softmax_scale", p.softmax_scale = NAN);
  BWD_CASE("softmax_scale = -inf", p.softmax_scale = -INFINITY);
  BWD_CASE("deterministic = 2 is not 0 or 1", p.deterministic = 2);
  BWD_CASE("deterministic = 7 is not 0 or 1", p.deterministic = 7);
  BWD_CASE("deterministic = -1 is not 0 or 1", p.deterministic = -1);
}

Test(validation_attn_bwd, strides) {
  BWD_CASE("q_stride_head = 500", p.q_stride_head = 500);
  BWD_CASE("q_stride_token = 576", p.q_stride_token = 576);
  BWD_CASE("kv_stride = 580 is not a multiple of 8", p.kv_stride = 580);
  BWD_CASE("indices_stride = 1", p.indices_stride = 1);
  BWD_CASE("out_stride_head = 100", p.out_stride_head = 100);
  BWD_CASE("out_stride_token = -512", p.out_stride_token = -512);
  BWD_CASE("dout_stride_head = 100", p.dout_stride_head = 100);
  BWD_CASE("dout_stride_token = 520", p.dout_stride_token = 520);
  BWD_CASE("dout_stride_head = 516 is not a multiple of 8", p.dout_stride_head = 516;
           p.dout_stride_token = 1032);
  BWD_CASE("dq_stride_head = 500", p.dq_stride_head = 500);
  BWD_CASE("dq_stride_token = 1000", p.dq_stride_token = 1000);
  BWD_CASE("dq_stride_token = 1156 is not a multiple of 8", p.dq_stride_token = 1156);
  BWD_CASE("dq_stride_head = -1", p.dq_stride_head = -1);
  BWD_CASE("dkv_stride = 500", p.dkv_stride = 500);
  BWD_CASE("dkv_stride = 580 is not a multiple of 8", p.dkv_stride = 580);
  BWD_CASE("dkv_stride = -576", p.dkv_stride = -576);
  BWD_CASE("byte size of dkv overflows", p.num_kv = INT32_MAX - 1;
           p.dkv_stride = INT64_MAX / 8 / 8 * 8);
  BWD_CASE("byte size of dq overflows", p.num_tokens = INT32_MAX;
           p.dq_stride_token = INT64_MAX / 4 / 8 * 8);
}

Test(validation_attn_bwd, pointers) {
  BWD_CASE("q is NULL", p.q = NULL);
  BWD_CASE("q is not 16-byte aligned", p.q = off(p.q, 8));
  BWD_CASE("kv is NULL", p.kv = NULL);
  BWD_CASE("kv is not 16-byte aligned", p.kv = off(p.kv, 2));
  BWD_CASE("indices is NULL", p.indices = NULL);
  BWD_CASE("topk_length is not 4-byte aligned", p.topk_length = off(p.topk_length, 2));
  BWD_CASE("sink is not 4-byte aligned", p.sink = off(p.sink, 1));
  BWD_CASE("out is NULL", p.out = NULL);
  BWD_CASE("out is not 16-byte aligned", p.out = off(p.out, 2));
  BWD_CASE("dout is NULL", p.dout = NULL);
  BWD_CASE("dout is not 16-byte aligned", p.dout = off(p.dout, 8));
  BWD_CASE("lse is NULL", p.lse = NULL);
  BWD_CASE("lse is not 4-byte aligned", p.lse = off(p.lse, 2));
  BWD_CASE("dq is NULL", p.dq = NULL);
  BWD_CASE("dq is not 16-byte aligned", p.dq = off(p.dq, 4));
  BWD_CASE("dkv is NULL", p.dkv = NULL);
  BWD_CASE("dkv is not 16-byte aligned", p.dkv = off(p.dkv, 2));
  BWD_CASE("dsink is not 4-byte aligned", p.dsink = off(p.dsink, 2));
}

/* The optional slot target ([T, K] fp32, stride 0 = K): checked like every output when given. */
Test(validation_attn_bwd, slot_target) {
  BWD_CASE("slot_target_stride = 2 is below the row length 3", p.slot_target = f.tgt; p.slot_target_stride = 2);
  BWD_CASE("slot_target_stride = -3 is negative", p.slot_target = f.tgt; p.slot_target_stride = -3);
  BWD_CASE("slot_target is not 4-byte aligned", p.slot_target = off(f.tgt, 2));
  BWD_CASE("byte size of slot_target overflows", p.slot_target = f.tgt; p.slot_target_stride = INT64_MAX / 2);
  attn_fix f;
  attn_fix_init(&f);
  dsa_attn_bwd_params p = f.b;
  p.slot_target = f.tgt;
  expect_ok(&BWD, &p);
  p.slot_target_stride = 8;
  expect_ok(&BWD, &p);
  attn_fix_free(&f);
}

Test(validation_attn_bwd, valid_layouts_and_zero_size) {
  attn_fix f;
  attn_fix_init(&f);
  dsa_attn_bwd_params p = f.b;
  expect_ok(&BWD, &p);
  p.topk_length = NULL;
  p.sink = NULL;
  p.dsink = NULL;
  p.deterministic = 1;
  expect_ok(&BWD, &p);
  p = f.b;
  p.q_stride_token = 576; /* token-inner q and dq, explicit defaults elsewhere */
  p.q_stride_head = 1152;
  p.dq_stride_token = 576;
  p.dq_stride_head = 1152;
  p.out_stride_token = 1024;
  p.out_stride_head = 512;
  p.dout_stride_token = 512;
  p.dout_stride_head = 1024;
  p.kv_stride = 576;
  p.dkv_stride = 576;
  expect_ok(&BWD, &p);
  p = f.b;
  p.head_dim = 512;
  expect_ok(&BWD, &p);
  p = f.b;
  p.num_kv = 0; /* no keys: kv and dkv may be NULL */
  p.kv = NULL;
  p.dkv = NULL;
  expect_ok(&BWD, &p);
  dsa_attn_bwd_params z = {0}; /* no tokens: every pointer may be NULL */
  z.num_heads = 3;
  z.head_dim = 512;
  z.num_kv = 9;
  z.topk = 1;
  z.softmax_scale = 0.5f;
  expect_ok(&BWD, &z);
  attn_fix_free(&f);
}

/* The reference also reads the host plan's arrays: a window outside [0, T_k) is an error there
 * (the GPU op never reads the device view on the host, so this check is the reference's own). */
Test(validation_indexer, reference_checks_plan_windows) {
  idx_fix f;
  idx_init(&f);
  f.starts[2] = 2; /* keys [2, 5) with T_k = 4 */
  out_poison(&f.outs);
  TC_FAILS(dsa_ref_indexer_topk(&f.p), DSA_ERROR_INVALID_ARGUMENT, "plan row 2");
  out_expect_poisoned(&f.outs, "dsa_ref_indexer_topk");
  double sc[4];
  TC_FAILS(dsa_ref_indexer_scores(&f.p, 2, sc), DSA_ERROR_INVALID_ARGUMENT, "plan row 2");
  TC_OK(dsa_ref_indexer_scores(&f.p, 1, sc));
  TC_FAILS(dsa_ref_indexer_scores(&f.p, 3, sc), DSA_ERROR_INVALID_ARGUMENT, "row = 3");
  TC_FAILS(dsa_ref_indexer_scores(&f.p, -1, sc), DSA_ERROR_INVALID_ARGUMENT, "row = -1");
  TC_FAILS(dsa_ref_indexer_scores(&f.p, 1, NULL), DSA_ERROR_INVALID_ARGUMENT, "score_out");
  f.starts[2] = -1;
  TC_FAILS(dsa_ref_indexer_topk(&f.p), DSA_ERROR_INVALID_ARGUMENT, "plan row 2");
  idx_free(&f);
}
