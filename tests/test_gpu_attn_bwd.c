/* test_gpu_attn_bwd.c - GPU suite gpu_attn_bwd: dsa_sparse_attn_bwd against the CPU reference
 * dsa_ref_sparse_attn_bwd on fresh random inputs (out and lse from dsa_ref_sparse_attn_fwd on the
 * same inputs, dout random), in both modes:
 *  - non-deterministic (fp32 atomics) and deterministic (key-major, three times: dq, dkv and dsink
 *    must be bitwise identical across the repetitions);
 *  - dq and dkv within 1e-2 relative error (tc_rel_err_bf16 over all elements), dsink within 1e-3
 *    (exactly 0 where the reference is 0: sink NULL or +-inf); the two modes within 1e-2 of each
 *    other.
 * Outputs are poisoned over their whole allocation, gaps of strided layouts included: every element
 * must be written and every gap must stay untouched. The workspace is handed over 1 byte off a
 * 256-byte boundary (the op aligns up inside).
 * Each mode runs twice (DSA_OPTION_BWD_KERNEL, include/dsa_tune.h; messages name the kernel by its
 * value): on the portable kernels (1) and on the lockstep 64-head sm_90a kernel (2); a configuration
 * an sm_90a kernel declines with DSA_ERROR_UNSUPPORTED is logged and skipped, and
 * DSA_TEST_REQUIRE_SM90=1 turns "declined D = 576 or D = 512" into a failure: every case here has
 * the 16-byte aligned rows those kernels need, so on an H200 they must run them all. Every suite runs
 * at both head dims (D = 576, and D = 512: no rope part, all dims are value dims). The sm_90a deterministic mode
 * works in chunks of tokens; its fp32 sums add every kv row's contributions in ascending (token,
 * slot, head block) order whatever the chunk size, so with chunk_sweep its reruns with 1, 2 and 5
 * tokens per chunk (DSA_OPTION_BWD_DET_CHUNK_TOKENS) must be bitwise identical to the one-chunk run.
 * The non-deterministic mode of the sm_90a kernels (fp32 atomics into their permuted dKV
 * accumulators, src/kernels.h) is also held against the same kernel's deterministic mode.
 * The ws_* tests run the same cases on the warp-specialised 64-head sm_90a kernel
 * (DSA_BWD_KERNEL_SM90_WS, 4; cuda/attn_bwd/bwd_sm90_ws.cu): both modes of it alone per case
 * (only_kernel), checked as above (reference, poison, gaps, dsink, the deterministic reruns, the two
 * modes against each other); it is the automatic choice of both modes on cc 9.0, and never runs
 * under racecheck (ws_gate below). */
#include <limits.h>
#include "test_common.h"
#include "dsa_testing.h" /* dsa_testing_set_l2_bytes */

typedef enum { LEN_NULL, LEN_ZERO, LEN_FULL, LEN_RANDOM } len_mode;
typedef enum { SINK_NULL, SINK_FINITE, SINK_POS_INF, SINK_NEG_INF, SINK_MIX } sink_mode;

typedef struct bwd_case {
  int64_t T;
  int H, D;
  int64_t Tkv;
  int K;
  len_mode len;
  sink_mode sink;
  double p_invalid; /* a slot holds -1, INT_MIN, T_kv, > T_kv or INT_MAX */
  double p_dup;     /* a slot repeats an earlier slot of its row */
  double p_empty;   /* a row has only invalid slots */
  double p_tail;    /* a row's slots from a random cut on are invalid (a -1-padded list; cuts at 0,
                     * K and multiples of 64 included) */
  int strided;      /* padded token strides for q/out/dout/dq, head-major dout, padded kv/dkv/idx */
  int no_dsink;     /* pass dsink = NULL */
  int chunk_sweep;  /* sm_90a deterministic pass: runs 1.. use 1, 2, 5 tokens per chunk */
} bwd_case;

static int32_t invalid_index(tc_rng *r, int64_t Tkv) {
  switch (tc_below(r, 5)) {
    case 0: return -1;
    case 1: return INT_MIN;
    case 2: return (int32_t)Tkv;
    case 3: return (int32_t)(Tkv + 1 + tc_below(r, 1000));
    default: return INT_MAX;
  }
}

static size_t ext3(int64_t T, int64_t st, int64_t H, int64_t sh, int64_t inner) {
  if (T == 0) return 1;
  return (size_t)((T - 1) * st + (H - 1) * sh + inner);
}

static size_t nz(int64_t n) { return n > 0 ? (size_t)n : 1; }

static void *dev_copy(const void *h, size_t bytes) {
  void *d = NULL;
  TC_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
  if (bytes) TC_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

/* Gathers a strided [n0, n1, inner] bf16 tensor into a contiguous array. */
static void gather3(uint16_t *dst, const uint16_t *src, int64_t n0, int64_t s0, int64_t n1,
                    int64_t s1, int64_t inner) {
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b)
      memcpy(dst + (a * n1 + b) * inner, src + a * s0 + b * s1, (size_t)inner * 2);
}

/* Every element outside the logical [n0, n1, inner] region must still hold the poison. */
static void check_gaps(const char *what, const uint16_t *buf, size_t n, int64_t n0, int64_t s0,
                       int64_t n1, int64_t s1, int64_t inner) {
  uint8_t *mark = calloc(n ? n : 1, 1);
  cr_assert(mark);
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b) memset(mark + a * s0 + b * s1, 1, (size_t)inner);
  for (size_t i = 0; i < n; ++i)
    if (!mark[i])
      cr_assert(buf[i] == TC_POISON_BF16, "%s: gap element %zu was written (0x%04x)", what, i,
                (unsigned)buf[i]);
  free(mark);
}

/* Nonzero: run_case runs this DSA_OPTION_BWD_KERNEL value alone, one pass per mode (the ws_* tests:
 * DSA_BWD_KERNEL_SM90_WS). */
static int only_kernel = 0;
/* >= 0: run_case's context reads this L2 size (dsa_testing_set_l2_bytes; ws_sweep: 0, which turns the
 * warp-specialised kernel's sweep on at every size) */
static int force_l2 = -1;

typedef struct gpu_result {
  uint16_t *dq, *dkv; /* host copies of the whole allocations */
  float *target;      /* the slot target's whole allocation */
  float dsink[DSA_MAX_HEADS];
} gpu_result;

/* The optional slot target (dsa_attn_bwd_params.slot_target) against the reference's: every element
 * of the T x K region within 1e-4 of its row's largest reference value, exactly 0 at invalid slots,
 * the padding of a strided row untouched (still the 0xFF poison). */
static void check_target(const char *name, const float *got, int64_t st, const float *ref, const int32_t *idx,
                         int64_t idx_st, const int32_t *len, int64_t T, int K, int64_t Tkv) {
  for (int64_t t = 0; t < T; ++t) {
    int lim = len ? len[t] : K;
    lim = lim < 0 ? 0 : lim > K ? K : lim;
    double mx = 0;
    for (int j = 0; j < K; ++j) mx = fmax(mx, fabs((double)ref[t * K + j]));
    for (int64_t j = 0; j < st; ++j) {
      const float g = got[t * st + j];
      if (j >= K) {
        uint32_t bits;
        memcpy(&bits, &g, 4);
        cr_assert(bits == 0xFFFFFFFFu, "%s: slot target padding [%lld, %lld] was written", name, (long long)t,
                  (long long)j);
        continue;
      }
      const int32_t v = idx[t * idx_st + j];
      const int valid = j < lim && v >= 0 && (int64_t)v < Tkv;
      const double e = ref[t * K + j];
      cr_assert(!isnan(g), "%s: slot target [%lld, %lld] is NaN", name, (long long)t, (long long)j);
      if (!valid) cr_assert(g == 0.f, "%s: slot target [%lld, %lld] = %g at an invalid slot", name, (long long)t,
                            (long long)j, (double)g);
      cr_assert(fabs(g - e) <= 1e-4 * mx, "%s: slot target [%lld, %lld] = %.9g, reference %.9g (row max %g)", name,
                (long long)t, (long long)j, (double)g, e, mx);
    }
  }
}

static void run_case(const bwd_case *c, tc_rng *rng, const char *name) {
  bwd_case shrunk;
  if (tc_racecheck()) { /* tests/test_common.h */
    shrunk = *c;
    tc_racecheck_shrink(&shrunk.T, &shrunk.K, shrunk.H);
    c = &shrunk;
  }
  const int64_t T = c->T, H = c->H, D = c->D, Tkv = c->Tkv, K = c->K, V = DSA_VALUE_DIM;
  const float scale = 1.0f / sqrtf(576.0f);
  /* strides */
  const int64_t q_sh = D, q_st = H * D + (c->strided ? 24 : 0);
  const int64_t o_sh = V, o_st = H * V + (c->strided ? 8 : 0);
  const int64_t g_st = c->strided ? V + 16 : H * V, g_sh = c->strided ? T * g_st + 32 : V; /* head-major */
  const int64_t dq_sh = c->strided ? D + 8 : D, dq_st = H * dq_sh + (c->strided ? 16 : 0);
  const int64_t kv_st = D + (c->strided ? 64 : 0), dkv_st = D + (c->strided ? 40 : 0);
  const int64_t idx_st = K + (c->strided ? 5 : 0);
  const int64_t tg_st = K + (c->strided ? 3 : 0); /* the optional slot target, every pass */
  cr_log_info("%s: T=%lld H=%lld D=%lld T_kv=%lld K=%lld len=%d sink=%d invalid=%.2f dup=%.2f "
              "empty=%.2f strided=%d",
              name, (long long)T, (long long)H, (long long)D, (long long)Tkv, (long long)K,
              (int)c->len, (int)c->sink, c->p_invalid, c->p_dup, c->p_empty, c->strided);

  /* ---- host inputs ---- */
  const size_t nq = ext3(T, q_st, H, q_sh, D), nout = ext3(T, o_st, H, o_sh, V);
  const size_t ng = ext3(T, g_st, H, g_sh, V), ndq = ext3(T, dq_st, H, dq_sh, D);
  const size_t nkv = Tkv ? (size_t)((Tkv - 1) * kv_st + D) : 1;
  const size_t ndkv = Tkv ? (size_t)((Tkv - 1) * dkv_st + D) : 1;
  const size_t nidx = T ? (size_t)(T * idx_st) : 1;
  uint16_t *q = malloc(nq * 2), *kv = malloc(nkv * 2), *out = malloc(nout * 2), *dout = malloc(ng * 2);
  int32_t *idx = malloc(nidx * 4), *len = malloc((size_t)(T ? T : 1) * 4);
  float *lse = malloc(nz(T * H) * 4), sink[DSA_MAX_HEADS];
  cr_assert(q && kv && out && dout && idx && len && lse);
  tc_fill_bf16(rng, q, nq, -1.0, 1.0);
  tc_fill_bf16(rng, kv, nkv, -1.0, 1.0);
  tc_fill_bf16(rng, dout, ng, -1.0, 1.0);
  for (size_t i = 0; i < nout; ++i) out[i] = TC_POISON_BF16; /* gaps: never read */
  for (int64_t t = 0; t < T; ++t) {
    int32_t *row = idx + t * idx_st;
    const int empty = tc_uniform(rng) < c->p_empty;
    for (int64_t j = 0; j < K; ++j) {
      const double u = tc_uniform(rng);
      if (empty || Tkv == 0 || u < c->p_invalid)
        row[j] = invalid_index(rng, Tkv);
      else if (j > 0 && u < c->p_invalid + c->p_dup)
        row[j] = row[tc_below(rng, j)];
      else
        row[j] = (int32_t)tc_below(rng, Tkv);
    }
    if (c->p_tail > 0 && tc_uniform(rng) < c->p_tail) {
      const int64_t r = tc_below(rng, 4);
      const int64_t cut = r == 0 ? 64 * (int64_t)tc_below(rng, K / 64 + 1) : r == 1 ? (int64_t)tc_below(rng, 2) * K
                                                                                     : (int64_t)tc_below(rng, K + 1);
      for (int64_t j = cut; j < K; ++j) row[j] = j % 5 ? -1 : invalid_index(rng, Tkv);
    }
    for (int64_t j = K; j < idx_st; ++j) row[j] = Tkv ? (int32_t)tc_below(rng, Tkv) : 0;
    switch (c->len) {
      case LEN_ZERO: len[t] = 0; break;
      case LEN_FULL: len[t] = (int32_t)K; break;
      default: len[t] = (int32_t)(tc_below(rng, K + 7) - 3); break; /* -3 .. K+3: clamped */
    }
  }
  for (int h = 0; h < H; ++h) {
    const float finite = (float)tc_range(rng, -2.0, 4.0);
    switch (c->sink) {
      case SINK_POS_INF: sink[h] = INFINITY; break;
      case SINK_NEG_INF: sink[h] = -INFINITY; break;
      case SINK_MIX: sink[h] = h % 4 == 0 ? INFINITY : h % 4 == 1 ? -INFINITY : finite; break;
      default: sink[h] = finite; break;
    }
  }
  const int has_len = c->len != LEN_NULL, has_sink = c->sink != SINK_NULL;

  /* ---- reference: forward for out and lse, then backward ---- */
  dsa_attn_fwd_params fp = {
      .num_tokens = T, .num_heads = (int32_t)H, .head_dim = (int32_t)D, .num_kv = Tkv,
      .topk = (int32_t)K, .softmax_scale = scale, .q = q, .q_stride_token = q_st,
      .q_stride_head = q_sh, .kv = kv, .kv_stride = kv_st, .indices = idx, .indices_stride = idx_st,
      .topk_length = has_len ? len : NULL, .sink = has_sink ? sink : NULL, .out = out,
      .out_stride_token = o_st, .out_stride_head = o_sh, .lse = lse};
  TC_OK(dsa_ref_sparse_attn_fwd(&fp));
  uint16_t *dq_ref = malloc(nz(T * H * D) * 2);
  uint16_t *dkv_ref = malloc(nz(Tkv * D) * 2);
  float *tg_ref = malloc(nz(T * K) * 4);
  float dsink_ref[DSA_MAX_HEADS];
  cr_assert(dq_ref && dkv_ref && tg_ref);
  for (int64_t i = 0; i < Tkv * D; ++i) dkv_ref[i] = 0; /* T = 0: the op defines dkv = 0 */
  for (int h = 0; h < H; ++h) dsink_ref[h] = 0.f;
  dsa_attn_bwd_params rp = {
      .num_tokens = T, .num_heads = (int32_t)H, .head_dim = (int32_t)D, .num_kv = Tkv,
      .topk = (int32_t)K, .softmax_scale = scale, .q = q, .q_stride_token = q_st,
      .q_stride_head = q_sh, .kv = kv, .kv_stride = kv_st, .indices = idx, .indices_stride = idx_st,
      .topk_length = has_len ? len : NULL, .sink = has_sink ? sink : NULL, .out = out,
      .out_stride_token = o_st, .out_stride_head = o_sh, .dout = dout, .dout_stride_token = g_st,
      .dout_stride_head = g_sh, .lse = lse, .dq = dq_ref, .dkv = dkv_ref, .dsink = dsink_ref,
      .slot_target = tg_ref, .slot_target_stride = K};
  TC_OK(dsa_ref_sparse_attn_bwd(&rp));
  if (!has_sink)
    for (int h = 0; h < H; ++h) dsink_ref[h] = 0.f;

  /* ---- device ---- */
  dsa_context *ctx = NULL;
  TC_OK(tc_context_create(&ctx));
  if (force_l2 >= 0) dsa_testing_set_l2_bytes(ctx, force_l2);
  cudaStream_t stream;
  TC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  uint16_t *d_q = dev_copy(q, nq * 2), *d_kv = dev_copy(kv, nkv * 2);
  uint16_t *d_out = dev_copy(out, nout * 2), *d_dout = dev_copy(dout, ng * 2);
  int32_t *d_idx = dev_copy(idx, nidx * 4), *d_len = dev_copy(len, (size_t)T * 4);
  float *d_lse = dev_copy(lse, (size_t)(T * H) * 4), *d_sink = dev_copy(sink, sizeof sink);
  uint16_t *d_dq, *d_dkv;
  float *d_dsink, *d_tg;
  const size_t ntg = nz(T * tg_st);
  TC_CUDA(cudaMalloc((void **)&d_tg, ntg * 4));
  TC_CUDA(cudaMalloc((void **)&d_dq, ndq * 2));
  TC_CUDA(cudaMalloc((void **)&d_dkv, ndkv * 2));
  TC_CUDA(cudaMalloc((void **)&d_dsink, DSA_MAX_HEADS * 4));
  uint16_t *poison16 = malloc((ndq > ndkv ? ndq : ndkv) * 2);
  float poison32[DSA_MAX_HEADS];
  cr_assert(poison16);
  for (size_t i = 0; i < (ndq > ndkv ? ndq : ndkv); ++i) poison16[i] = TC_POISON_BF16;
  tc_poison_f32(poison32, DSA_MAX_HEADS);

  dsa_attn_bwd_params p = rp;
  p.q = d_q; p.kv = d_kv; p.indices = d_idx; p.topk_length = has_len ? d_len : NULL;
  p.sink = has_sink ? d_sink : NULL; p.out = d_out; p.dout = d_dout; p.lse = d_lse;
  p.dq = d_dq; p.dq_stride_token = dq_st; p.dq_stride_head = dq_sh;
  p.dkv = d_dkv; p.dkv_stride = dkv_st;
  p.dsink = c->no_dsink ? NULL : d_dsink;
  p.slot_target = d_tg;
  p.slot_target_stride = tg_st;
  float *tg_host = malloc(ntg * 4);
  cr_assert(tg_host);

  uint16_t *dq_host = malloc(ndq * 2), *dkv_host = malloc(ndkv * 2);
  uint16_t *dq_c = malloc(nz(T * H * D) * 2);
  uint16_t *dkv_c = malloc(nz(Tkv * D) * 2);
  gpu_result res[4] = {{0}}; /* the first repetition of each pass */
  cr_assert(dq_host && dkv_host && dq_c && dkv_c);

  /* passes 0, 1: non-deterministic on kernel 1 (DSA_BWD_KERNEL_PORTABLE), 2 (SM90_H64); passes 2, 3:
   * the same, deterministic. only_kernel: passes 0 and 2 alone, on that kernel */
  static const int sweep[4] = {0, 1, 2, 5};
  for (int pass = 0; pass < 4; ++pass) {
    if (only_kernel && pass != 0 && pass != 2) continue;
    const int mode = pass >= 2, variant = only_kernel ? only_kernel : 1 + pass % 2;
    const int sweep_pass = mode && variant != 1 && c->chunk_sweep; /* sm_90a deterministic chunks */
    p.deterministic = mode;
    size_t ws_bytes = 0, ws_again = 0;
    TC_OK(dsa_sparse_attn_bwd(ctx, &p, NULL, &ws_bytes, stream));
    TC_OK(dsa_sparse_attn_bwd(ctx, &p, NULL, &ws_again, stream));
    cr_assert(ws_bytes >= 1 && ws_bytes == ws_again, "workspace size %zu / %zu", ws_bytes, ws_again);
    unsigned char *ws;
    TC_CUDA(cudaMalloc((void **)&ws, ws_bytes + 1)); /* used from ws + 1: exactly ws_bytes */
    /* under compute-sanitizer (DSA_TEST_SANITIZE): one rerun, with 2 tokens per chunk on a sweep pass;
     * the ws_* tests rerun the non-deterministic mode once for its slot target (reproducible in both
     * modes) */
    const int runs = mode ? (tc_sanitize() ? 2 : sweep_pass ? 4 : 3) : only_kernel ? 2 : 1;
    for (int run = 0; run < runs; ++run) {
      TC_CUDA(cudaMemcpy(d_dq, poison16, ndq * 2, cudaMemcpyHostToDevice));
      TC_CUDA(cudaMemcpy(d_dkv, poison16, ndkv * 2, cudaMemcpyHostToDevice));
      TC_CUDA(cudaMemcpy(d_dsink, poison32, sizeof poison32, cudaMemcpyHostToDevice));
      TC_CUDA(cudaMemset(d_tg, 0xFF, ntg * 4));
      size_t b = ws_bytes;
      TC_SET_OPTION(ctx, DSA_OPTION_BWD_KERNEL, variant);
      TC_SET_OPTION(ctx, DSA_OPTION_BWD_DET_CHUNK_TOKENS, sweep_pass ? (tc_sanitize() ? 2 * run : sweep[run]) : 0);
      const dsa_status st = dsa_sparse_attn_bwd(ctx, &p, ws + 1, &b, stream);
      TC_SET_OPTION(ctx, DSA_OPTION_BWD_KERNEL, DSA_BWD_KERNEL_AUTO);
      TC_SET_OPTION(ctx, DSA_OPTION_BWD_DET_CHUNK_TOKENS, 0);
      if (variant != 1 && st == DSA_ERROR_UNSUPPORTED) {
        if ((D == 576 || D == 512) && getenv("DSA_TEST_REQUIRE_SM90") != NULL)
          cr_assert_fail("%s: the sm_90a kernel (variant %d) declined D=%d H=%d (it must run it): %s", name,
                         variant, (int)D, (int)H, dsa_last_error_message());
        cr_log_info("%s: the sm_90a kernel declined this configuration: %s", name,
                    dsa_last_error_message());
        break;
      }
      cr_assert(st == DSA_SUCCESS, "%s: variant %d mode %d returned %d (%s)", name, variant, mode,
                (int)st, dsa_last_error_message());
      TC_CUDA(cudaStreamSynchronize(stream));
      TC_CUDA(cudaGetLastError());
      TC_CUDA(cudaMemcpy(dq_host, d_dq, ndq * 2, cudaMemcpyDeviceToHost));
      TC_CUDA(cudaMemcpy(dkv_host, d_dkv, ndkv * 2, cudaMemcpyDeviceToHost));
      float dsink_got[DSA_MAX_HEADS];
      TC_CUDA(cudaMemcpy(dsink_got, d_dsink, sizeof dsink_got, cudaMemcpyDeviceToHost));
      TC_CUDA(cudaMemcpy(tg_host, d_tg, ntg * 4, cudaMemcpyDeviceToHost));
      if (T > 0) check_gaps("dq", dq_host, ndq, T, dq_st, H, dq_sh, D);
      if (Tkv > 0) check_gaps("dkv", dkv_host, ndkv, Tkv, dkv_st, 1, 0, D);
      gather3(dq_c, dq_host, T, dq_st, H, dq_sh, D);
      gather3(dkv_c, dkv_host, Tkv, dkv_st, 1, 0, D);
      if (run == 0) {
        const double e_dq = tc_rel_err_bf16(dq_c, dq_ref, (size_t)(T * H * D));
        const double e_dkv = tc_rel_err_bf16(dkv_c, dkv_ref, (size_t)(Tkv * D));
        cr_log_info("%s mode %d variant %d: dq rel err %.3g, dkv rel err %.3g", name, mode, variant, e_dq,
                    e_dkv);
        cr_assert(e_dq <= 1e-2, "%s mode %d variant %d: dq rel err %g", name, mode, variant, e_dq);
        cr_assert(e_dkv <= 1e-2, "%s mode %d variant %d: dkv rel err %g", name, mode, variant, e_dkv);
        if (!c->no_dsink) {
          for (int h = 0; h < H; ++h) {
            if (dsink_ref[h] == 0.f)
              cr_assert(dsink_got[h] == 0.f, "%s mode %d: dsink[%d] = %g, reference 0", name, mode,
                        h, (double)dsink_got[h]);
          }
          const double e_ds = tc_rel_err_f32(dsink_got, dsink_ref, (size_t)H);
          cr_assert(e_ds <= 1e-3, "%s mode %d variant %d: dsink rel err %g (h0: %g vs %g)", name,
                    mode, variant, e_ds,
                    (double)dsink_got[0], (double)dsink_ref[0]);
        } else {
          for (int h = 0; h < DSA_MAX_HEADS; ++h)
            cr_assert(isnan(dsink_got[h]), "dsink = NULL but the buffer was written");
        }
        check_target(name, tg_host, tg_st, tg_ref, idx, idx_st, has_len ? len : NULL, T, (int)K, Tkv);
        res[pass].dq = malloc(ndq * 2);
        res[pass].dkv = malloc(ndkv * 2);
        res[pass].target = malloc(ntg * 4);
        cr_assert(res[pass].dq && res[pass].dkv && res[pass].target);
        memcpy(res[pass].dq, dq_host, ndq * 2);
        memcpy(res[pass].dkv, dkv_host, ndkv * 2);
        memcpy(res[pass].target, tg_host, ntg * 4);
        memcpy(res[pass].dsink, dsink_got, sizeof dsink_got);
      } else if (!mode) {
        cr_assert(memcmp(res[pass].target, tg_host, ntg * 4) == 0,
                  "%s: slot target (variant %d, mode 0) differs between repetitions 0 and %d", name, variant, run);
      } else {
        cr_assert(memcmp(res[pass].target, tg_host, ntg * 4) == 0,
                  "%s: slot target (variant %d, deterministic) differs between repetitions 0 and %d", name, variant, run);
        cr_assert(memcmp(res[pass].dkv, dkv_host, ndkv * 2) == 0,
                  "%s: deterministic dkv (variant %d) differs between repetitions 0 and %d", name, variant, run);
        cr_assert(memcmp(res[pass].dq, dq_host, ndq * 2) == 0,
                  "%s: deterministic dq (variant %d) differs between repetitions 0 and %d", name, variant, run);
        cr_assert(memcmp(res[pass].dsink, dsink_got, sizeof dsink_got) == 0,
                  "%s: deterministic dsink (variant %d) differs between repetitions 0 and %d", name, variant,
                  run);
      }
    }
    TC_CUDA(cudaFree(ws));
  }
  /* the two modes of each variant agree within tolerance (same per-slot math, other sum order) */
  for (int v = 0; v < 2; ++v) {
    if (res[v].dkv == NULL || res[v + 2].dkv == NULL) continue; /* skipped or declined */
    gather3(dkv_c, res[v].dkv, Tkv, dkv_st, 1, 0, D);
    gather3(dkv_ref, res[v + 2].dkv, Tkv, dkv_st, 1, 0, D);
    const double e_modes = tc_rel_err_bf16(dkv_c, dkv_ref, (size_t)(Tkv * D));
    cr_assert(e_modes <= 1e-2, "%s: dkv of the two modes (variant %d) differ by %g", name, v + 1,
              e_modes);
  }
  for (int m = 0; m < 4; ++m) {
    free(res[m].dq);
    free(res[m].dkv);
    free(res[m].target);
  }
  free(q); free(kv); free(out); free(dout); free(idx); free(len); free(lse);
  free(dq_ref); free(dkv_ref); free(tg_ref); free(tg_host); free(poison16); free(dq_host); free(dkv_host); free(dq_c); free(dkv_c);
  cudaFree(d_q); cudaFree(d_kv); cudaFree(d_out); cudaFree(d_dout); cudaFree(d_idx); cudaFree(d_len);
  cudaFree(d_lse); cudaFree(d_sink); cudaFree(d_dq); cudaFree(d_dkv); cudaFree(d_dsink); cudaFree(d_tg);
  TC_CUDA(cudaStreamDestroy(stream));
  dsa_context_destroy(ctx);
}

/* T so that T*H*K stays near 2^15 (the CPU reference costs about 0.1 s per 2^10 (t, h, slot) at
 * D = 576, forward and backward together), at least 1, at most 37. */
static int64_t pick_T(int H, int K) {
  /* under compute-sanitizer (DSA_TEST_SANITIZE): near 2^12, the kernels' work is what costs there */
  int64_t T = (int64_t)(tc_sanitize() ? 1 << 12 : 1 << 15) / ((int64_t)H * K);
  return T < 1 ? 1 : T > 37 ? 37 : T;
}

/* K = 1, 63, 64, 100 (not multiples of the 64-key tile but 64) and 2048; len NULL or random (with
 * values below 0 and above K), sinks NULL or finite, 10% invalid, duplicate and empty rows. */
static void shapes_for_heads(int H, int D) {
  static const int Ks[] = {1, 63, 64, 100, 2048};
  tc_rng rng = tc_seed(D == 576 ? "gpu_attn_bwd/heads" : "gpu_attn_bwd/heads_d512");
  for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; ++i) {
    const int K = Ks[i];
    bwd_case c = {.T = pick_T(H, K), .H = H, .D = D, .Tkv = 61 + K / 3, .K = K,
                  .len = (i % 2 || K == 2048) ? LEN_RANDOM : LEN_NULL, .sink = (i % 3 == 0) ? SINK_NULL : SINK_FINITE,
                  .p_invalid = 0.1, .p_dup = 0.1, .p_empty = 0.1};
    char name[64];
    snprintf(name, sizeof name, "D=%d H=%d K=%d", D, H, K);
    run_case(&c, &rng, name);
  }
}

/* K above the selectors' 2048: 2051 and 4096 (DSA_MAX_ATTN_TOPK), both modes through run_case. */
Test(gpu_attn_bwd, topk_above_2048) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_bwd/topk_above_2048");
  static const int heads[] = {1, 16, 64, 128};
  static const int Ks[] = {2051, 4096};
  for (int hi = 0; hi < 4; ++hi)
    for (int ki = 0; ki < 2; ++ki) {
      const int H = heads[hi], K = Ks[ki], D = (hi == 2 && ki == 1) ? 512 : 576;
      bwd_case c = {.T = pick_T(H, K), .H = H, .D = D, .Tkv = 5003, .K = K,
                    .len = ki ? LEN_RANDOM : LEN_NULL, .sink = hi % 2 ? SINK_FINITE : SINK_NULL,
                    .p_invalid = 0.05, .p_dup = 0.05, .p_empty = 0.1};
      char name[64];
      snprintf(name, sizeof name, "D=%d H=%d K=%d", D, H, K);
      run_case(&c, &rng, name);
    }
}

Test(gpu_attn_bwd, heads_1) { TC_REQUIRE_GPU(); shapes_for_heads(1, 576); }
Test(gpu_attn_bwd, heads_3) { TC_REQUIRE_GPU(); shapes_for_heads(3, 576); }
Test(gpu_attn_bwd, heads_8) { TC_REQUIRE_GPU(); shapes_for_heads(8, 576); }
Test(gpu_attn_bwd, heads_16) { TC_REQUIRE_GPU(); shapes_for_heads(16, 576); }
Test(gpu_attn_bwd, heads_24) { TC_REQUIRE_GPU(); shapes_for_heads(24, 576); }
Test(gpu_attn_bwd, heads_32) { TC_REQUIRE_GPU(); shapes_for_heads(32, 576); }
Test(gpu_attn_bwd, heads_64) { TC_REQUIRE_GPU(); shapes_for_heads(64, 576); }
Test(gpu_attn_bwd, heads_100) { TC_REQUIRE_GPU(); shapes_for_heads(100, 576); }
Test(gpu_attn_bwd, heads_128) { TC_REQUIRE_GPU(); shapes_for_heads(128, 576); }
/* D = 512 (sm_90a: the 8-block instantiation) */
Test(gpu_attn_bwd, d512_heads_1) { TC_REQUIRE_GPU(); shapes_for_heads(1, 512); }
Test(gpu_attn_bwd, d512_heads_3) { TC_REQUIRE_GPU(); shapes_for_heads(3, 512); }
Test(gpu_attn_bwd, d512_heads_8) { TC_REQUIRE_GPU(); shapes_for_heads(8, 512); }
Test(gpu_attn_bwd, d512_heads_16) { TC_REQUIRE_GPU(); shapes_for_heads(16, 512); }
Test(gpu_attn_bwd, d512_heads_24) { TC_REQUIRE_GPU(); shapes_for_heads(24, 512); }
Test(gpu_attn_bwd, d512_heads_32) { TC_REQUIRE_GPU(); shapes_for_heads(32, 512); }
Test(gpu_attn_bwd, d512_heads_64) { TC_REQUIRE_GPU(); shapes_for_heads(64, 512); }
Test(gpu_attn_bwd, d512_heads_100) { TC_REQUIRE_GPU(); shapes_for_heads(100, 512); }
Test(gpu_attn_bwd, d512_heads_128) { TC_REQUIRE_GPU(); shapes_for_heads(128, 512); }

static void invalid_cases(int D) {
  tc_rng rng = tc_seed(D == 576 ? "gpu_attn_bwd/invalid" : "gpu_attn_bwd/invalid_d512");
  bwd_case a = {.T = 29, .H = 5, .D = D, .Tkv = 40, .K = 77, .len = LEN_RANDOM,
                .sink = SINK_FINITE, .p_invalid = 0.3, .p_dup = 0.3, .p_empty = 0.25};
  run_case(&a, &rng, "invalid/dup/empty, len random");
  bwd_case b = a;
  b.len = LEN_NULL;
  run_case(&b, &rng, "invalid/dup/empty, len NULL");
  /* heavy duplicates: 3 kv rows for every slot of every row (long key-major lists) */
  bwd_case d = {.T = 33, .H = 7, .D = D, .Tkv = 3, .K = 130, .len = LEN_FULL,
                .sink = SINK_FINITE, .p_dup = 0.5};
  run_case(&d, &rng, "3 kv rows");
  /* every row empty */
  bwd_case e = {.T = 9, .H = 4, .D = D, .Tkv = 20, .K = 16, .len = LEN_FULL,
                .sink = SINK_FINITE, .p_empty = 1.0};
  run_case(&e, &rng, "all rows empty");
}

Test(gpu_attn_bwd, invalid_duplicate_and_empty_slots) { TC_REQUIRE_GPU(); invalid_cases(576); }
Test(gpu_attn_bwd, d512_invalid_duplicate_and_empty_slots) { TC_REQUIRE_GPU(); invalid_cases(512); }

static void len_sink_cases(int D) {
  tc_rng rng = tc_seed(D == 576 ? "gpu_attn_bwd/len_sink" : "gpu_attn_bwd/len_sink_d512");
  static const len_mode lens[] = {LEN_NULL, LEN_ZERO, LEN_FULL, LEN_RANDOM};
  static const sink_mode sinks[] = {SINK_NULL, SINK_FINITE, SINK_POS_INF, SINK_NEG_INF, SINK_MIX};
  for (int l = 0; l < 4; ++l)
    for (int s = 0; s < 5; ++s) {
      bwd_case c = {.T = 13, .H = 6, .D = D, .Tkv = 50, .K = 45, .len = lens[l],
                    .sink = sinks[s], .p_invalid = 0.1, .p_dup = 0.1, .p_empty = 0.1};
      char name[64];
      snprintf(name, sizeof name, "D=%d len %d sink %d", D, l, s);
      run_case(&c, &rng, name);
    }
}

Test(gpu_attn_bwd, topk_length_and_sink_modes) { TC_REQUIRE_GPU(); len_sink_cases(576); }
Test(gpu_attn_bwd, d512_topk_length_and_sink_modes) { TC_REQUIRE_GPU(); len_sink_cases(512); }

static void strided_cases(void) {
  tc_rng rng = tc_seed("gpu_attn_bwd/strided");
  bwd_case a = {.T = 17, .H = 19, .D = 576, .Tkv = 70, .K = 90, .len = LEN_RANDOM,
                .sink = SINK_MIX, .p_invalid = 0.1, .p_dup = 0.2, .p_empty = 0.1, .strided = 1};
  run_case(&a, &rng, "strided D=576");
  bwd_case b = a;
  b.D = 512;
  run_case(&b, &rng, "strided D=512");
  bwd_case c = {.T = 11, .H = 64, .D = 512, .Tkv = 100, .K = 64, .len = LEN_NULL,
                .sink = SINK_FINITE, .p_dup = 0.1};
  run_case(&c, &rng, "D=512 H=64");
  bwd_case d = a;
  d.no_dsink = 1;
  run_case(&d, &rng, "dsink NULL");
}

Test(gpu_attn_bwd, strided_and_d512) { TC_REQUIRE_GPU(); strided_cases(); }

Test(gpu_attn_bwd, many_tokens) {
  TC_REQUIRE_GPU();
  if (tc_racecheck()) cr_skip_test("T > 65535 is skipped under racecheck (grid and 64-bit offsets, no shared-memory question; memcheck runs it)");
  tc_rng rng = tc_seed("gpu_attn_bwd/many_tokens");
  bwd_case a = {.T = 70001, .H = 1, .D = 576, .Tkv = 1000, .K = 1, .len = LEN_RANDOM,
                .sink = SINK_FINITE, .p_invalid = 0.1};
  run_case(&a, &rng, "T=70001 H=1 K=1");
  bwd_case b = {.T = 66000, .H = 2, .D = 576, .Tkv = 333, .K = 2, .len = LEN_NULL,
                .sink = SINK_NULL, .p_invalid = 0.1, .p_dup = 0.2};
  run_case(&b, &rng, "T=66000 H=2 K=2");
}

/* The sm_90a deterministic mode over many chunks: the one-chunk run and the runs with 1, 2 and 5
 * tokens per chunk must give bitwise identical dq, dkv and dsink (and match the reference). */
static void det_chunk_cases(int D) {
  tc_rng rng = tc_seed(D == 576 ? "gpu_attn_bwd/det_chunks" : "gpu_attn_bwd/det_chunks_d512");
  bwd_case a = {.T = 11, .H = 64, .D = D, .Tkv = 50, .K = 45, .len = LEN_RANDOM,
                .sink = SINK_FINITE, .p_invalid = 0.1, .p_dup = 0.2, .p_empty = 0.1, .chunk_sweep = 1};
  run_case(&a, &rng, "chunks H=64 K=45");
  bwd_case b = {.T = 5, .H = 128, .D = D, .Tkv = 70, .K = 65, .len = LEN_FULL,
                .sink = SINK_MIX, .p_invalid = 0.1, .p_dup = 0.1, .strided = 1, .chunk_sweep = 1};
  run_case(&b, &rng, "chunks H=128 K=65 strided");
  /* long key-major lists (3 kv rows) crossing chunks, H not a multiple of 64 */
  bwd_case d = {.T = 17, .H = 7, .D = D, .Tkv = 3, .K = 65, .len = LEN_FULL,
                .sink = SINK_FINITE, .p_dup = 0.5, .chunk_sweep = 1};
  run_case(&d, &rng, "chunks 3 kv rows");
  bwd_case e = {.T = 6, .H = 3, .D = D, .Tkv = 900, .K = 2048, .len = LEN_RANDOM,
                .sink = SINK_NULL, .p_invalid = 0.05, .p_empty = 0.2, .chunk_sweep = 1};
  run_case(&e, &rng, "chunks K=2048");
  /* H = 100: two head blocks, the second with 28 zero-filled rows */
  bwd_case f = {.T = 4, .H = 100, .D = D, .Tkv = 40, .K = 100, .len = LEN_RANDOM,
                .sink = SINK_FINITE, .p_invalid = 0.1, .p_dup = 0.2, .p_empty = 0.1, .chunk_sweep = 1};
  run_case(&f, &rng, "chunks H=100 K=100");
  /* few heads: 32 and 13 (one head block, most rows zero), strided, sinks of every kind */
  bwd_case g = {.T = 7, .H = 32, .D = D, .Tkv = 60, .K = 130, .len = LEN_RANDOM,
                .sink = SINK_MIX, .p_invalid = 0.1, .p_dup = 0.2, .p_empty = 0.1, .strided = 1, .chunk_sweep = 1};
  run_case(&g, &rng, "chunks H=32 K=130 strided");
  bwd_case h = {.T = 9, .H = 13, .D = D, .Tkv = 5, .K = 70, .len = LEN_FULL,
                .sink = SINK_FINITE, .p_invalid = 0.05, .p_dup = 0.5, .chunk_sweep = 1};
  run_case(&h, &rng, "chunks H=13 5 kv rows");
}

Test(gpu_attn_bwd, det_chunks) { TC_REQUIRE_GPU(); det_chunk_cases(576); }
Test(gpu_attn_bwd, d512_det_chunks) { TC_REQUIRE_GPU(); det_chunk_cases(512); }

static void zero_size_cases(void) {
  tc_rng rng = tc_seed("gpu_attn_bwd/zero");
  bwd_case a = {.T = 0, .H = 4, .D = 576, .Tkv = 37, .K = 8, .len = LEN_FULL, .sink = SINK_FINITE};
  run_case(&a, &rng, "T=0: dkv = 0, dsink = 0");
  bwd_case b = {.T = 5, .H = 4, .D = 576, .Tkv = 0, .K = 8, .len = LEN_FULL, .sink = SINK_FINITE};
  run_case(&b, &rng, "T_kv=0: every slot invalid");
  bwd_case c = a;
  c.D = 512;
  run_case(&c, &rng, "D=512 T=0");
  bwd_case d = b;
  d.D = 512;
  run_case(&d, &rng, "D=512 T_kv=0");
}

Test(gpu_attn_bwd, zero_sizes) { TC_REQUIRE_GPU(); zero_size_cases(); }

/* ---- the warp-specialised sm_90a kernel (DSA_BWD_KERNEL_SM90_WS): the cases above, one
 * non-deterministic pass each (reference, poison, gaps, dsink as for the other kernels). Both head
 * dims; H = 1, 16, 63 (one head block with zero rows), 64, 100 (two blocks, the second with 28 zero
 * rows), 128; K = 1, 63, 64, 100, 2048 (not multiples of the 64-key tile but 64); invalid / -1 /
 * out-of-range slots, duplicates, empty rows, topk_length NULL / 0 / K / random, sinks NULL / finite /
 * +inf / -inf / mixed, strided q / out / dout / dq / kv / dkv / indices, dsink NULL, T = 0 and
 * T_kv = 0; ws_tile_edges: K = 65, 127, 128, 129, 192 (a last tile of 1 / 63 / 64 / 1 / 64 slots,
 * 2-3 tiles: both idx halves and every barrier's first and second phase); ws_topk_above_2048: K =
 * 2051 and 4096 (33 / 64 tiles).
 * Skipped under racecheck (ws_gate), which cannot follow the kernel's barrier.arrive -> barrier.sync
 * hand-offs (docs/reliability.md section 3c: hazards reported where the hardware keeps the order; the
 * kernel has no mbarrier twin); memcheck, synccheck and initcheck run it. */
static void ws_gate(void) {
  if (tc_racecheck())
    cr_skip_test("skipped under racecheck: its named-barrier arrive / sync hand-offs are outside what "
                 "racecheck follows (docs/reliability.md 3c); memcheck / synccheck / initcheck run it");
}
/* One family of cases (cases(D)) at both head dims on the warp-specialised kernel. */
static void ws_both_dims(void (*cases)(int)) {
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  cases(576);
  cases(512);
  only_kernel = 0;
}
static void ws_heads(int H) {
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  shapes_for_heads(H, 576);
  shapes_for_heads(H, 512);
  only_kernel = 0;
}
Test(gpu_attn_bwd, ws_heads_1) { TC_REQUIRE_GPU(); ws_heads(1); }
Test(gpu_attn_bwd, ws_heads_16) { TC_REQUIRE_GPU(); ws_heads(16); }
Test(gpu_attn_bwd, ws_heads_63) { TC_REQUIRE_GPU(); ws_heads(63); }
Test(gpu_attn_bwd, ws_heads_64) { TC_REQUIRE_GPU(); ws_heads(64); }
Test(gpu_attn_bwd, ws_heads_100) { TC_REQUIRE_GPU(); ws_heads(100); }
Test(gpu_attn_bwd, ws_heads_128) { TC_REQUIRE_GPU(); ws_heads(128); }
Test(gpu_attn_bwd, ws_invalid_duplicate_and_empty_slots) {
  TC_REQUIRE_GPU();
  ws_both_dims(invalid_cases);
}
Test(gpu_attn_bwd, ws_topk_length_and_sink_modes) {
  TC_REQUIRE_GPU();
  ws_both_dims(len_sink_cases);
}
Test(gpu_attn_bwd, ws_strided_and_zero_sizes) {
  TC_REQUIRE_GPU();
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  strided_cases();
  zero_size_cases();
  only_kernel = 0;
}

/* The tile loop's edges: 2 or 3 tiles whose last one holds 1, 63 or 64 slots (LEN_FULL: every token
 * has them; LEN_RANDOM: some tokens 0 or 1 tiles beside), H 64 / 128 / 100 (zero rows in block 1). */
static void tile_edge_cases(const char *seed) {
  tc_rng rng = tc_seed(seed);
  static const int Ks[] = {65, 127, 128, 129, 192};
  static const int Hs[] = {64, 128, 100, 64, 128};
  for (int i = 0; i < 5; ++i) {
    const int H = Hs[i], K = Ks[i], D = i % 2 ? 512 : 576;
    bwd_case c = {.T = pick_T(H, K), .H = H, .D = D, .Tkv = 3 * K, .K = K, .len = i < 3 ? LEN_FULL : LEN_RANDOM,
                  .sink = i % 2 ? SINK_FINITE : SINK_MIX, .p_invalid = 0.1, .p_dup = 0.1, .p_empty = 0.05};
    char name[64];
    snprintf(name, sizeof name, "ws D=%d H=%d K=%d", D, H, K);
    run_case(&c, &rng, name);
  }
}
Test(gpu_attn_bwd, ws_tile_edges) {
  TC_REQUIRE_GPU();
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  tile_edge_cases("gpu_attn_bwd/ws_tile_edges");
  only_kernel = 0;
}
/* The sweep (rows started at the tile index the resident CTAs are at, where T_kv's accumulator
 * exceeds half the L2; cuda/attn_bwd/bwd_sm90_ws.cu), on at these sizes through an L2 of 0 bytes: the
 * tile edges, invalid / duplicate / empty slots, lengths and sinks, 100 and 128 heads, and whole rows
 * of 5-6 tiles with a partial last one (T above the split tail's 128 / head blocks tokens, so most
 * tokens run as one CTA, not two halves). The start tile comes from a count of finished tiles that
 * every launch of the process adds to, so the launches here start their rows at varied tiles (a
 * partial tile mid-order included); only dq's summation order sees it. */
static void sweep_whole_row_cases(tc_rng *rng) {
  static const struct { int T, H, D, K, len; } cs[] = {
      {160, 64, 576, 333, LEN_RANDOM}, {150, 128, 512, 320, LEN_FULL}, {140, 100, 576, 300, LEN_RANDOM}};
  for (int i = 0; i < 3; ++i) {
    bwd_case c = {.T = tc_sanitize() ? 70 : cs[i].T, .H = cs[i].H, .D = cs[i].D, .Tkv = 3 * cs[i].K + 11,
                  .K = cs[i].K, .len = cs[i].len, .sink = i % 2 ? SINK_FINITE : SINK_MIX, .p_invalid = 0.05,
                  .p_dup = 0.05, .p_empty = 0.02};
    char name[64];
    snprintf(name, sizeof name, "ws sweep D=%d H=%d K=%d T=%d", c.D, c.H, c.K, (int)c.T);
    run_case(&c, rng, name);
  }
}
Test(gpu_attn_bwd, ws_sweep) {
  TC_REQUIRE_GPU();
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  force_l2 = 0;
  tile_edge_cases("gpu_attn_bwd/ws_sweep");
  tc_rng rng = tc_seed("gpu_attn_bwd/ws_sweep whole rows");
  sweep_whole_row_cases(&rng);
  invalid_cases(576);
  len_sink_cases(512);
  shapes_for_heads(100, 576);
  shapes_for_heads(128, 512);
  force_l2 = -1;
  only_kernel = 0;
}
/* -1-padded lists without topk_length (the kernel walks each row up to its last valid slot, which the
 * prep finds): tails cut at 0, K, tile edges and anywhere, H 16 / 64 / 128, K up to 4 tiles. */
Test(gpu_attn_bwd, ws_padded_lists_without_length) {
  TC_REQUIRE_GPU();
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  tc_rng rng = tc_seed("gpu_attn_bwd/ws_padded_lists_without_length");
  static const int Ks[] = {129, 256, 200, 64};
  static const int Hs[] = {64, 128, 16, 64};
  for (int i = 0; i < 4; ++i) {
    const int H = Hs[i], K = Ks[i], D = i % 2 ? 512 : 576;
    bwd_case c = {.T = tc_sanitize() ? 6 : 24, .H = H, .D = D, .Tkv = 2 * K + 7, .K = K, .len = LEN_NULL,
                  .sink = i % 2 ? SINK_FINITE : SINK_NULL, .p_invalid = 0.05, .p_dup = 0.1, .p_empty = 0.05,
                  .p_tail = 0.9};
    char name[64];
    snprintf(name, sizeof name, "ws padded D=%d H=%d K=%d", D, H, K);
    run_case(&c, &rng, name);
  }
  only_kernel = 0;
}
/* K above 2048 (33 and 64 tiles per token); kept to three cases: the CPU reference of one H = 64,
 * K = 4096 token is ~2^18 (t, h, slot). */
Test(gpu_attn_bwd, ws_topk_above_2048) {
  TC_REQUIRE_GPU();
  ws_gate();
  only_kernel = DSA_BWD_KERNEL_SM90_WS;
  tc_rng rng = tc_seed("gpu_attn_bwd/ws_topk_above_2048");
  static const int Hs[] = {1, 64, 64};
  static const int Ks[] = {4096, 4096, 2051};
  for (int i = 0; i < 3; ++i) {
    const int H = Hs[i], K = Ks[i], D = i == 2 ? 512 : 576;
    bwd_case c = {.T = pick_T(H, K), .H = H, .D = D, .Tkv = 5003, .K = K, .len = i == 1 ? LEN_RANDOM : LEN_NULL,
                  .sink = i ? SINK_FINITE : SINK_NULL, .p_invalid = 0.05, .p_dup = 0.05, .p_empty = 0.1};
    char name[64];
    snprintf(name, sizeof name, "ws D=%d H=%d K=%d", D, H, K);
    run_case(&c, &rng, name);
  }
  only_kernel = 0;
}
/* A small backward problem on the device (random q / kv / indices / lse, out = dout), dq and dkv
 * poisoned with 0xFF: the contract tests' inputs. */
typedef struct {
  dsa_context *ctx;
  dsa_attn_bwd_params p;
  uint16_t *q, *kv, *g, *dq, *dkv;
  int32_t *idx;
  float *lse, *dsink;
} small_bwd;

static void small_bwd_init(small_bwd *f, const char *seed_name, int64_t T, int64_t H, int64_t Tkv, int64_t K) {
  const int64_t D = 576, V = DSA_VALUE_DIM;
  tc_rng rng = tc_seed(seed_name);
  memset(f, 0, sizeof *f);
  TC_OK(tc_context_create(&f->ctx));
  uint16_t *hq = malloc((size_t)(T * H * D) * 2), *hkv = malloc((size_t)(Tkv * D) * 2);
  uint16_t *hg = malloc((size_t)(T * H * V) * 2);
  int32_t *hidx = malloc((size_t)(T * K) * 4);
  float *hlse = malloc((size_t)(T * H) * 4);
  cr_assert(hq && hkv && hg && hidx && hlse);
  tc_fill_bf16(&rng, hq, (size_t)(T * H * D), -1, 1);
  tc_fill_bf16(&rng, hkv, (size_t)(Tkv * D), -1, 1);
  tc_fill_bf16(&rng, hg, (size_t)(T * H * V), -1, 1);
  for (int64_t i = 0; i < T * K; ++i) hidx[i] = (int32_t)tc_below(&rng, Tkv);
  tc_fill_f32(&rng, hlse, (size_t)(T * H), 1, 3);
  f->q = dev_copy(hq, (size_t)(T * H * D) * 2);
  f->kv = dev_copy(hkv, (size_t)(Tkv * D) * 2);
  f->g = dev_copy(hg, (size_t)(T * H * V) * 2);
  f->idx = dev_copy(hidx, (size_t)(T * K) * 4);
  f->lse = dev_copy(hlse, (size_t)(T * H) * 4);
  free(hq); free(hkv); free(hg); free(hidx); free(hlse);
  TC_CUDA(cudaMalloc((void **)&f->dq, (size_t)(T * H * D) * 2));
  TC_CUDA(cudaMalloc((void **)&f->dkv, (size_t)(Tkv * D) * 2));
  TC_CUDA(cudaMalloc((void **)&f->dsink, (size_t)H * 4));
  TC_CUDA(cudaMemset(f->dq, 0xFF, (size_t)(T * H * D) * 2));
  TC_CUDA(cudaMemset(f->dkv, 0xFF, (size_t)(Tkv * D) * 2));
  dsa_attn_bwd_params p = {.num_tokens = T, .num_heads = (int32_t)H, .head_dim = (int32_t)D,
                           .num_kv = Tkv, .topk = (int32_t)K, .softmax_scale = 0.05f, .q = f->q,
                           .kv = f->kv, .indices = f->idx, .out = f->g, .dout = f->g, .lse = f->lse,
                           .dq = f->dq, .dkv = f->dkv, .dsink = f->dsink};
  f->p = p;
}

static void small_bwd_free(small_bwd *f) {
  cudaFree(f->q); cudaFree(f->kv); cudaFree(f->g); cudaFree(f->idx); cudaFree(f->lse);
  cudaFree(f->dq); cudaFree(f->dkv); cudaFree(f->dsink);
  dsa_context_destroy(f->ctx);
}

/* The deterministic mode of the warp-specialised kernel over many chunks (its contrib rows are whole
 * 64-slot tiles per CTA: K = 45, 65, 100, 130 leave partial last tiles), both head dims. */
Test(gpu_attn_bwd, ws_det_chunks) {
  TC_REQUIRE_GPU();
  ws_both_dims(det_chunk_cases);
}

/* The deterministic mode of the warp-specialised kernel captured in a CUDA graph, in one chunk and in
 * six (the sort-ahead forks the context's side stream from the captured stream only
 * when there is a second chunk, and joins it back): the graph's replay equals the eager call
 * bitwise, outputs poisoned between them. */
Test(gpu_attn_bwd, ws_det_graph_capture) {
  TC_REQUIRE_GPU();
  ws_gate();
  const int64_t T = 40, H = 64, Tkv = 300, K = 100, D = 576;
  const size_t nq = (size_t)(T * H * D), nkv = (size_t)(Tkv * D);
  small_bwd f;
  small_bwd_init(&f, "gpu_attn_bwd/ws_det_graph_capture", T, H, Tkv, K);
  cudaStream_t s;
  TC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint16_t *dq0 = malloc(nq * 2), *dkv0 = malloc(nkv * 2), *dq1 = malloc(nq * 2), *dkv1 = malloc(nkv * 2);
  cr_assert(dq0 && dkv0 && dq1 && dkv1);
  f.p.deterministic = 1;
  TC_SET_OPTION(f.ctx, DSA_OPTION_BWD_KERNEL, DSA_BWD_KERNEL_SM90_WS);
  static const int chunk_tokens[] = {0, 7}; /* 0: the whole T in one chunk; 7: 5 + 5 x 7 tokens */
  for (int i = 0; i < 2; ++i) {
    TC_SET_OPTION(f.ctx, DSA_OPTION_BWD_DET_CHUNK_TOKENS, chunk_tokens[i]);
    size_t need = 0;
    TC_OK(dsa_sparse_attn_bwd(f.ctx, &f.p, NULL, &need, s));
    void *ws;
    TC_CUDA(cudaMalloc(&ws, need));
    dsa_status st = dsa_sparse_attn_bwd(f.ctx, &f.p, ws, &need, s);
    if (st == DSA_ERROR_UNSUPPORTED) {
      if (getenv("DSA_TEST_REQUIRE_SM90") != NULL)
        cr_assert_fail("ws_det_graph_capture: the sm_90a kernel declined: %s", dsa_last_error_message());
      cr_log_info("ws_det_graph_capture: the sm_90a kernel declined: %s", dsa_last_error_message());
      TC_CUDA(cudaFree(ws));
      break;
    }
    cr_assert(st == DSA_SUCCESS, "eager call: %s", dsa_last_error_message());
    TC_CUDA(cudaStreamSynchronize(s));
    TC_CUDA(cudaMemcpy(dq0, f.dq, nq * 2, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemcpy(dkv0, f.dkv, nkv * 2, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemset(f.dq, 0xFF, nq * 2));
    TC_CUDA(cudaMemset(f.dkv, 0xFF, nkv * 2));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TC_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    st = dsa_sparse_attn_bwd(f.ctx, &f.p, ws, &need, s);
    const cudaError_t ce = cudaStreamEndCapture(s, &g);
    cr_assert(st == DSA_SUCCESS, "captured call, %d tokens per chunk: %s", chunk_tokens[i], dsa_last_error_message());
    TC_CUDA(ce);
    TC_CUDA(cudaGraphInstantiate(&ge, g, 0));
    TC_CUDA(cudaGraphLaunch(ge, s));
    TC_CUDA(cudaStreamSynchronize(s));
    TC_CUDA(cudaMemcpy(dq1, f.dq, nq * 2, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemcpy(dkv1, f.dkv, nkv * 2, cudaMemcpyDeviceToHost));
    cr_assert(memcmp(dq0, dq1, nq * 2) == 0, "%d tokens per chunk: the replay's dq differs", chunk_tokens[i]);
    cr_assert(memcmp(dkv0, dkv1, nkv * 2) == 0, "%d tokens per chunk: the replay's dkv differs", chunk_tokens[i]);
    TC_CUDA(cudaGraphExecDestroy(ge));
    TC_CUDA(cudaGraphDestroy(g));
    TC_CUDA(cudaFree(ws));
  }
  free(dq0); free(dkv0); free(dq1); free(dkv1);
  TC_CUDA(cudaStreamDestroy(s));
  small_bwd_free(&f);
}

/* The retired DSA_BWD_KERNEL_SM90_SMALL (its kernel left the library): DSA_ERROR_UNSUPPORTED naming
 * it, in both modes, before any launch; outputs untouched. Launches nothing: not gated. */
Test(gpu_attn_bwd, retired_small_kernel_declines) {
  TC_REQUIRE_GPU();
  small_bwd f;
  small_bwd_init(&f, "gpu_attn_bwd/retired_small_kernel_declines", 3, 16, 16, 8);
  TC_SET_OPTION(f.ctx, DSA_OPTION_BWD_KERNEL, DSA_BWD_KERNEL_SM90_SMALL);
  for (int mode = 0; mode < 2; ++mode) {
    f.p.deterministic = mode;
    size_t need = 0;
    TC_OK(dsa_sparse_attn_bwd(f.ctx, &f.p, NULL, &need, 0));
    void *ws;
    TC_CUDA(cudaMalloc(&ws, need));
    TC_FAILS(dsa_sparse_attn_bwd(f.ctx, &f.p, ws, &need, 0), DSA_ERROR_UNSUPPORTED, "DSA_BWD_KERNEL_SM90_SMALL");
    TC_CUDA(cudaDeviceSynchronize());
    uint16_t probe[64];
    TC_CUDA(cudaMemcpy(probe, f.dkv, sizeof probe, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; ++i) cr_assert(probe[i] == 0xFFFF, "a declined call wrote dkv");
    TC_CUDA(cudaMemcpy(probe, f.dq, sizeof probe, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; ++i) cr_assert(probe[i] == 0xFFFF, "a declined call wrote dq");
    TC_CUDA(cudaFree(ws));
  }
  small_bwd_free(&f);
}

Test(gpu_attn_bwd, workspace_contract) {
  TC_REQUIRE_GPU();
  const int64_t Tkv = 20, D = 576;
  small_bwd f;
  small_bwd_init(&f, "gpu_attn_bwd/workspace", 7, 3, Tkv, 10);
  dsa_context *ctx = f.ctx;
  dsa_attn_bwd_params p = f.p;
  uint16_t *dkv = f.dkv;
  for (int mode = 0; mode < 2; ++mode) {
    p.deterministic = mode;
    size_t need = 0, again = 0;
    TC_FAILS(dsa_sparse_attn_bwd(ctx, &p, NULL, NULL, 0), DSA_ERROR_INVALID_ARGUMENT,
             "workspace_bytes");
    TC_OK(dsa_sparse_attn_bwd(ctx, &p, NULL, &need, 0));
    TC_OK(dsa_sparse_attn_bwd(ctx, &p, NULL, &again, 0));
    cr_assert(need >= 1 && need == again);
    void *ws;
    TC_CUDA(cudaMalloc(&ws, need));
    size_t small = need - 1;
    TC_FAILS(dsa_sparse_attn_bwd(ctx, &p, ws, &small, 0), DSA_ERROR_WORKSPACE_TOO_SMALL,
             "workspace_bytes");
    TC_CUDA(cudaDeviceSynchronize());
    uint16_t probe[64];
    TC_CUDA(cudaMemcpy(probe, dkv, sizeof probe, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; ++i) cr_assert(probe[i] == 0xFFFF, "a failed call wrote dkv");
    TC_FAILS(dsa_sparse_attn_bwd(NULL, &p, ws, &need, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx");
    TC_OK(dsa_sparse_attn_bwd(ctx, &p, ws, &need, 0));
    TC_CUDA(cudaDeviceSynchronize());
    TC_CUDA(cudaFree(ws));
    TC_CUDA(cudaMemset(dkv, 0xFF, (size_t)(Tkv * D) * 2));
  }
  small_bwd_free(&f);
}
