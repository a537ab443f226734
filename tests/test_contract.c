/* test_contract.c - contract tests that test_validation.c, test_plan.c and test_compact.c do not
 * already make (docs/reliability.md lists what is covered where).
 *  - suite `contract` (CPU): sizes whose int32 products overflow are accepted or rejected with a
 *    message, the same way by the check and the entry point; every bf16 tensor of every op at
 *    every 1..15-byte misalignment; stride layouts at the edges of the overlap rules; the
 *    workspace size queries without a device; the thread-local message; NULL no-ops; the
 *    regression inputs the fuzzers found.
 *  - suite `gpu_contract` (needs a GPU): zero-size work records no launch and writes nothing; a
 *    workspace at a 1-byte offset; a whole layer (plan upload, indexer top-k, forward, backward
 *    deterministic) on a non-default stream and recorded into a CUDA graph, replayed twice,
 *    bitwise equal to the eager run on the default stream. */
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include "test_common.h"

/* A fake device address: never dereferenced (ctx = NULL stops every call after the checks).
 * Outputs must not overlap inputs (contract section 13.3), so fake outputs sit OUT(n) = n * 2^50
 * bytes above the inputs, past any input extent these tests use (< 2^49 bytes). */
#define FAKE(type, off) ((type)(uintptr_t)(0x7f0000000000ull + (off)))
#define OUT(n) ((uint64_t)(n) << 50)

/* A fake view of tq queries over tk keys that passes the section 5 checks (one segment, every
 * query valid); its arrays are fake addresses. */
static void fake_view(dsa_plan_view *v, int64_t tq, int64_t tk) {
  memset(v, 0, sizeof *v);
  v->num_queries = tq;
  v->total_key_tokens = tk;
  v->num_segments = 1;
  v->num_valid = tq;
  v->all_rows_nonempty = 1;
  v->max_seqlen_q = (int32_t)tq;
  v->max_seqlen_k = (int32_t)tk;
  v->starts = v->causal_lengths = v->segment_cu_q = v->segment_cu_k = v->q_causal_offsets =
      FAKE(const int32_t *, 0);
  v->query_valid = FAKE(const uint8_t *, 0);
}

static void *ct_alloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 64 + 63) / 64 * 64); /* 64 spare bytes for shifted starts */
  cr_assert_not_null(p);
  memset(p, 0, (bytes + 64 + 63) / 64 * 64);
  return p;
}

/* =============================================================================================
 * Sizes whose int32 products overflow: the checks compute in int64, so these are valid and the
 * call reaches the context (a NULL ctx is then the only error); where the int64 byte extent itself
 * overflows the call is rejected with a message. The reference is never called with fake pointers.
 * =========================================================================================== */
Test(contract, int32_product_sizes_reach_the_context) {
  /* attention: T * H * D = (2^31 - 1) * 128 * 576 overflows int32 (and T * H, T * K) */
  dsa_attn_fwd_params f = {0};
  f.num_tokens = INT32_MAX;
  f.num_heads = 128;
  f.head_dim = 576;
  f.num_kv = INT32_MAX - 1;
  f.topk = 2048;
  f.softmax_scale = 0.0625f;
  f.q = FAKE(const uint16_t *, 0);
  f.kv = FAKE(const uint16_t *, 0);
  f.indices = FAKE(const int32_t *, 0);
  f.out = FAKE(uint16_t *, OUT(1));
  f.lse = FAKE(float *, OUT(2));
  TC_FAILS(dsa_sparse_attn_fwd(NULL, &f, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_sparse_attn_fwd: ctx is NULL");

  dsa_attn_bwd_params b = {0};
  b.num_tokens = INT32_MAX;
  b.num_heads = 128;
  b.head_dim = 576;
  b.num_kv = INT32_MAX - 1;
  b.topk = 2048;
  b.softmax_scale = 0.0625f;
  b.q = b.kv = b.out = b.dout = FAKE(const uint16_t *, 0);
  b.indices = FAKE(const int32_t *, 0);
  b.lse = FAKE(const float *, 0);
  b.dq = FAKE(uint16_t *, OUT(1));
  b.dkv = FAKE(uint16_t *, OUT(2));
  char ws[16];
  size_t bytes = 777;
  TC_FAILS(dsa_sparse_attn_bwd(NULL, &b, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_sparse_attn_bwd: ctx is NULL");
  cr_assert_eq(bytes, 777);
  /* the non-deterministic size query needs no context: 3 fp32 [T, H] arrays and the fp32 dkv
   * accumulator, all without wrapping */
  TC_OK(dsa_sparse_attn_bwd(NULL, &b, NULL, &bytes, 0));
  const double th = (double)INT32_MAX * 128.0;
  cr_assert((double)bytes >= 3.0 * th * 4.0 + (double)(INT32_MAX - 1) * 576.0 * 4.0,
            "size %zu is below the [T, H] arrays + dkv accumulator", bytes);
  size_t again = 0;
  TC_OK(dsa_sparse_attn_bwd(NULL, &b, NULL, &again, 0));
  cr_assert_eq(again, bytes, "size query not stable");

  /* indexer: T_q * H_idx * 128 = (2^31 - 2) * 2^13 (the queries are rows of the T_k < 2^31 - 1 keys) */
  dsa_plan_view v;
  fake_view(&v, INT32_MAX - 1, INT32_MAX - 1);
  dsa_indexer_params ip = {0};
  ip.plan = &v;
  ip.num_heads = 64;
  ip.topk = 2048;
  ip.index_q = ip.index_k = FAKE(const uint16_t *, 0);
  ip.weights = FAKE(const void *, 0);
  ip.indices = FAKE(int32_t *, OUT(1));
  ip.lengths = FAKE(int32_t *, OUT(2));
  bytes = 777;
  TC_FAILS(dsa_indexer_topk(NULL, &ip, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_indexer_topk: ctx is NULL");
  cr_assert_eq(bytes, 777);
  TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &bytes, 0)); /* the size query needs no context */
  cr_assert_geq(bytes, 1);

  /* head padding: T * Hp * D = (2^31 - 1) * 1024 * 576 */
  dsa_pad_heads_params ph = {0};
  ph.num_tokens = INT32_MAX;
  ph.num_heads = 128;
  ph.padded_heads = 1024;
  ph.head_dim = 576;
  ph.q = FAKE(const uint16_t *, 0);
  ph.q_out = FAKE(uint16_t *, (uint64_t)1 << 49); /* past q's ~2^48-byte extent */
  TC_FAILS(dsa_pad_heads(NULL, &ph, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_pad_heads: ctx is NULL");

  /* compaction: rows * k = (2^31 - 1) * 2048 */
  dsa_compact_params cp = {0};
  cp.rows = INT32_MAX;
  cp.k = 2048;
  cp.key_count = INT32_MAX - 1;
  cp.indices = FAKE(const int32_t *, 0);
  cp.out = FAKE(int32_t *, 0); /* in place */
  TC_FAILS(dsa_compact_indices(NULL, &cp, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_compact_indices: ctx is NULL");

  /* top-k: rows * columns = (2^31 - 1) * 2^30 elements = 2^63 - 2^32 bytes: still fits int64 */
  dsa_topk_params tp = {0};
  tp.rows = INT32_MAX;
  tp.columns = (int64_t)1 << 30;
  tp.k = 2048;
  tp.scores = FAKE(const float *, 0);
  tp.indices = (int32_t *)(uintptr_t)0x10000; /* below the 2^63-byte scores: 2^44 bytes end well under */
  bytes = 777;
  TC_FAILS(dsa_topk(NULL, &tp, ws, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_topk: ctx is NULL");
  cr_assert_eq(bytes, 777);
  TC_OK(dsa_topk(NULL, &tp, NULL, &bytes, 0));
  cr_assert_eq(bytes, 1);
}

Test(contract, int64_byte_extent_overflow_is_rejected) {
  /* top-k: rows = columns = 2^31 - 1: (rows - 1) * columns + columns elements * 4 > 2^63 */
  dsa_topk_params tp = {0};
  tp.rows = INT32_MAX;
  tp.columns = INT32_MAX;
  tp.k = 1;
  tp.scores = FAKE(const float *, 0);
  tp.indices = FAKE(int32_t *, 0);
  size_t bytes = 777;
  TC_FAILS(dsa_topk(NULL, &tp, NULL, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "byte size of scores overflows");
  TC_FAILS(dsa_ref_topk(&tp), DSA_ERROR_INVALID_ARGUMENT, "byte size of scores overflows");
  cr_assert_eq(bytes, 777);
  /* attention: a head stride whose product with H overflows int64 is "rows overlap", not UB */
  dsa_attn_fwd_params f = {0};
  f.num_tokens = 2;
  f.num_heads = 128;
  f.head_dim = 576;
  f.num_kv = 4;
  f.topk = 1;
  f.softmax_scale = 1.0f;
  f.q_stride_head = INT64_MAX / 64 / 8 * 8; /* * 128 overflows */
  f.q_stride_token = INT64_MAX / 8 * 8;
  f.q = f.kv = FAKE(const uint16_t *, 0);
  f.indices = FAKE(const int32_t *, 0);
  f.out = FAKE(uint16_t *, 0);
  f.lse = FAKE(float *, 0);
  TC_FAILS(dsa_sparse_attn_fwd(NULL, &f, 0), DSA_ERROR_INVALID_ARGUMENT, "rows overlap");
  TC_FAILS(dsa_ref_sparse_attn_fwd(&f), DSA_ERROR_INVALID_ARGUMENT, "rows overlap");
  /* token-inner layout: q_stride_token * num_tokens overflows */
  f.num_tokens = INT32_MAX;
  f.q_stride_token = INT64_MAX / 1024 / 8 * 8;
  f.q_stride_head = INT64_MAX / 8 * 8;
  TC_FAILS(dsa_sparse_attn_fwd(NULL, &f, 0), DSA_ERROR_INVALID_ARGUMENT, "rows overlap");
  /* the indexer's q with the extent just past int64 */
  dsa_plan_view v;
  fake_view(&v, 2, 4);
  dsa_indexer_params ip = {0};
  ip.plan = &v;
  ip.num_heads = 1;
  ip.topk = 1;
  ip.q_stride_token = INT64_MAX / 2 / 8 * 8; /* (T - 1) * stride * 2 bytes > 2^63 */
  ip.index_q = ip.index_k = FAKE(const uint16_t *, 0);
  ip.weights = FAKE(const void *, 0);
  ip.indices = ip.lengths = FAKE(int32_t *, 0);
  bytes = 777;
  TC_FAILS(dsa_indexer_topk(NULL, &ip, NULL, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "byte size of index_q overflows");
}

/* =============================================================================================
 * Every bf16 tensor of every op at every misalignment 1..15 bytes: rejected (by the reference and
 * by the GPU entry point, before the context) with a message naming the tensor; 16 bytes off is
 * accepted. Real host buffers, so a check that let one through could not crash the reference.
 * =========================================================================================== */
typedef enum { OP_PAD, OP_IDX, OP_FWD, OP_BWD } op_kind;
typedef struct {
  op_kind op;
  const char *name; /* as the message spells it */
  size_t field;     /* offsetof the pointer in the params struct */
} bf16_field;

static const bf16_field BF16_FIELDS[] = {
    {OP_PAD, "q", offsetof(dsa_pad_heads_params, q)},
    {OP_PAD, "q_out", offsetof(dsa_pad_heads_params, q_out)},
    {OP_IDX, "index_q", offsetof(dsa_indexer_params, index_q)},
    {OP_IDX, "index_k", offsetof(dsa_indexer_params, index_k)},
    {OP_FWD, "q", offsetof(dsa_attn_fwd_params, q)},
    {OP_FWD, "kv", offsetof(dsa_attn_fwd_params, kv)},
    {OP_FWD, "out", offsetof(dsa_attn_fwd_params, out)},
    {OP_BWD, "q", offsetof(dsa_attn_bwd_params, q)},
    {OP_BWD, "kv", offsetof(dsa_attn_bwd_params, kv)},
    {OP_BWD, "out", offsetof(dsa_attn_bwd_params, out)},
    {OP_BWD, "dout", offsetof(dsa_attn_bwd_params, dout)},
    {OP_BWD, "dq", offsetof(dsa_attn_bwd_params, dq)},
    {OP_BWD, "dkv", offsetof(dsa_attn_bwd_params, dkv)},
};

/* Small valid problems of each op over real host buffers (T = 2, H = 2, T_kv = 3, K = 2). */
typedef struct {
  void *bufs[20];
  int n;
  int32_t starts[2], causal[2];
  uint8_t valid[2];
  dsa_plan_view view;
  dsa_pad_heads_params pad;
  dsa_indexer_params idx;
  dsa_attn_fwd_params fwd;
  dsa_attn_bwd_params bwd;
} problems;

static void *pb_alloc(problems *pb, size_t bytes) {
  void *p = ct_alloc(bytes);
  pb->bufs[pb->n++] = p;
  return p;
}
static void problems_init(problems *pb) {
  memset(pb, 0, sizeof *pb);
  pb->pad.num_tokens = 2;
  pb->pad.num_heads = 2;
  pb->pad.padded_heads = 4;
  pb->pad.head_dim = 64;
  pb->pad.q = pb_alloc(pb, 2 * 2 * 64 * 2);
  pb->pad.q_out = pb_alloc(pb, 2 * 4 * 64 * 2);

  for (int t = 0; t < 2; ++t) {
    pb->starts[t] = 0;
    pb->causal[t] = t + 1;
    pb->valid[t] = 1;
  }
  pb->view.num_queries = 2;
  pb->view.total_key_tokens = 3;
  pb->view.starts = pb->starts;
  pb->view.causal_lengths = pb->causal;
  pb->view.query_valid = pb->valid;
  tc_view_complete(&pb->view);
  pb->idx.plan = &pb->view;
  pb->idx.num_heads = 2;
  pb->idx.topk = 2;
  pb->idx.index_q = pb_alloc(pb, 2 * 2 * 128 * 2);
  pb->idx.index_k = pb_alloc(pb, 3 * 128 * 2);
  pb->idx.weights = pb_alloc(pb, 2 * 2 * 4);
  pb->idx.indices = pb_alloc(pb, 2 * 2 * 4);
  pb->idx.lengths = pb_alloc(pb, 2 * 4);

  dsa_attn_fwd_params *f = &pb->fwd;
  f->num_tokens = 2;
  f->num_heads = 2;
  f->head_dim = 576;
  f->num_kv = 3;
  f->topk = 2;
  f->softmax_scale = 0.0625f;
  f->q = pb_alloc(pb, 2 * 2 * 576 * 2);
  f->kv = pb_alloc(pb, 3 * 576 * 2);
  int32_t *ind = pb_alloc(pb, 2 * 2 * 4);
  ind[0] = 0, ind[1] = 2, ind[2] = 1, ind[3] = -1;
  f->indices = ind;
  f->out = pb_alloc(pb, 2 * 2 * 512 * 2);
  f->lse = pb_alloc(pb, 2 * 2 * 4);
  dsa_attn_bwd_params *b = &pb->bwd;
  b->num_tokens = 2;
  b->num_heads = 2;
  b->head_dim = 576;
  b->num_kv = 3;
  b->topk = 2;
  b->softmax_scale = 0.0625f;
  b->q = f->q;
  b->kv = f->kv;
  b->indices = f->indices;
  b->out = f->out;
  b->dout = pb_alloc(pb, 2 * 2 * 512 * 2);
  b->lse = f->lse;
  b->dq = pb_alloc(pb, 2 * 2 * 576 * 2);
  b->dkv = pb_alloc(pb, 3 * 576 * 2);
}
static void problems_free(problems *pb) {
  for (int i = 0; i < pb->n; ++i) free(pb->bufs[i]);
}

/* Runs the op of `kind` on params `p` through the reference and the GPU entry point (ctx NULL). */
static void run_both(op_kind kind, void *p, dsa_status *ref, char *ref_msg, dsa_status *gpu,
                     char *gpu_msg) {
  char ws[16];
  size_t bytes = 777;
  switch (kind) {
    case OP_PAD: *ref = dsa_ref_pad_heads(p); break;
    case OP_IDX: *ref = dsa_ref_indexer_topk(p); break;
    case OP_FWD: *ref = dsa_ref_sparse_attn_fwd(p); break;
    case OP_BWD: *ref = dsa_ref_sparse_attn_bwd(p); break;
  }
  snprintf(ref_msg, 256, "%s", *ref == DSA_SUCCESS ? "" : dsa_last_error_message());
  switch (kind) {
    case OP_PAD: *gpu = dsa_pad_heads(NULL, p, 0); break;
    case OP_IDX: *gpu = dsa_indexer_topk(NULL, p, ws, &bytes, 0); break;
    case OP_FWD: *gpu = dsa_sparse_attn_fwd(NULL, p, 0); break;
    case OP_BWD: *gpu = dsa_sparse_attn_bwd(NULL, p, ws, &bytes, 0); break;
  }
  snprintf(gpu_msg, 256, "%s", dsa_last_error_message());
  cr_assert_eq(bytes, 777, "a failed call wrote the workspace size");
}

Test(contract, every_bf16_tensor_at_every_misalignment) {
  problems pb;
  problems_init(&pb);
  for (size_t i = 0; i < sizeof BF16_FIELDS / sizeof BF16_FIELDS[0]; ++i) {
    const bf16_field *fd = &BF16_FIELDS[i];
    for (int off = 1; off <= 16; ++off) {
      union {
        dsa_pad_heads_params pad;
        dsa_indexer_params idx;
        dsa_attn_fwd_params fwd;
        dsa_attn_bwd_params bwd;
      } u;
      switch (fd->op) {
        case OP_PAD: u.pad = pb.pad; break;
        case OP_IDX: u.idx = pb.idx; break;
        case OP_FWD: u.fwd = pb.fwd; break;
        case OP_BWD: u.bwd = pb.bwd; break;
      }
      char *field = (char *)&u + fd->field, *ptr;
      memcpy(&ptr, field, sizeof ptr);
      ptr += off;
      memcpy(field, &ptr, sizeof ptr);
      dsa_status rs, gs;
      char rmsg[256], gmsg[256], want[64];
      run_both(fd->op, &u, &rs, rmsg, &gs, gmsg);
      if (off == 16) { /* aligned again: the reference runs, the GPU op stops at ctx */
        cr_assert_eq(rs, DSA_SUCCESS, "%s 16 bytes off: %s", fd->name, rmsg);
        cr_assert(gs == DSA_ERROR_INVALID_ARGUMENT && strstr(gmsg, "ctx is NULL"), "%s: %s",
                  fd->name, gmsg);
        continue;
      }
      snprintf(want, sizeof want, ": %s ", fd->name);
      cr_assert_eq(rs, DSA_ERROR_INVALID_ARGUMENT, "ref accepted %s %d bytes off", fd->name, off);
      cr_assert_eq(gs, DSA_ERROR_INVALID_ARGUMENT, "gpu op: %s %d bytes off", fd->name, off);
      cr_assert(strstr(rmsg, want) && strstr(rmsg, "16-byte aligned"),
                "%s %d bytes off: message \"%s\"", fd->name, off, rmsg);
      cr_assert(strstr(gmsg, want) && strstr(gmsg, "16-byte aligned"),
                "%s %d bytes off: message \"%s\"", fd->name, off, gmsg);
      cr_assert(strcmp(strchr(rmsg, ':'), strchr(gmsg, ':')) == 0,
                "reference and GPU op disagree: \"%s\" vs \"%s\"", rmsg, gmsg);
    }
  }
  /* bf16 indexer weights need 2 bytes only: odd offsets fail, even ones pass */
  for (int off = 1; off <= 8; ++off) {
    dsa_indexer_params p = pb.idx;
    p.weights_dtype = DSA_DTYPE_BF16;
    p.weights = (const char *)p.weights + off;
    dsa_status rs, gs;
    char rmsg[256], gmsg[256];
    run_both(OP_IDX, &p, &rs, rmsg, &gs, gmsg);
    if (off % 2) {
      cr_assert(rs == DSA_ERROR_INVALID_ARGUMENT && strstr(rmsg, "weights is not 2-byte aligned"), "%s", rmsg);
      cr_assert(gs == DSA_ERROR_INVALID_ARGUMENT && strstr(gmsg, "weights is not 2-byte aligned"), "%s", gmsg);
    } else {
      cr_assert_eq(rs, DSA_SUCCESS, "bf16 weights %d bytes off: %s", off, rmsg);
      cr_assert(strstr(gmsg, "ctx is NULL"), "%s", gmsg);
    }
  }
  problems_free(&pb);
}

/* =============================================================================================
 * Stride layouts at the edges of the no-overlap rule, accepted and rejected alike by the
 * reference and the GPU op.
 * =========================================================================================== */
static void expect_fwd(const dsa_attn_fwd_params *p, int ok, const char *word) {
  dsa_status rs, gs;
  char rmsg[256], gmsg[256];
  run_both(OP_FWD, (void *)p, &rs, rmsg, &gs, gmsg);
  if (ok) {
    cr_assert_eq(rs, DSA_SUCCESS, "expected acceptance: %s", rmsg);
    cr_assert(strstr(gmsg, "ctx is NULL"), "%s", gmsg);
  } else {
    cr_assert(rs == DSA_ERROR_INVALID_ARGUMENT && strstr(rmsg, word), "ref: \"%s\" lacks \"%s\"", rmsg, word);
    cr_assert(gs == DSA_ERROR_INVALID_ARGUMENT && strstr(gmsg, word), "gpu: \"%s\" lacks \"%s\"", gmsg, word);
  }
}

Test(contract, stride_layouts_at_the_overlap_edges) {
  problems pb;
  problems_init(&pb);
  dsa_attn_fwd_params p = pb.fwd;
  /* equal token and head strides: fine for one head, overlapping rows for two */
  p.num_heads = 1;
  p.q_stride_token = p.q_stride_head = 576;
  p.out_stride_token = p.out_stride_head = 512;
  expect_fwd(&p, 1, "");
  p = pb.fwd;
  p.q_stride_token = p.q_stride_head = 576;
  expect_fwd(&p, 0, "q_stride_token = 576 is below q_stride_head * num_heads");
  /* head-major at the exact minimum (heads of a token adjacent, tokens adjacent) */
  p = pb.fwd;
  p.q_stride_head = 576;
  p.q_stride_token = 1152;
  expect_fwd(&p, 1, "");
  /* token-inner at the exact minimum, one element short */
  p = pb.fwd;
  p.q_stride_token = 576;
  p.q_stride_head = 1152;
  expect_fwd(&p, 1, "");
  p.q_stride_head = 1144;
  expect_fwd(&p, 0, "q_stride_head = 1144 is below q_stride_token * num_tokens");
  /* one token: any token stride >= D is a token-inner layout and needs no head clearance */
  p = pb.fwd;
  p.num_tokens = 1;
  p.q_stride_token = 576;
  p.q_stride_head = 576 + 8;
  p.out_stride_token = 512;
  p.out_stride_head = 520;
  expect_fwd(&p, 1, "");
  /* the head stride below D although the token stride is larger */
  p = pb.fwd;
  p.q_stride_head = 568;
  p.q_stride_token = 4096;
  expect_fwd(&p, 0, "q_stride_head = 568 is below the row length 576");
  /* D = 512 with the 576-wide defaults explicitly given: valid (larger rows) */
  p = pb.fwd;
  p.head_dim = 512;
  p.q_stride_head = 576;
  p.q_stride_token = 1152;
  p.kv_stride = 576;
  expect_fwd(&p, 1, "");
  /* a stride of INT64_MAX rounded to 8: the extent check, not a wrap */
  p = pb.fwd;
  p.kv_stride = INT64_MAX / 8 * 8;
  expect_fwd(&p, 0, "byte size of kv overflows");
  problems_free(&pb);
}

/* =============================================================================================
 * Workspace size queries without a device (contract section 13.2): every op answers with
 * ctx = NULL. Top-k: 1 byte. The indexer: CUBLAS and FUSED their own size, DEFAULT the larger (the
 * cuBLAS one), each >= 1 and stable; a real call still needs the context. The backward's
 * non-deterministic size needs none (>= 1, stable, the same for explicit default strides); its
 * deterministic size needs a device (CUB's radix sort) and says so where there is none.
 * =========================================================================================== */
Test(contract, workspace_size_queries_without_a_context) {
  problems pb;
  problems_init(&pb);
  size_t bytes = 777;
  dsa_topk_params tp = {0};
  tp.rows = 2;
  tp.columns = 3;
  tp.k = 2;
  tp.scores = (const float *)pb.fwd.lse;
  tp.indices = (int32_t *)pb.idx.indices;
  TC_OK(dsa_topk(NULL, &tp, NULL, &bytes, 0));
  cr_assert_eq(bytes, 1, "top-k size %zu", bytes);
  char ws1[16];
  bytes = 777;
  TC_FAILS(dsa_topk(NULL, &tp, ws1, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_topk: ctx is NULL");
  cr_assert_eq(bytes, 777);
  TC_FAILS(dsa_topk(NULL, &tp, NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "workspace_bytes is NULL");
  {
    /* a window longer than K so that the engines' sizes differ (the cuBLAS one adds logits) */
    dsa_indexer_params ip = pb.idx;
    ip.topk = 1;
    size_t def = 0, cub = 0, fus = 0, again = 0;
    ip.engine = DSA_INDEXER_ENGINE_DEFAULT;
    TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &def, 0));
    TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &again, 0));
    cr_assert_eq(again, def, "indexer size query not stable");
    ip.engine = DSA_INDEXER_ENGINE_CUBLAS;
    TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &cub, 0));
    ip.engine = DSA_INDEXER_ENGINE_FUSED;
    TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &fus, 0));
    cr_assert(fus >= 1 && cub > fus && def == cub, "indexer sizes: default %zu, cublas %zu, fused %zu",
              def, cub, fus);
    bytes = 777;
    TC_FAILS(dsa_indexer_topk(NULL, &ip, ws1, &bytes, 0), DSA_ERROR_INVALID_ARGUMENT,
             "dsa_indexer_topk: ctx is NULL");
    cr_assert_eq(bytes, 777);
    TC_FAILS(dsa_indexer_topk(NULL, &ip, NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT,
             "workspace_bytes is NULL");
  }

  dsa_attn_bwd_params b = pb.bwd;
  size_t first = 0, again = 0, explicit_strides = 0;
  TC_OK(dsa_sparse_attn_bwd(NULL, &b, NULL, &first, 0));
  cr_assert_geq(first, 1);
  for (int i = 0; i < 3; ++i) {
    TC_OK(dsa_sparse_attn_bwd(NULL, &b, NULL, &again, 0));
    cr_assert_eq(again, first, "size query not stable");
  }
  b.q_stride_token = b.dq_stride_token = 2 * 576;
  b.q_stride_head = b.dq_stride_head = 576;
  b.kv_stride = b.dkv_stride = 576;
  b.out_stride_token = b.dout_stride_token = 1024;
  b.out_stride_head = b.dout_stride_head = 512;
  b.indices_stride = 2;
  TC_OK(dsa_sparse_attn_bwd(NULL, &b, NULL, &explicit_strides, 0));
  cr_assert_eq(explicit_strides, first, "explicit default strides change the size");
  TC_FAILS(dsa_sparse_attn_bwd(NULL, &b, NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "workspace_bytes is NULL");
  b = pb.bwd; /* zero-size work still has a size >= 1 */
  b.num_tokens = 0;
  TC_OK(dsa_sparse_attn_bwd(NULL, &b, NULL, &again, 0));
  cr_assert_geq(again, 1);
  b = pb.bwd;
  b.deterministic = 1;
  bytes = 777;
  dsa_status s = dsa_sparse_attn_bwd(NULL, &b, NULL, &bytes, 0);
  if (!tc_have_gpu()) {
    cr_assert_eq(s, DSA_ERROR_NO_DEVICE, "deterministic size without a device: %d (%s)", (int)s,
                 dsa_last_error_message());
    cr_assert(strstr(dsa_last_error_message(), "needs a CUDA device"), "%s", dsa_last_error_message());
    cr_assert_eq(bytes, 777);
  } else {
    cr_assert_eq(s, DSA_SUCCESS, "%s", dsa_last_error_message());
    cr_assert_geq(bytes, 1);
  }
  /* the plan upload's size query needs no context either */
  static const int32_t cu[] = {0, 3, 5};
  dsa_plan_desc d = {cu, NULL, 2, 5, 0, -1, NULL, 0};
  dsa_plan *plan = NULL;
  TC_OK(dsa_plan_create(&d, &plan));
  TC_OK(dsa_plan_upload(NULL, plan, NULL, &first, NULL, 0));
  TC_OK(dsa_plan_upload(NULL, plan, NULL, &again, NULL, 0));
  cr_assert(first >= 1 && again == first);
  dsa_plan_destroy(plan);
  problems_free(&pb);
}

/* =============================================================================================
 * Small API contracts: the message is thread-local; NULL destroys are no-ops; unknown statuses
 * have a string.
 * =========================================================================================== */
static void *other_thread(void *arg) {
  (void)arg;
  (void)dsa_sparse_attn_fwd(NULL, NULL, 0); /* "p is NULL" on this thread only */
  return strstr(dsa_last_error_message(), "p is NULL") ? (void *)1 : NULL;
}

Test(contract, message_is_thread_local_and_null_is_noop) {
  TC_FAILS(dsa_topk(NULL, NULL, NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "dsa_topk: p is NULL");
  pthread_t th;
  void *ret = NULL;
  cr_assert_eq(pthread_create(&th, NULL, other_thread, NULL), 0);
  cr_assert_eq(pthread_join(th, &ret), 0);
  cr_assert_not_null(ret, "the other thread did not see its own message");
  cr_assert(strncmp(dsa_last_error_message(), "dsa_topk: p is NULL", 19) == 0,
            "another thread's failure changed this thread's message: \"%s\"", dsa_last_error_message());
  dsa_plan_destroy(NULL);
  dsa_context_destroy(NULL);
  cr_assert_null(dsa_plan_host_view(NULL));
  TC_FAILS(dsa_context_device_info(NULL, NULL, NULL, NULL), DSA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  cr_assert_str_eq(dsa_status_string((dsa_status)-1), "unknown status");
  cr_assert_str_eq(dsa_status_string(DSA_STATUS_COUNT_), "unknown status");
}

/* =============================================================================================
 * gpu_contract
 * =========================================================================================== */
/* The ops run on a non-blocking stream, which is not ordered with the legacy default stream:
 * every setup copy / memset on the legacy stream is followed by a device synchronisation. */
typedef struct {
  dsa_context *ctx;
  cudaStream_t stream; /* non-blocking, not the default stream */
} gc_env;

static gc_env gc_open(void) {
  gc_env e;
  TC_OK(tc_context_create(&e.ctx)); /* under racecheck: the forward's checkable twin (test_common.h) */
  TC_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
  return e;
}
static void gc_close(gc_env *e) {
  TC_CUDA(cudaStreamSynchronize(e->stream));
  TC_CUDA(cudaStreamDestroy(e->stream));
  dsa_context_destroy(e->ctx);
}
static void *dev_poisoned(size_t bytes) {
  void *p = NULL;
  TC_CUDA(cudaMalloc(&p, bytes));
  TC_CUDA(cudaMemset(p, 0xA5, bytes));
  TC_CUDA(cudaDeviceSynchronize()); /* the legacy-stream memset is not ordered with e.stream */
  return p;
}
static void expect_dev_poisoned(const void *d, size_t bytes, const char *what) {
  unsigned char *h = malloc(bytes);
  TC_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < bytes; ++i) cr_assert_eq(h[i], 0xA5, "%s: byte %zu written", what, i);
  free(h);
}

/* Captures what `call` enqueues on e->stream and returns the graph's node count. */
#define NODES_OF(e, call, count)                                                        \
  do {                                                                                  \
    cudaGraph_t g_;                                                                     \
    size_t n_ = 0;                                                                      \
    TC_CUDA(cudaStreamBeginCapture((e)->stream, cudaStreamCaptureModeGlobal));          \
    dsa_status s_ = (call);                                                             \
    TC_CUDA(cudaStreamEndCapture((e)->stream, &g_));                                    \
    cr_assert_eq(s_, DSA_SUCCESS, "%s: %s", #call, dsa_last_error_message());           \
    TC_CUDA(cudaGraphGetNodes(g_, NULL, &n_));                                          \
    TC_CUDA(cudaGraphDestroy(g_));                                                      \
    *(count) = n_;                                                                      \
  } while (0)

Test(gpu_contract, zero_size_work_launches_nothing) {
  TC_REQUIRE_GPU();
  gc_env e = gc_open();
  size_t nodes = 99, bytes = 0;
  void *a = dev_poisoned(4096), *b = dev_poisoned(4096), *c = dev_poisoned(4096);
  void *ws = dev_poisoned(1 << 20);

  dsa_compact_params cp = {0};
  cp.k = 16;
  cp.key_count = 10;
  cp.indices = a;
  cp.out = b;
  cp.lengths = c;
  NODES_OF(&e, dsa_compact_indices(e.ctx, &cp, e.stream), &nodes);
  cr_assert_eq(nodes, 0, "compact rows = 0 recorded %zu nodes", nodes);

  dsa_pad_heads_params ph = {0};
  ph.num_heads = 3;
  ph.padded_heads = 8;
  ph.head_dim = 576;
  ph.q = a;
  ph.q_out = b;
  NODES_OF(&e, dsa_pad_heads(e.ctx, &ph, e.stream), &nodes);
  cr_assert_eq(nodes, 0, "pad_heads T = 0 recorded %zu nodes", nodes);

  dsa_topk_params tp = {0};
  tp.columns = 100;
  tp.k = 8;
  tp.scores = a;
  tp.indices = b;
  TC_OK(dsa_topk(e.ctx, &tp, NULL, &bytes, e.stream));
  cr_assert_geq(bytes, 1);
  NODES_OF(&e, dsa_topk(e.ctx, &tp, ws, &bytes, e.stream), &nodes);
  cr_assert_eq(nodes, 0, "topk rows = 0 recorded %zu nodes", nodes);

  dsa_plan_view v = {0};
  v.total_key_tokens = 100;
  dsa_indexer_params ip = {0};
  ip.plan = &v;
  ip.num_heads = 4;
  ip.topk = 8;
  ip.indices = b;
  ip.lengths = c;
  TC_OK(dsa_indexer_topk(e.ctx, &ip, NULL, &bytes, e.stream));
  cr_assert(bytes >= 1 && bytes <= (1 << 20), "indexer size %zu", bytes);
  NODES_OF(&e, dsa_indexer_topk(e.ctx, &ip, ws, &bytes, e.stream), &nodes);
  cr_assert_eq(nodes, 0, "indexer T_q = 0 recorded %zu nodes", nodes);

  dsa_attn_fwd_params f = {0};
  f.num_heads = 8;
  f.head_dim = 576;
  f.num_kv = 10;
  f.topk = 64;
  f.softmax_scale = 0.0625f;
  f.out = b;
  f.lse = c;
  NODES_OF(&e, dsa_sparse_attn_fwd(e.ctx, &f, e.stream), &nodes);
  cr_assert_eq(nodes, 0, "fwd T = 0 recorded %zu nodes", nodes);

  dsa_attn_bwd_params bw = {0};
  bw.num_heads = 8;
  bw.head_dim = 576;
  bw.num_kv = 0;
  bw.topk = 64;
  bw.softmax_scale = 0.0625f;
  bw.dq = b;
  for (int det = 0; det < 2; ++det) {
    bw.deterministic = det;
    TC_OK(dsa_sparse_attn_bwd(e.ctx, &bw, NULL, &bytes, e.stream));
    cr_assert(bytes >= 1 && bytes <= (1 << 20), "bwd size %zu", bytes);
    NODES_OF(&e, dsa_sparse_attn_bwd(e.ctx, &bw, ws, &bytes, e.stream), &nodes);
    cr_assert_eq(nodes, 0, "bwd T = T_kv = 0 (deterministic %d) recorded %zu nodes", det, nodes);
  }
  TC_CUDA(cudaStreamSynchronize(e.stream));
  expect_dev_poisoned(a, 4096, "zero-size input buffer");
  expect_dev_poisoned(b, 4096, "zero-size output buffer");
  expect_dev_poisoned(c, 4096, "zero-size output buffer");

  /* T = 0 with T_kv > 0 is not zero work: dkv [T_kv, D] and dsink are defined as 0 */
  bw.num_kv = 3;
  bw.dkv = a;
  bw.dsink = c;
  bw.deterministic = 0;
  TC_OK(dsa_sparse_attn_bwd(e.ctx, &bw, NULL, &bytes, e.stream));
  TC_OK(dsa_sparse_attn_bwd(e.ctx, &bw, ws, &bytes, e.stream));
  TC_CUDA(cudaStreamSynchronize(e.stream));
  uint16_t dkv[3 * 576];
  float dsink[8];
  TC_CUDA(cudaMemcpy(dkv, a, sizeof dkv, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(dsink, c, sizeof dsink, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 3 * 576; ++i) cr_assert_eq(dkv[i], 0, "T = 0: dkv[%d] = 0x%04x", i, dkv[i]);
  for (int h = 0; h < 8; ++h) cr_assert_eq(dsink[h], 0.0f, "T = 0: dsink[%d] = %g", h, dsink[h]);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(ws);
  gc_close(&e);
}

/* The workspace at a 1-byte offset (the queried size handed over exactly) gives bitwise the
 * aligned result for top-k and the indexer (the backward's own suite does the same); the plan
 * upload's buffer must be 16-byte aligned and says so. */
Test(gpu_contract, workspace_at_a_one_byte_offset) {
  TC_REQUIRE_GPU();
  gc_env e = gc_open();
  tc_rng r = tc_seed("gpu_contract.workspace_at_a_one_byte_offset");
  enum { ROWS = 37, COLS = 1000, K = 50 };
  float *hs = malloc(sizeof(float) * ROWS * COLS);
  tc_fill_f32(&r, hs, (size_t)ROWS * COLS, -1, 1);
  float *ds;
  int32_t *di;
  TC_CUDA(cudaMalloc((void **)&ds, sizeof(float) * ROWS * COLS));
  TC_CUDA(cudaMalloc((void **)&di, sizeof(int32_t) * ROWS * K * 2));
  TC_CUDA(cudaMemcpy(ds, hs, sizeof(float) * ROWS * COLS, cudaMemcpyHostToDevice));
  TC_CUDA(cudaDeviceSynchronize()); /* e.stream is non-blocking: order the setup copy first */
  dsa_topk_params tp = {0};
  tp.rows = ROWS;
  tp.columns = COLS;
  tp.k = K;
  tp.scores = ds;
  tp.indices = di;
  size_t need = 0;
  TC_OK(dsa_topk(e.ctx, &tp, NULL, &need, e.stream));
  unsigned char *ws;
  TC_CUDA(cudaMalloc((void **)&ws, need + 1));
  TC_OK(dsa_topk(e.ctx, &tp, ws, &need, e.stream));
  tp.indices = di + ROWS * K;
  TC_OK(dsa_topk(e.ctx, &tp, ws + 1, &need, e.stream));
  int32_t *h = malloc(sizeof(int32_t) * ROWS * K * 2);
  TC_CUDA(cudaStreamSynchronize(e.stream));
  TC_CUDA(cudaMemcpy(h, di, sizeof(int32_t) * ROWS * K * 2, cudaMemcpyDeviceToHost));
  cr_assert(memcmp(h, h + ROWS * K, sizeof(int32_t) * ROWS * K) == 0, "topk: 1-byte offset differs");
  cudaFree(ws);

  /* indexer: T = 700 in two documents, K = 64 (both engines) */
  static const int32_t cu[] = {0, 450, 700};
  dsa_plan_desc d = {cu, NULL, 2, 700, 0, -1, NULL, 0};
  dsa_plan *plan;
  TC_OK(dsa_plan_create(&d, &plan));
  size_t pbytes = 0;
  TC_OK(dsa_plan_upload(e.ctx, plan, NULL, &pbytes, NULL, e.stream));
  unsigned char *pbuf;
  dsa_plan_view dv;
  TC_CUDA(cudaMalloc((void **)&pbuf, pbytes + 16));
  TC_FAILS(dsa_plan_upload(e.ctx, plan, pbuf + 1, &pbytes, &dv, e.stream), DSA_ERROR_INVALID_ARGUMENT,
           "16-byte aligned");
  TC_OK(dsa_plan_upload(e.ctx, plan, pbuf, &pbytes, &dv, e.stream));
  const int T = 700, HI = 4;
  uint16_t *hq = malloc(2 * (size_t)T * HI * 128), *hk = malloc(2 * (size_t)T * 128);
  float *hw = malloc(4 * (size_t)T * HI);
  tc_fill_bf16(&r, hq, (size_t)T * HI * 128, -1, 1);
  tc_fill_bf16(&r, hk, (size_t)T * 128, -1, 1);
  tc_fill_f32(&r, hw, (size_t)T * HI, 0, 0.1);
  uint16_t *dq, *dk;
  float *dw;
  int32_t *dind, *dlen;
  TC_CUDA(cudaMalloc((void **)&dq, 2 * (size_t)T * HI * 128));
  TC_CUDA(cudaMalloc((void **)&dk, 2 * (size_t)T * 128));
  TC_CUDA(cudaMalloc((void **)&dw, 4 * (size_t)T * HI));
  TC_CUDA(cudaMalloc((void **)&dind, 4 * (size_t)T * 64 * 2));
  TC_CUDA(cudaMalloc((void **)&dlen, 4 * (size_t)T * 2));
  TC_CUDA(cudaMemcpy(dq, hq, 2 * (size_t)T * HI * 128, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(dk, hk, 2 * (size_t)T * 128, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(dw, hw, 4 * (size_t)T * HI, cudaMemcpyHostToDevice));
  TC_CUDA(cudaDeviceSynchronize());
  int32_t *hi = malloc(4 * (size_t)T * 64 * 2), *hl = malloc(4 * (size_t)T * 2);
  for (int en = 1; en <= 2; ++en) {
    if (en == DSA_INDEXER_ENGINE_CUBLAS && tc_sanitize_skips_cublas()) continue; /* test_common.h */
    dsa_indexer_params ip = {0};
    ip.plan = &dv;
    ip.num_heads = HI;
    ip.topk = 64;
    ip.index_q = dq;
    ip.index_k = dk;
    ip.weights = dw;
    ip.weights_dtype = DSA_DTYPE_F32;
    ip.engine = (dsa_indexer_engine)en;
    ip.indices = dind;
    ip.lengths = dlen;
    TC_OK(dsa_indexer_topk(e.ctx, &ip, NULL, &need, e.stream));
    TC_CUDA(cudaMalloc((void **)&ws, need + 1));
    TC_OK(dsa_indexer_topk(e.ctx, &ip, ws, &need, e.stream));
    ip.indices = dind + T * 64;
    ip.lengths = dlen + T;
    TC_OK(dsa_indexer_topk(e.ctx, &ip, ws + 1, &need, e.stream));
    TC_CUDA(cudaStreamSynchronize(e.stream));
    TC_CUDA(cudaMemcpy(hi, dind, 4 * (size_t)T * 64 * 2, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemcpy(hl, dlen, 4 * (size_t)T * 2, cudaMemcpyDeviceToHost));
    cr_assert(memcmp(hi, hi + T * 64, 4 * (size_t)T * 64) == 0, "indexer engine %d: 1-byte offset differs", en);
    cr_assert(memcmp(hl, hl + T, 4 * (size_t)T) == 0, "indexer engine %d: lengths differ", en);
    cudaFree(ws);
  }
  free(hs), free(h), free(hq), free(hk), free(hw), free(hi), free(hl);
  cudaFree(ds), cudaFree(di), cudaFree(pbuf), cudaFree(dq), cudaFree(dk), cudaFree(dw);
  cudaFree(dind), cudaFree(dlen);
  dsa_plan_destroy(plan);
  gc_close(&e);
}

/* ---- a whole layer in a CUDA graph ---------------------------------------------------------- */
enum { L_T = 300, L_H = 8, L_HI = 4, L_K = 64, L_D = 576, L_DV = 512 };

typedef struct {
  dsa_plan *plan;
  unsigned char *plan_buf, *ws_idx, *ws_bwd;
  size_t plan_bytes, idx_bytes, bwd_bytes;
  uint16_t *iq, *ik, *q, *kv, *dout, *out, *dq, *dkv;
  float *w, *sink, *lse, *mx, *dsink;
  int32_t *ind, *len;
} layer;

/* The outputs, in the order they are compared. */
#define LAYER_OUTPUTS(L, X)                                                        \
  X(L.ind, (size_t)L_T * L_K * 4) X(L.len, (size_t)L_T * 4)                        \
  X(L.out, (size_t)L_T * L_H * L_DV * 2) X(L.lse, (size_t)L_T * L_H * 4)           \
  X(L.mx, (size_t)L_T * L_H * 4) X(L.dq, (size_t)L_T * L_H * L_D * 2)              \
  X(L.dkv, (size_t)L_T * L_D * 2) X(L.dsink, (size_t)L_H * 4)

static void *dev_random_bf16(tc_rng *r, size_t n, double lo, double hi) {
  uint16_t *h = malloc(n * 2);
  void *d;
  tc_fill_bf16(r, h, n, lo, hi);
  TC_CUDA(cudaMalloc(&d, n * 2));
  TC_CUDA(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaDeviceSynchronize()); /* a pageable copy may still be in flight on return */
  free(h);
  return d;
}
static void *dev_random_f32(tc_rng *r, size_t n, double lo, double hi) {
  float *h = malloc(n * 4);
  void *d;
  tc_fill_f32(r, h, n, lo, hi);
  TC_CUDA(cudaMalloc(&d, n * 4));
  TC_CUDA(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
  TC_CUDA(cudaDeviceSynchronize());
  free(h);
  return d;
}

#define L_TRY(expr)                      \
  do {                                   \
    dsa_status l_s_ = (expr);            \
    if (l_s_ != DSA_SUCCESS) return l_s_; \
  } while (0)

/* plan upload -> indexer top-k -> forward (the indexer's indices and lengths) -> backward
 * (deterministic), all on `stream`. */
static dsa_status layer_run(dsa_context *ctx, layer *L, cudaStream_t stream) {
  dsa_plan_view dv;
  L_TRY(dsa_plan_upload(ctx, L->plan, L->plan_buf, &L->plan_bytes, &dv, stream));
  dsa_indexer_params ip = {0};
  ip.plan = &dv;
  ip.num_heads = L_HI;
  ip.topk = L_K;
  ip.index_q = L->iq;
  ip.index_k = L->ik;
  ip.weights = L->w;
  ip.weights_dtype = DSA_DTYPE_F32;
  ip.indices = L->ind;
  ip.lengths = L->len;
  size_t bytes = L->idx_bytes;
  L_TRY(dsa_indexer_topk(ctx, &ip, L->ws_idx, &bytes, stream));
  dsa_attn_fwd_params f = {0};
  f.num_tokens = L_T;
  f.num_heads = L_H;
  f.head_dim = L_D;
  f.num_kv = L_T;
  f.topk = L_K;
  f.softmax_scale = 0.0625f;
  f.q = L->q;
  f.kv = L->kv;
  f.indices = L->ind;
  f.topk_length = L->len;
  f.sink = L->sink;
  f.out = L->out;
  f.lse = L->lse;
  f.max_logits = L->mx;
  L_TRY(dsa_sparse_attn_fwd(ctx, &f, stream));
  dsa_attn_bwd_params b = {0};
  b.num_tokens = L_T;
  b.num_heads = L_H;
  b.head_dim = L_D;
  b.num_kv = L_T;
  b.topk = L_K;
  b.softmax_scale = 0.0625f;
  b.deterministic = 1;
  b.q = L->q;
  b.kv = L->kv;
  b.indices = L->ind;
  b.topk_length = L->len;
  b.sink = L->sink;
  b.out = L->out;
  b.dout = L->dout;
  b.lse = L->lse;
  b.dq = L->dq;
  b.dkv = L->dkv;
  b.dsink = L->dsink;
  if (L->ws_bwd == NULL) return dsa_sparse_attn_bwd(ctx, &b, NULL, &L->bwd_bytes, stream);
  bytes = L->bwd_bytes;
  return dsa_sparse_attn_bwd(ctx, &b, L->ws_bwd, &bytes, stream);
}

static void layer_poison(layer *L, cudaStream_t s) {
#define POISON_(p, n) TC_CUDA(cudaMemsetAsync(p, 0xA5, n, s));
  LAYER_OUTPUTS((*L), POISON_)
#undef POISON_
}
/* Copies every output into one host buffer (returns its size). */
static size_t layer_fetch(layer *L, unsigned char *h) {
  size_t at = 0;
#define FETCH_(p, n) TC_CUDA(cudaMemcpy(h + at, p, n, cudaMemcpyDeviceToHost)); at += n;
  LAYER_OUTPUTS((*L), FETCH_)
#undef FETCH_
  return at;
}

Test(gpu_contract, layer_in_a_cuda_graph_replays_bitwise, .timeout = 300) {
  TC_REQUIRE_GPU();
  gc_env e = gc_open();
  tc_rng r = tc_seed("gpu_contract.layer_in_a_cuda_graph_replays_bitwise");
  layer L;
  memset(&L, 0, sizeof L);
  static const int32_t cu[] = {0, 170, 300};
  dsa_plan_desc d = {cu, NULL, 2, L_T, 0, -1, NULL, 0};
  TC_OK(dsa_plan_create(&d, &L.plan));
  TC_OK(dsa_plan_upload(e.ctx, L.plan, NULL, &L.plan_bytes, NULL, e.stream));
  TC_CUDA(cudaMalloc((void **)&L.plan_buf, L.plan_bytes));
  L.iq = dev_random_bf16(&r, (size_t)L_T * L_HI * 128, -1, 1);
  L.ik = dev_random_bf16(&r, (size_t)L_T * 128, -1, 1);
  L.w = dev_random_f32(&r, (size_t)L_T * L_HI, -0.1, 0.1);
  L.q = dev_random_bf16(&r, (size_t)L_T * L_H * L_D, -1, 1);
  L.kv = dev_random_bf16(&r, (size_t)L_T * L_D, -1, 1);
  L.dout = dev_random_bf16(&r, (size_t)L_T * L_H * L_DV, -1, 1);
  L.sink = dev_random_f32(&r, L_H, -1, 1);
#define ALLOC_(p, n) TC_CUDA(cudaMalloc((void **)&p, n));
  LAYER_OUTPUTS(L, ALLOC_)
#undef ALLOC_
  { /* workspace sizes (the backward's comes from layer_run with ws_bwd = NULL) */
    dsa_plan_view dv;
    TC_OK(dsa_plan_upload(e.ctx, L.plan, L.plan_buf, &L.plan_bytes, &dv, e.stream));
    dsa_indexer_params ip = {0};
    ip.plan = &dv;
    ip.num_heads = L_HI;
    ip.topk = L_K;
    ip.index_q = L.iq;
    ip.index_k = L.ik;
    ip.weights = L.w;
    ip.indices = L.ind;
    ip.lengths = L.len;
    TC_OK(dsa_indexer_topk(e.ctx, &ip, NULL, &L.idx_bytes, e.stream));
    TC_CUDA(cudaMalloc((void **)&L.ws_idx, L.idx_bytes));
    TC_OK(layer_run(e.ctx, &L, e.stream));
    TC_CUDA(cudaStreamSynchronize(e.stream));
    TC_CUDA(cudaMalloc((void **)&L.ws_bwd, L.bwd_bytes));
  }
  size_t total = 0;
#define SUM_(p, n) total += n;
  LAYER_OUTPUTS(L, SUM_)
#undef SUM_
  unsigned char *eager = malloc(total), *other = malloc(total);

  /* eager on the legacy default stream */
  layer_poison(&L, 0);
  TC_OK(layer_run(e.ctx, &L, 0));
  TC_CUDA(cudaDeviceSynchronize());
  layer_fetch(&L, eager);
  /* sanity: lengths = min(K, causal length) (the op suites check the values themselves) */
  {
    const dsa_plan_view *hv = dsa_plan_host_view(L.plan);
    int32_t *len = (int32_t *)(eager + (size_t)L_T * L_K * 4);
    for (int t = 0; t < L_T; ++t) {
      const int32_t want = hv->causal_lengths[t] < L_K ? hv->causal_lengths[t] : L_K;
      cr_assert_eq(len[t], want, "lengths[%d] = %d, expected %d", t, len[t], want);
    }
  }
  /* eager on a non-default (non-blocking) stream: bitwise the same */
  layer_poison(&L, e.stream);
  TC_OK(layer_run(e.ctx, &L, e.stream));
  TC_CUDA(cudaStreamSynchronize(e.stream));
  layer_fetch(&L, other);
  cr_assert(memcmp(eager, other, total) == 0, "non-default stream differs from the default stream");

  /* capture (global mode: any allocation or synchronisation inside an op breaks the capture) */
  cudaGraph_t g;
  cudaGraphExec_t ge;
  TC_CUDA(cudaStreamSynchronize(e.stream));
  TC_CUDA(cudaStreamBeginCapture(e.stream, cudaStreamCaptureModeGlobal));
  dsa_status s = layer_run(e.ctx, &L, e.stream);
  cudaError_t ce = cudaStreamEndCapture(e.stream, &g);
  cr_assert_eq(s, DSA_SUCCESS, "layer inside capture: %s", dsa_last_error_message());
  cr_assert_eq(ce, cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorString(ce));
  TC_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 2; ++rep) {
    layer_poison(&L, e.stream);
    TC_CUDA(cudaGraphLaunch(ge, e.stream));
    TC_CUDA(cudaStreamSynchronize(e.stream));
    memset(other, 0, total);
    layer_fetch(&L, other);
    size_t at = 0;
#define CMP_(p, n)                                                                          \
  cr_assert(memcmp(eager + at, other + at, n) == 0, "replay %d: %s differs from eager", rep, #p); \
  at += n;
    LAYER_OUTPUTS(L, CMP_)
#undef CMP_
  }
  TC_CUDA(cudaGraphExecDestroy(ge));
  TC_CUDA(cudaGraphDestroy(g));
  free(eager);
  free(other);
#define FREE_(p, n) cudaFree(p);
  LAYER_OUTPUTS(L, FREE_)
#undef FREE_
  cudaFree(L.iq), cudaFree(L.ik), cudaFree(L.w), cudaFree(L.q), cudaFree(L.kv), cudaFree(L.dout);
  cudaFree(L.sink), cudaFree(L.plan_buf), cudaFree(L.ws_idx), cudaFree(L.ws_bwd);
  dsa_plan_destroy(L.plan);
  gc_close(&e);
}

/* =============================================================================================
 * Regressions found by the fuzzers (tests/fuzz/). Each keeps the input that failed.
 * =========================================================================================== */
/* fuzz_validate: dsa_sparse_attn_bwd with num_tokens = 0 still writes dkv (num_kv > 0)
 * and dsink (zeros), but src/validate.c checks no pointer for zero-token work, so a misaligned
 * dkv or dsink was accepted: the reference then stored to it misaligned (UBSan:
 * src/reference.c:502 "store to misaligned address ... for type 'float'"), and the GPU op would
 * launch its dkv / dsink kernels on it. The outputs a zero-size call writes must be checked. */
Test(contract, fuzz_regression_bwd_zero_tokens_checks_written_outputs) {
  problems pb;
  problems_init(&pb);
  dsa_attn_bwd_params b = pb.bwd;
  b.num_tokens = 0; /* T = 0, T_kv = 3: dkv [3, 576] and dsink [2] are written (zeros) */
  b.dsink = (float *)((char *)pb.fwd.lse + 1);
  dsa_status rs, gs;
  char rmsg[256], gmsg[256];
  memset(pb.fwd.lse, 0xA5, 16);
  run_both(OP_BWD, &b, &rs, rmsg, &gs, gmsg);
  cr_expect(rs == DSA_ERROR_INVALID_ARGUMENT && strstr(rmsg, "dsink is not 4-byte aligned"),
            "T = 0, dsink 1 byte off: reference returned %d (\"%s\")", (int)rs, rmsg);
  cr_expect(gs == DSA_ERROR_INVALID_ARGUMENT && strstr(gmsg, "dsink is not 4-byte aligned"),
            "T = 0, dsink 1 byte off: GPU op returned %d (\"%s\")", (int)gs, gmsg);
  for (int i = 0; i < 16; ++i)
    cr_expect_eq(((unsigned char *)pb.fwd.lse)[i], 0xA5, "a rejected call wrote dsink (byte %d)", i);
  b.dsink = NULL;
  b.dkv = (uint16_t *)((char *)b.dkv + 2);
  run_both(OP_BWD, &b, &rs, rmsg, &gs, gmsg);
  cr_expect(rs == DSA_ERROR_INVALID_ARGUMENT && strstr(rmsg, "dkv is not 16-byte aligned"),
            "T = 0, dkv 2 bytes off: reference returned %d (\"%s\")", (int)rs, rmsg);
  cr_expect(gs == DSA_ERROR_INVALID_ARGUMENT && strstr(gmsg, "dkv is not 16-byte aligned"),
            "T = 0, dkv 2 bytes off: GPU op returned %d (\"%s\")", (int)gs, gmsg);
  problems_free(&pb);
}
