/* test_gpu_indexer_train.c - GPU suite gpu_indexer_train: the four indexer-training ops
 * (dsa_attn_slot_target, dsa_indexer_slot_scores, dsa_indexer_loss, dsa_indexer_bwd) against their
 * CPU references (src/reference_train.c) on fresh random inputs (the seed is printed; DSA_TEST_SEED
 * replays), every element compared:
 *  - fp32 outputs (slot target, scores, g, d_weights) within 1e-4 of the row's largest |reference|
 *    (g and d_weights: or of the size of their terms, |grad_loss coeff / N| tgt and sum_j |g| ReLU(x),
 *    as a row of one d_weights sum (H = 1) or g with two valid slots can cancel to near 0),
 *    bf16 outputs (d_index_q per (token, head), d_index_k per key row) within 1e-2 of the row's
 *    largest |reference|; invalid slots and rows that do not count exactly 0; NaN never passes.
 *  - sizes that are multiples of nothing (T 37, K 77, T_k 50 or 301), H 1 / 16 / 64 / 128 for the
 *    slot target (D 576 and 512, the lse from dsa_ref_sparse_attn_fwd), H 1 / 7 / 32 / 64 for the
 *    indexer ops, fp32 and bf16 weights;
 *  - edge cases: empty rows, all-invalid rows, duplicates, -1 / INT_MIN / out-of-range indices,
 *    lengths from -3 to K + 3 (clamped; 0 and K included), sinks +-inf, targets that sum to 0,
 *    T = 0 (the loss is 0, d_index_k all zeros);
 *  - every op runs twice and must be bitwise identical (the loss, g and the deterministic d_index_k
 *    by contract; the others because they have no atomics); the non-deterministic d_index_k is
 *    held to the tolerance only;
 *  - outputs are poisoned over their whole allocation, gaps of padded strides included: every
 *    element written, every gap untouched; a non-default stream; workspaces handed 1 byte off a
 *    256-byte boundary; bad inputs and too-small workspaces write nothing.
 * The indexer's q and k hold multiples of 1/8 in [-1, 1]: every dot product is then exact in fp32,
 * so the GPU and the reference take the same ReLU' = [x > 0] branch (x = 0 included) and the
 * comparison measures the accumulation, not a coin flip at x ~ 0. */
#include <limits.h>
#include "test_common.h"

static void *dcopy(const void *h, size_t bytes) {
  void *d = NULL;
  TC_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
  if (bytes) TC_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}
static void *dpoison(size_t bytes) { /* 0xFF bytes: a NaN in fp32 and in bf16 */
  void *d = NULL;
  TC_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
  TC_CUDA(cudaMemset(d, 0xFF, bytes ? bytes : 1));
  return d;
}
static void *hget(const void *d, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  cr_assert(h);
  if (bytes) TC_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  return h;
}
static size_t nz(int64_t n) { return n > 0 ? (size_t)n : 1; }

static int32_t invalid_index(tc_rng *r, int64_t nkeys) {
  switch (tc_below(r, 4)) {
    case 0: return -1;
    case 1: return INT_MIN;
    case 2: return (int32_t)nkeys;
    default: return (int32_t)(nkeys + 1 + tc_below(r, 1000));
  }
}

/* Random [T, K] indices (row stride st) and lengths: empty rows, invalid slots, duplicates. */
static void make_slots(tc_rng *r, int64_t T, int K, int64_t st, int64_t nkeys, int32_t *idx, int32_t *len) {
  for (int64_t t = 0; t < T; ++t) {
    int32_t *row = idx + t * st;
    const int empty = t % 9 == 4;
    for (int j = 0; j < K; ++j) {
      const double u = tc_uniform(r);
      if (empty || nkeys == 0 || u < 0.15) row[j] = invalid_index(r, nkeys);
      else if (j > 0 && u < 0.3) row[j] = row[tc_below(r, j)];
      else row[j] = (int32_t)tc_below(r, nkeys);
    }
    for (int64_t j = K; j < st; ++j) row[j] = 0; /* padding: never read as a slot */
    len[t] = t % 7 == 0 ? K : t % 7 == 1 ? 0 : (int32_t)(tc_below(r, K + 7) - 3);
  }
}

static int slot_valid(const int32_t *idx, int64_t st, const int32_t *len, int K, int64_t nkeys,
                      int64_t t, int j) {
  int lim = len ? len[t] : K;
  lim = lim < 0 ? 0 : lim > K ? K : lim;
  const int32_t v = idx[t * st + j];
  return j < lim && v >= 0 && (int64_t)v < nkeys;
}

/* fp32 rows: |got - ref| <= tol * the row's largest |ref| or |base| (base: NULL, or a contiguous
 * [rows, cols] bound on the size of the terms each element sums: a sum that cancels to near 0 is
 * only accurate relative to its terms, so a row of one such sum - d_weights with H = 1, g of a row
 * with two valid slots - needs that base); zero where `zero` says (NULL: nowhere); NaN fails. */
static void check_rows_f32_base(const char *what, const float *got, int64_t gst, const float *ref, int64_t rst,
                                const float *base, int64_t rows, int cols, double tol, const uint8_t *zero) {
  for (int64_t t = 0; t < rows; ++t) {
    double mx = 0;
    for (int j = 0; j < cols; ++j) mx = fmax(mx, fabs((double)ref[t * rst + j]));
    if (base)
      for (int j = 0; j < cols; ++j) mx = fmax(mx, fabs((double)base[t * cols + j]));
    for (int j = 0; j < cols; ++j) {
      const double g = got[t * gst + j], e = ref[t * rst + j];
      cr_assert(!isnan(g) && !isnan(e), "%s[%lld, %d]: NaN (got %g, ref %g)", what, (long long)t, j, g, e);
      if (zero && zero[t * cols + j])
        cr_assert(g == 0.0, "%s[%lld, %d] = %g where the op defines 0", what, (long long)t, j, g);
      cr_assert(fabs(g - e) <= tol * mx, "%s[%lld, %d]: got %.9g, ref %.9g (row max %g)", what,
                (long long)t, j, g, e, mx);
    }
  }
}
static void check_rows_f32(const char *what, const float *got, int64_t gst, const float *ref, int64_t rst,
                           int64_t rows, int cols, double tol, const uint8_t *zero) {
  check_rows_f32_base(what, got, gst, ref, rst, NULL, rows, cols, tol, zero);
}

/* bf16 rows of `inner` elements at got[a * s0 + b * s1] against a contiguous reference. */
static void check_rows_bf16(const char *what, const uint16_t *got, int64_t n0, int64_t s0, int64_t n1,
                            int64_t s1, const uint16_t *ref, int inner, double tol) {
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b) {
      const uint16_t *g = got + a * s0 + b * s1, *e = ref + (a * n1 + b) * inner;
      double mx = 0;
      for (int d = 0; d < inner; ++d) mx = fmax(mx, fabs((double)dsa_bf16_to_f32(e[d])));
      for (int d = 0; d < inner; ++d) {
        const double x = dsa_bf16_to_f32(g[d]), y = dsa_bf16_to_f32(e[d]);
        cr_assert(!isnan(x) && !isnan(y), "%s[%lld, %lld, %d]: NaN (got %g, ref %g)", what, (long long)a,
                  (long long)b, d, x, y);
        cr_assert(fabs(x - y) <= tol * mx, "%s[%lld, %lld, %d]: got %.6g, ref %.6g (row max %g)", what,
                  (long long)a, (long long)b, d, x, y, mx);
      }
    }
}

/* Every 2-byte element outside the logical [n0, n1, inner] region still holds the 0xFFFF poison. */
static void check_gaps_bf16(const char *what, const uint16_t *buf, size_t n, int64_t n0, int64_t s0, int64_t n1,
                         int64_t s1, int64_t inner) {
  uint8_t *mark = calloc(nz((int64_t)n), 1);
  cr_assert(mark);
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b) memset(mark + a * s0 + b * s1, 1, (size_t)inner);
  for (size_t i = 0; i < n; ++i)
    if (!mark[i]) cr_assert(buf[i] == 0xFFFF, "%s: gap element %zu was written (0x%04x)", what, i, buf[i]);
  free(mark);
}
static void check_gaps32(const char *what, const float *buf, int64_t rows, int64_t st, int cols) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = cols; j < st; ++j)
      cr_assert(tc_bytes_are(buf + t * st + j, 4, 0xFF), "%s: gap [%lld, %lld] was written", what, (long long)t,
                (long long)j);
}

static void fill_grid8(tc_rng *r, uint16_t *x, size_t n) { /* multiples of 1/8 in [-1, 1] */
  for (size_t i = 0; i < n; ++i) x[i] = dsa_f32_to_bf16((float)(tc_below(r, 17) - 8) / 8.0f);
}

typedef struct gpu_env {
  dsa_context *ctx;
  cudaStream_t stream;
} gpu_env;
static gpu_env env_open(void) {
  gpu_env e;
  TC_OK(tc_context_create(&e.ctx));
  TC_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamDefault));
  return e;
}
static void env_close(gpu_env *e) {
  TC_CUDA(cudaStreamSynchronize(e->stream));
  TC_CUDA(cudaStreamDestroy(e->stream));
  dsa_context_destroy(e->ctx);
}
#define TC_SYNC(e)                                      \
  do {                                                  \
    TC_CUDA(cudaStreamSynchronize((e)->stream));        \
    TC_CUDA(cudaGetLastError());                        \
  } while (0)

/* =============================================================================================
 * slot target
 * =========================================================================================== */
typedef enum { SINK_NULL, SINK_FINITE, SINK_POS_INF, SINK_NEG_INF, SINK_MIX } sink_mode;

static void run_slot_target(gpu_env *env, tc_rng *rng, int64_t T, int H, int D, int64_t Tkv, int K,
                            sink_mode sm, int strided) {
  const int64_t q_sh = D, q_st = (int64_t)H * D + (strided ? 16 : 0), kv_st = D + (strided ? 8 : 0);
  const int64_t idx_st = K + (strided ? 3 : 0), tg_st = K + (strided ? 5 : 0);
  cr_log_info("slot_target: T=%lld H=%d D=%d T_kv=%lld K=%d sink=%d strided=%d", (long long)T, H, D,
              (long long)Tkv, K, (int)sm, strided);
  const size_t nq = T ? (size_t)((T - 1) * q_st + (H - 1) * q_sh + D) : 1;
  const size_t nkv = Tkv ? (size_t)((Tkv - 1) * kv_st + D) : 1;
  uint16_t *q = malloc(nq * 2), *kv = malloc(nkv * 2), *out = malloc(nz(T * H * 512) * 2);
  int32_t *idx = malloc(nz(T * idx_st) * 4), *len = malloc(nz(T) * 4);
  float *lse = malloc(nz(T * H) * 4), sink[DSA_MAX_HEADS];
  float *ref = malloc(nz(T * K) * 4);
  cr_assert(q && kv && out && idx && len && lse && ref);
  tc_fill_bf16(rng, q, nq, -1.0, 1.0);
  tc_fill_bf16(rng, kv, nkv, -1.0, 1.0);
  make_slots(rng, T, K, idx_st, Tkv, idx, len);
  for (int h = 0; h < H; ++h) {
    const float f = (float)tc_range(rng, -2.0, 3.0);
    sink[h] = sm == SINK_POS_INF ? INFINITY : sm == SINK_NEG_INF ? -INFINITY
              : sm == SINK_MIX ? (h % 3 == 0 ? INFINITY : h % 3 == 1 ? -INFINITY : f) : f;
  }
  const float scale = 1.0f / sqrtf((float)D);
  /* lse from the forward on the same inputs (+inf on rows without a valid slot) */
  dsa_attn_fwd_params fp = {.num_tokens = T, .num_heads = H, .head_dim = D, .num_kv = Tkv, .topk = K,
                            .softmax_scale = scale, .q = q, .q_stride_token = q_st, .q_stride_head = q_sh,
                            .kv = kv, .kv_stride = kv_st, .indices = idx, .indices_stride = idx_st,
                            .topk_length = len, .out = out, .lse = lse};
  TC_OK(dsa_ref_sparse_attn_fwd(&fp));
  dsa_slot_target_params p = {.num_tokens = T, .num_heads = H, .head_dim = D, .num_kv = Tkv, .topk = K,
                              .softmax_scale = scale, .q = q, .q_stride_token = q_st, .q_stride_head = q_sh,
                              .kv = kv, .kv_stride = kv_st, .indices = idx, .indices_stride = idx_st,
                              .topk_length = len, .sink = sm == SINK_NULL ? NULL : sink, .lse = lse,
                              .target = ref, .target_stride = K};
  TC_OK(dsa_ref_attn_slot_target(&p));
  uint8_t *zero = malloc(nz(T * K));
  cr_assert(zero);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) zero[t * K + j] = !slot_valid(idx, idx_st, len, K, Tkv, t, j);

  dsa_slot_target_params d = p;
  d.q = dcopy(q, nq * 2);
  d.kv = dcopy(kv, nkv * 2);
  d.indices = dcopy(idx, nz(T * idx_st) * 4);
  d.topk_length = dcopy(len, nz(T) * 4);
  d.sink = p.sink ? dcopy(sink, sizeof sink) : NULL;
  d.lse = dcopy(lse, nz(T * H) * 4);
  const size_t ntg = nz(T * tg_st) * 4;
  d.target = dpoison(ntg);
  d.target_stride = tg_st;
  /* both kernels (DSA_OPTION_TRAIN_KERNEL), each twice: equal to the reference, then bitwise
   * equal to itself; the sm_90a one may decline only off an H200-class device (DSA_TEST_REQUIRE_SM90) */
  for (int kernel = DSA_TRAIN_KERNEL_PORTABLE; kernel <= DSA_TRAIN_KERNEL_SM90; ++kernel) {
    float *first = NULL;
    for (int run = 0; run < 2; ++run) {
      TC_CUDA(cudaMemset(d.target, 0xFF, ntg));
      TC_SET_OPTION(env->ctx, DSA_OPTION_TRAIN_KERNEL, kernel);
      const dsa_status st = dsa_attn_slot_target(env->ctx, &d, env->stream);
      TC_SET_OPTION(env->ctx, DSA_OPTION_TRAIN_KERNEL, DSA_TRAIN_KERNEL_AUTO);
      if (kernel == DSA_TRAIN_KERNEL_SM90 && st == DSA_ERROR_UNSUPPORTED) {
        cr_assert(getenv("DSA_TEST_REQUIRE_SM90") == NULL, "the sm_90a slot target declined D=%d H=%d: %s", D, H,
                  dsa_last_error_message());
        cr_log_info("slot_target: the sm_90a kernel declined: %s", dsa_last_error_message());
        break;
      }
      TC_OK(st);
      TC_SYNC(env);
      float *got = hget(d.target, ntg);
      if (run == 0) {
        check_rows_f32("target", got, tg_st, ref, K, T, K, 1e-4, zero);
        check_gaps32("target", got, T, tg_st, K);
        first = got;
      } else {
        cr_assert(memcmp(first, got, ntg) == 0, "slot target (kernel %d) differs between two runs", kernel);
        free(got);
      }
    }
    free(first);
  }
  cudaFree((void *)d.q); cudaFree((void *)d.kv); cudaFree((void *)d.indices); cudaFree((void *)d.topk_length);
  cudaFree((void *)d.sink); cudaFree((void *)d.lse); cudaFree(d.target);
  free(q); free(kv); free(out); free(idx); free(len); free(lse); free(ref); free(zero);
}

Test(gpu_indexer_train, slot_target_matches_reference) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_indexer_train/slot_target_matches_reference");
  gpu_env env = env_open();
  static const int Hs[4] = {1, 16, 64, 128};
  static const sink_mode sinks[4] = {SINK_FINITE, SINK_MIX, SINK_NULL, SINK_POS_INF};
  for (int di = 0; di < 2; ++di)
    for (int hi = 0; hi < 4; ++hi)
      run_slot_target(&env, &rng, 37, Hs[hi], di ? 512 : 576, 50, 77, sinks[(hi + di) % 4], hi == 1);
  run_slot_target(&env, &rng, 37, 7, 576, 50, 77, SINK_NEG_INF, 1);
  run_slot_target(&env, &rng, 5, 3, 576, 0, 77, SINK_FINITE, 0); /* no keys: every slot invalid */
  /* many tiles (the sm_90a kernel's two KV stages), K not a multiple of 64, two head blocks with zero
   * rows in the second, K = DSA_MAX_ATTN_TOPK */
  run_slot_target(&env, &rng, 6, 100, 576, 3001, 2051, SINK_FINITE, 1);
  run_slot_target(&env, &rng, 3, 64, 512, 5003, 4096, SINK_MIX, 0);
  run_slot_target(&env, &rng, 11, 128, 576, 700, 192, SINK_NULL, 0);
  env_close(&env);
}

/* =============================================================================================
 * indexer slot scores and backward: shared inputs
 * =========================================================================================== */
typedef struct idx_case {
  int64_t T, Tk;
  int H, K;
  int wbf16, strided;
} idx_case;

typedef struct idx_inputs {
  int64_t q_st, q_sh, k_st, w_st, idx_st;
  size_t nq, nk, nw;
  uint16_t *q, *k;
  void *w;
  int32_t *idx, *len;
} idx_inputs;

static idx_inputs make_idx_inputs(tc_rng *r, const idx_case *c) {
  idx_inputs in;
  const int64_t T = c->T, H = c->H, K = c->K, Tk = c->Tk;
  in.q_sh = c->strided ? 136 : 128;
  in.q_st = H * in.q_sh + (c->strided ? 8 : 0);
  in.k_st = c->strided ? 144 : 128;
  in.w_st = H + (c->strided ? 3 : 0);
  in.idx_st = K + (c->strided ? 2 : 0);
  in.nq = T ? (size_t)((T - 1) * in.q_st + (H - 1) * in.q_sh + 128) : 1;
  in.nk = Tk ? (size_t)((Tk - 1) * in.k_st + 128) : 1;
  in.nw = nz(T * in.w_st);
  in.q = malloc(in.nq * 2);
  in.k = malloc(in.nk * 2);
  in.w = malloc(in.nw * 4);
  in.idx = malloc(nz(T * in.idx_st) * 4);
  in.len = malloc(nz(T) * 4);
  cr_assert(in.q && in.k && in.w && in.idx && in.len);
  fill_grid8(r, in.q, in.nq);
  fill_grid8(r, in.k, in.nk);
  for (size_t i = 0; i < in.nw; ++i) {
    const float v = (float)tc_range(r, -1.0, 1.0);
    if (c->wbf16) ((uint16_t *)in.w)[i] = dsa_f32_to_bf16(v);
    else ((float *)in.w)[i] = v;
  }
  make_slots(r, T, (int)K, in.idx_st, Tk, in.idx, in.len);
  return in;
}
static void free_idx_inputs(idx_inputs *in) {
  free(in->q); free(in->k); free(in->w); free(in->idx); free(in->len);
}

static void run_slot_scores(gpu_env *env, tc_rng *rng, const idx_case *c) {
  cr_log_info("slot_scores: T=%lld T_k=%lld H=%d K=%d bf16 weights=%d strided=%d", (long long)c->T,
              (long long)c->Tk, c->H, c->K, c->wbf16, c->strided);
  idx_inputs in = make_idx_inputs(rng, c);
  const int64_t T = c->T, K = c->K, sst = K + (c->strided ? 7 : 0);
  float *ref = malloc(nz(T * K) * 4);
  uint8_t *zero = malloc(nz(T * K));
  cr_assert(ref && zero);
  dsa_indexer_slot_scores_params p = {
      .num_tokens = T, .num_keys = c->Tk, .num_heads = c->H, .topk = c->K, .index_q = in.q,
      .q_stride_token = in.q_st, .q_stride_head = in.q_sh, .index_k = in.k, .k_stride = in.k_st,
      .weights = in.w, .weights_dtype = c->wbf16 ? DSA_DTYPE_BF16 : DSA_DTYPE_F32,
      .weights_stride = in.w_st, .indices = in.idx, .indices_stride = in.idx_st, .lengths = in.len,
      .scores = ref, .scores_stride = K};
  TC_OK(dsa_ref_indexer_slot_scores(&p));
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) zero[t * K + j] = !slot_valid(in.idx, in.idx_st, in.len, (int)K, c->Tk, t, j);
  dsa_indexer_slot_scores_params d = p;
  d.index_q = dcopy(in.q, in.nq * 2);
  d.index_k = dcopy(in.k, in.nk * 2);
  d.weights = dcopy(in.w, in.nw * 4);
  d.indices = dcopy(in.idx, nz(T * in.idx_st) * 4);
  d.lengths = dcopy(in.len, nz(T) * 4);
  const size_t ns = nz(T * sst) * 4;
  d.scores = dpoison(ns);
  d.scores_stride = sst;
  /* both kernels (DSA_OPTION_TRAIN_KERNEL), each twice: equal to the reference, then bitwise equal to
   * itself; the sm_90a one may decline only off an H200-class device (DSA_TEST_REQUIRE_SM90) */
  for (int kernel = DSA_TRAIN_KERNEL_PORTABLE; kernel <= DSA_TRAIN_KERNEL_SM90; ++kernel) {
    float *first = NULL;
    for (int run = 0; run < 2; ++run) {
      TC_CUDA(cudaMemset(d.scores, 0xFF, ns));
      TC_SET_OPTION(env->ctx, DSA_OPTION_TRAIN_KERNEL, kernel);
      const dsa_status st = dsa_indexer_slot_scores(env->ctx, &d, env->stream);
      TC_SET_OPTION(env->ctx, DSA_OPTION_TRAIN_KERNEL, DSA_TRAIN_KERNEL_AUTO);
      if (kernel == DSA_TRAIN_KERNEL_SM90 && st == DSA_ERROR_UNSUPPORTED) {
        cr_assert(getenv("DSA_TEST_REQUIRE_SM90") == NULL, "the sm_90a slot scores declined: %s",
                  dsa_last_error_message());
        break;
      }
      TC_OK(st);
      TC_SYNC(env);
      float *got = hget(d.scores, ns);
      if (run == 0) {
        check_rows_f32("scores", got, sst, ref, K, T, (int)K, 1e-4, zero);
        check_gaps32("scores", got, T, sst, (int)K);
        first = got;
      } else {
        cr_assert(memcmp(first, got, ns) == 0, "slot scores (kernel %d) differ between two runs", kernel);
        free(got);
      }
    }
    free(first);
  }
  cudaFree((void *)d.index_q); cudaFree((void *)d.index_k); cudaFree((void *)d.weights);
  cudaFree((void *)d.indices); cudaFree((void *)d.lengths); cudaFree(d.scores);
  free(ref); free(zero);
  free_idx_inputs(&in);
}

Test(gpu_indexer_train, slot_scores_match_reference) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_indexer_train/slot_scores_match_reference");
  gpu_env env = env_open();
  static const int Hs[4] = {1, 7, 32, 64};
  for (int hi = 0; hi < 4; ++hi)
    for (int wb = 0; wb < 2; ++wb) {
      const idx_case c = {37, hi % 2 ? 301 : 50, Hs[hi], 77, wb, (hi + wb) % 2};
      run_slot_scores(&env, &rng, &c);
    }
  const idx_case wide = {3, 2100, 64, 2048, 0, 0}; /* K = DSA_MAX_TOPK */
  run_slot_scores(&env, &rng, &wide);
  const idx_case tiles = {9, 700, 33, 450, 1, 1}; /* 8 tiles: the sm_90a kernel's stages wrap */
  run_slot_scores(&env, &rng, &tiles);
  env_close(&env);
}

/* =============================================================================================
 * indexer backward
 * =========================================================================================== */
/* The magnitude bases of d_index_q and d_index_k: the sums of |g w| [x > 0] |k| and |g w| [x > 0] |q|
 * over the same terms as the outputs (x is exact here: q and k are multiples of 1/8). The sm_90a
 * kernel feeds G = g w [x > 0] to the tensor cores as bf16, so each term carries up to 2^-9 of
 * relative error: its outputs are held to 1e-2 of the row's largest reference value plus 4e-3 of
 * this base (the CUDA-core kernels, in fp32, pass the first bound alone). */
static void indexer_bwd_bases(const idx_inputs *in, const idx_case *c, const float *g, int64_t g_st, float *bq,
                              float *bk) {
  const int64_t T = c->T, Tk = c->Tk, H = c->H, K = c->K;
  memset(bq, 0, nz(T * H * 128) * 4);
  memset(bk, 0, nz(Tk * 128) * 4);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      if (!slot_valid(in->idx, in->idx_st, in->len, (int)K, Tk, t, j)) continue;
      const int64_t s = in->idx[t * in->idx_st + j];
      const uint16_t *kr = in->k + s * in->k_st;
      for (int64_t h = 0; h < H; ++h) {
        const uint16_t *qr = in->q + t * in->q_st + h * in->q_sh;
        double x = 0;
        for (int d = 0; d < 128; ++d) x += (double)dsa_bf16_to_f32(qr[d]) * dsa_bf16_to_f32(kr[d]);
        if (!(x > 0)) continue;
        const double wv = c->wbf16 ? dsa_bf16_to_f32(((const uint16_t *)in->w)[t * in->w_st + h])
                                   : ((const float *)in->w)[t * in->w_st + h];
        const double a = fabs((double)g[t * g_st + j] * wv);
        for (int d = 0; d < 128; ++d) {
          bq[(t * H + h) * 128 + d] += (float)(a * fabs(dsa_bf16_to_f32(kr[d])));
          bk[s * 128 + d] += (float)(a * fabs(dsa_bf16_to_f32(qr[d])));
        }
      }
    }
}

/* check_rows_bf16 with the bound tol * (row max) + btol * base[element] (base contiguous like ref). */
static void check_rows_bf16_base(const char *what, const uint16_t *got, int64_t n0, int64_t s0, int64_t n1, int64_t s1,
                                 const uint16_t *ref, const float *base, int inner, double tol, double btol) {
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b) {
      const uint16_t *gr = got + a * s0 + b * s1, *e = ref + (a * n1 + b) * inner;
      const float *bs = base + (a * n1 + b) * inner;
      double mx = 0;
      for (int d = 0; d < inner; ++d) mx = fmax(mx, fabs((double)dsa_bf16_to_f32(e[d])));
      for (int d = 0; d < inner; ++d) {
        const double x = dsa_bf16_to_f32(gr[d]), y = dsa_bf16_to_f32(e[d]);
        cr_assert(!isnan(x) && !isnan(y), "%s[%lld, %lld, %d]: NaN (got %g, ref %g)", what, (long long)a,
                  (long long)b, d, x, y);
        cr_assert(fabs(x - y) <= tol * mx + btol * bs[d], "%s[%lld, %lld, %d]: got %.6g, ref %.6g (row max %g, base %g)",
                  what, (long long)a, (long long)b, d, x, y, mx, (double)bs[d]);
      }
    }
}
static void run_indexer_bwd(gpu_env *env, tc_rng *rng, const idx_case *c) {
  cr_log_info("indexer_bwd: T=%lld T_k=%lld H=%d K=%d bf16 weights=%d strided=%d", (long long)c->T,
              (long long)c->Tk, c->H, c->K, c->wbf16, c->strided);
  idx_inputs in = make_idx_inputs(rng, c);
  const int64_t T = c->T, Tk = c->Tk, H = c->H, K = c->K;
  const int64_t g_st = K + (c->strided ? 1 : 0);
  const int64_t dq_sh = c->strided ? 136 : 128, dq_st = H * dq_sh + (c->strided ? 16 : 0);
  const int64_t dw_st = H + (c->strided ? 2 : 0), dk_st = c->strided ? 136 : 128;
  float *g = malloc(nz(T * g_st) * 4);
  cr_assert(g);
  tc_fill_f32(rng, g, nz(T * g_st), -0.5, 0.5);
  for (int64_t t = 0; t < T; ++t) /* invalid slots: anything, never read (NaN here) */
    for (int j = 0; j < K; ++j)
      if (!slot_valid(in.idx, in.idx_st, in.len, (int)K, Tk, t, j)) g[t * g_st + j] = NAN;
  uint16_t *dq_ref = malloc(nz(T * H * 128) * 2), *dk_ref = malloc(nz(Tk * 128) * 2);
  float *dw_ref = malloc(nz(T * H) * 4);
  cr_assert(dq_ref && dk_ref && dw_ref);
  dsa_indexer_bwd_params p = {
      .num_tokens = T, .num_keys = Tk, .num_heads = c->H, .topk = c->K, .index_q = in.q,
      .q_stride_token = in.q_st, .q_stride_head = in.q_sh, .index_k = in.k, .k_stride = in.k_st,
      .weights = in.w, .weights_dtype = c->wbf16 ? DSA_DTYPE_BF16 : DSA_DTYPE_F32,
      .weights_stride = in.w_st, .indices = in.idx, .indices_stride = in.idx_st, .lengths = in.len,
      .grad = g, .grad_stride = g_st, .d_index_q = dq_ref, .d_weights = dw_ref, .d_index_k = dk_ref};
  TC_OK(dsa_ref_indexer_bwd(&p));
  /* d_weights' tolerance base: sum_j |g| ReLU(x) (the reference on |g|), the size of its terms */
  float *g_abs = malloc(nz(T * g_st) * 4), *dw_base = malloc(nz(T * H) * 4);
  uint16_t *dq_scr = malloc(nz(T * H * 128) * 2), *dk_scr = malloc(nz(Tk * 128) * 2);
  cr_assert(g_abs && dw_base && dq_scr && dk_scr);
  for (size_t i = 0; i < nz(T * g_st); ++i) g_abs[i] = fabsf(g[i]);
  dsa_indexer_bwd_params pa = p;
  pa.grad = g_abs;
  pa.d_index_q = dq_scr;
  pa.d_weights = dw_base;
  pa.d_index_k = dk_scr;
  TC_OK(dsa_ref_indexer_bwd(&pa));
  free(g_abs); free(dq_scr); free(dk_scr);
  float *bq = malloc(nz(T * H * 128) * 4), *bk = malloc(nz(Tk * 128) * 4);
  cr_assert(bq && bk);
  indexer_bwd_bases(&in, c, g, g_st, bq, bk);
  dsa_indexer_bwd_params d = p;
  d.index_q = dcopy(in.q, in.nq * 2);
  d.index_k = dcopy(in.k, in.nk * 2);
  d.weights = dcopy(in.w, in.nw * 4);
  d.indices = dcopy(in.idx, nz(T * in.idx_st) * 4);
  d.lengths = dcopy(in.len, nz(T) * 4);
  d.grad = dcopy(g, nz(T * g_st) * 4);
  const size_t ndq = (T ? (size_t)((T - 1) * dq_st + (H - 1) * dq_sh + 128) : 1) * 2;
  const size_t ndw = nz(T * dw_st) * 4, ndk = (Tk ? (size_t)((Tk - 1) * dk_st + 128) : 1) * 2;
  d.d_index_q = dpoison(ndq);
  d.dq_stride_token = dq_st;
  d.dq_stride_head = dq_sh;
  d.d_weights = dpoison(ndw);
  d.dw_stride = dw_st;
  d.d_index_k = dpoison(ndk);
  d.dk_stride = dk_st;
  /* both kernels (DSA_OPTION_TRAIN_KERNEL) in both modes, and AUTO in the deterministic mode (on cc
   * 9.0 the sm_90a kernel's slot-rows pass, as SM90 forced; elsewhere the CUDA-core sorted pass); the
   * sm_90a one may decline only off an H200-class device (DSA_TEST_REQUIRE_SM90) */
  for (int kd = 0; kd < 5; ++kd) {
    const int det = kd == 4 ? 1 : kd % 2;
    const int kernel = kd == 4 ? DSA_TRAIN_KERNEL_AUTO : kd < 2 ? DSA_TRAIN_KERNEL_PORTABLE : DSA_TRAIN_KERNEL_SM90;
    d.deterministic = det;
    size_t bytes = 0, again = 0;
    TC_OK(dsa_indexer_bwd(env->ctx, &d, NULL, &bytes, env->stream));
    TC_OK(dsa_indexer_bwd(NULL, &d, NULL, &again, env->stream));
    cr_assert(bytes >= 1 && bytes == again, "workspace size %zu with a context, %zu without", bytes, again);
    unsigned char *ws;
    TC_CUDA(cudaMalloc((void **)&ws, bytes + 1));
    uint16_t *first_dq = NULL, *first_dk = NULL;
    float *first_dw = NULL;
    for (int run = 0; run < 2; ++run) {
      TC_CUDA(cudaMemset(d.d_index_q, 0xFF, ndq));
      TC_CUDA(cudaMemset(d.d_weights, 0xFF, ndw));
      TC_CUDA(cudaMemset(d.d_index_k, 0xFF, ndk));
      TC_CUDA(cudaMemset(ws, 0xFF, bytes + 1)); /* a stale workspace must not matter */
      size_t b = bytes;
      TC_SET_OPTION(env->ctx, DSA_OPTION_TRAIN_KERNEL, kernel);
      const dsa_status st = dsa_indexer_bwd(env->ctx, &d, ws + 1, &b, env->stream);
      TC_SET_OPTION(env->ctx, DSA_OPTION_TRAIN_KERNEL, DSA_TRAIN_KERNEL_AUTO);
      if (kernel == DSA_TRAIN_KERNEL_SM90 && st == DSA_ERROR_UNSUPPORTED) {
        cr_assert(getenv("DSA_TEST_REQUIRE_SM90") == NULL, "the sm_90a indexer backward declined: %s",
                  dsa_last_error_message());
        cr_log_info("indexer_bwd: the sm_90a kernel declined: %s", dsa_last_error_message());
        break;
      }
      TC_OK(st);
      TC_SYNC(env);
      uint16_t *dq = hget(d.d_index_q, ndq), *dk = hget(d.d_index_k, ndk);
      float *dw = hget(d.d_weights, ndw);
      if (run == 0) {
        cr_log_info("indexer_bwd: kernel %d deterministic %d", kernel, det);
        if (kernel == DSA_TRAIN_KERNEL_PORTABLE) {
          check_rows_bf16(det ? "d_index_q (det)" : "d_index_q", dq, T, dq_st, H, dq_sh, dq_ref, 128, 1e-2);
          check_rows_bf16(det ? "d_index_k (det)" : "d_index_k", dk, Tk, dk_st, 1, 0, dk_ref, 128, 1e-2);
        } else { /* the sm_90a kernel's G is bf16 (the _base bounds, which also hold for AUTO's
                  * CUDA-core fallback off cc 9.0); the deterministic d_index_k is the slot rows' */
          check_rows_bf16_base("d_index_q (sm90)", dq, T, dq_st, H, dq_sh, dq_ref, bq, 128, 1e-2, 4e-3);
          check_rows_bf16_base(det ? "d_index_k (det, sm90 rows)" : "d_index_k (sm90)", dk, Tk, dk_st, 1, 0, dk_ref,
                               bk, 128, 1e-2, 4e-3);
        }
        check_rows_f32_base("d_weights", dw, dw_st, dw_ref, H, dw_base, T, (int)H, 1e-4, NULL);
        if (T > 0) check_gaps_bf16("d_index_q", dq, ndq / 2, T, dq_st, H, dq_sh, 128);
        if (Tk > 0) check_gaps_bf16("d_index_k", dk, ndk / 2, Tk, dk_st, 1, 0, 128);
        check_gaps32("d_weights", dw, T, dw_st, (int)H);
        first_dq = dq;
        first_dk = dk;
        first_dw = dw;
      } else {
        cr_assert(memcmp(first_dq, dq, ndq) == 0, "d_index_q (deterministic = %d) differs between runs", det);
        cr_assert(memcmp(first_dw, dw, ndw) == 0, "d_weights (deterministic = %d) differs between runs", det);
        if (det) cr_assert(memcmp(first_dk, dk, ndk) == 0, "deterministic d_index_k differs between runs");
        free(dq); free(dk); free(dw);
      }
    }
    free(first_dq); free(first_dk); free(first_dw);
    TC_CUDA(cudaFree(ws));
  }
  cudaFree((void *)d.index_q); cudaFree((void *)d.index_k); cudaFree((void *)d.weights);
  cudaFree((void *)d.indices); cudaFree((void *)d.lengths); cudaFree((void *)d.grad);
  cudaFree(d.d_index_q); cudaFree(d.d_weights); cudaFree(d.d_index_k);
  free(g); free(dq_ref); free(dk_ref); free(dw_ref); free(dw_base); free(bq); free(bk);
  free_idx_inputs(&in);
}

Test(gpu_indexer_train, indexer_bwd_matches_reference) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_indexer_train/indexer_bwd_matches_reference");
  gpu_env env = env_open();
  static const int Hs[4] = {1, 7, 32, 64};
  for (int hi = 0; hi < 4; ++hi)
    for (int wb = 0; wb < 2; ++wb) {
      const idx_case c = {37, hi % 2 ? 50 : 301, Hs[hi], 77, wb, (hi + wb) % 2};
      run_indexer_bwd(&env, &rng, &c);
    }
  const idx_case few_keys = {37, 3, 64, 77, 0, 0};   /* many tokens per key: long sorted lists */
  const idx_case no_tokens = {0, 41, 7, 77, 0, 1};   /* d_index_k all zeros */
  const idx_case no_keys = {6, 0, 7, 77, 1, 0};      /* every slot invalid: d_index_q, d_weights 0 */
  const idx_case wide = {2, 2100, 32, 2048, 1, 0};   /* K = DSA_MAX_TOPK */
  const idx_case tiles = {9, 700, 33, 450, 0, 1};     /* 8 tiles (the sm_90a kernel's stages wrap), K % 64 != 0 */
  const idx_case chunks = {600, 300, 32, 77, 1, 0};   /* T above the slot-rows pass's 264-token chunks */
  run_indexer_bwd(&env, &rng, &few_keys);
  run_indexer_bwd(&env, &rng, &tiles);
  run_indexer_bwd(&env, &rng, &chunks);
  run_indexer_bwd(&env, &rng, &no_tokens);
  run_indexer_bwd(&env, &rng, &no_keys);
  run_indexer_bwd(&env, &rng, &wide);
  env_close(&env);
}

/* =============================================================================================
 * loss
 * =========================================================================================== */
static void run_loss(gpu_env *env, tc_rng *rng, int64_t T, int K, int64_t nkeys, int with_grad,
                     int with_gl, int strided) {
  cr_log_info("loss: T=%lld K=%d keys=%lld grad=%d grad_loss=%d strided=%d", (long long)T, K,
              (long long)nkeys, with_grad, with_gl, strided);
  const int64_t ist = K + (strided ? 3 : 0), ast = K + (strided ? 1 : 0), zst = K + (strided ? 2 : 0);
  const int64_t gst = K + (strided ? 5 : 0);
  int32_t *idx = malloc(nz(T * ist) * 4), *len = malloc(nz(T) * 4);
  float *a = malloc(nz(T * ast) * 4), *z = malloc(nz(T * zst) * 4), *g_ref = malloc(nz(T * K) * 4);
  uint8_t *zero = malloc(nz(T * K));
  cr_assert(idx && len && a && z && g_ref && zero);
  make_slots(rng, T, K, ist, nkeys, idx, len);
  tc_fill_f32(rng, z, nz(T * zst), -4.0, 4.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < ast; ++j) {
      const double u = tc_uniform(rng);
      float v = (float)tc_range(rng, 0.0, 2.0);
      if (t % 5 == 2) v = 0.0f;                    /* a row whose target sums to 0 */
      else if (u < 0.1) v = 0.0f;                  /* tgt = 0 terms */
      else if (u < 0.15) v = 1e-30f;               /* tiny targets */
      a[t * ast + j] = v;
    }
  if (T > 3) z[3 * zst + 1] = 80.0f; /* a large score: p of the others underflows, log p stays finite */
  const float gl = 0.625f;
  float loss_ref = NAN;
  dsa_indexer_loss_params p = {.num_tokens = T, .topk = K, .num_keys = nkeys, .indices = idx,
                               .indices_stride = ist, .lengths = len, .target = a, .target_stride = ast,
                               .scores = z, .scores_stride = zst, .coeff = 0.7f,
                               .grad_loss = with_gl ? &gl : NULL, .loss = &loss_ref,
                               .grad = with_grad ? g_ref : NULL, .grad_stride = K};
  TC_OK(dsa_ref_indexer_loss(&p));
  /* g's tolerance base: |grad_loss coeff / N| tgt (g = that factor times p - tgt, which cancels in a
   * row of two valid slots) */
  float *g_base = malloc(nz(T * K) * 4);
  double *row_sa = malloc(nz(T) * 8);
  cr_assert(g_base && row_sa);
  int64_t N = 0;
  for (int64_t t = 0; t < T; ++t) {
    int any = 0;
    double sa = 0;
    for (int j = 0; j < K; ++j)
      if (slot_valid(idx, ist, len, K, nkeys, t, j)) {
        any = 1;
        sa += a[t * ast + j];
      }
    for (int j = 0; j < K; ++j)
      zero[t * K + j] = !(any && sa > 0) || !slot_valid(idx, ist, len, K, nkeys, t, j);
    row_sa[t] = sa;
    N += any && sa > 0;
  }
  const double gfac = N > 0 ? fabs((with_gl ? (double)gl : 1.0) * (double)p.coeff / (double)N) : 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j)
      g_base[t * K + j] = zero[t * K + j] ? 0.0f : (float)(gfac * a[t * ast + j] / row_sa[t]);
  free(row_sa);
  dsa_indexer_loss_params d = p;
  d.indices = dcopy(idx, nz(T * ist) * 4);
  d.lengths = dcopy(len, nz(T) * 4);
  d.target = dcopy(a, nz(T * ast) * 4);
  d.scores = dcopy(z, nz(T * zst) * 4);
  d.grad_loss = with_gl ? dcopy(&gl, 4) : NULL;
  d.loss = dpoison(4);
  const size_t ng = nz(T * gst) * 4;
  float *dgrad = dpoison(ng);
  d.grad = with_grad ? dgrad : NULL;
  d.grad_stride = gst;
  size_t bytes = 0, again = 0;
  TC_OK(dsa_indexer_loss(NULL, &d, NULL, &bytes, env->stream));
  TC_OK(dsa_indexer_loss(env->ctx, &d, NULL, &again, env->stream));
  cr_assert(bytes >= 1 && bytes == again);
  unsigned char *ws;
  TC_CUDA(cudaMalloc((void **)&ws, bytes + 1));
  /* a workspace one byte short: nothing written */
  size_t b = bytes - 1;
  TC_FAILS(dsa_indexer_loss(env->ctx, &d, ws + 1, &b, env->stream), DSA_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  TC_SYNC(env);
  float loss_got, *first = NULL, first_loss = 0;
  TC_CUDA(cudaMemcpy(&loss_got, d.loss, 4, cudaMemcpyDeviceToHost));
  cr_assert(tc_bytes_are(&loss_got, 4, 0xFF), "a failed call wrote the loss");
  for (int run = 0; run < 2; ++run) {
    TC_CUDA(cudaMemset((void *)d.loss, 0xFF, 4));
    TC_CUDA(cudaMemset(dgrad, 0xFF, ng));
    TC_CUDA(cudaMemset(ws, 0xFF, bytes + 1));
    b = bytes;
    TC_OK(dsa_indexer_loss(env->ctx, &d, ws + 1, &b, env->stream));
    TC_SYNC(env);
    TC_CUDA(cudaMemcpy(&loss_got, d.loss, 4, cudaMemcpyDeviceToHost));
    float *got = hget(dgrad, ng);
    if (run == 0) {
      cr_assert(!isnan(loss_got) && !isnan(loss_ref), "loss NaN: got %g, ref %g", (double)loss_got,
                (double)loss_ref);
      cr_assert(fabs((double)loss_got - loss_ref) <= 1e-4 * fabs((double)loss_ref) + 1e-6,
                "loss: got %.9g, ref %.9g", (double)loss_got, (double)loss_ref);
      if (T == 0) cr_assert(loss_got == 0.0f);
      if (with_grad) {
        check_rows_f32_base("g", got, gst, g_ref, K, g_base, T, K, 1e-4, zero);
        check_gaps32("g", got, T, gst, K);
      } else {
        cr_assert(tc_bytes_are(got, ng, 0xFF), "grad = NULL but the buffer was written");
      }
      first = got;
      first_loss = loss_got;
    } else {
      cr_assert(memcmp(&first_loss, &loss_got, 4) == 0, "the loss differs between two runs: %.9g, %.9g",
                (double)first_loss, (double)loss_got);
      cr_assert(memcmp(first, got, ng) == 0, "g differs between two runs");
      free(got);
    }
  }
  free(first);
  TC_CUDA(cudaFree(ws));
  cudaFree((void *)d.indices); cudaFree((void *)d.lengths); cudaFree((void *)d.target);
  cudaFree((void *)d.scores); cudaFree((void *)d.grad_loss); cudaFree(d.loss); cudaFree(dgrad);
  free(idx); free(len); free(a); free(z); free(g_ref); free(zero); free(g_base);
}

Test(gpu_indexer_train, loss_matches_reference) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_indexer_train/loss_matches_reference");
  gpu_env env = env_open();
  run_loss(&env, &rng, 37, 77, 50, 1, 0, 0);
  run_loss(&env, &rng, 37, 77, 50, 1, 1, 1);
  run_loss(&env, &rng, 37, 77, 50, 0, 1, 0);
  run_loss(&env, &rng, 1000, 2048, 3000, 1, 1, 0); /* K = DSA_MAX_TOPK, many rows for the reduction */
  run_loss(&env, &rng, 37, 5, 0, 1, 0, 0);         /* no keys: no row counts, loss 0, g 0 */
  run_loss(&env, &rng, 0, 77, 50, 1, 1, 0);        /* T = 0: loss 0 */
  env_close(&env);
}

/* =============================================================================================
 * bad inputs write nothing; too-small workspaces
 * =========================================================================================== */
Test(gpu_indexer_train, bad_inputs_write_nothing) {
  TC_REQUIRE_GPU();
  gpu_env env = env_open();
  enum { T = 3, H = 2, K = 4, TK = 5 };
  uint16_t *q = dpoison(T * H * 576 * 2), *kv = dpoison(TK * 576 * 2);
  int32_t *idx = dpoison(T * K * 4);
  float *lse = dpoison(T * H * 4), *out = dpoison(T * K * 4), *w = dpoison(T * H * 4);
  uint16_t *dq = dpoison(T * H * 128 * 2), *dk = dpoison(TK * 128 * 2);
  float *dw = dpoison(T * H * 4), *loss = dpoison(4);
  TC_CUDA(cudaMemset(idx, 0, T * K * 4));
  dsa_slot_target_params st = {.num_tokens = T, .num_heads = H, .head_dim = 576, .num_kv = TK, .topk = K,
                               .softmax_scale = 0.1f, .q = q, .kv = kv, .indices = idx, .lse = lse,
                               .target = out};
  st.softmax_scale = -1.0f;
  TC_FAILS(dsa_attn_slot_target(env.ctx, &st, env.stream), DSA_ERROR_INVALID_ARGUMENT, "softmax_scale");
  st.softmax_scale = 0.1f;
  st.lse = NULL;
  TC_FAILS(dsa_attn_slot_target(env.ctx, &st, env.stream), DSA_ERROR_INVALID_ARGUMENT, "lse");
  TC_FAILS(dsa_attn_slot_target(NULL, &st, env.stream), DSA_ERROR_INVALID_ARGUMENT, "lse");
  dsa_indexer_slot_scores_params ss = {.num_tokens = T, .num_keys = TK, .num_heads = H, .topk = K,
                                       .index_q = q, .index_k = kv, .weights = w,
                                       .weights_dtype = DSA_DTYPE_F32, .indices = idx, .scores = out};
  ss.q_stride_head = 100; /* not a multiple of 8 */
  TC_FAILS(dsa_indexer_slot_scores(env.ctx, &ss, env.stream), DSA_ERROR_INVALID_ARGUMENT, "q_stride_head");
  dsa_indexer_bwd_params bw = {.num_tokens = T, .num_keys = TK, .num_heads = H, .topk = K, .index_q = q,
                               .index_k = kv, .weights = w, .weights_dtype = DSA_DTYPE_F32, .indices = idx,
                               .grad = out, .d_index_q = dq, .d_weights = dw, .d_index_k = dk};
  for (int det = 0; det < 2; ++det) {
    bw.deterministic = det;
    size_t bytes = 0;
    TC_OK(dsa_indexer_bwd(env.ctx, &bw, NULL, &bytes, env.stream));
    unsigned char *ws;
    TC_CUDA(cudaMalloc((void **)&ws, bytes));
    size_t b = bytes - 1;
    TC_FAILS(dsa_indexer_bwd(env.ctx, &bw, ws, &b, env.stream), DSA_ERROR_WORKSPACE_TOO_SMALL, "workspace_bytes");
    cr_assert_eq(b, bytes - 1);
    bw.num_heads = 65;
    b = bytes;
    TC_FAILS(dsa_indexer_bwd(env.ctx, &bw, ws, &b, env.stream), DSA_ERROR_INVALID_ARGUMENT, "num_heads");
    bw.num_heads = H;
    TC_FAILS(dsa_indexer_bwd(NULL, &bw, ws, &b, env.stream), DSA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    TC_CUDA(cudaFree(ws));
  }
  dsa_indexer_loss_params lp = {.num_tokens = T, .topk = K, .num_keys = TK, .indices = idx, .target = out,
                                .scores = out, .coeff = INFINITY, .loss = loss};
  size_t lb = 0;
  TC_FAILS(dsa_indexer_loss(env.ctx, &lp, NULL, &lb, env.stream), DSA_ERROR_INVALID_ARGUMENT, "coeff");
  cr_assert_eq(lb, 0, "a failed size query wrote the size");
  TC_SYNC(&env);
  const struct { const char *name; void *ptr; size_t bytes; } outs[] = {
      {"target / scores", out, T * K * 4}, {"d_index_q", dq, T * H * 128 * 2}, {"d_weights", dw, T * H * 4},
      {"d_index_k", dk, TK * 128 * 2}, {"loss", loss, 4}};
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; ++i) {
    void *h = hget(outs[i].ptr, outs[i].bytes);
    cr_assert(tc_bytes_are(h, outs[i].bytes, 0xFF), "%s was written by a failed call", outs[i].name);
    free(h);
  }
  cudaFree(q); cudaFree(kv); cudaFree(idx); cudaFree(lse); cudaFree(out); cudaFree(w);
  cudaFree(dq); cudaFree(dk); cudaFree(dw); cudaFree(loss);
  env_close(&env);
}
