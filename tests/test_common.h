/*
 * test_common.h - helpers every Criterion suite shares: seeded random inputs (the seed is printed),
 * the GPU gate (cr_skip_test when there is no device), the sanitizer switches, the assertion macros
 * and hand-made plan views; the helpers the benchmarks use too (fills, poisoning, error norms) are in
 * tests/test_shared.h, which this header includes.
 * Every GPU suite is named "gpu_*" so `make sanitize` can select them.
 */
#ifndef DSA_TEST_COMMON_H
#define DSA_TEST_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include "dsa.h"
#include "dsa_tune.h"
#include "test_shared.h" /* the generator, fills, poison, NaN tests, errors, tc_have_gpu (with bench/) */

/* A fresh seed per test (DSA_TEST_SEED overrides), printed so a failure can be replayed. */
static inline tc_rng tc_seed(const char *what) {
  tc_rng r;
  const char *env = getenv("DSA_TEST_SEED");
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  r.s = env ? strtoull(env, NULL, 0) : ((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20));
  cr_log_info("%s: seed %llu (replay with DSA_TEST_SEED=%llu)", what, (unsigned long long)r.s,
              (unsigned long long)r.s);
  return r;
}

/* ---- GPU gate ----
 * GPU suites create their streams with cudaStreamDefault (blocking): the setup's cudaMemcpy and
 * cudaMemset run on the legacy default stream, which a blocking stream waits for. A
 * cudaStreamNonBlocking stream does not, and then the op can race its own inputs. */
/* The start of the message of a test that skips without a GPU (tests/test_summary.c counts them). */
#define TC_NO_GPU_SKIP "no CUDA device"
#define TC_REQUIRE_GPU()                                        \
  do {                                                          \
    if (!tc_have_gpu()) cr_skip_test(TC_NO_GPU_SKIP ": GPU suite skipped"); \
  } while (0)

/* DSA_TEST_SANITIZE=1 (set by `make sanitize`): the GPU suites run under compute-sanitizer,
 * which makes every kernel 10-1000x slower. Suites shrink their biggest shapes (fewer checked rows,
 * smaller H and K, T above 65535 kept where the test is about it), keeping every code path;
 * gpu_large skips (its 4-16 GB tensors would take minutes per launch under the tools). */
static inline int tc_sanitize(void) {
  const char *s = getenv("DSA_TEST_SANITIZE");
  return s != NULL && s[0] != '\0' && strcmp(s, "0") != 0;
}

/* DSA_TEST_SANITIZE=racecheck: racecheck tracks every shared-memory access, so the attention
 * suites shrink further (tc_racecheck_shrink: at most 256 slots = four 64-key tiles, so both
 * stages of a two-stage ring are used with both barrier parities, and about two 64-wide (query, head) tiles of
 * tokens) and skip the T > 65535 cases (a grid-size question, not a shared-memory one: memcheck
 * and the plain run cover it). */
static inline int tc_racecheck(void) {
  const char *s = getenv("DSA_TEST_SANITIZE");
  return s != NULL && strcmp(s, "racecheck") == 0;
}
static inline void tc_racecheck_shrink(int64_t *T, int *K, int H) {
  if (!tc_racecheck()) return;
  int64_t t_cap = H > 0 ? 128 / H : 2;
  if (t_cap < 2) t_cap = 2;
  if (*T > t_cap && *T <= 65535) *T = t_cap;
  if (*K > 256) *K = 256;
}

/* DSA_TEST_SANITIZE=initcheck or racecheck: these tools cannot follow cuBLAS's own GEMM kernels
 * (nvjet_*, the indexer's cuBLAS engine): initcheck does not see their stores (every read of a GEMM
 * output is reported uninitialized: tests/sanitize/initcheck_cublas.cu), racecheck reports hazards
 * inside them, and excluding them with --kernel-name-exclude is worse (initcheck then misses the
 * excluded kernel's own stores and flags every later read; racecheck failed internally, "failed to
 * handle a hardware exception", and cuBLAS returned an error). So under those two tools the suites
 * skip the cuBLAS engine; memcheck and synccheck run it. */
static inline int tc_sanitize_skips_cublas(void) {
  const char *s = getenv("DSA_TEST_SANITIZE");
  return s != NULL && (strcmp(s, "initcheck") == 0 || strcmp(s, "racecheck") == 0);
}

/* The GPU suites' context (device 0). Under racecheck: racecheck does not follow the ordering of a
 * named barrier's barrier.arrive -> barrier.sync (dev/barrier_probe.cu: on the H200 it reports RAW /
 * WAR hazards on an arrive / sync hand-off that the hardware ran 8.65 M times without one wrong read,
 * and even on accesses that a later barrier.sync of both sides separates; the same hand-off on
 * mbarriers or plain barrier.sync is clean). The 64-head forward hands its row max and P tiles
 * between WGs that way, so under racecheck the context runs its twin with mbarrier hand-offs
 * (DSA_OPTION_FWD_SM90_HANDOFF = DSA_FWD_HANDOFF_MBARRIER: same data flow, checkable), and the
 * forward suite skips the named-barrier one (docs/reliability.md section 3c). The warp-specialised
 * backward (the automatic choice in both modes) hands P / dS and the KV tile the same
 * way and has no such twin, so under racecheck the context forces the lockstep 64-head backward
 * (DSA_BWD_KERNEL_SM90_H64, plain barrier.sync) for the suites that run the automatic choice;
 * gpu_attn_bwd forces each kernel itself and skips the ws_* tests there. */
static inline dsa_status tc_context_create(dsa_context **ctx) {
  dsa_status s = dsa_context_create(ctx, 0);
  if (s == DSA_SUCCESS && tc_racecheck()) {
    s = dsa_context_set_option(*ctx, DSA_OPTION_FWD_SM90_HANDOFF, DSA_FWD_HANDOFF_MBARRIER);
    if (s == DSA_SUCCESS) s = dsa_context_set_option(*ctx, DSA_OPTION_BWD_KERNEL, DSA_BWD_KERNEL_SM90_H64);
  }
  return s;
}

/* cudaMalloc of a large buffer: a device without the memory skips the test (naming the size). */
#define TC_MALLOC_OR_SKIP(ptr, bytes)                                                         \
  do {                                                                                        \
    size_t tc_b_ = (size_t)(bytes);                                                           \
    cudaError_t tc_e_ = cudaMalloc((void **)&(ptr), tc_b_);                                   \
    if (tc_e_ == cudaErrorMemoryAllocation) {                                                 \
      (void)cudaGetLastError();                                                               \
      cr_skip_test("needs %.2f GB of device memory for %s (cudaMalloc failed)",               \
                   (double)tc_b_ / 1e9, #ptr);                                                \
    }                                                                                         \
    cr_assert(tc_e_ == cudaSuccess, "cudaMalloc(%s, %zu) failed: %s", #ptr, tc_b_,            \
              cudaGetErrorString(tc_e_));                                                     \
  } while (0)

#define TC_CUDA(call)                                                                   \
  do {                                                                                  \
    cudaError_t tc_e_ = (call);                                                         \
    cr_assert(tc_e_ == cudaSuccess, "%s failed: %s", #call, cudaGetErrorString(tc_e_)); \
  } while (0)

/* Sets an option of a test's context (include/dsa_tune.h); a rejected value fails the test. */
#define TC_SET_OPTION(ctx, opt, value) TC_OK(dsa_context_set_option((ctx), (opt), (int64_t)(value)))
#define TC_OK(call)                                                                        \
  do {                                                                                     \
    dsa_status tc_s_ = (call);                                                             \
    cr_assert(tc_s_ == DSA_SUCCESS, "%s returned %d (%s): %s", #call, (int)tc_s_,          \
              dsa_status_string(tc_s_), dsa_last_error_message());                         \
  } while (0)

/* A call that must fail with `status` and a message mentioning `word` (the argument's name). */
#define TC_FAILS(call, status, word)                                                         \
  do {                                                                                       \
    dsa_status tc_s_ = (call);                                                               \
    cr_assert(tc_s_ == (status), "%s returned %d, expected %d (%s)", #call, (int)tc_s_,      \
              (int)(status), dsa_last_error_message());                                      \
    cr_assert(strstr(dsa_last_error_message(), (word)) != NULL,                              \
              "message \"%s\" does not name \"%s\"", dsa_last_error_message(), (word));      \
  } while (0)

/* ---- hand-made plan views (docs/contract.md section 5) ----
 * Every op checks the view it is handed: counts, segments, validity fields consistent. Tests that
 * build a view by hand from host starts / causal_lengths / query_valid (num_queries and
 * total_key_tokens set) complete it with tc_view_complete: the validity fields from query_valid,
 * one segment (the segment arrays point at a static placeholder the ops never read), max_seqlen_q
 * = T_q, max_seqlen_k = the longest visible window (at least 1, at most T_k). */
static inline const int32_t *tc_view_placeholder_i32(void) {
  static const int32_t z[2] = {0, 0};
  return z;
}
static inline const int64_t *tc_view_placeholder_i64(void) {
  static const int64_t z[1] = {0};
  return z;
}
static inline void tc_view_complete(dsa_plan_view *v) {
  int64_t nvalid = 0, msk = 1;
  for (int64_t t = 0; t < v->num_queries; ++t) {
    nvalid += v->query_valid[t] != 0;
    if (v->causal_lengths[t] > msk) msk = v->causal_lengths[t];
  }
  if (msk > v->total_key_tokens) msk = v->total_key_tokens;
  v->num_valid = nvalid;
  v->all_rows_nonempty = nvalid == v->num_queries;
  v->valid_row_indices = v->all_rows_nonempty ? NULL : tc_view_placeholder_i64();
  v->num_segments = 1;
  v->segment_cu_q = v->segment_cu_k = v->q_causal_offsets = tc_view_placeholder_i32();
  v->max_seqlen_q = (int32_t)v->num_queries;
  v->max_seqlen_k = (int32_t)msk;
}
/* The one-query view of row t of a host plan view (for the reference of a single row): the row's
 * arrays, its global position, its validity, one segment; max_seqlen_k and the key sources kept. */
static inline dsa_plan_view tc_view_row(const dsa_plan_view *hv, int64_t t) {
  dsa_plan_view v = *hv;
  const int ok = hv->query_valid[t] != 0;
  v.num_queries = 1;
  v.query_start = hv->query_start + t;
  v.starts = hv->starts + t;
  v.causal_lengths = hv->causal_lengths + t;
  v.query_valid = hv->query_valid + t;
  v.num_valid = ok;
  v.all_rows_nonempty = ok;
  v.valid_row_indices = ok ? NULL : (hv->valid_row_indices ? hv->valid_row_indices : tc_view_placeholder_i64());
  v.num_segments = 1;
  v.max_seqlen_q = 1;
  return v;
}

/* An indexer size query's inputs: a host plan of one causal sequence of tk keys with the queries
 * [qs, qs + nq) (nq = -1: all of them, qs ignored), and params of h heads and top-k k on it with placeholder
 * device pointers (only the scalars and the plan's host arrays are read), the outputs apart from the
 * inputs' ranges and each other's (overlap is rejected: contract 13.3). The caller destroys *plan. */
static inline dsa_indexer_params tc_indexer_size_params(int64_t tk, int64_t nq, int64_t qs, int h, int k,
                                                        dsa_plan **plan) {
  int32_t cu[2] = {0, (int32_t)tk};
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu;
  d.num_seqs = 1;
  d.total_key_tokens = tk;
  d.num_queries = nq;
  d.query_start = nq < 0 ? 0 : qs;
  *plan = NULL;
  TC_OK(dsa_plan_create(&d, plan));
  dsa_indexer_params p;
  memset(&p, 0, sizeof p);
  p.plan = dsa_plan_host_view(*plan);
  p.num_heads = h;
  p.topk = k;
  p.index_q = p.index_k = (const uint16_t *)(uintptr_t)0x10000;
  p.weights = (const void *)(uintptr_t)0x10000;
  p.weights_dtype = DSA_DTYPE_F32;
  p.indices = (int32_t *)(uintptr_t)((uint64_t)1 << 40);
  p.lengths = (int32_t *)(uintptr_t)((uint64_t)2 << 40);
  return p;
}

#endif /* DSA_TEST_COMMON_H */
