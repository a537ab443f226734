/*
 * indexer_bwd_sm90.cu - dsa_indexer_bwd's per-token kernel on sm_90a (dsa_ib_launch_sm90,
 * cuda/indexer_train/train_launch.cuh; the math: docs/indexer-training.md section 4), and dsa_indexer_slot_scores' (its
 * tiles, stages and X = K q^T, then z = sum_h w ReLU(x) per slot: slot_scores_sm90_kernel at the end
 * of the file). With x[j, h] = k_idx[s_j] .
 * q_idx[t, h] and G[j, h] = g[t, j] w[t, h] [x > 0] over the valid slots j of token t:
 *   d_weights[t, h] = sum_j g[t, j] ReLU(x[j, h])          (column sums of g ReLU(X))
 *   d_index_q[t]    = G^T K                                  ([H x 128], K = the slots' key rows)
 *   d_index_k[s_j] += (G q_idx[t])[j]                        ([64 x 128] per tile, fp32 reductions)
 * The automatic choice on cc 9.0 (DSA_OPTION_TRAIN_KERNEL forces either kernel); the CUDA-core
 * kernels of indexer_bwd.cu run everything else. In the deterministic mode the kernel runs with rows:
 * it covers tokens [t0, t0 + grid), writes d_index_q and d_weights, and writes each valid slot's dK
 * row (fp32 [128]) at rows[((t - t0) K + j) 128] instead of reducing it (acc NULL);
 * dk_rows_reduce_kernel (indexer_bwd.cu) sums them per key in a fixed order.
 *
 * One CTA per token, one warpgroup of 128 threads, __launch_bounds__(128, 2): two CTAs per SM, so one
 * CTA's reductions and gathers run under the other's wgmmas. Heads padded to 64 (zero q rows and
 * weights: G = 0 there). Shared memory (1024-B aligned, SW128 [rows][64-column blocks of 8 KB]): q
 * [64 heads x 128] 16 KB, kStages key tiles [64 slots x 128] 16 KB each, G [64 slots x 64 heads] bf16
 * 8 KB, per stage the tile's key rows (int32, -1 invalid) and g (0 at invalid slots), the per-warp
 * d_weights sums [4][64]: 94208 B with the alignment slack.
 *
 * Per 64-slot tile n (stage n % kStages): cp.async.wait_group for tile n, fence.proxy.async,
 * __syncthreads; then the gather of tile n + kStages - 1 into the stage tile n - 1 used (every thread
 * is past its reads: the barrier), one cp.async group per iteration (empty past the last tile);
 *   1. X = K q^T: 8 SS m64n64k16 (keys on M, heads on N; both K-major), wait;
 *   2. per element: d_weights partial += g ReLU(x) (a valid slot; ReLU keeps NaN), G = g w [x > 0]
 *      (0 at invalid slots), packed to bf16 pairs: the accumulator map is the RS A map of the next
 *      product, and stmatrix G to smem for the one after; the tile's key rows into registers;
 *      fence.proxy.async, __syncthreads;
 *   3. dK = G q: 4 RS m64n128k16 (A = G registers, B = q N-major); dQ += G^T K: 4 SS m64n128k16 (A =
 *      G read M-major, B = the key tile N-major); one commit, wait;
 *   4. dK's 64 x 128 fp32 into the permuted accumulator (sm90_red_block_lay1, two 64-column blocks,
 *      evict_last), valid slots only.
 * After the last tile: d_index_q (bf16 pairs) of the heads < H, d_weights from the per-thread
 * partials (sm90_warp_colsum64, then the four warps in order). Every sum but dK's reductions has a
 * fixed order: d_index_q and d_weights are bitwise reproducible. A token without a valid slot writes
 * zeros.
 *
 * x here is the wgmma's fp32 sum over the 128 dims, not head_dot's dimension-ordered fma chain:
 * [x > 0] can differ from the CUDA-core kernels' (and the slot scores') decision where |x| is within
 * rounding of 0, as the fp64 reference's can from either.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "indexer_train/train_launch.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kBlockN = 64;          /* slots per tile: the wgmma M of X and dK */
constexpr int kD = DSA_INDEX_HEAD_DIM; /* 128 */
constexpr int kStages = 4;
constexpr int kTile = 64 * kD * 2;   /* one [64 x 128] bf16 tile: two SW128 blocks */
static_assert(kD == 128, "two 64-column blocks per row");

struct IbSmem {
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kTile;                   /* kStages key tiles */
  static constexpr int kG = kK + kStages * kTile;         /* [64 slots][64 heads] bf16 */
  static constexpr int kIdx = kG + 64 * 128;              /* int32 [kStages][64] */
  static constexpr int kGr = kIdx + kStages * kBlockN * 4; /* f32 [kStages][64] */
  static constexpr int kDw = kGr + kStages * kBlockN * 4; /* f32 [4][64] */
  static constexpr int kEnd = kDw + 4 * 64 * 4;
  static constexpr int kBytes = kEnd + 1024;
};
static_assert(IbSmem::kBytes == 94208, "the size the comment quotes");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void ib_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void ib_wait_stages() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
}

/* Tile n's key rows into stage st (sm90_gather_tile_idx: zero fill and -1 for invalid slots); P: the
 * backward's or the slot scores' params. */
template <class P>
__device__ __forceinline__ void ib_gather_keys(const P &p, uint8_t *smem, uint32_t base, const int32_t *irow, int n,
                                               int st, int klen, int t) {
  int32_t idxs[4];
  sm90_gather_read_indices(irow, n, t >> 3, klen, idxs);
  sm90_gather_tile_idx<2>(base + IbSmem::kK + st * kTile, (int32_t *)(smem + IbSmem::kIdx) + st * kBlockN, idxs,
                          t >> 3, t & 7, p.index_k, p.k_stride, p.num_keys, p.index_q);
}
/* The backward's gather: the key rows, and by threads 0..63 the slot's g (0 where invalid). */
__device__ __forceinline__ void ib_gather(const dsa_indexer_bwd_params &p, uint8_t *smem, uint32_t base,
                                          const int32_t *irow, const float *grow, int n, int st, int klen, int t) {
  ib_gather_keys(p, smem, base, irow, n, st, klen, t);
  if (t < kBlockN) {
    const int j = n * kBlockN + t;
    const int32_t v = j < klen ? __ldg(irow + j) : -1;
    ((float *)(smem + IbSmem::kGr))[st * kBlockN + t] = (v >= 0 && (int64_t)v < p.num_keys) ? __ldg(grow + j) : 0.f;
  }
}

/* X = K q^T of the key tile at koff (keys on M, heads on N; both K-major SW128): 8 SS m64n64k16, waited. */
__device__ __forceinline__ void ib_x_tile(float x[32], uint32_t b4, uint32_t koff) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    x[i] = 0.f;
    sm90_fence_operand(x[i]);
  }
  sm90_wgmma_fence();
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t off = b * 8192 + k * 32;
      sm90_wgmma_ss_m64n64k16<0, 0>(x, sm90_desc_at(b4, koff + off, 16, 1024), sm90_desc_at(b4, IbSmem::kQ + off, 16, 1024),
                                    (b | k) != 0);
    }
  sm90_wgmma_commit();
  sm90_wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) sm90_fence_operand(x[i]);
}

/* This thread's 16 head columns 8 cc + 2 (lane % 4) + e of the X map: their weights (0 past H). */
template <class P>
__device__ __forceinline__ void ib_weights(const P &p, int64_t tok, int lane, float w[16]) {
  const int wbf16 = p.weights_dtype == DSA_DTYPE_BF16;
#pragma unroll
  for (int cc = 0; cc < 8; ++cc)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * cc + 2 * (lane & 3) + e;
      float x = 0.f;
      if (h < p.num_heads)
        x = wbf16 ? __uint_as_float((uint32_t)((const uint16_t *)p.weights)[tok * p.weights_stride + h] << 16)
                  : ((const float *)p.weights)[tok * p.weights_stride + h];
      w[2 * cc + e] = x;
    }
}
#endif

template <bool ROWS>
__global__ void __launch_bounds__(kThreads, 2) indexer_bwd_sm90_kernel(const __grid_constant__ dsa_indexer_bwd_params p,
                                                                       float *acc, float *rows, int64_t t0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int64_t tok = ROWS ? t0 + blockIdx.x : blockIdx.x;
  const int H = p.num_heads;
  const int klen = p.lengths ? min(max(p.lengths[tok], 0), p.topk) : p.topk;
  const int ntiles = (klen + kBlockN - 1) / kBlockN;
  const uint32_t base = sm90_smem_addr(smem), b4 = base >> 4;
  const int32_t *irow = p.indices + tok * p.indices_stride;
  const float *grow = p.grad + tok * p.grad_stride;
  const int32_t *sidx = (const int32_t *)(smem + IbSmem::kIdx);
  const float *sgr = (const float *)(smem + IbSmem::kGr);
  const int r0 = 16 * warp + (lane >> 2), odd = (lane >> 2) & 1;
  const uint64_t pol = sm90_l2_policy(true); /* reductions: evict_last */

  float w[16];
  ib_weights(p, tok, lane, w);

  float dq[64], dwp[16];
#pragma unroll
  for (int i = 0; i < 64; ++i) dq[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) dwp[i] = 0.f;

  if (ntiles > 0) {
    sm90_load_q_heads64<2>(base + IbSmem::kQ, p.index_q, tok, p.q_stride_token, p.q_stride_head, 0, H, t >> 3, t & 7);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < ntiles) ib_gather(p, smem, base, irow, grow, s, s, klen, t);
      ib_commit(); /* group s: tile s (group 0 with q) */
    }
  }
  for (int n = 0; n < ntiles; ++n) {
    const int st = n % kStages;
    ib_wait_stages(); /* tile n's group (kStages - 2 younger ones may be in flight) */
    sm90_fence_proxy_async();
    __syncthreads();
    if (n + kStages - 1 < ntiles) ib_gather(p, smem, base, irow, grow, n + kStages - 1, (n + kStages - 1) % kStages, klen, t);
    ib_commit();
    const uint32_t koff = IbSmem::kK + st * kTile;

    /* 1. X = K q^T (keys on M, heads on N) */
    float x[32];
    ib_x_tile(x, b4, koff);

    /* 2. d_weights partials, G (register i: slot row r0 + 8 ((i >> 1) & 1), head column 8 (i >> 2) +
     * 2 (lane % 4) + (i & 1)) */
    const int32_t *tidx = sidx + st * kBlockN;
    const bool v0 = tidx[r0] >= 0, v1 = tidx[r0 + 8] >= 0;
    const float g0 = sgr[st * kBlockN + r0], g1 = sgr[st * kBlockN + r0 + 8];
    uint32_t gp[16];
#pragma unroll
    for (int cc = 0; cc < 8; ++cc)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float gv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float xv = x[4 * cc + 2 * hr + e];
          const bool v = hr ? v1 : v0;
          const float gj = hr ? g1 : g0;
          const float relu = (xv > 0.f || xv != xv) ? xv : 0.f; /* ReLU keeps NaN */
          if (v) dwp[2 * cc + e] += gj * relu;
          gv[e] = (v && xv > 0.f) ? gj * w[2 * cc + e] : 0.f;
        }
        gp[2 * cc + hr] = sm90_pack_bf16x2(gv[0], gv[1]);
      }
    {
      /* stmatrix x4 per k16 slice kk of heads: lane l addresses slot row 16 warp + l % 8 + 8 ((l / 8) %
       * 2), 16-B chunk 2 kk + l / 16 (docs/hopper.md section 2) */
      const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int chunk = 2 * kk + (lane >> 4);
        sm90_stmatrix_x4(base + IbSmem::kG + r * 128 + (((chunk ^ r) & 7) << 4), gp[4 * kk], gp[4 * kk + 1],
                         gp[4 * kk + 2], gp[4 * kk + 3]);
      }
    }
    int32_t ka[2], kb[2];
    sm90_lay1_key_rows(tidx, r0, odd, ka, kb);
    sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> wgmma (async proxy) */
    __syncthreads();

    /* 3. dK = G q (RS), dQ += G^T K (SS): one group */
    float dk[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      dk[i] = 0.f;
      sm90_fence_operand(dk[i]);
      sm90_fence_operand(dq[i]);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sm90_fence_operand_u32(gp[i]);
    sm90_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90_wgmma_rs_m64n128k16<1>(dk, gp + 4 * kk, sm90_desc_at(b4, IbSmem::kQ + kk * 2048, 8192, 1024), kk != 0);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90_wgmma_ss_m64n128k16<1, 1>(dq, sm90_desc_at(b4, IbSmem::kG + kk * 2048, 8192, 1024),
                                     sm90_desc_at(b4, koff + kk * 2048, 8192, 1024), 1);
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      sm90_fence_operand(dk[i]);
      sm90_fence_operand(dq[i]);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sm90_fence_operand_u32(gp[i]);

    /* 4. dK into the permuted accumulator; or (rows) each valid slot's row, in order, for the
     * deterministic reduce; neither: the deterministic CUDA-core pass sums d_index_k itself */
    if (!ROWS && acc != nullptr) {
      float *const rowp = acc + 16 * odd + 4 * (lane & 3);
      sm90_red_block_lay1<kD>(rowp, dk, 0, odd, ka, kb, pol);
      sm90_red_block_lay1<kD>(rowp, dk + 32, 1, odd, ka, kb, pol);
    } else if (ROWS) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (!(hr ? v1 : v0)) continue;
        float *rrow = rows + ((tok - t0) * p.topk + kBlockN * n + r0 + 8 * hr) * kD + 2 * (lane & 3);
#pragma unroll
        for (int cc = 0; cc < 16; ++cc) *(float2 *)(rrow + 8 * cc) = make_float2(dk[4 * cc + 2 * hr], dk[4 * cc + 2 * hr + 1]);
      }
    }
  }

  /* d_index_q: rows r0, r0 + 8 (heads), columns 8 cc + 2 (lane % 4) + {0, 1} (m64n128 map) */
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int h = r0 + 8 * hr;
    if (h >= H) continue;
    uint16_t *orow = p.d_index_q + tok * p.dq_stride_token + (int64_t)h * p.dq_stride_head + 2 * (lane & 3);
#pragma unroll
    for (int cc = 0; cc < 16; ++cc) *(uint32_t *)(orow + 8 * cc) = sm90_pack_bf16x2(dq[4 * cc + 2 * hr], dq[4 * cc + 2 * hr + 1]);
  }
  /* d_weights: the partials' column sums over the 64 slot rows, warps in order */
  float z[2];
  sm90_warp_colsum64(dwp, lane, z);
  float *sdw = (float *)(smem + IbSmem::kDw);
  *(float2 *)(sdw + 64 * warp + 2 * lane) = make_float2(z[0], z[1]);
  __syncthreads();
  if (t < H) p.d_weights[tok * p.dw_stride + t] = ((sdw[t] + sdw[64 + t]) + sdw[128 + t]) + sdw[192 + t];
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run (the launcher checks cc 9.0) */
#endif
}

/* The permuted fp32 accumulator [T_k, 128] -> bf16 d_index_k: dk[r][c] = acc[r][slot(c)]. */
__global__ void dk_convert_lay1_kernel(const __grid_constant__ dsa_indexer_bwd_params p, const float *src) {
  const int64_t n = p.num_keys * kD;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / kD;
    const int c = (int)(i - r * kD);
    p.d_index_k[r * p.dk_stride + c] = __bfloat16_as_ushort(__float2bfloat16_rn(src[r * kD + dsa_bwd_dkv_slot(c)]));
  }
}

/* dsa_indexer_slot_scores on sm_90a: z[t, j] = sum_h w[t, h] ReLU(x[j, h]) with the backward's tiles,
 * stages and X = K q^T; each thread sums its two slot rows' 16 head columns, then the quad of lanes
 * that holds the row adds its four sums (lanes l ^ 1, l ^ 2: a fixed order, bitwise reproducible).
 * The launcher zeroes the scores first; every slot j < the row's length is written (0 where invalid),
 * none past it (the row's last tile stops at its length: the next row may start there). */
__global__ void __launch_bounds__(kThreads, 2) slot_scores_sm90_kernel(
    const __grid_constant__ dsa_indexer_slot_scores_params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int64_t tok = blockIdx.x;
  const int klen = p.lengths ? min(max(p.lengths[tok], 0), p.topk) : p.topk;
  const int ntiles = (klen + kBlockN - 1) / kBlockN;
  if (ntiles == 0) return;
  const uint32_t base = sm90_smem_addr(smem), b4 = base >> 4;
  const int32_t *irow = p.indices + tok * p.indices_stride;
  const int32_t *sidx = (const int32_t *)(smem + IbSmem::kIdx);
  const int r0 = 16 * warp + (lane >> 2);
  float w[16];
  ib_weights(p, tok, lane, w);
  sm90_load_q_heads64<2>(base + IbSmem::kQ, p.index_q, tok, p.q_stride_token, p.q_stride_head, 0, p.num_heads, t >> 3,
                         t & 7);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ntiles) ib_gather_keys(p, smem, base, irow, s, s, klen, t);
    ib_commit();
  }
  for (int n = 0; n < ntiles; ++n) {
    const int st = n % kStages;
    ib_wait_stages();
    sm90_fence_proxy_async();
    __syncthreads();
    if (n + kStages - 1 < ntiles) ib_gather_keys(p, smem, base, irow, n + kStages - 1, (n + kStages - 1) % kStages, klen, t);
    ib_commit();
    float x[32];
    ib_x_tile(x, b4, IbSmem::kK + st * kTile);
    float z[2] = {0.f, 0.f};
#pragma unroll
    for (int cc = 0; cc < 8; ++cc)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float xv = x[4 * cc + 2 * hr + e];
          z[hr] = fmaf(w[2 * cc + e], (xv > 0.f || xv != xv) ? xv : 0.f, z[hr]); /* ReLU keeps NaN */
        }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      z[hr] += __shfl_xor_sync(0xffffffffu, z[hr], 1);
      z[hr] += __shfl_xor_sync(0xffffffffu, z[hr], 2);
    }
    if ((lane & 3) == 0) {
      const int32_t *tidx = sidx + st * kBlockN;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = r0 + 8 * hr, j = kBlockN * n + row;
        if (j < klen) p.scores[tok * p.scores_stride + j] = tidx[row] >= 0 ? z[hr] : 0.f; /* the last tile's tail: past the row */
      }
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

/* The launch checks both sm_90a kernels of this file share (one CTA per token). */
dsa_status ib_check(const dsa_context *ctx, int64_t num_tokens, const char *fn) {
  DSA_TRY(dsa_sm90_check_cc(ctx, fn));
  if (num_tokens > 0x7fffffff)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel handles at most 2^31-1 tokens", fn);
  return dsa_sm90_check_smem(ctx, IbSmem::kBytes, fn);
}

}  // namespace

extern "C" dsa_status dsa_ib_sm90_check(const dsa_context *ctx, const dsa_indexer_bwd_params *p) {
  return ib_check(ctx, p->num_tokens, "dsa_indexer_bwd");
}

extern "C" dsa_status dsa_ib_launch_sm90(const dsa_context *ctx, const dsa_indexer_bwd_params *p, float *acc,
                                         cudaStream_t stream) {
  static const char fn[] = "dsa_indexer_bwd";
  static int attr_set[DSA_TRACKED_DEVICES];
  DSA_TRY(ib_check(ctx, p->num_tokens, fn));
  if (p->num_tokens == 0) return DSA_SUCCESS;
  DSA_TRY(dsa_kernel_smem_once((const void *)indexer_bwd_sm90_kernel<false>, IbSmem::kBytes, 0, ctx->device, attr_set,
                               "dsa_indexer_bwd: cudaFuncSetAttribute"));
  indexer_bwd_sm90_kernel<false><<<(unsigned)p->num_tokens, kThreads, IbSmem::kBytes, stream>>>(*p, acc, nullptr, 0);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}

extern "C" dsa_status dsa_ib_launch_sm90_rows(const dsa_context *ctx, const dsa_indexer_bwd_params *p, float *rows,
                                              int64_t t0, int64_t count, cudaStream_t stream) {
  static const char fn[] = "dsa_indexer_bwd";
  static int attr_set[DSA_TRACKED_DEVICES];
  DSA_TRY(ib_check(ctx, p->num_tokens, fn));
  if (count <= 0) return DSA_SUCCESS;
  DSA_TRY(dsa_kernel_smem_once((const void *)indexer_bwd_sm90_kernel<true>, IbSmem::kBytes, 0, ctx->device, attr_set,
                               "dsa_indexer_bwd: cudaFuncSetAttribute"));
  indexer_bwd_sm90_kernel<true><<<(unsigned)count, kThreads, IbSmem::kBytes, stream>>>(*p, nullptr, rows, t0);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}

extern "C" dsa_status dsa_ib_launch_convert_lay1(const dsa_indexer_bwd_params *p, const float *acc,
                                                 cudaStream_t stream) {
  const int64_t n = p->num_keys * kD;
  int64_t g = (n + 255) / 256;
  if (g > (1 << 20)) g = 1 << 20;
  if (g < 1) g = 1;
  dk_convert_lay1_kernel<<<(unsigned)g, 256, 0, stream>>>(*p, acc);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_indexer_bwd");
}

extern "C" dsa_status dsa_ss_launch_sm90(const dsa_context *ctx, const dsa_indexer_slot_scores_params *p,
                                         cudaStream_t stream) {
  static const char fn[] = "dsa_indexer_slot_scores";
  static int attr_set[DSA_TRACKED_DEVICES];
  DSA_TRY(ib_check(ctx, p->num_tokens, fn));
  DSA_TRY(dsa_kernel_smem_once((const void *)slot_scores_sm90_kernel, IbSmem::kBytes, 0, ctx->device, attr_set,
                               "dsa_indexer_slot_scores: cudaFuncSetAttribute"));
  DSA_TRY(dsa_cuda_status((int)cudaMemset2DAsync(p->scores, (size_t)p->scores_stride * 4, 0, (size_t)p->topk * 4,
                                                 (size_t)p->num_tokens, stream),
                          fn));
  slot_scores_sm90_kernel<<<(unsigned)p->num_tokens, kThreads, IbSmem::kBytes, stream>>>(*p);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}
