/*
 * fwd_sm90_h64.cu - sparse MLA attention forward on sm_90a tensor cores (wgmma), 64 heads per CTA on
 * the wgmma M: dsa_fwd_launch_sm90_h64 (cuda/attn_fwd/fwd_launch.cuh). The forward's dispatch point
 * (cuda/attn_fwd/dispatch.cu) gives the small-H kernel (fwd_sm90_small.cu) head ranges that are not a
 * multiple of 64 in automatic mode, the portable kernel (fwd_portable.cu) every configuration this
 * one declines with DSA_ERROR_UNSUPPORTED. Design and rationale: docs/fwd-sm90-next.md (the
 * tile-split layout that FlashMLA's sm90 sparse prefill uses; written from that description, no code
 * taken).
 *
 * One CTA = one query token x one block of 64 heads (H = 128: two CTAs per token, adjacent in the
 * 1-D grid so they share the gathered KV rows in L2). A launch covers heads [head_begin, head_end) of
 * the H heads (the whole H, or [0, 64 floor(H / 64)) when the dispatch gives the rest to the small-H
 * kernel); heads are addressed by their global index (q / out strides, lse t * H + h, sink h). A head
 * range that is not a multiple of 64 runs with the missing Q rows zero-filled (never written out).
 * 384 threads:
 *   WG2 producer (56 registers): cp.async gather with the manual 128B swizzle (docs/hopper.md section
 *       5) into two KV buffers of 64 keys x D, each in two halves with their own mbarriers: L = blocks
 *       0..3 (dims 0..255), R = blocks 4..NB-1 (dims 256..D-1). Tile 2i goes to buffer 0, tile 2i + 1
 *       to buffer 1. Invalid slots (beyond topk_length, index < 0 or >= num_kv) are zero-filled and
 *       flagged in a per-buffer byte mask. The gather's cp.async carry the L2 policy of
 *       DSA_OPTION_FWD_KV_L2_HINT (dsa_fwd_kv_evict_last, cuda/attn_fwd/dispatch.cu).
 *   WG0, WG1 consumers (224 registers): first load Q (cp.async, evict_first; the producer never waits
 *       for it), then WG w computes the whole S = Q K^T (m64n64k16 SS, D/16 steps)
 *       of the tiles in buffer w, i.e. WG0 the even tiles, WG1 the odd ones. WG0 owns value dims
 *       0..255 of O, WG1 256..511; each runs PV for both tiles of a pair: its own P from registers
 *       (RS m64n256k16 x4) and the peer's P from a shared tile (SS m64n256k16 x4).
 * Head dims: D = 576 (nine 64-column SW128 blocks) and D = 512 (eight), one instantiation each.
 * One softmax frame per row for both WGs, chained per pair of tiles through sm_max[64]. The frame is
 * moved lazily (kSm90RescaleSlack, sm90_common.cuh): lazy(f, t) = t > f + 8 ? max(f, t) : f, so that on
 * most tiles every factor below is exactly 1 and the warp skips the O rescale (128 FMUL per thread)
 * and WG0 the repacking of P0; max_logits comes from each WG's true running max, met in the epilogue:
 *   WG0: m0 = lazy(m, tilemax(2i)), posts m0 (kBarM0 arrive), O0 *= exp2(m - m0), P0 = exp2(s - m0),
 *        O0 += P0 V0[0:256] (RS), releases buffer 0 L; waits kBarM1, reads m1, scales its fp32 P0 by
 *        exp2(m0 - m1) into the shared tile sP0 (kBarS0 arrive), O0 *= exp2(m0 - m1), waits kBarS1,
 *        O0 += sP1 V1[0:256] (SS), issues S(2i + 2) half L, retires the SS PV (releases buffer 1 L),
 *        issues half R, waits for S.
 *   WG1: S(2i + 1) (half R first, the order it arrives), waits kBarM0, m1 = lazy(max(m, m0), tilemax),
 *        posts m1 (kBarM1 arrive), O1 *= exp2(m - m1), P1 = exp2(s - m1), stmatrix P1 into sP1
 *        (kBarS1 arrive), O1 += P1 V1[256:512] (RS), waits kBarS0, O1 += sP0 V0[256:512] (SS), retires
 *        the RS PV (releases buffer 1 R), then the SS PV (releases buffer 0 R).
 *   WG0 posts m0 before its exponentials and WG1 posts kBarS1 right after its stmatrix, so neither
 *   hand-off waits on work the peer does not need.
 *   Each WG sums its own tiles' P (in fp32) into its row sums; the sums meet in the epilogue.
 * The WGs thus alternate: WG0's softmax runs under WG1's S, WG1's softmax under WG0's RS PV, and WG0
 * issues the next S right behind its SS PV.
 Epilogue: each WG normalises its O half and, where out rows are 16-B aligned, stages it as bf16 in
 * the Q tile (free once both WGs passed kBarSum: every S retired) so that each warp writes its rows
 * as whole 16-B chunks; otherwise it stores bf16 pairs from the accumulator registers.
 * Stage ownership (who releases which half; the producer refills in this order: 0L, 1R, 0R, 1L):
 *   buffer 0 L: S(even) + WG0's RS PV             -> WG0 after the RS PV (empty[0][0])
 *   buffer 0 R: S(even) + WG1's SS PV (V0 dims 256..511; at D = 576 block 8 also holds sP0)
 *                                                 -> WG1 after the SS PV (empty[0][1])
 *   buffer 1 R: S(odd) + WG1's RS PV              -> WG1 after the RS PV (empty[1][1])
 *   buffer 1 L: S(odd) + WG0's SS PV              -> WG0 after the SS PV (empty[1][0])
 * Validity bytes of buffer w are written with the half its owner releases after reading them (0 L,
 * 1 R). sP0: at D = 576 buffer 0's block 8 (the RoPE dims: only S(even) reads them, and WG0 writes
 * sP0 after that S completed; the producer refills block 8 only after WG1's SS PV released 0 R); at
 * D = 512 its own tile. sP1: its own tile; WG1 rewrites it after kBarM0 of the next pair, which WG0
 * arrives at only after it retired the SS PV that read it.
 * Any K: an odd number of 64-key tiles ends with a pair whose odd tile has only invalid slots
 * (zero-filled, masked: P = 0). Rows with no valid slot keep max -inf (rescale factors guarded).
 * A WG never waits on the full barriers of the peer's buffer: the peer waited (and ran the proxy
 * fence) before its kBarS0 / kBarS1 arrive; this WG runs fence.proxy.async after the matching sync.
 * cp.async writes are generic-proxy; a consumer runs fence.proxy.async after each full wait, before
 * wgmma reads the tile (docs/hopper.md section 3).
 * Named barriers (ids 1..5, 256 threads = both consumer WGs, the non-.aligned forms since the two WGs
 * reach them from different code): kBarM0, kBarM1, kBarS0, kBarS1 once per pair (one WG arrives, the
 * other syncs), kBarSum once in the epilogue.
 * The last pair of WG0 is peeled (template NEXT) so every wgmma wait is unconditional: with a wait
 * under a run-time branch ptxas cannot prove the accumulators retired on every path and serializes
 * the wgmmas (C7517 / C7514).
 * Template MB = true: the same kernel with the four hand-offs on mbarriers instead of named barriers
 * (hand_post below), kept because racecheck follows mbarriers but not barrier.arrive -> barrier.sync;
 * DSA_OPTION_FWD_SM90_HANDOFF selects it (the test suites do under racecheck).
 * Declined with DSA_ERROR_UNSUPPORTED: a device other than cc 9.0, any other D, q / kv rows not 16-B
 * aligned, out rows not 4-B aligned, T * ceil(head_count / 64) above 2^31 - 1 CTAs, shared memory
 * above the device's opt-in limit.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "attn_fwd/fwd_launch.cuh"

namespace {

constexpr int kThreads = 384;
constexpr int kConsumerRegs = 224; /* O 128 + S 32 + P 16 (+ WG0's fp32 P kept for the rescale) */
constexpr int kProducerRegs = 56;  /* 8 indices per pair held across 4 waits (at 40 ptxas spilled 16 B) */
constexpr int kBlkBytes = 64 * 128; /* one 64 x 64 bf16 SW128 block */
constexpr float kLog2e = 1.4426950408889634f;
static_assert(2 * kConsumerRegs + kProducerRegs <= 504, "setmaxnreg pool: 384 x 168 = 128 x 504");
static_assert(DSA_VALUE_DIM == 512, "WG w owns value dims [256 w, 256 w + 256): blocks 4 w .. 4 w + 3");

template <int NB>
struct Smem {
  static constexpr int kTile = NB * kBlkBytes;
  static constexpr int kQ = 0;
  static constexpr int kKV = kTile;                             /* buffer w at kKV + w * kTile */
  static constexpr int kP1 = kKV + 2 * kTile;                   /* WG1's P, read by WG0 */
  static constexpr int kP0 = NB == 9 ? kKV + 8 * kBlkBytes : kP1 + kBlkBytes; /* WG0's P */
  static constexpr int kValid = kP1 + (NB == 9 ? 1 : 2) * kBlkBytes; /* [2][64] bytes */
  static constexpr int kBars = kValid + 2 * 64; /* q_full, full[2][2], empty[2][2], hand[4] (MB handoffs) */
  static constexpr int kMax = kBars + 128;                      /* f32 [64] the chained row max */
  static constexpr int kSum = kMax + 64 * 4;                    /* f32 [2][64] final row sums, [2][64] maxima */
  static constexpr int kBytes = kSum + 4 * 64 * 4 + 1024;
};

static_assert(Smem<8>::kQ == 0 && Smem<9>::kQ == 0 && Smem<8>::kP0 % 1024 == 0 && Smem<9>::kP0 % 1024 == 0 &&
                  Smem<8>::kP1 % 1024 == 0 && Smem<9>::kP1 % 1024 == 0,
              "SW128 tiles start on 1024-B boundaries (descriptor base offset 0)");
static_assert(Smem<9>::kBytes <= 227 * 1024, "fits the H100 / H200 opt-in shared memory (227 KB)");

struct FwdArgs {
  dsa_attn_fwd_params p;
  float scale_log2;
  int num_hblocks, head_begin, head_end;
  int kv_evict_last; /* the KV gather's L2 policy (dsa_fwd_kv_evict_last) */
  int out_vec16;     /* 1: out rows 16-B aligned (staged, 16-B stores), else 4-B stores from registers */
};

/* Device helpers: only in the sm_90a pass (and the host pass, which never calls them): the compute_90
 * PTX pass has no sm90_common.cuh wrappers; the kernel body is guarded the same way. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kBarM0 = 1, kBarM1 = 2, kBarS0 = 3, kBarS1 = 4, kBarSum = 5; /* named barriers; 0 = __syncthreads */

__device__ __forceinline__ void bar_arrive_any(int id, int count) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* The four per-pair hand-offs between the consumer WGs (M0, M1, S0, S1): one WG posts, the other
 * waits. MB = false (the default): named barrier id, barrier.arrive / barrier.sync of 256 threads.
 * MB = true: the mbarrier hand[id - 1], 128 arrivals of the posting WG (release), the waiter acquires
 * phase i & 1 of pair i; same protocol and data flow, slower (docs/perf.md), kept as the twin that
 * racecheck can follow (it does not follow barrier.arrive -> barrier.sync: dev/barrier_probe.cu,
 * docs/reliability.md section 3c). */
template <bool MB>
__device__ __forceinline__ void hand_post(int id, uint64_t *hand) {
  if constexpr (MB) sm90_mbar_arrive(&hand[id - 1]);
  else bar_arrive_any(id, 256);
}
template <bool MB>
__device__ __forceinline__ void hand_wait(int id, uint64_t *hand, int i) {
  if constexpr (MB) sm90_mbar_wait(&hand[id - 1], (uint32_t)i & 1);
  else sm90_named_bar_sync_any(id, 256);
}

/* Every wgmma descriptor is b4 (the shared-memory base's address >> 4, one live register) plus a
 * compile-time offset of the Smem map (sm90_desc_at). */

/* Issues S += Q K^T over blocks [B0, B1) (m64n64k16 SS, both K-major SW128; Q at q_off, the KV buffer
 * at kv_off); ZERO: the first step overwrites the accumulator. */
template <int B0, int B1, bool ZERO>
__device__ __forceinline__ void issue_s(float *sacc, uint32_t b4, uint32_t q_off, uint32_t kv_off) {
#pragma unroll
  for (int b = B0; b < B1; ++b)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t off = b * kBlkBytes + k * 32;
      sm90_wgmma_ss_m64n64k16<0, 0>(sacc, sm90_desc_at(b4, q_off + off, 16, 1024),
                                    sm90_desc_at(b4, kv_off + off, 16, 1024), !(ZERO && b == B0 && k == 0));
    }
}

/* Masks the completed S (32 registers) into x (sm90_mask_logits: log2-domain logits, -inf for invalid
 * slots) and returns the tile's row maxima (rows r0, r0 + 8 of this thread), reduced over the 4
 * threads of the row. */
__device__ __forceinline__ void mask_tile(const float *sacc, const uint8_t *vs, float scale_log2, int lane, float *x,
                                          float tmax[2]) {
  sm90_mask_logits<64>(sacc, vs, scale_log2, lane, x);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float mx = -INFINITY;
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) mx = fmaxf(mx, fmaxf(x[4 * cc + 2 * hr], x[4 * cc + 2 * hr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    tmax[hr] = mx;
  }
}

/* Online-softmax step with the new row max m_new (>= row_max): alpha = rescale of the old O and sums,
 * x <- exp2(x - m), row_sum updated, P packed as the RS A operand (slice kk, register q = pair 8 kk + 2 q). */
__device__ __forceinline__ void softmax_step(float *x, const float m_new[2], float row_max[2], float row_sum[2],
                                             float alpha[2], uint32_t (*pa)[4]) {
  float m_use[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    m_use[hr] = m_new[hr] == -INFINITY ? 0.f : m_new[hr]; /* no valid slot yet: avoid (-inf) - (-inf) */
    alpha[hr] = exp2f(row_max[hr] - m_use[hr]);
    row_max[hr] = m_new[hr];
  }
  float psum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    x[i] = sm90_exp2(x[i] - m_use[(i >> 1) & 1]);
    psum[(i >> 1) & 1] += x[i];
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) row_sum[hr] = row_sum[hr] * alpha[hr] + psum[hr];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) pa[kk][q] = sm90_pack_bf16x2(x[8 * kk + 2 * q], x[8 * kk + 2 * q + 1]);
}

__device__ __forceinline__ void rescale_o(float *o, const float f[2]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= f[(i >> 1) & 1];
}

/* The lazily moved frame (sm90_frame_moves): the row's frame f moves to the tile's max tm only when tm
 * exceeds it by more than the slack. */
__device__ __forceinline__ float lazy_frame(float f, float tm) { return sm90_frame_moves(f, tm) ? fmaxf(f, tm) : f; }

/* P (64 heads x 64 keys, this WG's A-operand registers) -> the K-major SW128 tile at pbuf, then the
 * proxy fence (stmatrix is generic-proxy, the peer's wgmma reads it through the async proxy). */
__device__ __forceinline__ void store_p(uint32_t pbuf, uint32_t (*pa)[4], int warp, int lane) {
  const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int chunk = 2 * kk + (lane >> 4);
    sm90_stmatrix_x4(pbuf + r * 128 + (((chunk ^ r) & 7) << 4), pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
  }
  sm90_fence_proxy_async();
}

/* O (+)= P V for this WG's value dims: V = buffer blocks [4 c, 4 c + 4) at v_off read MN-major (LBO
 * 8192, SBO 1024, +2048 B per 16 keys). RS: P from registers; SS: P from the shared tile at p_off. */
__device__ __forceinline__ void issue_pv_rs(float *o, uint32_t (*pa)[4], uint32_t b4, uint32_t v_off) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90_wgmma_rs_m64n256k16_tb1(o, pa[kk], sm90_desc_at(b4, v_off + kk * 2048, kBlkBytes, 1024), 1);
}
__device__ __forceinline__ void issue_pv_ss(float *o, uint32_t b4, uint32_t p_off, uint32_t v_off) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90_wgmma_ss_m64n256k16<1>(o, sm90_desc_at(b4, p_off + kk * 32, 16, 1024),
                                sm90_desc_at(b4, v_off + kk * 2048, kBlkBytes, 1024), 1);
}

#define FENCE_ARR(a, n)                                                                                         \
  do {                                                                                                          \
    _Pragma("unroll") for (int fi_ = 0; fi_ < (n); ++fi_) sm90_fence_operand((a)[fi_]);                       \
  } while (0)
#define FENCE_PA(pa)                                                                                            \
  do {                                                                                                          \
    _Pragma("unroll") for (int fk_ = 0; fk_ < 4; ++fk_) _Pragma("unroll") for (int fq_ = 0; fq_ < 4; ++fq_)    \
        sm90_fence_operand_u32((pa)[fk_][fq_]);                                                               \
  } while (0)

/* Waits for one half of a buffer and makes the cp.async data visible to wgmma. */
__device__ __forceinline__ void wait_half(uint64_t *bar, uint32_t parity) {
  sm90_mbar_wait(bar, parity);
  sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
}

/* WG0, pair i: S(2i) complete in sacc on entry, nothing in flight. NEXT: pair i + 1 exists; then
 * S(2i + 2) is complete on return. */
template <int NB, bool NEXT, bool MB>
__device__ __forceinline__ void wg0_pair(int i, uint8_t *smem, uint64_t (*full)[2], uint64_t (*empty)[2], uint64_t *hand,
                                         uint32_t b4,
                                         float scale_log2, int warp, int lane, float *o, float *sacc,
                                         float row_max[2], float row_sum[2], float true_max[2]) {
  typedef Smem<NB> L;
  constexpr uint32_t kB0 = L::kKV, kB1 = L::kKV + L::kTile; /* the two KV buffers' offsets */
  float *sm_max = (float *)(smem + L::kMax);
  const int r0 = 16 * warp + (lane >> 2);
  float x[32], tmax[2], m0[2], alpha[2];
  uint32_t pa[4][4];
  mask_tile(sacc, smem + L::kValid, scale_log2, lane, x, tmax);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    true_max[hr] = fmaxf(true_max[hr], tmax[hr]);
    m0[hr] = lazy_frame(row_max[hr], tmax[hr]);
  }
  /* post m0 before the exponentials: WG1 needs only the max */
  if ((lane & 3) == 0) {
    sm_max[r0] = m0[0];
    sm_max[r0 + 8] = m0[1];
  }
  hand_post<MB>(kBarM0, hand);
  softmax_step(x, m0, row_max, row_sum, alpha, pa);
  if (sm90_warp_any_factor<2>(alpha)) rescale_o(o, alpha);
  /* O0 += P0 V0[0:256] */
  FENCE_ARR(o, 128);
  FENCE_PA(pa);
  sm90_wgmma_fence();
  issue_pv_rs(o, pa, b4, kB0);
  sm90_wgmma_commit();
  sm90_wgmma_wait<0>();
  FENCE_ARR(o, 128);
  FENCE_PA(pa);
  sm90_mbar_arrive(&empty[0][0]); /* buffer 0 L: S(2i) and this PV done, mask read */
  /* the chain's max after WG1's tile: bring P0 (fp32) and O0 into that frame */
  hand_wait<MB>(kBarM1, hand, i);
  float sc[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float m1 = sm_max[r0 + 8 * hr];
    sc[hr] = m0[hr] == -INFINITY ? 1.f : exp2f(m0[hr] - m1); /* m0 = -inf: P0 = O0 = sum = 0 */
    row_max[hr] = m1;
    row_sum[hr] *= sc[hr];
  }
  /* sc = 1 (WG1's tile did not move the frame): pa still holds P0 in that frame */
  const bool moved = sm90_warp_any_factor<2>(sc);
  if (moved) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int e = 8 * kk + 2 * q;
        pa[kk][q] = sm90_pack_bf16x2(x[e] * sc[(e >> 1) & 1], x[e + 1] * sc[(e >> 1) & 1]);
      }
  }
  store_p(sm90_smem_addr(smem + L::kP0), pa, warp, lane);
  hand_post<MB>(kBarS0, hand);
  if (moved) rescale_o(o, sc);
  hand_wait<MB>(kBarS1, hand, i);
  /* buffer 1 L's cp.async data: WG1 waited full[1][0] before kBarS1; order it for this WG's wgmma */
  sm90_fence_proxy_async();
  /* O0 += sP1 V1[0:256] */
  FENCE_ARR(o, 128);
  sm90_wgmma_fence();
  issue_pv_ss(o, b4, L::kP1, kB1);
  sm90_wgmma_commit();
  if constexpr (NEXT) {
    const uint32_t par = (uint32_t)(i + 1) & 1;
    wait_half(&full[0][0], par);
    FENCE_ARR(sacc, 32);
    sm90_wgmma_fence();
    issue_s<0, 4, true>(sacc, b4, L::kQ, kB0);
    sm90_wgmma_commit();
    sm90_wgmma_wait<1>(); /* the SS PV retired (groups retire in order); S half L may run on */
    FENCE_ARR(o, 128);
    sm90_mbar_arrive(&empty[1][0]); /* buffer 1 L: S(2i + 1) and this PV done */
    wait_half(&full[0][1], par);
    sm90_wgmma_fence();
    issue_s<4, NB, false>(sacc, b4, L::kQ, kB0);
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
    FENCE_ARR(sacc, 32);
  } else {
    sm90_wgmma_wait<0>();
    FENCE_ARR(o, 128);
    sm90_mbar_arrive(&empty[1][0]);
  }
}

/* WG1, pair i: nothing in flight on entry or return. */
template <int NB, bool MB>
__device__ __forceinline__ void wg1_pair(int i, uint8_t *smem, uint64_t (*full)[2], uint64_t (*empty)[2], uint64_t *hand,
                                         uint32_t b4,
                                         float scale_log2, int warp, int lane, float *o, float *sacc,
                                         float row_max[2], float row_sum[2], float true_max[2]) {
  typedef Smem<NB> L;
  constexpr uint32_t kB0 = L::kKV, kB1 = L::kKV + L::kTile; /* the two KV buffers' offsets */
  float *sm_max = (float *)(smem + L::kMax);
  const int r0 = 16 * warp + (lane >> 2);
  const uint32_t par = (uint32_t)i & 1;
  /* S(2i + 1), half R first (the producer fills buffer 1 R before L) */
  wait_half(&full[1][1], par);
  FENCE_ARR(sacc, 32);
  sm90_wgmma_fence();
  issue_s<4, NB, true>(sacc, b4, L::kQ, kB1);
  wait_half(&full[1][0], par);
  sm90_wgmma_fence();
  issue_s<0, 4, false>(sacc, b4, L::kQ, kB1);
  sm90_wgmma_commit();
  sm90_wgmma_wait<0>();
  FENCE_ARR(sacc, 32);
  float x[32], tmax[2], m1[2], alpha[2];
  uint32_t pa[4][4];
  mask_tile(sacc, smem + L::kValid + 64, scale_log2, lane, x, tmax);
  hand_wait<MB>(kBarM0, hand, i);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    true_max[hr] = fmaxf(true_max[hr], tmax[hr]);
    m1[hr] = lazy_frame(fmaxf(row_max[hr], sm_max[r0 + 8 * hr]), tmax[hr]);
  }
  __syncwarp(); /* every lane of the row read m0 before its writer posts m1 */
  if ((lane & 3) == 0) {
    sm_max[r0] = m1[0];
    sm_max[r0 + 8] = m1[1];
  }
  hand_post<MB>(kBarM1, hand);
  softmax_step(x, m1, row_max, row_sum, alpha, pa);
  if (sm90_warp_any_factor<2>(alpha)) rescale_o(o, alpha);
  /* P1 for WG0 first: the A registers must not be read while the RS wgmma that reads them is in flight */
  store_p(sm90_smem_addr(smem + L::kP1), pa, warp, lane);
  /* sP1 written and fenced, buffer 1 L waited (full[1][0], above): WG0's SS PV may start */
  hand_post<MB>(kBarS1, hand);
  /* O1 += P1 V1[256:512] */
  FENCE_ARR(o, 128);
  FENCE_PA(pa);
  sm90_wgmma_fence();
  issue_pv_rs(o, pa, b4, kB1 + 4 * kBlkBytes);
  sm90_wgmma_commit();
  hand_wait<MB>(kBarS0, hand, i);
  /* buffer 0 R's cp.async data: WG0 waited full[0][1] before kBarS0; order it for this WG's wgmma */
  sm90_fence_proxy_async();
  /* O1 += sP0 V0[256:512] */
  sm90_wgmma_fence();
  issue_pv_ss(o, b4, L::kP0, kB0 + 4 * kBlkBytes);
  sm90_wgmma_commit();
  sm90_wgmma_wait<1>();
  FENCE_PA(pa);
  sm90_mbar_arrive(&empty[1][1]); /* buffer 1 R: S(2i + 1), the RS PV, mask read */
  sm90_wgmma_wait<0>();
  FENCE_ARR(o, 128);
  sm90_mbar_arrive(&empty[0][1]); /* buffer 0 R: S(2i) (WG0, done before kBarS0) and the SS PV */
}


/* Item it of the launch: (token, block of 64 heads), tokens in descending order (with causal lengths
 * the longest rows start first and the short ones fill the last wave: a static longest-first
 * schedule; equal lengths: no change), the head blocks of a token adjacent; its valid length and
 * pairs of tiles (an odd tile count ends with an all-invalid odd tile). */
__device__ __forceinline__ void item_of(const FwdArgs &args, uint32_t it, int64_t &tok, int &h0, int &klen, int &npairs) {
  const dsa_attn_fwd_params &p = args.p;
  tok = p.num_tokens - 1 - it / args.num_hblocks;
  h0 = args.head_begin + (int)(it % args.num_hblocks) * 64;
  klen = p.topk;
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + 63) / 64;
  npairs = (ntiles + 1) / 2;
}

/* The mbarriers in the Smem map: q_full, full[2][2], empty[2][2], hand[4]. */
template <int NB>
__device__ __forceinline__ void bars_of(uint8_t *smem, uint64_t *&q_full, uint64_t (*&full)[2], uint64_t (*&empty)[2],
                                        uint64_t *&hand) {
  uint64_t *bars = (uint64_t *)(smem + Smem<NB>::kBars);
  q_full = bars;
  full = (uint64_t(*)[2])(bars + 1);
  empty = (uint64_t(*)[2])(bars + 5);
  hand = bars + 9;
}

__device__ __forceinline__ void init_bars(uint64_t *q_full, uint64_t (*full)[2], uint64_t (*empty)[2], uint64_t *hand) {
  sm90_mbar_init(q_full, 256); /* the consumers' cp.async .noinc */
  for (int w = 0; w < 2; ++w)
    for (int h = 0; h < 2; ++h) {
      sm90_mbar_init(&full[w][h], 256); /* 128 cp.async .noinc + 128 plain (mask bytes) */
      sm90_mbar_init(&empty[w][h], 128); /* the releasing WG */
    }
  for (int k = 0; k < 4; ++k) sm90_mbar_init(&hand[k], 128); /* the posting WG */
  sm90_mbar_init_fence();
}

/* One half of a gathered tile from sources computed before: blocks [B0, B1) of the thread's rows g +
 * 16 r, r < 4 (dst: its chunk of its first row in the tile; rows 16 apart at + 2048 r), src-size 16
 * where bit 4 + r of vbits is set, else 0 (zero fill). */
template <int B0, int B1>
__device__ __forceinline__ void gather_half(uint32_t dst, const uint16_t *const src[4], uint32_t vbits, uint64_t pol) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint32_t sz = (vbits >> r) & 16u;
#pragma unroll
    for (int b = B0; b < B1; ++b) sm90_cp_async16_hint(dst + b * kBlkBytes + r * 2048, src[r] + b * 64, sz, pol);
  }
}

/* The producer's part of one item (token tok, its heads from h0): its npairs pairs of tiles into the
 * ring. */
template <int NB>
__device__ __forceinline__ void producer_item(const FwdArgs &args, uint8_t *smem, uint64_t (*full)[2],
                                              uint64_t (*empty)[2], int64_t tok, int klen, int npairs, int g, int j) {
  typedef Smem<NB> L;
  const dsa_attn_fwd_params &p = args.p;
  const int32_t *irow = p.indices + tok * p.indices_stride;
  const uint32_t sb0 = sm90_smem_addr(smem + L::kKV);
  uint8_t *valid = smem + L::kValid;
  const uint64_t pol = sm90_l2_policy(args.kv_evict_last != 0);
  for (int i = 0; i < npairs; ++i) {
    const uint32_t par = ((uint32_t)i & 1) ^ 1; /* first use of a half: parity 1 returns at once */
    int32_t ia[4], ib[4];
    sm90_gather_read_indices(irow, 2 * i, g, klen, ia);
    sm90_gather_read_indices(irow, 2 * i + 1, g, klen, ib);
    /* The pair's eight row sources and their validity come before the first empty wait, so that each
     * half after its wait is a plain run of cp.async: the 64-bit address arithmetic is off the path
     * from a freed buffer to its copies (where the gather misses L2 this is -3% a shape). */
    uint32_t dst = sb0 + sm90_sw128_chunk_off(g, j);
    /* dst is opaque to ptxas: split into a uniform base plus a per-thread offset, CUDA 13.0's ptxas
     * encodes the hinted LDGSTS with an odd uniform pair as its L2 descriptor, an illegal instruction */
    asm volatile("" : "+r"(dst));
    const uint16_t *src[2][4];
    uint32_t vbits = 0; /* bit 4 + 4 t + r: row r of tile t is a valid slot */
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      bool ok;
      src[0][r] = sm90_gather_src(ia[r], j, p.kv, p.kv_stride, p.num_kv, p.q, &ok);
      vbits |= (uint32_t)ok << (4 + r);
      src[1][r] = sm90_gather_src(ib[r], j, p.kv, p.kv_stride, p.num_kv, p.q, &ok);
      vbits |= (uint32_t)ok << (8 + r);
    }
    /* keep the arithmetic above the waits (ptxas would otherwise sink it to each use) */
#pragma unroll
    for (int t2 = 0; t2 < 2; ++t2)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" : "+l"(src[t2][r]));
    asm volatile("" : "+r"(vbits));
    sm90_mbar_wait(&empty[0][0], par);
    gather_half<0, 4>(dst, src[0], vbits, pol);
    if (j == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r) valid[g + 16 * r] = (vbits >> (4 + r)) & 1;
    }
    sm90_cp_async_mbar_arrive_noinc(&full[0][0]);
    sm90_mbar_arrive(&full[0][0]);
    sm90_mbar_wait(&empty[1][1], par);
    gather_half<4, NB>(dst + L::kTile, src[1], vbits >> 4, pol);
    if (j == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r) valid[64 + g + 16 * r] = (vbits >> (8 + r)) & 1;
    }
    sm90_cp_async_mbar_arrive_noinc(&full[1][1]);
    sm90_mbar_arrive(&full[1][1]);
    sm90_mbar_wait(&empty[0][1], par);
    gather_half<4, NB>(dst, src[0], vbits, pol);
    sm90_cp_async_mbar_arrive_noinc(&full[0][1]);
    sm90_mbar_arrive(&full[0][1]);
    sm90_mbar_wait(&empty[1][0], par);
    gather_half<0, 4>(dst + L::kTile, src[1], vbits >> 4, pol);
    sm90_cp_async_mbar_arrive_noinc(&full[1][0]);
    sm90_mbar_arrive(&full[1][0]);
  }
}

/* A consumer warpgroup's part of one item (token tok, heads h0 .. h_end): Q, the pairs, the epilogue. */
template <int NB, bool MB>
__device__ __forceinline__ void consumer_item(const FwdArgs &args, uint8_t *smem, uint64_t *q_full,
                                              uint64_t (*full)[2], uint64_t (*empty)[2], uint64_t *hand, int64_t tok,
                                              int h0, int npairs, int c, int t) {
  typedef Smem<NB> L;
  const dsa_attn_fwd_params &p = args.p;
  const int h_end = args.head_end;
  const int warp = t >> 5, lane = t & 31;
  const float scale_log2 = args.scale_log2;
  float o[128], sacc[32];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) sacc[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}; /* the frame and the sums in it */
  float true_max[2] = {-INFINITY, -INFINITY}; /* the logits' running max of this WG's tiles (max_logits) */

  {
    /* Q (zero rows past h_end) by the 256 consumer threads, so that the producer starts on the first
     * KV half at once: thread (g, j) of WG c copies 16-B chunk j of every block of rows g + 16 (2 c +
     * i), i < 2, with an L2 evict_first policy (each Q row is read by one CTA, once). */
    const int g = t >> 3, j = t & 7;
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    const uint32_t sq0 = sm90_smem_addr(smem + L::kQ);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = g + 16 * (2 * c + i), h = h0 + r;
      const bool ok = h < h_end;
      const uint16_t *src = p.q + tok * p.q_stride_token + (int64_t)(ok ? h : h0) * p.q_stride_head + j * 8;
#pragma unroll
      for (int b = 0; b < NB; ++b)
        sm90_cp_async16_hint(sq0 + b * 8192 + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u, pol);
    }
    sm90_cp_async_mbar_arrive_noinc(q_full);
  }
  sm90_mbar_wait(q_full, 0);
  sm90_fence_proxy_async();
  const uint32_t b4 = sm90_smem_addr(smem) >> 4;

  if (c == 0) {
    if (npairs > 0) { /* S(0) */
      wait_half(&full[0][0], 0);
      FENCE_ARR(sacc, 32);
      sm90_wgmma_fence();
      issue_s<0, 4, true>(sacc, b4, L::kQ, L::kKV);
      wait_half(&full[0][1], 0);
      sm90_wgmma_fence();
      issue_s<4, NB, false>(sacc, b4, L::kQ, L::kKV);
      sm90_wgmma_commit();
      sm90_wgmma_wait<0>();
      FENCE_ARR(sacc, 32);
    }
    for (int i = 0; i < npairs - 1; ++i)
      wg0_pair<NB, true, MB>(i, smem, full, empty, hand, b4, scale_log2, warp, lane, o, sacc, row_max, row_sum, true_max);
    if (npairs > 0)
      wg0_pair<NB, false, MB>(npairs - 1, smem, full, empty, hand, b4, scale_log2, warp, lane, o, sacc, row_max, row_sum, true_max);
  } else {
    for (int i = 0; i < npairs; ++i)
      wg1_pair<NB, MB>(i, smem, full, empty, hand, b4, scale_log2, warp, lane, o, sacc, row_max, row_sum, true_max);
  }

  /* ---- epilogue: normalise, sink factor, bf16 out, lse, max_logits. Both WGs end
   * with the same row max (the chain's last m1); each summed only its own tiles. */
  float *red_sum = (float *)(smem + L::kSum);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float l = row_sum[hr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    row_sum[hr] = l;
  }
  float *red_max = red_sum + 2 * 64;
  if ((lane & 3) == 0) {
    red_sum[c * 64 + 16 * warp + (lane >> 2)] = row_sum[0];
    red_sum[c * 64 + 16 * warp + (lane >> 2) + 8] = row_sum[1];
    red_max[c * 64 + 16 * warp + (lane >> 2)] = true_max[0];
    red_max[c * 64 + 16 * warp + (lane >> 2) + 8] = true_max[1];
  }
  sm90_named_bar_sync_any(kBarSum, 256);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    row_sum[hr] += red_sum[(c ^ 1) * 64 + 16 * warp + (lane >> 2) + 8 * hr];
    true_max[hr] = fmaxf(true_max[hr], red_max[(c ^ 1) * 64 + 16 * warp + (lane >> 2) + 8 * hr]);
  }
  float fac[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float l = row_sum[hr];
    const int h = h0 + 16 * warp + (lane >> 2) + 8 * hr;
    const bool empty_row = row_max[hr] == -INFINITY && l == 0.f;
    const float lse = empty_row ? INFINITY : (row_max[hr] + log2f(l)) * kLn2;
    float f = 0.f;
    if (!empty_row && h < h_end) {
      f = 1.f / l;
      if (p.sink) f *= 1.f / (1.f + expf(p.sink[h] - lse));
    }
    fac[hr] = f;
    if (c == 0 && (lane & 3) == 0 && h < h_end) {
      const int64_t th = tok * p.num_heads + h;
      p.lse[th] = lse;
      if (p.max_logits) p.max_logits[th] = empty_row ? -INFINITY : true_max[hr] * kLn2;
    }
  }
  if (args.out_vec16) {
    /* out through shared memory: the warp stages its 16 rows x 256 dims as bf16 in the Q tile (free:
     * every S retired before kBarSum), [64 rows][1024 B] with 16-B chunk c of row r at c ^ (r % 8) (the
     * 4-B writes of 8 rows and the 16-B reads of one row are both conflict-free), then writes each row
     * as 32 x 16 B: whole 32-B sectors, a quarter of the store instructions. */
    uint8_t *stage = smem + L::kQ;
    const int r0 = 16 * warp + (lane >> 2);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      uint8_t *srow = stage + (r0 + 8 * hr) * 1024 + 4 * (lane & 3);
#pragma unroll
      for (int cc = 0; cc < 32; ++cc) {
        const int i = 4 * cc + 2 * hr;
        *(uint32_t *)(srow + (((32 * c + cc) ^ (lane >> 2)) << 4)) = sm90_pack_bf16x2(o[i] * fac[hr], o[i + 1] * fac[hr]);
      }
    }
    __syncwarp();
#pragma unroll 4
    for (int rr = 0; rr < 16; ++rr) {
      const int r = 16 * warp + rr, h = h0 + r;
      const uint4 v = *(const uint4 *)(stage + r * 1024 + (((32 * c + lane) ^ (r & 7)) << 4));
      if (h < h_end)
        *(uint4 *)(p.out + tok * p.out_stride_token + (int64_t)h * p.out_stride_head + c * 256 + 8 * lane) = v;
    }
  } else {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int h = h0 + 16 * warp + (lane >> 2) + 8 * hr;
      if (h >= h_end) continue;
      uint16_t *orow = p.out + tok * p.out_stride_token + (int64_t)h * p.out_stride_head + c * 256 + 2 * (lane & 3);
#pragma unroll
      for (int cc = 0; cc < 32; ++cc) {
        const int i = 4 * cc + 2 * hr;
        *(uint32_t *)(orow + 8 * cc) = sm90_pack_bf16x2(o[i] * fac[hr], o[i + 1] * fac[hr]);
      }
    }
  }
}

/* The kernel's body. */
template <int NB, bool MB>
__device__ __forceinline__ void fwd_body(const FwdArgs &args) {
  static_assert(NB == 8 || NB == 9, "D = 512 or 576");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  uint64_t *q_full, *hand;
  uint64_t(*full)[2], (*empty)[2];
  bars_of<NB>(smem, q_full, full, empty, hand);

  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  int64_t tok;
  int h0, klen, npairs;
  item_of(args, blockIdx.x, tok, h0, klen, npairs);
  if (tid == 0) init_bars(q_full, full, empty, hand);
  __syncthreads();

  if (wg == 2) {
    /* ================= producer ================= */
    sm90_setmaxnreg_dec<kProducerRegs>();
    const int g = t >> 3, j = t & 7; /* the kv rows g + 16 i of thread (g, j), chunk j of each block */

    producer_item<NB>(args, smem, full, empty, tok, klen, npairs, g, j);
    sm90_cp_async_wait_all();
  } else {
    /* ================= consumers ================= */
    sm90_setmaxnreg_inc<kConsumerRegs>();
    consumer_item<NB, MB>(args, smem, q_full, full, empty, hand, tok, h0, npairs, wg, t);
  }
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL || !__CUDA_ARCH__ */

template <int NB, bool MB>
__global__ void __launch_bounds__(kThreads, 1) attn_fwd_sm90_h64_kernel(const __grid_constant__ FwdArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_body<NB, MB>(args);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}


template <int NB, bool MB>
dsa_status launch(const dsa_context *ctx, const dsa_attn_fwd_params *p, cudaStream_t stream, int head_begin,
                   int head_end, int num_hblocks) {
  const char *fn = "dsa_sparse_attn_fwd";
  const int smem_bytes = Smem<NB>::kBytes;
  DSA_TRY(dsa_sm90_check_smem(ctx, smem_bytes, fn));
  const void *kernel = (const void *)attn_fwd_sm90_h64_kernel<NB, MB>;
  static int attr_set[DSA_TRACKED_DEVICES];
  DSA_TRY(dsa_kernel_smem_once(kernel, smem_bytes, 0, ctx->device, attr_set, fn));
  FwdArgs args;
  args.p = *p;
  args.scale_log2 = p->softmax_scale * kLog2e;
  args.num_hblocks = num_hblocks;
  args.head_begin = head_begin;
  args.head_end = head_end;
  args.kv_evict_last = dsa_fwd_kv_evict_last(ctx, p);
  args.out_vec16 = dsa_rows_16b_aligned(p->out, p->out_stride_token, p->out_stride_head);
  const unsigned items = (unsigned)(p->num_tokens * num_hblocks);
  attn_fwd_sm90_h64_kernel<NB, MB><<<items, kThreads, smem_bytes, stream>>>(args);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}

}  // namespace

extern "C" dsa_status dsa_fwd_launch_sm90_h64(const dsa_context *ctx, const dsa_attn_fwd_params *p, int head_begin,
                                              int head_count, cudaStream_t stream) {
  const char *fn = "dsa_sparse_attn_fwd";
  DSA_TRY(dsa_sm90_check_cc(ctx, fn));
  if (p->head_dim != 576 && p->head_dim != 512)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel supports head_dim 576 or 512, not %d", fn,
                    (int)p->head_dim);
  if (p->num_heads < 1 || p->num_heads > DSA_MAX_HEADS || head_count < 1 || head_begin < 0 ||
      head_begin > p->num_heads - head_count)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a kernel supports num_heads 1..128 and a head range inside them, not heads "
                    "[%d, %d) of %d", fn, head_begin, head_begin + head_count, (int)p->num_heads);
  /* cp.async moves 16 B: q / kv rows must start 16-B aligned. out is written as bf16 pairs. */
  if (((uintptr_t)p->q & 15) || ((uintptr_t)p->kv & 15) || (p->q_stride_token & 7) || (p->q_stride_head & 7) ||
      (p->kv_stride & 7))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a kernel needs 16-byte aligned q / kv rows (q_stride_token = %lld, "
                    "q_stride_head = %lld, kv_stride = %lld)",
                    fn, (long long)p->q_stride_token, (long long)p->q_stride_head, (long long)p->kv_stride);
  if (((uintptr_t)p->out & 3) || (p->out_stride_token & 1) || (p->out_stride_head & 1))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a kernel needs 4-byte aligned out rows (out_stride_token = %lld, "
                    "out_stride_head = %lld)",
                    fn, (long long)p->out_stride_token, (long long)p->out_stride_head);
  if (p->num_tokens <= 0) return DSA_SUCCESS;
  const int num_hblocks = (head_count + 63) / 64;
  DSA_TRY(dsa_sm90_check_grid(p->num_tokens, num_hblocks, fn));
  const int head_end = head_begin + head_count;
  /* DSA_OPTION_FWD_SM90_HANDOFF: named barriers (the default) or the mbarrier twin (racecheck) */
  const bool mb = ctx->options[DSA_OPTION_FWD_SM90_HANDOFF] == DSA_FWD_HANDOFF_MBARRIER;
  if (p->head_dim == 576)
    return mb ? launch<9, true>(ctx, p, stream, head_begin, head_end, num_hblocks)
              : launch<9, false>(ctx, p, stream, head_begin, head_end, num_hblocks);
  return mb ? launch<8, true>(ctx, p, stream, head_begin, head_end, num_hblocks)
            : launch<8, false>(ctx, p, stream, head_begin, head_end, num_hblocks);
}
