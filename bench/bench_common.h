/*
 * bench_common.h - what the benchmark programs (dsa_bench, dsa_layer) share: fast random device
 * inputs from the suites' generator (tests/test_shared.h, which also gives the relative errors the
 * programs check with), causal index construction for the GLM shapes, L2-flushed CUDA-event timing
 * (median of reps), the same-run ceilings (cuBLAS bf16 GEMM, device-to-device copy), the counting
 * rules of docs/perf.md ("Method"), and small helpers (card name, commit, date, JSON strings).
 * Plain C99; the only CUDA code it calls is the runtime API and cuBLAS.
 */
#ifndef DSA_BENCH_COMMON_H
#define DSA_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime_api.h>
#include "dsa.h"
#include "test_shared.h" /* the generator, errors, NaN tests, tc_have_gpu: the same as the suites' */

/* ---- errors: a CUDA failure in the benchmark harness itself is fatal (it is not the library's) ---- */
#define BC_CUDA(call)                                                                  \
  do {                                                                                 \
    cudaError_t bc_e_ = (call);                                                        \
    if (bc_e_ != cudaSuccess) bc_die("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, \
                                     cudaGetErrorString(bc_e_));                       \
  } while (0)
void bc_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void *bc_malloc(size_t bytes);      /* host malloc or die */
void *bc_dmalloc(size_t bytes);     /* cudaMalloc or die (prints the size that failed) */

/* ---- random numbers: the suites' splitmix64 (tc_rng, tc_next, tc_below: tests/test_shared.h) ----
 * Bulk fills for the benchmarks' large tensors (hundreds of MB): four 16-bit draws per 64-bit output
 * for bf16, two 32-bit ones for fp32, values uniform in [lo, hi) (never exactly lo); the suites'
 * tc_fill_* take one draw per element. */
void bc_fill_bf16_host(tc_rng *r, uint16_t *x, size_t n, float lo, float hi);
void bc_fill_f32_host(tc_rng *r, float *x, size_t n, float lo, float hi);
/* Device fills from the host in 32 MiB chunks (random everywhere, no repetition). */
void bc_fill_bf16_device(tc_rng *r, uint16_t *d, size_t n, float lo, float hi);
void bc_fill_f32_device(tc_rng *r, float *d, size_t n, float lo, float hi);

/* ---- indices ---- */
/* rows x k distinct random values in [0, range) per row (unsorted), host. Needs k <= range. */
void bc_random_distinct_indices(tc_rng *r, int32_t *idx, int64_t rows, int32_t k, int64_t range);
/* Causal GLM indices for one sequence, host: local row t is global position g = query_start + t
 * and sees keys 0..g; if g + 1 <= k the row is 0..g, else a random ascending k-subset of 0..g.
 * Slots past the valid count are -1; lengths[t] = min(g + 1, k). */
void bc_causal_indices(tc_rng *r, int32_t *idx, int32_t *lengths, int64_t rows, int64_t query_start,
                       int32_t k);
/* The same for a packed batch: key positions start at doc_start (the document's first row), the
 * row sees doc_start..doc_start+c-1 with c = its causal length (0: a row of -1). */
void bc_causal_row(tc_rng *r, int32_t *row, int32_t k, int64_t doc_start, int64_t causal_len);

/* ---- timing ---- */
typedef dsa_status (*bc_op_fn)(void *arg, cudaStream_t stream);
typedef struct bc_timer {
  cudaStream_t stream;
  void *flush;         /* device buffer of 2x L2 size, written before every rep */
  size_t flush_bytes;
  int reps;
} bc_timer;
void bc_timer_init(bc_timer *t, int reps);
void bc_timer_free(bc_timer *t);
/* One warm-up call (its status is returned as is when not DSA_SUCCESS: nothing is timed then),
 * then per rep: L2 flush, a 1 ms hold of the stream from a host callback (the call's host work is
 * queued meanwhile, outside the events), event, op, event. *median_ms gets the median of the reps. A failure in
 * a timed rep is returned too. */
dsa_status bc_time_op(bc_timer *t, bc_op_fn fn, void *arg, double *median_ms);
double bc_median(double *v, int n); /* sorts v */

/* The indexer-training ops as bc_time_op callbacks (dsa_bench, dsa_layer): each reads its params
 * from one bc_train_arg (the two-phase ones with ws / ws_bytes). */
typedef struct bc_train_arg {
  dsa_context *ctx;
  dsa_slot_target_params st;
  dsa_indexer_slot_scores_params sc;
  dsa_indexer_loss_params ls;
  dsa_indexer_bwd_params bw;
  void *ws;
  size_t ws_bytes;
} bc_train_arg;
dsa_status bc_slot_target_run(void *arg, cudaStream_t stream);
dsa_status bc_slot_scores_run(void *arg, cudaStream_t stream);
dsa_status bc_indexer_loss_run(void *arg, cudaStream_t stream);
dsa_status bc_indexer_bwd_run(void *arg, cudaStream_t stream);
double bc_now_s(void);             /* monotonic host clock, seconds */

/* ---- ceilings measured in the same run ---- */
typedef struct bc_ceilings {
  double gemm_tflops; /* cuBLAS bf16 GEMM 8192^3, fp32 compute, median */
  double copy_gbps;   /* 1 GiB D2D cudaMemcpyAsync, read + write bytes (2 GiB per copy) */
} bc_ceilings;
void bc_measure_ceilings(bc_timer *t, bc_ceilings *c);

/* ---- counting rules (docs/perf.md, "Method") ---- */
static inline double bc_flops_fwd(double slots, int heads) { return 2.0 * heads * slots * (576 + 512); }
static inline double bc_flops_bwd(double slots, int heads) { return 2.0 * heads * slots * 2752; }
/* the same five products at head dim d (d = 576: 2752; d = 512 has no rope part: 3*512 + 2*512) */
static inline double bc_flops_bwd_d(double slots, int heads, int d) { return 2.0 * heads * slots * (3.0 * d + 2 * 512); }
static inline double bc_flops_idx(double pairs, int idx_heads) { return 2.0 * idx_heads * 128 * pairs; }
static inline double bc_bytes_topk(double rows, double columns) { return rows * columns * 4; }

/* ---- environment ---- */
void bc_card_name(char *buf, size_t n, int spaces_to_dashes); /* device 0 name */
void bc_commit(char *buf, size_t n);  /* DSA_COMMIT, else git rev-parse --short HEAD, else unknown */
void bc_date(char *buf, size_t n);    /* YYYY-MM-DD (local time) */
void bc_json_string(FILE *f, const char *s); /* writes "s" with escapes */
void bc_json_number(FILE *f, double v);      /* a number, or null when v is NaN/inf */
int bc_mkdir_p(const char *dir);              /* 0 on success (or when it exists) */

#endif /* DSA_BENCH_COMMON_H */
