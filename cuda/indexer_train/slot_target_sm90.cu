/*
 * slot_target_sm90.cu - dsa_attn_slot_target on sm_90a (dsa_st_launch_sm90,
 * cuda/indexer_train/train_launch.cuh; the math: docs/indexer-training.md section 1):
 *   a[t, j] = sum_h exp(scale * q[t, h, :D] . kv[s_j, :D] - L'[t, h]),  L' = logaddexp(lse, sink[h]),
 * a head with lse = +inf contributing 0, invalid slots 0. The automatic choice on cc 9.0 for D = 576
 * / 512 (DSA_OPTION_TRAIN_KERNEL forces either kernel); the CUDA-core kernel of slot_target.cu
 * runs everything else.
 *
 * The forward's S = Q K^T on tensor cores, without the P V product. Per 64-slot tile the op moves
 * 1152 B of kv per slot into shared memory and reads it once more for the wgmmas; with Q in registers
 * (RS) the wgmmas read only the tile, so shared memory carries 2 x 72 KB per tile instead of 3 x 72.
 * One CTA per (token, block of 64 heads), tokens in descending order (the longest causal rows first),
 * three warpgroups, __launch_bounds__(384, 1):
 *   WG2 producer (56 registers): Q (zero rows past H) into stage 2 first (q_full), then tile n into
 *       stage s = n % 3 (tile 2 also waits q_free: Q read by both consumers): waits empty[s],
 *       cp.async of the 64 kv rows (zero fill for invalid slots) into the SW128 stage and the kv
 *       indices (or -1) into idx[s], then a .noinc arrive (the copies) and a plain arrive (the
 *       indices) on full[s].
 *   WG0, WG1 consumers (224 registers): both read Q's A fragments from stage 2 by ldmatrix (4 D / 16
 *       registers per thread), then arrive on q_free (256 arrivals). WG c takes the tiles n = c,
 *       c + 2, ...: waits full[n % 3], issues the 4 D / 16 RS m64n64k16 wgmmas of S = Q K^T, reads the
 *       slots' validity while they run, retires them and releases the stage before its exponentials:
 *       P = exp2(S scale log2e - L' log2e), 0 at invalid slots; per warp the column sums over its 16
 *       head rows (sm90_warp_colsum64), the four warps' sums meet in the WG's own shared buffer
 *       (double-buffered by tile, one named barrier per tile) and thread c < 64 adds them in warp
 *       order and atomically adds the result to a[t, 64 n + c] of a valid slot. One WG's
 *       exponentials run under the other's wgmmas.
 * Tile n is use n / 3 of stage n % 3; full and empty waits take that use's parity.
 * Shared memory (1024-B aligned, SW128 K-major [rows][64-column blocks of 8 KB]): three stages [64 x
 * D], idx int32 [3][64], the column sums f32 [2 WGs][2][4][64], eight mbarriers: 227136 / 202560 B
 * with the alignment slack.
 * The launcher zeroes the target first, so slots past the row's tiles and invalid slots read 0, and a
 * slot gets one add per head block: at most two (H <= 128), and (0 + x) + y = x + y in either order,
 * so the result is bitwise reproducible.
 * Hazards: a stage and its idx third are rewritten only after its consumer's empty arrive, which
 * follows its wait<0> of the stage's wgmmas and its reads of the indices (stage 2's Q: after every
 * consumer thread's q_free arrive, which follows its ldmatrix); a WG's column-sum half of tile n is
 * rewritten at its tile n + 4, after its named barrier of tile n + 2, which each reader of tile n's
 * sums reaches after its reads.
 * cp.async writes are generic-proxy: a consumer runs fence.proxy.async after each full wait
 * (docs/hopper.md section 3).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "indexer_train/train_launch.cuh"

namespace {

constexpr int kThreads = 384;  /* WG0, WG1 consumers, WG2 producer */
constexpr int kConsumerRegs = 224; /* Q 144 + S 32 + the column sums 16 + addressing */
constexpr int kProducerRegs = 56;
constexpr int kBlockM = 64;    /* heads per CTA: the wgmma M */
constexpr int kBlockN = 64;    /* slots per tile */
constexpr int kStages = 3;
constexpr int kBlk = 64 * 128; /* one 64 x 64 bf16 SW128 block */
static_assert(2 * kConsumerRegs + kProducerRegs <= 504, "setmaxnreg pool: 384 x 168 = 128 x 504");

template <int NB>
struct StSmem {
  static constexpr int kStage = NB * kBlk;
  static constexpr int kKV = 0;                            /* stage s at kKV + s * kStage; Q first in stage 2 */
  static constexpr int kIdx = kKV + kStages * kStage;      /* int32 [3][64]: kv row or -1 */
  static constexpr int kPart = kIdx + kStages * kBlockN * 4; /* f32 [2][2][4][64]: per-warp column sums */
  static constexpr int kBars = kPart + 2 * 2 * 4 * kBlockN * 4; /* full[3], empty[3], q_full, q_free */
  static constexpr int kEnd = kBars + (2 * kStages + 2) * 8;
  static constexpr int kBytes = kEnd + 1024;               /* + slack to align the base */
};
static_assert(StSmem<9>::kBytes == 227136 && StSmem<8>::kBytes == 202560, "the sizes the comment quotes");
static_assert(StSmem<9>::kBytes <= 227 * 1024, "fits the H100 / H200 opt-in shared memory (227 KB)");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* logaddexp in fp32, as slot_target.cu and the backward's prep compute it. */
__device__ __forceinline__ float st_logaddexp(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  return fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

/* L' log2e of head h (+inf for a head past H or with lse = +inf: P = 0). */
__device__ __forceinline__ float st_lp_log2(const dsa_slot_target_params &p, int64_t tok, int h) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (h >= p.num_heads) return INFINITY;
  const float lse = p.lse[tok * p.num_heads + h];
  const float lp = lse == INFINITY ? INFINITY : st_logaddexp(lse, p.sink ? p.sink[h] : -INFINITY);
  return lp * kLog2e; /* +inf * log2e = +inf */
}

/* Tile n's stage and the parity of its use there. */
__device__ __forceinline__ void st_stage_of(int n, int &s, uint32_t &par) {
  s = n % kStages;
  par = (uint32_t)(n / kStages) & 1;
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
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  /* tokens in descending order: with causal lengths the longest rows start first (longest-first) */
  const int64_t tok = p.num_tokens - 1 - blockIdx.x / num_hblocks;
  const int h0 = (int)(blockIdx.x % num_hblocks) * kBlockM;
  int klen = p.topk;
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + kBlockN - 1) / kBlockN;
  if (ntiles == 0) return; /* the target row is zero already */

  const uint32_t base = sm90_smem_addr(smem);
  int32_t *sidx = (int32_t *)(smem + L::kIdx);
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *full = bars, *empty = bars + kStages, *q_full = bars + 2 * kStages, *q_free = q_full + 1;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90_mbar_init(&full[s], 256); /* 128 cp.async .noinc + 128 plain (the indices) */
      sm90_mbar_init(&empty[s], 128); /* the releasing consumer WG */
    }
    sm90_mbar_init(q_full, 128); /* the producer's cp.async .noinc */
    sm90_mbar_init(q_free, 256); /* both consumer WGs */
    sm90_mbar_init_fence();
  }
  __syncthreads();

  if (wg == 2) {
    /* ================= producer ================= */
    sm90_setmaxnreg_dec<kProducerRegs>();
    const int g = t >> 3, j = t & 7;
    const int32_t *irow = p.indices + tok * p.indices_stride;
    sm90_load_q_heads64<NB>(base + L::kKV + 2 * L::kStage, p.q, tok, p.q_stride_token, p.q_stride_head, h0, p.num_heads,
                            g, j);
    sm90_cp_async_mbar_arrive_noinc(q_full);
    for (int n = 0; n < ntiles; ++n) {
      int s;
      uint32_t par;
      st_stage_of(n, s, par);
      int32_t idxs[4];
      sm90_gather_read_indices(irow, n, g, klen, idxs);
      if (n == 2) sm90_mbar_wait(q_free, 0); /* stage 2 held Q */
      sm90_mbar_wait(&empty[s], par ^ 1); /* first use: parity 1 returns at once */
      sm90_gather_tile_idx<NB>(base + L::kKV + s * L::kStage, sidx + s * kBlockN, idxs, g, j, p.kv, p.kv_stride,
                               p.num_kv, p.q);
      sm90_cp_async_mbar_arrive_noinc(&full[s]);
      sm90_mbar_arrive(&full[s]);
    }
    sm90_cp_async_wait_all();
    return;
  }

  /* ================= consumers ================= */
  constexpr int kBarSums = 1; /* named barriers: WG c's column sums, kBarSums + c */
  sm90_setmaxnreg_inc<kConsumerRegs>();
  const int c = wg, warp = t >> 5, lane = t & 31;
  const int r0 = 16 * warp + (lane >> 2);
  const float lp2[2] = {st_lp_log2(p, tok, h0 + r0), st_lp_log2(p, tok, h0 + r0 + 8)};
  const float scale_log2 = p.softmax_scale * kLog2e;
  const uint32_t b4 = base >> 4;
  float *trow = p.target + tok * p.target_stride;
  float *spart = (float *)(smem + L::kPart) + c * 2 * 4 * kBlockN;

  /* Q's A fragments: k16 slice kk = dims [16 kk, 16 kk + 16) of the warp's 16 head rows */
  uint32_t qf[4 * NB * 4];
  sm90_mbar_wait(q_full, 0);
  {
    const int r = 16 * warp + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < 4 * NB; ++kk) {
      const int chunk = 2 * (kk & 3) + (lane >> 4);
      sm90_ldmatrix_x4(base + L::kKV + 2 * L::kStage + (kk >> 2) * kBlk + r * 128 + (((chunk ^ r) & 7) << 4),
                       qf + 4 * kk);
    }
  }
  sm90_mbar_arrive(q_free); /* this thread's ldmatrix of Q done */

  for (int n = c, k = 0; n < ntiles; n += 2, ++k) {
    int s;
    uint32_t par;
    st_stage_of(n, s, par);
    sm90_mbar_wait(&full[s], par);
    sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
    float sacc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sacc[i] = 0.f;
      sm90_fence_operand(sacc[i]);
    }
#pragma unroll
    for (int i = 0; i < 4 * NB * 4; ++i) sm90_fence_operand_u32(qf[i]);
    sm90_wgmma_fence();
    const uint32_t kv_off = L::kKV + s * L::kStage;
#pragma unroll
    for (int kk = 0; kk < 4 * NB; ++kk)
      sm90_wgmma_rs_m64n64k16(sacc, qf + 4 * kk, sm90_desc_at(b4, kv_off + (kk >> 2) * kBlk + (kk & 3) * 32, 16, 1024),
                              kk != 0);
    sm90_wgmma_commit();
    /* the slots' validity while the wgmmas run: bit 2 cc + e = column 8 cc + 2 (lane % 4) + e */
    const int32_t *tidx = sidx + s * kBlockN;
    uint32_t okbits = 0;
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const int2 pr = *(const int2 *)(tidx + 8 * cc + 2 * (lane & 3));
      okbits |= (pr.x >= 0 ? 1u : 0u) << (2 * cc);
      okbits |= (pr.y >= 0 ? 1u : 0u) << (2 * cc + 1);
    }
    const bool slot_ok = t < kBlockN && tidx[t] >= 0;
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) sm90_fence_operand(sacc[i]);
#pragma unroll
    for (int i = 0; i < 4 * NB * 4; ++i) sm90_fence_operand_u32(qf[i]);
    sm90_mbar_arrive(&empty[s]); /* stage s: its wgmmas retired, its indices read */

    /* P (0 at invalid slots) summed over this thread's two rows: v[2 cc + e] = column 8 cc + 2 (lane
     * % 4) + e (register i = 4 cc + 2 hr + e: row r0 + 8 hr) */
    float v[16];
#pragma unroll
    for (int cc = 0; cc < 8; ++cc)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = (okbits >> (2 * cc + e)) & 1u;
        /* one ex2.approx.ftz each (sm90_exp2): a P below 2^-126 is 0; exp2f's subnormal scaling
         * would add three instructions each to the consumers, the kernel's bound */
        const float p0 = ok ? sm90_exp2(sacc[4 * cc + e] * scale_log2 - lp2[0]) : 0.f;
        const float p1 = ok ? sm90_exp2(sacc[4 * cc + 2 + e] * scale_log2 - lp2[1]) : 0.f;
        v[2 * cc + e] = p0 + p1;
      }
    float z[2];
    sm90_warp_colsum64(v, lane, z);
    float *part = spart + (k & 1) * 4 * kBlockN;
    *(float2 *)(part + kBlockN * warp + 2 * lane) = make_float2(z[0], z[1]);
    sm90_named_bar_sync(kBarSums + c, 128);
    if (slot_ok) {
      const float a = ((part[t] + part[kBlockN + t]) + part[2 * kBlockN + t]) + part[3 * kBlockN + t];
      atomicAdd(trow + kBlockN * n + t, a);
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

extern "C" dsa_status dsa_st_launch_sm90(const dsa_context *ctx, const dsa_slot_target_params *p,
                                         cudaStream_t stream) {
  static const char fn[] = "dsa_attn_slot_target";
  DSA_TRY(dsa_sm90_check_cc(ctx, fn));
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
  DSA_TRY(dsa_sm90_check_grid(p->num_tokens, nhb, fn));
  const int smem = p->head_dim == 576 ? StSmem<9>::kBytes : StSmem<8>::kBytes;
  DSA_TRY(dsa_sm90_check_smem(ctx, smem, fn));
  return p->head_dim == 576 ? st_launch<9>(ctx, p, stream, nhb) : st_launch<8>(ctx, p, stream, nhb);
}
