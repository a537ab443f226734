/* test_gpu_compact.c - GPU suite for dsa_compact_indices and dsa_pad_heads against the CPU
 * references on fresh random inputs (seed printed): every K tier and its edges, rows that are not
 * tile multiples and rows > 65535, every kind of invalid entry, strided and in-place operands,
 * poisoned outputs with every element checked (strided padding included), bitwise-identical
 * reruns, zero-size work, all on a non-default stream. */
#include "test_common.h"

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  TC_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

/* ---- compaction ---- */

typedef struct {
  int64_t rows;
  int32_t k;
  int64_t key_count;
  int64_t in_pad, out_pad; /* extra columns per row (0: contiguous default, stride passed as 0) */
  int in_place;
  int with_lengths;
} compact_case;

#define PAD_MARK ((int32_t)0x13572468)

/* Entries drawn from: -1, INT32_MIN, other negatives, out of range (>= key_count, up to INT32_MAX),
 * duplicates of an earlier entry in the row, and valid keys. */
static void fill_row(tc_rng *r, int32_t *row, int k, int64_t key_count) {
  for (int j = 0; j < k; ++j) {
    int64_t c = tc_below(r, 10);
    int32_t v;
    if (c == 0) v = -1;
    else if (c == 1) v = INT32_MIN;
    else if (c == 2) v = -(int32_t)tc_below(r, 1000) - 2;
    else if (c == 3) v = (int32_t)(key_count + tc_below(r, (int64_t)INT32_MAX - key_count + 1));
    else if (c == 4 && j > 0) v = row[tc_below(r, j)];
    else v = key_count > 0 ? (int32_t)tc_below(r, key_count) : -1;
    row[j] = v;
  }
}

static void run_compact_case(dsa_context *ctx, cudaStream_t stream, tc_rng *rng, compact_case c) {
  int64_t is = c.k + c.in_pad, os = c.in_place ? is : c.k + c.out_pad;
  size_t in_n = (size_t)(c.rows * is), out_n = (size_t)(c.rows * os);
  int32_t *h_in = malloc(in_n * 4), *h_ref = malloc(out_n * 4), *h_got = malloc(out_n * 4);
  int32_t *h_rerun = malloc(out_n * 4), *h_len_ref = malloc((size_t)c.rows * 4 + 4);
  int32_t *h_len = malloc((size_t)c.rows * 4 + 4), *h_len2 = malloc((size_t)c.rows * 4 + 4);
  cr_assert(h_in && h_ref && h_got && h_rerun && h_len_ref && h_len && h_len2);
  for (int64_t t = 0; t < c.rows; ++t) {
    fill_row(rng, h_in + t * is, c.k, c.key_count);
    for (int64_t j = c.k; j < is; ++j) h_in[t * is + j] = PAD_MARK;
  }
  /* reference: in place on a copy of the input, else into a poisoned buffer */
  if (c.in_place) memcpy(h_ref, h_in, in_n * 4);
  else
    for (size_t i = 0; i < out_n; ++i) h_ref[i] = TC_POISON_I32;
  dsa_compact_params rp = {.rows = c.rows, .k = c.k, .key_count = c.key_count,
                           .indices = c.in_place ? h_ref : h_in, .indices_stride = c.in_pad ? is : 0,
                           .out = h_ref, .out_stride = c.in_place ? (c.in_pad ? is : 0) : (c.out_pad ? os : 0),
                           .lengths = c.with_lengths ? h_len_ref : NULL};
  TC_OK(dsa_ref_compact_indices(&rp));

  int32_t *d_in = dev_alloc(in_n * 4);
  int32_t *d_out = c.in_place ? d_in : dev_alloc(out_n * 4);
  int32_t *d_len = c.with_lengths ? dev_alloc((size_t)c.rows * 4) : NULL;
  for (int pass = 0; pass < 2; ++pass) {
    int32_t *dst = pass == 0 ? h_got : h_rerun, *ldst = pass == 0 ? h_len : h_len2;
    /* fresh input and poisoned outputs for each pass */
    TC_CUDA(cudaMemcpy(d_in, h_in, in_n * 4, cudaMemcpyHostToDevice));
    if (!c.in_place) {
      for (size_t i = 0; i < out_n; ++i) dst[i] = TC_POISON_I32;
      TC_CUDA(cudaMemcpy(d_out, dst, out_n * 4, cudaMemcpyHostToDevice));
    }
    if (d_len) {
      for (int64_t t = 0; t < c.rows; ++t) ldst[t] = TC_POISON_I32;
      TC_CUDA(cudaMemcpy(d_len, ldst, (size_t)c.rows * 4, cudaMemcpyHostToDevice));
    }
    dsa_compact_params gp = rp;
    gp.indices = d_in;
    gp.out = d_out;
    gp.lengths = d_len;
    TC_OK(dsa_compact_indices(ctx, &gp, stream));
    TC_CUDA(cudaStreamSynchronize(stream));
    TC_CUDA(cudaMemcpy(dst, d_out, out_n * 4, cudaMemcpyDeviceToHost));
    if (d_len) TC_CUDA(cudaMemcpy(ldst, d_len, (size_t)c.rows * 4, cudaMemcpyDeviceToHost));
  }
  for (int64_t t = 0; t < c.rows; ++t) {
    for (int64_t j = 0; j < os; ++j) {
      size_t i = (size_t)(t * os + j);
      cr_assert_eq(h_got[i], h_ref[i],
                   "rows %lld k %d key_count %lld in_place %d: row %lld slot %lld got %d want %d",
                   (long long)c.rows, c.k, (long long)c.key_count, c.in_place, (long long)t,
                   (long long)j, h_got[i], h_ref[i]);
      cr_assert_eq(h_rerun[i], h_got[i], "rerun differs at row %lld slot %lld", (long long)t,
                   (long long)j);
    }
    if (c.with_lengths) {
      cr_assert_eq(h_len[t], h_len_ref[t], "k %d: lengths[%lld] got %d want %d", c.k, (long long)t,
                   h_len[t], h_len_ref[t]);
      cr_assert_eq(h_len2[t], h_len[t]);
    }
  }
  cudaFree(d_in);
  if (!c.in_place) cudaFree(d_out);
  if (d_len) cudaFree(d_len);
  free(h_in), free(h_ref), free(h_got), free(h_rerun), free(h_len_ref), free(h_len), free(h_len2);
}

Test(gpu_compact, compact_random_vs_reference) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_compact/compact_random_vs_reference");
  dsa_context *ctx = NULL;
  cudaStream_t stream;
  TC_OK(dsa_context_create(&ctx, 0));
  TC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const int ks[] = {1, 7, 63, 64, 100, 128, 129, 512, 513, 1024, 1025, 2047, 2048};
  const int64_t key_counts[] = {1, 50, 4096, 100003, (int64_t)INT32_MAX - 1};
  for (size_t a = 0; a < sizeof ks / sizeof ks[0]; ++a) {
    int k = ks[a];
    /* under compute-sanitizer (DSA_TEST_SANITIZE) fewer rows: racecheck instruments every shared
     * access of the block radix sort; the 70000-row cases below keep the large-grid path */
    int64_t rows = tc_sanitize() ? (k >= 1024 ? 23 : 61) : k >= 1024 ? 301 : 1237;
    for (int variant = 0; variant < 4; ++variant) {
      compact_case c = {.rows = rows, .k = k,
                        .key_count = key_counts[tc_below(&rng, 5)],
                        .in_pad = variant & 1 ? 1 + tc_below(&rng, 9) : 0,
                        .out_pad = variant & 2 ? 1 + tc_below(&rng, 9) : 0,
                        .in_place = variant == 3,
                        .with_lengths = variant != 1};
      /* small key ranges give many duplicates: make sure one per K uses key_count 50 */
      if (variant == 0) c.key_count = 50;
      run_compact_case(ctx, stream, &rng, c);
    }
  }
  /* key_count 0 (all invalid), a single row, and more than 65535 rows */
  run_compact_case(ctx, stream, &rng, (compact_case){.rows = 17, .k = 100, .key_count = 0, .with_lengths = 1});
  run_compact_case(ctx, stream, &rng, (compact_case){.rows = 1, .k = 2048, .key_count = 3000, .with_lengths = 1});
  run_compact_case(ctx, stream, &rng, (compact_case){.rows = 70000, .k = 7, .key_count = 12345, .with_lengths = 1});
  run_compact_case(ctx, stream, &rng, (compact_case){.rows = 70001, .k = 7, .key_count = 12345,
                                                     .in_pad = 3, .in_place = 1, .with_lengths = 1});
  TC_CUDA(cudaStreamDestroy(stream));
  dsa_context_destroy(ctx);
}

Test(gpu_compact, zero_size_and_errors) {
  TC_REQUIRE_GPU();
  dsa_context *ctx = NULL;
  TC_OK(dsa_context_create(&ctx, 0));
  dsa_compact_params z = {.rows = 0, .k = 5, .key_count = 10};
  TC_OK(dsa_compact_indices(ctx, &z, 0));
  dsa_pad_heads_params pz = {.num_tokens = 0, .num_heads = 3, .padded_heads = 64, .head_dim = 576};
  TC_OK(dsa_pad_heads(ctx, &pz, 0));
  /* params are checked before anything runs */
  dsa_compact_params bad = {.rows = 3, .k = 0, .key_count = 10};
  TC_FAILS(dsa_compact_indices(ctx, &bad, 0), DSA_ERROR_INVALID_ARGUMENT, "k = 0");
  /* T == 0 with a sink_out still writes the sink */
  float h_sink[3] = {1.0f, -1.0f, 2.5f}, h_out[8];
  float *d_sink = dev_alloc(sizeof h_sink), *d_sink_out = dev_alloc(sizeof h_out);
  tc_poison_f32(h_out, 8);
  TC_CUDA(cudaMemcpy(d_sink, h_sink, sizeof h_sink, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_sink_out, h_out, sizeof h_out, cudaMemcpyHostToDevice));
  dsa_pad_heads_params ps = {.num_tokens = 0, .num_heads = 3, .padded_heads = 6, .head_dim = 8,
                             .sink = d_sink, .sink_out = d_sink_out};
  TC_OK(dsa_pad_heads(ctx, &ps, 0));
  TC_CUDA(cudaMemcpy(h_out, d_sink_out, sizeof h_out, cudaMemcpyDeviceToHost));
  cr_assert_eq(h_out[0], 1.0f);
  cr_assert_eq(h_out[1], -1.0f);
  cr_assert_eq(h_out[2], 2.5f);
  for (int h = 3; h < 6; ++h) cr_assert(isinf(h_out[h]) && h_out[h] < 0);
  cr_assert(isnan(h_out[6]) && isnan(h_out[7]), "beyond Hp untouched");
  cudaFree(d_sink), cudaFree(d_sink_out);
  dsa_context_destroy(ctx);
}

/* ---- head padding ---- */

static void run_pad_case(dsa_context *ctx, cudaStream_t stream, tc_rng *rng, int64_t T, int H,
                         int Hp, int D, int64_t st, int64_t sh, int sink_mode) {
  /* st / sh: 0 = contiguous default; else explicit strides (validated to be legal by the caller) */
  int64_t rs = st ? st : (int64_t)H * D, rh = sh ? sh : D;
  size_t q_n = (size_t)((T - 1) * rs + (H - 1) * rh + D), o_n = (size_t)(T * Hp * D);
  uint16_t *h_q = malloc(q_n * 2), *h_ref = malloc(o_n * 2), *h_got = malloc(o_n * 2);
  uint16_t *h_got2 = malloc(o_n * 2);
  float h_sink[DSA_MAX_HEADS], h_sref[1024], h_sgot[1024], h_sgot2[1024];
  cr_assert(h_q && h_ref && h_got && h_got2);
  tc_fill_bf16(rng, h_q, q_n, -4.0, 4.0);
  tc_fill_f32(rng, h_sink, DSA_MAX_HEADS, -3.0, 3.0);
  const float *sink_h = sink_mode == 1 ? NULL : h_sink; /* 0: given, 1: NULL, 2: sink_out NULL */
  for (size_t i = 0; i < o_n; ++i) h_ref[i] = TC_POISON_BF16;
  tc_poison_f32(h_sref, 1024);
  dsa_pad_heads_params rp = {.num_tokens = T, .num_heads = H, .padded_heads = Hp, .head_dim = D,
                             .q = h_q, .q_stride_token = st, .q_stride_head = sh, .q_out = h_ref,
                             .sink = sink_h, .sink_out = sink_mode == 2 ? NULL : h_sref};
  TC_OK(dsa_ref_pad_heads(&rp));

  uint16_t *d_q = dev_alloc(q_n * 2), *d_o = dev_alloc(o_n * 2);
  float *d_sink = dev_alloc(sizeof h_sink), *d_so = dev_alloc(sizeof h_sgot);
  TC_CUDA(cudaMemcpy(d_q, h_q, q_n * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_sink, h_sink, sizeof h_sink, cudaMemcpyHostToDevice));
  for (int pass = 0; pass < 2; ++pass) {
    uint16_t *dst = pass ? h_got2 : h_got;
    float *sdst = pass ? h_sgot2 : h_sgot;
    for (size_t i = 0; i < o_n; ++i) dst[i] = TC_POISON_BF16;
    tc_poison_f32(sdst, 1024);
    TC_CUDA(cudaMemcpy(d_o, dst, o_n * 2, cudaMemcpyHostToDevice));
    TC_CUDA(cudaMemcpy(d_so, sdst, sizeof h_sgot, cudaMemcpyHostToDevice));
    dsa_pad_heads_params gp = rp;
    gp.q = d_q;
    gp.q_out = d_o;
    gp.sink = sink_mode == 1 ? NULL : d_sink;
    gp.sink_out = sink_mode == 2 ? NULL : d_so;
    TC_OK(dsa_pad_heads(ctx, &gp, stream));
    TC_CUDA(cudaStreamSynchronize(stream));
    TC_CUDA(cudaMemcpy(dst, d_o, o_n * 2, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemcpy(sdst, d_so, sizeof h_sgot, cudaMemcpyDeviceToHost));
  }
  for (size_t i = 0; i < o_n; ++i) {
    cr_assert_eq(h_got[i], h_ref[i], "T %lld H %d Hp %d D %d: element %zu (t %lld h %lld d %lld) got 0x%04x want 0x%04x",
                 (long long)T, H, Hp, D, i, (long long)(i / ((size_t)Hp * D)),
                 (long long)(i / D % Hp), (long long)(i % D), h_got[i], h_ref[i]);
    cr_assert_eq(h_got2[i], h_got[i], "rerun differs at %zu", i);
  }
  /* sink_out compared bitwise (NaN poison where nothing is written, -inf for padded heads) */
  cr_assert(memcmp(h_sgot, h_sref, sizeof h_sref) == 0, "sink_out differs (H %d Hp %d mode %d)", H,
            Hp, sink_mode);
  cr_assert(memcmp(h_sgot2, h_sgot, sizeof h_sgot) == 0);
  cudaFree(d_q), cudaFree(d_o), cudaFree(d_sink), cudaFree(d_so);
  free(h_q), free(h_ref), free(h_got), free(h_got2);
}

Test(gpu_compact, pad_heads_random_vs_reference) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_compact/pad_heads_random_vs_reference");
  dsa_context *ctx = NULL;
  cudaStream_t stream;
  TC_OK(dsa_context_create(&ctx, 0));
  TC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const int hs[] = {1, 3, 8, 16, 32, 64, 128};
  for (size_t a = 0; a < sizeof hs / sizeof hs[0]; ++a) {
    int H = hs[a];
    int Hp = dsa_padded_head_count(H) > H ? dsa_padded_head_count(H) : H + 1 + (int)tc_below(&rng, 70);
    for (int variant = 0; variant < 3; ++variant) {
      int D = variant == 0 ? 576 : (variant == 1 ? 512 : 8 * (1 + (int)tc_below(&rng, 40)));
      int64_t T = 1 + tc_below(&rng, 77);
      int64_t st = 0, sh = 0;
      if (variant == 1) { /* padded head and token strides */
        sh = D + 8 * (1 + tc_below(&rng, 4));
        st = sh * H + 8 * tc_below(&rng, 5);
      } else if (variant == 2) { /* token-minor layout: q stored [H, T, D] */
        st = D;
        sh = (int64_t)D * T + 8 * (1 + tc_below(&rng, 3));
      }
      run_pad_case(ctx, stream, &rng, T, H, Hp, D, st, sh, variant);
    }
  }
  /* Hp == H (a plain copy), and a larger T */
  run_pad_case(ctx, stream, &rng, 33, 64, 64, 576, 0, 0, 0);
  run_pad_case(ctx, stream, &rng, 601, 16, 64, 512, 0, 0, 1);
  TC_CUDA(cudaStreamDestroy(stream));
  dsa_context_destroy(ctx);
}

/* Both ops enqueue only kernels (no sync, no allocation), so they can be captured into a graph. */
Test(gpu_compact, graph_capture) {
  TC_REQUIRE_GPU();
  tc_rng rng = tc_seed("gpu_compact/graph_capture");
  enum { R = 97, K = 300, T = 13, H = 8, HP = 64, D = 576 };
  dsa_context *ctx = NULL;
  cudaStream_t stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TC_OK(dsa_context_create(&ctx, 0));
  TC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  int32_t *h_in = malloc(R * K * 4), *h_ref = malloc(R * K * 4), *h_got = malloc(R * K * 4);
  int32_t h_len_ref[R], h_len[R];
  uint16_t *h_q = malloc((size_t)T * H * D * 2), *h_qref = malloc((size_t)T * HP * D * 2);
  uint16_t *h_qgot = malloc((size_t)T * HP * D * 2);
  cr_assert(h_in && h_ref && h_got && h_q && h_qref && h_qgot);
  for (int r = 0; r < R; ++r) fill_row(&rng, h_in + r * K, K, 777);
  tc_fill_bf16(&rng, h_q, (size_t)T * H * D, -2.0, 2.0);
  dsa_compact_params cp = {.rows = R, .k = K, .key_count = 777, .indices = h_in, .out = h_ref,
                           .lengths = h_len_ref};
  TC_OK(dsa_ref_compact_indices(&cp));
  dsa_pad_heads_params pp = {.num_tokens = T, .num_heads = H, .padded_heads = HP, .head_dim = D,
                             .q = h_q, .q_out = h_qref};
  TC_OK(dsa_ref_pad_heads(&pp));

  int32_t *d_in = dev_alloc(R * K * 4), *d_out = dev_alloc(R * K * 4), *d_len = dev_alloc(R * 4);
  uint16_t *d_q = dev_alloc((size_t)T * H * D * 2), *d_qo = dev_alloc((size_t)T * HP * D * 2);
  TC_CUDA(cudaMemcpy(d_in, h_in, R * K * 4, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d_q, h_q, (size_t)T * H * D * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemset(d_out, 0x5A, R * K * 4));
  TC_CUDA(cudaMemset(d_len, 0x5A, R * 4));
  TC_CUDA(cudaMemset(d_qo, 0x7F, (size_t)T * HP * D * 2));
  cp.indices = d_in, cp.out = d_out, cp.lengths = d_len;
  pp.q = d_q, pp.q_out = d_qo;
  TC_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  dsa_status s1 = dsa_compact_indices(ctx, &cp, stream);
  dsa_status s2 = dsa_pad_heads(ctx, &pp, stream);
  TC_CUDA(cudaStreamEndCapture(stream, &graph));
  TC_OK(s1);
  TC_OK(s2);
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  TC_CUDA(cudaGraphLaunch(exec, stream));
  TC_CUDA(cudaStreamSynchronize(stream));
  TC_CUDA(cudaMemcpy(h_got, d_out, R * K * 4, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(h_len, d_len, R * 4, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(h_qgot, d_qo, (size_t)T * HP * D * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < R * K; ++i) cr_assert_eq(h_got[i], h_ref[i], "compact element %d", i);
  for (int r = 0; r < R; ++r) cr_assert_eq(h_len[r], h_len_ref[r], "lengths[%d]", r);
  cr_assert(memcmp(h_qgot, h_qref, (size_t)T * HP * D * 2) == 0, "q_out differs");
  TC_CUDA(cudaGraphExecDestroy(exec));
  TC_CUDA(cudaGraphDestroy(graph));
  cudaFree(d_in), cudaFree(d_out), cudaFree(d_len), cudaFree(d_q), cudaFree(d_qo);
  free(h_in), free(h_ref), free(h_got), free(h_q), free(h_qref), free(h_qgot);
  TC_CUDA(cudaStreamDestroy(stream));
  dsa_context_destroy(ctx);
}
