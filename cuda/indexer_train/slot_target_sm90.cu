/*
 * slot_target_sm90.cu - dsa_attn_slot_target on sm_90a (dsa_launch_slot_target_sm90, src/internal.h;
 * the math: docs/indexer-training.md section 1):
 *   a[t, j] = sum_h exp(scale * q[t, h, :D] . kv[s_j, :D] - L'[t, h]),  L' = logaddexp(lse, sink[h]),
 * a head with lse = +inf contributing 0, invalid slots 0. The automatic choice on cc 9.0 for D = 576
 * / 512 (DSA_OPTION_TRAIN_KERNEL forces either kernel); the CUDA-core kernel of slot_target.cu
 * runs everything else.
 *
 * The forward's S = Q K^T on tensor cores, without the P V product: one CTA per (token, block of 64
 * heads), one warpgroup of 128 threads, __launch_bounds__(128, 1). Shared memory (1024-B aligned,
 * SW128 K-major [rows][64-column blocks of 8 KB]): Q [64 x D], two KV stages [64 x D], idx int32
 * [2][64], L' log2e [64], the per-warp column sums [4][64]: 224000 / 199424 B with the alignment
 * slack. Heads past H are zero rows with L' = +inf (P = 0).
 *
 * Per 64-slot tile n (stage n & 1): the gather of tile n + 1 into the other stage is issued first
 * (cp.async, zero fill for invalid slots, as the backward's WG0 gathers), so it lands while tile n
 * runs; cp.async.wait_group for tile n, fence.proxy.async, __syncthreads; 4 D / 64 SS m64n64k16 wgmmas
 * (one commit, wait<0>); P = exp2(S scale log2e - L' log2e), 0 at invalid slots; per warp the column
 * sums over its 16 head rows (each thread adds its two rows, then a reduce-scatter over the 8 lanes
 * holding the same columns leaves lane l with columns 2l, 2l + 1); the four warps' sums meet in
 * shared memory and thread c < 64 adds them in warp order and atomically adds the result to a[t, 64 n
 * + c] of a valid slot. The launcher zeroes the target first, so slots past the row's tiles and
 * invalid slots read 0, and a slot gets one add per head block: at most two (H <= 128), and (0 + x) +
 * y = x + y in either order, so the result is bitwise reproducible.
 *
 * Hazards: stage n & 1 and idx half n & 1 are rewritten by the gather of tile n + 2, issued at the
 * top of iteration n + 1, after the __syncthreads that follows every thread's wait<0> of tile n's
 * wgmmas and its last read of idx half n & 1 (the slot validity is read into a register before that
 * barrier); the column-sum buffer is rewritten only after the next tile's top __syncthreads, which
 * every thread reaches after its reads of the buffer.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"

namespace {

constexpr int kThreads = 128; /* one warpgroup */
constexpr int kBlockM = 64;   /* heads per CTA: the wgmma M */
constexpr int kBlockN = 64;   /* slots per tile */
constexpr int kBlk = 64 * 128; /* one 64 x 64 bf16 SW128 block */

template <int NB>
struct StSmem {
  static constexpr int kQ = 0;
  static constexpr int kKV0 = kQ + NB * kBlk;
  static constexpr int kKV1 = kKV0 + NB * kBlk;
  static constexpr int kIdx = kKV1 + NB * kBlk;      /* int32 [2][64]: kv row or -1 */
  static constexpr int kLp = kIdx + 2 * kBlockN * 4; /* f32 [64]: L' log2e, +inf for dead rows */
  static constexpr int kPart = kLp + kBlockM * 4;    /* f32 [4][64]: per-warp column sums */
  static constexpr int kEnd = kPart + 4 * kBlockN * 4;
  static constexpr int kBytes = kEnd + 1024;         /* + slack to align the base */
};
static_assert(StSmem<9>::kBytes == 224000 && StSmem<8>::kBytes == 199424, "the sizes the comment quotes");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void st_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void st_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* logaddexp in fp32, as slot_target.cu and the backward's prep compute it. */
__device__ __forceinline__ float st_logaddexp(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  return fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

/* The gather of one 64-slot tile into the SW128 stage at skv and of its kv indices (or -1) into
 * tidx; an invalid slot reads 0 bytes from q. */
template <int NB>
__device__ __forceinline__ void st_gather(const dsa_slot_target_params &p, uint32_t skv, int32_t *tidx,
                                          const int32_t idxs[4], int g, int j) {
  sm90_gather_tile_idx<NB>(skv, tidx, idxs, g, j, p.kv, p.kv_stride, p.num_kv, p.q);
}
#endif

template <int NB>
__global__ void __launch_bounds__(kThreads, 1) slot_target_sm90_kernel(const __grid_constant__ dsa_slot_target_params p,
                                                                       int num_hblocks) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef StSmem<NB> L;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, g = t >> 3, j = t & 7;
  const int64_t tok = blockIdx.x / num_hblocks;
  const int h0 = (int)(blockIdx.x % num_hblocks) * kBlockM;
  int klen = p.topk;
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + kBlockN - 1) / kBlockN;
  if (ntiles == 0) return; /* the target row is zero already */

  const uint32_t base = sm90_smem_addr(smem);
  const uint32_t b4 = base >> 4;
  int32_t *sidx = (int32_t *)(smem + L::kIdx);
  float *slp = (float *)(smem + L::kLp), *spart = (float *)(smem + L::kPart);
  const int32_t *irow = p.indices + tok * p.indices_stride;

  /* Q rows (zero rows past H) and tile 0: one cp.async group; L' log2e by threads 0..63 */
  sm90_load_q_heads64<NB>(base + L::kQ, p.q, tok, p.q_stride_token, p.q_stride_head, h0, p.num_heads, g, j);
  {
    int32_t idxs[4];
    sm90_gather_read_indices(irow, 0, g, klen, idxs);
    st_gather<NB>(p, base + L::kKV0, sidx, idxs, g, j);
  }
  st_commit();
  if (t < kBlockM) {
    const int h = h0 + t;
    float lp = INFINITY;
    if (h < p.num_heads) {
      const float lse = p.lse[tok * p.num_heads + h];
      lp = lse == INFINITY ? INFINITY : st_logaddexp(lse, p.sink ? p.sink[h] : -INFINITY);
    }
    slp[t] = lp * kLog2e; /* +inf * log2e = +inf */
  }
  __syncthreads(); /* slp */
  const int r0 = 16 * warp + (lane >> 2);
  const float lp2[2] = {slp[r0], slp[r0 + 8]};
  const float scale_log2 = p.softmax_scale * kLog2e;

  for (int n = 0; n < ntiles; ++n) {
    const int s = n & 1;
    if (n + 1 < ntiles) {
      int32_t idxs[4];
      sm90_gather_read_indices(irow, n + 1, g, klen, idxs);
      st_gather<NB>(p, base + (s ? L::kKV0 : L::kKV1), sidx + (s ^ 1) * kBlockN, idxs, g, j);
      st_commit();
      st_wait_group<1>(); /* tile n (and Q) landed; tile n + 1 may still be in flight */
    } else {
      st_wait_group<0>();
    }
    sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
    __syncthreads();          /* every thread's copies of tile n and its idx writes */
    const int32_t *tidx = sidx + s * kBlockN;
    const bool slot_ok = t < kBlockN && tidx[t] >= 0;

    float sacc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sacc[i] = 0.f;
      sm90_fence_operand(sacc[i]);
    }
    sm90_wgmma_fence();
    const uint32_t kv_off = s ? L::kKV1 : L::kKV0;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t off = b * kBlk + k * 32;
        sm90_wgmma_ss_m64n64k16<0, 0>(sacc, sm90_desc_at(b4, L::kQ + off, 16, 1024),
                                      sm90_desc_at(b4, kv_off + off, 16, 1024), (b | k) != 0);
      }
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) sm90_fence_operand(sacc[i]);

    /* P (0 at invalid slots) summed over this thread's two rows: v[2 cc + e] = column 8 cc + 2 (lane
     * % 4) + e (register i = 4 cc + 2 hr + e: row r0 + 8 hr) */
    float v[16];
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const int col = 8 * cc + 2 * (lane & 3);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = tidx[col + e] >= 0;
        const float p0 = ok ? exp2f(sacc[4 * cc + e] * scale_log2 - lp2[0]) : 0.f;
        const float p1 = ok ? exp2f(sacc[4 * cc + 2 + e] * scale_log2 - lp2[1]) : 0.f;
        v[2 * cc + e] = p0 + p1;
      }
    }
    float z[2];
    sm90_warp_colsum64(v, lane, z);
    *(float2 *)(spart + kBlockN * warp + 2 * lane) = make_float2(z[0], z[1]);
    __syncthreads();
    if (slot_ok) {
      const float a = ((spart[t] + spart[kBlockN + t]) + spart[2 * kBlockN + t]) + spart[3 * kBlockN + t];
      atomicAdd(p.target + tok * p.target_stride + kBlockN * n + t, a);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run (the launcher checks cc 9.0) */
#endif
}

template <int NB>
dsa_status st_launch(const dsa_context *ctx, const dsa_slot_target_params *p, cudaStream_t stream, int nhb) {
  static const char fn[] = "dsa_attn_slot_target";
  static int attr_set[DSA_TRACKED_DEVICES];
  DSA_TRY(dsa_kernel_smem_once((const void *)slot_target_sm90_kernel<NB>, StSmem<NB>::kBytes, 0, ctx->device, attr_set,
                               "dsa_attn_slot_target: cudaFuncSetAttribute"));
  DSA_TRY(dsa_cuda_status((int)cudaMemset2DAsync(p->target, (size_t)p->target_stride * 4, 0, (size_t)p->topk * 4,
                                                 (size_t)p->num_tokens, stream),
                          fn));
  slot_target_sm90_kernel<NB><<<(unsigned)(p->num_tokens * nhb), kThreads, StSmem<NB>::kBytes, stream>>>(*p, nhb);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}

}  // namespace

extern "C" dsa_status dsa_launch_slot_target_sm90(const dsa_context *ctx, const dsa_slot_target_params *p,
                                                  cudaStream_t stream) {
  static const char fn[] = "dsa_attn_slot_target";
  if (!(ctx->cc_major == 9 && ctx->cc_minor == 0))
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel needs compute capability 9.0, device has %d.%d", fn,
                    ctx->cc_major, ctx->cc_minor);
  if (p->head_dim != 576 && p->head_dim != 512)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel supports head_dim 576 and 512, not %d", fn,
                    (int)p->head_dim);
  /* cp.async moves 16 B: q and kv rows must start 16-B aligned */
  if (((uintptr_t)p->q & 15) || ((uintptr_t)p->kv & 15) || (p->q_stride_token & 7) || (p->q_stride_head & 7) ||
      (p->kv_stride & 7))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a kernel needs 16-byte aligned q / kv rows (q strides %lld, %lld; kv_stride %lld)",
                    fn, (long long)p->q_stride_token, (long long)p->q_stride_head, (long long)p->kv_stride);
  const int nhb = (p->num_heads + kBlockM - 1) / kBlockM;
  if (p->num_tokens > (int64_t)0x7fffffff / nhb)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel handles at most %d tokens, not %lld", fn,
                    0x7fffffff / nhb, (long long)p->num_tokens);
  const int smem = p->head_dim == 576 ? StSmem<9>::kBytes : StSmem<8>::kBytes;
  if (smem > ctx->max_smem_optin)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel needs %d bytes of shared memory, device has %d", fn,
                    smem, ctx->max_smem_optin);
  return p->head_dim == 576 ? st_launch<9>(ctx, p, stream, nhb) : st_launch<8>(ctx, p, stream, nhb);
}
