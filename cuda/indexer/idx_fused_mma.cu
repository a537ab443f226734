/*
 * idx_fused_mma.cu - the lightning indexer's fused scoring on mma.sync (dsa_idx_launch_fused_mma,
 * cuda/indexer/idx_launch.cuh; the indexer's dispatch point, cuda/indexer/dispatch.cu, drives it, the
 * top-k of cuda/topk/ selects from its scores).
 *
 * idx_fused (DSA_INDEXER_ENGINE_FUSED, DSA_INDEXER_FUSED_MMA_SYNC): the head-summed scores computed
 * on chip, so the [queries * H_idx, keys] logits never exist in memory. Tensor cores through
 * mma.sync m16n8k16 bf16 -> fp32 (sm_80+ PTX, so the compute_90 build has it too). Operand map as in
 * docs/hopper.md section 8: keys on M (A = a 16-key x 128-dim slice of the key tile, held in
 * registers for the whole tile, two per warp so each B fragment feeds two mma), (query, head) on N
 * (B = q rows, 8 heads per n-tile). ReLU and the weight are applied to the accumulator in place
 * (padded heads h >= H_idx contribute 0, also when a key holds inf or NaN: 0 * inf would be NaN),
 * the head sum is an in-thread sum over the thread's two columns of every n-tile plus shfl_xor 1, 2
 * across the quad. A CTA (4 warps) holds 128 (query, head) rows of q in shared memory (128 / H_pad
 * queries, H_pad = H rounded up to 8) and streams FX_TILES (2) tiles of 128 keys (cp.async, each
 * warp loading its own 32 key rows and prefetching the next tile's while it computes); tiles
 * outside every query's visible window, and queries that select all their keys (causal_length <=
 * K), are skipped. Summation order is fixed: deterministic.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include "internal.h"
#include "indexer/idx_common.cuh"
#include "indexer/idx_launch.cuh"

#define FX_THREADS 128 /* 4 warps x 32 keys = one 128-key tile */
#define FX_MT 2        /* m16 tiles per warp: each B fragment read from smem feeds FX_MT mma */
#define FX_TILE (4 * 16 * FX_MT) /* keys per tile */
#define FX_TILES 2     /* tiles per CTA: q is loaded once for 256 keys */
/* Operand loads by cp.async. Each warp loads only the 32 key rows it turns into A fragments, so a
 * warp waits for its own rows (cp.async.wait_group + __syncwarp, no block barrier per tile) and, once
 * its A fragments are in registers, issues the next tile's rows into the same place: the next
 * tile's load overlaps this tile's mma. The q rows of the CTA go by cp.async too, in flight
 * together with the first key tile. */
#define FX_QROWS 128   /* (query, head) rows of q per CTA: 32 KB + padding */
#define FX_LD 136      /* smem row pitch in bf16: 272 B, so 8 ldmatrix rows hit 8 distinct bank quads */
#define FX_MAXQ 16     /* queries per CTA at most (H_pad = 8) */

static __device__ __forceinline__ uint32_t fx_smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void fx_ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                  uint32_t &r2, uint32_t &r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#endif
}

static __device__ __forceinline__ void fx_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

static __device__ __forceinline__ void fx_cp_async16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(fx_smem(smem)), "l"(gmem) : "memory");
#endif
}
static __device__ __forceinline__ void fx_cp_async_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void fx_cp_async_wait_all(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

/* The calling warp's rows [warp * 16 * FX_MT, +16 * FX_MT) of the key tile starting at
 * column cbase, by cp.async (rows past the window are zeroed with plain stores), one commit group. */
static __device__ __forceinline__ void fx_load_k_warp(const dsa_indexer_fused_args &a, uint16_t *Ks,
                                                      int64_t cbase, int warp, int lane) {
#pragma unroll 4
  for (int i = lane; i < 16 * FX_MT * 16; i += 32) {
    const int row = warp * 16 * FX_MT + (i >> 4), v = i & 15;
    const int64_t col = cbase + row;
    uint16_t *dst = Ks + row * FX_LD + v * 8;
    if (col < a.window)
      fx_cp_async16(dst, a.k + (a.window_start + col) * a.k_stride + v * 8);
    else
      *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u);
  }
  fx_cp_async_commit();
}

static __global__ void __launch_bounds__(FX_THREADS)
idx_fused(dsa_indexer_fused_args a, int hp, int qg) {
  extern __shared__ __align__(16) unsigned char fx_smem_raw[];
  uint16_t *Qs = (uint16_t *)fx_smem_raw;         /* [FX_QROWS][FX_LD] */
  uint16_t *Ks = Qs + FX_QROWS * FX_LD;           /* [FX_TILE][FX_LD] */
  float *Ws = (float *)(Ks + FX_TILE * FX_LD);    /* [FX_QROWS] */
  __shared__ long long s_lo[FX_MAXQ], s_hi[FX_MAXQ];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t r0 = (int64_t)blockIdx.y * qg;
  const int64_t cb0 = (int64_t)blockIdx.x * (FX_TILE * FX_TILES);

  /* visible window (columns of the chunk's scores row) of each query; empty when it selects all */
  if (tid < qg) {
    long long lo = 0, hi = 0;
    const int64_t r = r0 + tid;
    if (r < a.rows) {
      const int32_t cl = a.causal_lengths[r];
      if (cl > a.topk) {
        lo = (long long)a.starts[r] - a.window_start;
        hi = lo + cl;
      }
    }
    s_lo[tid] = lo;
    s_hi[tid] = hi;
  }
  __syncthreads();
  long long ulo = 0x7fffffffffffffffll, uhi = 0;
  for (int g = 0; g < qg; ++g)
    if (s_hi[g] > s_lo[g]) {
      ulo = s_lo[g] < ulo ? s_lo[g] : ulo;
      uhi = s_hi[g] > uhi ? s_hi[g] : uhi;
    }
  if (uhi <= cb0 || ulo >= cb0 + FX_TILE * FX_TILES) return; /* block-uniform */

  const int nrows = qg * hp;
  /* the first tile that meets [ulo, uhi) (one does: the test above) starts loading now */
  for (int t = 0; t < FX_TILES; ++t) {
    const int64_t cb = cb0 + (int64_t)t * FX_TILE;
    if (!(uhi <= cb || ulo >= cb + FX_TILE)) {
      fx_load_k_warp(a, Ks, cb, warp, lane);
      break;
    }
  }
  /* q rows (g, h) -> Qs[g * hp + h] by cp.async; padded heads and missing queries are zero */
  for (int i = tid; i < nrows * 16; i += FX_THREADS) {
    const int row = i >> 4, v = i & 15, g = row / hp, h = row - g * hp;
    uint16_t *dst = Qs + row * FX_LD + v * 8;
    if (r0 + g < a.rows && h < a.heads)
      fx_cp_async16(dst, a.q + (r0 + g) * a.q_stride_token + (int64_t)h * a.q_stride_head + v * 8);
    else
      *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u);
  }
  fx_cp_async_commit();
  for (int i = tid; i < nrows; i += FX_THREADS) {
    const int g = i / hp, h = i - g * hp;
    float w = 0.0f;
    if (r0 + g < a.rows && h < a.heads) {
      const int64_t off = (r0 + g) * a.weights_stride + h;
      w = a.weights_bf16 ? __uint_as_float((uint32_t)((const uint16_t *)a.weights)[off] << 16)
                         : ((const float *)a.weights)[off];
    }
    Ws[i] = w;
  }
  fx_cp_async_wait_all(); /* this thread's q rows (and first key rows) have landed */
  __syncthreads();        /* everyone's Qs / Ws are written */

  for (int tile = 0; tile < FX_TILES; ++tile) {
    const int64_t cbase = cb0 + (int64_t)tile * FX_TILE;
    if (uhi <= cbase || ulo >= cbase + FX_TILE) continue; /* block-uniform */
    fx_cp_async_wait_all(); /* this lane's copies of the warp's key rows for this tile */
    __syncwarp();           /* ... and every other lane's (cp.async and zero stores) */
    /* this warp's 32 keys (two m16 tiles) x 128 dims as 2 x 8 A fragments: each B fragment loaded
     * from shared memory feeds two mma */
    uint32_t af[FX_MT][8][4];
#pragma unroll
    for (int mt = 0; mt < FX_MT; ++mt)
#pragma unroll
      for (int ks = 0; ks < 8; ++ks)
        fx_ldsm_x4(fx_smem(Ks + (warp * 16 * FX_MT + mt * 16 + (lane & 15)) * FX_LD + ks * 16 + (lane >> 4) * 8),
                   af[mt][ks][0], af[mt][ks][1], af[mt][ks][2], af[mt][ks][3]);
    /* the warp's rows are in registers: once every lane's ldmatrix is done, the next tile that
     * meets [ulo, uhi) may land in the same rows while this one is computed */
    __syncwarp();
    for (int t = tile + 1; t < FX_TILES; ++t) {
      const int64_t cb = cb0 + (int64_t)t * FX_TILE;
      if (!(uhi <= cb || ulo >= cb + FX_TILE)) {
        fx_load_k_warp(a, Ks, cb, warp, lane);
        break;
      }
    }
    const int64_t wc0 = cbase + warp * 16 * FX_MT; /* the warp's first column */
    for (int g = 0; g < qg; ++g) {
      if (s_hi[g] <= wc0 || s_lo[g] >= wc0 + 16 * FX_MT) continue; /* warp-uniform */
      float p[FX_MT][2];
#pragma unroll
      for (int mt = 0; mt < FX_MT; ++mt) p[mt][0] = p[mt][1] = 0.0f;
      for (int nt = 0; nt < hp / 8; ++nt) {
        const uint16_t *qb = Qs + (g * hp + nt * 8) * FX_LD;
        float acc[FX_MT][4];
#pragma unroll
        for (int mt = 0; mt < FX_MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
        for (int k2 = 0; k2 < 4; ++k2) {
          uint32_t b0, b1, b2, b3;
          fx_ldsm_x4(fx_smem(qb + (lane & 7) * FX_LD + k2 * 32 + (lane >> 3) * 8), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < FX_MT; ++mt) {
            fx_mma(acc[mt], af[mt][2 * k2], b0, b1);
            fx_mma(acc[mt], af[mt][2 * k2 + 1], b2, b3);
          }
        }
        const float w0 = Ws[g * hp + nt * 8 + (lane & 3) * 2], w1 = Ws[g * hp + nt * 8 + (lane & 3) * 2 + 1];
        /* padded heads (h >= heads) add nothing: their q rows are 0, but 0 * inf in a key is NaN,
         * and 0 * NaN would then reach the score (the reference sums real heads only) */
        const bool u0 = nt * 8 + (lane & 3) * 2 < a.heads, u1 = nt * 8 + (lane & 3) * 2 + 1 < a.heads;
#pragma unroll
        for (int mt = 0; mt < FX_MT; ++mt) {
          p[mt][0] = fmaf(w0, idx_relu(u0 ? acc[mt][0] : 0.0f), p[mt][0]);
          p[mt][0] = fmaf(w1, idx_relu(u1 ? acc[mt][1] : 0.0f), p[mt][0]);
          p[mt][1] = fmaf(w0, idx_relu(u0 ? acc[mt][2] : 0.0f), p[mt][1]);
          p[mt][1] = fmaf(w1, idx_relu(u1 ? acc[mt][3] : 0.0f), p[mt][1]);
        }
      }
      float *row = a.scores + (r0 + g) * a.scores_ld;
#pragma unroll
      for (int mt = 0; mt < FX_MT; ++mt) {
        float p0 = p[mt][0], p1 = p[mt][1];
        p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
        p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
        if ((lane & 3) == 0) {
          const int64_t c = wc0 + mt * 16 + (lane >> 2);
          if (c < a.window) row[c] = p0;
          if (c + 8 < a.window) row[c + 8] = p1;
        }
      }
    }
  }
}

extern "C" dsa_status dsa_idx_launch_fused_mma(const dsa_context *ctx, const dsa_indexer_fused_args *a,
                                               cudaStream_t stream) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* the smem limit set per device */
  const int hp = (a->heads + 7) / 8 * 8, qg = FX_QROWS / hp;
  const size_t smem = (size_t)(FX_QROWS + FX_TILE) * FX_LD * 2 + FX_QROWS * 4;
  dim3 grid;
  if (a->rows <= 0 || a->window <= 0) return DSA_SUCCESS;
  DSA_TRY(dsa_kernel_smem_once((const void *)idx_fused, (int)smem, 0, ctx->device, attr_set,
                               "dsa_indexer_topk (cudaFuncSetAttribute)"));
  grid.x = (unsigned)((a->window + FX_TILE * FX_TILES - 1) / (FX_TILE * FX_TILES));
  grid.y = (unsigned)((a->rows + qg - 1) / qg);
  grid.z = 1;
  idx_fused<<<grid, FX_THREADS, smem, stream>>>(*a, hp, qg);
  return dsa_cuda_status(cudaGetLastError(), "dsa_indexer_topk (fused kernel launch)");
}
