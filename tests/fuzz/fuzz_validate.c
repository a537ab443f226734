/* fuzz_validate.c - libFuzzer harness of the argument checks of every op (src/validate.c,
 * src/compact.c). Two paths, picked by the first byte:
 *  - arbitrary params (any sizes, strides, fake never-dereferenced pointers) handed to the public
 *    GPU entry point with ctx = NULL: it must return a status, never crash or read a pointer; the
 *    status and message must be exactly those of the shared check (dsa_check_*), and params the
 *    check accepts must then fail on the NULL ctx (checks run before the context);
 *  - tiny sizes with real host buffers of exactly the size the (resolved) strides address,
 *    filled with the input's bytes (any index, NaN, inf), handed to the dsa_ref_* twin: ASan sees
 *    every read and write; a failed call must leave the outputs byte for byte as they were. */
#include "fuzz_common.h"
#include "dsa_testing.h"

/* ---- buffers of the reference path ------------------------------------------------------------ */
typedef struct {
  void *mem[24];
  int n;
  void *out[8];
  void *copy[8];
  size_t out_bytes[8];
  int nout;
} pool;

/* Records an output's bytes as they are before the call. */
static void snapshot(pool *pl, void *p, size_t bytes) {
  pl->out[pl->nout] = p;
  pl->out_bytes[pl->nout] = bytes;
  pl->copy[pl->nout] = malloc(bytes);
  memcpy(pl->copy[pl->nout], p, bytes);
  ++pl->nout;
}
/* A buffer of `elems` elements of `esz` bytes at a 16-byte aligned address plus `offset` bytes,
 * allocated to the exact byte (ASan flags one byte past it), filled from the input. */
static void *take(pool *pl, fz_in *in, int64_t elems, size_t esz, size_t offset, int is_out) {
  void *base = NULL;
  if (elems < 1) elems = 1;
  const size_t bytes = (size_t)elems * esz;
  if (posix_memalign(&base, 16, bytes + offset) != 0) abort();
  pl->mem[pl->n++] = base;
  unsigned char *p = (unsigned char *)base + offset;
  for (size_t i = 0; i < bytes; ++i) p[i] = in->n ? fz_u8(in) : (unsigned char)(i * 131 + 7);
  if (is_out) snapshot(pl, p, bytes);
  return p;
}
/* Takes the outputs as they are now as the new "before" (a second call after a successful one). */
static void resnapshot(pool *pl) {
  for (int i = 0; i < pl->nout; ++i) memcpy(pl->copy[i], pl->out[i], pl->out_bytes[i]);
}
static void outputs_unchanged(const pool *pl, const char *fn) {
  for (int i = 0; i < pl->nout; ++i)
    FZ_CHECK(memcmp(pl->out[i], pl->copy[i], pl->out_bytes[i]) == 0,
             "%s failed (%s) but wrote output %d", fn, dsa_last_error_message(), i);
}
static void pool_free(pool *pl) {
  for (int i = 0; i < pl->n; ++i) free(pl->mem[i]);
  for (int i = 0; i < pl->nout; ++i) free(pl->copy[i]);
}
/* A stride of the reference path: 0 (default) or near the row length (sometimes too short). */
static int64_t small_stride(fz_in *in, int64_t row_len) {
  const uint8_t m = fz_u8(in);
  if (m < 128) return 0;
  if (m < 224) return row_len + 8 * (m % 3);
  return row_len + (int8_t)fz_u8(in);
}
/* Elements a [e0, e1, inner] tensor with resolved strides s0, s1 spans (0 if empty). */
static int64_t span(int64_t e0, int64_t s0, int64_t e1, int64_t s1, int64_t inner) {
  if (e0 <= 0 || e1 <= 0 || inner <= 0 || s0 < 0 || s1 < 0) return 1;
  return (e0 - 1) * s0 + (e1 - 1) * s1 + inner;
}
static void resolve3(int64_t H, int64_t D, int64_t *st, int64_t *sh) {
  if (*st == 0) *st = H * D;
  if (*sh == 0) *sh = D;
}
/* The harness itself only steers int32 values in buffers it may read as int32. */
static int aligned4(const void *p) { return (uintptr_t)p % 4 == 0; }
static size_t misalign(fz_in *in) { /* usually 0, sometimes a few bytes */
  const uint8_t m = fz_u8(in);
  return m < 240 ? 0 : (size_t)(m % 16);
}
static void check_ref_result(dsa_status s, const pool *pl, const char *fn) {
  FZ_CHECK(s == DSA_SUCCESS || s == DSA_ERROR_INVALID_ARGUMENT, "%s returned %d", fn, (int)s);
  if (s != DSA_SUCCESS) {
    FZ_CHECK(strncmp(dsa_last_error_message(), fn, strlen(fn)) == 0, "message \"%s\"",
             dsa_last_error_message());
    outputs_unchanged(pl, fn);
  }
}
/* A row of selected columns: ascending, in [lo, hi), then -1; returns the count. */
static int64_t check_row(const int32_t *row, int64_t k, int64_t lo, int64_t hi, int sorted) {
  int64_t n = 0;
  while (n < k && row[n] != -1) {
    FZ_CHECK(row[n] >= lo && row[n] < hi, "column %d outside [%lld, %lld)", (int)row[n],
             (long long)lo, (long long)hi);
    FZ_CHECK(!sorted || n == 0 || row[n] > row[n - 1] || (sorted == 2 && row[n] == row[n - 1]),
             "row not ascending");
    ++n;
  }
  for (int64_t j = n; j < k; ++j) FZ_CHECK(row[j] == -1, "-1 tail broken at %lld", (long long)j);
  return n;
}

static void ref_compact(fz_in *in, pool *pl) {
  dsa_compact_params p;
  memset(&p, 0, sizeof p);
  p.rows = fz_u8(in) % 6;
  p.k = 1 + fz_u8(in) % 24;
  p.key_count = fz_u8(in) % 40;
  p.indices_stride = small_stride(in, p.k);
  const int in_place = fz_u8(in) & 1;
  p.out_stride = in_place ? p.indices_stride : small_stride(in, p.k);
  const int64_t is = p.indices_stride ? p.indices_stride : p.k, os = p.out_stride ? p.out_stride : p.k;
  int32_t *idx = (int32_t *)take(pl, in, span(p.rows, is, 1, 0, p.k), 4, misalign(in), 0);
  for (int64_t i = 0; i < span(p.rows, is, 1, 0, p.k); ++i)
    if (fz_u8(in) < 200 && aligned4(idx)) idx[i] = (int32_t)(idx[i] % 48) - 4; /* mostly near the valid range */
  snapshot(pl, idx, (size_t)span(p.rows, is, 1, 0, p.k) * 4);
  p.indices = idx;
  p.out = in_place ? idx : (int32_t *)take(pl, in, span(p.rows, os, 1, 0, p.k), 4, misalign(in), 1);
  p.lengths = fz_u8(in) & 1 ? (int32_t *)take(pl, in, p.rows, 4, misalign(in), 1) : NULL;
  const dsa_status s = dsa_ref_compact_indices(&p);
  check_ref_result(s, pl, "dsa_ref_compact_indices");
  if (s == DSA_SUCCESS)
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t n = check_row(p.out + r * os, p.k, 0, p.key_count, 2);
      FZ_CHECK(p.lengths == NULL || p.lengths[r] == n, "lengths[%lld]", (long long)r);
    }
}

static void ref_pad_heads(fz_in *in, pool *pl) {
  dsa_pad_heads_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = fz_u8(in) % 5;
  p.num_heads = 1 + fz_u8(in) % 6;
  p.padded_heads = p.num_heads + fz_u8(in) % 4 - (fz_u8(in) >= 250);
  p.head_dim = 8 * (1 + fz_u8(in) % 6) + (fz_u8(in) >= 250 ? 4 : 0);
  p.q_stride_token = small_stride(in, (int64_t)p.num_heads * p.head_dim);
  p.q_stride_head = small_stride(in, p.head_dim);
  int64_t st = p.q_stride_token, sh = p.q_stride_head;
  resolve3(p.num_heads, p.head_dim, &st, &sh);
  p.q = (const uint16_t *)take(pl, in, span(p.num_tokens, st, p.num_heads, sh, p.head_dim), 2,
                               misalign(in), 0);
  p.q_out = (uint16_t *)take(pl, in, p.num_tokens * (p.padded_heads > 0 ? p.padded_heads : 1) * p.head_dim,
                             2, misalign(in), 1);
  p.sink = fz_u8(in) & 1 ? (const float *)take(pl, in, p.num_heads, 4, misalign(in), 0) : NULL;
  p.sink_out = fz_u8(in) & 1 ? (float *)take(pl, in, p.padded_heads, 4, misalign(in), 1) : NULL;
  check_ref_result(dsa_ref_pad_heads(&p), pl, "dsa_ref_pad_heads");
}

static void ref_topk(fz_in *in, pool *pl) {
  dsa_topk_params p;
  memset(&p, 0, sizeof p);
  p.rows = fz_u8(in) % 6;
  p.columns = fz_u8(in) % 40;
  p.k = 1 + fz_u8(in) % 24;
  p.scores_stride = small_stride(in, p.columns);
  p.indices_stride = small_stride(in, p.k);
  const int64_t ss = p.scores_stride ? p.scores_stride : p.columns;
  const int64_t is = p.indices_stride ? p.indices_stride : p.k;
  p.scores = (const float *)take(pl, in, span(p.rows, ss, 1, 0, p.columns), 4, misalign(in), 0);
  if (fz_u8(in) & 1) {
    int32_t *len = (int32_t *)take(pl, in, p.rows, 4, misalign(in), 0);
    for (int64_t r = 0; r < p.rows; ++r)
      if (fz_u8(in) < 200 && aligned4(len)) len[r] = len[r] % 48 - 4;
    p.lengths = len;
  }
  p.indices = (int32_t *)take(pl, in, span(p.rows, is, 1, 0, p.k), 4, misalign(in), 1);
  const dsa_status s = dsa_ref_topk(&p);
  check_ref_result(s, pl, "dsa_ref_topk");
  if (s == DSA_SUCCESS)
    for (int64_t r = 0; r < p.rows; ++r) {
      int64_t L = p.lengths ? p.lengths[r] : p.columns;
      L = L < 0 ? 0 : (L > p.columns ? p.columns : L);
      const int64_t n = check_row(p.indices + r * is, p.k, 0, L, 1);
      FZ_CHECK(n == (L < p.k ? L : p.k), "row %lld selected %lld of %lld", (long long)r,
               (long long)n, (long long)L);
    }
}

static void ref_indexer(fz_in *in, pool *pl) {
  dsa_indexer_params p;
  dsa_plan_view v;
  memset(&p, 0, sizeof p);
  memset(&v, 0, sizeof v);
  const int64_t D = DSA_INDEX_HEAD_DIM;
  v.num_queries = fz_u8(in) % 5;
  v.total_key_tokens = fz_u8(in) % 12;
  p.plan = &v;
  p.num_heads = 1 + fz_u8(in) % 4;
  p.topk = 1 + fz_u8(in) % 8;
  p.weights_dtype = (dsa_dtype)(fz_u8(in) & 1);
  p.engine = (dsa_indexer_engine)(fz_u8(in) % 3);
  p.q_stride_token = small_stride(in, p.num_heads * D);
  p.q_stride_head = small_stride(in, D);
  p.k_stride = small_stride(in, D);
  p.weights_stride = small_stride(in, p.num_heads);
  p.indices_stride = small_stride(in, p.topk);
  int64_t st = p.q_stride_token, sh = p.q_stride_head;
  resolve3(p.num_heads, D, &st, &sh);
  const int64_t ks = p.k_stride ? p.k_stride : D, ws = p.weights_stride ? p.weights_stride : p.num_heads;
  const int64_t is = p.indices_stride ? p.indices_stride : p.topk, Tq = v.num_queries;
  int32_t *starts = (int32_t *)take(pl, in, Tq, 4, 0, 0), *causal = (int32_t *)take(pl, in, Tq, 4, 0, 0);
  for (int64_t t = 0; t < Tq; ++t) { /* mostly windows inside [0, T_k), sometimes arbitrary */
    if (fz_u8(in) < 220) {
      causal[t] = (int32_t)((uint32_t)causal[t] % (uint32_t)(v.total_key_tokens + 1));
      starts[t] = (int32_t)((uint32_t)starts[t] % (uint32_t)(v.total_key_tokens - causal[t] + 1));
    }
  }
  v.starts = starts;
  v.causal_lengths = causal;
  v.query_valid = (const uint8_t *)take(pl, in, Tq, 1, 0, 0);
  if (fz_u8(in) < 230) { /* complete the view so that contract section 5 accepts it (mostly) */
    static const int32_t seg[2] = {0, 0};
    static const int64_t vri[1] = {0};
    int64_t nv = 0, msk = 1;
    for (int64_t t = 0; t < Tq; ++t) {
      nv += v.query_valid[t] != 0;
      if (causal[t] > msk) msk = causal[t];
    }
    v.num_valid = nv;
    v.all_rows_nonempty = nv == Tq;
    v.valid_row_indices = nv == Tq ? NULL : vri;
    v.num_segments = 1;
    v.segment_cu_q = v.segment_cu_k = v.q_causal_offsets = seg;
    v.max_seqlen_q = (int32_t)Tq;
    v.max_seqlen_k = (int32_t)(msk < v.total_key_tokens ? msk : v.total_key_tokens);
  }
  p.index_q = (const uint16_t *)take(pl, in, span(Tq, st, p.num_heads, sh, D), 2, misalign(in), 0);
  p.index_k = (const uint16_t *)take(pl, in, span(v.total_key_tokens, ks, 1, 0, D), 2, misalign(in), 0);
  p.weights = take(pl, in, span(Tq, ws, 1, 0, p.num_heads), p.weights_dtype == DSA_DTYPE_F32 ? 4 : 2,
                   misalign(in), 0);
  p.indices = (int32_t *)take(pl, in, span(Tq, is, 1, 0, p.topk), 4, misalign(in), 1);
  p.lengths = (int32_t *)take(pl, in, Tq, 4, misalign(in), 1);
  const dsa_status s = dsa_ref_indexer_topk(&p);
  check_ref_result(s, pl, "dsa_ref_indexer_topk");
  if (s == DSA_SUCCESS)
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t n = check_row(p.indices + t * is, p.topk, starts[t],
                                  (int64_t)starts[t] + (causal[t] > 0 ? causal[t] : 0), 1);
      FZ_CHECK(n == p.lengths[t], "lengths[%lld]", (long long)t);
    }
  /* the scores of one row (any row number) into a buffer of exactly its visible length; the top-k
   * call above may have written indices / lengths, which is not this call's doing */
  resnapshot(pl);
  const int64_t row = (int64_t)(int8_t)fz_u8(in);
  int64_t vis = row >= 0 && row < Tq && causal[row] > 0 ? causal[row] : 0;
  if (vis > v.total_key_tokens) vis = v.total_key_tokens; /* such a window is rejected anyway */
  double *sc = vis > 0 ? (double *)take(pl, in, vis, sizeof(double), 0, 1) : NULL;
  check_ref_result(dsa_ref_indexer_scores(&p, row, sc), pl, "dsa_ref_indexer_scores");
}

/* Shared part of the attention paths: sizes, q / kv / indices buffers. */
typedef struct {
  int64_t T, Tkv, st, sh, kvs, is;
  int32_t H, D, K;
} attn_dims;
static void attn_dims_read(fz_in *in, attn_dims *a) {
  a->T = fz_u8(in) % 4;
  a->H = 1 + fz_u8(in) % 3;
  a->D = fz_u8(in) & 1 ? 512 : 576;
  if (fz_u8(in) >= 250) a->D = 520; /* rejected */
  a->Tkv = fz_u8(in) % 7;
  a->K = 1 + fz_u8(in) % 6;
}
static int32_t *attn_indices(fz_in *in, pool *pl, const attn_dims *a, int64_t is) {
  const int64_t n = span(a->T, is, 1, 0, a->K);
  int32_t *idx = (int32_t *)take(pl, in, n, 4, misalign(in), 0);
  for (int64_t i = 0; i < n; ++i)
    if (fz_u8(in) < 220 && aligned4(idx)) idx[i] = idx[i] % (int32_t)(a->Tkv + 3) - 1; /* mostly in range, some -1 */
  return idx;
}
static int32_t *attn_lengths(fz_in *in, pool *pl, const attn_dims *a) {
  if (!(fz_u8(in) & 1)) return NULL;
  int32_t *len = (int32_t *)take(pl, in, a->T, 4, misalign(in), 0);
  for (int64_t t = 0; t < a->T; ++t)
    if (fz_u8(in) < 220 && aligned4(len)) len[t] = len[t] % (a->K + 3) - 1;
  return len;
}

static void ref_attn_fwd(fz_in *in, pool *pl) {
  dsa_attn_fwd_params p;
  attn_dims a;
  memset(&p, 0, sizeof p);
  attn_dims_read(in, &a);
  p.num_tokens = a.T;
  p.num_heads = a.H;
  p.head_dim = a.D;
  p.num_kv = a.Tkv;
  p.topk = a.K;
  p.softmax_scale = fz_u8(in) < 250 ? 0.04f * (1 + fz_u8(in) % 4) : fz_f32(in);
  p.q_stride_token = small_stride(in, (int64_t)a.H * a.D);
  p.q_stride_head = small_stride(in, a.D);
  p.kv_stride = small_stride(in, a.D);
  p.indices_stride = small_stride(in, a.K);
  p.out_stride_token = small_stride(in, (int64_t)a.H * 512);
  p.out_stride_head = small_stride(in, 512);
  int64_t st = p.q_stride_token, sh = p.q_stride_head, ot = p.out_stride_token, oh = p.out_stride_head;
  resolve3(a.H, a.D, &st, &sh);
  resolve3(a.H, 512, &ot, &oh);
  const int64_t kvs = p.kv_stride ? p.kv_stride : a.D, is = p.indices_stride ? p.indices_stride : a.K;
  p.q = (const uint16_t *)take(pl, in, span(a.T, st, a.H, sh, a.D), 2, misalign(in), 0);
  p.kv = (const uint16_t *)take(pl, in, span(a.Tkv, kvs, 1, 0, a.D), 2, misalign(in), 0);
  p.indices = attn_indices(in, pl, &a, is);
  p.topk_length = attn_lengths(in, pl, &a);
  p.sink = fz_u8(in) & 1 ? (const float *)take(pl, in, a.H, 4, misalign(in), 0) : NULL;
  p.out = (uint16_t *)take(pl, in, span(a.T, ot, a.H, oh, 512), 2, misalign(in), 1);
  p.lse = (float *)take(pl, in, a.T * a.H, 4, misalign(in), 1);
  p.max_logits = fz_u8(in) & 1 ? (float *)take(pl, in, a.T * a.H, 4, misalign(in), 1) : NULL;
  check_ref_result(dsa_ref_sparse_attn_fwd(&p), pl, "dsa_ref_sparse_attn_fwd");
}

static void ref_attn_bwd(fz_in *in, pool *pl) {
  dsa_attn_bwd_params p;
  attn_dims a;
  memset(&p, 0, sizeof p);
  attn_dims_read(in, &a);
  p.num_tokens = a.T;
  p.num_heads = a.H;
  p.head_dim = a.D;
  p.num_kv = a.Tkv;
  p.topk = a.K;
  p.deterministic = fz_u8(in) & 1;
  p.softmax_scale = fz_u8(in) < 250 ? 0.04f * (1 + fz_u8(in) % 4) : fz_f32(in);
  p.q_stride_token = small_stride(in, (int64_t)a.H * a.D);
  p.q_stride_head = small_stride(in, a.D);
  p.kv_stride = small_stride(in, a.D);
  p.indices_stride = small_stride(in, a.K);
  p.out_stride_token = small_stride(in, (int64_t)a.H * 512);
  p.out_stride_head = small_stride(in, 512);
  p.dout_stride_token = small_stride(in, (int64_t)a.H * 512);
  p.dout_stride_head = small_stride(in, 512);
  p.dq_stride_token = small_stride(in, (int64_t)a.H * a.D);
  p.dq_stride_head = small_stride(in, a.D);
  p.dkv_stride = small_stride(in, a.D);
  int64_t st = p.q_stride_token, sh = p.q_stride_head, ot = p.out_stride_token, oh = p.out_stride_head;
  int64_t dt = p.dout_stride_token, dh = p.dout_stride_head, qt = p.dq_stride_token, qh = p.dq_stride_head;
  resolve3(a.H, a.D, &st, &sh);
  resolve3(a.H, 512, &ot, &oh);
  resolve3(a.H, 512, &dt, &dh);
  resolve3(a.H, a.D, &qt, &qh);
  const int64_t kvs = p.kv_stride ? p.kv_stride : a.D, is = p.indices_stride ? p.indices_stride : a.K;
  const int64_t dks = p.dkv_stride ? p.dkv_stride : a.D;
  p.q = (const uint16_t *)take(pl, in, span(a.T, st, a.H, sh, a.D), 2, misalign(in), 0);
  p.kv = (const uint16_t *)take(pl, in, span(a.Tkv, kvs, 1, 0, a.D), 2, misalign(in), 0);
  p.indices = attn_indices(in, pl, &a, is);
  p.topk_length = attn_lengths(in, pl, &a);
  p.sink = fz_u8(in) & 1 ? (const float *)take(pl, in, a.H, 4, misalign(in), 0) : NULL;
  p.out = (const uint16_t *)take(pl, in, span(a.T, ot, a.H, oh, 512), 2, misalign(in), 0);
  p.dout = (const uint16_t *)take(pl, in, span(a.T, dt, a.H, dh, 512), 2, misalign(in), 0);
  p.lse = (const float *)take(pl, in, a.T * a.H, 4, misalign(in), 0);
  p.dq = (uint16_t *)take(pl, in, span(a.T, qt, a.H, qh, a.D), 2, misalign(in), 1);
  p.dkv = (uint16_t *)take(pl, in, span(a.Tkv, dks, 1, 0, a.D), 2, misalign(in), 1);
  p.dsink = fz_u8(in) & 1 ? (float *)take(pl, in, a.H, 4, misalign(in), 1) : NULL;
  check_ref_result(dsa_ref_sparse_attn_bwd(&p), pl, "dsa_ref_sparse_attn_bwd");
}

/* ---- arbitrary params against the GPU entry points (ctx = NULL) ------------------------------- */
/* A pointer that is never dereferenced: NULL, a fake aligned address, one a few bytes off, raw. */
static void *fake_ptr(fz_in *in) {
  const uint8_t m = fz_u8(in);
  if (m < 24) return NULL;
  if (m < 200) return (void *)(uintptr_t)(0x7f0000000000ull + 4096ull * (m % 16));
  if (m < 240) return (void *)(uintptr_t)(0x7f0000000000ull + (fz_u8(in) % 16));
  return (void *)(uintptr_t)fz_i64(in);
}
static int64_t any_stride(fz_in *in, int64_t row_len) {
  const uint8_t m = fz_u8(in);
  if (m < 96) return 0;
  if (m < 200) return (int64_t)((uint64_t)row_len + (uint64_t)(int64_t)(int8_t)fz_u8(in)); /* wraps */
  return fz_size(in, 1 << 20);
}

/* The entry point's status and message must be the shared check's; accepted params must fail on
 * the NULL ctx. */
static void expect_like_check(dsa_status got, dsa_status check, const char *check_msg,
                              const char *fn) {
  if (check != DSA_SUCCESS) {
    FZ_CHECK(got == check, "%s returned %d, the check %d (%s)", fn, (int)got, (int)check, check_msg);
    FZ_CHECK(strcmp(dsa_last_error_message(), check_msg) == 0, "%s: \"%s\" vs the check's \"%s\"",
             fn, dsa_last_error_message(), check_msg);
  } else {
    FZ_CHECK(got == DSA_ERROR_INVALID_ARGUMENT && strstr(dsa_last_error_message(), "ctx") != NULL,
             "%s accepted by the check, then %d (%s)", fn, (int)got, dsa_last_error_message());
  }
}
#define CHECK_THEN_CALL(checkfn, P, R, fn, call)                                        \
  do {                                                                                  \
    char msg_[512];                                                                     \
    const dsa_status c_ = checkfn(&P, fn, &R);                                          \
    snprintf(msg_, sizeof msg_, "%s", c_ == DSA_SUCCESS ? "" : dsa_last_error_message()); \
    expect_like_check((call), c_, msg_, fn);                                            \
  } while (0)

/* A size query (workspace NULL) needs no context: params the check rejects fail the same way and
 * leave the size alone; accepted params give DSA_SUCCESS and a size >= 1. */
#define CHECK_THEN_SIZE(checkfn, P, R, fn, call, bytes)                                  \
  do {                                                                                  \
    char msg_[512];                                                                     \
    const dsa_status c_ = checkfn(&P, fn, &R);                                          \
    snprintf(msg_, sizeof msg_, "%s", c_ == DSA_SUCCESS ? "" : dsa_last_error_message()); \
    const dsa_status s_ = (call);                                                       \
    if (c_ != DSA_SUCCESS) {                                                            \
      expect_like_check(s_, c_, msg_, fn);                                              \
      FZ_CHECK(bytes == 777, "%s wrote the size on a failed size query", fn);           \
    } else {                                                                            \
      FZ_CHECK(s_ == DSA_SUCCESS && bytes >= 1 && bytes != 777,                         \
               "%s size query without a context: %d (%s), size %zu", fn, (int)s_,       \
               dsa_last_error_message(), bytes);                                        \
    }                                                                                   \
  } while (0)

static void gpu_null_ctx(fz_in *in) {
  char ws_buf[16];
  void *ws = fz_u8(in) & 1 ? (void *)ws_buf : NULL;
  size_t ws_bytes = 777;
  switch (fz_u8(in) % 6) {
    case 0: {
      dsa_compact_params p, r;
      p.rows = fz_size(in, 1 << 16);
      p.k = (int32_t)fz_size(in, 4096);
      p.key_count = fz_size(in, 1 << 20);
      p.indices = (const int32_t *)fake_ptr(in);
      p.indices_stride = any_stride(in, p.k);
      p.out = fz_u8(in) & 1 ? (int32_t *)p.indices : (int32_t *)fake_ptr(in);
      p.out_stride = fz_u8(in) & 1 ? p.indices_stride : any_stride(in, p.k);
      p.lengths = (int32_t *)fake_ptr(in);
      CHECK_THEN_CALL(dsa_check_compact, p, r, "dsa_compact_indices", dsa_compact_indices(NULL, &p, NULL));
      break;
    }
    case 1: {
      dsa_pad_heads_params p, r;
      p.num_tokens = fz_size(in, 1 << 16);
      p.num_heads = (int32_t)fz_size(in, 200);
      p.padded_heads = (int32_t)fz_size(in, 1100);
      p.head_dim = (int32_t)fz_size(in, 1024);
      p.q = (const uint16_t *)fake_ptr(in);
      p.q_stride_token = any_stride(in, (int64_t)p.num_heads * p.head_dim);
      p.q_stride_head = any_stride(in, p.head_dim);
      p.q_out = (uint16_t *)fake_ptr(in);
      p.sink = (const float *)fake_ptr(in);
      p.sink_out = (float *)fake_ptr(in);
      CHECK_THEN_CALL(dsa_check_pad_heads, p, r, "dsa_pad_heads", dsa_pad_heads(NULL, &p, NULL));
      break;
    }
    case 2: {
      dsa_topk_params p, r;
      p.rows = fz_size(in, 1 << 16);
      p.columns = fz_size(in, 1 << 20);
      p.k = (int32_t)fz_size(in, 4096);
      p.scores = (const float *)fake_ptr(in);
      p.scores_stride = any_stride(in, p.columns);
      p.lengths = (const int32_t *)fake_ptr(in);
      p.indices = (int32_t *)fake_ptr(in);
      p.indices_stride = any_stride(in, p.k);
      if (ws != NULL) {
        CHECK_THEN_CALL(dsa_check_topk, p, r, "dsa_topk", dsa_topk(NULL, &p, ws, &ws_bytes, NULL));
        FZ_CHECK(ws_bytes == 777, "dsa_topk wrote the size on a failed call");
      } else {
        CHECK_THEN_SIZE(dsa_check_topk, p, r, "dsa_topk", dsa_topk(NULL, &p, NULL, &ws_bytes, NULL),
                        ws_bytes);
      }
      break;
    }
    case 3: {
      dsa_indexer_params p, r;
      dsa_plan_view v;
      memset(&v, 0, sizeof v);
      v.num_queries = fz_size(in, 1 << 16);
      v.total_key_tokens = fz_size(in, 1 << 20);
      v.query_start = fz_size(in, 1 << 20);
      v.max_seqlen_k = (int32_t)fz_size(in, 1 << 20);
      v.starts = (const int32_t *)fake_ptr(in);
      v.causal_lengths = (const int32_t *)fake_ptr(in);
      if (fz_u8(in) < 200) { /* a view the section 5 checks accept, mostly */
        v.query_valid = (const uint8_t *)fake_ptr(in);
        v.all_rows_nonempty = fz_u8(in) < 250 ? 1 : (int32_t)fz_size(in, 3);
        v.num_valid = v.all_rows_nonempty ? v.num_queries : fz_size(in, 1 << 16);
        v.valid_row_indices = v.all_rows_nonempty ? NULL : (const int64_t *)fake_ptr(in);
        v.num_segments = 1 + fz_u8(in) % 4;
        v.segment_cu_q = v.segment_cu_k = v.q_causal_offsets = (const int32_t *)fake_ptr(in);
        v.max_seqlen_q = (int32_t)fz_size(in, 1 << 16);
      }
      p.plan = fz_u8(in) < 250 ? &v : NULL;
      p.num_heads = (int32_t)fz_size(in, 80);
      p.topk = (int32_t)fz_size(in, 4096);
      p.index_q = (const uint16_t *)fake_ptr(in);
      p.q_stride_token = any_stride(in, (int64_t)p.num_heads * 128);
      p.q_stride_head = any_stride(in, 128);
      p.index_k = (const uint16_t *)fake_ptr(in);
      p.k_stride = any_stride(in, 128);
      p.weights = fake_ptr(in);
      p.weights_dtype = (dsa_dtype)(int32_t)fz_size(in, 2);
      p.weights_stride = any_stride(in, p.num_heads);
      p.indices = (int32_t *)fake_ptr(in);
      p.indices_stride = any_stride(in, p.topk);
      p.lengths = (int32_t *)fake_ptr(in);
      p.engine = (dsa_indexer_engine)(int32_t)fz_size(in, 3);
      if (ws != NULL) {
        CHECK_THEN_CALL(dsa_check_indexer, p, r, "dsa_indexer_topk",
                        dsa_indexer_topk(NULL, &p, ws, &ws_bytes, NULL));
        FZ_CHECK(ws_bytes == 777, "dsa_indexer_topk wrote the size on a failed call");
      } else {
        CHECK_THEN_SIZE(dsa_check_indexer, p, r, "dsa_indexer_topk",
                        dsa_indexer_topk(NULL, &p, NULL, &ws_bytes, NULL), ws_bytes);
      }
      break;
    }
    case 4:
    case 5: {
      dsa_attn_bwd_params b, rb;
      b.num_tokens = fz_size(in, 1 << 16);
      b.num_heads = (int32_t)fz_size(in, 140);
      b.head_dim = fz_u8(in) < 200 ? 576 : (int32_t)fz_size(in, 600);
      b.num_kv = fz_size(in, 1 << 20);
      b.topk = (int32_t)fz_size(in, 4096);
      b.softmax_scale = fz_u8(in) < 200 ? 0.0625f : fz_f32(in);
      b.deterministic = fz_u8(in) < 240 ? (fz_u8(in) & 1) : (int32_t)fz_i64(in);
      b.q = (const uint16_t *)fake_ptr(in);
      b.q_stride_token = any_stride(in, (int64_t)b.num_heads * b.head_dim);
      b.q_stride_head = any_stride(in, b.head_dim);
      b.kv = (const uint16_t *)fake_ptr(in);
      b.kv_stride = any_stride(in, b.head_dim);
      b.indices = (const int32_t *)fake_ptr(in);
      b.indices_stride = any_stride(in, b.topk);
      b.topk_length = (const int32_t *)fake_ptr(in);
      b.sink = (const float *)fake_ptr(in);
      b.out = (const uint16_t *)fake_ptr(in);
      b.out_stride_token = any_stride(in, (int64_t)b.num_heads * 512);
      b.out_stride_head = any_stride(in, 512);
      b.dout = (const uint16_t *)fake_ptr(in);
      b.dout_stride_token = any_stride(in, (int64_t)b.num_heads * 512);
      b.dout_stride_head = any_stride(in, 512);
      b.lse = (const float *)fake_ptr(in);
      b.dq = (uint16_t *)fake_ptr(in);
      b.dq_stride_token = any_stride(in, (int64_t)b.num_heads * b.head_dim);
      b.dq_stride_head = any_stride(in, b.head_dim);
      b.dkv = (uint16_t *)fake_ptr(in);
      b.dkv_stride = any_stride(in, b.head_dim);
      b.dsink = (float *)fake_ptr(in);
      if (fz_u8(in) & 1) { /* the forward reads the same fields */
        dsa_attn_fwd_params p, r;
        p.num_tokens = b.num_tokens; p.num_heads = b.num_heads; p.head_dim = b.head_dim;
        p.num_kv = b.num_kv; p.topk = b.topk; p.softmax_scale = b.softmax_scale;
        p.q = b.q; p.q_stride_token = b.q_stride_token; p.q_stride_head = b.q_stride_head;
        p.kv = b.kv; p.kv_stride = b.kv_stride; p.indices = b.indices;
        p.indices_stride = b.indices_stride; p.topk_length = b.topk_length; p.sink = b.sink;
        p.out = (uint16_t *)b.out; p.out_stride_token = b.out_stride_token;
        p.out_stride_head = b.out_stride_head; p.lse = (float *)b.lse; p.max_logits = b.dsink;
        CHECK_THEN_CALL(dsa_check_attn_fwd, p, r, "dsa_sparse_attn_fwd",
                        dsa_sparse_attn_fwd(NULL, &p, NULL));
      } else if (ws != NULL) {
        CHECK_THEN_CALL(dsa_check_attn_bwd, b, rb, "dsa_sparse_attn_bwd",
                        dsa_sparse_attn_bwd(NULL, &b, ws, &ws_bytes, NULL));
        FZ_CHECK(ws_bytes == 777, "dsa_sparse_attn_bwd wrote the size on a failed call");
      } else { /* the size query needs no context (a device only in deterministic mode) */
        const dsa_status c = dsa_check_attn_bwd(&b, "dsa_sparse_attn_bwd", &rb);
        const dsa_status s = dsa_sparse_attn_bwd(NULL, &b, NULL, &ws_bytes, NULL);
        if (c != DSA_SUCCESS) {
          FZ_CHECK(s == c && ws_bytes == 777, "bwd size query: check %d, call %d", (int)c, (int)s);
        } else if (s == DSA_SUCCESS) {
          FZ_CHECK(ws_bytes >= 1 && ws_bytes != 777, "bwd size query wrote %zu", ws_bytes);
        } else {
          FZ_CHECK(s == DSA_ERROR_NO_DEVICE || s == DSA_ERROR_UNSUPPORTED || s == DSA_ERROR_CUDA,
                   "bwd size query returned %d (%s)", (int)s, dsa_last_error_message());
          FZ_CHECK(ws_bytes == 777, "bwd size query wrote the size on failure");
        }
      }
      break;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size};
  const uint8_t mode = fz_u8(&in);
  { /* bf16 round trip: exact for every non-NaN pattern, NaN stays NaN */
    const uint16_t h = (uint16_t)(size >= 3 ? data[1] | data[2] << 8 : 0);
    const float f = dsa_bf16_to_f32(h);
    FZ_CHECK(f != f ? (dsa_f32_to_bf16(f) & 0x7fff) > 0x7f80 : dsa_f32_to_bf16(f) == h,
             "bf16 0x%04x -> %g -> 0x%04x", h, (double)f, dsa_f32_to_bf16(f));
  }
  if (mode < 96) {
    gpu_null_ctx(&in);
    return 0;
  }
  pool pl;
  memset(&pl, 0, sizeof pl);
  switch (mode % 6) {
    case 0: ref_compact(&in, &pl); break;
    case 1: ref_pad_heads(&in, &pl); break;
    case 2: ref_topk(&in, &pl); break;
    case 3: ref_indexer(&in, &pl); break;
    case 4: ref_attn_fwd(&in, &pl); break;
    default: ref_attn_bwd(&in, &pl); break;
  }
  pool_free(&pl);
  return 0;
}
