/*
 * topk_radix.cu - deterministic per-row top-k by radix select (dsa_topk and the indexer's selection):
 * the radix kernel (DSA_TOPK_KERNEL_RADIX), the automatic choice where the device lacks the filter
 * kernel's shared memory (cuda/topk/topk.cu).
 *
 * One CTA of 1024 threads per row, grid-stride over rows on a 1-D grid:
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
 * Three data flows, chosen per row:
 *  - cached (L <= cache_cap, at most 48K keys = 192 KB from the device's opt-in limit): the first
 *    global read (16-byte loads when the row is aligned) fills a key cache in shared memory; every
 *    later pass reads it. One read of the row.
 *  - compaction (longer rows whose top-11-bit threshold bin fits in the same shared memory): a
 *    second read sends the certain winners (above the bin) to a staging list and the bin's
 *    (key, column) pairs to a candidate list; the last two radix digits, the tie-break (a radix
 *    select on ~column among keys equal to the threshold) and a bitonic sort of the k columns run
 *    in shared memory. Two reads. DSA_OPTION_TOPK_COMPACT_LONG_ROWS = 0 disables it (tests run both).
 *  - streaming (anything else, any length): every pass re-reads the row (five reads).
 * Feature bits (the kernel's flags argument; the launcher passes TK_FLAGS, all of them): TK_F_CPASYNC
 * (cached rows: the first read is cp.async straight into the key cache in 4 commit groups,
 * converted to keys in place), TK_F_HC (pass 0 counts into 4 lane-indexed sub-histograms),
 * TK_F_PREFETCH (warp 0 prefetches the CTA's next row into L2), TK_F_EMIT4 (cached rows emit 4
 * columns per lane per step with one packed warp scan), TK_F_CAND (cached rows whose top-11-bit
 * threshold bin holds <= TK_CAND_CAP keys: pass 1 gathers that bin's keys into the free pass-0
 * sub-histograms and pass 2 counts only them), TK_F_CNT (with CAND: pass 1 sweeps each warp's emit
 * stretch, counts the keys above the bin and tags each candidate with its warp, so the per-warp
 * counts before the emit need no sweep), TK_F_V4 (uncached rows: 16-byte loads in pass 0). Cached
 * rows then read the key cache twice after the first read (pass 1, emit) instead of four times
 * (passes 1, 2, count, emit). The kernel is issue-bound: instruction count per key, not memory or
 * same-bin atomics, is what costs (docs/perf.md has the measurements of each bit).
 * Everything is integer counting, and ties are settled by column: bitwise deterministic and
 * independent of the other rows. No workspace.
 *
 * The same kernel serves the indexer: `starts` gives each row a column offset
 * (starts[r] - start_base) into the scores row and adds starts[r] to every emitted column (global
 * key coordinates); `scores` may be NULL when every row is known to have L <= k.
 */
#include "topk/topk_common.cuh"

#define TK_HC 4                         /* pass-0 sub-histograms (lane & 3): fewer same-bin conflicts */
#define TK_GROUPS 4                     /* cp.async commit groups of a cached row (load/compute overlap) */
#define TK_UNROLL 16                    /* independent global loads in flight per thread */
#define TK_MAX_CACHE_KEYS (48 * 1024)   /* 192 KB of cached keys at most (H200 opt-in: 227 KB) */

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

#define TK_F_CPASYNC 1 /* cached rows: first read by cp.async straight into shared memory */
#define TK_F_HC 2      /* pass 0 counts into TK_HC sub-histograms */
#define TK_F_PREFETCH 4 /* prefetch the CTA's next row into L2 (cp.async.bulk.prefetch) */
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
        /* uncached first pass: 16-byte loads (4 in flight per thread, as the cached path) */
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

/* The feature bits the launcher passes (see the header). */
#define TK_FLAGS (TK_F_CPASYNC | TK_F_HC | TK_F_PREFETCH | TK_F_EMIT4 | TK_F_CAND | TK_F_CNT | TK_F_V4)

template <int NT>
static dsa_status tk_launch(const dsa_topk_launch *a, int64_t cap, size_t smem, int flags, int compact_ok,
                            int device, cudaStream_t stream) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* the largest smem limit set so far per device */
  int64_t grid;
  /* static shared memory (TK_HC histograms and small state) counts against the same limit */
  if (smem + TK_HC * TK_BINS * 4 + 1024 > 48 * 1024)
    DSA_TRY(dsa_kernel_smem_once((const void *)tk_radix_kernel<NT>, (int)smem, 0, device, attr_set,
                                 "dsa_topk (cudaFuncSetAttribute)"));
  grid = a->rows < (1 << 24) ? a->rows : (1 << 24);
  tk_radix_kernel<NT><<<(unsigned)grid, NT, smem, stream>>>(*a, cap, compact_ok, flags);
  return dsa_cuda_status(cudaGetLastError(), "dsa_topk (kernel launch)");
}

extern "C" dsa_status dsa_topk_launch_radix(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  const int64_t cap = tk_cache_cap(ctx, a);
  /* whole 16-byte granules: the counting sweep reads the cache as uint4 and the compiler widens
   * the scalar tail (up to 3 keys) into one vector read of its aligned granule, which must stay
   * inside the allocation (compute-sanitizer memcheck flagged 12-byte reads past a 3001-key cache) */
  const size_t smem = (size_t)((cap + 3) & ~(int64_t)3) * sizeof(uint32_t);
  const int compact_ok = ctx->options[DSA_OPTION_TOPK_COMPACT_LONG_ROWS] != 0;
  return tk_launch<1024>(a, cap, smem, TK_FLAGS, compact_ok, ctx->device, stream);
}
