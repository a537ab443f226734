/*
 * bwd_common.cuh - the small passes of dsa_sparse_attn_bwd, shared by the portable launcher
 * (cuda/attn_bwd/bwd_portable.cu) and the sm_90a ones (cuda/attn_bwd/bwd_sm90_h64.cu,
 * cuda/attn_bwd/bwd_sm90_ws.cu). One
 * source definition: the files include this header, and each compiles its own copy of the kernels it
 * uses (anonymous namespace, no relocatable device code, so no symbol crosses a translation unit).
 * The launchers therefore run the very same arithmetic for L', the dsink partials (bwd_row_stats;
 * the warp-specialised kernel sums its own Delta in its prologue), the fp32 -> bf16 conversion, dsink
 * and the deterministic modes' key lists (and the two sm_90a ones the same deterministic dKV reduction
 * and workspace layout).
 *
 *  - prep:    one CTA per token (block-stride loop), one warp per head: Delta = sum_{d<512} out*dout,
 *             L' = logaddexp(lse, sink) (+inf for rows that contribute nothing: no valid slot, or
 *             lse = +inf), part = exp(sink - L') * Delta (0 where excluded).
 *  - convert: fp32 accumulator [T_kv, D] (row stride D) -> bf16 dkv; a NULL source writes zeros.
 *             bwd_convert_lay1_kernel<D>: the same from the sm_90a kernels' permuted layout 1.
 *  - dsink:   one CTA per head sums the per-token partials in a fixed order (deterministic in both
 *             modes).
 *  - keys:    entry i < n of a token range starting at tok0 (token tok0 + i / K, slot i % K):
 *             key = the kv row of a valid slot (j < clamp(len, 0, K) and 0 <= idx < T_kv), else the
 *             sentinel T_kv; value = the token (portable key-major path) or i (sm_90a chunked path).
 *             A stable radix sort by key then keeps each row's entries in ascending (token, slot)
 *             order.
 *  - offsets: off[r] = first position of the sorted keys with key >= r, r = 0..T_kv
 *             (dsa_sorted_key_offsets_kernel, cuda/common/radix_sort.cuh, shared with the indexer backward).
 *  - det reduce (the sm_90a kernels' deterministic mode: cuda/attn_bwd/bwd_sm90_ws.cu and
 *             cuda/attn_bwd/bwd_sm90_h64.cu): acc[r] += the row's per-slot dKV rows of one chunk in
 *             sorted (token, slot, head block) order; with it bwd_det_layout, the one chunked
 *             workspace layout of both sm_90a launchers (and of the op's size query).
 * Host helpers: 256-B region alignment, grid sizing, the radix sort's key width and temp size.
 * Workspace prefix of both launchers (every region 256-B aligned from the aligned-up base):
 * delta, lp, part [T, H] f32 (then acc [T_kv, D] f32 in the modes that use it).
 */
#ifndef DSA_ATTN_BWD_COMMON_CUH
#define DSA_ATTN_BWD_COMMON_CUH

#include <stdint.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cub/device/device_radix_sort.cuh>
#include "common/radix_sort.cuh"

#include "internal.h"

/* CUB lives in dsa_cub::cub (-DCUB_WRAPPED_NAMESPACE); CUB_NS_QUALIFIER names it either way. */
namespace cub = CUB_NS_QUALIFIER;

namespace {

constexpr int kBwdSmallThreads = 256; /* prep (8 warps), convert, keys, offsets, dsink */
constexpr size_t kBwdAlign = 256;     /* workspace region alignment */
/* Spare rows after the non-deterministic fp32 dkv accumulator's T_kv rows (2.25 MiB at D = 576): the
 * warp-specialised kernel reduces an invalid slot's zeros into one of them (cuda/attn_bwd/
 * bwd_sm90_ws.cu ws_gather) instead of branching around each reduction, so that a non-finite q / dO
 * (0 * inf) reaches no real row. Zeroed with the accumulator, never read. 1024 rows: CTA b's 64-row
 * tiles land on rows 64 (b % 16) .. + 63, so concurrent CTAs share them at most ~9 ways. */
constexpr int64_t kBwdSpareRows = 1024;

__device__ __forceinline__ float bf2f(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
__device__ __forceinline__ uint16_t f2bf(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

/* topk_length[t] clamped to [0, K] (K without topk_length). */
__device__ __forceinline__ int bwd_eff_len(const dsa_attn_bwd_params &p, int64_t t) {
  if (p.topk_length == nullptr) return p.topk;
  const int l = p.topk_length[t];
  return l < 0 ? 0 : (l > p.topk ? p.topk : l);
}

/* The kv row of slot j of token t, or -1 when the slot is invalid (j >= len, idx outside [0, T_kv)). */
__device__ __forceinline__ int bwd_slot_row(const dsa_attn_bwd_params &p, int64_t t, int j, int len) {
  if (j >= len) return -1;
  const int v = p.indices[t * p.indices_stride + j];
  return (v >= 0 && (int64_t)v < p.num_kv) ? v : -1;
}

/* L' and the dsink partial of a row from its lse L, its head's sink sk (-inf without sinks), Delta s
 * and whether the row has a valid slot (any): L' = logaddexp(L, sk) (L without a sink), +inf when the
 * row contributes nothing (no valid slot, or L = +inf); part = exp(sk - L') Delta, 0 where excluded.
 * The prep kernel and the warp-specialised kernel's prologue both call it. */
__device__ __forceinline__ void bwd_row_stats(float L, float sk, bool any, float s, float *lp, float *part) {
  float Lp = INFINITY;
  if (any && L != INFINITY) {
    if (sk == -INFINITY) Lp = L;
    else Lp = fmaxf(L, sk) + log1pf(expf(-fabsf(L - sk)));
  }
  *lp = Lp;
  *part = (any && isfinite(sk) && Lp != INFINITY) ? expf(sk - Lp) * s : 0.f;
}

/* ---- prep: Delta, L', dsink partials ---------------------------------------------------------- */
/* len_out (non-NULL only without topk_length): each row's last valid slot + 1 (0 for none), a
 * length under which the row's valid slots all lie, for a main kernel to skip the -1 tail. A NULL
 * delta asks for the lengths only (the warp-specialised kernel computes Delta, L' and the partials
 * itself, in its prologue). */
__global__ void __launch_bounds__(kBwdSmallThreads) bwd_prep_kernel(const __grid_constant__ dsa_attn_bwd_params p,
                                                                    float *delta, float *lp, float *part,
                                                                    int32_t *len_out) {
  __shared__ int wlast[kBwdSmallThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int len = bwd_eff_len(p, t);
    int any = 0;
    if (len_out) {
      int last = -1;
      for (int j = tid; j < len; j += kBwdSmallThreads)
        if (bwd_slot_row(p, t, j, len) >= 0) last = j;
      last = __reduce_max_sync(0xffffffffu, last);
      if (lane == 0) wlast[warp] = last;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kBwdSmallThreads / 32; ++w) last = max(last, wlast[w]);
      any = last >= 0;
      if (tid == 0) len_out[t] = last + 1;
      __syncthreads(); /* wlast is rewritten for the next token */
    } else {
      for (int j = tid; j < len && !any; j += kBwdSmallThreads) any = bwd_slot_row(p, t, j, len) >= 0;
      any = __syncthreads_or(any);
    }
    if (delta == nullptr) continue; /* lengths only */
    for (int h = warp; h < p.num_heads; h += kBwdSmallThreads / 32) {
      const uint16_t *o = p.out + t * p.out_stride_token + (int64_t)h * p.out_stride_head;
      const uint16_t *g = p.dout + t * p.dout_stride_token + (int64_t)h * p.dout_stride_head;
      float s = 0.f;
      for (int d = lane; d < DSA_VALUE_DIM; d += 32) s += bf2f(o[d]) * bf2f(g[d]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) {
        const int64_t th = t * p.num_heads + h;
        float Lp, pt;
        bwd_row_stats(p.lse[th], p.sink ? p.sink[h] : -INFINITY, any, s, &Lp, &pt);
        delta[th] = s;
        lp[th] = Lp;
        part[th] = pt;
      }
    }
    __syncthreads();
  }
}

/* ---- fp32 accumulator [T_kv, D] (row stride D) -> bf16 dkv (src NULL: zeros) ------------------- */
__global__ void bwd_convert_kernel(const __grid_constant__ dsa_attn_bwd_params p, const float *src) {
  const int64_t n = p.num_kv * p.head_dim;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / p.head_dim, d = i - r * p.head_dim;
    p.dkv[r * p.dkv_stride + d] = src ? f2bf(src[i]) : (uint16_t)0;
  }
}

/* ---- the same from the sm_90a kernels' permuted accumulator (layout 1, src/kernels.h
 * dsa_bwd_dkv_slot): dkv[r][c] = bf16(src[r][slot(c)]). The permutation stays inside aligned
 * 16-column groups, so a warp's reads still cover the same 128 B as layout 0's. D (576 / 512) is a
 * template constant; a template so that only the launchers that run layout 1 instantiate it.
 * One thread per 16-column group: four 16-B loads, the permutation in registers (compile-time
 * indices), two 16-B stores (the op's checks require 16-B aligned dkv rows). */
constexpr int kBwdConvertPerThread = 16; /* columns per work item */
template <int D>
__global__ void bwd_convert_lay1_kernel(const __grid_constant__ dsa_attn_bwd_params p, const float *src) {
  constexpr int kG = D / 16; /* groups per row */
  const int64_t n = p.num_kv * kG;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / kG;
    const int g = (int)(i - r * kG);
    const float4 *s4 = (const float4 *)(src + r * D + 16 * g);
    float a[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 v = __ldcs(s4 + k);
      a[4 * k] = v.x;
      a[4 * k + 1] = v.y;
      a[4 * k + 2] = v.z;
      a[4 * k + 3] = v.w;
    }
    uint32_t w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      w[k] = (uint32_t)f2bf(a[dsa_bwd_dkv_slot(2 * k)]) | (uint32_t)f2bf(a[dsa_bwd_dkv_slot(2 * k + 1)]) << 16;
    uint4 *d4 = (uint4 *)(p.dkv + r * p.dkv_stride + 16 * g);
    d4[0] = make_uint4(w[0], w[1], w[2], w[3]);
    d4[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

/* ---- dsink: one CTA per head, fixed-order reduction of the per-token partials ------------------ */
__global__ void __launch_bounds__(kBwdSmallThreads) bwd_dsink_kernel(const __grid_constant__ dsa_attn_bwd_params p,
                                                                     const float *part) {
  __shared__ float red[kBwdSmallThreads];
  const int h = blockIdx.x, tid = threadIdx.x;
  float s = 0.f;
  for (int64_t t = tid; t < p.num_tokens; t += kBwdSmallThreads) s += part[t * p.num_heads + h];
  red[tid] = s;
  __syncthreads();
  for (int w = kBwdSmallThreads / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  if (tid == 0) {
    const float sk = p.sink ? p.sink[h] : -INFINITY;
    p.dsink[h] = (p.sink && isfinite(sk) && p.num_tokens > 0) ? -red[0] : 0.f;
  }
}

/* ---- deterministic modes: key list and offsets ------------------------------------------------ */
/* Entry i < n: token tok0 + i / K, slot i % K. key = its kv row when valid, else the sentinel T_kv;
 * value = the token (per_token != 0) or i. */
__global__ void bwd_keys_kernel(const __grid_constant__ dsa_attn_bwd_params p, int64_t tok0, int64_t n,
                                int per_token, uint32_t *keys, int32_t *vals) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t tl = i / p.topk;
    const int j = (int)(i - tl * p.topk);
    const int64_t t = tok0 + tl;
    const int r = bwd_slot_row(p, t, j, bwd_eff_len(p, t));
    keys[i] = r >= 0 ? (uint32_t)r : (uint32_t)p.num_kv;
    vals[i] = per_token ? (int32_t)t : (int32_t)i;
  }
}


/* ---- host helpers ----------------------------------------------------------------------------- */
inline size_t bwd_align_up(size_t x) { return (x + kBwdAlign - 1) / kBwdAlign * kBwdAlign; }

inline unsigned bwd_grid_for(int64_t n, int64_t per_block, int64_t cap) {
  int64_t g = (n + per_block - 1) / per_block;
  if (g > cap) g = cap;
  if (g < 1) g = 1;
  return (unsigned)g;
}

constexpr unsigned kBwdGridCap = 1u << 20; /* block-stride loops above this */

/* The deterministic modes' sort regions for n entries, appended at offset *o (each 256-B aligned):
 * keys0, keys1 [n] u32, vals0, vals1 [n] i32, off [T_kv + 1] i64, CUB radix-sort temp for n items
 * (0 bytes when n or T_kv is 0). Both layouts (cuda/attn_bwd/bwd_portable.cu's make_layout, bwd_det_layout
 * below) end with these. */
struct BwdSortLayout {
  size_t keys0, keys1, vals0, vals1, off, temp;
  size_t temp_bytes;
  int end_bit; /* radix sort key bits: the sentinel num_kv fits */
};

inline dsa_status bwd_sort_layout(int64_t n, int64_t num_kv, size_t *o, BwdSortLayout *S) {
  *S = BwdSortLayout();
  S->end_bit = dsa_radix_key_bits(num_kv);
  S->keys0 = *o; *o += bwd_align_up((size_t)n * 4);
  S->keys1 = *o; *o += bwd_align_up((size_t)n * 4);
  S->vals0 = *o; *o += bwd_align_up((size_t)n * 4);
  S->vals1 = *o; *o += bwd_align_up((size_t)n * 4);
  S->off = *o; *o += bwd_align_up(((size_t)num_kv + 1) * 8);
  size_t temp = 0;
  if (n > 0 && num_kv > 0) DSA_TRY(dsa_radix_sort_temp_bytes(n, S->end_bit, &temp, "dsa_sparse_attn_bwd"));
  S->temp_bytes = temp;
  S->temp = *o; *o += bwd_align_up(temp);
  return DSA_SUCCESS;
}

/* ---- launch wrappers (params validated and stride-resolved; every launch checked) --------------- */
inline dsa_status bwd_launch_prep(const dsa_attn_bwd_params *p, float *delta, float *lp, float *part,
                                  cudaStream_t stream, int32_t *len_out = nullptr) {
  bwd_prep_kernel<<<bwd_grid_for(p->num_tokens, 1, kBwdGridCap), kBwdSmallThreads, 0, stream>>>(*p, delta, lp,
                                                                                              part, len_out);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}

/* src NULL: dkv = 0 on every row. */
inline dsa_status bwd_launch_convert(const dsa_attn_bwd_params *p, const float *src, cudaStream_t stream) {
  bwd_convert_kernel<<<bwd_grid_for(p->num_kv * p->head_dim, kBwdSmallThreads, kBwdGridCap), kBwdSmallThreads, 0,
                       stream>>>(*p, src);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}

/* layout 1 (src non-NULL, p->head_dim == D): un-permutes while converting */
template <int D>
inline dsa_status bwd_launch_convert_lay1(const dsa_attn_bwd_params *p, const float *src, cudaStream_t stream) {
  bwd_convert_lay1_kernel<D><<<bwd_grid_for(p->num_kv * (D / kBwdConvertPerThread), kBwdSmallThreads, kBwdGridCap), kBwdSmallThreads, 0,
                               stream>>>(*p, src);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}

inline dsa_status bwd_launch_dsink(const dsa_attn_bwd_params *p, const float *part, cudaStream_t stream) {
  bwd_dsink_kernel<<<p->num_heads, kBwdSmallThreads, 0, stream>>>(*p, part);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}

/* Keys of the n entries from token tok0, stable radix sort (the regions of S in the aligned
 * workspace ws: double buffers keys0/keys1, vals0/vals1, temp), offsets off[0..T_kv] (region off).
 * *vals_sorted: the value buffer holding the result. */
inline dsa_status bwd_launch_sorted_keys(const dsa_attn_bwd_params *p, int64_t tok0, int64_t n, int per_token,
                                         const BwdSortLayout &S, unsigned char *ws, const int32_t **vals_sorted,
                                         cudaStream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  uint32_t *k0 = (uint32_t *)(ws + S.keys0), *k1 = (uint32_t *)(ws + S.keys1);
  int32_t *v0 = (int32_t *)(ws + S.vals0), *v1 = (int32_t *)(ws + S.vals1);
  bwd_keys_kernel<<<bwd_grid_for(n, kBwdSmallThreads, kBwdGridCap), kBwdSmallThreads, 0, stream>>>(*p, tok0, n,
                                                                                                 per_token, k0, v0);
  DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  cub::DoubleBuffer<uint32_t> kb(k0, k1);
  cub::DoubleBuffer<int32_t> vb(v0, v1);
  size_t tb = S.temp_bytes;
  DSA_TRY(dsa_cuda_status((int)cub::DeviceRadixSort::SortPairs(ws + S.temp, tb, kb, vb, n, 0, S.end_bit, stream),
                          fn));
  dsa_sorted_key_offsets_kernel<<<bwd_grid_for(p->num_kv + 1, kBwdSmallThreads, kBwdGridCap), kBwdSmallThreads, 0, stream>>>(
      kb.Current(), n, p->num_kv, (int64_t *)(ws + S.off));
  DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  *vals_sorted = vb.Current();
  return DSA_SUCCESS;
}

/* ---- sm_90a deterministic mode: chunked workspace and fixed-order dKV reduction -----------------
 * Used by the two sm_90a launchers (cuda/attn_bwd/bwd_sm90_ws.cu and bwd_sm90_h64.cu, H <= 128 in
 * head blocks of 64); the portable launcher does not use them. Tokens run in chunks of C;
 * bwd_launch_sorted_keys sorts the chunk's entry ids i = token_in_chunk * K + slot by kv row. The
 * lockstep kernel stores each valid slot's fp32 dKV row to contrib[(token_in_chunk * NHB +
 * head_block) * K + slot][D] and the reduction gathers them in sorted order after the sort
 * (bwd_det_sort_reduce); the warp-specialised kernel runs after the sort and stores entry i's rows at
 * contrib[pos[i] * NHB + head_block], pos[i] = i's rank (bwd_det_sort_pos), so the reduction reads
 * each kv row's rows as one run (bwd_det_reduce_sorted). */
constexpr size_t kBwdDetContribBudget = (size_t)2 << 30; /* contrib bytes (per chunk; split in two with the overlap) */
constexpr int kBwdDetHeadBlock = 64;                      /* heads per contrib head block */
constexpr int kBwdDetRedBatch = 8;                        /* entries whose loads are in flight together */
constexpr int kBwdDetDumpRows = 64; /* contrib rows after the entries' (the sorted layout's partial-tile slots) */

/* The sorted layout's row positions: pos[vals[s]] = s for the n sorted entries (entry i's rank);
 * vals NULL (no kv rows: every entry invalid, nothing sorted): pos[s] = s. */
__global__ void bwd_det_pos_kernel(const int32_t *vals, int64_t n, int32_t *pos) {
  for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < n; s += (int64_t)gridDim.x * blockDim.x)
    pos[vals != nullptr ? vals[s] : s] = (int32_t)s;
}

/* acc[r] = ((acc[r] + c_0) + c_1) + ... over kv row r's entries [off[r], off[r + 1]) of this chunk in
 * sorted order (ascending token, then slot), each entry's NHB head blocks in order 0, 1; this thread's
 * float4 d4 of the row. kBatch entries' loads are in flight together: the batch groups the loads only,
 * the adds stay in entry order, so every kBatch gives the same bits. Where the rows are: kSorted (the
 * warp-specialised kernel stores them in sorted order), the entry at sorted position s has head block
 * hb's row at s NHB + hb, so a kv row's rows are one contiguous run; else entry v = (token in chunk) K
 * + slot has it at ((v / K) NHB + hb) K + v % K (NHB = 1: row v itself, without the division). The
 * sum is per column, so the column order of the rows (real, or the permuted one of the
 * warp-specialised kernel) passes through to acc unchanged. */
template <int D, int NHB, bool kSorted, int kBatch>
__device__ __forceinline__ void bwd_det_reduce_row(const float *contrib, const int64_t *off, const int32_t *vals,
                                                   float *acc, int64_t r, int K, int d4) {
  const int64_t e0 = off[r], e1 = off[r + 1];
  if (e0 == e1) return;
  float4 x = ((const float4 *)(acc + r * D))[d4];
  for (int64_t e = e0; e < e1; e += kBatch) {
    const int ne = e1 - e < kBatch ? (int)(e1 - e) : kBatch;
    float4 c[kBatch * NHB];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (i < ne) {
        int64_t row, hstride;
        if constexpr (kSorted) {
          row = (e + i) * NHB;
          hstride = 1;
        } else {
          const int v = __ldg(vals + e + i);
          if constexpr (NHB == 1) {
            row = (int64_t)v;
          } else {
            const int tl = v / K, j = v - tl * K;
            row = (int64_t)tl * NHB * K + j;
          }
          hstride = K;
        }
#pragma unroll
        for (int hb = 0; hb < NHB; ++hb)
          c[i * NHB + hb] = __ldcs((const float4 *)(contrib + (row + hb * hstride) * D) + d4);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (i < ne) {
#pragma unroll
        for (int hb = 0; hb < NHB; ++hb) {
          const float4 y = c[i * NHB + hb];
          x.x += y.x;
          x.y += y.y;
          x.z += y.z;
          x.w += y.w;
        }
      }
    }
  }
  ((float4 *)(acc + r * D))[d4] = x;
}

/* One CTA of D / 4 threads (one float4 of the D dims each: 144 at D = 576, 128 at D = 512) per kv row
 * (block-stride), bwd_det_reduce_row with kBwdDetRedBatch. Every row is owned by one CTA and every sum
 * has a fixed order: no atomics, bitwise reproducible. */
template <int D, int NHB, bool kSorted>
__global__ void __launch_bounds__(D / 4) bwd_det_reduce_kernel(const float *contrib, const int64_t *off,
                                                               const int32_t *vals, float *acc, int64_t T_kv, int K) {
  const int d4 = threadIdx.x;
  for (int64_t r = blockIdx.x; r < T_kv; r += gridDim.x)
    bwd_det_reduce_row<D, NHB, kSorted, kBwdDetRedBatch>(contrib, off, vals, acc, r, K, d4);
}


/* Deterministic-mode workspace (offsets from the 256-B aligned base; every region 256-B aligned):
 * delta, lp, part [T, H] f32 and acc [T_kv, D] f32 exactly as in the non-deterministic layout,
 * then contrib [C * ceil(H / 64) * K + 64 (dump rows), D] f32, keys0, keys1 [C * K] u32, vals0,
 * vals1 [C * K] i32, off [T_kv + 1] i64, CUB radix-sort temp for C * K items, pos [C * K] i32; C = tokens per chunk (at most 2 GiB
 * of contrib; chunk_tokens > 0, DSA_OPTION_BWD_DET_CHUNK_TOKENS, overrides it; clamped to 1..T and to
 * int32 entry ids), then a second sort region and rank array (the warp-specialised launcher sorts
 * chunk c + 1 on the context's side stream while chunk c is reduced). Both sm_90a launchers and the
 * op's size query (dsa_bwd_sm90_det_workspace_size, cuda/attn_bwd/bwd_launch.cuh) compute this one
 * layout. */
/* The caller's workspace pointer aligned up to kBwdAlign (every size query counts that slack). */
inline unsigned char *bwd_align_workspace(void *workspace) {
  return (unsigned char *)(((uintptr_t)workspace + kBwdAlign - 1) & ~(uintptr_t)(kBwdAlign - 1));
}

/* The regions every backward workspace starts with, at the same offsets in cuda/attn_bwd/bwd_portable.cu's
 * make_layout and in bwd_det_layout: delta, lp, part ([T x H] fp32 each), len ([T] int32: the prep's
 * row lengths when topk_length is NULL), then the fp32 dKV accumulator; ws is the aligned workspace. */
/* The warp-specialised kernel's non-deterministic mode runs its last tokens (in CTA order) as two CTAs each, one per half of the
 * row's tiles, so that the last wave holds half-length CTAs; each half stores its fp32 dQ to a
 * partial [2][S][H][D] that bwd_sm90_ws.cu's combine sums (half 0 + half 1) into dq. S tokens: about
 * one wave of CTAs (kBwdSplitCtas, independent of the device so that the size query needs none). */
constexpr int64_t kBwdSplitCtas = 128;
inline int64_t bwd_split_tokens(const dsa_attn_bwd_params *p) {
  const int64_t nhb = (p->num_heads + kBwdDetHeadBlock - 1) / kBwdDetHeadBlock;
  const int64_t s = kBwdSplitCtas / nhb;
  return p->deterministic ? 0 : (p->num_tokens < s ? p->num_tokens : s);
}
inline size_t bwd_split_bytes(const dsa_attn_bwd_params *p) {
  return bwd_align_up((size_t)2 * (size_t)bwd_split_tokens(p) * (size_t)p->num_heads * (size_t)p->head_dim * 4);
}

struct BwdBaseRegions {
  float *delta, *lp, *part, *acc;
  int32_t *len;
};
inline BwdBaseRegions bwd_base_regions(unsigned char *ws, const dsa_attn_bwd_params *p) {
  const size_t th = bwd_align_up((size_t)p->num_tokens * (size_t)p->num_heads * 4);
  BwdBaseRegions r;
  r.delta = (float *)ws;
  r.lp = (float *)(ws + th);
  r.part = (float *)(ws + 2 * th);
  r.len = (int32_t *)(ws + 3 * th);
  r.acc = (float *)(ws + 3 * th + bwd_align_up((size_t)p->num_tokens * 4));
  return r;
}

/* No tokens: the outputs are still defined, dkv = 0 on every row and dsink = 0 (the checks accept a
 * NULL dkv / dsink for zero-size work: then it is not written). part: the dsink partials region. */
inline dsa_status bwd_zero_tokens(const dsa_attn_bwd_params *p, const float *part, cudaStream_t stream) {
  if (p->num_kv > 0 && p->dkv != nullptr) DSA_TRY(bwd_launch_convert(p, nullptr, stream));
  if (p->dsink) DSA_TRY(bwd_launch_dsink(p, part, stream));
  return DSA_SUCCESS;
}

struct BwdDetLayout {
  size_t delta, lp, part, acc, contrib, pos;
  BwdSortLayout sort; /* keys0 .. temp */
  size_t pos2;        /* the second rank array and sort region (the sort ahead) */
  BwdSortLayout sort2;
  size_t total;
  int64_t chunk; /* C */
};

inline dsa_status bwd_det_layout(const dsa_attn_bwd_params *p, int64_t chunk_tokens, BwdDetLayout *L) {
  const size_t th = (size_t)p->num_tokens * (size_t)p->num_heads;
  const size_t D = (size_t)p->head_dim;
  const int nhb = (p->num_heads + kBwdDetHeadBlock - 1) / kBwdDetHeadBlock;
  const size_t per_tok = (size_t)nhb * (size_t)p->topk * D * 4;
  int64_t C = chunk_tokens > 0 ? chunk_tokens : (int64_t)(kBwdDetContribBudget / per_tok);
  if (C < 1) C = 1;
  if (C > (int64_t)INT32_MAX / p->topk) C = (int64_t)INT32_MAX / p->topk; /* entry ids are int32 */
  if (C > p->num_tokens) C = p->num_tokens;
  size_t o = 0;
  *L = BwdDetLayout();
  L->chunk = C;
  L->delta = o; o += bwd_align_up(th * 4);
  L->lp = o; o += bwd_align_up(th * 4);
  L->part = o; o += bwd_align_up(th * 4);
  o += bwd_align_up((size_t)p->num_tokens * 4); /* len (bwd_base_regions) */
  L->acc = o; o += bwd_align_up((size_t)p->num_kv * D * 4);
  L->contrib = o; o += bwd_align_up((size_t)C * per_tok + (size_t)kBwdDetDumpRows * D * 4);
  DSA_TRY(bwd_sort_layout(C * (int64_t)p->topk, p->num_kv, &o, &L->sort));
  L->pos = o; o += bwd_align_up((size_t)C * (size_t)p->topk * 4);
  DSA_TRY(bwd_sort_layout(C * (int64_t)p->topk, p->num_kv, &o, &L->sort2));
  L->pos2 = o; o += bwd_align_up((size_t)C * (size_t)p->topk * 4);
  L->total = o + kBwdAlign; /* slack: the caller's pointer is aligned up inside */
  return DSA_SUCCESS;
}

/* The tokens per launch of a deterministic chunk loop: the layout's C when the chunk size is forced
 * (chunk_tokens > 0), else C rounded down to whole waves, tokens_per_wave = the device's resident CTAs
 * of the main kernel / its CTAs per token, so that a launch of full-length tokens does not end on a
 * part-filled wave (at K = 2048 a wave of full-length tokens takes ~0.2 ms; on 132 SMs 410 tokens
 * take four waves, 396 take three). At most C, so the workspace holds it. */
inline int64_t bwd_det_run_chunk(const BwdDetLayout &L, int64_t chunk_tokens, int64_t tokens_per_wave) {
  if (chunk_tokens > 0 || tokens_per_wave < 1 || L.chunk < tokens_per_wave) return L.chunk;
  return L.chunk / tokens_per_wave * tokens_per_wave;
}

/* One chunk's dKV reduction (after its main kernel): sort the chunk's nt * K entries from token t0
 * by kv row (regions of L in the aligned workspace ws), then acc += contrib in sorted order (rows by
 * entry id: the lockstep kernel's layout). */
template <int D, int NHB>
inline dsa_status bwd_det_sort_reduce(const dsa_attn_bwd_params *p, const BwdDetLayout &L, unsigned char *ws,
                                      int64_t t0, int64_t nt, const float *contrib, float *acc,
                                      cudaStream_t stream) {
  const int32_t *vals = nullptr;
  DSA_TRY(bwd_launch_sorted_keys(p, t0, nt * (int64_t)p->topk, 0, L.sort, ws, &vals, stream));
  bwd_det_reduce_kernel<D, NHB, false><<<bwd_grid_for(p->num_kv, 1, kBwdGridCap), D / 4, 0, stream>>>(
      contrib, (const int64_t *)(ws + L.sort.off), vals, acc, p->num_kv, p->topk);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}

/* The sorted layout, before a chunk's main kernel: sort the chunk's entries by kv row (sort region S)
 * and write each entry's rank to the int32 array at byte offset pos (L.pos; the main kernel stores
 * entry i's rows at pos[i] NHB + hb). */
inline dsa_status bwd_det_sort_pos(const dsa_attn_bwd_params *p, const BwdSortLayout &S, size_t pos,
                                   unsigned char *ws, int64_t t0, int64_t nt, cudaStream_t stream) {
  const int64_t n = nt * (int64_t)p->topk;
  const int32_t *vals = nullptr;
  if (p->num_kv > 0) DSA_TRY(bwd_launch_sorted_keys(p, t0, n, 0, S, ws, &vals, stream));
  bwd_det_pos_kernel<<<bwd_grid_for(n, kBwdSmallThreads, kBwdGridCap), kBwdSmallThreads, 0, stream>>>(
      vals, n, (int32_t *)(ws + pos));
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}

/* The sorted layout's reduction, after a chunk's main kernel: acc += each kv row's contiguous run of
 * rows (off from bwd_det_sort_pos's sort in region S); nhb = ceil(H / 64) head blocks (1 or 2). */
template <int D>
inline dsa_status bwd_det_reduce_sorted(const dsa_attn_bwd_params *p, const BwdSortLayout &S, unsigned char *ws,
                                        const float *contrib, float *acc, int nhb, cudaStream_t stream) {
  const unsigned grid = bwd_grid_for(p->num_kv, 1, kBwdGridCap);
  const int64_t *off = (const int64_t *)(ws + S.off);
  if (nhb == 1)
    bwd_det_reduce_kernel<D, 1, true><<<grid, D / 4, 0, stream>>>(contrib, off, nullptr, acc, p->num_kv, p->topk);
  else
    bwd_det_reduce_kernel<D, 2, true><<<grid, D / 4, 0, stream>>>(contrib, off, nullptr, acc, p->num_kv, p->topk);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_sparse_attn_bwd");
}


}  // namespace

#endif /* DSA_ATTN_BWD_COMMON_CUH */
