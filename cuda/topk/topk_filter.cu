/*
 * topk_filter.cu - deterministic per-row top-k (dsa_topk and the indexer's selection) on two kernels
 * (DSA_TOPK_KERNEL_FILTER, the automatic choice where the device has its 2 x 90 KB of shared memory
 * per SM; the top-k's dispatch point, cuda/topk/topk.cu, chooses between them): the bisection kernel
 * (tkb_kernel) for launches whose rows all have at most TKB_CAP = 4096 columns (`columns` <= 4096:
 * the indexer's windows of short sequences), the filter kernel (tkf_kernel) for the others. Same output as the radix kernel
 * (cuda/topk/topk_radix.cu: the rule, the key order, ties to the smaller column, ascending output).
 *
 * The filter kernel, per row (one CTA of 512 threads, two CTAs per SM, grid-stride over rows;
 * CAP = 8192 candidates):
 *  - L <= CAP: every column is a candidate (take-all), no sample.
 *  - else the sample: sv = min(n4 / 32, SV_MAX) 16-byte vectors at a fixed stride over the aligned
 *    body of the row (S = 4 sv keys, 1/32 of the row up to 128K columns) and a 2-pass radix select
 *    (11 + 11 bits) of the r-th largest sample key, r = ceil(TARGET * S / L), give the 22-bit
 *    prefix T of that key: about TARGET (= CAP / 2) keys of the row are >= T. T becomes a
 *    float threshold tf (key order and float order agree for non-NaN values; -0 == +0 in both; NaN
 *    fails every float compare, as its key 0 is below every number); the exact set kept is
 *    {key(x) >= key(tf)}, any tf gives a valid "all keys >= some key" set.
 *  - the filtering read (16-byte loads, TKF_U per thread in flight, head / tail columns up to the
 *    16-byte alignment scalar): x >= tf (one setp per key, no .ftz) sets a bit of a 4U-bit lane mask;
 *    a warp scan of the popcounts and one shared atomic per warp step reserve the slots; the kept
 *    (float bits, column) pairs go to ck / cc in any order. A warp whose reservation passes
 *    CAP stops (the row then falls back).
 *  - c = candidates: K <= c <= CAP means every selected key is among them (the K-th largest key
 *    T* is >= key(tf), so all keys > T* and all keys == T* were kept): the exact selection runs on the
 *    candidates only. Keys in place + block min / max; the bits above the highest bit where min and
 *    max differ are common, so the radix passes (11-bit digits, 2048 bins) start there (uniform
 *    scores: 2 passes, the first one spread over ~1000 bins instead of a few exponent bins). Emit:
 *    the bitmaps of the candidates > T* and == T* by column (windows of WIN columns over the
 *    histogram memory), one block scan of (popc gt, popc eq) per window: ascending output, the
 *    need_eq smallest columns among the ties. The append order never matters: only counts and sets
 *    are used.
 *  - fallback (c < K: threshold too high; c > CAP: too low, e.g. constant or heavily tied rows; T
 *    with a NaN key): the exact radix select straight from global memory (three passes 11 + 11 + 10
 *    bits, then a count and an emit sweep by warp stretches, as the radix kernel's streaming path),
 *    same CTA, no workspace.
 *  - the CTA's next row: its sample vectors are prefetched into L2 while this row is worked on.
 * Why: the radix kernel histograms every key three times (key conversion, shift, shared atomic per
 * key per pass, heavy same-bin conflicts in pass 0 for scores of a narrow exponent range); here a key
 * costs one compare plus its share of a 16-byte load, a 16-key mask and a warp scan, and 1/8 (32K)
 * or 1/32 (128K) of the keys are written to shared memory. It is not bandwidth-bound: the per-row
 * phases (sample select, candidate select, emit: each a few block barriers, two CTAs per SM) take
 * most of a row's time (docs/perf.md has the measurements).
 *
 * The bisection kernel (after tkf_kernel) holds a row of at most 4096 columns in registers, 16 keys
 * per thread, and finds its K-th largest key bit by bit, one warp reduction and one barrier per bit:
 * ~11 steps for random scores, where the filter kernel's take-all path would run a serial chain of
 * shared-memory passes on the row (copy, min / max, radix histograms with their scans, the bitmap
 * emit).
 *
 * Everything is integer counting or exact compares, and ties are settled by column: bitwise
 * deterministic and independent of the other rows. No workspace.
 */
#include "topk/topk_common.cuh"

#define TKF_U 4 /* 16-byte loads per thread per filtering step */

/* The filter kernel's build: NT threads per CTA, MINB CTAs per SM; CAP candidates in shared memory;
 * WIN columns per emit window (two bitmaps of WIN / 32 words over the histograms). */
template <int NT_, int CAP_, int WIN_, int MINB_>
struct TkfCfg {
  static constexpr int NT = NT_, CAP = CAP_, WIN = WIN_, MINB = MINB_;
  static constexpr int TARGET = CAP / 2;  /* candidates the sampled threshold aims at */
  static constexpr int SV_MAX = 2 * NT;   /* sample vectors at most */
  static constexpr int SMEM = (2 * CAP + 3 * TK_BINS) * 4; /* ck, cc, h0 h1 h2 */
  static_assert(2 * (WIN / 32) <= 3 * TK_BINS, "the emit bitmaps overlay the histograms");
  static_assert((WIN / 32) % NT == 0, "whole bitmap words per thread");
  static_assert(TARGET >= 2 * 2048, "the target covers twice the largest k");
};
/* Any row length (the launches with rows past the bisection kernel's 4096 columns, and those without
 * scores): 512 threads, two CTAs per SM, 88 KB (TKF_SMEM). */
typedef TkfCfg<512, 8192, 65536, 2> TkfLong;
static_assert(TkfLong::SMEM == TKF_SMEM, "ck, cc, three 2048-bin histograms");

/* x >= t as an IEEE compare (subnormals kept whatever the flags: no .ftz); NaN gives 0 */
static __device__ __forceinline__ unsigned tkf_ge(float x, float t) {
  unsigned r;
  asm("{\n\t.reg .pred p;\n\tsetp.ge.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(r) : "f"(x), "f"(t));
  return r;
}

/* the aligned body of a row longer than CAP and its sample: head columns [0, hd) up to the
 * 16-byte alignment, n4 float4 vectors from column hd, sv sample vectors at stride sst */
struct tkf_geom {
  int hd, n4, sv, sst;
};
template <class C>
static __device__ __forceinline__ tkf_geom tkf_geometry(const float *src, int Li) {
  tkf_geom g;
  g.hd = (int)(((16u - ((unsigned)(uintptr_t)src & 15u)) & 15u) >> 2);
  g.n4 = (Li - g.hd) >> 2;
  g.sv = (g.n4 >> 5) < C::SV_MAX ? (g.n4 >> 5) : C::SV_MAX; /* >= 63 for Li > TkfLong::CAP */
  g.sst = g.n4 / g.sv;                                          /* >= 32 */
  return g;
}

/* Next row of this CTA: its sample vectors into L2 (nothing for rows without a sample). */
template <class C>
static __device__ __forceinline__ void tkf_prefetch_next(const dsa_topk_launch &a, int64_t nr, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t nL = tk_row_len(a, nr);
  int64_t noff = 0;
  if (nL <= a.k) return;
  if (nL <= C::CAP) return;
  if (a.starts != NULL) noff = a.starts[nr] - a.start_base;
  const float *ns = a.scores + nr * a.scores_stride + noff;
  const tkf_geom g = tkf_geometry<C>(ns, (int)nL);
  for (int i = tid; i < g.sv; i += C::NT)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ns + g.hd + 4 * (int64_t)i * g.sst) : "memory");
#else
  (void)a;
  (void)nr;
  (void)tid;
#endif
}

/* The exact streaming select of one row from global memory (the fallback): h0.. (three 2048-bin
 * histograms) must be zero in this thread's program order before the call. */
template <class C>
static __device__ __forceinline__ void tkf_fallback(const float *__restrict__ src, int64_t L, int k, int64_t add,
                                                    int32_t *out, int *h0, int *s_scan, uint32_t *s_prefix,
                                                    int *s_rem, int *s_nc, long long *s_wgt, long long *s_weq) {
  constexpr int NT = C::NT, NW = NT / 32;
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


template <class C>
static __global__ void __launch_bounds__(C::NT, C::MINB) tkf_kernel(dsa_topk_launch a) {
  constexpr int NT = C::NT, NW = NT / 32, U = TKF_U, CAP = C::CAP, WIN = C::WIN;
  constexpr int WPT = WIN / 32 / NT; /* bitmap words per thread in the emit scan */
  extern __shared__ __align__(16) uint32_t tkf_smem[];
  uint32_t *const ck = tkf_smem;                       /* [CAP] candidate float bits, then keys */
  uint32_t *const cc = tkf_smem + CAP;                 /* [CAP] candidate columns */
  int *const h0 = (int *)(tkf_smem + 2 * CAP);         /* [3 * TK_BINS] histograms h0, h1, h2 */
  uint32_t *const bg = (uint32_t *)h0;                 /* emit: [WIN / 32] key > T* (over h0..) */
  uint32_t *const be = bg + WIN / 32;                  /* emit: [WIN / 32] key == T* */
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
    if (row + gridDim.x < a.rows) tkf_prefetch_next<C>(a, row + gridDim.x, tid);

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
    if (Li <= CAP) {
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
      const tkf_geom g = tkf_geometry<C>(src, Li);
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
      int rem = (int)(((int64_t)C::TARGET * 4 * g.sv + L - 1) / L), nc; /* 1 <= r < S */
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
            m |= (tkf_ge(v[u].x, tf) | (tkf_ge(v[u].y, tf) << 1) | (tkf_ge(v[u].z, tf) << 2) |
                  (tkf_ge(v[u].w, tf) << 3))
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
          if (wb + tot > CAP) return false; /* warp-uniform: s_cnt > CAP, the row falls back */
          uint32_t *p = ck + (wb + x - n); /* this lane's slots; the columns sit CAP words after */
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const uint32_t cb = (uint32_t)g.hd + 4u * (uint32_t)(base + u * NT + tid);
            const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if ((m >> (4 * u + j)) & 1u) {
                p[0] = __float_as_uint(e[j]);
                p[CAP] = cb + j;
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
            if (tkf_ge(xv, tf)) {
              const int p = atomicAdd(&s_cnt, 1);
              if (p < CAP) {
                ck[p] = __float_as_uint(xv);
                cc[p] = (uint32_t)col;
              }
            }
          }
        }
        __syncthreads();
        c = s_cnt;
      }
      if (c < k || c > CAP) { /* block-uniform */
        tkf_fallback<C>(src, L, k, add, out, h0, s_scan, &s_prefix, &s_rem, &s_nc, s_wgt, s_weq);
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

    /* ---- emit: per window of WIN columns, bitmaps of the candidates > thr and == thr, one
     * block scan of (popc gt << 16 | popc eq) over the words (both < 65536: at most CAP bits) ---- */
    int gb_run = 0, eb_run = 0;
#pragma unroll 1
    for (int64_t w0 = 0; w0 < L; w0 += WIN) {
      /* the histograms (and the previous window's words) were last read before a barrier */
      for (int i = tid; i < 2 * (WIN / 32); i += NT) bg[i] = 0u;
      __syncthreads();
      for (int i = tid; i < c; i += NT) {
        const uint32_t key = ck[i];
        const uint32_t col = cc[i] - (uint32_t)w0;
        if (col < WIN && key >= thr) atomicOr(key > thr ? &bg[col >> 5] : &be[col >> 5], 1u << (col & 31));
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

/* The bisection kernel: the launches whose rows all have at most kTkbCap = 4096 columns, by a
 * bisection on the keys held in registers. One row per 256-thread CTA, thread t holding columns
 * t + 256 u (u < 16: each warp load is 128 contiguous bytes), up to five CTAs per SM. The K-th
 * largest key T* is found bit by bit from the highest bit where the row's min and max keys differ
 * (the bits above are common): per bit, the block counts the keys that match the prefix decided so
 * far with the bit set (one warp reduction, one barrier on a double-buffered count); it stops as soon
 * as the keys matching the prefix are exactly the ones still needed (all taken: no ties), else after
 * bit 0 with T* and the number of its ties to take. Random scores need ~11 steps
 * (dev/topk_bisect_model.py, an emulation of this kernel, matches the contract's selection on ties,
 * NaN, +-0, +-inf and constant rows). The emit: per u, ballots of the keys taken outright (>= a lower
 * bound) and of T*'s ties; one block scan of the (u, warp) counts in column order gives each warp its
 * output base; ties go to the smallest columns; ascending output as the filter kernel's. No
 * shared-memory copy of the row, 672 B of shared memory. */
namespace {
constexpr int kTkbThreads = 256, kTkbKeys = 16, kTkbMinBlocks = 5;
constexpr int kTkbCap = kTkbThreads * kTkbKeys; /* columns of a row at most */
static_assert(kTkbCap == TKB_CAP, "the dispatch's column bound (cuda/topk/topk_common.cuh) is this kernel's");
}  // namespace

/* The K-th largest of the n keys held KPT per thread (key[u] of
 * item tid + NT u, valid below n; an invalid item's key is 0, which no candidate below matches) by
 * bisection: bit by bit from the highest bit where the min and max valid keys differ (the bits above
 * are common), the block counts the keys that match the prefix decided so far with the bit set (one
 * warp reduction, one barrier on a double-buffered count); it stops as soon as the keys matching
 * the prefix are exactly the ones still needed. Returns the selection: every valid key >= *lo, and
 * the first *need_eq (by item order, the caller's) of the keys == *teq (T*) below it; k < n. The
 * shared arrays' previous readers must be behind a barrier (the caller's row loop has several). */
template <int NT, int KPT>
static __device__ __forceinline__ void tkb_bisect(const uint32_t (&key)[KPT], int n, int k, int (*s_cnt)[NT / 32],
                                                  uint32_t *s_min, uint32_t *s_max, uint32_t *lo, uint32_t *teq,
                                                  int *need_eq) {
  constexpr int NW = NT / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t kmn = 0xffffffffu, kmx = 0u;
#pragma unroll
  for (int u = 0; u < KPT; ++u)
    if (tid + NT * u < n) {
      kmn = min(kmn, key[u]);
      kmx = max(kmx, key[u]);
    }
  kmn = __reduce_min_sync(0xffffffffu, kmn);
  kmx = __reduce_max_sync(0xffffffffu, kmx);
  if (lane == 0) {
    s_min[warp] = kmn;
    s_max[warp] = kmx;
  }
  __syncthreads();
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    kmn = min(kmn, s_min[w]);
    kmx = max(kmx, s_max[w]);
  }
  const uint32_t x = kmn ^ kmx;
  int b = x ? 31 - __clz((int)x) : -1;
  uint32_t prefix = b == 31 ? 0u : (b >= 0 ? (kmx >> (b + 1)) << (b + 1) : kmx);
  int rem = k, nmatch = n, p = 0; /* block-uniform */
  for (; b >= 0 && nmatch != rem; --b) {
    const uint32_t cand = prefix | (1u << b), hm = 0xffffffffu << b;
    int c = 0;
#pragma unroll
    for (int u = 0; u < KPT; ++u) c += (int)((key[u] & hm) == cand);
    c = __reduce_add_sync(0xffffffffu, c);
    if (lane == 0) s_cnt[p][warp] = c;
    __syncthreads();
    int c1 = 0;
#pragma unroll
    for (int w = 0; w < NW; ++w) c1 += s_cnt[p][w];
    p ^= 1;
    if (c1 >= rem) {
      prefix = cand;
      nmatch = c1;
    } else {
      rem -= c1;
      nmatch -= c1;
    }
  }
  const bool exact = nmatch == rem; /* the keys matching the prefix are exactly the rest: no ties */
  *lo = exact ? prefix : prefix + 1u; /* T* <= +inf's key < 0xffffffff: no wrap */
  *teq = prefix;
  *need_eq = exact ? 0 : rem;
}

static __global__ void __launch_bounds__(kTkbThreads, kTkbMinBlocks) tkb_kernel(dsa_topk_launch a) {
  constexpr int NT = kTkbThreads, NW = NT / 32, KPT = kTkbKeys;
  __shared__ int s_cnt[2][NW];
  __shared__ uint32_t s_min[NW], s_max[NW];
  __shared__ int s_base[KPT * NW]; /* per (u, warp): (taken-outright count << 16 | tie count), then its exclusive prefix */
  __shared__ int s_scan[NW];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k = a.k;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    int64_t L, add;
    int32_t *out;
    const float *src;
    if (!tk_row_begin<NT>(a, row, tid, &L, &add, &out, &src)) continue; /* L <= k: written; block-uniform */
    const int Li = (int)L; /* k < Li <= 4096 */
    /* key[u] of column tid + NT u; 0 past the row (NaN's key too: validity is tested where it matters;
     * the bisection's candidates have a bit set, which 0 never matches) */
    uint32_t key[KPT];
    {
      /* all 16 loads in flight before the first use, none predicated: past the row a load reads the
       * row's first score instead (its address picked by a select whose predicate dies at once; a
       * branch or a predicate per load lets ptxas keep only a few loads in flight: 7 predicate
       * registers) */
      float v[KPT];
      const float *base = src + tid;
#pragma unroll
      for (int u = 0; u < KPT; ++u) v[u] = __ldg(tid + NT * u < Li ? base + NT * u : src);
#pragma unroll
      for (int u = 0; u < KPT; ++u) key[u] = tid + NT * u < Li ? tk_key(v[u]) : 0u;
    }
    /* taken outright: keys >= lo; ties: need_eq of the keys == teq (T*), the smallest columns */
    uint32_t lo, teq;
    int need_eq;
    tkb_bisect<NT, KPT>(key, Li, k, s_cnt, s_min, s_max, &lo, &teq, &need_eq);
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
      const bool v = tid + NT * u < Li, g = v && key[u] >= lo, e = v && !g && key[u] == teq;
      const unsigned mg = __ballot_sync(0xffffffffu, g), me = __ballot_sync(0xffffffffu, e);
      if (lane == 0) s_base[u * NW + warp] = (__popc(mg) << 16) | __popc(me);
    }
    __syncthreads();
    {
      const int v = tid < KPT * NW ? s_base[tid] : 0; /* (u, warp) in column order; sums < 65536 each */
      const int ex = tk_block_excl_scan<NT>(v, s_scan);
      if (tid < KPT * NW) s_base[tid] = ex;
    }
    __syncthreads();
    const unsigned lt = (1u << lane) - 1u;
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
      const bool v = tid + NT * u < Li, g = v && key[u] >= lo, e = v && !g && key[u] == teq;
      const unsigned mg = __ballot_sync(0xffffffffu, g), me = __ballot_sync(0xffffffffu, e);
      const int base = s_base[u * NW + warp];
      const int gb = (base >> 16) + __popc(mg & lt), eb = (base & 0xffff) + __popc(me & lt);
      if (g || (e && eb < need_eq)) out[gb + (eb < need_eq ? eb : need_eq)] = (int32_t)(tid + NT * u + add);
    }
    /* the next row's first shared writes (s_min) come after these reads in every thread's order and
     * before its min / max barrier, which no thread passes before all finished this row */
  }
}

extern "C" dsa_status dsa_topk_launch_bisect(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  const int64_t slots = (int64_t)kTkbMinBlocks * ctx->sm_count;
  const int64_t grid = a->rows < slots ? a->rows : slots;
  tkb_kernel<<<(unsigned)grid, kTkbThreads, 0, stream>>>(*a);
  return dsa_cuda_status(cudaGetLastError(), "dsa_topk (kernel launch)");
}

template <class C>
static dsa_status tkf_launch(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* MINB CTAs per SM: the largest carveout too */
  DSA_TRY(dsa_kernel_smem_once((const void *)tkf_kernel<C>, C::SMEM, 1, ctx->device, attr_set,
                               "dsa_topk (cudaFuncSetAttribute)"));
  const int64_t slots = (int64_t)C::MINB * ctx->sm_count;
  const int64_t grid = a->rows < slots ? a->rows : slots;
  tkf_kernel<C><<<(unsigned)grid, C::NT, C::SMEM, stream>>>(*a);
  return dsa_cuda_status(cudaGetLastError(), "dsa_topk (kernel launch)");
}

extern "C" dsa_status dsa_topk_launch_filter(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  return tkf_launch<TkfLong>(ctx, a, stream);
}
