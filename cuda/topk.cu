/*
 * topk.cu - deterministic per-row top-k by radix select (dsa_topk and the indexer's selection).
 *
 * One kernel, one CTA (1024 threads by default, TK_THREADS_DEFAULT) per row, grid-stride over rows on
 * a 1-D grid:
 *  1. Map each fp32 score to an order-preserving uint32 key (NaN -> 0, the lowest; -0 -> +0 so the
 *     two zeros tie; sign-flip trick for the rest).
 *  2. Radix select the k-th largest key with three histogram passes of 11 + 11 + 10 bits
 *     (shared-memory histogram, block scan from the top bin). This yields the threshold T,
 *     count_gt = #keys > T and need_eq = k - count_gt (>= 1).
 *  3. Emit: every column with key > T and the first need_eq columns (in column order) with key == T.
 *     Each warp owns a contiguous stretch of columns; one counting sweep, a 16-entry scan over the
 *     warps, then an emitting sweep where ballots give each selected column its output slot. The
 *     output is therefore already in ascending column order: no sort.
 * Rows with L <= k skip all of it (0..L-1 then -1).
 *
 * Three variants of the data flow, chosen per row:
 *  - cached (L <= cache_cap, at most 48K keys = 192 KB from the device's opt-in limit): the first
 *    global read (16-byte loads when the row is aligned) fills a key cache in shared memory; every
 *    later pass reads it. One read of the row.
 *  - compaction (longer rows whose top-11-bit threshold bin fits in the same shared memory): a
 *    second read sends the certain winners (above the bin) to a staging list and the bin's
 *    (key, column) pairs to a candidate list; the last two radix digits, the tie-break (a radix
 *    select on ~column among keys equal to the threshold) and a bitonic sort of the k columns run
 *    in shared memory. Two reads. dsa_topk_compact_long_rows = 0 disables it (tests run both).
 *  - streaming (anything else, any length): every pass re-reads the row (five reads).
 * Variant bits (TK_FLAGS_DEFAULT): TK_F_CPASYNC (cached rows: the first read is cp.async straight
 * into the key cache in 4 commit groups, converted to keys in place), TK_F_HC (pass 0 counts into 4
 * lane-indexed sub-histograms), TK_F_PREFETCH (warp 0 prefetches the CTA's next row into L2),
 * TK_F_EMIT4 (cached rows emit 4 columns per lane per step with one packed warp scan), TK_F_CAND
 * (cached rows whose top-11-bit threshold bin holds <= TK_CAND_CAP keys: pass 1 gathers that bin's
 * keys into the free pass-0 sub-histograms and pass 2 counts only them), TK_F_CNT (with CAND: pass 1
 * sweeps each warp's emit stretch, counts the keys above the bin and tags each candidate with its
 * warp, so the per-warp counts before the emit need no sweep). Cached rows then read the key cache
 * twice after the first read (pass 1, emit) instead of four times (passes 1, 2, count, emit).
 * H200, median of 10, topk-32k causal/full (ms): 0.900/0.925 before; flags 2 (HC): 0.899/0.924;
 * +CPASYNC: 0.902/0.909; +PREFETCH: 0.902/0.909; + 1024 threads: 0.881/0.867; +EMIT4 (the default):
 * 0.782/0.757 (512 threads: 0.821/0.814). topk-128k: 3.37 -> 2.79 (1024 threads only). A
 * warp-aggregated pass 0 (__match_any_sync) was slower (1.44 ms, dropped). ncu on the old variant:
 * SM issue-bound (compute 52%, DRAM 9%, 7.4 warp cycles per issued instruction with 16 warps), i.e.
 * instruction count per key, not memory or same-bin atomics, is what costs.
 * Everything is integer counting, and ties are settled by column: bitwise deterministic and
 * independent of the other rows. No workspace.
 *
 * dsa_topk_variant (src/internal.h) picks the kernel: 1 = the one above; 2 and 3 = the register-resident
 * kernels further down (tkr_kernel: the row in registers, plus shared memory for 3, one read, radix
 * passes on the held keys, bitmap emit; rows of at most 32768 columns, else 1); 0 = automatic (3
 * where it applies). They exist because the kernel above is one CTA per SM whose barriers idle the
 * SM; variant 3 runs two independent rows per SM. 4 = the sampled-threshold filter (tk4_kernel, any
 * length, own section further down; the automatic choice since its first H200 run, 2026-11-29:
 * topk-32k 0.368 vs 0.464 ms for variant 3, topk-128k 0.842 vs 2.647 ms for variant 1): a strided sample of 1/32 of the row (16-byte
 * vectors) gives a threshold that ~4096 keys pass, one 16-byte-load read keeps the keys >= it as
 * (value, column) candidates in shared memory (one compare per key, a warp scan and one shared atomic
 * per 16 keys per lane), then the exact radix select and the bitmap emit of variant 3 run on the
 * candidates only; rows whose candidates miss k or overflow the 8192 slots redo the exact select
 * from global memory in the same CTA. Instruction count (SASS of the filtering loop, sm_90a): 191
 * per 16 keys per thread, ~12 per key (2.4 compare + mask, 4 predicated appends executed for every
 * key, ~2.5 warp scan / reservation / loop, 0.25 loads), against ~20 plus three shared atomics with
 * same-bin conflicts for the radix passes over every key. Prediction (H200, 132 SMs x 4 schedulers at
 * ~1.75 GHz = 9.2e11 warp instructions/s, copy 4.2 TB/s): topk-32k issues 4096 x 32768 x 12 / 32 =
 * 5.0e7 warp instructions for the filter (55 us) plus ~10k per row for the sample, select and emit
 * (4.1e7, 45 us; ~22 barriers per row, hidden by the SM's other CTA while it streams) under the
 * 128 us of DRAM time: ~0.15-0.20 ms (variant 3: 0.464); topk-128k 2.0e8 + 0.5e8 warp
 * instructions (~270 us) under 511 us of DRAM time: ~0.55-0.65 ms (variant 1: 2.64). Measured on
 * the H200 (2026-11-29): 0.345 and 0.842 ms; the automatic choice since. The "~22 barriers per row,
 * hidden by the other CTA" part of the model is what failed: DRAM runs at 37% of its peak.
 * The same kernel serves the indexer: `starts` gives each row a column offset
 * (starts[r] - start_base) into the scores row and adds starts[r] to every emitted column (global
 * key coordinates); `scores` may be NULL when every row is known to have L <= k.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include "internal.h"

#define TK_HC 4                         /* pass-0 sub-histograms (lane & 3): fewer same-bin conflicts */
#define TK_GROUPS 4                     /* cp.async commit groups of a cached row (load/compute overlap) */
#define TK_BINS 2048                    /* 11-bit digits: three passes cover 32 bits */
#define TK_UNROLL 16                    /* independent global loads in flight per thread */
#define TK_MAX_CACHE_KEYS (48 * 1024)   /* 192 KB of cached keys at most (H200 opt-in: 227 KB) */

static __device__ __forceinline__ uint32_t tk_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (f != f) return 0u;            /* NaN: below -inf (whose key is 0x007FFFFF) */
  if (u == 0x80000000u) u = 0u;     /* -0 and +0 are equal scores */
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#define TK_F_CPASYNC 1 /* cached rows: first read by cp.async straight into shared memory */
#define TK_F_HC 2      /* pass 0 counts into TK_HC sub-histograms */
#define TK_F_PREFETCH 4 /* prefetch the CTA's next row into L2 (cp.async.bulk.prefetch) */

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

static __device__ __forceinline__ void tk_cp_async16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#endif
}
static __device__ __forceinline__ void tk_cp_async_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* waits until at most (MAXP - g) groups are pending, g = 0..MAXP (unrolled callers) */
template <int MAXP>
static __device__ __forceinline__ void tk_cp_async_wait(int g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (MAXP - g) {
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
  }
#endif
}

#define TK_F_EMIT4 16 /* cached rows: emit 4 columns per lane per step */
#define TK_F_CAND 32  /* cached rows: pass 1 gathers the threshold bin's keys, pass 2 reads only them */
#define TK_CAND_CAP ((TK_HC - 1) * TK_BINS) /* candidate keys: the pass-0 sub-histograms 1.. (free then) */
#define TK_F_V4 128   /* uncached rows: 16-byte loads in pass 0 (aligned rows); the compaction read skips
                       * the ballots of warp steps with nothing to keep (__any_sync) */
#define TK_F_CNT 64   /* with TK_F_CAND: pass 1 sweeps each warp's emit stretch and, with the candidates
                       * (tagged with the warp), yields the per-warp counts: no counting sweep */

/* Pass 1 of TK_F_CNT (shift 10, 11 bits, higher digit want = b0): counts the key's digit and gathers
 * it when it is in bin b0, as its low 21 bits | wtag (the warp in bits 21..; the top 11 bits are
 * b0 for every candidate); returns 1 when the key is above bin b0 (certainly selected). */
static __device__ __forceinline__ int tk_count_key_cnt(uint32_t key, uint32_t want, int *s_hist,
                                                       int *s_cand, int *s_ncand, uint32_t wtag) {
  const uint32_t d = key >> 21;
  if (d == want) {
    atomicAdd(&s_hist[(key >> 10) & (TK_BINS - 1)], 1);
    s_cand[atomicAdd(s_ncand, 1)] = (int)((key & 0x1FFFFFu) | wtag);
  }
  return d > want;
}

/* One key of a later radix pass over the cache: count its digit when its higher digits match; in
 * pass 1 with TK_F_CAND also append it (as an int, no type punning) to the candidate list at
 * s_cand (the order of the list does not matter: pass 2 only counts). */
static __device__ __forceinline__ void tk_count_key(uint32_t key, int hi_shift, uint32_t want,
                                                    int shift, int nb, int *s_hist, bool gather,
                                                    int *s_cand, int *s_ncand) {
  if ((key >> hi_shift) == want) {
    atomicAdd(&s_hist[(key >> shift) & (nb - 1)], 1);
    if (gather) s_cand[atomicAdd(s_ncand, 1)] = (int)key;
  }
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

/* Ascending bitonic sort of buf[0..n), n a power of two <= 2048, by the whole block. */
template <int NT>
static __device__ __forceinline__ void tk_bitonic_sort(uint32_t *buf, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n / 2; i += NT) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool asc = (lo & size) == 0;
        const uint32_t x = buf[lo], y = buf[hi];
        if ((x > y) == asc) {
          buf[lo] = y;
          buf[hi] = x;
        }
      }
      __syncthreads();
    }
}

#define TK_OBUF 2048 /* output staging entries of the compaction path (>= any k, a power of two) */

/* Rows too long for the key cache, after the first histogram pass found the top-11-bit bin b0 of
 * the k-th largest key (prefix, rem = its rank inside the bin): one more read of the row sends the
 * columns of every key above b0 (certainly selected, fewer than k) to obuf and the (key, column)
 * of every key in b0 to a candidate list in shared memory; the remaining two radix passes, the
 * tie-break (the need_eq smallest columns among keys equal to the threshold, by a radix select on
 * ~column) and the final ascending sort of the k columns all run in shared memory. Two reads of
 * the row instead of five. The candidates must fit: TK_OBUF + 2 * |b0| <= cache_cap words. */
template <int NT>
static __device__ void tk_compact_rest(const float *__restrict__ src, int64_t L, int k, int64_t add,
                                       int32_t *out, uint32_t prefix, int rem, int64_t cache_cap,
                                       uint32_t *s_keys, int *s_hist, int *s_scan, uint32_t *s_prefix,
                                       int *s_rem, int *s_nc, int *s_nsel, int *s_ncand, int flags) {
  const int tid = threadIdx.x, lane = tid & 31;
  const unsigned lt_mask = (1u << lane) - 1u;
  uint32_t *obuf = s_keys;              /* [TK_OBUF] selected columns */
  const int nc = *s_nc;                 /* candidates in bin b0 (read before anyone rewrites it) */
  uint32_t *ckey = s_keys + TK_OBUF;    /* [nc] */
  uint32_t *ccol = ckey + nc;           /* [nc] */
  const uint32_t b0 = prefix >> 21;
  int dummy;
  (void)cache_cap;
  __syncthreads(); /* everyone has read *s_nc */
  if (tid == 0) {
    *s_nsel = 0;
    *s_ncand = 0;
  }
  __syncthreads();
  for (int64_t base = 0; base < L; base += (int64_t)NT * TK_UNROLL) {
    float v[TK_UNROLL];
#pragma unroll
    for (int j = 0; j < TK_UNROLL; ++j) {
      const int64_t c = base + (int64_t)j * NT + tid;
      v[j] = c < L ? __ldg(src + c) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < TK_UNROLL; ++j) {
      const int64_t c = base + (int64_t)j * NT + tid;
      const uint32_t key = tk_key(v[j]);
      const bool is_sel = c < L && (key >> 21) > b0;
      const bool is_cand = c < L && (key >> 21) == b0;
      /* warp-uniform: most steps keep nothing (the whole loop nest is warp-uniform) */
      if ((flags & TK_F_V4) && !__any_sync(0xffffffffu, is_sel || is_cand)) continue;
      const unsigned ms = __ballot_sync(0xffffffffu, is_sel), mc = __ballot_sync(0xffffffffu, is_cand);
      int bs = 0, bc = 0;
      if (lane == 0) {
        if (ms) bs = atomicAdd(s_nsel, __popc(ms));
        if (mc) bc = atomicAdd(s_ncand, __popc(mc));
      }
      bs = __shfl_sync(0xffffffffu, bs, 0);
      bc = __shfl_sync(0xffffffffu, bc, 0);
      if (is_sel) obuf[bs + __popc(ms & lt_mask)] = (uint32_t)c;
      if (is_cand) {
        const int i = bc + __popc(mc & lt_mask);
        ckey[i] = key;
        ccol[i] = (uint32_t)c;
      }
    }
  }
  __syncthreads();
  /* the threshold key: two more digits over the candidates */
  for (int pass = 1; pass < 3; ++pass) {
    const int shift = pass == 1 ? 10 : 0, bits = pass == 1 ? 11 : 10, nb = 1 << bits;
    const int hi_shift = shift + bits;
    for (int b = tid; b < TK_BINS; b += NT) s_hist[b] = 0;
    __syncthreads();
    for (int i = tid; i < nc; i += NT) {
      const uint32_t key = ckey[i];
      if ((key >> hi_shift) == (prefix >> hi_shift)) atomicAdd(&s_hist[(key >> shift) & (nb - 1)], 1);
    }
    __syncthreads();
    tk_find_bin<NT>(nb, shift, prefix, rem, dummy, s_hist, s_scan, s_prefix, s_rem, s_nc);
  }
  const uint32_t thr = prefix;
  /* among keys == thr take the rem smallest columns: the rem-th largest ~column */
  uint32_t cpre = 0;
  int crem = rem;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0), bits = pass == 2 ? 10 : 11, nb = 1 << bits;
    const int hi_shift = shift + bits;
    for (int b = tid; b < TK_BINS; b += NT) s_hist[b] = 0;
    __syncthreads();
    for (int i = tid; i < nc; i += NT) {
      if (ckey[i] != thr) continue;
      const uint32_t v = ~ccol[i];
      if (pass == 0 || (v >> hi_shift) == (cpre >> hi_shift)) atomicAdd(&s_hist[(v >> shift) & (nb - 1)], 1);
    }
    __syncthreads();
    tk_find_bin<NT>(nb, shift, cpre, crem, dummy, s_hist, s_scan, s_prefix, s_rem, s_nc);
  }
  /* gather the selected candidates after the certain ones (*s_nsel of them so far) */
  for (int base = 0; base < nc; base += NT) {
    const int i = base + tid;
    bool sel = false;
    uint32_t col = 0;
    if (i < nc) {
      const uint32_t key = ckey[i];
      col = ccol[i];
      sel = key > thr || (key == thr && ~col >= cpre);
    }
    const unsigned m = __ballot_sync(0xffffffffu, sel);
    int b = 0;
    if (lane == 0 && m) b = atomicAdd(s_nsel, __popc(m));
    b = __shfl_sync(0xffffffffu, b, 0);
    if (sel) obuf[b + __popc(m & lt_mask)] = col;
  }
  __syncthreads();
  int n2 = 1;
  while (n2 < k) n2 <<= 1;
  for (int i = k + tid; i < n2; i += NT) obuf[i] = 0xffffffffu;
  __syncthreads();
  tk_bitonic_sort<NT>(obuf, n2);
  for (int j = tid; j < k; j += NT) out[j] = (int32_t)(obuf[j] + add);
  __syncthreads(); /* shared state is reused by the next row */
}

/* One warp's stretch [c0, c1) of a row read from global memory (the streaming paths of variant 1 and
 * variant 4's fallback): the count of keys > thr and == thr (ballots, any lane order). */
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

template <int NT>
static __global__ void __launch_bounds__(NT)
tk_radix_kernel(dsa_topk_launch a, int64_t cache_cap, int compact_ok, int flags) {
  extern __shared__ __align__(16) uint32_t s_keys[]; /* [cache_cap] cached keys of the current row */
  __shared__ int s_hist[TK_HC * TK_BINS]; /* pass 0: TK_HC sub-histograms; later: the first */
  __shared__ int s_scan[(NT / 32)];
  __shared__ long long s_wgt[(NT / 32)], s_weq[(NT / 32)];
  __shared__ int s_cgt[(NT / 32)], s_ceq[(NT / 32)]; /* TK_F_CNT per-warp counts */
  __shared__ uint32_t s_prefix;
  __shared__ int s_rem, s_nc, s_nsel, s_ncand;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k = a.k;
  int *const hp = s_hist + ((flags & TK_F_HC) ? (lane & (TK_HC - 1)) * TK_BINS : 0); /* pass-0 copy */

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    int64_t L, add;
    int32_t *out;
    const float *src;
    if (!tk_row_begin<NT>(a, row, tid, &L, &add, &out, &src)) continue; /* L <= k: written; block-uniform */
    const bool cache = L <= cache_cap;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if ((flags & TK_F_PREFETCH) && warp == 0 && row + gridDim.x < a.rows) {
      /* pull the CTA's next row into L2 while this one is worked on (whole 16-byte granules
       * inside the row, 32 KB per instruction) */
      const int64_t nr = row + gridDim.x;
      const int64_t nL = tk_row_len(a, nr);
      int64_t noff = 0;
      if (a.starts != NULL) noff = a.starts[nr] - a.start_base;
      if (nL > k) {
        const uintptr_t p0 = (uintptr_t)(a.scores + nr * a.scores_stride + noff);
        const uintptr_t b0 = (p0 + 15) & ~(uintptr_t)15, b1 = (p0 + (uintptr_t)nL * 4) & ~(uintptr_t)15;
        for (uintptr_t p = b0 + (uintptr_t)lane * 32768; p < b1; p += 32 * 32768) {
          const unsigned n = (unsigned)(b1 - p < 32768 ? b1 - p : 32768);
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(n) : "memory");
        }
      }
    }
#endif

    /* the emit stretch of this warp: columns [c0, c1), a multiple of 32 wide (c1 < c0 possible) */
    const int64_t per_warp = ((L + (NT / 32) * 32 - 1) / ((NT / 32) * 32)) * 32;
    const int64_t c0 = (int64_t)warp * per_warp;
    const int64_t c1 = c0 + per_warp < L ? c0 + per_warp : L;

    /* ---- radix select of the k-th largest key ---- */
    uint32_t prefix = 0;
    int rem = k;
    bool compact = false;
    int cand_n = -1; /* >= 0: pass 1 gathers (and pass 2 reads) this many candidate keys */
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
      const int bits = pass == 2 ? 10 : 11;
      const int nb = 1 << bits;
      const int hi_shift = shift + bits; /* 32 (unused), 21, 10 */
      {
        const int nz = (pass == 0 ? TK_HC : 1) * TK_BINS;
        for (int b = tid; b < nz; b += NT) s_hist[b] = 0;
        if (pass == 1 && tid == 0) s_ncand = 0;
      }
      __syncthreads();
      if (pass == 0 && cache && ((uintptr_t)src & 15) == 0 && (flags & TK_F_CPASYNC)) {
        /* the common first pass: the whole row goes to the key cache by cp.async (all of it in
         * flight at once, no register staging) in TK_GROUPS commit groups; each group is turned
         * into keys and counted in place while the later groups are still landing */
        const int64_t n4 = L >> 2;
        const int64_t q4 = (n4 + TK_GROUPS - 1) / TK_GROUPS;
        const float4 *s4 = (const float4 *)src;
        uint4 *k4 = (uint4 *)s_keys;
#pragma unroll
        for (int g = 0; g < TK_GROUPS; ++g) {
          const int64_t e = (g + 1) * q4 < n4 ? (g + 1) * q4 : n4;
          for (int64_t i = g * q4 + tid; i < e; i += NT) tk_cp_async16(k4 + i, s4 + i);
          tk_cp_async_commit();
        }
        for (int64_t c = (n4 << 2) + tid; c < L; c += NT) {
          const uint32_t key = tk_key(__ldg(src + c));
          s_keys[c] = key;
          atomicAdd(&hp[key >> 21], 1);
        }
#pragma unroll
        for (int g = 0; g < TK_GROUPS; ++g) {
          tk_cp_async_wait<TK_GROUPS - 1>(g);
          __syncthreads();
          const int64_t e = (g + 1) * q4 < n4 ? (g + 1) * q4 : n4;
          for (int64_t i = g * q4 + tid; i < e; i += NT) {
            const float4 v = *(const float4 *)(k4 + i);
            const uint4 kk = make_uint4(tk_key(v.x), tk_key(v.y), tk_key(v.z), tk_key(v.w));
            k4[i] = kk;
            atomicAdd(&hp[kk.x >> 21], 1);
            atomicAdd(&hp[kk.y >> 21], 1);
            atomicAdd(&hp[kk.z >> 21], 1);
            atomicAdd(&hp[kk.w >> 21], 1);
          }
        }
      } else if (pass == 0 && cache && ((uintptr_t)src & 15) == 0) {
        /* 16-byte loads through registers into the key cache */
        const int64_t n4 = L >> 2;
        const float4 *s4 = (const float4 *)src;
        uint4 *k4 = (uint4 *)s_keys;
        for (int64_t base = 0; base < n4; base += (int64_t)NT * 4) {
          float4 v[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t i = base + (int64_t)j * NT + tid;
            v[j] = i < n4 ? __ldg(s4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t i = base + (int64_t)j * NT + tid;
            if (i < n4) {
              const uint4 kk = make_uint4(tk_key(v[j].x), tk_key(v[j].y), tk_key(v[j].z), tk_key(v[j].w));
              k4[i] = kk;
              atomicAdd(&hp[kk.x >> 21], 1);
              atomicAdd(&hp[kk.y >> 21], 1);
              atomicAdd(&hp[kk.z >> 21], 1);
              atomicAdd(&hp[kk.w >> 21], 1);
            }
          }
        }
        for (int64_t c = (n4 << 2) + tid; c < L; c += NT) {
          const uint32_t key = tk_key(__ldg(src + c));
          s_keys[c] = key;
          atomicAdd(&hp[key >> 21], 1);
        }
      } else if (pass == 0 && !cache && ((uintptr_t)src & 15) == 0 && (flags & TK_F_V4)) {
        /* uncached first pass: 16-byte loads (4 in flight per thread, as the cached variant) */
        const int64_t n4 = L >> 2;
        const float4 *s4 = (const float4 *)src;
        for (int64_t base = 0; base < n4; base += (int64_t)NT * 4) {
          float4 v[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t i = base + (int64_t)j * NT + tid;
            v[j] = i < n4 ? __ldg(s4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t i = base + (int64_t)j * NT + tid;
            if (i < n4) {
              atomicAdd(&hp[tk_key(v[j].x) >> 21], 1);
              atomicAdd(&hp[tk_key(v[j].y) >> 21], 1);
              atomicAdd(&hp[tk_key(v[j].z) >> 21], 1);
              atomicAdd(&hp[tk_key(v[j].w) >> 21], 1);
            }
          }
        }
        for (int64_t c = (n4 << 2) + tid; c < L; c += NT) atomicAdd(&hp[tk_key(__ldg(src + c)) >> 21], 1);
      } else if (pass == 0 || !cache) {
        for (int64_t base = 0; base < L; base += (int64_t)NT * TK_UNROLL) {
          float v[TK_UNROLL];
#pragma unroll
          for (int j = 0; j < TK_UNROLL; ++j) {
            int64_t c = base + (int64_t)j * NT + tid;
            v[j] = c < L ? __ldg(src + c) : 0.0f;
          }
#pragma unroll
          for (int j = 0; j < TK_UNROLL; ++j) {
            int64_t c = base + (int64_t)j * NT + tid;
            if (c < L) {
              uint32_t key = tk_key(v[j]);
              if (pass == 0) {
                if (cache) s_keys[c] = key;
                atomicAdd(&hp[key >> 21], 1);
              } else if ((key >> hi_shift) == (prefix >> hi_shift)) {
                atomicAdd(&s_hist[(key >> shift) & (nb - 1)], 1);
              }
            }
          }
        }
      } else if (pass == 1 && cand_n >= 0 && (flags & TK_F_CNT)) {
        /* pass 1 over this warp's emit stretch (4 keys per lane per step, as the counting sweep
         * did): digit histogram, candidates tagged with the warp, and the keys above bin b0 */
        const uint32_t want = prefix >> hi_shift; /* b0 */
        const uint32_t wtag = (uint32_t)warp << 21;
        int *const s_cand = s_hist + TK_BINS;
        const int e1 = (int)c1;
        int above = 0;
        for (int c = (int)c0 + lane * 4; c < e1; c += 128) {
          if (c + 4 <= e1) {
            const uint4 kk = *(const uint4 *)(s_keys + c);
            above += tk_count_key_cnt(kk.x, want, s_hist, s_cand, &s_ncand, wtag);
            above += tk_count_key_cnt(kk.y, want, s_hist, s_cand, &s_ncand, wtag);
            above += tk_count_key_cnt(kk.z, want, s_hist, s_cand, &s_ncand, wtag);
            above += tk_count_key_cnt(kk.w, want, s_hist, s_cand, &s_ncand, wtag);
          } else {
            for (int cc = c; cc < e1; ++cc) above += tk_count_key_cnt(s_keys[cc], want, s_hist, s_cand, &s_ncand, wtag);
          }
        }
        above = (int)__reduce_add_sync(0xffffffffu, (unsigned)above);
        if (lane == 0) {
          s_cgt[warp] = above;
          s_ceq[warp] = 0;
        }
      } else if (pass == 2 && cand_n >= 0) {
        /* the last pass over the cand_n keys of the top-11-bit bin that pass 1 gathered (every key
         * the full sweep would count is among them: same histogram, ~1/30 of the reads); the
         * top 11 bits of each are b0 (TK_F_CNT stores only the low 21 bits) */
        const uint32_t want = prefix >> hi_shift, top = prefix & 0xFFE00000u;
        const int *s_cand = s_hist + TK_BINS;
        for (int i = tid; i < cand_n; i += NT)
          tk_count_key(top | ((uint32_t)s_cand[i] & 0x1FFFFFu), hi_shift, want, shift, nb, s_hist, false,
                       NULL, NULL);
      } else {
        /* later passes over the cache: 4 keys per 16-byte shared read (32-bit indices: a cached
         * row has at most TK_MAX_CACHE_KEYS keys); pass 1 with cand_n >= 0 also gathers the keys
         * of the top-11-bit bin (exactly cand_n of them: pass 0 counted the same cached keys) */
        const uint32_t want = prefix >> hi_shift;
        const bool gather = pass == 1 && cand_n >= 0;
        int *const s_cand = s_hist + TK_BINS;
        const int n4 = (int)(L >> 2), nl = (int)L;
        const uint4 *k4 = (const uint4 *)s_keys;
        for (int i = tid; i < n4; i += NT) {
          const uint4 kk = k4[i];
          tk_count_key(kk.x, hi_shift, want, shift, nb, s_hist, gather, s_cand, &s_ncand);
          tk_count_key(kk.y, hi_shift, want, shift, nb, s_hist, gather, s_cand, &s_ncand);
          tk_count_key(kk.z, hi_shift, want, shift, nb, s_hist, gather, s_cand, &s_ncand);
          tk_count_key(kk.w, hi_shift, want, shift, nb, s_hist, gather, s_cand, &s_ncand);
        }
        for (int c = (n4 << 2) + tid; c < nl; c += NT)
          tk_count_key(s_keys[c], hi_shift, want, shift, nb, s_hist, gather, s_cand, &s_ncand);
      }
      __syncthreads();
      if (pass == 0) { /* fold the sub-histograms into the first */
        for (int b = tid; b < TK_BINS; b += NT) {
          int t = 0;
#pragma unroll
          for (int c = 1; c < TK_HC; ++c) t += s_hist[c * TK_BINS + b];
          s_hist[b] += t;
        }
        __syncthreads();
      }
      /* Thread t owns bins [nb - (t+1)*bpt, nb - t*bpt): thread 0 the top ones, so an exclusive
       * scan in thread order counts the matching keys in higher bins. */
      const int bpt = nb / NT;
      const int hi = nb - tid * bpt;
      int sum = 0;
      for (int i = 0; i < bpt; ++i) sum += s_hist[hi - 1 - i];
      int cum = tk_block_excl_scan<NT>(sum, s_scan);
      for (int i = 0; i < bpt; ++i) {
        const int b = hi - 1 - i;
        const int h = s_hist[b];
        if (cum < rem && cum + h >= rem) {
          s_prefix = prefix | ((uint32_t)b << shift);
          s_rem = rem - cum;
          s_nc = h;
        }
        cum += h;
      }
      __syncthreads();
      prefix = s_prefix;
      rem = s_rem;
      /* block-uniform; s_nc (the bin's count) is not rewritten before pass 1's find-bin, which
       * follows two more barriers */
      if (pass == 0 && cache && (flags & TK_F_CAND) && s_nc <= TK_CAND_CAP) cand_n = s_nc;
      if (pass == 0 && !cache && compact_ok && TK_OBUF + 2 * (int64_t)s_nc <= cache_cap) {
        compact = true; /* block-uniform */
        break;
      }
    }
    if (compact) {
      tk_compact_rest<NT>(src, L, k, add, out, prefix, rem, cache_cap, s_keys, s_hist, s_scan, &s_prefix,
                      &s_rem, &s_nc, &s_nsel, &s_ncand, flags);
      continue;
    }
    const uint32_t thr = prefix;
    const long long need_eq = rem, count_gt = k - rem;

    /* ---- emit in column order: warp w owns columns [c0, c1) (defined above) ---- */
    long long gt_before = 0, eq_before = 0;
    if (cand_n >= 0 && (flags & TK_F_CNT)) {
      /* per-warp counts without a sweep: the keys above bin b0 (pass 1 put them in s_cgt) plus the
       * candidates above / equal to thr, each counted for the warp whose stretch it came from */
      const int *s_cand = s_hist + TK_BINS;
      const uint32_t top = thr & 0xFFE00000u;
      for (int i = tid; i < cand_n; i += NT) {
        const uint32_t v = (uint32_t)s_cand[i], key = top | (v & 0x1FFFFFu);
        if (key > thr)
          atomicAdd(&s_cgt[v >> 21], 1);
        else if (key == thr)
          atomicAdd(&s_ceq[v >> 21], 1);
      }
      __syncthreads();
      for (int w = 0; w < warp; ++w) {
        gt_before += s_cgt[w];
        eq_before += s_ceq[w];
      }
    } else {
      long long n_gt = 0, n_eq = 0;
      if (cache) { /* counts only: any order, 4 keys per 16-byte read (c0 is a multiple of 32) */
        int cgt = 0, ceq = 0;
        for (int64_t c = c0 + lane * 4; c < c1; c += 128) {
          if (c + 4 <= c1) {
            const uint4 kk = *(const uint4 *)(s_keys + c);
            cgt += (kk.x > thr) + (kk.y > thr) + (kk.z > thr) + (kk.w > thr);
            ceq += (kk.x == thr) + (kk.y == thr) + (kk.z == thr) + (kk.w == thr);
          } else {
            for (int64_t cc = c; cc < c1; ++cc) {
              cgt += s_keys[cc] > thr;
              ceq += s_keys[cc] == thr;
            }
          }
        }
        n_gt = (long long)__reduce_add_sync(0xffffffffu, (unsigned)cgt);
        n_eq = (long long)__reduce_add_sync(0xffffffffu, (unsigned)ceq);
      } else {
        tk_count_stretch(src, c0, c1, thr, lane, &n_gt, &n_eq);
      }
      if (lane == 0) {
        s_wgt[warp] = n_gt;
        s_weq[warp] = n_eq;
      }
      __syncthreads();
      for (int w = 0; w < warp; ++w) {
        gt_before += s_wgt[w];
        eq_before += s_weq[w];
      }
    }
    if (cache && (flags & TK_F_EMIT4)) {
      /* 4 consecutive columns per lane (one 16-byte shared read), 128 per warp step; one packed
       * (gt | eq << 16) warp scan gives each lane its counts before it; 32-bit arithmetic (a
       * cached row has at most TK_MAX_CACHE_KEYS columns) */
      const uint4 *k4 = (const uint4 *)s_keys;
      const int cgt = (int)count_gt, neq = (int)need_eq, e1 = (int)c1;
      int gtb = (int)gt_before, eqb = (int)eq_before;
      for (int base = (int)c0; base < e1; base += 128) {
        if (gtb == cgt && eqb >= neq) break; /* warp-uniform: all emitted */
        const int c = base + lane * 4;
        uint4 kk = make_uint4(0u, 0u, 0u, 0u);
        if (c < e1) kk = k4[c >> 2];
        const uint32_t kv[4] = {kk.x, kk.y, kk.z, kk.w};
        unsigned gm = 0, em = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          gm |= (unsigned)(c + j < e1 && kv[j] > thr) << j;
          em |= (unsigned)(c + j < e1 && kv[j] == thr) << j;
        }
        const int packed = __popc(gm) | (__popc(em) << 16);
        int incl = packed;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int y = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += y;
        }
        const int excl = incl - packed;
        int g = gtb + (excl & 0xffff), e = eqb + (excl >> 16);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if ((gm >> j) & 1u) {
            out[g + (e < neq ? e : neq)] = (int32_t)(c + j + add);
            ++g;
          } else if ((em >> j) & 1u) {
            if (e < neq) out[g + e] = (int32_t)(c + j + add);
            ++e;
          }
        }
        const int tot = __shfl_sync(0xffffffffu, incl, 31);
        gtb += tot & 0xffff;
        eqb += tot >> 16;
      }
      __syncthreads(); /* shared state is reused by the next row */
      continue;
    }
    tk_emit_stretch(src, s_keys, cache, c0, c1, thr, count_gt, need_eq, gt_before, eq_before, out, add, lane);
    __syncthreads(); /* shared state is reused by the next row */
  }
}

/* ---- register-resident variants (dsa_topk_variant 2 and 3; rows of at most TKR_MAX_COLS) ----
 * The row lives in registers (and, for variant 3, half of it in shared memory), one read of the
 * scores, no key cache sweep: thread t holds the float4 slots q = j * NT + t, j < VR in registers and
 * VR <= j < VR + VS in shared memory, i.e. columns 4q..4q+3 (coalesced 16-byte loads, all in flight
 * at once). Columns >= L ("pads") take key 0 (NaN's); pass 0 does not count them one by one (a whole
 * warp of pads would pile 32 atomics on bin 0) but thread 0 adds their number to bin 0, and passes
 * 1 and 2 count them as ordinary keys. They can never be selected: L > k valid keys are >= 0 and
 * have smaller columns. Three radix passes (11 + 11 + 10 bits) histogram the keys straight from
 * registers / shared memory; the emit marks the selected keys in two bitmaps (key > T, key == T;
 * bit c % 32 of word c / 32), one block scan of (popc gt, popc eq) over the words in column order
 * gives each word its output slot and its share of the need_eq ties (smallest columns first): the
 * output comes out ascending with ~2 bits per word to write.
 *  - variant 2: 1024 threads x 32 keys in registers, one CTA per SM (64 registers per thread);
 *  - variant 3: 512 threads x (16 keys in registers + 16 in shared memory, 64 KB), two CTAs per SM
 *    so one CTA's barriers and load latency overlap the other's work. */
#define TKR_MAX_COLS 32768 /* NT * (VR + VS) * 4 of both instantiations */

/* the 4 keys of float4 slot c / 4 (c = 4q); columns >= Li give key 0 */
static __device__ __forceinline__ uint4 tkr_load4(const float *__restrict__ src, int c, int Li, bool vec) {
  if (vec && c + 4 <= Li) {
    const float4 v = __ldg((const float4 *)(src + c));
    return make_uint4(tk_key(v.x), tk_key(v.y), tk_key(v.z), tk_key(v.w));
  }
  uint4 r;
  r.x = c < Li ? tk_key(__ldg(src + c)) : 0u;
  r.y = c + 1 < Li ? tk_key(__ldg(src + c + 1)) : 0u;
  r.z = c + 2 < Li ? tk_key(__ldg(src + c + 2)) : 0u;
  r.w = c + 3 < Li ? tk_key(__ldg(src + c + 3)) : 0u;
  return r;
}
/* pass 0 of one slot: top 11 bits; full (warp-uniform): the warp's 128 columns are all < Li */
static __device__ __forceinline__ void tkr_hist0(uint4 kk, int c, int Li, bool full, int *h) {
  if (full) {
    atomicAdd(&h[kk.x >> 21], 1);
    atomicAdd(&h[kk.y >> 21], 1);
    atomicAdd(&h[kk.z >> 21], 1);
    atomicAdd(&h[kk.w >> 21], 1);
  } else {
    if (c < Li) atomicAdd(&h[kk.x >> 21], 1);
    if (c + 1 < Li) atomicAdd(&h[kk.y >> 21], 1);
    if (c + 2 < Li) atomicAdd(&h[kk.z >> 21], 1);
    if (c + 3 < Li) atomicAdd(&h[kk.w >> 21], 1);
  }
}
/* passes 1 and 2: count digit (key >> shift) & mask of the keys whose bits above hs equal want */
static __device__ __forceinline__ void tkr_hist(uint4 kk, int hs, uint32_t want, int shift, uint32_t mask,
                                                int *h) {
  if ((kk.x >> hs) == want) atomicAdd(&h[(kk.x >> shift) & mask], 1);
  if ((kk.y >> hs) == want) atomicAdd(&h[(kk.y >> shift) & mask], 1);
  if ((kk.z >> hs) == want) atomicAdd(&h[(kk.z >> shift) & mask], 1);
  if ((kk.w >> hs) == want) atomicAdd(&h[(kk.w >> shift) & mask], 1);
}
/* emit marks of one slot q (word q / 8, nibble q % 8) */
static __device__ __forceinline__ void tkr_mark(uint4 kk, uint32_t thr, int q, uint32_t *s_g, uint32_t *s_e) {
  const unsigned g = (unsigned)(kk.x > thr) | ((unsigned)(kk.y > thr) << 1) | ((unsigned)(kk.z > thr) << 2) |
                     ((unsigned)(kk.w > thr) << 3);
  const unsigned e = (unsigned)(kk.x == thr) | ((unsigned)(kk.y == thr) << 1) | ((unsigned)(kk.z == thr) << 2) |
                     ((unsigned)(kk.w == thr) << 3);
  const int sh = (q & 7) * 4;
  if (g) atomicOr(&s_g[q >> 3], g << sh);
  if (e) atomicOr(&s_e[q >> 3], e << sh);
}

/* L2 prefetch of row nr (whole 16-byte granules inside it), by one warp; nothing for rows <= k */
static __device__ __forceinline__ void tkr_prefetch_row(const dsa_topk_launch &a, int64_t nr, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t nL = tk_row_len(a, nr);
  int64_t noff = 0;
  if (a.starts != NULL) noff = a.starts[nr] - a.start_base;
  if (nL > a.k) {
    const uintptr_t p0 = (uintptr_t)(a.scores + nr * a.scores_stride + noff);
    const uintptr_t b0 = (p0 + 15) & ~(uintptr_t)15, b1 = (p0 + (uintptr_t)nL * 4) & ~(uintptr_t)15;
    for (uintptr_t p = b0 + (uintptr_t)lane * 32768; p < b1; p += 32 * 32768) {
      const unsigned n = (unsigned)(b1 - p < 32768 ? b1 - p : 32768);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(n) : "memory");
    }
  }
#else
  (void)a;
  (void)nr;
  (void)lane;
#endif
}

/* NT threads, VR float4 slots per thread in registers, VS in shared memory (dynamic, VS * NT * 16
 * bytes); every row has L <= NT * (VR + VS) * 4 (the launcher checks columns). */
template <int NT, int VR, int VS, int MINB>
static __global__ void __launch_bounds__(NT, MINB) tkr_kernel(dsa_topk_launch a) {
  constexpr int V = VR + VS;       /* float4 slots per thread */
  constexpr int NW = NT * V / 8;   /* bitmap words: 32 columns each */
  constexpr int WPT = V / 8;       /* words per thread in the emit scan */
  static_assert(V % 8 == 0 && NT % 32 == 0, "whole bitmap words per thread");
  extern __shared__ __align__(16) uint32_t tkr_smem[]; /* [VS * NT * 4] keys of slots VR.. */
  __shared__ int s_h0[TK_BINS], s_h1[TK_BINS], s_h2[TK_BINS / 2];
  __shared__ uint32_t s_g[NW], s_e[NW];
  __shared__ int s_scan[NT / 32];
  __shared__ uint32_t s_prefix;
  __shared__ int s_rem, s_nc;
  uint4 *const s_k4 = (uint4 *)tkr_smem;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k = a.k;

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    int64_t L, add;
    int32_t *out;
    const float *src;
    if (!tk_row_begin<NT>(a, row, tid, &L, &add, &out, &src)) continue; /* L <= k: written; block-uniform */
    const int Li = (int)L;                                /* <= TKR_MAX_COLS */
    const int jmax = (Li + NT * 4 - 1) / (NT * 4);        /* slots j >= jmax are all pads: skipped */
    const bool vec = ((uintptr_t)src & 15) == 0;
    if (warp == 0 && row + gridDim.x < a.rows) tkr_prefetch_row(a, row + gridDim.x, lane);

    /* the previous row's last reads of this shared state came before its emit scan's barriers */
    for (int i = tid; i < TK_BINS; i += NT) {
      s_h0[i] = 0;
      s_h1[i] = 0;
    }
    for (int i = tid; i < TK_BINS / 2; i += NT) s_h2[i] = 0;
    for (int i = tid; i < NW; i += NT) {
      s_g[i] = 0;
      s_e[i] = 0;
    }
    __syncthreads();
    if (tid == 0 && jmax * NT * 4 > Li) atomicAdd(&s_h0[0], jmax * NT * 4 - Li); /* pads of slots < jmax */

    /* ---- the one read + pass 0: the whole slots of the shared-memory part go by cp.async
     * (no registers), then the register slots are loaded (all in flight), then the shared-memory
     * slots are converted in place (each thread its own: no barrier) and counted ---- */
    if (VS > 0 && vec) {
#pragma unroll
      for (int j = 0; j < VS; ++j) {
        const int q = (VR + j) * NT + tid;
        if (VR + j < jmax && 4 * q + 4 <= Li) tk_cp_async16(s_k4 + j * NT + tid, src + 4 * q);
      }
      tk_cp_async_commit();
    }
    uint4 kr[VR];
#pragma unroll
    for (int j = 0; j < VR; ++j) {
      const int q = j * NT + tid;
      kr[j] = make_uint4(0u, 0u, 0u, 0u);
      if (j < jmax) kr[j] = tkr_load4(src, 4 * q, Li, vec);
    }
    if (VS > 0) {
      if (vec) tk_cp_async_wait<0>(0);
#pragma unroll
      for (int j = 0; j < VS; ++j) {
        const int q = (VR + j) * NT + tid;
        if (VR + j < jmax) {
          uint4 kk;
          if (vec && 4 * q + 4 <= Li) {
            const float4 v = *(const float4 *)(s_k4 + j * NT + tid);
            kk = make_uint4(tk_key(v.x), tk_key(v.y), tk_key(v.z), tk_key(v.w));
          } else {
            kk = tkr_load4(src, 4 * q, Li, false);
          }
          s_k4[j * NT + tid] = kk;
          tkr_hist0(kk, 4 * q, Li, 4 * ((VR + j) * NT + warp * 32 + 32) <= Li, s_h0);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < VR; ++j) {
      const int q = j * NT + tid;
      if (j < jmax) tkr_hist0(kr[j], 4 * q, Li, 4 * (j * NT + warp * 32 + 32) <= Li, s_h0);
    }
    __syncthreads();
    uint32_t prefix = 0;
    int rem = k, nc;
    tk_find_bin<NT>(TK_BINS, 21, prefix, rem, nc, s_h0, s_scan, &s_prefix, &s_rem, &s_nc);

    /* ---- passes 1 and 2 over the keys whose higher digits match ---- */
#pragma unroll 1
    for (int pass = 1; pass < 3; ++pass) {
      const int shift = pass == 1 ? 10 : 0, hs = pass == 1 ? 21 : 10;
      const uint32_t want = prefix >> hs, mask = pass == 1 ? TK_BINS - 1 : TK_BINS / 2 - 1;
      int *const h = pass == 1 ? s_h1 : s_h2;
#pragma unroll
      for (int j = 0; j < VR; ++j)
        if (j < jmax) tkr_hist(kr[j], hs, want, shift, mask, h);
#pragma unroll
      for (int j = 0; j < VS; ++j)
        if (VR + j < jmax) tkr_hist(s_k4[j * NT + tid], hs, want, shift, mask, h);
      __syncthreads();
      tk_find_bin<NT>(pass == 1 ? TK_BINS : TK_BINS / 2, shift, prefix, rem, nc, h, s_scan, &s_prefix, &s_rem,
                      &s_nc);
    }
    const uint32_t thr = prefix; /* the k-th largest key */
    const int need_eq = rem;     /* >= 1 keys == thr to take, smallest columns first */

    /* ---- emit: bitmaps, one scan over the words in column order, set bits to slots ---- */
#pragma unroll
    for (int j = 0; j < VR; ++j)
      if (j < jmax) tkr_mark(kr[j], thr, j * NT + tid, s_g, s_e);
#pragma unroll
    for (int j = 0; j < VS; ++j)
      if (VR + j < jmax) tkr_mark(s_k4[j * NT + tid], thr, (VR + j) * NT + tid, s_g, s_e);
    __syncthreads();
    uint32_t gw[WPT], ew[WPT];
    int packed = 0; /* gt count << 16 | eq count: gt < k <= 2048, eq <= TKR_MAX_COLS < 65536 */
#pragma unroll
    for (int w = 0; w < WPT; ++w) {
      gw[w] = s_g[tid * WPT + w];
      ew[w] = s_e[tid * WPT + w];
      packed += (__popc(gw[w]) << 16) + __popc(ew[w]);
    }
    const int excl = tk_block_excl_scan<NT>(packed, s_scan);
    int gb = excl >> 16, eb = excl & 0xFFFF;
#pragma unroll
    for (int w = 0; w < WPT; ++w) {
      uint32_t sel = gw[w];
      const int ne = __popc(ew[w]);
      const int take = need_eq - eb; /* ties this word may still take */
      if (take >= ne) {
        sel |= ew[w];
      } else if (take > 0) { /* the lowest `take` set bits (one word per row gets here) */
        uint32_t x = ew[w];
        for (int n = 0; n < take; ++n) {
          sel |= x & (0u - x);
          x &= x - 1u;
        }
      }
      int pos = gb + (eb < need_eq ? eb : need_eq);
      const int cbase = (tid * WPT + w) * 32;
      while (sel) {
        const int b = __ffs(sel) - 1;
        out[pos++] = (int32_t)(cbase + b + add);
        sel &= sel - 1u;
      }
      gb += __popc(gw[w]);
      eb += ne;
    }
  }
}

/* 1 = the shared-memory key cache kernel above (tk_radix_kernel), 2 = register-resident, 1024
 * threads, 3 = registers + shared memory, 512 threads, two CTAs per SM, 4 = the sampled-threshold
 * filter (tk4_kernel below, any row); 0 = automatic (4 where the device has its shared memory, else
 * 3 where the row fits: columns <= TKR_MAX_COLS, else 1). 2 and 3 fall back to 1
 * where they do not apply, 4 where the device lacks the shared memory. Tests and dsa_bench
 * (DSA_TOPK_VARIANT) set it. */
int dsa_topk_variant = 0;
/* Variant 4: 1 = prefetch the CTA's next row whole into L2 when it has <= TK4_PREFETCH_ROW columns
 * (else its sample vectors only), 0 = the sample vectors only for every row (the default). Measured
 * on the H200 (2026-11-29, topk-32k): with 1 the kernel read 952 MB from DRAM for 537 MB of rows
 * (the prefetched rows were evicted before their turn and read again) in 0.368 ms; with 0, 578 MB in
 * 0.345 ms. dsa_bench sets it from DSA_TOPK_V4_PREFETCH. */
int dsa_topk_v4_whole_prefetch = 0;

#define TKR3_SMEM (8 * 512 * 16) /* variant 3: VS * NT * 16 bytes of keys */

/* Launches variant 2 or 3 for a launch whose every row has at most TKR_MAX_COLS columns. */
static dsa_status tkr_launch(const dsa_context *ctx, const dsa_topk_launch *a, int variant,
                             cudaStream_t stream) {
  int64_t grid;
  if (variant == 2) {
    grid = a->rows < ctx->sm_count ? a->rows : ctx->sm_count;
    tkr_kernel<1024, 8, 0, 1><<<(unsigned)grid, 1024, 0, stream>>>(*a);
  } else {
    static int attr_set[DSA_TRACKED_DEVICES]; /* two CTAs per SM: the largest carveout too */
    DSA_TRY(dsa_kernel_smem_once((const void *)tkr_kernel<512, 8, 8, 2>, TKR3_SMEM, 1, ctx->device, attr_set,
                                 "dsa_topk (cudaFuncSetAttribute)"));
    grid = a->rows < 2 * (int64_t)ctx->sm_count ? a->rows : 2 * (int64_t)ctx->sm_count;
    tkr_kernel<512, 8, 8, 2><<<(unsigned)grid, 512, TKR3_SMEM, stream>>>(*a);
  }
  return dsa_cuda_status(cudaGetLastError(), "dsa_topk (kernel launch)");
}

/* ---- variant 4 (dsa_topk_variant 4): sampled threshold, one filtering read, exact select on the
 * candidates; any row length; the automatic choice (see the header for the measurements). ----
 * Per row (one 512-thread CTA, two CTAs per SM, grid-stride over rows):
 *  - L <= TK4_CAP: every column is a candidate (take-all), no sample.
 *  - else the sample: sv = min(n4 / 32, TK4_SV_MAX) 16-byte vectors at a fixed stride over the aligned
 *    body of the row (S = 4 sv keys, 1/32 of the row up to 128K columns) and a 2-pass radix select
 *    (11 + 11 bits) of the r-th largest sample key, r = ceil(TK4_TARGET * S / L), give the 22-bit
 *    prefix T of that key: about TK4_TARGET (= TK4_CAP / 2) keys of the row are >= T. T becomes a
 *    float threshold tf (key order and float order agree for non-NaN values; -0 == +0 in both; NaN
 *    fails every float compare, as its key 0 is below every number); the exact set kept is
 *    {key(x) >= key(tf)}, any tf gives a valid "all keys >= some key" set.
 *  - the filtering read (16-byte loads, TK4_U per thread in flight, head / tail columns up to the
 *    16-byte alignment scalar): x >= tf (one setp per key, no .ftz) sets a bit of a 4U-bit lane mask;
 *    a warp scan of the popcounts and one shared atomic per warp step reserve the slots; the kept
 *    (float bits, column) pairs go to ck / cc in any order. A warp whose reservation passes
 *    TK4_CAP stops (the row then falls back).
 *  - c = candidates: K <= c <= TK4_CAP means every selected key is among them (the K-th largest key
 *    T* is >= key(tf), so all keys > T* and all keys == T* were kept): the exact selection runs on the
 *    candidates only. Keys in place + block min / max; the bits above the highest bit where min and
 *    max differ are common, so the radix passes (11-bit digits, 2048 bins) start there (uniform
 *    scores: 2 passes, the first one spread over ~1000 bins instead of a few exponent bins). Emit:
 *    the bitmaps of the candidates > T* and == T* by column (windows of TK4_WIN columns over the
 *    histogram memory), one block scan of (popc gt, popc eq) per window: ascending output, the
 *    need_eq smallest columns among the ties, as variant 3. The append order never matters: only
 *    counts and sets are used.
 *  - fallback (c < K: threshold too high; c > TK4_CAP: too low, e.g. constant or heavily tied rows; T
 *    with a NaN key): the exact radix select straight from global memory (three passes 11 + 11 + 10
 *    bits, then a count and an emit sweep by warp stretches, as variant 1's streaming path), same
 *    CTA, no workspace.
 * Why: variants 1-3 histogram every key three times (key conversion, shift, shared atomic per key
 * per pass, heavy same-bin conflicts in pass 0 for scores of a narrow exponent range); here a key
 * costs one compare plus its share of a 16-byte load, a 16-key mask and a warp scan, and 1/8 (32K)
 * or 1/32 (128K) of the keys are written to shared memory. Prediction (see the header): topk-32k
 * ~0.15-0.2 ms, topk-128k ~0.55-0.65 ms (bandwidth-bound filtering read + per-row fixed phases).
 * Measured on the H200 (2026-11-29): 0.345 / 0.851 ms. Not bandwidth-bound: with the sample-only
 * prefetch the DRAM reads are 1.08x the rows' bytes at 37% of the DRAM peak; the per-row phases
 * (sample select, candidate select, emit: each a few block barriers, two CTAs per SM) take ~60% of a
 * row's 22 us. Next: overlap the next row's filtering read with this row's select (docs/perf.md). */
#define TK4_NT 512                 /* threads per CTA (two CTAs per SM) */
#define TK4_CAP 8192               /* candidate (float bits, column) pairs in shared memory */
#define TK4_TARGET (TK4_CAP / 2)   /* candidates the sampled threshold aims at (>= 2 K for any K) */
#define TK4_U 4                    /* 16-byte loads per thread per filtering step */
#define TK4_SV_MAX (2 * TK4_NT)    /* sample vectors at most (4096 keys) */
#define TK4_WIN 65536              /* columns per emit window (two bitmaps of TK4_WIN / 32 words) */
#define TK4_PREFETCH_ROW 32768     /* dsa_topk_v4_whole_prefetch = 1: the next row goes to L2 whole up to this length */
#define TK4_SMEM ((2 * TK4_CAP + 3 * TK_BINS) * 4) /* ck, cc, three 2048-bin histograms: 88 KB */
static_assert(2 * (TK4_WIN / 32) <= 3 * TK_BINS, "the emit bitmaps overlay the histograms");
static_assert((TK4_WIN / 32) % TK4_NT == 0, "whole bitmap words per thread");
static_assert(TK4_TARGET >= 2 * 2048, "the target covers twice the largest k");

/* x >= t as an IEEE compare (subnormals kept whatever the flags: no .ftz); NaN gives 0 */
static __device__ __forceinline__ unsigned tk4_ge(float x, float t) {
  unsigned r;
  asm("{\n\t.reg .pred p;\n\tsetp.ge.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(r) : "f"(x), "f"(t));
  return r;
}

/* the aligned body of a row longer than TK4_CAP and its sample: head columns [0, hd) up to the
 * 16-byte alignment, n4 float4 vectors from column hd, sv sample vectors at stride sst */
struct tk4_geom {
  int hd, n4, sv, sst;
};
static __device__ __forceinline__ tk4_geom tk4_geometry(const float *src, int Li) {
  tk4_geom g;
  g.hd = (int)(((16u - ((unsigned)(uintptr_t)src & 15u)) & 15u) >> 2);
  g.n4 = (Li - g.hd) >> 2;
  g.sv = (g.n4 >> 5) < TK4_SV_MAX ? (g.n4 >> 5) : TK4_SV_MAX; /* >= 63 for Li > TK4_CAP */
  g.sst = g.n4 / g.sv;                                          /* >= 32 */
  return g;
}

/* Next row of this CTA: whole into L2 when short (warp 0, bulk prefetch), else its sample vectors. */
static __device__ __forceinline__ void tk4_prefetch_next(const dsa_topk_launch &a, int64_t nr, int tid, int whole) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t nL = tk_row_len(a, nr);
  int64_t noff = 0;
  if (nL <= a.k) return;
  if (whole && nL <= TK4_PREFETCH_ROW) {
    if (tid < 32) tkr_prefetch_row(a, nr, tid);
    return;
  }
  if (nL <= TK4_CAP) return;
  if (a.starts != NULL) noff = a.starts[nr] - a.start_base;
  const float *ns = a.scores + nr * a.scores_stride + noff;
  const tk4_geom g = tk4_geometry(ns, (int)nL);
  for (int i = tid; i < g.sv; i += TK4_NT)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ns + g.hd + 4 * (int64_t)i * g.sst) : "memory");
#else
  (void)a;
  (void)nr;
  (void)tid;
#endif
}

/* The exact streaming select of one row from global memory (the fallback): h0.. (three 2048-bin
 * histograms) must be zero in this thread's program order before the call. */
static __device__ __forceinline__ void tk4_fallback(const float *__restrict__ src, int64_t L, int k, int64_t add,
                                                    int32_t *out, int *h0, int *s_scan, uint32_t *s_prefix,
                                                    int *s_rem, int *s_nc, long long *s_wgt, long long *s_weq) {
  constexpr int NT = TK4_NT, NW = NT / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __syncthreads();
  uint32_t prefix = 0;
  int rem = k, nc;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int nb = pass == 2 ? TK_BINS / 2 : TK_BINS;
    const int hs = pass == 1 ? 21 : 10; /* pass > 0: the bits above the digit must match prefix */
    int *const h = h0 + pass * TK_BINS;
    for (int64_t c = tid; c < L; c += NT) {
      const uint32_t key = tk_key(__ldg(src + c));
      if (pass == 0 || (key >> hs) == (prefix >> hs)) atomicAdd(&h[(key >> shift) & (nb - 1)], 1);
    }
    __syncthreads();
    tk_find_bin<NT>(nb, shift, prefix, rem, nc, h, s_scan, s_prefix, s_rem, s_nc);
  }
  const uint32_t thr = prefix;
  const long long need_eq = rem, count_gt = k - rem;
  /* warp w owns columns [c0, c1): count, scan over the warps, emit in column order (ballots) */
  const int64_t per_warp = ((L + NW * 32 - 1) / (NW * 32)) * 32;
  const int64_t c0 = (int64_t)warp * per_warp;
  const int64_t c1 = c0 + per_warp < L ? c0 + per_warp : L;
  long long n_gt, n_eq;
  tk_count_stretch(src, c0, c1, thr, lane, &n_gt, &n_eq);
  if (lane == 0) {
    s_wgt[warp] = n_gt;
    s_weq[warp] = n_eq;
  }
  __syncthreads();
  long long gt_before = 0, eq_before = 0;
  for (int w = 0; w < warp; ++w) {
    gt_before += s_wgt[w];
    eq_before += s_weq[w];
  }
  tk_emit_stretch(src, nullptr, false, c0, c1, thr, count_gt, need_eq, gt_before, eq_before, out, add, lane);
  /* no closing barrier: the next row's first shared writes (histogram zeroing) follow the last
   * histogram reads (inside tk_find_bin, before its barrier); s_wgt / s_weq are rewritten only after
   * the next fallback's barriers */
}

static __global__ void __launch_bounds__(TK4_NT, 2) tk4_kernel(dsa_topk_launch a, int whole_prefetch) {
  constexpr int NT = TK4_NT, NW = NT / 32, U = TK4_U;
  constexpr int WPT = TK4_WIN / 32 / NT; /* bitmap words per thread in the emit scan */
  extern __shared__ __align__(16) uint32_t tk4_smem[];
  uint32_t *const ck = tk4_smem;                    /* [TK4_CAP] candidate float bits, then keys */
  uint32_t *const cc = tk4_smem + TK4_CAP;          /* [TK4_CAP] candidate columns */
  int *const h0 = (int *)(tk4_smem + 2 * TK4_CAP); /* [3 * TK_BINS] histograms h0, h1, h2 */
  uint32_t *const bg = (uint32_t *)h0;              /* emit: [TK4_WIN / 32] key > T* (over h0..) */
  uint32_t *const be = bg + TK4_WIN / 32;           /* emit: [TK4_WIN / 32] key == T* */
  __shared__ int s_scan[NW];
  __shared__ uint32_t s_prefix, s_kmin, s_kmax;
  __shared__ int s_rem, s_nc, s_cnt;
  __shared__ long long s_wgt[NW], s_weq[NW];
  const int tid = threadIdx.x, lane = tid & 31;
  const int k = a.k;

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    int64_t L, add;
    int32_t *out;
    const float *src;
    if (!tk_row_begin<NT>(a, row, tid, &L, &add, &out, &src)) continue; /* L <= k: written; block-uniform */
    const int Li = (int)L; /* columns < 2^31 (int32 indices) */
    if (row + gridDim.x < a.rows) tk4_prefetch_next(a, row + gridDim.x, tid, whole_prefetch);

    /* the previous row's last shared reads (histograms / bitmaps, s_cnt, s_kmin / s_kmax) came
     * before its last barrier */
    for (int i = tid; i < 3 * TK_BINS; i += NT) h0[i] = 0;
    if (tid == 0) {
      s_cnt = 0;
      s_kmin = 0xffffffffu;
      s_kmax = 0u;
    }
    __syncthreads();

    int c; /* candidates (block-uniform) */
    if (Li <= TK4_CAP) {
      /* take-all: every column, in column order */
#pragma unroll 4
      for (int i = tid; i < Li; i += NT) {
        ck[i] = __float_as_uint(__ldg(src + i));
        cc[i] = (uint32_t)i;
      }
      c = Li;
      __syncthreads();
    } else {
      /* ---- the sample: the r-th largest of S = 4 sv keys, its top 22 bits ---- */
      const tk4_geom g = tk4_geometry(src, Li);
      const float4 *s4 = (const float4 *)(src + g.hd);
      uint32_t sk[8];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int si = i * NT + tid;
        uint4 kk = make_uint4(0u, 0u, 0u, 0u);
        if (si < g.sv) {
          const float4 v = __ldg(s4 + (int64_t)si * g.sst);
          kk = make_uint4(tk_key(v.x), tk_key(v.y), tk_key(v.z), tk_key(v.w));
          atomicAdd(&h0[kk.x >> 21], 1);
          atomicAdd(&h0[kk.y >> 21], 1);
          atomicAdd(&h0[kk.z >> 21], 1);
          atomicAdd(&h0[kk.w >> 21], 1);
        }
        sk[4 * i] = kk.x;
        sk[4 * i + 1] = kk.y;
        sk[4 * i + 2] = kk.z;
        sk[4 * i + 3] = kk.w;
      }
      __syncthreads();
      uint32_t prefix = 0;
      int rem = (int)(((int64_t)TK4_TARGET * 4 * g.sv + L - 1) / L), nc; /* 1 <= r < S */
      tk_find_bin<NT>(TK_BINS, 21, prefix, rem, nc, h0, s_scan, &s_prefix, &s_rem, &s_nc);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if ((i >> 2) * NT + tid < g.sv && (sk[i] >> 21) == (prefix >> 21))
          atomicAdd(&h0[TK_BINS + ((sk[i] >> 10) & (TK_BINS - 1))], 1);
      __syncthreads();
      tk_find_bin<NT>(TK_BINS, 10, prefix, rem, nc, h0 + TK_BINS, s_scan, &s_prefix, &s_rem, &s_nc);
      /* h0 and h1 were last read inside tk_find_bin (before its barrier): zero them for the select
       * (or the fallback); the barrier after the filtering read orders this */
      for (int i = tid; i < 2 * TK_BINS; i += NT) h0[i] = 0;
      const uint32_t T = prefix; /* block-uniform; 0: the sampled threshold is NaN, no useful filter */
      c = 0;
      if (T != 0u) {
        uint32_t tb; /* a non-NaN float whose key is close to T (any such float is a valid filter) */
        if (T <= 0x007FFFFFu) tb = 0xFF800000u; /* at or below -inf: every number */
        else if (T < 0x80000000u) tb = ~T;      /* negative */
        else tb = (T & 0x7FFFFFFFu) < 0x7F800000u ? (T & 0x7FFFFFFFu) : 0x7F800000u;
        const float tf = __uint_as_float(tb);

        /* ---- the filtering read: whole steps of NT * U vectors without bounds checks, then the
         * last partial one ---- */
        const int n4 = g.n4;
        auto step = [&](const int base, const bool full) -> bool { /* false: overflow */
          float4 v[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const int q = base + u * NT + tid;
            if (full || q < n4) v[u] = __ldg(s4 + q);
            else v[u] = make_float4(__int_as_float(0x7fffffff), __int_as_float(0x7fffffff),
                                    __int_as_float(0x7fffffff), __int_as_float(0x7fffffff)); /* NaN: kept never */
          }
          unsigned m = 0;
#pragma unroll
          for (int u = 0; u < U; ++u)
            m |= (tk4_ge(v[u].x, tf) | (tk4_ge(v[u].y, tf) << 1) | (tk4_ge(v[u].z, tf) << 2) |
                  (tk4_ge(v[u].w, tf) << 3))
                 << (4 * u);
          const int n = __popc(m);
          int x = n; /* inclusive warp scan of the lane counts */
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
          }
          const int tot = __shfl_sync(0xffffffffu, x, 31);
          if (tot == 0) return true; /* warp-uniform */
          int wb = 0;
          if (lane == 31) wb = atomicAdd(&s_cnt, tot);
          wb = __shfl_sync(0xffffffffu, wb, 31);
          if (wb + tot > TK4_CAP) return false; /* warp-uniform: s_cnt > TK4_CAP, the row falls back */
          uint32_t *p = ck + (wb + x - n); /* this lane's slots; the columns sit TK4_CAP words after */
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const uint32_t cb = (uint32_t)g.hd + 4u * (uint32_t)(base + u * NT + tid);
            const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if ((m >> (4 * u + j)) & 1u) {
                p[0] = __float_as_uint(e[j]);
                p[TK4_CAP] = cb + j;
                ++p;
              }
          }
          return true;
        };
        {
          int base = 0;
          bool go = true;
          for (; go && base + NT * U <= n4; base += NT * U) go = step(base, true); /* warp-uniform */
          if (go && base < n4) step(base, false);
        }
        { /* head and tail columns outside the aligned body (at most 3 + 3) */
          const int tail0 = g.hd + 4 * n4, nx = g.hd + (Li - tail0);
          if (tid < nx) {
            const int col = tid < g.hd ? tid : tail0 + (tid - g.hd);
            const float xv = __ldg(src + col);
            if (tk4_ge(xv, tf)) {
              const int p = atomicAdd(&s_cnt, 1);
              if (p < TK4_CAP) {
                ck[p] = __float_as_uint(xv);
                cc[p] = (uint32_t)col;
              }
            }
          }
        }
        __syncthreads();
        c = s_cnt;
      }
      if (c < k || c > TK4_CAP) { /* block-uniform */
        tk4_fallback(src, L, k, add, out, h0, s_scan, &s_prefix, &s_rem, &s_nc, s_wgt, s_weq);
        continue;
      }
    }

    /* ---- exact select on the c candidates: keys in place, their min / max ---- */
    {
      uint32_t kmn = 0xffffffffu, kmx = 0u;
      for (int i = tid; i < c; i += NT) {
        const uint32_t key = tk_key(__uint_as_float(ck[i]));
        ck[i] = key;
        kmn = key < kmn ? key : kmn;
        kmx = key > kmx ? key : kmx;
      }
      kmn = __reduce_min_sync(0xffffffffu, kmn);
      kmx = __reduce_max_sync(0xffffffffu, kmx);
      if (lane == 0) {
        atomicMin(&s_kmin, kmn);
        atomicMax(&s_kmax, kmx);
      }
    }
    __syncthreads();
    uint32_t prefix;
    int rem = k, nc;
    {
      const uint32_t kmin = s_kmin, kmax = s_kmax, x = kmin ^ kmax;
      int lo = x ? 32 - __clz((int)x) : 0; /* the bits >= lo are common to every candidate */
      prefix = lo == 32 ? 0u : (kmax >> lo) << lo;
      int *h = h0;
#pragma unroll 1
      while (lo > 0) { /* block-uniform; at most three passes (digits of 11 bits from bit lo down) */
        const int shift = lo > 11 ? lo - 11 : 0;
        for (int i = tid; i < c; i += NT) {
          const uint32_t key = ck[i];
          if (lo == 32 || (key >> lo) == (prefix >> lo)) atomicAdd(&h[(key >> shift) & (TK_BINS - 1)], 1);
        }
        __syncthreads();
        tk_find_bin<NT>(TK_BINS, shift, prefix, rem, nc, h, s_scan, &s_prefix, &s_rem, &s_nc);
        lo = shift;
        h += TK_BINS;
      }
    }
    const uint32_t thr = prefix; /* the k-th largest key */
    const int need_eq = rem, count_gt = k - rem;

    /* ---- emit: per window of TK4_WIN columns, bitmaps of the candidates > thr and == thr, one
     * block scan of (popc gt << 16 | popc eq) over the words (both < 65536: at most TK4_CAP bits) ---- */
    int gb_run = 0, eb_run = 0;
#pragma unroll 1
    for (int64_t w0 = 0; w0 < L; w0 += TK4_WIN) {
      /* the histograms (and the previous window's words) were last read before a barrier */
      for (int i = tid; i < 2 * (TK4_WIN / 32); i += NT) bg[i] = 0u;
      __syncthreads();
      for (int i = tid; i < c; i += NT) {
        const uint32_t key = ck[i];
        const uint32_t col = cc[i] - (uint32_t)w0;
        if (col < TK4_WIN && key >= thr) atomicOr(key > thr ? &bg[col >> 5] : &be[col >> 5], 1u << (col & 31));
      }
      __syncthreads();
      uint32_t gw[WPT], ew[WPT];
      int packed = 0;
#pragma unroll
      for (int w = 0; w < WPT; ++w) {
        gw[w] = bg[tid * WPT + w];
        ew[w] = be[tid * WPT + w];
        packed += (__popc(gw[w]) << 16) + __popc(ew[w]);
      }
      const int excl = tk_block_excl_scan<NT>(packed, s_scan);
      const int total = s_scan[NW - 1];
      int gb = gb_run + (excl >> 16), eb = eb_run + (excl & 0xFFFF);
#pragma unroll
      for (int w = 0; w < WPT; ++w) {
        uint32_t sel = gw[w];
        const int ne = __popc(ew[w]);
        const int take = need_eq - eb; /* ties this word may still take */
        if (take >= ne) {
          sel |= ew[w];
        } else if (take > 0) { /* the lowest `take` set bits */
          uint32_t xw = ew[w];
          for (int n = 0; n < take; ++n) {
            sel |= xw & (0u - xw);
            xw &= xw - 1u;
          }
        }
        int pos = gb + (eb < need_eq ? eb : need_eq);
        const int64_t cbase = w0 + (int64_t)(tid * WPT + w) * 32 + add;
        while (sel) {
          const int b = __ffs(sel) - 1;
          out[pos++] = (int32_t)(cbase + b);
          sel &= sel - 1u;
        }
        gb += __popc(gw[w]);
        eb += ne;
      }
      gb_run += total >> 16;
      eb_run += total & 0xFFFF;
      if (gb_run == count_gt && eb_run >= need_eq) break; /* block-uniform: all emitted */
    }
  }
}

/* Launches variant 4 (any row length; needs TK4_SMEM of opt-in shared memory per CTA). */
static dsa_status tk4_launch(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* two CTAs per SM: the largest carveout too */
  DSA_TRY(dsa_kernel_smem_once((const void *)tk4_kernel, TK4_SMEM, 1, ctx->device, attr_set,
                               "dsa_topk (cudaFuncSetAttribute)"));
  const int64_t grid = a->rows < 2 * (int64_t)ctx->sm_count ? a->rows : 2 * (int64_t)ctx->sm_count;
  tk4_kernel<<<(unsigned)grid, TK4_NT, TK4_SMEM, stream>>>(*a, dsa_topk_v4_whole_prefetch);
  return dsa_cuda_status(cudaGetLastError(), "dsa_topk (kernel launch)");
}

/* 1: rows too long for the key cache take the two-read compaction path when their candidates fit
 * (tests set 0 to run the five-read path). */
int dsa_topk_compact_long_rows = 1;

/* Keys a row may cache in shared memory on this device for this launch. */
static int64_t tk_cache_cap(const dsa_context *ctx, const dsa_topk_launch *a) {
  int64_t cap;
  if (a->scores == NULL) return 0;
  cap = ((int64_t)ctx->max_smem_optin - (int64_t)(TK_HC * TK_BINS * 4 + 1024)) / 4;
  if (cap > TK_MAX_CACHE_KEYS) cap = TK_MAX_CACHE_KEYS;
  if (cap > a->columns) cap = a->columns;
  if (cap < 0) cap = 0;
  return cap;
}

/* The variant (measured on the H200, see the header): TK_F_* bits and threads per CTA; -D overrides
 * for experiments. Tests run the default. */
#ifndef TK_USE_CAND /* -DTK_USE_CAND=0: the previous variant (pass 2 sweeps the whole cache) */
#define TK_USE_CAND 1
#endif
#ifndef TK_FLAGS_DEFAULT
#ifndef TK_USE_V4 /* -DTK_USE_V4=0: scalar loads in the uncached first pass, no __any_sync skip */
#define TK_USE_V4 1
#endif
#ifndef TK_USE_CNT /* -DTK_USE_CNT=0: keep the counting sweep before the emit (TK_F_CNT needs TK_F_CAND) */
#define TK_USE_CNT 1
#endif
#define TK_FLAGS_DEFAULT                                                                              \
  (TK_F_CPASYNC | TK_F_HC | TK_F_PREFETCH | TK_F_EMIT4 | (TK_USE_CAND ? TK_F_CAND : 0) |               \
   (TK_USE_CAND && TK_USE_CNT ? TK_F_CNT : 0) | (TK_USE_V4 ? TK_F_V4 : 0))
#endif
#ifndef TK_THREADS_DEFAULT
#define TK_THREADS_DEFAULT 1024
#endif

template <int NT>
static dsa_status tk_launch(const dsa_topk_launch *a, int64_t cap, size_t smem, int flags, int device,
                            cudaStream_t stream) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* the largest smem limit set so far per device */
  int64_t grid;
  /* static shared memory (TK_HC histograms and small state) counts against the same limit */
  if (smem + TK_HC * TK_BINS * 4 + 1024 > 48 * 1024)
    DSA_TRY(dsa_kernel_smem_once((const void *)tk_radix_kernel<NT>, (int)smem, 0, device, attr_set,
                                 "dsa_topk (cudaFuncSetAttribute)"));
  grid = a->rows < (1 << 24) ? a->rows : (1 << 24);
  tk_radix_kernel<NT><<<(unsigned)grid, NT, smem, stream>>>(*a, cap, dsa_topk_compact_long_rows, flags);
  return dsa_cuda_status(cudaGetLastError(), "dsa_topk (kernel launch)");
}

extern "C" dsa_status dsa_launch_topk(const dsa_context *ctx, const dsa_topk_launch *a,
                                      cudaStream_t stream) {
  int64_t cap;
  size_t smem;
  const int flags = TK_FLAGS_DEFAULT;
  int variant = dsa_topk_variant == 0 ? 4 : dsa_topk_variant;
  if (a->rows <= 0) return DSA_SUCCESS;
  /* variant 4: any rows (no scores: every row has L <= k, never read); 2 x 90 KB of shared memory per SM */
  if (variant == 4 && ctx->max_smem_optin < TK4_SMEM + 2048) variant = dsa_topk_variant == 0 ? 3 : 1;
  if (variant == 4) return tk4_launch(ctx, a, stream);
  /* variants 2 and 3: rows of at most TKR_MAX_COLS; 3 needs 2 x (64 + 29) KB of shared memory per SM */
  if (variant == 3 && ctx->max_smem_optin < TKR3_SMEM + 32 * 1024) variant = 1;
  if ((variant == 2 || variant == 3) && a->scores != NULL && a->columns <= TKR_MAX_COLS)
    return tkr_launch(ctx, a, variant, stream);
  cap = tk_cache_cap(ctx, a);
  /* whole 16-byte granules: the counting sweep reads the cache as uint4 and the compiler widens
   * the scalar tail (up to 3 keys) into one vector read of its aligned granule, which must stay
   * inside the allocation (compute-sanitizer memcheck flagged 12-byte reads past a 3001-key cache) */
  smem = (size_t)((cap + 3) & ~(int64_t)3) * sizeof(uint32_t);
#if TK_THREADS_DEFAULT == 1024
  return tk_launch<1024>(a, cap, smem, flags, ctx->device, stream);
#else
  return tk_launch<512>(a, cap, smem, flags, ctx->device, stream);
#endif
}
