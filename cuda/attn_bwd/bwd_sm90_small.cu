/*
 * bwd_sm90_small.cu - sparse MLA attention backward on sm_90a tensor cores for few heads (H = 1..32;
 * dsa_launch_attn_bwd_sm90_small, src/internal.h): dsa_sparse_attn_bwd's main pass in both modes. Same
 * contract, workspace and small passes as cuda/attn_bwd/bwd_sm90_h64.cu (read its top comment and docs/design.md
 * section 6): prep (Delta, L', dsink partials), the fp32 dkv accumulator, convert and dsink come from
 * cuda/attn_bwd/bwd_common.cuh; declines with DSA_ERROR_UNSUPPORTED what it does not run (the op then
 * tries the 64-head sm_90a kernel, then the portable one).
 *
 * Why a second kernel: the 64-head kernel puts heads on the wgmma M (m64), so H = 16 does the tensor
 * work of H = 64. Here, as in the forward's cuda/attn_fwd/fwd_sm90_small.cu, keys go on M and heads on N
 * (N = H rounded up to 8; NP = H rounded up to 16 rows of Q / dO in smem, the pad rows zero). Per
 * 64-key tile of one query token (all its heads):
 *   S^T [64 keys x N]  = K [64 x D] Q^T          SS m64nNk16, A = the gathered KV tile (K-major),
 *                                                B = Q [N x D] (K-major), D / 16 k-steps
 *   dP^T [64 x N]      = V [64 x 512] dO^T        SS m64nNk16, B = dO [N x 512], 32 k-steps
 *   P^T = exp2(S^T scale log2e - L' log2e) (0 on invalid slots), dS^T = scale P^T (dP^T - Delta),
 *   per column = head (L', Delta per column; dead columns h >= H have L' = +inf: P = 0)
 *   dQ^T [D x N]      += K^T [D x 64] dS^T        SS m64nNk16 with tA = 1 (the KV tile read
 *                                                M-major, as the forward's O^T = V^T P), B = dS^T
 *                                                stored [N heads][64 keys] K-major by stmatrix .trans;
 *                                                D / 64 m-blocks x 4 k-steps; accumulated over the
 *                                                token's tiles in registers (D N / 128 per thread),
 *                                                except at N = 32, D = 576 (144 registers): there the
 *                                                rope block is a fresh accumulator per tile added to
 *                                                an fp32 copy in smem (16 LDS / STS per thread and
 *                                                tile), 128 registers stay
 *   dKV [64 keys x D]  = dS^T Q (+ P^T dO on the 512 value dims)   RS m64n64k16 per 64-dim block:
 *                                                A = dS^T / P^T from the S / dP accumulator
 *                                                registers packed to bf16 (the accumulator-pair map is
 *                                                the RS A map, docs/hopper.md section 2; heads past N: zero
 *                                                registers), K = NP heads (1 or 2 k16 steps), B = Q /
 *                                                dO block read MN-major (tB = 1: LBO = one block of
 *                                                Q, SBO 1024 per 8 heads, +2048 B per k16 of heads)
 *   then per key row: red.global.add.v4.f32 into acc[idx] (the pairs of two lanes exchanged by one
 *   shfl so every lane holds 4 consecutive dims of one key row: half the atomic operations of
 *   float2 atomics), or (deterministic) the row stored to contrib[(token - tok0) K + slot][D] exactly as
 *   the 64-head kernel with one head block writes it, so the same CUB sort + fixed-order reduction
 *   (the launcher below, same det layout) consumes it.
 * dKV accumulator in the non-deterministic mode: layout 1, the permuted one (src/internal.h
 * dsa_bwd_dkv_slot; attn_bwd_sm90_small_kernel<NB, N, false, 1>, no pair swap): each lane adds 4
 * permuted slots of rows r0 and r0 + 8 per 16-column group (a quad = 64 contiguous bytes of a row);
 * the convert pass un-permutes. Not instantiated at N = 32, D = 576 (it spilled 16 B at 255
 * registers): that configuration (H 25..32 at D = 576) runs layout 0, the real column order (the
 * float2-pair form above), as the deterministic mode does.
 * One CTA = one query token. 256 threads: WG0 consumer (all products), WG1 producer (cp.async gather
 * of 64 kv rows per tile with the manual 128B swizzle into 2 KV stages, Q / dO / L' / Delta once),
 * mbarriers as in the forward (docs/hopper.md section 4):
 *   q_full  : 128 .noinc cp.async arrivals + 128 plain arrivals (L', Delta stores) -> Q, dO landed.
 *   full[s] : 128 .noinc + 128 plain arrivals (the stage's kv-row indices) -> stage s landed.
 *   empty[s]: 128 consumer arrivals after the dQ^T wgmma of the tile completed (the dKV products do
 *             not read the KV tile: the next gather overlaps them and their atomics).
 * dS^T tile WAR: a WG barrier before the stmatrix of tile n + 1 (every warp finished the dQ^T wgmma of
 * tile n); no smem is left for a second buffer at N = 32, D = 576.
 * dQ out: dQ^T staged as [head][D] bf16 rows through KV stage 0 after the last tile, then 16-B stores.
 * Shared memory (D = 576): 2 x 72 KB stages + Q, dO [NP rows] + the dS^T tile (+ the 8 KB rope dQ^T at
 * N = 32): 231208 B at N = 32, 186024 B at N = 16; D = 512: 16 KB less in the stages, 2 KB / row less
 * in Q. One CTA per SM.
 * ptxas (nvcc 13, -Xptxas -v, __launch_bounds__(256, 1)), no spills, no C7510-C7520 notes: D = 576
 * N = 8 / 16 / 24 / 32: 142 / 184 / 233 / 255 registers (deterministic 150 / 196 / 236 / 255); D = 512:
 * 130 / 176 / 220 / 255 (134 / 178 / 222 / 255). PTX per tile (D = 576, N = 16): 104 m64n16k16 (36 S^T,
 * 32 dP^T, 36 dQ^T with tA), 17 m64n64k16 RS (dKV), 2 stmatrix.x2.trans, 72 atom.add.v4.f32 per thread.
 * Declined with DSA_ERROR_UNSUPPORTED: a device other than cc 9.0, D other than 576 / 512, H > 32,
 * q / kv / dout rows not 16-B aligned, dq rows not 4-B aligned, T above 2^31 - 1, shared memory above
 * the device's opt-in limit.
 * Limits of this design: one consumer WG serialises S / dP -> softmax -> dQ^T -> dKV + atomics per tile
 * (the producer overlaps the gathers); the dKV atomics (64 x D fp32 per tile whatever N is) are the
 * same volume as the 64-head kernel's and bound it; small-N SS wgmma is smem-bandwidth bound
 * (A = 2 KB per k16 for N x 16 x 64 MACs).
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "attn_bwd/bwd_common.cuh" /* prep, convert, dsink, keys, offsets, det layout */

namespace {

constexpr int kSThreads = 256;            /* WG0 consumer, WG1 producer */
constexpr int kSBlockK = 64;              /* keys per KV tile: the M of one wgmma */
constexpr int kSMaxN = 32;                /* heads per CTA (dQ^T = D N / 128 registers) */
constexpr int kSStages = 2;               /* KV stages */
constexpr int kSNBV = DSA_VALUE_DIM / 64; /* 8 value blocks */
constexpr int kSBlk = 64 * 128;           /* one 64 x 64 bf16 SW128 block */
constexpr float kSLog2e = 1.4426950408889634f;
[[maybe_unused]] constexpr int kSBarDS = 1;  /* consumer WG: dS^T tile complete (128 threads) */
[[maybe_unused]] constexpr int kSBarOut = 2; /* consumer WG: epilogue staging (128 threads) */
[[maybe_unused]] constexpr int kSBarDQ = 3;  /* consumer WG: dQ^T of the previous tile done (dS^T tile WAR) */

/* Shared memory for NB 64-column blocks per row and N columns (NP = rows of Q / dO, zero pad). */
template <int NB, int N>
struct SSmem {
  static constexpr int kNP = (N + 15) / 16 * 16;
  static constexpr int kQBlk = kNP * 128;                /* one 64-column block of Q / dO: NP rows */
  static constexpr int kTile = NB * kSBlk;               /* KV stage [64 keys x D] */
  static constexpr int kKV = 0;
  static constexpr int kQ = kKV + kSStages * kTile;
  static constexpr int kDO = kQ + NB * kQBlk;
  static constexpr int kDS = kDO + kSNBV * kQBlk;         /* [N heads][64 keys] bf16 SW128 */
  /* dQ^T of the rope block (64 dims) in fp32 smem, [N / 2 registers][128 threads] (each thread
   * owns its fragment), where the register file cannot hold all of dQ^T (D N > 256 x 32: N = 32
   * at D = 576, 144 registers otherwise) */
  static constexpr bool kRope = NB * N > 8 * kSMaxN;
  static constexpr int kRopeAcc = kDS + N * 128;
  static constexpr int kIdx = kRopeAcc + (kRope ? 64 * N * 4 : 0); /* int32 [stages][64]: kv row or -1 */
  static constexpr int kLp = kIdx + kSStages * kSBlockK * 4; /* f32 [NP]: L' log2e, +inf dead */
  static constexpr int kDelta = kLp + kNP * 4;            /* f32 [NP] */
  static constexpr int kBars = (kDelta + kNP * 4 + 7) / 8 * 8; /* q_full, full[2], empty[2] */
  static constexpr int kEnd = kBars + 8 * (1 + 2 * kSStages);
  static constexpr int kBytes = kEnd + 1024;
  static constexpr int kOutPitch = NB * 128 + 16;         /* staged dq row: D bf16 + 16 B */
  static_assert(N % 8 == 0 && N >= 8 && N <= kSMaxN, "wgmma N");
  static_assert(kQ % 1024 == 0 && kDO % 1024 == 0 && kDS % 1024 == 0, "1024-B tiles");
  static_assert(N * kOutPitch <= kTile, "staged dq fits in KV stage 0");
};
static_assert(SSmem<9, 32>::kBytes <= 232448 && SSmem<8, 32>::kBytes <= 232448, "fits the 227 KB opt-in");

struct SArgs {
  dsa_attn_bwd_params p;
  const float *delta, *lp; /* [T, H] from the prep pass */
  float *acc;              /* [T_kv, D] fp32 (atomic mode) */
  float *contrib;          /* deterministic: [chunk tokens][K][D] fp32 per-slot dKV rows */
  int64_t tok0;            /* deterministic: first token of the chunk (0 otherwise) */
  float scale, scale_log2;
  int dq_vec16; /* dq rows 16-B aligned: uint4 stores */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* D(64xCW) (+)= A(64x16, registers: the accumulator-pair map) B(16xCW, smem MN-major, tB = 1). */
template <int CW>
__device__ __forceinline__ void sb_wgmma_rs_tb1(float *d, const uint32_t *a, uint64_t desc_b, int scale_d) {
  if constexpr (CW == 32)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
  if constexpr (CW == 64)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* stmatrix m8n8.x2 .trans: lanes 0-7 address the rows of matrix 0, lanes 8-15 those of matrix 1;
 * memory row q of a matrix receives column q of the thread-distributed 8 x 8 fragment. */
__device__ __forceinline__ void sb_stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

/* dKV rows of one CW-wide chunk ch of the head dims for the tile's 64 keys (keys on M): RS wgmma,
 * A = dS^T (and P^T when KDO, value dims) from registers, B = Q (dO) block read MN-major (tB = 1:
 * LBO = one 64-column block of Q, SBO 1024 per 8 heads, +2048 B per k16 of heads); then per key row
 * the red.global.add.v4.f32 (or the deterministic mode's streaming store). Register i: key row
 * r0 + 8 ((i >> 1) & 1), dim CW ch + 8 (i >> 2) + 2 (lane % 4) + (i & 1). Lanes l and l ^ 1 swap one
 * pair so that the even lane holds 4 consecutive dims of row r0 and the odd lane 4 of row r0 + 8:
 * one 16-B atomic / store per (lane, 8-dim group). */
template <int NB, int N, int CW, bool KDO, bool kDet, int kLay>
__device__ __forceinline__ void small_bwd_dkv_chunk(const SArgs &args, uint32_t sq, uint32_t sdo,
                                                    const uint32_t (*ads)[4], const uint32_t (*ap)[4], int ch,
                                                    int lane, int32_t kr, int64_t crow) {
  typedef SSmem<NB, N> L;
  constexpr int kD = 64 * NB;
  constexpr int NKS = L::kNP / 16;
  static_assert(CW == 64, "MN-major SW128 B: chunks of whole 64-column blocks");
  float acc[CW / 2];
#pragma unroll
  for (int i = 0; i < CW / 2; ++i) {
    acc[i] = 0.f;
    sm90_fence_operand(acc[i]);
  }
  sm90_wgmma_fence();
  const uint32_t boff = (uint32_t)ch * L::kQBlk;
#pragma unroll
  for (int j = 0; j < NKS; ++j)
    sb_wgmma_rs_tb1<CW>(acc, ads[j], sm90_desc_at(sq >> 4, boff + j * 2048, L::kQBlk, 1024), j != 0);
  if constexpr (KDO) {
#pragma unroll
    for (int j = 0; j < NKS; ++j)
      sb_wgmma_rs_tb1<CW>(acc, ap[j], sm90_desc_at(sdo >> 4, boff + j * 2048, L::kQBlk, 1024), 1);
  }
  sm90_wgmma_commit();
  sm90_wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < CW / 2; ++i) sm90_fence_operand(acc[i]);
  if constexpr (kLay == 1) {
    /* permuted accumulator (layout 1, non-deterministic only; src/internal.h dsa_bwd_dkv_slot): no
     * pair swap. kr is row r0's kv row on even lanes and row r0 + 8's on odd ones (as for layout 0;
     * one register: holding both across the tile spilled 16 B at N = 32, D = 576), so one shfl per
     * chunk fetches the other from lane ^ 1 (same r0). For 16-column group g, registers 8 g +
     * {0, 1, 4, 5} (+ 2: row r0 + 8) are real columns CW ch + 16 g + {2 q, 2 q + 1, 8 + 2 q, 9 + 2 q},
     * q = lane % 4, stored at slots CW ch + 16 g + 4 q + {0..3}: one v4 per (row, group), the quad
     * 64 contiguous bytes of a row (layout 0: 2 lanes, 32 B). Still 8 v4 per thread per chunk. */
    static_assert(!kDet, "the deterministic mode keeps layout 0");
    const int32_t kother = __shfl_xor_sync(0xffffffffu, kr, 1);
    const int32_t kr_lo = (lane & 1) ? kother : kr, kr_hi = (lane & 1) ? kr : kother;
    const int s0 = dsa_bwd_dkv_slot(CW * ch + 2 * (lane & 3)); /* = CW ch + 4 (lane % 4) */
#pragma unroll
    for (int g4 = 0; g4 < CW / 16; ++g4) {
      if (kr_lo >= 0)
        atomicAdd((float4 *)(args.acc + (int64_t)kr_lo * kD + s0 + 16 * g4),
                  make_float4(acc[8 * g4], acc[8 * g4 + 1], acc[8 * g4 + 4], acc[8 * g4 + 5]));
      if (kr_hi >= 0)
        atomicAdd((float4 *)(args.acc + (int64_t)kr_hi * kD + s0 + 16 * g4),
                  make_float4(acc[8 * g4 + 2], acc[8 * g4 + 3], acc[8 * g4 + 6], acc[8 * g4 + 7]));
    }
    return;
  }
  const int odd = lane & 1;
  const int c0 = CW * ch + 2 * (lane & 2); /* + 8 cc: first of this lane's 4 dims */
#pragma unroll
  for (int cc = 0; cc < CW / 8; ++cc) {
    const float a0 = acc[4 * cc], a1 = acc[4 * cc + 1], b0 = acc[4 * cc + 2], b1 = acc[4 * cc + 3];
    const float x0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
    const float4 v = odd ? make_float4(x0, x1, b0, b1) : make_float4(a0, a1, x0, x1);
    if (kr >= 0) {
      if constexpr (kDet) {
        /* streaming store (the chunk buffer is far larger than L2) of this slot's row */
        __stcs((float4 *)(args.contrib + crow * kD + c0 + 8 * cc), v);
      } else {
        atomicAdd((float4 *)(args.acc + (int64_t)kr * kD + c0 + 8 * cc), v);
      }
    }
  }
}

/* The consumer warpgroup (t = thread in the WG). */
template <int NB, int N, bool kDet, int kLay>
__device__ __forceinline__ void small_bwd_consumer(const SArgs &args, uint8_t *smem, int t, int ntiles) {
  typedef SSmem<NB, N> L;
  constexpr int kD = 64 * NB;
  constexpr int NR = N / 2;        /* accumulator registers of one m64nN tile */
  constexpr int NC = N / 4;        /* distinct columns (heads) per thread */
  constexpr int NKS = L::kNP / 16; /* k16 steps of heads in the dKV products */
  constexpr bool kRope = L::kRope;
  constexpr int NBR = kRope ? NB - 1 : NB; /* dQ^T blocks held in registers */
  const dsa_attn_bwd_params &p = args.p;
  const int64_t tok = args.tok0 + blockIdx.x;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = 16 * warp + (lane >> 2); /* this thread's rows (keys / dims): r0, r0 + 8 */
  const float scale = args.scale, scale_log2 = args.scale_log2;
  const int32_t *sidx = (const int32_t *)(smem + L::kIdx);
  float *racc = (float *)(smem + L::kRopeAcc); /* kRope: [NR][128] */
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + kSStages;
  const uint32_t sq = sm90_smem_addr(smem + L::kQ), sdo = sm90_smem_addr(smem + L::kDO);
  const uint32_t sds = sm90_smem_addr(smem + L::kDS);
  /* Accumulator map (docs/hopper.md section 2): register i is row 16 warp + lane / 4 + 8 ((i >> 1) & 1),
   * column 8 (i >> 2) + 2 (lane % 4) + (i & 1); column slot c = 2 (i >> 2) + (i & 1). */
#define SLOT_OF(i) (2 * ((i) >> 2) + ((i) & 1))
#define COL_OF(c) (8 * ((c) >> 1) + 2 * (lane & 3) + ((c) & 1))

  float dq[NBR][NR]; /* dQ^T: block m = dims [64 m, 64 m + 64) x N heads */
#pragma unroll
  for (int m = 0; m < NBR; ++m)
#pragma unroll
    for (int i = 0; i < NR; ++i) dq[m][i] = 0.f;
  if constexpr (kRope) {
#pragma unroll
    for (int i = 0; i < NR; ++i) racc[i * 128 + t] = 0.f; /* this thread's entries only */
  }

  if (ntiles > 0) {
    sm90_mbar_wait(q_full, 0);
    sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
  }
  float lp2[NC], dl[NC];
  {
    const float *slp = (const float *)(smem + L::kLp), *sdl = (const float *)(smem + L::kDelta);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      lp2[c] = ntiles > 0 ? slp[COL_OF(c)] : 0.f;
      dl[c] = ntiles > 0 ? sdl[COL_OF(c)] : 0.f;
    }
  }

  for (int n = 0; n < ntiles; ++n) {
    const int s = n % kSStages;
    sm90_mbar_wait(&full[s], (uint32_t)(n / kSStages) & 1);
    sm90_fence_proxy_async();
    const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTile);

    /* ---- S^T = K Q^T and dP^T = V dO^T: both K-major SW128, SBO 1024, +32 B per k16; the KV tile
     * has 8 KB per 64-column block, Q / dO NP * 128 B. */
    float sacc[NR], dpacc[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      sacc[i] = 0.f;
      dpacc[i] = 0.f;
      sm90_fence_operand(sacc[i]);
      sm90_fence_operand(dpacc[i]);
    }
    sm90_wgmma_fence();
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        sm90_wgmma_ss_nN<N, 0>(sacc, sm90_desc_at(skv >> 4, b * kSBlk + k * 32, 16, 1024),
                          sm90_desc_at(sq >> 4, b * L::kQBlk + k * 32, 16, 1024), (b | k) != 0);
#pragma unroll
    for (int b = 0; b < kSNBV; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        sm90_wgmma_ss_nN<N, 0>(dpacc, sm90_desc_at(skv >> 4, b * kSBlk + k * 32, 16, 1024),
                          sm90_desc_at(sdo >> 4, b * L::kQBlk + k * 32, 16, 1024), (b | k) != 0);
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      sm90_fence_operand(sacc[i]);
      sm90_fence_operand(dpacc[i]);
    }

    /* ---- P^T, dS^T (rows = keys r0, r0 + 8; columns = heads) */
    const int32_t kr0 = sidx[s * kSBlockK + r0], kr1 = sidx[s * kSBlockK + r0 + 8];
    float pv[NR], dsv[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      const int c = SLOT_OF(i);
      const bool ok = ((i >> 1) & 1) ? kr1 >= 0 : kr0 >= 0;
      const float pr = ok ? exp2f(sacc[i] * scale_log2 - lp2[c]) : 0.f;
      pv[i] = pr;
      dsv[i] = scale * pr * (dpacc[i] - dl[c]);
    }
    /* WAR on the dS^T tile: every warp has finished the dQ^T wgmma of tile n - 1 (which reads it)
     * before any warp overwrites it. */
    if (n > 0) sm90_named_bar_sync_any(kSBarDQ, 128);
    /* dS^T -> smem [N heads][64 keys] bf16 K-major SW128 (the B operand of dQ^T): for heads
     * 8j..8j+7 the warp's fragment is two 8 x 8 matrices [keys][heads] (rows r0, r0 + 8);
     * stmatrix .trans stores each transposed: memory row q = head 8j + q, 16 B = 8 keys at chunk
     * 2 warp + matrix, swizzled by q. */
    {
      const int q = lane & 7, mat = (lane >> 3) & 1, chunk = 2 * warp + mat;
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const int h = 8 * j + q;
        sb_stmatrix_x2_trans(sds + h * 128 + (((chunk ^ q) & 7) << 4), sm90_pack_bf16x2(dsv[4 * j], dsv[4 * j + 1]),
                             sm90_pack_bf16x2(dsv[4 * j + 2], dsv[4 * j + 3]));
      }
    }
    /* A registers of the dKV products: k16 slice j (heads 16 j .. 16 j + 15), register q = the
     * accumulator pair (8 j + 2 q, + 1); pairs past N are zero heads. */
    uint32_t ads[NKS][4], ap[NKS][4];
#pragma unroll
    for (int j = 0; j < NKS; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = 8 * j + 2 * q;
        ads[j][q] = i < NR ? sm90_pack_bf16x2(dsv[i], dsv[i + 1]) : 0u;
        ap[j][q] = i < NR ? sm90_pack_bf16x2(pv[i], pv[i + 1]) : 0u;
      }
    sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> wgmma (async proxy) */
    sm90_named_bar_sync_any(kSBarDS, 128);

    /* ---- dQ^T += K^T dS^T: A = the KV tile's block m read M-major (tA = 1): LBO 8192, SBO 1024,
     * +2048 B per k16 of keys; B = dS^T K-major, +32 B per k16 of keys. kRope: block NB - 1 into a
     * fresh accumulator, added to its fp32 smem copy. */
    float rtmp[kRope ? NR : 1];
#pragma unroll
    for (int m = 0; m < NBR; ++m)
#pragma unroll
      for (int i = 0; i < NR; ++i) sm90_fence_operand(dq[m][i]);
    if constexpr (kRope) {
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        rtmp[i] = 0.f;
        sm90_fence_operand(rtmp[i]);
      }
    }
    sm90_wgmma_fence();
#pragma unroll
    for (int m = 0; m < NBR; ++m)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        sm90_wgmma_ss_nN<N, 1>(dq[m], sm90_desc_at(skv >> 4, m * kSBlk + kk * 2048, kSBlk, 1024),
                          sm90_desc_at(sds >> 4, kk * 32, 16, 1024), 1);
    if constexpr (kRope) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        sm90_wgmma_ss_nN<N, 1>(rtmp, sm90_desc_at(skv >> 4, (NB - 1) * kSBlk + kk * 2048, kSBlk, 1024),
                          sm90_desc_at(sds >> 4, kk * 32, 16, 1024), kk != 0);
    }
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < NBR; ++m)
#pragma unroll
      for (int i = 0; i < NR; ++i) sm90_fence_operand(dq[m][i]);
    if constexpr (kRope) {
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        sm90_fence_operand(rtmp[i]);
        racc[i * 128 + t] += rtmp[i];
      }
    }
    sm90_mbar_arrive(&empty[s]); /* stage s (tile and indices, read above) is free */

    /* ---- dKV rows: the value blocks with P^T dO, then (D = 576) the rope block */
#pragma unroll
    for (int j = 0; j < NKS; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        sm90_fence_operand_u32(ads[j][q]);
        sm90_fence_operand_u32(ap[j][q]);
      }
    const int odd = lane & 1;
    const int32_t kr = odd ? kr1 : kr0;
    const int64_t crow = (int64_t)blockIdx.x * p.topk + (int64_t)n * kSBlockK + r0 + 8 * odd; /* det: contrib row */
#pragma unroll 1
    for (int b = 0; b < kSNBV; ++b)
      small_bwd_dkv_chunk<NB, N, 64, true, kDet, kLay>(args, sq, sdo, ads, ap, b, lane, kr, crow);
    if constexpr (NB > kSNBV)
      small_bwd_dkv_chunk<NB, N, 64, false, kDet, kLay>(args, sq, sdo, ads, ap, kSNBV, lane, kr, crow);
  }

  /* ---- dQ out: dQ^T -> staged [head][D] bf16 rows in KV stage 0 (every tile consumed: no copy in
   * flight, no wgmma reading it after the barrier), then 16-B stores of the real heads. */
  sm90_named_bar_sync_any(kSBarOut, 128);
  uint8_t *stage = smem + L::kKV;
#pragma unroll
  for (int m = 0; m < NB; ++m)
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      const int dim = 64 * m + r0 + 8 * ((i >> 1) & 1);
      const int h = COL_OF(SLOT_OF(i));
      const float v = (kRope && m == NB - 1) ? racc[i * 128 + t] : dq[m < NBR ? m : 0][i];
      *(uint16_t *)(stage + h * L::kOutPitch + dim * 2) = (uint16_t)(sm90_pack_bf16x2(v, 0.f) & 0xffffu);
    }
  sm90_named_bar_sync_any(kSBarOut, 128);
  constexpr int kChunks = kD / 8; /* 16-B chunks per dq row */
  const int Hn = p.num_heads;
  for (int cidx = t; cidx < Hn * kChunks; cidx += 128) {
    const int h = cidx / kChunks, ch = cidx - h * kChunks;
    const uint4 v = *(const uint4 *)(stage + h * L::kOutPitch + ch * 16);
    uint16_t *dst = p.dq + tok * p.dq_stride_token + (int64_t)h * p.dq_stride_head + ch * 8;
    sm90_store_16b(dst, v, args.dq_vec16);
  }
#undef SLOT_OF
#undef COL_OF
}
#endif

/* The kernel body (kLay: the dKV accumulator layout of the non-deterministic mode, 1 permuted, 0 real
 * column order: the launcher's kLayAtomic). */
template <int NB, int N, bool kDet, int kLay>
__device__ __forceinline__ void attn_bwd_sm90_small_main(const SArgs &args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef SSmem<NB, N> L;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* the integer round trip (generic LD / ST to shared memory), not sm90_smem_align1024: with shared
   * loads the N = 32, D = 576 instantiations reach 255 registers and spill 4 B */
  uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + kSStages;
  const dsa_attn_bwd_params &p = args.p;
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  const int64_t tok = args.tok0 + blockIdx.x;
  int klen = p.topk; /* slots [0, klen) may be valid */
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + kSBlockK - 1) / kSBlockK;

  if (tid == 0) {
    sm90_mbar_init(q_full, 256);
    for (int s = 0; s < kSStages; ++s) {
      sm90_mbar_init(&full[s], 256);
      sm90_mbar_init(&empty[s], 128);
    }
    sm90_mbar_init_fence();
  }
  __syncthreads();

  if (wg == 1) {
    /* ================= producer ================= */
    if (ntiles == 0) return; /* dq = 0: the consumer waits on nothing */
    const int g = t >> 3, j = t & 7; /* chunk j of rows g, g + 16, ... (rows 16 apart: same r % 8) */
    const int H = p.num_heads;
    const uint32_t sq = sm90_smem_addr(smem + L::kQ), sdo = sm90_smem_addr(smem + L::kDO);
#pragma unroll
    for (int i = 0; i < L::kNP / 16; ++i) {
      const int r = g + 16 * i;
      const bool ok = r < H; /* rows H..NP-1: zero (dead columns, and the k16 pad of the dKV products) */
      const int hh = ok ? r : 0;
      const uint16_t *qs = p.q + tok * p.q_stride_token + (int64_t)hh * p.q_stride_head + j * 8;
      const uint16_t *gs = p.dout + tok * p.dout_stride_token + (int64_t)hh * p.dout_stride_head + j * 8;
#pragma unroll
      for (int b = 0; b < NB; ++b)
        sm90_cp_async16(sq + b * L::kQBlk + sm90_sw128_chunk_off(r, j), qs + b * 64, ok ? 16u : 0u);
#pragma unroll
      for (int b = 0; b < kSNBV; ++b)
        sm90_cp_async16(sdo + b * L::kQBlk + sm90_sw128_chunk_off(r, j), gs + b * 64, ok ? 16u : 0u);
    }
    if (t < L::kNP) {
      float *slp = (float *)(smem + L::kLp), *sdl = (float *)(smem + L::kDelta);
      const bool live = t < H;
      slp[t] = live ? args.lp[tok * H + t] * kSLog2e : INFINITY; /* +inf * log2e = +inf */
      sdl[t] = live ? args.delta[tok * H + t] : 0.f;
    }
    sm90_cp_async_mbar_arrive_noinc(q_full);
    sm90_mbar_arrive(q_full); /* releases the L' / Delta stores */

    const int32_t *irow = p.indices + tok * p.indices_stride;
    int32_t *sidx = (int32_t *)(smem + L::kIdx);
    for (int n = 0; n < ntiles; ++n) {
      const int s = n % kSStages;
      const uint32_t use = (uint32_t)(n / kSStages);
      int32_t idxs[4]; /* read before the wait: the latency overlaps the consumer's work */
      sm90_gather_read_indices(irow, n, g, klen, idxs);
      sm90_mbar_wait(&empty[s], (use & 1) ^ 1); /* first use of a stage: parity 1 returns at once */
      const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTile);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = g + 16 * i;
        const int32_t idx = idxs[i];
        const bool ok = idx >= 0 && (int64_t)idx < p.num_kv;
        const uint16_t *src = ok ? p.kv + (int64_t)idx * p.kv_stride + j * 8 : p.q + j * 8;
#pragma unroll
        for (int b = 0; b < NB; ++b)
          sm90_cp_async16(skv + b * kSBlk + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u);
        if (j == 0) sidx[s * kSBlockK + r] = ok ? idx : -1;
      }
      sm90_cp_async_mbar_arrive_noinc(&full[s]); /* fires when this thread's copies have landed */
      sm90_mbar_arrive(&full[s]);                /* releases the index stores */
    }
    sm90_cp_async_wait_all();
  } else {
    small_bwd_consumer<NB, N, kDet, kLay>(args, smem, t, ntiles);
  }
#endif
}

/* kDet: the deterministic mode (layout 0); kLay 1 (non-deterministic mode only): the permuted dKV
 * accumulator, 64-B v4 atomics, no pair swap. */
template <int NB, int N, bool kDet, int kLay>
__global__ void __launch_bounds__(kSThreads, 1) attn_bwd_sm90_small_kernel(const __grid_constant__ SArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  attn_bwd_sm90_small_main<NB, N, kDet, kLay>(args);
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run (the launcher checks cc 9.0) */
#endif
}

/* ---- deterministic mode: the 64-head kernel's workspace layout (bwd_det_layout) and fixed-order
 * reduction (bwd_det_reduce_kernel<D, 1>), both in cuda/attn_bwd/bwd_common.cuh: H <= 32 is one head
 * block, and contrib row (token - tok0) K + slot is what that kernel reads for entry id i. */

/* Dynamic smem attribute: once per (instantiation, device). */
template <int NB, int N, bool kDet, int kLay>
dsa_status small_prepare(int dev) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* per instantiation: the smem limit set per device */
  const void *fn = (const void *)attn_bwd_sm90_small_kernel<NB, N, kDet, kLay>; /* instantiated only if used */
  return dsa_kernel_smem_once(fn, SSmem<NB, N>::kBytes, 0, dev, attr_set, "dsa_sparse_attn_bwd: cudaFuncSetAttribute");
}

template <int NB, int N>
dsa_status small_launch(const dsa_context *ctx, const dsa_attn_bwd_params *p, void *workspace, cudaStream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  constexpr int kD = 64 * NB;
  const int smem_bytes = SSmem<NB, N>::kBytes;
  if (smem_bytes > ctx->max_smem_optin)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H backward kernel needs %d bytes of shared memory, device has %d", fn,
                    smem_bytes, ctx->max_smem_optin);
  unsigned char *ws = bwd_align_workspace(workspace);
  const BwdBaseRegions R = bwd_base_regions(ws, p);
  float *delta = R.delta, *lp = R.lp, *part = R.part, *acc = R.acc;
  if (p->num_tokens == 0) return bwd_zero_tokens(p, part, stream);
  const int det = p->deterministic ? 1 : 0;
  /* dKV accumulator (src/internal.h): the permuted layout 1 in the non-deterministic mode, except at
   * N = 32, D = 576, where the layout-1 kernel spilled 16 B at 255 registers (ptxas, nvcc 13.0): that
   * configuration keeps layout 0 (real column order; no layout-1 kernel is instantiated for it), as
   * does the deterministic mode. */
  constexpr bool kLay1Ok = !(NB == 9 && N == 32);
  constexpr int kLayAtomic = kLay1Ok ? 1 : 0; /* the non-deterministic kernel's layout */
  const int lay1 = kLay1Ok && !det;
  BwdDetLayout DL = BwdDetLayout(); /* value-initialised: filled by bwd_det_layout in the deterministic mode */
  if (det) {
    DSA_TRY(bwd_det_layout(p, ctx->options[DSA_OPTION_BWD_DET_CHUNK_TOKENS], &DL));
    DSA_TRY((small_prepare<NB, N, true, 0>(ctx->device)));
  } else {
    DSA_TRY((small_prepare<NB, N, false, kLayAtomic>(ctx->device)));
  }
  DSA_TRY(bwd_launch_prep(p, delta, lp, part, stream));
  if (p->num_kv > 0) DSA_TRY(dsa_cuda_status((int)cudaMemsetAsync(acc, 0, (size_t)p->num_kv * kD * 4, stream), fn));

  SArgs args;
  args.p = *p;
  args.delta = delta;
  args.lp = lp;
  args.acc = acc;
  args.contrib = nullptr;
  args.tok0 = 0;
  args.scale = p->softmax_scale;
  args.scale_log2 = p->softmax_scale * kSLog2e;
  args.dq_vec16 = dsa_rows_16b_aligned(p->dq, p->dq_stride_token, p->dq_stride_head);
  if (!det) {
    attn_bwd_sm90_small_kernel<NB, N, false, kLayAtomic><<<(unsigned)p->num_tokens, kSThreads, smem_bytes, stream>>>(args);
    DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  } else {
    args.contrib = (float *)(ws + DL.contrib);
    for (int64_t t0 = 0; t0 < p->num_tokens; t0 += DL.chunk) {
      const int64_t nt = p->num_tokens - t0 < DL.chunk ? p->num_tokens - t0 : DL.chunk;
      args.tok0 = t0;
      attn_bwd_sm90_small_kernel<NB, N, true, 0><<<(unsigned)nt, kSThreads, smem_bytes, stream>>>(args);
      DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
      if (p->num_kv == 0) continue; /* every slot invalid: dq only */
      DSA_TRY((bwd_det_sort_reduce<kD, 1>(p, DL, ws, t0, nt, args.contrib, p->topk, acc, stream)));
    }
  }
  if (p->num_kv > 0) DSA_TRY(lay1 ? bwd_launch_convert_lay1<kD>(p, acc, stream) : bwd_launch_convert(p, acc, stream));
  if (p->dsink) DSA_TRY(bwd_launch_dsink(p, part, stream));
  return DSA_SUCCESS;
}

template <int NB>
dsa_status small_launch_nb(const dsa_context *ctx, const dsa_attn_bwd_params *p, void *workspace,
                           cudaStream_t stream) {
  switch ((p->num_heads + 7) / 8) {
    case 1: return small_launch<NB, 8>(ctx, p, workspace, stream);
    case 2: return small_launch<NB, 16>(ctx, p, workspace, stream);
    case 3: return small_launch<NB, 24>(ctx, p, workspace, stream);
    default: return small_launch<NB, 32>(ctx, p, workspace, stream);
  }
}

}  // namespace

extern "C" dsa_status dsa_launch_attn_bwd_sm90_small(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                                     void *workspace, cudaStream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  if (!(ctx->cc_major == 9 && ctx->cc_minor == 0))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H backward kernel needs compute capability 9.0, device has %d.%d", fn,
                    ctx->cc_major, ctx->cc_minor);
  if (p->head_dim != 576 && p->head_dim != 512)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a small-H backward kernel supports head_dim 576 and 512, not %d",
                    fn, (int)p->head_dim);
  if (p->num_heads < 1 || p->num_heads > kSMaxN)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a small-H backward kernel supports num_heads 1..%d, not %d",
                    fn, kSMaxN, (int)p->num_heads);
  if (((uintptr_t)p->q & 15) || ((uintptr_t)p->kv & 15) || ((uintptr_t)p->dout & 15) || (p->q_stride_token & 7) ||
      (p->q_stride_head & 7) || (p->kv_stride & 7) || (p->dout_stride_token & 7) || (p->dout_stride_head & 7))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H backward kernel needs 16-byte aligned q / kv / dout rows (q strides "
                    "%lld, %lld; kv_stride %lld; dout strides %lld, %lld)",
                    fn, (long long)p->q_stride_token, (long long)p->q_stride_head, (long long)p->kv_stride,
                    (long long)p->dout_stride_token, (long long)p->dout_stride_head);
  if (((uintptr_t)p->dq & 3) || (p->dq_stride_token & 1) || (p->dq_stride_head & 1))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H backward kernel needs 4-byte aligned dq rows (dq strides %lld, %lld)", fn,
                    (long long)p->dq_stride_token, (long long)p->dq_stride_head);
  if (p->num_tokens > (int64_t)0x7fffffff)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a small-H backward kernel handles at most %d tokens, not %lld",
                    fn, 0x7fffffff, (long long)p->num_tokens);
  return p->head_dim == 576 ? small_launch_nb<9>(ctx, p, workspace, stream)
                            : small_launch_nb<8>(ctx, p, workspace, stream);
}
