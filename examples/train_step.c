/* train_step.c - one training step of a DeepSeek Sparse Attention layer with libdsa, in two halves.
 *
 * The CPU half (every machine): the step on the CPU reference (dsa_ref_indexer_topk, _sparse_attn_fwd,
 * _sparse_attn_bwd), each output checked against formulas written out in fp64 in this file:
 * the indexer's rows are the K best keys of each causal window, out and lse are the softmax over the
 * selected keys, and dq / dkv are the derivative of loss = sum(dout * out) (a central finite
 * difference of the fp64 forward along a random direction).
 *
 * The GPU half (with a CUDA device): plan the packed batch (host) -> upload the plan -> indexer
 * top-k -> sparse forward -> sparse backward, with the two-phase workspace queries and every status
 * checked, each output compared with the CPU reference's.
 *
 * The batch: 3 documents of 150, 100 and 70 tokens packed into T = 320 rows; H = 8 attention heads,
 * H_idx = 4 indexer heads, K = 64 keys per query (the documents are longer than K, so the indexer
 * really scores and selects). Inputs are random; a real model computes them (docs/contract.md
 * section 10 says from what).
 *
 * Build: make examples (build/examples/train_step, linked with build/libdsa.a).
 * Usage: train_step [--cpu]   (--cpu: the CPU half only, even with a GPU)
 * Exit status: 0 = every check passed (the GPU half skipped without a device, said so);
 *              1 = a mismatch; 2 = a libdsa or CUDA error (the message says which call). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <dsa.h>

enum { NDOC = 3, T = 320, H = 8, H_IDX = 4, K = 64, D = DSA_HEAD_DIM, DV = DSA_VALUE_DIM,
       DI = DSA_INDEX_HEAD_DIM };
static const int32_t cu_seqlens[NDOC + 1] = {0, 150, 250, 320};

/* Every libdsa status is checked: on failure, the status text and the message naming the argument. */
#define DSA_CHECK(call)                                                                   \
  do {                                                                                    \
    dsa_status s_ = (call);                                                               \
    if (s_ != DSA_SUCCESS) {                                                              \
      fprintf(stderr, "train_step: %s failed: %s: %s\n", #call, dsa_status_string(s_),    \
              dsa_last_error_message());                                                  \
      exit(2);                                                                            \
    }                                                                                     \
  } while (0)
#define CUDA_CHECK(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "train_step: %s failed: %s\n", #call, cudaGetErrorString(e_));          \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

/* ---- host helpers: random bf16 inputs, device copies, error norms ---- */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float uniform(float lo, float hi) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return lo + (hi - lo) * (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}
static uint16_t *random_bf16(size_t n, float lo, float hi) {
  uint16_t *x = malloc(n * sizeof *x);
  if (x == NULL) exit(2);
  for (size_t i = 0; i < n; ++i) x[i] = dsa_f32_to_bf16(uniform(lo, hi));
  return x;
}
static void *host_alloc(size_t bytes) {
  void *p = calloc(1, bytes);
  if (p == NULL) exit(2);
  return p;
}
static void *to_device(const void *host, size_t bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, bytes));
  if (host != NULL) CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
static void *to_host(const void *dev, size_t bytes) {
  void *h = host_alloc(bytes);
  CUDA_CHECK(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
  return h;
}
static double *to_f64(const uint16_t *x, size_t n) {
  double *y = host_alloc(n * sizeof *y);
  for (size_t i = 0; i < n; ++i) y[i] = dsa_bf16_to_f32(x[i]);
  return y;
}
/* ||got - ref|| / ||ref|| over n values, got bf16 (NaN anywhere counts as a mismatch) */
static double rel_err(const uint16_t *got, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double g = dsa_bf16_to_f32(got[i]), r = ref[i];
    if (isnan(g) || isnan(r)) return INFINITY;
    num += (g - r) * (g - r), den += r * r;
  }
  return sqrt(num / (den > 0 ? den : 1));
}
static int failures;
static void report(const char *what, double err, double tol, const char *against) {
  printf("  %-8s %.2e (tolerance %.0e)  %s%s\n", what, err, tol, against, err <= tol ? "" : "  MISMATCH");
  failures += !(err <= tol);
}

/* ---- the CPU half's checks: fp64 formulas written out here, independent of libdsa's reference ---- */
/* 1 iff row t of the indexer's output holds the min(K, n) best keys of its causal window
 * [cu_seqlens[d], t] (n keys) by score sum_h w[t, h] ReLU(q[t, h] . k[s]), ascending, then -1.
 * Scores within a relative 1e-12 count as ties (the reference sums in another order). */
static int topk_row_ok(int t, const uint16_t *iq, const uint16_t *ik, const float *w, const int32_t *idx,
                       const int32_t *len) {
  int d = 0;
  while (t >= cu_seqlens[d + 1]) ++d;
  const int lo = cu_seqlens[d], n = t - lo + 1, want = n < K ? n : K;
  char chosen[T] = {0};
  if (len[t] != want) return 0;
  for (int j = 0; j < K; ++j) {
    const int s = idx[t * K + j];
    if (j >= want) {
      if (s != -1) return 0;
    } else if (s < lo || s > t || (j > 0 && s <= idx[t * K + j - 1])) {
      return 0;
    } else {
      chosen[s] = 1;
    }
  }
  double worst_in = INFINITY, best_out = -INFINITY;
  for (int s = lo; s <= t; ++s) {
    double score = 0;
    for (int h = 0; h < H_IDX; ++h) {
      double dot = 0;
      for (int c = 0; c < DI; ++c)
        dot += (double)dsa_bf16_to_f32(iq[((size_t)t * H_IDX + h) * DI + c]) * dsa_bf16_to_f32(ik[(size_t)s * DI + c]);
      score += w[t * H_IDX + h] * (dot > 0 ? dot : 0);
    }
    if (chosen[s]) worst_in = fmin(worst_in, score);
    else best_out = fmax(best_out, score);
  }
  return worst_in >= best_out - 1e-12 * fabs(best_out);
}

/* The sparse forward in fp64 (docs/contract.md section 9.2, no sink) over rows idx[t, 0 .. len[t]):
 * out[t, h] = sum_j softmax_j(scale * q[t, h] . kv[idx[t, j]]) * kv[idx[t, j], 0:512] and lse the
 * log-sum-exp. Returns loss = sum(dout * out); writes out and lse when they are not NULL. */
typedef struct fwd64_args {
  const double *q, *kv; /* [T, H, D], [T, D] */
  const int32_t *idx, *len;
  const double *dout;   /* [T, H, DV] */
  float scale;
} fwd64_args;
static double attn_fwd64(const fwd64_args *a, double *out, double *lse) {
  double loss = 0, s[K], o[DV];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const double *q = a->q + ((size_t)t * H + h) * D;
      const int32_t *idx = a->idx + (size_t)t * K;
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < a->len[t]; ++j) {
        const double *k = a->kv + (size_t)idx[j] * D;
        double dot = 0;
        for (int c = 0; c < D; ++c) dot += q[c] * k[c];
        s[j] = a->scale * dot, m = fmax(m, s[j]);
      }
      for (int j = 0; j < a->len[t]; ++j) sum += exp(s[j] - m);
      memset(o, 0, sizeof o);
      for (int j = 0; j < a->len[t]; ++j) {
        const double p = exp(s[j] - m) / sum, *v = a->kv + (size_t)idx[j] * D;
        for (int c = 0; c < DV; ++c) o[c] += p * v[c];
      }
      const size_t row = ((size_t)t * H + h) * DV;
      for (int c = 0; c < DV; ++c) loss += a->dout[row + c] * o[c];
      if (out != NULL) memcpy(out + row, o, sizeof o);
      if (lse != NULL) lse[t * H + h] = m + log(sum);
    }
  return loss;
}
/* The gradient grad of the loss with respect to x (n values: the fp64 copy of input x0, that *a
 * reads) against a central finite difference of attn_fwd64 along a random direction u:
 * |(L(x + e u) - L(x - e u)) / 2e - sum_i grad[i] u[i]|, relative to sqrt(sum_i (grad[i] u[i])^2),
 * the size that sum has for a random u (the sum itself may come out near 0). */
static double fd_err(const fwd64_args *a, double *x, const uint16_t *x0, size_t n, const uint16_t *grad) {
  const double e = 1e-3;
  double *u = host_alloc(n * sizeof *u), dir = 0, size = 0;
  for (size_t i = 0; i < n; ++i) {
    const double gu = dsa_bf16_to_f32(grad[i]) * (u[i] = uniform(-1, 1));
    dir += gu, size += gu * gu;
  }
  for (size_t i = 0; i < n; ++i) x[i] = dsa_bf16_to_f32(x0[i]) + e * u[i];
  const double lp = attn_fwd64(a, NULL, NULL);
  for (size_t i = 0; i < n; ++i) x[i] = dsa_bf16_to_f32(x0[i]) - e * u[i];
  const double lm = attn_fwd64(a, NULL, NULL);
  for (size_t i = 0; i < n; ++i) x[i] = dsa_bf16_to_f32(x0[i]);
  free(u);
  return fabs((lp - lm) / (2 * e) - dir) / sqrt(size);
}

int main(int argc, char **argv) {
  const int cpu_only = argc > 1 && strcmp(argv[1], "--cpu") == 0;
  if (argc > 2 || (argc == 2 && !cpu_only)) {
    fprintf(stderr, "usage: train_step [--cpu]\n");
    return 2;
  }
  printf("train_step: libdsa %s; 3 documents (150, 100, 70 tokens) packed into T = %d rows, H = %d, "
         "H_idx = %d, K = %d\n", dsa_version_string(), T, H, H_IDX, K);
  /* 1. The packed batch, planned on the host (once per batch; every layer reuses it). */
  dsa_plan_desc desc = {0};
  desc.cu_seqlens = cu_seqlens;
  desc.num_seqs = NDOC;
  desc.total_key_tokens = T;
  desc.num_queries = -1; /* every token is a query: no context parallelism */
  dsa_plan *plan = NULL;
  DSA_CHECK(dsa_plan_create(&desc, &plan));
  const dsa_plan_view *hv = dsa_plan_host_view(plan);

  /* Inputs (a model computes these): indexer q / k / weights, attention q / kv, the incoming dout. */
  uint16_t *h_iq = random_bf16((size_t)T * H_IDX * DI, -1, 1), *h_ik = random_bf16((size_t)T * DI, -1, 1);
  float *h_w = host_alloc((size_t)T * H_IDX * sizeof(float));
  for (size_t i = 0; i < (size_t)T * H_IDX; ++i) h_w[i] = uniform(-1, 1) / sqrtf((float)(H_IDX * DI));
  uint16_t *h_q = random_bf16((size_t)T * H * D, -1, 1), *h_kv = random_bf16((size_t)T * D, -1, 1);
  uint16_t *h_dout = random_bf16((size_t)T * H * DV, -1, 1);

  /* 2. The CPU half: the step on the CPU reference (host pointers), then its checks. */
  int32_t *r_idx = host_alloc((size_t)T * K * 4), *r_len = host_alloc((size_t)T * 4);
  uint16_t *r_out = host_alloc((size_t)T * H * DV * 2), *r_dq = host_alloc((size_t)T * H * D * 2);
  uint16_t *r_dkv = host_alloc((size_t)T * D * 2);
  float *r_lse = host_alloc((size_t)T * H * 4);
  dsa_indexer_params ip = {0};
  ip.plan = hv;
  ip.num_heads = H_IDX, ip.topk = K;
  ip.index_q = h_iq, ip.index_k = h_ik, ip.weights = h_w, ip.weights_dtype = DSA_DTYPE_F32;
  ip.indices = r_idx, ip.lengths = r_len, ip.engine = DSA_INDEXER_ENGINE_DEFAULT;
  DSA_CHECK(dsa_ref_indexer_topk(&ip));
  dsa_attn_fwd_params fp = {0};
  fp.num_tokens = T, fp.num_heads = H, fp.head_dim = D, fp.num_kv = T, fp.topk = K;
  fp.softmax_scale = 0.0625f; /* GLM-5: qk_head_dim^-0.5 */
  fp.q = h_q, fp.kv = h_kv, fp.indices = r_idx, fp.topk_length = r_len, fp.out = r_out, fp.lse = r_lse;
  DSA_CHECK(dsa_ref_sparse_attn_fwd(&fp));
  dsa_attn_bwd_params bp = {0};
  bp.num_tokens = T, bp.num_heads = H, bp.head_dim = D, bp.num_kv = T, bp.topk = K;
  bp.softmax_scale = fp.softmax_scale, bp.deterministic = 0; /* 0: fp32 atomics on the GPU */
  bp.q = h_q, bp.kv = h_kv, bp.indices = r_idx, bp.topk_length = r_len, bp.out = r_out, bp.dout = h_dout;
  bp.lse = r_lse, bp.dq = r_dq, bp.dkv = r_dkv;
  DSA_CHECK(dsa_ref_sparse_attn_bwd(&bp));

  int rows_ok = 0;
  for (int t = 0; t < T; ++t) rows_ok += topk_row_ok(t, h_iq, h_ik, h_w, r_idx, r_len);
  double *q64 = to_f64(h_q, (size_t)T * H * D), *kv64 = to_f64(h_kv, (size_t)T * D);
  double *dout64 = to_f64(h_dout, (size_t)T * H * DV);
  double *out64 = host_alloc((size_t)T * H * DV * sizeof(double)), *lse64 = host_alloc((size_t)T * H * sizeof(double));
  fwd64_args f64 = {q64, kv64, r_idx, r_len, dout64, fp.softmax_scale};
  attn_fwd64(&f64, out64, lse64);
  double lse_err = 0;
  for (size_t i = 0; i < (size_t)T * H; ++i) lse_err = fmax(lse_err, fabs(r_lse[i] - lse64[i]));
  printf("CPU half: the step on the CPU reference (dsa_ref_*), checked against fp64 formulas in this file\n");
  printf("  indexer  %d of %d rows hold the K best keys of their causal window by sum_h w ReLU(q . k)%s\n",
         rows_ok, T, rows_ok == T ? "" : "  MISMATCH");
  failures += rows_ok != T;
  report("out", rel_err(r_out, out64, (size_t)T * H * DV), 1e-2, "relative error against softmax(scale q . k) v");
  report("lse", lse_err, 1e-4, "largest absolute error against log sum exp(scale q . k)");
  report("dq", fd_err(&f64, q64, h_q, (size_t)T * H * D, r_dq), 1e-2,
         "directional derivative against a finite difference of sum(dout * out)");
  report("dkv", fd_err(&f64, kv64, h_kv, (size_t)T * D, r_dkv), 1e-2,
         "directional derivative against a finite difference of sum(dout * out)");
  printf("CPU half: %s\n", failures == 0 ? "OK" : "MISMATCH");
  free(q64), free(kv64), free(dout64), free(out64), free(lse64);

  /* 3. The GPU half: a context on device 0. */
  dsa_context *ctx = NULL;
  dsa_status s = cpu_only ? DSA_ERROR_NO_DEVICE : dsa_context_create(&ctx, 0);
  if (s == DSA_ERROR_NO_DEVICE) {
    printf("GPU half: SKIPPED (%s)\n", cpu_only ? "--cpu" : dsa_last_error_message());
    printf("train_step: %s, GPU half skipped\n", failures == 0 ? "CPU half OK" : "MISMATCH");
    void *host[] = {h_iq, h_ik, h_w, h_q, h_kv, h_dout, r_idx, r_len, r_out, r_dq, r_dkv, r_lse};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) free(host[i]);
    dsa_plan_destroy(plan);
    return failures == 0 ? 0 : 1;
  }
  if (s != DSA_SUCCESS) { /* e.g. DSA_ERROR_UNSUPPORTED: this build has no code for the device */
    fprintf(stderr, "train_step: %s: %s\n", dsa_status_string(s), dsa_last_error_message());
    return 2;
  }
  int major = 0, minor = 0, sms = 0;
  DSA_CHECK(dsa_context_device_info(ctx, &major, &minor, &sms));
  printf("GPU half: device compute capability %d.%d, %d SMs\n", major, minor, sms);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));

  /* 4. Upload the plan: a size query, then one asynchronous copy into our buffer. */
  size_t plan_bytes = 0;
  dsa_plan_view dplan;
  DSA_CHECK(dsa_plan_upload(ctx, plan, NULL, &plan_bytes, NULL, stream));
  void *dplan_buf = to_device(NULL, plan_bytes);
  DSA_CHECK(dsa_plan_upload(ctx, plan, dplan_buf, &plan_bytes, &dplan, stream));
  printf("plan: %d documents, %d queries in %lld segments, %zu bytes on the device\n", NDOC, T,
         (long long)hv->num_segments, plan_bytes);
  uint16_t *d_iq = to_device(h_iq, (size_t)T * H_IDX * DI * 2), *d_ik = to_device(h_ik, (size_t)T * DI * 2);
  float *d_w = to_device(h_w, (size_t)T * H_IDX * 4);
  uint16_t *d_q = to_device(h_q, (size_t)T * H * D * 2), *d_kv = to_device(h_kv, (size_t)T * D * 2);
  uint16_t *d_dout = to_device(h_dout, (size_t)T * H * DV * 2);
  int32_t *d_idx = to_device(NULL, (size_t)T * K * 4), *d_len = to_device(NULL, (size_t)T * 4);
  uint16_t *d_out = to_device(NULL, (size_t)T * H * DV * 2);
  float *d_lse = to_device(NULL, (size_t)T * H * 4);
  uint16_t *d_dq = to_device(NULL, (size_t)T * H * D * 2), *d_dkv = to_device(NULL, (size_t)T * D * 2);

  /* 5. Indexer top-k: workspace query, then the call. Strides 0 = contiguous. */
  ip.plan = &dplan;
  ip.index_q = d_iq, ip.index_k = d_ik, ip.weights = d_w, ip.indices = d_idx, ip.lengths = d_len;
  size_t ws_idx = 0;
  DSA_CHECK(dsa_indexer_topk(ctx, &ip, NULL, &ws_idx, stream));
  void *d_ws_idx = to_device(NULL, ws_idx);
  DSA_CHECK(dsa_indexer_topk(ctx, &ip, d_ws_idx, &ws_idx, stream));

  /* 6. Sparse forward over the selected keys; lengths from the indexer are its topk_length. */
  fp.q = d_q, fp.kv = d_kv, fp.indices = d_idx, fp.topk_length = d_len, fp.out = d_out, fp.lse = d_lse;
  DSA_CHECK(dsa_sparse_attn_fwd(ctx, &fp, stream));

  /* 7. Sparse backward, workspace query first. */
  bp.q = d_q, bp.kv = d_kv, bp.indices = d_idx, bp.topk_length = d_len;
  bp.out = d_out, bp.dout = d_dout, bp.lse = d_lse, bp.dq = d_dq, bp.dkv = d_dkv;
  size_t ws_bwd = 0;
  DSA_CHECK(dsa_sparse_attn_bwd(ctx, &bp, NULL, &ws_bwd, stream));
  void *d_ws_bwd = to_device(NULL, ws_bwd);
  DSA_CHECK(dsa_sparse_attn_bwd(ctx, &bp, d_ws_bwd, &ws_bwd, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream)); /* the plan may be destroyed after this point */
  printf("indexer: workspace %zu bytes; backward: workspace %zu bytes\n", ws_idx, ws_bwd);

  /* 8. The results against the CPU reference. */
  int32_t *g_idx = to_host(d_idx, (size_t)T * K * 4), *g_len = to_host(d_len, (size_t)T * 4);
  uint16_t *g_out = to_host(d_out, (size_t)T * H * DV * 2), *g_dq = to_host(d_dq, (size_t)T * H * D * 2);
  uint16_t *g_dkv = to_host(d_dkv, (size_t)T * D * 2);
  float *g_lse = to_host(d_lse, (size_t)T * H * 4);
  long selected = 0, rows_equal = 0;
  for (int t = 0; t < T; ++t) {
    selected += g_len[t];
    rows_equal += g_len[t] == r_len[t] && memcmp(g_idx + t * K, r_idx + t * K, K * 4) == 0;
  }
  /* the attention reference runs again on the GPU's indices, so each stage is checked on its own inputs */
  fp.q = h_q, fp.kv = h_kv, fp.indices = g_idx, fp.topk_length = g_len, fp.out = r_out, fp.lse = r_lse;
  DSA_CHECK(dsa_ref_sparse_attn_fwd(&fp));
  bp.q = h_q, bp.kv = h_kv, bp.indices = g_idx, bp.topk_length = g_len, bp.out = g_out, bp.dout = h_dout;
  bp.lse = g_lse, bp.dq = r_dq, bp.dkv = r_dkv;
  DSA_CHECK(dsa_ref_sparse_attn_bwd(&bp));
  lse_err = 0;
  for (size_t i = 0; i < (size_t)T * H; ++i) lse_err = fmax(lse_err, fabs((double)g_lse[i] - r_lse[i]));
  double *r_out64 = to_f64(r_out, (size_t)T * H * DV), *r_dq64 = to_f64(r_dq, (size_t)T * H * D);
  double *r_dkv64 = to_f64(r_dkv, (size_t)T * D);

  printf("indexer: %.1f keys per query on average (K = %d); %ld of %d rows equal to the reference\n",
         (double)selected / T, K, rows_equal, T);
  printf("GPU half against the CPU reference:\n");
  failures += rows_equal != T;
  report("out", rel_err(g_out, r_out64, (size_t)T * H * DV), 1e-2, "relative error");
  report("lse", lse_err, 1e-3, "largest absolute error");
  report("dq", rel_err(g_dq, r_dq64, (size_t)T * H * D), 1e-2, "relative error");
  report("dkv", rel_err(g_dkv, r_dkv64, (size_t)T * D), 1e-2, "relative error");
  printf("train_step: %s\n", failures == 0 ? "OK" : "MISMATCH");

  void *dev[] = {dplan_buf, d_iq, d_ik, d_w, d_q, d_kv, d_dout, d_idx, d_len, d_out, d_lse, d_dq, d_dkv,
                 d_ws_idx, d_ws_bwd};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) CUDA_CHECK(cudaFree(dev[i]));
  void *host[] = {h_iq, h_ik, h_w, h_q, h_kv, h_dout, g_idx, g_len, g_out, g_dq, g_dkv, g_lse, r_idx, r_len,
                  r_out, r_dq, r_dkv, r_lse, r_out64, r_dq64, r_dkv64};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) free(host[i]);
  CUDA_CHECK(cudaStreamDestroy(stream));
  dsa_context_destroy(ctx);
  dsa_plan_destroy(plan);
  return failures == 0 ? 0 : 1;
}
