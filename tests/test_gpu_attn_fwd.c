/* test_gpu_attn_fwd.c - GPU suite gpu_attn_fwd: dsa_sparse_attn_fwd against the CPU reference
 * dsa_ref_sparse_attn_fwd on fresh random inputs, for every kernel choice (DSA_OPTION_FWD_KERNEL,
 * include/dsa_tune.h: PORTABLE, SM90_H64 = the 64-head sm_90a kernel on the whole H, SM90_SMALL =
 * the sm_90a small-H kernel (H <= 64), SM90_SPLIT = the 64-head kernel on heads [0, 64), the small-H
 * kernel on the rest (run only where it differs from the two before: 64 < H < 128), then AUTO; a
 * configuration an sm_90a kernel declines is logged and skipped for that choice only). Messages
 * name the choice by its value (1 portable .. 4 split, 0 automatic).
 *
 * Every run starts from poisoned outputs (NaN bf16 / NaN fp32) over the whole out allocation, gaps
 * of strided layouts included: every (t, h) must be written, every gap must stay untouched. out is
 * checked per (t, h) to 1e-2 relative error, lse and max_logits to 1e-3 * max(1, |ref|) with +inf
 * and -inf matched exactly. Large batches compare a random sample of rows: rows are independent,
 * so the reference runs on a gathered sub-batch of just those rows (it is slow by design).
 * DSA_TEST_REQUIRE_SM90=1 turns "the sm_90a kernel declined H = 64 or 128, D = 576, dense layouts"
 * from a warning into a failure, and so "the small-H kernel or the split declined a configuration it
 * must run".
 * Every run of the 64-head sm_90a kernel (SM90_H64, SM90_SPLIT, and AUTO where the automatic choice
 * takes it) is repeated for each hand-off of its consumer warpgroups (DSA_OPTION_FWD_SM90_HANDOFF:
 * 0 named barriers, the default; 1 mbarriers, the twin racecheck follows), each checked in full; the
 * twin does the same arithmetic in the same order, so a result that is not bitwise identical to the
 * default's is logged as a warning (a race that stays inside the tolerance would show there first).
 * Under racecheck the named-barrier hand-off is skipped (tests/test_common.h). DSA_TEST_FWD_ONLY=k
 * runs hand-off k alone. DSA_TEST_FWD_HEADS=h limits heads_33_to_127 to H = h (one sanitizer process
 * per head count). */
#include <limits.h>
#include "test_common.h"
#include <criterion/parameterized.h>

typedef enum { LEN_NULL, LEN_ZERO, LEN_FULL, LEN_RANDOM, LEN_MODES } len_mode;
typedef enum { SINK_NULL, SINK_FINITE, SINK_POS_INF, SINK_NEG_INF, SINK_MIX, SINK_MODES } sink_mode;
typedef enum { LAYOUT_DENSE, LAYOUT_TOKEN_PAD, LAYOUT_HEAD_MAJOR } layout;

typedef struct attn_case {
  int64_t T;
  int H, D;
  int64_t Tkv;
  int K;
  float scale;         /* 0: 1/sqrt(576) */
  len_mode len;
  sink_mode sink;
  double p_invalid;    /* a slot holds -1, INT_MIN, T_kv, > T_kv or INT_MAX */
  double p_dup;        /* a slot repeats an earlier slot of its row */
  double p_empty;      /* a row has only invalid slots */
  layout q_layout, out_layout;
  int64_t kv_stride;   /* 0: D (passed as 0, the contiguous default) */
  int64_t idx_pad;     /* indices row stride K + idx_pad (0: passed as 0) */
  int sample;          /* rows compared with the reference (0: automatic budget) */
  int rerun;           /* run each variant twice, results must be bitwise identical */
  int use_stream;      /* a non-blocking stream instead of the legacy default stream */
  int no_max_logits;   /* pass max_logits = NULL */
  int small_max;       /* > 0: DSA_OPTION_FWD_SMALL_AUTO_MAX = small_max - 1 on the context */
} attn_case;

static const char *len_name[] = {"NULL", "0", "K", "random"};
static const char *sink_name[] = {"NULL", "finite", "+inf", "-inf", "mix"};

/* Strides of a [T, H, inner] tensor in the given layout (explicit values, never 0). */
static void layout_strides(layout l, int64_t T, int64_t H, int64_t inner, int64_t *st, int64_t *sh) {
  switch (l) {
    case LAYOUT_TOKEN_PAD: /* a token stride above H * inner */
      *sh = inner;
      *st = H * inner + 64;
      break;
    case LAYOUT_HEAD_MAJOR: /* [H, T, inner] storage, with a gap between heads */
      *st = inner;
      *sh = T * inner + 16;
      break;
    default:
      *sh = inner;
      *st = H * inner;
      break;
  }
}

static size_t extent(int64_t T, int64_t st, int64_t H, int64_t sh, int64_t inner) {
  return (size_t)((T - 1) * st + (H - 1) * sh + inner);
}

static int32_t invalid_index(tc_rng *r, int64_t Tkv) {
  switch (tc_below(r, 5)) {
    case 0: return -1;
    case 1: return INT_MIN;
    case 2: return (int32_t)Tkv;
    case 3: return (int32_t)(Tkv + 1 + tc_below(r, 1000));
    default: return INT_MAX;
  }
}

static int required_sm90(const attn_case *c) {
  return (c->H == 64 || c->H == 128) && c->D == 576 && c->q_layout == LAYOUT_DENSE &&
         c->out_layout == LAYOUT_DENSE && c->kv_stride == 0;
}

/* The small-H kernel (variant 3) must run every H <= 64 with D = 576 or 512 and any layout whose
 * q / kv rows are 16-B aligned (every layout of this suite); the split (variant 4) every H > 64 under
 * the same conditions. */
static int required_small_sm90(const attn_case *c) {
  return c->H <= 64 && (c->D == 576 || c->D == 512) && c->kv_stride % 8 == 0;
}
static int required_split_sm90(const attn_case *c) {
  return c->H > 64 && (c->D == 576 || c->D == 512) && c->kv_stride % 8 == 0;
}

/* The order run_case goes through the kernel choices (DSA_OPTION_FWD_KERNEL); automatic last. */
static const int variants[] = {DSA_FWD_KERNEL_PORTABLE, DSA_FWD_KERNEL_SM90_H64, DSA_FWD_KERNEL_SM90_SMALL,
                               DSA_FWD_KERNEL_SM90_SPLIT, DSA_FWD_KERNEL_AUTO};
enum { NUM_HANDOFF = 2 }; /* DSA_OPTION_FWD_SM90_HANDOFF 0 (named barriers), 1 (mbarriers) */

/* DSA_TEST_FWD_ONLY=k runs hand-off k alone (on the 64-head kernel's launches): lets a sanitizer run
 * spend its time on one. */
static int fwd_only(void) {
  const char *s = getenv("DSA_TEST_FWD_ONLY");
  return s ? atoi(s) : -1;
}

/* Whether this kernel choice runs the 64-head sm_90a kernel for H heads (src/attn_fwd.c; small_max =
 * the context's DSA_OPTION_FWD_SMALL_AUTO_MAX): then it is run once per hand-off. */
static int runs_64head(int variant, int64_t H, int64_t small_max) {
  return variant == DSA_FWD_KERNEL_SM90_H64 || variant == DSA_FWD_KERNEL_SM90_SPLIT ||
         (variant == DSA_FWD_KERNEL_AUTO && (H >= 64 || H % 64 > small_max));
}

static void check_scalar(const char *what, float got, float ref, int64_t t, int h, const char *variant) {
  if (isinf(ref)) {
    cr_assert(got == ref, "variant %s: %s[t=%lld, h=%d] = %g, reference %g", variant, what,
              (long long)t, h, (double)got, (double)ref);
  } else {
    const double tol = 1e-3 * fmax(1.0, fabs((double)ref));
    cr_assert(fabs((double)got - (double)ref) <= tol, /* NaN fails too */
              "variant %s: %s[t=%lld, h=%d] = %.7g, reference %.7g (tolerance %.2g)", variant, what,
              (long long)t, h, (double)got, (double)ref, tol);
  }
}

/* Runs one configuration for both variants against the reference. */
static void run_case(const attn_case *c, tc_rng *rng, const char *name) {
  attn_case shrunk;
  if (tc_racecheck()) { /* tests/test_common.h */
    shrunk = *c;
    tc_racecheck_shrink(&shrunk.T, &shrunk.K, shrunk.H);
    c = &shrunk;
  }
  const int64_t T = c->T, H = c->H, D = c->D, Tkv = c->Tkv, K = c->K, V = DSA_VALUE_DIM;
  const float scale = c->scale > 0 ? c->scale : 1.0f / sqrtf(576.0f);
  int64_t q_st, q_sh, o_st, o_sh;
  layout_strides(c->q_layout, T, H, D, &q_st, &q_sh);
  layout_strides(c->out_layout, T, H, V, &o_st, &o_sh);
  const int64_t kv_st = c->kv_stride ? c->kv_stride : D;
  const int64_t idx_st = K + c->idx_pad;
  cr_log_info("%s: T=%lld H=%lld D=%lld T_kv=%lld K=%lld len=%s sink=%s invalid=%.2f dup=%.2f "
              "empty=%.2f q_layout=%d out_layout=%d kv_stride=%lld idx_stride=%lld",
              name, (long long)T, (long long)H, (long long)D, (long long)Tkv, (long long)K,
              len_name[c->len], sink_name[c->sink], c->p_invalid, c->p_dup, c->p_empty,
              (int)c->q_layout, (int)c->out_layout, (long long)kv_st, (long long)idx_st);

  /* ---- host inputs ---- */
  const size_t nq = extent(T, q_st, H, q_sh, D), nkv = (size_t)((Tkv - 1) * kv_st + D);
  const size_t nidx = (size_t)(T * idx_st), nout = extent(T, o_st, H, o_sh, V);
  uint16_t *q = malloc(nq * 2), *kv = malloc(nkv * 2);
  int32_t *idx = malloc(nidx * 4), *len = malloc((size_t)T * 4);
  float sink[DSA_MAX_HEADS];
  cr_assert(q && kv && idx && len, "host allocation failed");
  tc_fill_bf16(rng, q, nq, -1.0, 1.0);
  tc_fill_bf16(rng, kv, nkv, -1.0, 1.0);
  for (int64_t t = 0; t < T; ++t) {
    int32_t *row = idx + t * idx_st;
    const int empty = tc_uniform(rng) < c->p_empty;
    for (int64_t j = 0; j < K; ++j) {
      const double u = tc_uniform(rng);
      if (empty || u < c->p_invalid)
        row[j] = invalid_index(rng, Tkv);
      else if (j > 0 && u < c->p_invalid + c->p_dup)
        row[j] = row[tc_below(rng, j)];
      else
        row[j] = (int32_t)tc_below(rng, Tkv);
    }
    /* the padding after slot K holds valid rows: a kernel reading past K would count them */
    for (int64_t j = K; j < idx_st; ++j) row[j] = (int32_t)tc_below(rng, Tkv);
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

  /* ---- reference on the sampled rows (a contiguous sub-batch) ---- */
  int64_t S = c->sample;
  if (S <= 0) {
    S = (int64_t)(1 << 18) / (H * K);
    if (S < 3) S = 3;
  }
  if (S > T) S = T;
  int64_t *rows = malloc((size_t)S * sizeof(int64_t));
  cr_assert(rows);
  for (int64_t s = 0; s < S; ++s) rows[s] = S == T ? s : tc_below(rng, T);
  if (S < T) rows[S - 1] = T - 1; /* the last row always: it sits past every 2^16 boundary */
  uint16_t *q_ref = malloc((size_t)(S * H * D) * 2), *kv_ref = malloc((size_t)(Tkv * D) * 2);
  int32_t *idx_ref = malloc((size_t)(S * K) * 4), *len_ref = malloc((size_t)S * 4);
  uint16_t *out_ref = malloc((size_t)(S * H * V) * 2);
  float *lse_ref = malloc((size_t)(S * H) * 4), *max_ref = malloc((size_t)(S * H) * 4);
  cr_assert(q_ref && kv_ref && idx_ref && len_ref && out_ref && lse_ref && max_ref);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t = rows[s];
    for (int64_t h = 0; h < H; ++h)
      memcpy(q_ref + (s * H + h) * D, q + t * q_st + h * q_sh, (size_t)D * 2);
    memcpy(idx_ref + s * K, idx + t * idx_st, (size_t)K * 4);
    len_ref[s] = len[t];
  }
  for (int64_t r = 0; r < Tkv; ++r) memcpy(kv_ref + r * D, kv + r * kv_st, (size_t)D * 2);
  dsa_attn_fwd_params rp = {
      .num_tokens = S, .num_heads = (int32_t)H, .head_dim = (int32_t)D, .num_kv = Tkv,
      .topk = (int32_t)K, .softmax_scale = scale, .q = q_ref, .kv = kv_ref, .indices = idx_ref,
      .topk_length = has_len ? len_ref : NULL, .sink = has_sink ? sink : NULL, .out = out_ref,
      .lse = lse_ref, .max_logits = max_ref};
  TC_OK(dsa_ref_sparse_attn_fwd(&rp));

  /* ---- device ---- */
  dsa_context *ctx = NULL;
  TC_OK(tc_context_create(&ctx));
  if (c->small_max > 0) TC_SET_OPTION(ctx, DSA_OPTION_FWD_SMALL_AUTO_MAX, c->small_max - 1);
  int64_t small_max = 0, handoff_default = 0;
  TC_OK(dsa_context_get_option(ctx, DSA_OPTION_FWD_SMALL_AUTO_MAX, &small_max));
  TC_OK(dsa_context_get_option(ctx, DSA_OPTION_FWD_SM90_HANDOFF, &handoff_default));
  cudaStream_t stream = 0;
  if (c->use_stream) TC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  uint16_t *d_q, *d_kv, *d_out;
  int32_t *d_idx, *d_len;
  float *d_sink, *d_lse, *d_max;
  TC_CUDA(cudaMalloc((void **)&d_q, nq * 2));
  TC_CUDA(cudaMalloc((void **)&d_kv, nkv * 2));
  TC_CUDA(cudaMalloc((void **)&d_idx, nidx * 4));
  TC_CUDA(cudaMalloc((void **)&d_len, (size_t)T * 4));
  TC_CUDA(cudaMalloc((void **)&d_sink, DSA_MAX_HEADS * 4));
  TC_CUDA(cudaMalloc((void **)&d_out, nout * 2));
  TC_CUDA(cudaMalloc((void **)&d_lse, (size_t)(T * H) * 4));
  TC_CUDA(cudaMalloc((void **)&d_max, (size_t)(T * H) * 4));
  TC_CUDA(cudaMemcpy(d_q, q, nq * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_kv, kv, nkv * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_idx, idx, nidx * 4, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_len, len, (size_t)T * 4, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_sink, sink, DSA_MAX_HEADS * 4, cudaMemcpyHostToDevice));

  dsa_attn_fwd_params p = {
      .num_tokens = T, .num_heads = (int32_t)H, .head_dim = (int32_t)D, .num_kv = Tkv,
      .topk = (int32_t)K, .softmax_scale = scale, .q = d_q, .q_stride_token = q_st,
      .q_stride_head = q_sh, .kv = d_kv, .kv_stride = c->kv_stride, .indices = d_idx,
      .indices_stride = c->idx_pad ? idx_st : 0, .topk_length = has_len ? d_len : NULL,
      .sink = has_sink ? d_sink : NULL, .out = d_out, .out_stride_token = o_st,
      .out_stride_head = o_sh, .lse = d_lse, .max_logits = c->no_max_logits ? NULL : d_max};
  if (c->q_layout == LAYOUT_DENSE) p.q_stride_token = p.q_stride_head = 0;
  if (c->out_layout == LAYOUT_DENSE) p.out_stride_token = p.out_stride_head = 0;

  /* which out elements belong to some (t, h); the rest must stay poisoned */
  unsigned char *mask = calloc(nout, 1);
  uint16_t *out = malloc(nout * 2), *poison = malloc(nout * 2), *out_first = malloc(nout * 2);
  float *lse = malloc((size_t)(T * H) * 4), *mx = malloc((size_t)(T * H) * 4);
  float *lse_first = malloc((size_t)(T * H) * 4), *mx_first = malloc((size_t)(T * H) * 4);
  float *nan_f = malloc((size_t)(T * H) * 4);
  uint16_t *out_ov0 = malloc(nout * 2); /* hand-off 0's results of the current kernel choice */
  float *lse_ov0 = malloc((size_t)(T * H) * 4), *mx_ov0 = malloc((size_t)(T * H) * 4);
  cr_assert(mask && out && poison && out_first && lse && mx && lse_first && mx_first && nan_f);
  cr_assert(out_ov0 && lse_ov0 && mx_ov0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) memset(mask + t * o_st + h * o_sh, 1, (size_t)V);
  for (size_t i = 0; i < nout; ++i) poison[i] = TC_POISON_BF16;
  tc_poison_f32(nan_f, (size_t)(T * H));

  for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; ++vi) {
    const int variant = variants[vi];
    if (variant == DSA_FWD_KERNEL_SM90_SPLIT && (H <= 64 || H % 64 == 0)) continue; /* the same launches as 2 or 3 */
    const int num_ov = runs_64head(variant, H, small_max) ? NUM_HANDOFF : 1;
    int declined = 0;
    for (int ov = 0; ov < num_ov && !declined; ++ov) {
      if (num_ov > 1 && fwd_only() >= 0 && ov != fwd_only()) continue;
      if (num_ov > 1 && ov == DSA_FWD_HANDOFF_NAMED_BARRIER && tc_racecheck()) continue; /* test_common.h */
      char vn[32]; /* the kernel choice in messages: "2" or "2/handoff 1" */
      if (num_ov > 1)
        snprintf(vn, sizeof vn, "%d/handoff %d", variant, ov);
      else
        snprintf(vn, sizeof vn, "%d", variant);
      for (int run = 0; run < (c->rerun && !tc_sanitize() ? 2 : 1); ++run) {
        TC_CUDA(cudaMemcpy(d_out, poison, nout * 2, cudaMemcpyHostToDevice));
        TC_CUDA(cudaMemcpy(d_lse, nan_f, (size_t)(T * H) * 4, cudaMemcpyHostToDevice));
        TC_CUDA(cudaMemcpy(d_max, nan_f, (size_t)(T * H) * 4, cudaMemcpyHostToDevice));
        TC_CUDA(cudaDeviceSynchronize()); /* pageable copies vs a non-blocking stream */
        TC_SET_OPTION(ctx, DSA_OPTION_FWD_KERNEL, variant);
        TC_SET_OPTION(ctx, DSA_OPTION_FWD_SM90_HANDOFF, num_ov > 1 ? ov : handoff_default);
        const dsa_status st = dsa_sparse_attn_fwd(ctx, &p, stream);
        TC_SET_OPTION(ctx, DSA_OPTION_FWD_KERNEL, DSA_FWD_KERNEL_AUTO);
        TC_SET_OPTION(ctx, DSA_OPTION_FWD_SM90_HANDOFF, handoff_default);
        if ((variant == DSA_FWD_KERNEL_SM90_SMALL || variant == DSA_FWD_KERNEL_SM90_SPLIT) && st == DSA_ERROR_UNSUPPORTED) { /* 3: H <= 64 only */
          if ((variant == DSA_FWD_KERNEL_SM90_SMALL ? required_small_sm90(c) : required_split_sm90(c)) &&
              getenv("DSA_TEST_REQUIRE_SM90") != NULL)
            cr_assert_fail("%s: variant %d (sm_90a %s) declined H=%lld, D=%lld (it must run it): %s",
                           name, variant, variant == DSA_FWD_KERNEL_SM90_SMALL ? "small-H kernel" : "split", (long long)H,
                           (long long)D, dsa_last_error_message());
          cr_log_info("%s: variant %d (sm_90a %s) declined this configuration: %s", name, variant,
                      variant == DSA_FWD_KERNEL_SM90_SMALL ? "small-H kernel" : "split", dsa_last_error_message());
          declined = 1;
          break;
        }
        if (variant == DSA_FWD_KERNEL_SM90_H64 && st == DSA_ERROR_UNSUPPORTED) {
          if (required_sm90(c) && getenv("DSA_TEST_REQUIRE_SM90") != NULL)
            cr_assert_fail("%s: the sm_90a kernel declined H=%lld, D=576, dense (it must run it): %s",
                           name, (long long)H, dsa_last_error_message());
          else if (required_sm90(c))
            cr_log_warn("%s: the sm_90a kernel declined a configuration it should run (H=%lld, "
                        "D=576, dense): %s", name, (long long)H, dsa_last_error_message());
          else
            cr_log_info("%s: the sm_90a kernel declined this configuration: %s", name,
                        dsa_last_error_message());
          declined = 1;
          break;
        }
        cr_assert(st == DSA_SUCCESS, "%s: variant %s returned %d (%s): %s", name, vn, (int)st,
                  dsa_status_string(st), dsa_last_error_message());
        TC_CUDA(cudaStreamSynchronize(stream));
        TC_CUDA(cudaGetLastError());
        TC_CUDA(cudaMemcpy(out, d_out, nout * 2, cudaMemcpyDeviceToHost));
        TC_CUDA(cudaMemcpy(lse, d_lse, (size_t)(T * H) * 4, cudaMemcpyDeviceToHost));
        TC_CUDA(cudaMemcpy(mx, d_max, (size_t)(T * H) * 4, cudaMemcpyDeviceToHost));

        if (run == 1) { /* bitwise identical to the first run */
          cr_assert(memcmp(out, out_first, nout * 2) == 0, "%s: variant %s: out differs on rerun",
                    name, vn);
          cr_assert(memcmp(lse, lse_first, (size_t)(T * H) * 4) == 0,
                    "%s: variant %s: lse differs on rerun", name, vn);
          if (!c->no_max_logits)
            cr_assert(memcmp(mx, mx_first, (size_t)(T * H) * 4) == 0,
                      "%s: variant %s: max_logits differs on rerun", name, vn);
          continue;
        }
        memcpy(out_first, out, nout * 2);
        memcpy(lse_first, lse, (size_t)(T * H) * 4);
        memcpy(mx_first, mx, (size_t)(T * H) * 4);

        /* every element written (no NaN: the inputs are finite), every gap untouched */
        /* (plain ifs: a passing cr_assert per element would dominate at T = 70000) */
        for (size_t i = 0; i < nout; ++i) {
          if (mask[i] && isnan(dsa_bf16_to_f32(out[i])))
            cr_assert_fail("%s: variant %s: out element %zu not written", name, vn, i);
          if (!mask[i] && out[i] != TC_POISON_BF16)
            cr_assert_fail("%s: variant %s: out gap element %zu overwritten", name, vn, i);
        }
        for (int64_t i = 0; i < T * H; ++i) {
          if (isnan(lse[i]))
            cr_assert_fail("%s: variant %s: lse[%lld] not written", name, vn, (long long)i);
          if (c->no_max_logits && !isnan(mx[i]))
            cr_assert_fail("%s: variant %s: max_logits written although NULL", name, vn);
          if (!c->no_max_logits && isnan(mx[i]))
            cr_assert_fail("%s: variant %s: max_logits[%lld] not written", name, vn,
                           (long long)i);
        }
        /* the sampled rows against the reference */
        double worst = 0;
        for (int64_t s = 0; s < S; ++s) {
          const int64_t t = rows[s];
          for (int64_t h = 0; h < H; ++h) {
            uint16_t got[DSA_VALUE_DIM];
            memcpy(got, out + t * o_st + h * o_sh, sizeof got);
            const double e = tc_rel_err_bf16(got, out_ref + (s * H + h) * V, (size_t)V);
            if (e > worst) worst = e;
            cr_assert(e <= 1e-2, "%s: variant %s: out[t=%lld, h=%lld] relative error %.3g", name,
                      vn, (long long)t, (long long)h, e);
            check_scalar("lse", lse[t * H + h], lse_ref[s * H + h], t, (int)h, vn);
            if (!c->no_max_logits)
              check_scalar("max_logits", mx[t * H + h], max_ref[s * H + h], t, (int)h, vn);
          }
        }
        cr_log_info("%s: variant %s: %lld rows checked, worst out relative error %.3g", name,
                    vn, (long long)S, worst);
        if (num_ov > 1 && ov == 0) {
          memcpy(out_ov0, out, nout * 2);
          memcpy(lse_ov0, lse, (size_t)(T * H) * 4);
          memcpy(mx_ov0, mx, (size_t)(T * H) * 4);
        } else if (num_ov > 1 && !tc_racecheck() && (fwd_only() < 0) &&
                   (memcmp(out, out_ov0, nout * 2) != 0 || memcmp(lse, lse_ov0, (size_t)(T * H) * 4) != 0 ||
                    (!c->no_max_logits && memcmp(mx, mx_ov0, (size_t)(T * H) * 4) != 0))) {
          cr_log_warn("%s: variant %s: results pass but are not bitwise identical to hand-off 0's",
                      name, vn);
        }
      }
    }
  }

  if (c->use_stream) TC_CUDA(cudaStreamDestroy(stream));
  cudaFree(d_q); cudaFree(d_kv); cudaFree(d_idx); cudaFree(d_len); cudaFree(d_sink);
  cudaFree(d_out); cudaFree(d_lse); cudaFree(d_max);
  dsa_context_destroy(ctx);
  free(q); free(kv); free(idx); free(len); free(rows);
  free(q_ref); free(kv_ref); free(idx_ref); free(len_ref); free(out_ref); free(lse_ref); free(max_ref);
  free(mask); free(out); free(poison); free(out_first); free(lse); free(mx); free(lse_first);
  free(mx_first); free(nan_f); free(out_ov0); free(lse_ov0); free(mx_ov0);
}

static attn_case base_case(int64_t T, int H, int K) {
  attn_case c;
  memset(&c, 0, sizeof c);
  if (tc_sanitize()) {
    /* under compute-sanitizer (racecheck instruments every shared-memory access of the wgmma
     * kernels): at most 8 tokens and 1024 slots (16 tiles: every pipeline stage and parity still
     * cycles); T above 65535 stays (many_tokens is about it). Same code paths. */
    if (T > 8 && T <= 65535) T = 8;
    if (K > 1024) K = 1024;
  }
  c.T = T;
  c.H = H;
  c.D = 576;
  c.Tkv = 3001;
  c.K = K;
  c.len = LEN_NULL;
  c.sink = SINK_NULL;
  c.p_dup = 0.1;
  return c;
}

/* ---- every head count x every top-k width, with a rotating mix of the edge cases ---- */
ParameterizedTestParameters(gpu_attn_fwd, heads_by_topk) {
  static int heads[] = {1, 3, 8, 16, 32, 64, 128};
  return cr_make_param_array(int, heads, sizeof heads / sizeof heads[0]);
}
ParameterizedTest(int *heads, gpu_attn_fwd, heads_by_topk) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/heads_by_topk");
  static const int ks[] = {1, 63, 64, 100, 2048};
  static const len_mode lens[] = {LEN_NULL, LEN_RANDOM, LEN_FULL};
  for (int i = 0; i < 5; ++i) {
    attn_case c = base_case(29, *heads, ks[i]);
    c.len = lens[(i + *heads) % 3];
    c.sink = (sink_mode)((i + *heads) % SINK_MODES);
    c.p_invalid = 0.1;
    c.p_empty = 0.1;
    c.scale = i % 2 ? 0.0625f : 0.f;
    char name[64];
    snprintf(name, sizeof name, "H=%d K=%d", *heads, ks[i]);
    run_case(&c, &rng, name);
  }
}

/* ---- K above the selectors' 2048: 2051 (a pooled indexer's width, not a tile multiple) and 4096
 * (DSA_MAX_ATTN_TOPK), every kernel family by head count ---- */
Test(gpu_attn_fwd, topk_above_2048) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/topk_above_2048");
  static const int heads[] = {1, 16, 48, 64, 100, 128};
  static const int ks[] = {2051, 4096};
  for (int hi = 0; hi < 6; ++hi)
    for (int ki = 0; ki < 2; ++ki) {
      attn_case c = base_case(heads[hi] >= 64 ? 3 : 5, heads[hi], ks[ki]);
      c.Tkv = 5003;
      c.len = (hi + ki) % 2 ? LEN_RANDOM : LEN_NULL;
      c.sink = (sink_mode)((hi + ki) % SINK_MODES);
      c.p_invalid = 0.05;
      c.p_empty = 0.1;
      char name[64];
      snprintf(name, sizeof name, "H=%d K=%d", heads[hi], ks[ki]);
      run_case(&c, &rng, name);
    }
}

/* ---- topk_length NULL / 0 / K / random x sink NULL / finite / +inf / -inf / per-head mix ---- */
Test(gpu_attn_fwd, topk_length_and_sink_modes) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/topk_length_and_sink_modes");
  /* 3 and 32: the small-H kernel (its block ring at N = 8 and 32, P in the RoPE block at N = 32);
   * 128: two head blocks of the 64-head kernel */
  static const int heads[] = {3, 32, 64, 128};
  for (int hi = 0; hi < 4; ++hi)
    for (int l = 0; l < LEN_MODES; ++l)
      for (int s = 0; s < SINK_MODES; ++s) {
        attn_case c = base_case(9, heads[hi], 100);
        c.len = (len_mode)l;
        c.sink = (sink_mode)s;
        c.p_invalid = 0.05;
        char name[64];
        snprintf(name, sizeof name, "H=%d len=%s sink=%s", heads[hi], len_name[l], sink_name[s]);
        run_case(&c, &rng, name);
      }
}

/* ---- rows with no valid slot, and rows that are mostly invalid ---- */
Test(gpu_attn_fwd, empty_and_invalid_rows) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/empty_and_invalid_rows");
  attn_case c = base_case(33, 16, 150);
  c.p_empty = 0.5;
  c.p_invalid = 0.3;
  c.sink = SINK_FINITE;
  run_case(&c, &rng, "half empty rows");
  c = base_case(17, 64, 70);
  c.p_invalid = 1.0; /* every slot invalid: -1, INT_MIN, T_kv, beyond, INT_MAX */
  c.len = LEN_FULL;
  run_case(&c, &rng, "all invalid");
  c = base_case(7, 128, 130);
  c.p_invalid = 1.0;
  c.len = LEN_FULL;
  run_case(&c, &rng, "all invalid, H=128");
  c = base_case(7, 32, 130);
  c.p_invalid = 1.0;
  c.len = LEN_FULL;
  run_case(&c, &rng, "all invalid, H=32");
  c = base_case(21, 128, 257);
  c.p_invalid = 0.9;
  c.p_dup = 0.05;
  c.len = LEN_RANDOM;
  c.sink = SINK_MIX;
  run_case(&c, &rng, "mostly invalid");
  /* two head blocks, the second with 28 zero head rows (where the 64-head kernel takes the whole H),
   * rows of 0 .. 3 tiles (odd counts: a last half-pair) */
  c = base_case(21, 100, 150);
  c.p_invalid = 0.2;
  c.p_empty = 0.2;
  c.len = LEN_RANDOM;
  c.sink = SINK_MIX;
  run_case(&c, &rng, "H=100, 0..3 tiles a row");
}

/* ---- many duplicates: each copy is its own softmax term ---- */
Test(gpu_attn_fwd, duplicates) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/duplicates");
  attn_case c = base_case(13, 32, 300);
  c.p_dup = 0.8;
  run_case(&c, &rng, "80% duplicates");
  c = base_case(11, 64, 2048);
  c.Tkv = 7; /* 2048 slots over 7 rows */
  c.p_dup = 0.0;
  run_case(&c, &rng, "T_kv=7 K=2048");
}

/* ---- D = 512 ---- */
Test(gpu_attn_fwd, head_dim_512) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/head_dim_512");
  static const int heads[] = {1, 8, 32, 64, 128};
  static const int ks[] = {64, 200, 130, 33, 2048};
  for (int i = 0; i < 5; ++i) {
    attn_case c = base_case(19, heads[i], ks[i]);
    c.D = 512;
    c.p_invalid = 0.1;
    c.len = i % 2 ? LEN_RANDOM : LEN_NULL;
    c.sink = i % 2 ? SINK_MIX : SINK_NULL;
    char name[64];
    snprintf(name, sizeof name, "D=512 H=%d K=%d", heads[i], ks[i]);
    run_case(&c, &rng, name);
  }
}

/* ---- 32 < H < 128, H not a multiple of 64: the small-H kernel with two consumer WGs (N = 40..64),
 * the split (64-head kernel on heads [0, 64) + small-H kernel on [64, H)) and the automatic choice.
 * Every row compared (sample = T), K not a multiple of 64, invalid slots and empty rows, topk_length,
 * sinks with +-inf, strided q / out / kv / indices, D = 512, one bitwise rerun per H. ---- */
ParameterizedTestParameters(gpu_attn_fwd, heads_33_to_127) {
  static int heads[] = {33, 40, 48, 52, 56, 63, 65, 96, 112, 120, 127};
  return cr_make_param_array(int, heads, sizeof heads / sizeof heads[0]);
}
ParameterizedTest(int *heads, gpu_attn_fwd, heads_33_to_127) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/heads_33_to_127");
  const int H = *heads;
  /* DSA_TEST_FWD_HEADS=h runs this test for H = h alone (a sanitizer run per head count) */
  const char *only = getenv("DSA_TEST_FWD_HEADS");
  if (only && atoi(only) != H) cr_skip_test("H=%d: DSA_TEST_FWD_HEADS=%s", H, only);
  char name[96];
  /* a: random topk_length, per-head sink mix (+inf, -inf, finite), token-padded q, head-major out */
  attn_case c = base_case(37, H, 100);
  c.len = LEN_RANDOM;
  c.sink = SINK_MIX;
  c.p_invalid = 0.1;
  c.p_empty = 0.1;
  c.q_layout = LAYOUT_TOKEN_PAD;
  c.out_layout = LAYOUT_HEAD_MAJOR;
  c.sample = (int)c.T;
  c.rerun = 1;
  snprintf(name, sizeof name, "H=%d K=100 strided q/out, sink mix, rerun", H);
  run_case(&c, &rng, name);
  /* b: 5 KV tiles (both stages reused), head-major q, kv stride 640, padded index rows, sink +inf or
   * -inf for every head, D = 512 for odd H */
  c = base_case(45, H, 257);
  c.D = H % 2 ? 512 : 576;
  c.len = LEN_FULL;
  c.sink = H % 3 ? SINK_NEG_INF : SINK_POS_INF;
  c.p_invalid = 0.2;
  c.q_layout = LAYOUT_HEAD_MAJOR;
  c.out_layout = LAYOUT_TOKEN_PAD;
  c.kv_stride = 640;
  c.idx_pad = 3;
  c.sample = (int)c.T;
  snprintf(name, sizeof name, "H=%d D=%d K=257 kv stride 640, sink %s", H, c.D, sink_name[c.sink]);
  run_case(&c, &rng, name);
  /* c: no topk_length, finite sinks, dense layouts, no max_logits, many duplicates, 11 KV tiles */
  c = base_case(37, H, 700);
  c.sink = SINK_FINITE;
  c.p_invalid = 0.05;
  c.p_dup = 0.3;
  c.no_max_logits = 1;
  c.sample = (int)c.T;
  snprintf(name, sizeof name, "H=%d K=700 dense, max_logits NULL", H);
  run_case(&c, &rng, name);
}

/* ---- DSA_OPTION_FWD_SMALL_AUTO_MAX moves the automatic choice between the small-H kernel and the
 * 64-head kernel's zero rows: H = 56 and 120 with 48 (the 64-head kernel on the whole H), H = 40 with
 * 0 (no remainder goes to the small-H kernel), H = 60 with 63 (every remainder does) ---- */
Test(gpu_attn_fwd, small_auto_max_option) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/small_auto_max_option");
  const int cases[][2] = {{56, 48}, {120, 48}, {40, 0}, {60, 63}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    char name[64];
    attn_case c = base_case(19, cases[i][0], 300);
    c.len = LEN_RANDOM;
    c.sink = SINK_FINITE;
    c.p_invalid = 0.1;
    c.sample = (int)c.T;
    c.small_max = cases[i][1] + 1;
    snprintf(name, sizeof name, "H=%d small_auto_max=%d", cases[i][0], cases[i][1]);
    run_case(&c, &rng, name);
  }
}

/* ---- strided q (token stride > H*D, head-major), kv row stride 640, strided out ---- */
Test(gpu_attn_fwd, strides) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/strides");
  static const int heads[] = {16, 64, 128, 5};
  for (int i = 0; i < 4; ++i) {
    attn_case c = base_case(23, heads[i], 130);
    c.D = i == 3 ? 512 : 576;
    c.q_layout = i % 2 ? LAYOUT_HEAD_MAJOR : LAYOUT_TOKEN_PAD;
    c.out_layout = i % 2 ? LAYOUT_TOKEN_PAD : LAYOUT_HEAD_MAJOR;
    c.kv_stride = 640;
    c.idx_pad = 5;
    c.p_invalid = 0.1;
    c.len = LEN_RANDOM;
    c.sink = SINK_FINITE;
    char name[64];
    snprintf(name, sizeof name, "strided H=%d D=%d", heads[i], c.D);
    run_case(&c, &rng, name);
  }
  attn_case c = base_case(23, 64, 130); /* only kv strided */
  c.kv_stride = 640;
  run_case(&c, &rng, "kv stride 640 only");
}

/* ---- T above 65535: never in gridDim.y/z, 64-bit offsets ---- */
Test(gpu_attn_fwd, many_tokens) {
  TC_REQUIRE_GPU();
  if (tc_racecheck()) cr_skip_test("T > 65535 is skipped under racecheck (grid and 64-bit offsets, no shared-memory question; memcheck runs it)");
  tc_rng rng = tc_seed("gpu_attn_fwd/many_tokens");
  attn_case c = base_case(70000, 1, 5);
  c.Tkv = 70000;
  c.sample = 64;
  c.len = LEN_RANDOM;
  c.p_invalid = 0.1;
  run_case(&c, &rng, "T=70000 H=1");
  c = base_case(70001, 2, 3);
  c.D = 512;
  c.sample = 64;
  c.sink = SINK_FINITE;
  run_case(&c, &rng, "T=70001 H=2 D=512");
}

/* ---- determinism, optional max_logits, non-default stream ---- */
Test(gpu_attn_fwd, rerun_is_bitwise_identical) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/rerun_is_bitwise_identical");
  attn_case c = base_case(16, 128, 2048);
  c.rerun = 1;
  c.len = LEN_RANDOM;
  c.sink = SINK_MIX;
  c.p_invalid = 0.05;
  run_case(&c, &rng, "rerun H=128 K=2048");
  c = base_case(40, 24, 500);
  c.rerun = 1;
  run_case(&c, &rng, "rerun H=24 K=500");
}

Test(gpu_attn_fwd, max_logits_optional) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/max_logits_optional");
  attn_case c = base_case(10, 64, 96);
  c.no_max_logits = 1;
  c.sink = SINK_FINITE;
  run_case(&c, &rng, "max_logits NULL H=64");
  c = base_case(10, 7, 96);
  c.no_max_logits = 1;
  run_case(&c, &rng, "max_logits NULL H=7");
}

Test(gpu_attn_fwd, non_default_stream) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/non_default_stream");
  attn_case c = base_case(20, 64, 300);
  c.use_stream = 1;
  c.len = LEN_RANDOM;
  c.sink = SINK_FINITE;
  run_case(&c, &rng, "stream H=64");
  c = base_case(20, 128, 64);
  c.use_stream = 1;
  run_case(&c, &rng, "stream H=128");
}

/* ---- bad inputs through the GPU op: a status, a message, nothing written ---- */
Test(gpu_attn_fwd, bad_inputs_write_nothing) {
  TC_REQUIRE_GPU();
  enum { T = 4, H = 8, K = 16, TKV = 32 };
  dsa_context *ctx = NULL;
  TC_OK(tc_context_create(&ctx));
  uint16_t *d_q, *d_kv, *d_out;
  int32_t *d_idx;
  float *d_lse;
  TC_CUDA(cudaMalloc((void **)&d_q, T * H * 576 * 2));
  TC_CUDA(cudaMalloc((void **)&d_kv, TKV * 576 * 2));
  TC_CUDA(cudaMalloc((void **)&d_idx, T * K * 4));
  TC_CUDA(cudaMalloc((void **)&d_out, T * H * 512 * 2));
  TC_CUDA(cudaMalloc((void **)&d_lse, T * H * 4));
  TC_CUDA(cudaMemset(d_q, 0, T * H * 576 * 2));
  TC_CUDA(cudaMemset(d_kv, 0, TKV * 576 * 2));
  TC_CUDA(cudaMemset(d_idx, 0, T * K * 4));
  TC_CUDA(cudaMemset(d_out, 0x7F, T * H * 512 * 2));
  TC_CUDA(cudaMemset(d_lse, 0x7F, T * H * 4));
  const dsa_attn_fwd_params good = {
      .num_tokens = T, .num_heads = H, .head_dim = 576, .num_kv = TKV, .topk = K,
      .softmax_scale = 0.0625f, .q = d_q, .kv = d_kv, .indices = d_idx, .out = d_out,
      .lse = d_lse};
  dsa_attn_fwd_params p = good;
  p.topk = 0;
  TC_FAILS(dsa_sparse_attn_fwd(ctx, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "topk");
  p = good;
  p.head_dim = 128;
  TC_FAILS(dsa_sparse_attn_fwd(ctx, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "head_dim");
  p = good;
  p.softmax_scale = nanf("");
  TC_FAILS(dsa_sparse_attn_fwd(ctx, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "softmax_scale");
  p = good;
  p.num_heads = 129;
  TC_FAILS(dsa_sparse_attn_fwd(ctx, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "num_heads");
  p = good;
  p.lse = NULL;
  TC_FAILS(dsa_sparse_attn_fwd(ctx, &p, 0), DSA_ERROR_INVALID_ARGUMENT, "lse");
  TC_FAILS(dsa_sparse_attn_fwd(ctx, NULL, 0), DSA_ERROR_INVALID_ARGUMENT, "p");
  TC_FAILS(dsa_sparse_attn_fwd(NULL, &good, 0), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  TC_CUDA(cudaDeviceSynchronize());
  uint16_t out[T * H * 512];
  float lse[T * H];
  TC_CUDA(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(lse, d_lse, sizeof lse, cudaMemcpyDeviceToHost));
  for (int i = 0; i < T * H * 512; ++i) cr_assert_eq(out[i], 0x7F7F, "out[%d] was written", i);
  for (int i = 0; i < T * H; ++i) {
    uint32_t u;
    memcpy(&u, &lse[i], 4);
    cr_assert_eq(u, 0x7F7F7F7Fu, "lse[%d] was written", i);
  }
  /* zero tokens: success, no launch, any pointer may be NULL */
  dsa_attn_fwd_params z = {.num_tokens = 0, .num_heads = H, .head_dim = 576, .num_kv = 0,
                           .topk = K, .softmax_scale = 1.0f};
  for (int v = DSA_FWD_KERNEL_AUTO; v <= DSA_FWD_KERNEL_SM90_SPLIT; ++v) {
    TC_SET_OPTION(ctx, DSA_OPTION_FWD_KERNEL, v);
    TC_OK(dsa_sparse_attn_fwd(ctx, &z, 0));
  }
  TC_SET_OPTION(ctx, DSA_OPTION_FWD_KERNEL, DSA_FWD_KERNEL_AUTO);
  cudaFree(d_q); cudaFree(d_kv); cudaFree(d_idx); cudaFree(d_out); cudaFree(d_lse);
  dsa_context_destroy(ctx);
}

/* ---- the automatic choice runs and leaves no message behind on success ---- */
Test(gpu_attn_fwd, automatic_dispatch) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_attn_fwd/automatic_dispatch");
  /* run_case forces the kernels; here the automatic choice must give reference results too */
  enum { T = 5, H = 12, K = 77, TKV = 500 };
  uint16_t *q = malloc(T * H * 576 * 2), *kv = malloc(TKV * 576 * 2);
  int32_t idx[T * K];
  uint16_t *out = malloc(T * H * 512 * 2), *out_ref = malloc(T * H * 512 * 2);
  float lse[T * H], lse_ref[T * H];
  cr_assert(q && kv && out && out_ref);
  tc_fill_bf16(&rng, q, T * H * 576, -1, 1);
  tc_fill_bf16(&rng, kv, TKV * 576, -1, 1);
  for (int i = 0; i < T * K; ++i) idx[i] = (int32_t)tc_below(&rng, TKV + 20) - 10;
  dsa_attn_fwd_params p = {.num_tokens = T, .num_heads = H, .head_dim = 576, .num_kv = TKV,
                           .topk = K, .softmax_scale = 0.0625f, .q = q, .kv = kv, .indices = idx,
                           .out = out_ref, .lse = lse_ref};
  TC_OK(dsa_ref_sparse_attn_fwd(&p));
  dsa_context *ctx = NULL;
  TC_OK(tc_context_create(&ctx));
  uint16_t *d_q, *d_kv, *d_out;
  int32_t *d_idx;
  float *d_lse;
  TC_CUDA(cudaMalloc((void **)&d_q, T * H * 576 * 2));
  TC_CUDA(cudaMalloc((void **)&d_kv, TKV * 576 * 2));
  TC_CUDA(cudaMalloc((void **)&d_idx, sizeof idx));
  TC_CUDA(cudaMalloc((void **)&d_out, T * H * 512 * 2));
  TC_CUDA(cudaMalloc((void **)&d_lse, sizeof lse));
  TC_CUDA(cudaMemcpy(d_q, q, T * H * 576 * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_kv, kv, TKV * 576 * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_idx, idx, sizeof idx, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemset(d_out, 0xFF, T * H * 512 * 2));
  TC_CUDA(cudaMemset(d_lse, 0xFF, sizeof lse));
  p.q = d_q;
  p.kv = d_kv;
  p.indices = d_idx;
  p.out = d_out;
  p.lse = d_lse;
  /* an earlier failure's message (a public call that fails before any device work) */
  cr_assert_eq(dsa_context_set_option(NULL, DSA_OPTION_FWD_KERNEL, DSA_FWD_KERNEL_AUTO), DSA_ERROR_INVALID_ARGUMENT);
  char earlier[512];
  snprintf(earlier, sizeof earlier, "%s", dsa_last_error_message());
  cr_assert(earlier[0] != '\0', "the failing call left no message");
  TC_OK(dsa_sparse_attn_fwd(ctx, &p, 0));
  cr_assert_str_eq(dsa_last_error_message(), earlier,
                   "a successful call changed the last message to \"%s\"", dsa_last_error_message());
  TC_CUDA(cudaDeviceSynchronize());
  TC_CUDA(cudaMemcpy(out, d_out, T * H * 512 * 2, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(lse, d_lse, sizeof lse, cudaMemcpyDeviceToHost));
  for (int i = 0; i < T * H; ++i) {
    const double e = tc_rel_err_bf16(out + i * 512, out_ref + i * 512, 512);
    cr_assert(e <= 1e-2, "out row %d relative error %.3g", i, e);
    check_scalar("lse", lse[i], lse_ref[i], i / H, i % H, "0");
  }
  cudaFree(d_q); cudaFree(d_kv); cudaFree(d_idx); cudaFree(d_out); cudaFree(d_lse);
  dsa_context_destroy(ctx);
  free(q); free(kv); free(out); free(out_ref);
}
