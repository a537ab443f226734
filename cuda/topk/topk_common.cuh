/*
 * topk_common.cuh - what the two top-k kernels share (cuda/topk/): the order-preserving key of a
 * score, a row's start (length, column offset, the L <= k rows written whole), the block scan, the
 * radix bin search, and the count / emit sweeps of a row read from global memory; the kernels'
 * launchers, which the top-k's dispatch point (cuda/topk/topk.cu) chooses between.
 */
#ifndef DSA_TOPK_COMMON_CUH
#define DSA_TOPK_COMMON_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include "internal.h"

#define TK_BINS 2048 /* 11-bit digits: three passes cover 32 bits */

static __device__ __forceinline__ uint32_t tk_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (f != f) return 0u;            /* NaN: below -inf (whose key is 0x007FFFFF) */
  if (u == 0x80000000u) u = 0u;     /* -0 and +0 are equal scores */
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}


/* Row r's length: lengths[r] clamped to [0, columns], or columns without lengths. */
static __device__ __forceinline__ int64_t tk_row_len(const dsa_topk_launch &a, int64_t r) {
  int64_t L = a.columns;
  if (a.lengths != NULL) {
    const int64_t l = a.lengths[r];
    L = l < 0 ? 0 : (l > a.columns ? a.columns : l);
  }
  return L;
}

/* The start every kernel makes on a row: its length L, the column offset `add` of the indexer
 * interface (starts), its output row, out_lengths; a row with L <= k is written here whole (0..L-1,
 * then -1) and 0 is returned (block-uniform), else *src is the row's first score and 1 is returned. */
template <int NT>
static __device__ __forceinline__ int tk_row_begin(const dsa_topk_launch &a, int64_t row, int tid, int64_t *L_out,
                                                   int64_t *add_out, int32_t **out_out, const float **src_out) {
  const int k = a.k;
  const int64_t L = tk_row_len(a, row);
  int64_t add = 0, off = 0;
  if (a.starts != NULL) {
    add = a.starts[row];
    off = add - a.start_base;
  }
  int32_t *out = a.indices + row * a.indices_stride;
  if (a.out_lengths != NULL && tid == 0) a.out_lengths[row] = (int32_t)(L < k ? L : k);
  *L_out = L;
  *add_out = add;
  *out_out = out;
  if (L <= k) {
    for (int j = tid; j < k; j += NT) out[j] = j < L ? (int32_t)(j + add) : -1;
    return 0;
  }
  *src_out = a.scores + row * a.scores_stride + off;
  return 1;
}

/* Exclusive block-wide sum over the NT threads (in thread order). */
template <int NT>
static __device__ __forceinline__ int tk_block_excl_scan(int v, int *s_scan) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_scan[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < (NT / 32) ? s_scan[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < (NT / 32)) s_scan[lane] = w;
  }
  __syncthreads();
  return (warp ? s_scan[warp - 1] : 0) + x - v;
}

/* After a histogram pass over nb bins (digit = (value >> shift) & (nb - 1)): finds the bin holding
 * the rem-th largest matching value, extends prefix with it and makes rem relative to the bin.
 * Ends with a barrier; every thread returns the same prefix / rem. *nc gets the bin's count. */
template <int NT>
static __device__ __forceinline__ void tk_find_bin(int nb, int shift, uint32_t &prefix, int &rem,
                                                   int &nc, const int *s_hist, int *s_scan,
                                                   uint32_t *s_prefix, int *s_rem, int *s_nc) {
  const int tid = threadIdx.x;
  const int bpt = nb / NT;
  const int hi = nb - tid * bpt;
  int sum = 0;
  for (int i = 0; i < bpt; ++i) sum += s_hist[hi - 1 - i];
  int cum = tk_block_excl_scan<NT>(sum, s_scan);
  for (int i = 0; i < bpt; ++i) {
    const int b = hi - 1 - i;
    const int h = s_hist[b];
    if (cum < rem && cum + h >= rem) {
      *s_prefix = prefix | ((uint32_t)b << shift);
      *s_rem = rem - cum;
      *s_nc = h;
    }
    cum += h;
  }
  __syncthreads();
  prefix = *s_prefix;
  rem = *s_rem;
  nc = *s_nc;
}

/* One warp's stretch [c0, c1) of a row read from global memory (the radix kernel's streaming path and
 * the filter kernel's fallback): the count of keys > thr and == thr (ballots, any lane order). */
static __device__ __forceinline__ void tk_count_stretch(const float *__restrict__ src, int64_t c0, int64_t c1, uint32_t thr,
                                                        int lane, long long *n_gt, long long *n_eq) {
  long long gt = 0, eq = 0;
  for (int64_t base = c0; base < c1; base += 32) {
    const int64_t c = base + lane;
    const uint32_t key = c < c1 ? tk_key(__ldg(src + c)) : 0u;
    gt += __popc(__ballot_sync(0xffffffffu, c < c1 && key > thr));
    eq += __popc(__ballot_sync(0xffffffffu, c < c1 && key == thr));
  }
  *n_gt = gt;
  *n_eq = eq;
}

/* Emits one warp's stretch [c0, c1) in column order: every key > thr and the first need_eq keys ==
 * thr of the row, at out[gt before + min(eq before, need_eq)]; gt_before / eq_before count both kinds
 * in the row before c0. Keys from the shared cache (cache) or global memory. Stops when the row is
 * complete (count_gt greater, need_eq equal emitted: warp-uniform). */
static __device__ __forceinline__ void tk_emit_stretch(const float *__restrict__ src, const uint32_t *s_keys, bool cache,
                                                       int64_t c0, int64_t c1, uint32_t thr, long long count_gt,
                                                       long long need_eq, long long gt_before, long long eq_before,
                                                       int32_t *out, int64_t add, int lane) {
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t base = c0; base < c1; base += 32) {
    if (gt_before == count_gt && eq_before >= need_eq) break; /* warp-uniform: all emitted */
    const int64_t c = base + lane;
    uint32_t key = 0;
    if (c < c1) key = cache ? s_keys[c] : tk_key(__ldg(src + c));
    const bool is_gt = c < c1 && key > thr;
    const bool is_eq = c < c1 && key == thr;
    const unsigned mgt = __ballot_sync(0xffffffffu, is_gt);
    const unsigned meq = __ballot_sync(0xffffffffu, is_eq);
    const long long e_before = eq_before + __popc(meq & lt_mask);
    if (is_gt || (is_eq && e_before < need_eq)) {
      const long long pos = gt_before + __popc(mgt & lt_mask) + (e_before < need_eq ? e_before : need_eq);
      out[pos] = (int32_t)(c + add);
    }
    gt_before += __popc(mgt);
    eq_before += __popc(meq);
  }
}

/* The filter kernel's dynamic shared memory per CTA (ck, cc, three 2048-bin histograms: 88 KB); it
 * runs two CTAs per SM. */
#define TKF_SMEM ((2 * 8192 + 3 * TK_BINS) * 4)

/* The bisection kernel's bound: the columns of a launch's rows at most (cuda/topk/topk_filter.cu). */
#define TKB_CAP 4096

/* The launchers (rows > 0): the bisection kernel (cuda/topk/topk_filter.cu; rows of at most TKB_CAP
 * columns), the filter kernel (the same file; any row length; needs TKF_SMEM of opt-in shared
 * memory) and the radix kernel (cuda/topk/topk_radix.cu; any device). */
extern "C" DSA_HIDDEN dsa_status dsa_topk_launch_bisect(const dsa_context *ctx, const dsa_topk_launch *a,
                                                       cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_topk_launch_filter(const dsa_context *ctx, const dsa_topk_launch *a,
                                                       cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_topk_launch_radix(const dsa_context *ctx, const dsa_topk_launch *a,
                                                      cudaStream_t stream);

#endif /* DSA_TOPK_COMMON_CUH */
