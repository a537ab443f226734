/* test_gpu_large.c - sizes where 32-bit address arithmetic would break (docs/reliability.md
 * section 5): every kernel family with a tensor of more than 2^31 elements, addressed at offsets
 * beyond 2^31 (kv with 3.8M rows of 576 in forward and backward, q with T * H * 576 > 2^31, top-k
 * scores with rows * ld > 2^31, the indexer's index_k beyond 2^31 elements through a
 * context-parallel query range in a second document, compaction with a row stride of 2048 over
 * 1.1M rows, head padding to a q_out beyond 2^31 elements), and 2^20 queries (forward, top-k,
 * indexer). Sampled checks against the CPU reference keep the run at seconds per test on an H200:
 * only the rows the checks read carry random data (the rest of a big tensor is a constant memset
 * pattern: a wrapped offset reads the pattern instead and fails the comparison), the reference
 * runs on the sampled rows (attention: on a compact copy of the referenced kv rows, indices
 * remapped). Allocation failure (a smaller card) skips the test with the size. Skipped under
 * DSA_TEST_SANITIZE (`make sanitize`): the tools would take minutes per launch on these tensors.
 * Needs about 18 GB of device memory at most (backward with a large q) and as much host memory
 * only for lazily touched buffers. */
#include "test_common.h"

#define LG_D 576
#define LG_V 512
#define LG_PATTERN 0x3C /* memset byte: bf16 0x3C3C = 0.0115, fp32 0x3C3C3C3C = 0.0115 */
#define TWO31 ((int64_t)1 << 31)

typedef struct {
  dsa_context *ctx;
  cudaStream_t stream;
} lg_env;

static lg_env lg_open(void) {
  lg_env e;
  TC_REQUIRE_GPU();
  if (tc_sanitize()) cr_skip_test("gpu_large is skipped under DSA_TEST_SANITIZE (multi-GB tensors)");
  TC_OK(tc_context_create(&e.ctx));
  TC_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamDefault));
  return e;
}

static void lg_close(lg_env *e) {
  TC_CUDA(cudaStreamDestroy(e->stream));
  dsa_context_destroy(e->ctx);
}

static void *lg_up(const void *h, size_t bytes) {
  void *d = NULL;
  TC_MALLOC_OR_SKIP(d, bytes ? bytes : 16);
  if (bytes && h) TC_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

static int lg_close_f(float g, float r) {
  if (!isfinite(r)) return memcmp(&g, &r, 4) == 0;
  return fabsf(g - r) <= 2e-3f * (1.0f + fabsf(r));
}

/* ============================================================================================= *
 * attention forward: run one configuration against reference rows
 * ============================================================================================= */
typedef struct {
  int64_t T, Tkv;
  int H, K;
  /* device tensors (full size) */
  uint16_t *dq, *dkv, *dout;
  int32_t *didx;
  float *dlse;
} lg_fwd;

/* Checks sampled tokens: out rows [ns, H, 512] and lse [ns, H] of the reference against the
 * device's rows tok[i]. */
static void lg_fwd_check(const lg_fwd *f, const int64_t *tok, int64_t ns, const uint16_t *rout,
                         const float *rlse, const char *what) {
  const int H = f->H;
  uint16_t *o = (uint16_t *)malloc((size_t)H * LG_V * 2);
  float *l = (float *)malloc((size_t)H * 4);
  cr_assert(o && l);
  for (int64_t i = 0; i < ns; ++i) {
    const int64_t t = tok[i];
    TC_CUDA(cudaMemcpy(o, f->dout + t * H * LG_V, (size_t)H * LG_V * 2, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemcpy(l, f->dlse + t * H, (size_t)H * 4, cudaMemcpyDeviceToHost));
    for (int h = 0; h < H; ++h) {
      const double err = tc_rel_err_bf16(o + h * LG_V, rout + (i * H + h) * LG_V, LG_V);
      cr_assert(err <= 1e-2, "%s: out[t=%lld, h=%d] relative error %g", what, (long long)t, h, err);
      cr_assert(lg_close_f(l[h], rlse[i * H + h]), "%s: lse[t=%lld, h=%d] = %g, reference %g", what,
                (long long)t, h, l[h], rlse[i * H + h]);
    }
  }
  free(o);
  free(l);
}

/* Runs the forward with each variant in vars (0-terminated list), poisoning out / lse first;
 * DSA_ERROR_UNSUPPORTED is logged and skipped. */
static void lg_fwd_run(lg_env *e, lg_fwd *f, const int *vars, const int64_t *tok, int64_t ns,
                       const uint16_t *rout, const float *rlse, const char *what) {
  static const char *const vn[5] = {"auto", "portable", "sm90", "sm90-small", "sm90-split"};
  dsa_attn_fwd_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = f->T;
  p.num_heads = f->H;
  p.head_dim = LG_D;
  p.num_kv = f->Tkv;
  p.topk = f->K;
  p.softmax_scale = 0.0625f;
  p.q = f->dq;
  p.kv = f->dkv;
  p.indices = f->didx;
  p.out = f->dout;
  p.lse = f->dlse;
  for (const int *v = vars; *v; ++v) {
    char w[160];
    snprintf(w, sizeof w, "%s [%s]", what, vn[*v]);
    TC_CUDA(cudaMemset(f->dout, 0xFF, (size_t)(f->T * f->H * LG_V) * 2));
    TC_CUDA(cudaMemset(f->dlse, 0xFF, (size_t)(f->T * f->H) * 4));
    TC_CUDA(cudaDeviceSynchronize());
    TC_SET_OPTION(e->ctx, DSA_OPTION_FWD_KERNEL, *v);
    dsa_status st = dsa_sparse_attn_fwd(e->ctx, &p, e->stream);
    TC_SET_OPTION(e->ctx, DSA_OPTION_FWD_KERNEL, DSA_FWD_KERNEL_AUTO);
    if (st == DSA_ERROR_UNSUPPORTED) {
      cr_log_info("%s: declined (%s)", w, dsa_last_error_message());
      continue;
    }
    cr_assert(st == DSA_SUCCESS, "%s: %s", w, dsa_last_error_message());
    TC_CUDA(cudaStreamSynchronize(e->stream));
    lg_fwd_check(f, tok, ns, rout, rlse, w);
    cr_log_info("%s: %lld tokens checked", w, (long long)ns);
  }
}

/* kv rows of the big tensor that carry data: A = [0, na) and B = [Tkv - nb, Tkv); the compact
 * copy is [A | B]. */
static int32_t lg_remap(int32_t i, int64_t Tkv, int64_t na, int64_t nb) {
  if (i < 0) return i;
  if (i < na) return i;
  return (int32_t)(na + (i - (Tkv - nb)));
}

/* Forward with kv of 3.8M x 576 (> 2^31 elements), indices near the end. */
Test(gpu_large, attn_fwd_kv_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/attn_fwd_kv_beyond_2pow31");
  const int64_t Tkv = 3800000, na = 64, nb = 4096, T = 64;
  const int K = 128;
  cr_assert(Tkv * LG_D > TWO31);
  uint16_t *dkv = NULL;
  TC_MALLOC_OR_SKIP(dkv, (size_t)(Tkv * LG_D) * 2);
  TC_CUDA(cudaMemset(dkv, LG_PATTERN, (size_t)(Tkv * LG_D) * 2));
  uint16_t *ckv = (uint16_t *)malloc((size_t)((na + nb) * LG_D) * 2);
  cr_assert_not_null(ckv);
  tc_fill_bf16(&r, ckv, (size_t)((na + nb) * LG_D), -1.0, 1.0);
  TC_CUDA(cudaMemcpy(dkv, ckv, (size_t)(na * LG_D) * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(dkv + (Tkv - nb) * LG_D, ckv + na * LG_D, (size_t)(nb * LG_D) * 2, cudaMemcpyHostToDevice));
  int32_t *idx = (int32_t *)malloc((size_t)(T * K) * 4), *cidx = (int32_t *)malloc((size_t)(T * K) * 4);
  cr_assert(idx && cidx);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t u = tc_below(&r, 32);
    idx[i] = u == 0 ? -1 : u < 5 ? (int32_t)tc_below(&r, na) : (int32_t)(Tkv - nb + tc_below(&r, nb));
  }
  idx[0] = (int32_t)(Tkv - 1);
  idx[K] = (int32_t)(TWO31 / LG_D + 1); /* past the 2^31-element boundary but not carrying data */
  for (int64_t i = 0; i < T * K; ++i) cidx[i] = lg_remap(idx[i], Tkv, na, nb);
  cidx[K] = -1; /* reference: that row is the pattern; handled below by excluding token 1 */
  static const int heads[2] = {16, 64};
  for (int hi = 0; hi < 2; ++hi) {
    const int H = heads[hi];
    uint16_t *q = (uint16_t *)malloc((size_t)(T * H * LG_D) * 2);
    cr_assert_not_null(q);
    tc_fill_bf16(&r, q, (size_t)(T * H * LG_D), -1.0, 1.0);
    /* reference on the compact kv; token 1 reads a pattern row, so it is left out of the check */
    uint16_t *rout = (uint16_t *)malloc((size_t)(T * H * LG_V) * 2);
    float *rlse = (float *)malloc((size_t)(T * H) * 4);
    dsa_attn_fwd_params p;
    memset(&p, 0, sizeof p);
    p.num_tokens = T;
    p.num_heads = H;
    p.head_dim = LG_D;
    p.num_kv = na + nb;
    p.topk = K;
    p.softmax_scale = 0.0625f;
    p.q = q;
    p.kv = ckv;
    p.indices = cidx;
    p.out = rout;
    p.lse = rlse;
    TC_OK(dsa_ref_sparse_attn_fwd(&p));
    int64_t tok[64], ns = 0;
    for (int64_t t = 0; t < T; ++t)
      if (t != 1) tok[ns++] = t;
    /* the reference rows of the sampled tokens, packed */
    uint16_t *so = (uint16_t *)malloc((size_t)(ns * H * LG_V) * 2);
    float *sl = (float *)malloc((size_t)(ns * H) * 4);
    for (int64_t i = 0; i < ns; ++i) {
      memcpy(so + i * H * LG_V, rout + tok[i] * H * LG_V, (size_t)H * LG_V * 2);
      memcpy(sl + i * H, rlse + tok[i] * H, (size_t)H * 4);
    }
    lg_fwd f = {T, Tkv, H, K, NULL, dkv, NULL, NULL, NULL};
    f.dq = (uint16_t *)lg_up(q, (size_t)(T * H * LG_D) * 2);
    f.didx = (int32_t *)lg_up(idx, (size_t)(T * K) * 4);
    f.dout = (uint16_t *)lg_up(NULL, (size_t)(T * H * LG_V) * 2);
    f.dlse = (float *)lg_up(NULL, (size_t)(T * H) * 4);
    static const int vars[] = {1, 2, 3, 4, 0};
    char what[64];
    snprintf(what, sizeof what, "fwd Tkv=%lld H=%d", (long long)Tkv, H);
    lg_fwd_run(&e, &f, vars, tok, ns, so, sl, what);
    cudaFree(f.dq), cudaFree(f.didx), cudaFree(f.dout), cudaFree(f.dlse);
    free(q), free(rout), free(rlse), free(so), free(sl);
  }
  cudaFree(dkv);
  free(ckv), free(idx), free(cidx);
  lg_close(&e);
}

/* Sampled tokens of a long q: the ends, the middle, both sides of the 2^31-element boundary. */
static int64_t lg_samples(int64_t T, int64_t row_elems, int64_t extra, tc_rng *r, int64_t *tok) {
  int64_t n = 0;
  const int64_t b = TWO31 / row_elems;
  const int64_t fixed[] = {0, 1, T / 2, b - 1, b, b + 1, T - 3, T - 2, T - 1};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; ++i)
    if (fixed[i] >= 0 && fixed[i] < T) tok[n++] = fixed[i];
  for (int64_t i = 0; i < extra; ++i) tok[n++] = tc_below(r, T);
  /* sort, unique */
  for (int64_t i = 1; i < n; ++i)
    for (int64_t j = i; j > 0 && tok[j - 1] > tok[j]; --j) {
      int64_t x = tok[j];
      tok[j] = tok[j - 1];
      tok[j - 1] = x;
    }
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (m == 0 || tok[m - 1] != tok[i]) tok[m++] = tok[i];
  return m;
}

/* Forward over T tokens with sampled q rows; kv small (Tkv rows, all random). */
static void lg_fwd_long_q(lg_env *e, tc_rng *r, int64_t T, int H, int K, int64_t Tkv, const int *vars,
                          const char *what) {
  uint16_t *dq = NULL, *dout = NULL;
  TC_MALLOC_OR_SKIP(dq, (size_t)(T * H * LG_D) * 2);
  TC_MALLOC_OR_SKIP(dout, (size_t)(T * H * LG_V) * 2);
  TC_CUDA(cudaMemset(dq, LG_PATTERN, (size_t)(T * H * LG_D) * 2));
  int64_t tok[600];
  const int64_t ns = lg_samples(T, (int64_t)H * LG_D, 64, r, tok);
  uint16_t *kv = (uint16_t *)malloc((size_t)(Tkv * LG_D) * 2);
  uint16_t *sq = (uint16_t *)malloc((size_t)(ns * H * LG_D) * 2);
  int32_t *idx = (int32_t *)malloc((size_t)(T * K) * 4), *sidx = (int32_t *)malloc((size_t)(ns * K) * 4);
  uint16_t *rout = (uint16_t *)malloc((size_t)(ns * H * LG_V) * 2);
  float *rlse = (float *)malloc((size_t)(ns * H) * 4);
  cr_assert(kv && sq && idx && sidx && rout && rlse);
  tc_fill_bf16(r, kv, (size_t)(Tkv * LG_D), -1.0, 1.0);
  tc_fill_bf16(r, sq, (size_t)(ns * H * LG_D), -1.0, 1.0);
  for (int64_t i = 0; i < T * K; ++i) idx[i] = (int32_t)(tc_next(r) % (uint64_t)Tkv);
  for (int64_t i = 0; i < ns; ++i) {
    memcpy(sidx + i * K, idx + tok[i] * K, (size_t)K * 4);
    TC_CUDA(cudaMemcpy(dq + tok[i] * H * LG_D, sq + i * H * LG_D, (size_t)H * LG_D * 2, cudaMemcpyHostToDevice));
  }
  dsa_attn_fwd_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = ns;
  p.num_heads = H;
  p.head_dim = LG_D;
  p.num_kv = Tkv;
  p.topk = K;
  p.softmax_scale = 0.0625f;
  p.q = sq;
  p.kv = kv;
  p.indices = sidx;
  p.out = rout;
  p.lse = rlse;
  TC_OK(dsa_ref_sparse_attn_fwd(&p));
  lg_fwd f = {T, Tkv, H, K, dq, NULL, dout, NULL, NULL};
  f.dkv = (uint16_t *)lg_up(kv, (size_t)(Tkv * LG_D) * 2);
  f.didx = (int32_t *)lg_up(idx, (size_t)(T * K) * 4);
  f.dlse = (float *)lg_up(NULL, (size_t)(T * H) * 4);
  lg_fwd_run(e, &f, vars, tok, ns, rout, rlse, what);
  cudaFree(dq), cudaFree(dout), cudaFree(f.dkv), cudaFree(f.didx), cudaFree(f.dlse);
  free(kv), free(sq), free(idx), free(sidx), free(rout), free(rlse);
}

/* q with T * H * 576 > 2^31 elements (out: T * H * 512 < 2^31 is written at offsets near it). */
Test(gpu_large, attn_fwd_q_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/attn_fwd_q_beyond_2pow31");
  static const int v12[] = {1, 2, 4, 0}, v13[] = {1, 3, 0};
  cr_assert((int64_t)29200 * 128 * LG_D > TWO31 && (int64_t)116600 * 32 * LG_D > TWO31);
  lg_fwd_long_q(&e, &r, 29200, 128, 16, 1000, v12, "fwd T=29200 H=128 K=16");
  lg_fwd_long_q(&e, &r, 116600, 32, 16, 1000, v13, "fwd T=116600 H=32 K=16");
  lg_close(&e);
}

/* 2^20 queries, H = 1, small K. */
Test(gpu_large, attn_fwd_2pow20_queries) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/attn_fwd_2pow20_queries");
  static const int vars[] = {1, 2, 3, 4, 0};
  lg_fwd_long_q(&e, &r, (int64_t)1 << 20, 1, 8, 5000, vars, "fwd T=2^20 H=1 K=8");
  lg_close(&e);
}

/* ============================================================================================= *
 * attention backward
 * ============================================================================================= */
typedef struct {
  int64_t T, Tkv;
  int H, K;
  const uint16_t *q, *kv, *out, *dout;
  const int32_t *idx;
  const float *lse, *sink;
  uint16_t *dq, *dkv;
  float *dsink;
} lg_bwd;

static dsa_attn_bwd_params lg_bwd_params(const lg_bwd *b, int det) {
  dsa_attn_bwd_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = b->T;
  p.num_heads = b->H;
  p.head_dim = LG_D;
  p.num_kv = b->Tkv;
  p.topk = b->K;
  p.softmax_scale = 0.0625f;
  p.deterministic = det;
  p.q = b->q;
  p.kv = b->kv;
  p.indices = b->idx;
  p.sink = b->sink;
  p.out = b->out;
  p.dout = b->dout;
  p.lse = b->lse;
  p.dq = b->dq;
  p.dkv = b->dkv;
  p.dsink = b->dsink;
  return p;
}

/* The backward kernels the large cases run (DSA_OPTION_BWD_KERNEL): portable, the lockstep 64-head
 * one and the warp-specialised one (the automatic choice). */
static const int lg_bwd_kernels[3] = {DSA_BWD_KERNEL_PORTABLE, DSA_BWD_KERNEL_SM90_H64, DSA_BWD_KERNEL_SM90_WS};

/* Runs the device backward (variant, mode) with dq / dkv / dsink poisoned first; returns 0 when
 * the variant declines. */
static int lg_bwd_gpu(lg_env *e, const lg_bwd *b, int variant, int det, const char *what) {
  dsa_attn_bwd_params p = lg_bwd_params(b, det);
  size_t need = 0;
  TC_CUDA(cudaMemset(b->dq, 0xFF, (size_t)(b->T * b->H * LG_D) * 2));
  TC_CUDA(cudaMemset(b->dkv, 0xFF, (size_t)(b->Tkv * LG_D) * 2));
  TC_CUDA(cudaMemset(b->dsink, 0xFF, (size_t)b->H * 4));
  TC_CUDA(cudaDeviceSynchronize());
  TC_SET_OPTION(e->ctx, DSA_OPTION_BWD_KERNEL, variant);
  dsa_status st = dsa_sparse_attn_bwd(e->ctx, &p, NULL, &need, e->stream);
  cr_assert(st == DSA_SUCCESS, "%s: size query: %s", what, dsa_last_error_message());
  void *ws = NULL;
  TC_MALLOC_OR_SKIP(ws, need);
  st = dsa_sparse_attn_bwd(e->ctx, &p, ws, &need, e->stream);
  TC_SET_OPTION(e->ctx, DSA_OPTION_BWD_KERNEL, DSA_BWD_KERNEL_AUTO);
  if (st == DSA_ERROR_UNSUPPORTED) {
    cr_log_info("%s: declined (%s)", what, dsa_last_error_message());
    cudaFree(ws);
    return 0;
  }
  cr_assert(st == DSA_SUCCESS, "%s: %s", what, dsa_last_error_message());
  TC_CUDA(cudaStreamSynchronize(e->stream));
  cudaFree(ws);
  return 1;
}

static void lg_cmp_rows(const uint16_t *got, const uint16_t *want, int64_t n, const char *name,
                        const char *what) {
  const double err = tc_rel_err_bf16(got, want, (size_t)n);
  cr_assert(err <= 1e-2, "%s: %s relative error %g", what, name, err);
}

/* Device rows [r0, r1) of a [*, w] bf16 tensor are all +-0. */
static void lg_expect_zero_rows(const uint16_t *d, int64_t r0, int64_t r1, int64_t w, const char *name,
                                const char *what) {
  const int64_t n = (r1 - r0) * w;
  uint16_t *h = (uint16_t *)malloc((size_t)n * 2);
  cr_assert_not_null(h);
  TC_CUDA(cudaMemcpy(h, d + r0 * w, (size_t)n * 2, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; ++i)
    if ((h[i] & 0x7FFF) != 0)
      cr_assert_fail("%s: %s row %lld element %lld = 0x%04x, want 0", what, name, (long long)(r0 + i / w),
                     (long long)(i % w), h[i]);
  free(h);
}

/* Backward with kv (and dkv, and the fp32 dkv workspace) beyond 2^31 elements. */
Test(gpu_large, attn_bwd_kv_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/attn_bwd_kv_beyond_2pow31");
  const int64_t Tkv = 3800000, na = 64, nb = 4096, T = 32;
  const int K = 64, H = 64;
  uint16_t *dkv_in = NULL, *dkv_out = NULL;
  TC_MALLOC_OR_SKIP(dkv_in, (size_t)(Tkv * LG_D) * 2);
  TC_MALLOC_OR_SKIP(dkv_out, (size_t)(Tkv * LG_D) * 2);
  TC_CUDA(cudaMemset(dkv_in, LG_PATTERN, (size_t)(Tkv * LG_D) * 2));
  const int64_t nc = na + nb;
  uint16_t *ckv = (uint16_t *)malloc((size_t)(nc * LG_D) * 2), *q = (uint16_t *)malloc((size_t)(T * H * LG_D) * 2);
  uint16_t *out = (uint16_t *)malloc((size_t)(T * H * LG_V) * 2), *dout = (uint16_t *)malloc((size_t)(T * H * LG_V) * 2);
  int32_t *idx = (int32_t *)malloc((size_t)(T * K) * 4), *cidx = (int32_t *)malloc((size_t)(T * K) * 4);
  float *lse = (float *)malloc((size_t)(T * H) * 4), *sink = (float *)malloc((size_t)H * 4);
  uint16_t *rdq = (uint16_t *)malloc((size_t)(T * H * LG_D) * 2), *rdkv = (uint16_t *)malloc((size_t)(nc * LG_D) * 2);
  float *rds = (float *)malloc((size_t)H * 4);
  cr_assert(ckv && q && out && dout && idx && cidx && lse && sink && rdq && rdkv && rds);
  tc_fill_bf16(&r, ckv, (size_t)(nc * LG_D), -1.0, 1.0);
  tc_fill_bf16(&r, q, (size_t)(T * H * LG_D), -1.0, 1.0);
  tc_fill_bf16(&r, dout, (size_t)(T * H * LG_V), -1.0, 1.0);
  tc_fill_f32(&r, sink, (size_t)H, -1.0, 1.0);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t u = tc_below(&r, 32);
    idx[i] = u == 0 ? -1 : u < 5 ? (int32_t)tc_below(&r, na) : (int32_t)(Tkv - nb + tc_below(&r, nb));
    cidx[i] = lg_remap(idx[i], Tkv, na, nb);
  }
  idx[0] = (int32_t)(Tkv - 1);
  cidx[0] = lg_remap(idx[0], Tkv, na, nb);
  TC_CUDA(cudaMemcpy(dkv_in, ckv, (size_t)(na * LG_D) * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(dkv_in + (Tkv - nb) * LG_D, ckv + na * LG_D, (size_t)(nb * LG_D) * 2, cudaMemcpyHostToDevice));
  lg_bwd c = {T, nc, H, K, q, ckv, out, dout, cidx, lse, sink, NULL, NULL, NULL};
  { /* forward on the compact problem for out and lse, then the reference backward */
    dsa_attn_fwd_params fp;
    memset(&fp, 0, sizeof fp);
    fp.num_tokens = T;
    fp.num_heads = H;
    fp.head_dim = LG_D;
    fp.num_kv = nc;
    fp.topk = K;
    fp.softmax_scale = 0.0625f;
    fp.q = q;
    fp.kv = ckv;
    fp.indices = cidx;
    fp.sink = sink;
    fp.out = out;
    fp.lse = lse;
    TC_OK(dsa_ref_sparse_attn_fwd(&fp));
    c.dq = rdq;
    c.dkv = rdkv;
    c.dsink = rds;
    dsa_attn_bwd_params bp = lg_bwd_params(&c, 1);
    TC_OK(dsa_ref_sparse_attn_bwd(&bp));
  }
  lg_bwd g = {T, Tkv, H, K, NULL, dkv_in, NULL, NULL, NULL, NULL, NULL, NULL, dkv_out, NULL};
  g.q = (uint16_t *)lg_up(q, (size_t)(T * H * LG_D) * 2);
  g.out = (uint16_t *)lg_up(out, (size_t)(T * H * LG_V) * 2);
  g.dout = (uint16_t *)lg_up(dout, (size_t)(T * H * LG_V) * 2);
  g.idx = (int32_t *)lg_up(idx, (size_t)(T * K) * 4);
  g.lse = (float *)lg_up(lse, (size_t)(T * H) * 4);
  g.sink = (float *)lg_up(sink, (size_t)H * 4);
  g.dq = (uint16_t *)lg_up(NULL, (size_t)(T * H * LG_D) * 2);
  g.dsink = (float *)lg_up(NULL, (size_t)H * 4);
  uint16_t *hdq = (uint16_t *)malloc((size_t)(T * H * LG_D) * 2), *hdkv = (uint16_t *)malloc((size_t)(nc * LG_D) * 2);
  float *hds = (float *)malloc((size_t)H * 4);
  cr_assert(hdq && hdkv && hds);
  const int64_t bnd = TWO31 / LG_D; /* first row whose elements lie past 2^31 */
  for (int vi = 0; vi < 3; ++vi)
    for (int det = 1; det >= 0; --det) {
      const int v = lg_bwd_kernels[vi];
      char what[96];
      snprintf(what, sizeof what, "bwd Tkv=%lld H=%d variant %d %s", (long long)Tkv, H, v,
               det ? "deterministic" : "atomic");
      if (!lg_bwd_gpu(&e, &g, v, det, what)) continue;
      TC_CUDA(cudaMemcpy(hdq, g.dq, (size_t)(T * H * LG_D) * 2, cudaMemcpyDeviceToHost));
      TC_CUDA(cudaMemcpy(hdkv, dkv_out, (size_t)(na * LG_D) * 2, cudaMemcpyDeviceToHost));
      TC_CUDA(cudaMemcpy(hdkv + na * LG_D, dkv_out + (Tkv - nb) * LG_D, (size_t)(nb * LG_D) * 2,
                         cudaMemcpyDeviceToHost));
      TC_CUDA(cudaMemcpy(hds, g.dsink, (size_t)H * 4, cudaMemcpyDeviceToHost));
      lg_cmp_rows(hdq, rdq, T * H * LG_D, "dq", what);
      lg_cmp_rows(hdkv, rdkv, nc * LG_D, "dkv (referenced blocks)", what);
      for (int h = 0; h < H; ++h)
        cr_assert(fabsf(hds[h] - rds[h]) <= 1e-3f * (1.0f + fabsf(rds[h])), "%s: dsink[%d] = %g, reference %g",
                  what, h, hds[h], rds[h]);
      /* unreferenced rows are written as 0: after the first block, around the 2^31 boundary,
       * just before the last block */
      lg_expect_zero_rows(dkv_out, na, na + 1024, LG_D, "dkv", what);
      lg_expect_zero_rows(dkv_out, bnd - 512, bnd + 512, LG_D, "dkv", what);
      lg_expect_zero_rows(dkv_out, Tkv - nb - 1024, Tkv - nb, LG_D, "dkv", what);
    }
  cudaFree((void *)g.q), cudaFree((void *)g.out), cudaFree((void *)g.dout), cudaFree((void *)g.idx);
  cudaFree((void *)g.lse), cudaFree((void *)g.sink), cudaFree(g.dq), cudaFree(g.dsink);
  cudaFree(dkv_in), cudaFree(dkv_out);
  free(ckv), free(q), free(out), free(dout), free(idx), free(cidx), free(lse), free(sink);
  free(rdq), free(rdkv), free(rds), free(hdq), free(hdkv), free(hds);
  lg_close(&e);
}

/* Backward with q, dq, out, dout beyond 2^31 elements (T = 29200, H = 128). Only sampled tokens
 * carry data and gradient: the others have dout = 0 (so dS = 0: they add exact zeros to dkv and
 * get dq = 0), which keeps dkv comparable with a reference over the sampled tokens alone. */
Test(gpu_large, attn_bwd_q_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/attn_bwd_q_beyond_2pow31");
  const int64_t T = 29200, Tkv = 1000;
  const int H = 128, K = 16;
  cr_assert(T * H * LG_D > TWO31);
  lg_bwd g = {T, Tkv, H, K, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
  uint16_t *dq_in = NULL, *dout_in = NULL, *out_in = NULL, *dq_out = NULL;
  float *dlse = NULL;
  TC_MALLOC_OR_SKIP(dq_in, (size_t)(T * H * LG_D) * 2);
  TC_MALLOC_OR_SKIP(dq_out, (size_t)(T * H * LG_D) * 2);
  TC_MALLOC_OR_SKIP(out_in, (size_t)(T * H * LG_V) * 2);
  TC_MALLOC_OR_SKIP(dout_in, (size_t)(T * H * LG_V) * 2);
  TC_MALLOC_OR_SKIP(dlse, (size_t)(T * H) * 4);
  TC_CUDA(cudaMemset(dq_in, LG_PATTERN, (size_t)(T * H * LG_D) * 2));
  TC_CUDA(cudaMemset(out_in, LG_PATTERN, (size_t)(T * H * LG_V) * 2));
  TC_CUDA(cudaMemset(dout_in, 0, (size_t)(T * H * LG_V) * 2));
  TC_CUDA(cudaMemset(dlse, LG_PATTERN, (size_t)(T * H) * 4));
  int64_t tok[128];
  const int64_t ns = lg_samples(T, (int64_t)H * LG_D, 16, &r, tok);
  uint16_t *kv = (uint16_t *)malloc((size_t)(Tkv * LG_D) * 2);
  int32_t *idx = (int32_t *)malloc((size_t)(T * K) * 4), *sidx = (int32_t *)malloc((size_t)(ns * K) * 4);
  uint16_t *sq = (uint16_t *)malloc((size_t)(ns * H * LG_D) * 2), *so = (uint16_t *)malloc((size_t)(ns * H * LG_V) * 2);
  uint16_t *sdo = (uint16_t *)malloc((size_t)(ns * H * LG_V) * 2);
  float *sl = (float *)malloc((size_t)(ns * H) * 4);
  uint16_t *rdq = (uint16_t *)malloc((size_t)(ns * H * LG_D) * 2), *rdkv = (uint16_t *)malloc((size_t)(Tkv * LG_D) * 2);
  uint16_t *hdq = (uint16_t *)malloc((size_t)H * LG_D * 2), *hdkv = (uint16_t *)malloc((size_t)(Tkv * LG_D) * 2);
  cr_assert(kv && idx && sidx && sq && so && sdo && sl && rdq && rdkv && hdq && hdkv);
  tc_fill_bf16(&r, kv, (size_t)(Tkv * LG_D), -1.0, 1.0);
  tc_fill_bf16(&r, sq, (size_t)(ns * H * LG_D), -1.0, 1.0);
  tc_fill_bf16(&r, sdo, (size_t)(ns * H * LG_V), -1.0, 1.0);
  for (int64_t i = 0; i < T * K; ++i) idx[i] = (int32_t)(tc_next(&r) % (uint64_t)Tkv);
  for (int64_t i = 0; i < ns; ++i) memcpy(sidx + i * K, idx + tok[i] * K, (size_t)K * 4);
  lg_bwd c = {ns, Tkv, H, K, sq, kv, so, sdo, sidx, sl, NULL, rdq, rdkv, NULL};
  {
    dsa_attn_fwd_params fp;
    memset(&fp, 0, sizeof fp);
    fp.num_tokens = ns;
    fp.num_heads = H;
    fp.head_dim = LG_D;
    fp.num_kv = Tkv;
    fp.topk = K;
    fp.softmax_scale = 0.0625f;
    fp.q = sq;
    fp.kv = kv;
    fp.indices = sidx;
    fp.out = so;
    fp.lse = sl;
    TC_OK(dsa_ref_sparse_attn_fwd(&fp));
    dsa_attn_bwd_params bp = lg_bwd_params(&c, 1);
    TC_OK(dsa_ref_sparse_attn_bwd(&bp));
  }
  for (int64_t i = 0; i < ns; ++i) {
    const int64_t t = tok[i];
    TC_CUDA(cudaMemcpy(dq_in + t * H * LG_D, sq + i * H * LG_D, (size_t)H * LG_D * 2, cudaMemcpyHostToDevice));
    TC_CUDA(cudaMemcpy(out_in + t * H * LG_V, so + i * H * LG_V, (size_t)H * LG_V * 2, cudaMemcpyHostToDevice));
    TC_CUDA(cudaMemcpy(dout_in + t * H * LG_V, sdo + i * H * LG_V, (size_t)H * LG_V * 2, cudaMemcpyHostToDevice));
    TC_CUDA(cudaMemcpy(dlse + t * H, sl + i * H, (size_t)H * 4, cudaMemcpyHostToDevice));
  }
  g.q = dq_in;
  g.out = out_in;
  g.dout = dout_in;
  g.lse = dlse;
  g.kv = (uint16_t *)lg_up(kv, (size_t)(Tkv * LG_D) * 2);
  g.idx = (int32_t *)lg_up(idx, (size_t)(T * K) * 4);
  g.dq = dq_out;
  g.dkv = (uint16_t *)lg_up(NULL, (size_t)(Tkv * LG_D) * 2);
  g.dsink = (float *)lg_up(NULL, (size_t)H * 4);
  for (int vi = 0; vi < 3; ++vi)
    for (int det = 1; det >= 0; --det) {
      const int v = lg_bwd_kernels[vi];
      char what[96];
      snprintf(what, sizeof what, "bwd T=%lld H=%d variant %d %s", (long long)T, H, v,
               det ? "deterministic" : "atomic");
      if (!lg_bwd_gpu(&e, &g, v, det, what)) continue;
      TC_CUDA(cudaMemcpy(hdkv, g.dkv, (size_t)(Tkv * LG_D) * 2, cudaMemcpyDeviceToHost));
      lg_cmp_rows(hdkv, rdkv, Tkv * LG_D, "dkv", what);
      for (int64_t i = 0; i < ns; ++i) {
        TC_CUDA(cudaMemcpy(hdq, dq_out + tok[i] * H * LG_D, (size_t)H * LG_D * 2, cudaMemcpyDeviceToHost));
        char w2[128];
        snprintf(w2, sizeof w2, "%s token %lld", what, (long long)tok[i]);
        lg_cmp_rows(hdq, rdq + i * H * LG_D, (int64_t)H * LG_D, "dq", w2);
      }
      /* tokens without gradient: dq = 0, also the last ones (offsets past 2^31) */
      for (int64_t t = T - 40, si = 0; t < T; ++t) {
        while (si < ns && tok[si] < t) ++si;
        if (si < ns && tok[si] == t) continue;
        lg_expect_zero_rows(dq_out, t * H, (t + 1) * H, LG_D, "dq", what);
      }
    }
  cudaFree(dq_in), cudaFree(dq_out), cudaFree(out_in), cudaFree(dout_in), cudaFree(dlse);
  cudaFree((void *)g.kv), cudaFree((void *)g.idx), cudaFree(g.dkv), cudaFree(g.dsink);
  free(kv), free(idx), free(sidx), free(sq), free(so), free(sdo), free(sl), free(rdq), free(rdkv);
  free(hdq), free(hdkv);
  lg_close(&e);
}

/* ============================================================================================= *
 * top-k
 * ============================================================================================= */
static void lg_topk_gpu(lg_env *e, dsa_topk_params *p) {
  size_t need = 0;
  TC_OK(dsa_topk(e->ctx, p, NULL, &need, e->stream));
  void *ws = lg_up(NULL, need);
  TC_OK(dsa_topk(e->ctx, p, ws, &need, e->stream));
  TC_CUDA(cudaStreamSynchronize(e->stream));
  cudaFree(ws);
}

/* One host row through the reference: want[0..k). */
static void lg_topk_ref_row(const float *s, int64_t cols, int32_t len, int32_t k, int32_t *want) {
  dsa_topk_params p;
  memset(&p, 0, sizeof p);
  p.rows = 1;
  p.columns = cols;
  p.k = k;
  p.scores = s;
  p.lengths = &len;
  p.indices = want;
  TC_OK(dsa_ref_topk(&p));
}

/* Scores of 2100 rows x 2^20 columns with a row stride of 2^20 + 16: rows * ld > 2^31. */
Test(gpu_large, topk_rows_times_ld_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/topk_rows_times_ld_beyond_2pow31");
  const int64_t rows = 2100, cols = (int64_t)1 << 20, ld = cols + 16;
  const int32_t K = 256;
  cr_assert(rows * ld > TWO31);
  float *ds = NULL;
  TC_MALLOC_OR_SKIP(ds, (size_t)(rows * ld) * 4);
  TC_CUDA(cudaMemset(ds, LG_PATTERN, (size_t)(rows * ld) * 4)); /* constant rows: columns 0..K-1 */
  const int64_t sample[] = {0, TWO31 / ld - 1, TWO31 / ld, TWO31 / ld + 1, rows - 2, rows - 1};
  const int ns = (int)(sizeof sample / sizeof sample[0]);
  float *row = (float *)malloc((size_t)cols * 4);
  int32_t *want = (int32_t *)malloc((size_t)ns * K * 4), *len = (int32_t *)malloc((size_t)rows * 4);
  cr_assert(row && want && len);
  for (int64_t i = 0; i < rows; ++i) len[i] = (int32_t)(cols - tc_below(&r, 1000));
  for (int i = 0; i < ns; ++i) {
    for (int64_t c = 0; c < cols; ++c) row[c] = (float)tc_range(&r, -1000.0, 1000.0);
    TC_CUDA(cudaMemcpy(ds + sample[i] * ld, row, (size_t)cols * 4, cudaMemcpyHostToDevice));
    lg_topk_ref_row(row, cols, len[sample[i]], K, want + i * K);
  }
  int32_t *dl = (int32_t *)lg_up(len, (size_t)rows * 4), *di = (int32_t *)lg_up(NULL, (size_t)(rows * K) * 4);
  TC_CUDA(cudaMemset(di, 0x5A, (size_t)(rows * K) * 4));
  TC_CUDA(cudaDeviceSynchronize());
  dsa_topk_params p;
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.columns = cols;
  p.k = K;
  p.scores = ds;
  p.scores_stride = ld;
  p.lengths = dl;
  p.indices = di;
  lg_topk_gpu(&e, &p);
  int32_t *got = (int32_t *)malloc((size_t)(rows * K) * 4);
  cr_assert_not_null(got);
  TC_CUDA(cudaMemcpy(got, di, (size_t)(rows * K) * 4, cudaMemcpyDeviceToHost));
  for (int64_t i = 0, si = 0; i < rows; ++i) {
    const int sampled = si < ns && sample[si] == i;
    for (int32_t j = 0; j < K; ++j) {
      const int32_t w = sampled ? want[si * K + j] : j;
      cr_assert_eq(got[i * K + j], w, "row %lld slot %d: %d, want %d", (long long)i, j, got[i * K + j], w);
    }
    si += sampled;
  }
  cudaFree(ds), cudaFree(dl), cudaFree(di);
  free(row), free(want), free(len), free(got);
  lg_close(&e);
}

/* 2^20 rows of 300 columns, random lengths: every row's structure checked, 4096 rows (and the
 * last) against the reference. */
Test(gpu_large, topk_2pow20_rows) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/topk_2pow20_rows");
  const int64_t rows = (int64_t)1 << 20, cols = 300;
  const int32_t K = 16;
  float *s = (float *)malloc((size_t)(rows * cols) * 4);
  int32_t *len = (int32_t *)malloc((size_t)rows * 4), *got = (int32_t *)malloc((size_t)(rows * K) * 4);
  cr_assert(s && len && got);
  for (int64_t i = 0; i < rows * cols; ++i) s[i] = (float)(tc_next(&r) & 0xFFFF) - 32768.0f; /* ties too */
  for (int64_t i = 0; i < rows; ++i) len[i] = (int32_t)tc_below(&r, cols + 1);
  float *ds = (float *)lg_up(s, (size_t)(rows * cols) * 4);
  int32_t *dl = (int32_t *)lg_up(len, (size_t)rows * 4), *di = (int32_t *)lg_up(NULL, (size_t)(rows * K) * 4);
  TC_CUDA(cudaMemset(di, 0x5A, (size_t)(rows * K) * 4));
  TC_CUDA(cudaDeviceSynchronize());
  dsa_topk_params p;
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.columns = cols;
  p.k = K;
  p.scores = ds;
  p.lengths = dl;
  p.indices = di;
  for (int v = DSA_TOPK_KERNEL_RADIX; v <= DSA_TOPK_KERNEL_FILTER; ++v) { /* every top-k kernel */
    TC_CUDA(cudaMemset(di, 0x5A, (size_t)(rows * K) * 4));
    TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, v);
    lg_topk_gpu(&e, &p);
    TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, DSA_TOPK_KERNEL_AUTO);
    TC_CUDA(cudaMemcpy(got, di, (size_t)(rows * K) * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t n = len[i] < K ? len[i] : K;
      for (int32_t j = 0; j < K; ++j) {
        const int32_t x = got[i * K + j];
        if (j < n ? (x < 0 || x >= len[i] || (j > 0 && x <= got[i * K + j - 1])) : x != -1)
          cr_assert_fail("variant %d: row %lld slot %d = %d (length %d): not an ascending valid prefix "
                         "then -1", v, (long long)i, j, x, len[i]);
      }
    }
    int32_t want[16];
    for (int64_t c = 0; c <= 4096; ++c) {
      const int64_t i = c == 4096 ? rows - 1 : tc_below(&r, rows);
      lg_topk_ref_row(s + i * cols, cols, len[i], K, want);
      for (int32_t j = 0; j < K; ++j)
        cr_assert_eq(got[i * K + j], want[j], "variant %d: row %lld slot %d: %d, reference %d", v,
                     (long long)i, j, got[i * K + j], want[j]);
    }
  }
  cudaFree(ds), cudaFree(dl), cudaFree(di);
  free(s), free(len), free(got);
  lg_close(&e);
}

/* ============================================================================================= *
 * indexer
 * ============================================================================================= */
typedef struct {
  dsa_plan *plan;
  const dsa_plan_view *hv;
  dsa_plan_view dv;
  void *dplan;
} lg_plan;

static void lg_plan_make(lg_env *e, const dsa_plan_desc *d, lg_plan *x) {
  size_t need = 0;
  TC_OK(dsa_plan_create(d, &x->plan));
  x->hv = dsa_plan_host_view(x->plan);
  TC_OK(dsa_plan_upload(e->ctx, x->plan, NULL, &need, NULL, e->stream));
  x->dplan = lg_up(NULL, need);
  TC_OK(dsa_plan_upload(e->ctx, x->plan, x->dplan, &need, &x->dv, e->stream));
  TC_CUDA(cudaStreamSynchronize(e->stream));
}

/* Small-integer bf16 (-4..4): exact scores, so GPU = reference index for index. */
static uint16_t lg_small_int(tc_rng *r) {
  static uint16_t tab[9];
  if (tab[0] == 0)
    for (int i = 0; i < 9; ++i) tab[i] = dsa_f32_to_bf16((float)(i - 4));
  return tab[tc_next(r) % 9];
}

/* Runs the indexer (engine) and checks rows[] (local rows) against the reference through a
 * one-query view of the host plan; also every row's length and every select-all row. */
static void lg_indexer_check(lg_env *e, const lg_plan *x, dsa_indexer_params hp, dsa_indexer_params dp,
                             dsa_indexer_engine engine, const int64_t *rows, int64_t nrows,
                             const char *what) {
  const int64_t Tq = x->hv->num_queries;
  const int32_t K = hp.topk;
  int32_t *di = (int32_t *)lg_up(NULL, (size_t)(Tq * K) * 4), *dl = (int32_t *)lg_up(NULL, (size_t)Tq * 4);
  TC_CUDA(cudaMemset(di, 0x5A, (size_t)(Tq * K) * 4));
  TC_CUDA(cudaMemset(dl, 0x5A, (size_t)Tq * 4));
  TC_CUDA(cudaDeviceSynchronize());
  dp.indices = di;
  dp.lengths = dl;
  dp.engine = engine;
  size_t need = 0;
  TC_OK(dsa_indexer_topk(e->ctx, &dp, NULL, &need, e->stream));
  void *ws = lg_up(NULL, need);
  TC_OK(dsa_indexer_topk(e->ctx, &dp, ws, &need, e->stream));
  TC_CUDA(cudaStreamSynchronize(e->stream));
  int32_t *got = (int32_t *)malloc((size_t)(Tq * K) * 4), *glen = (int32_t *)malloc((size_t)Tq * 4);
  cr_assert(got && glen);
  TC_CUDA(cudaMemcpy(got, di, (size_t)(Tq * K) * 4, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(glen, dl, (size_t)Tq * 4, cudaMemcpyDeviceToHost));
  for (int64_t t = 0; t < Tq; ++t) {
    const int32_t cl = x->hv->causal_lengths[t], n = cl < K ? cl : K;
    cr_assert_eq(glen[t], n, "%s: lengths[%lld] = %d, want %d", what, (long long)t, glen[t], n);
    if (cl <= K)
      for (int32_t j = 0; j < K; ++j) {
        const int32_t w = j < cl ? x->hv->starts[t] + j : -1;
        if (got[t * K + j] != w)
          cr_assert_fail("%s: select-all row %lld slot %d = %d, want %d", what, (long long)t, j, got[t * K + j], w);
      }
  }
  int32_t *want = (int32_t *)malloc((size_t)K * 4), wlen = -7;
  cr_assert_not_null(want);
  for (int64_t i = 0; i < nrows; ++i) {
    const int64_t t = rows[i];
    dsa_indexer_params p = hp;
    dsa_plan_view v = tc_view_row(x->hv, t);
    const size_t welem = hp.weights_dtype == DSA_DTYPE_F32 ? 4 : 2;
    p.plan = &v;
    p.index_q = hp.index_q + t * hp.q_stride_token;
    p.weights = (const char *)hp.weights + (size_t)(t * hp.weights_stride) * welem;
    p.indices = want;
    p.indices_stride = K;
    p.lengths = &wlen;
    TC_OK(dsa_ref_indexer_topk(&p));
    for (int32_t j = 0; j < K; ++j)
      cr_assert_eq(got[t * K + j], want[j], "%s: row %lld slot %d = %d, reference %d", what, (long long)t, j,
                   got[t * K + j], want[j]);
  }
  cudaFree(ws), cudaFree(di), cudaFree(dl);
  free(got), free(glen), free(want);
}

/* 2^20 queries in 8192 documents of 128 keys (K = 64: half of each document is scored). */
Test(gpu_large, indexer_2pow20_queries) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/indexer_2pow20_queries");
  const int64_t Tk = (int64_t)1 << 20, S = Tk / 128;
  const int H = 1, K = 64, D = 128;
  int32_t *cu = (int32_t *)malloc((size_t)(S + 1) * 4);
  cr_assert_not_null(cu);
  for (int64_t s = 0; s <= S; ++s) cu[s] = (int32_t)(s * 128);
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu;
  d.num_seqs = S;
  d.total_key_tokens = Tk;
  d.num_queries = -1;
  lg_plan x;
  lg_plan_make(&e, &d, &x);
  uint16_t *q = (uint16_t *)malloc((size_t)(Tk * H * D) * 2), *k = (uint16_t *)malloc((size_t)(Tk * D) * 2);
  float *w = (float *)malloc((size_t)(Tk * H) * 4);
  cr_assert(q && k && w);
  for (int64_t i = 0; i < Tk * H * D; ++i) q[i] = lg_small_int(&r);
  for (int64_t i = 0; i < Tk * D; ++i) k[i] = lg_small_int(&r);
  for (int64_t i = 0; i < Tk * H; ++i) w[i] = (float)(tc_below(&r, 17) - 8) / 8.0f;
  dsa_indexer_params hp;
  memset(&hp, 0, sizeof hp);
  hp.plan = x.hv;
  hp.num_heads = H;
  hp.topk = K;
  hp.index_q = q;
  hp.q_stride_token = H * D;
  hp.q_stride_head = D;
  hp.index_k = k;
  hp.k_stride = D;
  hp.weights = w;
  hp.weights_dtype = DSA_DTYPE_F32;
  hp.weights_stride = H;
  hp.indices_stride = K;
  dsa_indexer_params dp = hp;
  dp.plan = &x.dv;
  dp.index_q = (uint16_t *)lg_up(q, (size_t)(Tk * H * D) * 2);
  dp.index_k = (uint16_t *)lg_up(k, (size_t)(Tk * D) * 2);
  dp.weights = lg_up(w, (size_t)(Tk * H) * 4);
  int64_t rows[1025];
  for (int i = 0; i < 1024; ++i) rows[i] = tc_below(&r, S) * 128 + 64 + tc_below(&r, 64); /* scored */
  rows[1024] = Tk - 1;
  lg_indexer_check(&e, &x, hp, dp, DSA_INDEXER_ENGINE_FUSED, rows, 1025, "indexer T=2^20 fused");
  lg_indexer_check(&e, &x, hp, dp, DSA_INDEXER_ENGINE_CUBLAS, rows, 1025, "indexer T=2^20 cublas");
  cudaFree((void *)dp.index_q), cudaFree((void *)dp.index_k), cudaFree((void *)dp.weights), cudaFree(x.dplan);
  dsa_plan_destroy(x.plan);
  free(cu), free(q), free(k), free(w);
  lg_close(&e);
}

/* index_k beyond 2^31 elements: a first document of 16.8M keys, and a context-parallel query
 * range in the second (2000 queries) whose keys lie at storage rows > 2^31 / 128. */
Test(gpu_large, indexer_keys_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/indexer_keys_beyond_2pow31");
  const int64_t L0 = 16800000, L1 = 2000, Tk = L0 + L1;
  const int H = 4, K = 64, D = 128;
  cr_assert(L0 * D > TWO31);
  static int32_t cu[3];
  cu[0] = 0;
  cu[1] = (int32_t)L0;
  cu[2] = (int32_t)Tk;
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu;
  d.num_seqs = 2;
  d.total_key_tokens = Tk;
  d.query_start = L0;
  d.num_queries = L1;
  lg_plan x;
  lg_plan_make(&e, &d, &x);
  uint16_t *dk = NULL;
  TC_MALLOC_OR_SKIP(dk, (size_t)(Tk * D) * 2);
  TC_CUDA(cudaMemset(dk, 0, (size_t)(Tk * D) * 2));
  /* host: a lazily zeroed buffer of the full size; only the second document's rows are touched */
  uint16_t *k = (uint16_t *)calloc((size_t)(Tk * D), 2);
  uint16_t *q = (uint16_t *)malloc((size_t)(L1 * H * D) * 2);
  float *w = (float *)malloc((size_t)(L1 * H) * 4);
  cr_assert(k && q && w);
  for (int64_t i = L0 * D; i < Tk * D; ++i) k[i] = lg_small_int(&r);
  for (int64_t i = 0; i < L1 * H * D; ++i) q[i] = lg_small_int(&r);
  for (int64_t i = 0; i < L1 * H; ++i) w[i] = (float)(tc_below(&r, 17) - 8) / 8.0f;
  TC_CUDA(cudaMemcpy(dk + L0 * D, k + L0 * D, (size_t)(L1 * D) * 2, cudaMemcpyHostToDevice));
  dsa_indexer_params hp;
  memset(&hp, 0, sizeof hp);
  hp.plan = x.hv;
  hp.num_heads = H;
  hp.topk = K;
  hp.index_q = q;
  hp.q_stride_token = H * D;
  hp.q_stride_head = D;
  hp.index_k = k;
  hp.k_stride = D;
  hp.weights = w;
  hp.weights_dtype = DSA_DTYPE_F32;
  hp.weights_stride = H;
  hp.indices_stride = K;
  dsa_indexer_params dp = hp;
  dp.plan = &x.dv;
  dp.index_q = (uint16_t *)lg_up(q, (size_t)(L1 * H * D) * 2);
  dp.index_k = dk;
  dp.weights = lg_up(w, (size_t)(L1 * H) * 4);
  int64_t *rows = (int64_t *)malloc((size_t)L1 * 8), n = 0;
  cr_assert_not_null(rows);
  for (int64_t t = K; t < L1; t += 7) rows[n++] = t;
  rows[n++] = L1 - 1;
  lg_indexer_check(&e, &x, hp, dp, DSA_INDEXER_ENGINE_FUSED, rows, n, "indexer keys past 2^31 fused");
  lg_indexer_check(&e, &x, hp, dp, DSA_INDEXER_ENGINE_CUBLAS, rows, n, "indexer keys past 2^31 cublas");
  cudaFree(dk), cudaFree((void *)dp.index_q), cudaFree((void *)dp.weights), cudaFree(x.dplan);
  dsa_plan_destroy(x.plan);
  free(k), free(q), free(w), free(rows);
  lg_close(&e);
}

/* ============================================================================================= *
 * compaction and head padding
 * ============================================================================================= */
/* 1.1M rows with a row stride of 2048 (2.25e9 int32 elements), K = 16. */
Test(gpu_large, compact_stride_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/compact_stride_beyond_2pow31");
  const int64_t rows = 1100000, ld = 2048, kc = 1000;
  const int32_t K = 16;
  cr_assert(rows * ld > TWO31);
  int32_t *din = NULL;
  TC_MALLOC_OR_SKIP(din, (size_t)(rows * ld) * 4);
  TC_CUDA(cudaMemset(din, 0xFF, (size_t)(rows * ld) * 4));
  int32_t *in = (int32_t *)malloc((size_t)(rows * K) * 4), *want = (int32_t *)malloc((size_t)(rows * K) * 4);
  int32_t *wlen = (int32_t *)malloc((size_t)rows * 4), *got = (int32_t *)malloc((size_t)(rows * K) * 4);
  int32_t *glen = (int32_t *)malloc((size_t)rows * 4);
  cr_assert(in && want && wlen && got && glen);
  for (int64_t i = 0; i < rows * K; ++i) in[i] = (int32_t)tc_below(&r, kc + 100) - 5;
  TC_CUDA(cudaMemcpy2D(din, (size_t)ld * 4, in, (size_t)K * 4, (size_t)K * 4, (size_t)rows, cudaMemcpyHostToDevice));
  dsa_compact_params p;
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.k = K;
  p.key_count = kc;
  p.indices = in;
  p.out = want;
  p.lengths = wlen;
  TC_OK(dsa_ref_compact_indices(&p));
  int32_t *dout = (int32_t *)lg_up(NULL, (size_t)(rows * K) * 4), *dl = (int32_t *)lg_up(NULL, (size_t)rows * 4);
  TC_CUDA(cudaMemset(dout, 0x5A, (size_t)(rows * K) * 4));
  TC_CUDA(cudaDeviceSynchronize());
  p.indices = din;
  p.indices_stride = ld;
  p.out = dout;
  p.lengths = dl;
  TC_OK(dsa_compact_indices(e.ctx, &p, e.stream));
  TC_CUDA(cudaStreamSynchronize(e.stream));
  TC_CUDA(cudaMemcpy(got, dout, (size_t)(rows * K) * 4, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(glen, dl, (size_t)rows * 4, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < rows; ++i) {
    if (glen[i] != wlen[i]) cr_assert_fail("row %lld: length %d, want %d", (long long)i, glen[i], wlen[i]);
    if (memcmp(got + i * K, want + i * K, (size_t)K * 4) != 0) cr_assert_fail("row %lld differs", (long long)i);
  }
  /* in place (out = indices, stride 2048): the last rows, past the boundary */
  p.out = din;
  p.out_stride = ld;
  TC_OK(dsa_compact_indices(e.ctx, &p, e.stream));
  TC_CUDA(cudaStreamSynchronize(e.stream));
  TC_CUDA(cudaMemcpy2D(got, (size_t)K * 4, din, (size_t)ld * 4, (size_t)K * 4, (size_t)rows, cudaMemcpyDeviceToHost));
  for (int64_t i = rows - 1000; i < rows; ++i)
    if (memcmp(got + i * K, want + i * K, (size_t)K * 4) != 0) cr_assert_fail("in place: row %lld differs", (long long)i);
  cudaFree(din), cudaFree(dout), cudaFree(dl);
  free(in), free(want), free(wlen), free(got), free(glen);
  lg_close(&e);
}

/* q [58300, 32, 576] -> q_out [58300, 64, 576]: 2.15e9 output elements. */
Test(gpu_large, pad_heads_beyond_2pow31) {
  lg_env e = lg_open();
  tc_rng r = tc_seed("gpu_large/pad_heads_beyond_2pow31");
  const int64_t T = 58300;
  const int H = 32, Hp = 64;
  cr_assert(T * Hp * LG_D > TWO31);
  uint16_t *dq = NULL, *dqo = NULL;
  TC_MALLOC_OR_SKIP(dq, (size_t)(T * H * LG_D) * 2);
  TC_MALLOC_OR_SKIP(dqo, (size_t)(T * Hp * LG_D) * 2);
  TC_CUDA(cudaMemset(dq, LG_PATTERN, (size_t)(T * H * LG_D) * 2));
  TC_CUDA(cudaMemset(dqo, 0xFF, (size_t)(T * Hp * LG_D) * 2));
  int64_t tok[64];
  const int64_t ns = lg_samples(T, (int64_t)Hp * LG_D, 8, &r, tok);
  uint16_t *sq = (uint16_t *)malloc((size_t)(ns * H * LG_D) * 2), *o = (uint16_t *)malloc((size_t)Hp * LG_D * 2);
  cr_assert(sq && o);
  tc_fill_bf16(&r, sq, (size_t)(ns * H * LG_D), -1.0, 1.0);
  for (int64_t i = 0; i < ns; ++i)
    TC_CUDA(cudaMemcpy(dq + tok[i] * H * LG_D, sq + i * H * LG_D, (size_t)H * LG_D * 2, cudaMemcpyHostToDevice));
  float sink[32], sink_out[64];
  tc_fill_f32(&r, sink, 32, -1.0, 1.0);
  float *ds = (float *)lg_up(sink, sizeof sink), *dso = (float *)lg_up(NULL, sizeof sink_out);
  TC_CUDA(cudaDeviceSynchronize());
  dsa_pad_heads_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = T;
  p.num_heads = H;
  p.padded_heads = Hp;
  p.head_dim = LG_D;
  p.q = dq;
  p.q_out = dqo;
  p.sink = ds;
  p.sink_out = dso;
  TC_OK(dsa_pad_heads(e.ctx, &p, e.stream));
  TC_CUDA(cudaStreamSynchronize(e.stream));
  TC_CUDA(cudaMemcpy(sink_out, dso, sizeof sink_out, cudaMemcpyDeviceToHost));
  for (int h = 0; h < Hp; ++h)
    cr_assert(h < H ? sink_out[h] == sink[h] : sink_out[h] == -INFINITY, "sink_out[%d] = %g", h, sink_out[h]);
  for (int64_t i = 0; i < ns; ++i) {
    TC_CUDA(cudaMemcpy(o, dqo + tok[i] * Hp * LG_D, (size_t)Hp * LG_D * 2, cudaMemcpyDeviceToHost));
    cr_assert(memcmp(o, sq + i * H * LG_D, (size_t)H * LG_D * 2) == 0, "token %lld: heads 0..%d differ",
              (long long)tok[i], H - 1);
    for (int64_t j = (int64_t)H * LG_D; j < (int64_t)Hp * LG_D; ++j)
      if (o[j] != 0) cr_assert_fail("token %lld: padded element %lld = 0x%04x", (long long)tok[i], (long long)j, o[j]);
  }
  cudaFree(dq), cudaFree(dqo), cudaFree(ds), cudaFree(dso);
  free(sq), free(o);
  lg_close(&e);
}
