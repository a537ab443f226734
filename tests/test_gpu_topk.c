/* test_gpu_topk.c - dsa_topk on the device against dsa_ref_topk, exact equality of every index:
 * random, heavily tied (small value sets with NaN, +-inf, +-0) and constant rows; K in
 * {1, 7, 64, 100, 2048}; rows shorter and longer than K (lengths clamped from outside [0, columns]);
 * lengths NULL; one row of 2^20 columns (the uncached global-memory path); rows above the cached
 * limit; more than 65535 rows; strided scores and indices (gaps stay untouched); bitwise reruns;
 * a row alone equals the same row inside a batch; the workspace contract; bad arguments; CUDA graph
 * capture; the indexer's launch interface (per-row column offsets, out_lengths). Every comparison
 * runs each kernel (DSA_OPTION_TOPK_KERNEL, include/dsa_tune.h: 1 = the radix kernel, 2 = the
 * sampled-threshold filter, which takes any row and has its own exact fallback, whose paths
 * sampled_filter_paths drives, and runs launches of rows of at most 4096 columns on its bisection
 * kernel); messages name the kernel by that value. */
#include "test_common.h"
#include "dsa_testing.h" /* dsa_launch_topk: the indexer's launch interface */

static const int tk_variants[] = {DSA_TOPK_KERNEL_RADIX, DSA_TOPK_KERNEL_FILTER};
#define TK_NVARIANTS 2

typedef struct {
  dsa_context *ctx;
  cudaStream_t stream;
} tk_env;

static tk_env tk_open(void) {
  tk_env e;
  TC_OK(tc_context_create(&e.ctx));
  TC_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
  return e;
}

static void tk_close(tk_env *e) {
  TC_CUDA(cudaStreamDestroy(e->stream));
  dsa_context_destroy(e->ctx);
}

enum { FILL_RANDOM = 0, FILL_TIES = 1, FILL_CONST = 2, FILL_MIXED = 3 };

static float tied_value(tc_rng *r) {
  static const float set[] = {-2.0f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 3.0f};
  int64_t u = tc_below(r, 100);
  if (u < 4) return nanf("");
  if (u < 7) return INFINITY;
  if (u < 10) return -INFINITY;
  return set[tc_below(r, 7)];
}

/* Fills row r of scores per mode (FILL_MIXED picks a mode per row). */
static void fill_rows(tc_rng *r, float *s, int64_t rows, int64_t cols, int64_t stride, int mode) {
  for (int64_t i = 0; i < rows; ++i) {
    int m = mode == FILL_MIXED ? (int)tc_below(r, 3) : mode;
    float cst = m == FILL_CONST ? tied_value(r) : 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      float v;
      if (m == FILL_RANDOM) v = (float)tc_range(r, -100.0, 100.0);
      else if (m == FILL_TIES) v = tied_value(r);
      else v = cst;
      s[i * stride + c] = v;
    }
    for (int64_t c = cols; c < stride; ++c) s[i * stride + c] = INFINITY; /* gap: must be ignored */
  }
}

/* Runs dsa_topk on the device for host params p (host pointers; strides resolved by the caller),
 * writes the result into got[rows * indices_stride] (gaps included, poisoned beforehand). */
static void gpu_topk(tk_env *e, const dsa_topk_params *p, int32_t *got) {
  const int64_t sst = p->scores_stride ? p->scores_stride : p->columns;
  const int64_t ist = p->indices_stride ? p->indices_stride : p->k;
  size_t sbytes = (size_t)(p->rows * sst) * 4, ibytes = (size_t)(p->rows * ist) * 4;
  float *ds = NULL;
  int32_t *dl = NULL, *di = NULL;
  size_t ws_bytes = 0;
  unsigned char *ws = NULL;
  dsa_topk_params d = *p;
  TC_CUDA(cudaMalloc((void **)&ds, sbytes ? sbytes : 4));
  TC_CUDA(cudaMalloc((void **)&di, ibytes ? ibytes : 4));
  if (sbytes) TC_CUDA(cudaMemcpy(ds, p->scores, sbytes, cudaMemcpyHostToDevice));
  if (p->lengths) {
    TC_CUDA(cudaMalloc((void **)&dl, (size_t)p->rows * 4));
    TC_CUDA(cudaMemcpy(dl, p->lengths, (size_t)p->rows * 4, cudaMemcpyHostToDevice));
  }
  TC_CUDA(cudaMemset(di, 0x5A, ibytes ? ibytes : 4)); /* TC_POISON_I32 */
  /* cudaMemset (and the DMA of a pageable cudaMemcpy) run on the legacy default stream, which a
   * cudaStreamNonBlocking stream does not wait for: finish them before the op runs on e->stream */
  TC_CUDA(cudaDeviceSynchronize());
  d.scores = ds;
  d.lengths = dl;
  d.indices = di;
  TC_OK(dsa_topk(e->ctx, &d, NULL, &ws_bytes, e->stream));
  cr_assert(ws_bytes >= 1);
  TC_CUDA(cudaMalloc((void **)&ws, ws_bytes + 1));
  /* a workspace at a 1-byte offset is accepted (documented: any alignment) */
  TC_OK(dsa_topk(e->ctx, &d, ws + 1, &ws_bytes, e->stream));
  TC_CUDA(cudaStreamSynchronize(e->stream));
  TC_CUDA(cudaMemcpy(got, di, ibytes, cudaMemcpyDeviceToHost));
  cudaFree(ws);
  cudaFree(ds);
  cudaFree(dl);
  cudaFree(di);
}

/* Compares the GPU result with the reference for every row (gaps of a strided output must keep
 * the poison). */
static void check_topk(tk_env *e, const dsa_topk_params *p, const char *what) {
  const int64_t ist = p->indices_stride ? p->indices_stride : p->k;
  size_t n = (size_t)(p->rows * ist);
  int32_t *got = (int32_t *)malloc(n * 4 + 4), *want = (int32_t *)malloc(n * 4 + 4);
  dsa_topk_params h = *p;
  cr_assert(got && want);
  for (size_t i = 0; i < n; ++i) want[i] = TC_POISON_I32;
  h.indices = want;
  TC_OK(dsa_ref_topk(&h));
  for (int vi = 0; vi < TK_NVARIANTS; ++vi) {
    TC_SET_OPTION(e->ctx, DSA_OPTION_TOPK_KERNEL, tk_variants[vi]);
    gpu_topk(e, p, got); /* poisons the device output first */
    TC_SET_OPTION(e->ctx, DSA_OPTION_TOPK_KERNEL, DSA_TOPK_KERNEL_AUTO);
    for (int64_t r = 0; r < p->rows; ++r)
      for (int64_t j = 0; j < ist; ++j) {
        int64_t i = r * ist + j;
        cr_assert_eq(got[i], want[i],
                     "%s (variant %d): rows %lld cols %lld k %d: row %lld slot %lld is %d, want %d", what,
                     tk_variants[vi], (long long)p->rows, (long long)p->columns, p->k, (long long)r,
                     (long long)j, got[i], want[i]);
      }
  }
  free(got);
  free(want);
}

/* A case: rows x cols scores (mode), lengths random in [-3, cols + 3] (or NULL), optional
 * extra stride padding. */
static void run_case(tk_env *e, tc_rng *r, int64_t rows, int64_t cols, int32_t k, int mode,
                     int with_lengths, int64_t spad, int64_t ipad, const char *what) {
  /* racecheck: two rows per case (every row is one CTA's shared-memory work; 70001 rows stay) */
  if (tc_racecheck() && rows > 2 && rows <= 65535) rows = 2;
  dsa_topk_params p;
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.columns = cols;
  p.k = k;
  p.scores_stride = spad ? cols + spad : 0;
  p.indices_stride = ipad ? k + ipad : 0;
  int64_t sst = cols + spad;
  float *s = (float *)malloc((size_t)(rows * sst) * 4 + 4);
  int32_t *len = NULL;
  cr_assert_not_null(s);
  fill_rows(r, s, rows, cols, sst, mode);
  if (with_lengths) {
    len = (int32_t *)malloc((size_t)rows * 4);
    for (int64_t i = 0; i < rows; ++i) {
      int64_t u = tc_below(r, 10);
      if (u == 0) len[i] = (int32_t)(cols + 1 + tc_below(r, 3)); /* clamped to cols */
      else if (u == 1) len[i] = -(int32_t)tc_below(r, 3);       /* clamped to 0 */
      else if (u < 5) len[i] = (int32_t)tc_below(r, k + 2 < cols + 1 ? k + 2 : cols + 1); /* <= K-ish */
      else len[i] = (int32_t)tc_below(r, cols + 1);
    }
  }
  p.scores = s;
  p.lengths = len;
  check_topk(e, &p, what);
  free(s);
  free(len);
}

Test(gpu_topk, k_values_modes_and_lengths) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.k_values_modes_and_lengths");
  static const int32_t ks[] = {1, 7, 64, 100, 2048};
  for (int ki = 0; ki < 5; ++ki) {
    run_case(&e, &r, 37, 5003, ks[ki], FILL_RANDOM, 1, 0, 0, "random");
    run_case(&e, &r, 37, 5003, ks[ki], FILL_TIES, 1, 0, 0, "ties");
    run_case(&e, &r, 23, 3001, ks[ki], FILL_MIXED, 0, 0, 0, "mixed, lengths NULL");
    run_case(&e, &r, 11, ks[ki] + 1, ks[ki], FILL_TIES, 0, 0, 0, "columns = k + 1");
    run_case(&e, &r, 5, ks[ki], ks[ki], FILL_TIES, 0, 0, 0, "columns = k");
  }
  tk_close(&e);
}

/* Rows at and around 32768 columns, the bench's topk-32k (cached by the radix kernel, sampled by the
 * filter kernel), with every K. */
Test(gpu_topk, rows_at_32k) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.rows_at_32k");
  static const int32_t ks[] = {1, 7, 64, 100, 2048};
  for (int ki = 0; ki < 5; ++ki) {
    run_case(&e, &r, 9, 32768, ks[ki], FILL_RANDOM, 1, 0, 0, "32768 columns, random");
    run_case(&e, &r, 9, 32768, ks[ki], FILL_TIES, 1, 0, 0, "32768 columns, ties");
    run_case(&e, &r, 7, 32768, ks[ki], FILL_CONST, 0, 0, 0, "32768 columns, constant");
    run_case(&e, &r, 7, 32767, ks[ki], FILL_MIXED, 1, 1, 3, "32767 columns, unaligned rows");
    run_case(&e, &r, 5, 32769, ks[ki], FILL_MIXED, 1, 0, 0, "32769 columns");
  }
  run_case(&e, &r, 9, 16385, 2048, FILL_TIES, 1, 0, 0, "16385 columns");
  run_case(&e, &r, 9, 4097, 2048, FILL_RANDOM, 1, 0, 0, "4097 columns");
  tk_close(&e);
}

Test(gpu_topk, constant_and_nan_rows) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.constant_and_nan_rows");
  run_case(&e, &r, 16, 4099, 100, FILL_CONST, 1, 0, 0, "constant rows");
  run_case(&e, &r, 16, 4099, 2048, FILL_CONST, 0, 0, 0, "constant rows, k 2048");
  /* the same at <= 4096 columns (DSA_TOPK_KERNEL_FILTER's bisection kernel) */
  run_case(&e, &r, 16, 4096, 100, FILL_CONST, 1, 0, 0, "constant rows, 4096 columns");
  run_case(&e, &r, 16, 4096, 2048, FILL_CONST, 0, 0, 0, "constant rows, 4096 columns, k 2048");
  run_case(&e, &r, 300, 4096, 2048, FILL_TIES, 1, 0, 0, "300 rows of 4096 columns, ties, k 2048");
  run_case(&e, &r, 300, 4095, 2048, FILL_MIXED, 1, 1, 3, "300 unaligned rows of 4095 columns, k 2048");
  /* all-NaN and all -inf rows, and a row with exactly one number among NaNs */
  {
    dsa_topk_params p;
    int64_t cols = 3000;
    float *s = (float *)malloc((size_t)(3 * cols) * 4);
    for (int64_t c = 0; c < cols; ++c) {
      s[c] = nanf("");
      s[cols + c] = -INFINITY;
      s[2 * cols + c] = c == 1777 ? -1e30f : nanf("");
    }
    memset(&p, 0, sizeof p);
    p.rows = 3;
    p.columns = cols;
    p.k = 7;
    p.scores = s;
    check_topk(&e, &p, "NaN / -inf rows");
    free(s);
  }
  tk_close(&e);
}

/* The filter kernel (DSA_TOPK_KERNEL_FILTER: a sampled threshold, one filtering read, the exact select on the candidates; its
 * candidate capacity is 8192) on rows longer than that capacity, one row per pattern: uniform
 * [-1, 1] (the filter path, as dsa_bench); columns 128 c .. 128 c + 3 (the sampled vectors of an
 * aligned row of these lengths) high, so the sample overestimates the threshold (too few candidates
 * for large k, just enough for small k); the same columns low (too many candidates); 97% NaN (the
 * sampled threshold is NaN); random bit patterns of small magnitude (denormals, signed zeros); 64
 * distinct values (many ties at the threshold); a few +inf among random values. Both fallbacks and
 * the filter path, checked for every variant against the reference. */
static void sampled_pattern_row(tc_rng *r, float *s, int64_t cols, int pattern) {
  for (int64_t c = 0; c < cols; ++c) {
    const int sampled = (c % 128) < 4;
    float v;
    switch (pattern) {
      case 0: v = (float)tc_range(r, -1.0, 1.0); break;
      case 1: v = sampled ? (float)tc_range(r, 1000.0, 1001.0) : (float)tc_range(r, -1.0, 1.0); break;
      case 2: v = sampled ? -1000.0f : (float)tc_range(r, -1.0, 1.0); break;
      case 3: v = tc_below(r, 100) < 97 ? nanf("") : (float)tc_range(r, -1.0, 1.0); break;
      case 4: {
        const uint32_t b = (uint32_t)tc_next(r) & 0x807FFFFFu; /* exponent 0: subnormals and +-0 */
        memcpy(&v, &b, 4);
        break;
      }
      case 5: v = (float)tc_below(r, 64) - 32.0f; break;
      default: v = tc_below(r, 1000) == 0 ? INFINITY : (float)tc_range(r, -1.0, 1.0); break;
    }
    s[c] = v;
  }
}

Test(gpu_topk, sampled_filter_paths) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.sampled_filter_paths");
  static const int64_t colss[] = {8193, 9000, 40000, 131072};
  static const int32_t ks[] = {1, 100, 2048};
  const int64_t rows = 7;
  for (int ci = 0; ci < 4; ++ci)
    for (int ki = 0; ki < 3; ++ki) {
      const int64_t cols = colss[ci];
      float *s = (float *)malloc((size_t)(rows * cols) * 4);
      dsa_topk_params p;
      cr_assert_not_null(s);
      for (int64_t i = 0; i < rows; ++i) sampled_pattern_row(&r, s + i * cols, cols, (int)i);
      memset(&p, 0, sizeof p);
      p.rows = rows;
      p.columns = cols;
      p.k = ks[ki];
      p.scores = s;
      check_topk(&e, &p, "sampled-filter patterns (row = pattern)");
      free(s);
    }
  tk_close(&e);
}

Test(gpu_topk, long_rows_uncached_and_2pow20) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.long_rows_uncached_and_2pow20");
  for (int compact = 1; compact >= 0; --compact) {
    /* compact 1: two reads with the candidates in shared memory where they fit (else five reads);
     * 0: always five reads */
    TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_COMPACT_LONG_ROWS, compact);
    run_case(&e, &r, 1, (int64_t)1 << 20, 2048, FILL_RANDOM, 0, 0, 0, "2^20 columns, random");
    run_case(&e, &r, 1, (int64_t)1 << 20, 100, FILL_TIES, 0, 0, 0, "2^20 columns, ties");
    run_case(&e, &r, 6, 70001, 2048, FILL_MIXED, 1, 0, 0, "rows above the cache limit");
    run_case(&e, &r, 4, 70001, 7, FILL_CONST, 0, 0, 0, "constant rows above the cache limit");
    run_case(&e, &r, 6, 49153, 64, FILL_TIES, 0, 0, 0, "just above the cache limit");
    run_case(&e, &r, 6, 131072, 2048, FILL_RANDOM, 1, 0, 0, "128k columns, random");
    run_case(&e, &r, 6, 32768, 2048, FILL_RANDOM, 1, 0, 0, "32k columns (cached)");
  }
  TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_COMPACT_LONG_ROWS, 1);
  tk_close(&e);
}

Test(gpu_topk, many_rows_and_strides) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.many_rows_and_strides");
  run_case(&e, &r, 70001, 40, 7, FILL_MIXED, 1, 0, 0, "70001 rows");
  run_case(&e, &r, 70001, 9, 64, FILL_TIES, 0, 0, 0, "70001 rows, all shorter than k");
  run_case(&e, &r, 29, 2500, 100, FILL_TIES, 1, 13, 5, "strided scores and indices");
  run_case(&e, &r, 29, 2500, 2048, FILL_RANDOM, 0, 1, 3, "strided, k 2048");
  tk_close(&e);
}

/* Bitwise reruns, and a row alone gives what it gives inside a batch. */
Test(gpu_topk, deterministic_and_batch_independent) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.deterministic_and_batch_independent");
  const int64_t rows = 64, cols = 9000;
  const int32_t k = 2048;
  float *s = (float *)malloc((size_t)(rows * cols) * 4);
  int32_t *len = (int32_t *)malloc(rows * 4);
  int32_t *a = (int32_t *)malloc((size_t)(rows * k) * 4), *b = (int32_t *)malloc((size_t)(rows * k) * 4);
  int32_t one[2048];
  dsa_topk_params p;
  fill_rows(&r, s, rows, cols, cols, FILL_MIXED);
  for (int64_t i = 0; i < rows; ++i) len[i] = (int32_t)tc_below(&r, cols + 1);
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.columns = cols;
  p.k = k;
  p.scores = s;
  p.lengths = len;
  for (int vi = 0; vi < TK_NVARIANTS; ++vi) {
    TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, tk_variants[vi]);
    gpu_topk(&e, &p, a);
    gpu_topk(&e, &p, b);
    cr_assert(memcmp(a, b, (size_t)(rows * k) * 4) == 0, "variant %d: two runs differ", tk_variants[vi]);
    for (int64_t i = 0; i < rows; i += 9) {
      dsa_topk_params q = p;
      q.rows = 1;
      q.scores = s + i * cols;
      q.lengths = len + i;
      gpu_topk(&e, &q, one);
      cr_assert(memcmp(one, a + i * k, (size_t)k * 4) == 0, "variant %d: row %lld alone differs from the batch",
                tk_variants[vi], (long long)i);
    }
  }
  TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, DSA_TOPK_KERNEL_AUTO);
  free(s);
  free(len);
  free(a);
  free(b);
  tk_close(&e);
}

Test(gpu_topk, workspace_contract) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  dsa_topk_params p;
  size_t b1 = 0, b2 = 0;
  memset(&p, 0, sizeof p);
  p.rows = 100;
  p.columns = 50000;
  p.k = 2048;
  p.scores = (const float *)(uintptr_t)0x1000; /* not dereferenced by the size query */
  p.indices = (int32_t *)(uintptr_t)((uint64_t)1 << 40); /* apart from scores' range: contract 13.3 */
  TC_OK(dsa_topk(e.ctx, &p, NULL, &b1, e.stream));
  TC_OK(dsa_topk(e.ctx, &p, NULL, &b2, e.stream));
  cr_assert(b1 >= 1 && b1 == b2, "workspace size %zu then %zu", b1, b2);
  p.rows = 1 << 20;
  TC_OK(dsa_topk(e.ctx, &p, NULL, &b2, e.stream));
  cr_assert(b2 >= 1 && b2 <= ((size_t)256 << 20), "workspace not bounded: %zu", b2);
  /* zero rows: success, no launch */
  p.rows = 0;
  b1 = 1;
  TC_OK(dsa_topk(e.ctx, &p, (void *)(uintptr_t)0x1000, &b1, e.stream));
  tk_close(&e);
}

Test(gpu_topk, bad_arguments_write_nothing) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  const int64_t rows = 4, cols = 100;
  float *ds = NULL;
  int32_t *di = NULL, host[4 * 64];
  size_t wsb = 1;
  unsigned char *ws = NULL;
  dsa_topk_params p;
  TC_CUDA(cudaMalloc((void **)&ds, rows * cols * 4));
  TC_CUDA(cudaMalloc((void **)&di, rows * 64 * 4));
  TC_CUDA(cudaMalloc((void **)&ws, 16));
  TC_CUDA(cudaMemset(ds, 0, rows * cols * 4));
  TC_CUDA(cudaMemset(di, 0x5A, rows * 64 * 4));
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.columns = cols;
  p.k = 64;
  p.scores = ds;
  p.indices = di;
  p.k = 0;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "k");
  p.k = 2049;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "k");
  p.k = 64;
  p.scores = NULL;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "scores");
  p.scores = ds;
  p.rows = -1;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "rows");
  p.rows = rows;
  p.scores_stride = cols - 1;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "scores_stride");
  p.scores_stride = 0;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, NULL, e.stream), DSA_ERROR_INVALID_ARGUMENT, "workspace_bytes");
  TC_FAILS(dsa_topk(NULL, &p, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  TC_FAILS(dsa_topk(e.ctx, NULL, ws, &wsb, e.stream), DSA_ERROR_INVALID_ARGUMENT, "p");
  wsb = 0;
  TC_FAILS(dsa_topk(e.ctx, &p, ws, &wsb, e.stream), DSA_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  TC_CUDA(cudaDeviceSynchronize());
  TC_CUDA(cudaMemcpy(host, di, sizeof host, cudaMemcpyDeviceToHost));
  for (int i = 0; i < rows * 64; ++i)
    cr_assert_eq(host[i], TC_POISON_I32, "a failed call wrote indices[%d] = %d", i, host[i]);
  cudaFree(ds);
  cudaFree(di);
  cudaFree(ws);
  tk_close(&e);
}

/* The launch is capturable: a CUDA graph of one dsa_topk call replays to the reference result. */
Test(gpu_topk, graph_capture) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.graph_capture");
  const int64_t rows = 50, cols = 60001; /* above the cache limit */
  const int32_t k = 100;
  float *s = (float *)malloc((size_t)(rows * cols) * 4), *ds = NULL;
  int32_t *want = (int32_t *)malloc((size_t)(rows * k) * 4), *got = (int32_t *)malloc((size_t)(rows * k) * 4);
  int32_t *di = NULL;
  unsigned char *ws = NULL;
  size_t wsb = 0;
  dsa_topk_params p;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  fill_rows(&r, s, rows, cols, cols, FILL_MIXED);
  memset(&p, 0, sizeof p);
  p.rows = rows;
  p.columns = cols;
  p.k = k;
  TC_CUDA(cudaMalloc((void **)&ds, (size_t)(rows * cols) * 4));
  TC_CUDA(cudaMalloc((void **)&di, (size_t)(rows * k) * 4));
  TC_CUDA(cudaMemcpy(ds, s, (size_t)(rows * cols) * 4, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemset(di, 0x5A, (size_t)(rows * k) * 4));
  TC_CUDA(cudaDeviceSynchronize()); /* legacy-stream setup done before the non-blocking stream runs */
  p.scores = ds;
  p.indices = di;
  TC_OK(dsa_topk(e.ctx, &p, NULL, &wsb, e.stream));
  TC_CUDA(cudaMalloc((void **)&ws, wsb));
  for (int pass = 0; pass < 2 * TK_NVARIANTS; ++pass) { /* 32K columns (cached, opt-in smem) then 60001 */
    TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, tk_variants[pass >> 1]);
    p.columns = (pass & 1) == 0 ? 32768 : cols;
    TC_CUDA(cudaMemset(di, 0x5A, (size_t)(rows * k) * 4));
    TC_CUDA(cudaDeviceSynchronize());
    p.scores_stride = cols;
    {
      dsa_topk_params h = p;
      h.scores = s;
      h.indices = want;
      TC_OK(dsa_ref_topk(&h));
    }
    TC_CUDA(cudaStreamBeginCapture(e.stream, cudaStreamCaptureModeGlobal));
    TC_OK(dsa_topk(e.ctx, &p, ws, &wsb, e.stream));
    TC_CUDA(cudaStreamEndCapture(e.stream, &g));
    TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, DSA_TOPK_KERNEL_AUTO); /* the graph keeps the captured kernel */
    TC_CUDA(cudaGraphInstantiate(&ge, g, 0));
    TC_CUDA(cudaGraphLaunch(ge, e.stream));
    TC_CUDA(cudaStreamSynchronize(e.stream));
    TC_CUDA(cudaMemcpy(got, di, (size_t)(rows * k) * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < rows * k; ++i)
      cr_assert_eq(got[i], want[i], "graph replay (variant %d, columns %lld): element %lld is %d, want %d",
                   tk_variants[pass >> 1], (long long)p.columns, (long long)i, got[i], want[i]);
    TC_CUDA(cudaGraphExecDestroy(ge));
    TC_CUDA(cudaGraphDestroy(g));
  }
  cudaFree(ws);
  cudaFree(ds);
  cudaFree(di);
  free(s);
  free(want);
  free(got);
  tk_close(&e);
}

/* The indexer's launch (dsa_launch_topk with starts): row r reads its L_r columns at offset
 * starts[r] - start_base (any alignment) of its scores row, emits column + starts[r], and writes
 * min(L_r, k) to out_lengths; compared with the reference on the same row slice, every variant. */
Test(gpu_topk, indexer_launch_interface) {
  TC_REQUIRE_GPU();
  tk_env e = tk_open();
  tc_rng r = tc_seed("gpu_topk.indexer_launch_interface");
  static const int64_t colss[] = {5000, 32768};
  static const int32_t ks[] = {7, 2048};
  for (int ci = 0; ci < 2; ++ci)
    for (int ki = 0; ki < 2; ++ki) {
      const int64_t rows = 33, cols = colss[ci], ld = cols + 64, base = 1000;
      const int32_t k = ks[ki];
      float *s = (float *)malloc((size_t)(rows * ld) * 4), *ds = NULL;
      int32_t *len = (int32_t *)malloc(rows * 4), *st = (int32_t *)malloc(rows * 4);
      int32_t *want = (int32_t *)malloc((size_t)(rows * k) * 4), *got = (int32_t *)malloc((size_t)(rows * k) * 4);
      int32_t gotlen[33];
      int32_t *dlen = NULL, *dst = NULL, *di = NULL, *dol = NULL;
      fill_rows(&r, s, rows, ld, ld, FILL_MIXED);
      for (int64_t i = 0; i < rows; ++i) {
        st[i] = (int32_t)(base + tc_below(&r, 65)); /* off_r = 0..64: unaligned rows too */
        len[i] = i % 5 == 0 ? (int32_t)tc_below(&r, k + 1) : (int32_t)(k + 1 + tc_below(&r, cols - k));
        if (i == 1) len[i] = (int32_t)cols;
      }
      for (int64_t i = 0; i < rows; ++i) { /* reference: row i's slice, then + starts[i] */
        dsa_topk_params h;
        memset(&h, 0, sizeof h);
        h.rows = 1;
        h.columns = cols;
        h.k = k;
        h.scores = s + i * ld + (st[i] - base);
        h.lengths = len + i;
        h.indices = want + i * k;
        TC_OK(dsa_ref_topk(&h));
        for (int32_t j = 0; j < k; ++j)
          if (want[i * k + j] >= 0) want[i * k + j] += st[i];
      }
      TC_CUDA(cudaMalloc((void **)&ds, (size_t)(rows * ld) * 4));
      TC_CUDA(cudaMalloc((void **)&dlen, rows * 4));
      TC_CUDA(cudaMalloc((void **)&dst, rows * 4));
      TC_CUDA(cudaMalloc((void **)&dol, rows * 4));
      TC_CUDA(cudaMalloc((void **)&di, (size_t)(rows * k) * 4));
      TC_CUDA(cudaMemcpy(ds, s, (size_t)(rows * ld) * 4, cudaMemcpyHostToDevice));
      TC_CUDA(cudaMemcpy(dlen, len, rows * 4, cudaMemcpyHostToDevice));
      TC_CUDA(cudaMemcpy(dst, st, rows * 4, cudaMemcpyHostToDevice));
      for (int vi = 0; vi < TK_NVARIANTS; ++vi) {
        dsa_topk_launch a;
        TC_CUDA(cudaMemset(di, 0x5A, (size_t)(rows * k) * 4));
        TC_CUDA(cudaMemset(dol, 0x5A, rows * 4));
        TC_CUDA(cudaDeviceSynchronize());
        memset(&a, 0, sizeof a);
        a.rows = rows;
        a.columns = cols;
        a.k = k;
        a.scores = ds;
        a.scores_stride = ld;
        a.lengths = dlen;
        a.starts = dst;
        a.start_base = base;
        a.indices = di;
        a.indices_stride = k;
        a.out_lengths = dol;
        TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, tk_variants[vi]);
        TC_OK(dsa_launch_topk(e.ctx, &a, e.stream));
        TC_SET_OPTION(e.ctx, DSA_OPTION_TOPK_KERNEL, DSA_TOPK_KERNEL_AUTO);
        TC_CUDA(cudaStreamSynchronize(e.stream));
        TC_CUDA(cudaMemcpy(got, di, (size_t)(rows * k) * 4, cudaMemcpyDeviceToHost));
        TC_CUDA(cudaMemcpy(gotlen, dol, rows * 4, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < rows; ++i) {
          const int32_t wl = len[i] < 0 ? 0 : (len[i] < k ? len[i] : k);
          cr_assert_eq(gotlen[i], wl, "variant %d cols %lld k %d: out_lengths[%lld] = %d, want %d",
                       tk_variants[vi], (long long)cols, k, (long long)i, gotlen[i], wl);
          for (int32_t j = 0; j < k; ++j)
            cr_assert_eq(got[i * k + j], want[i * k + j],
                         "variant %d cols %lld k %d: row %lld slot %d is %d, want %d", tk_variants[vi],
                         (long long)cols, k, (long long)i, j, got[i * k + j], want[i * k + j]);
        }
      }
      cudaFree(ds);
      cudaFree(dlen);
      cudaFree(dst);
      cudaFree(dol);
      cudaFree(di);
      free(s);
      free(len);
      free(st);
      free(want);
      free(got);
    }
  tk_close(&e);
}
