/*
 * attn_fwd_sm90.cu - sparse MLA attention forward on sm_90a tensor cores (wgmma), the fast variant of
 * dsa_sparse_attn_fwd. The portable kernel (attn_fwd_simple) covers every configuration this one
 * declines with DSA_ERROR_UNSUPPORTED.
 *
 * One CTA = one query token x one block of 64 heads (H = 128: two CTAs per token, adjacent in the
 * 1-D grid so they share the gathered KV rows in L2). A launch covers heads [head_begin, head_end) of
 * the H heads (the whole H, or [0, 64) when the dispatch gives heads 64..H-1, 64 < H < 128, to the
 * small-H kernel); heads are addressed by their global index (q / out strides, lse t * H + h, sink h).
 * 384 threads, three warpgroups:
 *   WG2 (producer, setmaxnreg down): cp.async 16 B with a manual 128B swizzle (hopper-notes 5). Loads
 *        the Q tile [64 heads x D] once, then gathers 64 KV rows per tile into a double buffer.
 *        Invalid slots (beyond topk_length, index < 0 or >= num_kv) are zero-filled (src-size 0) and
 *        flagged in a per-stage byte mask.
 *   WG0, WG1 (consumers, setmaxnreg up): each computes the full S = Q K^T (64 x 64, SS wgmma, D/16
 *        k-steps) redundantly, masks it, runs the online softmax in the log2 domain, and accumulates
 *        its half of the 512 value dims: O[64 x 256] += P V (RS wgmma m64n256k16, P straight from the
 *        S registers, V = the KV tile read MN-major). WG0 owns dims 0..255, WG1 dims 256..511.
 * Head dims: D = 576 (nine 64-column SW128 blocks, 222384 B of shared memory) and D = 512 (eight,
 * 197808 B), one template instantiation each. Declined with DSA_ERROR_UNSUPPORTED: a device other
 * than cc 9.0, any other D, q / kv rows not 16-B aligned, out rows not 4-B aligned, T * ceil(H / 64)
 * above 2^31 - 1 CTAs, shared memory above the device's opt-in limit.
 * ptxas (nvcc 13): 168 registers at entry (the __launch_bounds__(384, 1) cap), consumers raised to
 * 232 and the producer lowered to 40 by setmaxnreg; no spills. Per 64-key tile each consumer WG
 * issues 36 (D = 576) HGMMA.64x64x16 and 4 HGMMA.64x256x16.
 * Split-S mode (the default since 2026-11-29: verified on an H200, 18/18 GPU tests, 448 vs 374 TFLOP/s on
 * fwd-v32-8k; -DDSA_SM90_FWD_SPLIT_S=0 builds the redundant-S mode): WG c
 * computes S for keys [32 c, 32 c + 32) only (18 HGMMA.64x32x16 per tile at D = 576), the WGs
 * exchange row maxima (named barrier 1), stmatrix their P halves into one shared 64 x 64 tile
 * (named barrier 2) and run PV as 4 SS HGMMA.64x256x16 on it. 231600 B of shared memory at D = 576.
 * v1 trade-offs, the next steps in order:
 *   - default mode: S is computed twice (once per consumer WG), ~50% more tensor work than needed;
 *     split-S mode removes that at the price of two 256-thread barriers per tile (the WGs run in
 *     lockstep, so one WG's softmax no longer hides behind the other's wgmma).
 *   - no overlap inside a WG in the default schedule; schedules 1 and 2 below overlap some of it
 *     (not yet measured on a GPU, so not the default).
 *   - a head range that is not a multiple of 64 runs with the unused Q rows zero-filled (wasted MMA
 *     rows); the automatic dispatch never asks for one (small H and the remainder of H > 64 go to
 *     attn_fwd_sm90_small.cu, keys on M); variant 2 still does (tests).
 *   - out is written from registers (4-byte stores); an stmatrix + TMA store epilogue is faster.
 *
 * Pipeline barriers (mbarriers in shared memory), parities as in hopper-notes 4:
 *   q_full   : 128 .noinc cp.async arrivals (producer threads) -> Q tile landed.
 *   full[s]  : 128 .noinc cp.async arrivals + 128 plain arrivals (the plain ones release the byte
 *              mask written with st.shared) -> KV stage s landed.
 *   empty[s] : 256 plain arrivals (every consumer thread, after its PV wgmma completed and its mask
 *              reads are done) -> stage s may be overwritten.
 * cp.async writes are generic-proxy; consumers run fence.proxy.async after each full wait, before
 * wgmma reads the tile (the ordering tested on an H200, hopper-notes 3 and test C).
 * Named barriers (256 threads, the two consumer WGs; each passes each one once per tile, plus kBarMax
 * once more in the epilogue for the row sums): kBarMax (1) after writing the tile's row maxima to
 * red_max[c], kBarP (2) after writing the P half (stmatrix + fence.proxy.async).
 *
 * Consumer schedules (template OVERLAP, run-time dsa_attn_fwd_sm90_overlap in src/attn_fwd.c, read
 * by the launcher; split-S mode only, the redundant-S build always runs 0). S(n) = Q K(n)^T,
 * sm(n) = mask + softmax + kBarMax, P(n) = stmatrix + kBarP, PV(n) = O += P(n) V(n); wait<k> =
 * wgmma.wait_group k (groups retire in commit order):
 *   0 (serial, the default): per tile  full(n), S(n), wait<0>, sm(n), rescale O, P(n), PV(n), wait<0>,
 *     arrive empty(n). Tensor cores idle during sm / P / rescale and the wgmma drains.
 *   1 (overlapped, FA3-style): prologue full(0), S(0), wait<0>. Tile n (S(n) complete, PV(n - 1) in
 *     flight): sm(n), P(n) into P buffer n & 1, wait<0> (PV(n - 1)), arrive empty(n - 1), rescale O,
 *     full(n + 1), S(n + 1), commit, PV(n), commit, wait<1> (S(n + 1) complete, PV(n) may run on).
 *     After the last tile: wait<0>, arrive empty(last). PV(n - 1) runs under the whole of sm(n) / P(n)
 *     (the wait sits after kBarP: ptxas hoists a wgmma wait up to the previous barrier, seen in the
 *     SASS), and ptxas interleaves the O rescale with the S(n + 1) issue. P is double-buffered because
 *     the peer WG may still run PV(n - 1) on the old buffer while this WG writes P(n): buffer n & 1 is
 *     the RoPE block (dims 512..575, block 8) of KV stage n & 1 at D = 576 (only S(n) reads it, and
 *     both WGs' S(n) completed before either passed kBarMax(n); the producer refills the stage only
 *     after empty(n), i.e. after PV(n)), and P tile n & 1 of two at D = 512 (no RoPE block; 215216 B).
 *     Buffer n & 1's previous reader, PV(n - 2) of either WG, completed before that WG arrived at
 *     kBarMax(n). The cost: a stage is now held from S(n) (issued during tile n - 1) until PV(n)
 *     completes (during tile n + 1), so with two stages the producer can only start tile n + 1 after
 *     PV(n - 1) completes, just before S(n + 1) needs it: the KV gather latency is exposed once per
 *     tile instead of hidden behind a whole tile of compute. Wins only where the gather is short
 *     (L2-resident KV, e.g. fwd-v32-8k's 9.4 MB); a third stage does not fit (72 KB each).
 *   2 (S hoisted): tile n (S(n) complete, nothing in flight): sm(n), rescale O, P(n), PV(n), commit,
 *     full(n + 1), S(n + 1), commit, wait<1> (PV(n) complete), arrive empty(n), wait<0> (S(n + 1)).
 *     The tensor cores run PV(n) and S(n + 1) back to back (no drain / issue bubble between them) and
 *     stages are held as in 0; softmax is not overlapped. One P tile, as in 0. Risk: when the producer
 *     lags, empty(n) waits for full(n + 1), so tile n + 2's gather no longer overlaps tile n + 1's.
 * Modes 1 / 2 peel the last tile (template NEXT) so every wgmma wait is unconditional: with a wait
 * under a run-time branch ptxas cannot prove the accumulators retired on every path and injects
 * waits / serializes the wgmmas (C7517 / C7514). Checked with nvcc 13.0: no such warnings, no spills,
 * consumers use 180 (mode 0, 1) / 177 (mode 2) of their 232 registers; mode 0's SASS is the previous
 * kernel's instruction for instruction (only the registers of O's zero-initialisation renamed).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "sm90_common.cuh"

namespace {

/* ---- tile and launch configuration ----------------------------------------------------------- */
constexpr int kBlockM = 64;         /* heads per CTA: the M of one wgmma (m64) */
constexpr int kBlockN = 64;         /* keys per KV tile: S is m64n64, P is four k16 slices */
constexpr int kStages = 2;          /* KV double buffer: Q 72 KB + 2 x 72 KB = 216 KB of the 227 KB */
constexpr int kThreads = 384;       /* 2 consumer WGs (one per half of dv) + 1 producer WG */
constexpr int kConsumerRegs = 232;  /* O 128 + S 32 + P 16 + addressing; 2 x 232 + 40 = 504 <= 512 */
constexpr int kProducerRegs = 40;   /* address math for 36 cp.async per tile */
constexpr int kDV = DSA_VALUE_DIM;  /* 512 value dims */
constexpr int kDVPerWG = kDV / 2;   /* 256: one m64n256k16 per k16 slice per consumer WG */
constexpr int kBlkBytes = 64 * 128; /* one 64 x 64 bf16 SW128 block: 8 atoms of 1024 B */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kBlockM == 64 && kBlockN == 64, "the fragment maps below assume m64 and 64-key tiles");
static_assert(kDVPerWG == 256, "PV uses one m64n256 wgmma per k16 slice");
static_assert(2 * kConsumerRegs + kProducerRegs <= 504,
              "setmaxnreg: the per-WG counts fit the launch's pool, 384 threads x 168 registers = 128 x 504");
static_assert(kConsumerRegs % 8 == 0 && kProducerRegs % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(kLog2e * kLn2 > 0.9999f && kLog2e * kLn2 < 1.0001f, "log2(e) and ln(2) are reciprocal");

/* Split-S mode (default; DSA_SM90_FWD_SPLIT_S=0 at build time selects the redundant-S mode): WG c
 * computes S only for keys [32 c, 32 c + 32) (m64n32), the two WGs exchange row maxima through shared
 * memory, write their P halves with stmatrix into one 64 x 64 bf16 SW128 tile, and both run
 * O += P V as SS wgmmas on that tile. Removes the redundant half of the Q K^T work at the price of two
 * 256-thread named barriers per tile. */
#ifndef DSA_SM90_FWD_SPLIT_S
#define DSA_SM90_FWD_SPLIT_S 1
#endif
constexpr bool kSplitS = DSA_SM90_FWD_SPLIT_S != 0;
constexpr int kBarMax = 1, kBarP = 2; /* named barrier ids (split mode); 0 is __syncthreads */
static_assert(kBarMax > 0 && kBarP > 0 && kBarMax != kBarP && kBarP < 16, "named barrier ids 1..15");

/* Shared-memory layout for NB 64-column blocks per row (D = 64 * NB). Every tile is 1024-B aligned
 * (SW128 atoms, descriptor base offset 0). */
template <int NB, bool SPLIT, int OVERLAP>
struct Smem {
  static constexpr int kTileBytes = NB * kBlkBytes;               /* [64 rows x D] bf16 */
  static constexpr int kQ = 0;                                    /* Q tile */
  static constexpr int kKV = kQ + kTileBytes;                     /* stage s at kKV + s * kTileBytes */
  /* split: P tiles [64 x 64] bf16: one; OVERLAP 1 at D = 512 two (P tile s for the tiles of stage s;
   * at D = 576 OVERLAP 1 puts P in the stage's RoPE block and leaves this one unused) */
  static constexpr int kPTiles = SPLIT ? (OVERLAP == 1 && NB == 8 ? 2 : 1) : 0;
  static constexpr int kP = kKV + kStages * kTileBytes;
  static constexpr int kValid = kP + kPTiles * kBlkBytes;         /* [kStages][64] bytes, 1 = valid */
  static constexpr int kBars = kValid + kStages * kBlockN;        /* q_full, full[2], empty[2] */
  static constexpr int kRed = kBars + 48;                         /* split: max[2][64], sum[2][64] f32 */
  static constexpr int kEnd = kRed + (SPLIT ? 4 * 2 * kBlockM * 2 : 0);
  static constexpr int kBytes = kEnd + 1024;                      /* + slack to align the base */
};

/* Kernel arguments: the resolved public params plus what the host precomputes. */
struct FwdArgs {
  dsa_attn_fwd_params p;
  float scale_log2;  /* softmax_scale * log2(e): the softmax runs on exp2 */
  int num_hblocks;   /* ceil((head_end - head_begin) / 64) */
  int head_begin;    /* the launch runs heads [head_begin, head_end) of the H = p.num_heads heads */
  int head_end;      /* (q / sink / out / lse / max_logits indexed by the global head as always) */
};

/* ---- consumer pieces, shared by the three loop schedules (OVERLAP 0 / 1 / 2, see the header) ---- */

/* Issues (does not commit) S = Q K^T for this WG's SN keys: both K-major SW128, LBO 16 (unused),
 * SBO 1024, +32 B per k16, +8 KB per block. Split mode: B starts at key row key0 (key0 * 128 B, a
 * multiple of 1024). The caller fences sacc and runs wgmma.fence first. */
template <int NB, bool SPLIT>
__device__ __forceinline__ void fwd_issue_s(float *sacc, uint32_t sq, uint32_t skv, int key0) {
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t off = b * kBlkBytes + k * 32;
      const uint64_t da = sm90_make_desc_sw128(sq + off, 16, 1024);
      const uint64_t db = sm90_make_desc_sw128(skv + key0 * 128 + off, 16, 1024);
      if constexpr (SPLIT)
        sm90_wgmma_ss_m64n32k16(sacc, da, db, (b | k) != 0);
      else
        sm90_wgmma_ss_m64n64k16<0, 0>(sacc, da, db, (b | k) != 0);
    }
}

/* Mask + online softmax (log2 domain) of one tile from the completed S accumulator: updates the
 * running row_max / row_sum, returns the O rescale factors alpha and P (bf16) packed as the RS A
 * operand (k16 slice kk, register q = accumulator pair (8 kk + 2 q, +1)). Does not touch O. Split
 * mode: exchanges the tile's row maxima with the peer WG through red_max and named barrier kBarMax
 * (both WGs call this once per tile). vs: the tile's validity bytes of this WG's first key. */
template <bool SPLIT, int SN>
__device__ __forceinline__ void fwd_softmax(const float *sacc, const uint8_t *vs, float scale_log2,
                                            float row_max[2], float row_sum[2], float *red_max, int c,
                                            int warp, int lane, float alpha[2], uint32_t (*pa)[4]) {
  constexpr int SR = SN / 2;
  float x[SR];
  sm90_mask_logits<SN>(sacc, vs, scale_log2, lane, x);
  float m_use[2], tile_max[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float mx = row_max[hr];
#pragma unroll
    for (int cc = 0; cc < SN / 8; ++cc) mx = fmaxf(mx, fmaxf(x[4 * cc + 2 * hr], x[4 * cc + 2 * hr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    tile_max[hr] = mx;
  }
  if constexpr (SPLIT) {
    /* Both WGs must rescale with the same maximum: exchange this tile's row maxima. The peer
     * reads red_max[c] before it reaches the kBarP barrier, which this WG passes before it
     * writes red_max[c] again for the next tile. */
    if ((lane & 3) == 0) {
      red_max[c * kBlockM + 16 * warp + (lane >> 2)] = tile_max[0];
      red_max[c * kBlockM + 16 * warp + (lane >> 2) + 8] = tile_max[1];
    }
    sm90_named_bar_sync(kBarMax, 256);
    tile_max[0] = fmaxf(tile_max[0], red_max[(c ^ 1) * kBlockM + 16 * warp + (lane >> 2)]);
    tile_max[1] = fmaxf(tile_max[1], red_max[(c ^ 1) * kBlockM + 16 * warp + (lane >> 2) + 8]);
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float mx = tile_max[hr];
    m_use[hr] = mx == -INFINITY ? 0.f : mx; /* no valid slot yet: avoid (-inf) - (-inf) */
    alpha[hr] = exp2f(row_max[hr] - m_use[hr]);
    row_max[hr] = mx;
  }
  float psum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < SR; ++i) {
    x[i] = exp2f(x[i] - m_use[(i >> 1) & 1]);
    psum[(i >> 1) & 1] += x[i];
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) row_sum[hr] = row_sum[hr] * alpha[hr] + psum[hr];
#pragma unroll
  for (int kk = 0; kk < SN / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) pa[kk][q] = sm90_pack_bf16x2(x[8 * kk + 2 * q], x[8 * kk + 2 * q + 1]);
}

/* O (NO accumulator registers) *= alpha per row. O must not be in flight (its PV group waited for). */
template <int NO>
__device__ __forceinline__ void fwd_rescale_o(float *o, const float alpha[2]) {
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] *= alpha[(i >> 1) & 1];
}

/* Split mode: this WG's P half -> the shared P tile at pbuf (K-major SW128, rows = heads, columns =
 * the tile's 64 keys): stmatrix x4 per k16 slice, lane l addresses row 16 warp + l % 8 + 8 ((l / 8) % 2)
 * at 16-B chunk 2 slice + l / 16 (hopper-notes 2, probe test F); then the proxy fence and named
 * barrier kBarP, after which both halves are visible to both WGs' wgmmas. The caller guarantees no
 * wgmma of either WG still reads pbuf. */
template <int SN>
__device__ __forceinline__ void fwd_store_p(uint32_t pbuf, uint32_t (*pa)[4], int key0, int warp, int lane) {
  const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < SN / 16; ++kk) {
    const int chunk = 2 * (key0 / 16 + kk) + (lane >> 4);
    sm90_stmatrix_x4(pbuf + r * 128 + (((chunk ^ r) & 7) << 4), pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
  }
  sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> wgmma (async proxy) */
  sm90_named_bar_sync(kBarP, 256);
}

/* Issues (does not commit) O += P V: V = the KV tile's dims [256 c, 256 c + 256) read MN-major
 * (tB = 1): LBO 8192 between 64-dim blocks, SBO 1024 between 8-key groups, +2048 B per k16 of keys.
 * P: registers (RS) or, in split mode, the shared P tile at pbuf (SS, K-major, +32 B per k16).
 * Fences O and P (written by ordinary code) and runs wgmma.fence first. */
template <bool SPLIT, int SN>
__device__ __forceinline__ void fwd_issue_pv(float *o, uint32_t (*pa)[4], uint32_t pbuf, uint32_t skv, int c) {
#pragma unroll
  for (int i = 0; i < kDVPerWG / 2; ++i) sm90_fence_operand(o[i]);
#pragma unroll
  for (int kk = 0; kk < SN / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) sm90_fence_operand_u32(pa[kk][q]);
  sm90_wgmma_fence();
  const uint32_t sv = skv + 4 * c * kBlkBytes;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t db = sm90_make_desc_sw128(sv + kk * 2048, kBlkBytes, 1024);
    if constexpr (SPLIT)
      sm90_wgmma_ss_m64n256k16<1>(o, sm90_make_desc_sw128(pbuf + kk * 32, 16, 1024), db, 1);
    else
      sm90_wgmma_rs_m64n256k16_tb1(o, pa[kk], db, 1);
  }
}

/* One tile n of the overlapped schedules (OVERLAP 1 / 2, split mode; header "Consumer schedules").
 * On entry S(n) is complete in sacc; OVERLAP 1: PV(n - 1) may still be in flight (O, its P buffer and
 * stage (n - 1) & 1 in use), OVERLAP 2: nothing is. NEXT: tile n + 1 exists (S(n + 1) is issued here
 * and complete on return). */
template <int NB, bool SPLIT, int OVERLAP, bool NEXT>
__device__ __forceinline__ void fwd_overlap_tile(int n, uint8_t *smem, const uint8_t *valid, uint64_t *full,
                                                 uint64_t *empty, float *red_max, uint32_t sq, uint32_t sp,
                                                 int key0, int c, int warp, int lane, float scale_log2, float *o,
                                                 float *sacc, float row_max[2], float row_sum[2]) {
  typedef Smem<NB, SPLIT, OVERLAP> L;
  constexpr int SN = kBlockN / 2, SR = SN / 2;
  static_assert(SPLIT && (OVERLAP == 1 || OVERLAP == 2), "overlapped schedules: split mode");
  const int s = n & 1;
  const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTileBytes);
  const uint32_t skv_next = sm90_smem_addr(smem + L::kKV + (s ^ 1) * L::kTileBytes);
  float alpha[2];
  uint32_t pa[SN / 16][4];
  fwd_softmax<SPLIT, SN>(sacc, valid + s * kBlockN + key0, scale_log2, row_max, row_sum, red_max, c, warp, lane,
                         alpha, pa);
  if constexpr (OVERLAP == 1) {
    /* P(n) goes to its own buffer, so PV(n - 1) may still read the other one: D = 576: the RoPE
     * block (dims 512..575) of stage s, which only S(n) reads, and both WGs' S(n) completed before
     * either passed kBarMax(n); D = 512: P tile s of two. The previous reader of that buffer, PV(n - 2)
     * of either WG, completed before that WG arrived at kBarMax(n) (its wait<0> below, tile n - 1). */
    const uint32_t pbuf = NB > 8 ? skv + 8 * kBlkBytes : sp + s * kBlkBytes;
    fwd_store_p<SN>(pbuf, pa, key0, warp, lane);
    /* PV(n - 1) (none at n = 0) must be complete before O is rescaled and stage s ^ 1 released. Placed
     * after kBarP: ptxas hoists a wgmma wait up to the previous barrier, so the whole softmax above
     * (exp2, pack, stmatrix) overlaps PV(n - 1). */
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kDVPerWG / 2; ++i) sm90_fence_operand(o[i]);
    if (n > 0) sm90_mbar_arrive(&empty[s ^ 1]);
    fwd_rescale_o<kDVPerWG / 2>(o, alpha);
    if constexpr (NEXT) { /* S(n + 1) first: the wait<1> below then leaves only PV(n) pending */
      sm90_mbar_wait(&full[s ^ 1], (uint32_t)((n + 1) >> 1) & 1);
      sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
#pragma unroll
      for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
      sm90_wgmma_fence();
      fwd_issue_s<NB, SPLIT>(sacc, sq, skv_next, key0);
      sm90_wgmma_commit();
    }
    fwd_issue_pv<SPLIT, SN>(o, pa, pbuf, skv, c);
    sm90_wgmma_commit();
    if constexpr (NEXT) {
      sm90_wgmma_wait<1>(); /* S(n + 1) complete; PV(n) may still run (O untouched until wait<0>) */
#pragma unroll
      for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
    }
  } else {
    /* OVERLAP 2: the serial order, but S(n + 1) is issued right behind PV(n) (no drain / fill bubble
     * between them); stage s is released as soon as PV(n) completes (wait<1>). */
    fwd_rescale_o<kDVPerWG / 2>(o, alpha);
    fwd_store_p<SN>(sp, pa, key0, warp, lane); /* the P tile is free: as in OVERLAP 0 */
    fwd_issue_pv<SPLIT, SN>(o, pa, sp, skv, c);
    sm90_wgmma_commit();
    if constexpr (NEXT) {
      sm90_mbar_wait(&full[s ^ 1], (uint32_t)((n + 1) >> 1) & 1);
      sm90_fence_proxy_async();
#pragma unroll
      for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
      sm90_wgmma_fence();
      fwd_issue_s<NB, SPLIT>(sacc, sq, skv_next, key0);
      sm90_wgmma_commit();
      sm90_wgmma_wait<1>(); /* PV(n) complete (groups retire in order); S(n + 1) may still run */
    } else {
      sm90_wgmma_wait<0>();
    }
#pragma unroll
    for (int i = 0; i < kDVPerWG / 2; ++i) sm90_fence_operand(o[i]);
    sm90_mbar_arrive(&empty[s]); /* this thread is done with stage s (tile and mask) */
    if constexpr (NEXT) {
      sm90_wgmma_wait<0>(); /* S(n + 1) */
#pragma unroll
      for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
    }
  }
}

template <int NB, bool SPLIT, int OVERLAP>
__global__ void __launch_bounds__(kThreads, 1) attn_fwd_sm90_kernel(const __grid_constant__ FwdArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(OVERLAP >= 0 && OVERLAP <= 2 && (OVERLAP == 0 || SPLIT), "overlap: split mode only");
  static_assert(NB == 8 || NB == 9, "OVERLAP 1 puts P in block 8 (the RoPE dims) when NB = 9");
  typedef Smem<NB, SPLIT, OVERLAP> L;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  uint8_t *valid = smem + L::kValid;
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + kStages;

  const dsa_attn_fwd_params &p = args.p;
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  const int64_t tok = blockIdx.x / args.num_hblocks;
  const int h0 = args.head_begin + (int)(blockIdx.x % args.num_hblocks) * kBlockM;
  const int h_end = args.head_end; /* heads h0 + r >= h_end: zero Q rows, never written */
  int klen = p.topk; /* slots [0, klen) may be valid; the rest never are */
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + kBlockN - 1) / kBlockN;

  if (tid == 0) {
    sm90_mbar_init(q_full, 128);
    for (int s = 0; s < kStages; ++s) {
      sm90_mbar_init(&full[s], 256);
      sm90_mbar_init(&empty[s], 256);
    }
    sm90_mbar_init_fence();
  }
  __syncthreads();

  if (wg == 2) {
    /* ================= producer ================= */
    sm90_setmaxnreg_dec<kProducerRegs>();
    const int g = t >> 3, j = t & 7; /* the q rows and kv rows of thread (g, j): sm90_load_q_heads64 */
    sm90_load_q_heads64<NB>(sm90_smem_addr(smem + L::kQ), p.q, tok, p.q_stride_token, p.q_stride_head, h0, h_end, g, j);
    sm90_cp_async_mbar_arrive_noinc(q_full);

    const int32_t *irow = p.indices + tok * p.indices_stride;
    const uint64_t pol = sm90_l2_policy(false); /* schedules 0-2: no L2 hint (dsa_fwd_kv_evict_last) */
    for (int n = 0; n < ntiles; ++n) {
      const int s = n & 1;
      const uint32_t use = (uint32_t)(n >> 1);
      /* read the indices before waiting, so their latency overlaps the consumers' work */
      int32_t idxs[4];
      sm90_gather_read_indices(irow, n, g, klen, idxs);
      sm90_mbar_wait(&empty[s], (use & 1) ^ 1); /* first use of a stage: parity 1 returns at once */
      const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTileBytes);
      sm90_gather_kv_rows<NB>(skv, valid + s * kBlockN, idxs, g, j, p.kv, p.kv_stride, p.num_kv, p.q, pol);
      sm90_cp_async_mbar_arrive_noinc(&full[s]); /* fires when this thread's copies have landed */
      sm90_mbar_arrive(&full[s]);                /* releases the mask bytes written above */
    }
    sm90_cp_async_wait_all();
  } else {
    /* ================= consumers ================= */
    sm90_setmaxnreg_inc<kConsumerRegs>();
    const int c = wg; /* value dims [256 c, 256 c + 256) */
    const int warp = t >> 5, lane = t & 31;
    const float scale_log2 = args.scale_log2;

    constexpr int SN = SPLIT ? kBlockN / 2 : kBlockN; /* S columns (keys) this WG computes */
    constexpr int SR = SN / 2;                         /* S accumulator registers per thread */
    const int key0 = SPLIT ? c * SN : 0;               /* first key of this WG's S columns */
    float *red_max = (float *)(smem + L::kRed);        /* split: [2 WGs][64 rows] tile row maxima */
    float *red_sum = red_max + 2 * kBlockM;            /* split: [2 WGs][64 rows] final row sums */
    const uint32_t sp = sm90_smem_addr(smem + L::kP);  /* split: P tile */

    float o[kDVPerWG / 2]; /* 64 x 256 fp32 accumulator, hopper-notes 2 map */
    float sacc[SR];        /* 64 x SN S accumulator */
#pragma unroll
    for (int i = 0; i < kDVPerWG / 2; ++i) o[i] = 0.f;
#pragma unroll
    for (int i = 0; i < SR; ++i) sacc[i] = 0.f;
    /* Running max (log2 units) and per-thread partial row sums for rows r0 = 16 warp + lane/4 and
     * r0 + 8 (accumulator register i belongs to row r0 + 8 * ((i >> 1) & 1)). */
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

    sm90_mbar_wait(q_full, 0);
    sm90_fence_proxy_async();
    const uint32_t sq = sm90_smem_addr(smem + L::kQ);

    if constexpr (OVERLAP == 0) {
      /* ---- serial schedule: per tile wait full, S, wait, softmax, [P exchange], PV, wait, release */
      for (int n = 0; n < ntiles; ++n) {
        const int s = n & 1;
        sm90_mbar_wait(&full[s], (uint32_t)(n >> 1) & 1);
        sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
        const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTileBytes);
#pragma unroll
        for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
        sm90_wgmma_fence();
        fwd_issue_s<NB, SPLIT>(sacc, sq, skv, key0);
        sm90_wgmma_commit();
        sm90_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
        float alpha[2];
        uint32_t pa[SN / 16][4];
        fwd_softmax<SPLIT, SN>(sacc, valid + s * kBlockN + key0, scale_log2, row_max, row_sum, red_max, c, warp,
                               lane, alpha, pa);
        fwd_rescale_o<kDVPerWG / 2>(o, alpha);
        /* split: safe to overwrite the P tile: both WGs finished the previous tile's PV before either
         * passed this tile's kBarMax barrier */
        if constexpr (SPLIT) fwd_store_p<SN>(sp, pa, key0, warp, lane);
        fwd_issue_pv<SPLIT, SN>(o, pa, sp, skv, c);
        sm90_wgmma_commit();
        sm90_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < kDVPerWG / 2; ++i) sm90_fence_operand(o[i]);
        sm90_mbar_arrive(&empty[s]); /* this thread is done with stage s (tile and mask) */
      }
    } else {
      /* ---- overlapped schedules (split mode only; header "Consumer schedules"). Prologue: S(0). */
      if (ntiles > 0) {
        sm90_mbar_wait(&full[0], 0);
        sm90_fence_proxy_async();
#pragma unroll
        for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
        sm90_wgmma_fence();
        fwd_issue_s<NB, SPLIT>(sacc, sq, sm90_smem_addr(smem + L::kKV), key0);
        sm90_wgmma_commit();
        sm90_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < SR; ++i) sm90_fence_operand(sacc[i]);
      }
      /* tiles 0 .. ntiles - 2 issue S(n + 1), the last one does not: peeled, so that every wgmma wait
       * is unconditional (ptxas tracks the in-flight accumulators per path; a wait under a run-time
       * branch makes it inject waits and serialize the wgmmas, warnings C7517 / C7514) */
      for (int n = 0; n < ntiles - 1; ++n)
        fwd_overlap_tile<NB, SPLIT, OVERLAP, true>(n, smem, valid, full, empty, red_max, sq, sp, key0, c, warp, lane,
                                                   scale_log2, o, sacc, row_max, row_sum);
      if (ntiles > 0)
        fwd_overlap_tile<NB, SPLIT, OVERLAP, false>(ntiles - 1, smem, valid, full, empty, red_max, sq, sp, key0, c,
                                                    warp, lane, scale_log2, o, sacc, row_max, row_sum);
      if constexpr (OVERLAP == 1) { /* the last PV (none if ntiles = 0; unconditional wait: see above) */
        sm90_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < kDVPerWG / 2; ++i) sm90_fence_operand(o[i]);
        if (ntiles > 0) sm90_mbar_arrive(&empty[(ntiles - 1) & 1]);
      }
    }

    /* ---- epilogue: normalise, sink factor, bf16 out, lse, max_logits */
    float fac[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float l = row_sum[hr];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      row_sum[hr] = l;
    }
    if constexpr (SPLIT) { /* each WG summed only its own keys: add the peer's sums */
      if ((lane & 3) == 0) {
        red_sum[c * kBlockM + 16 * warp + (lane >> 2)] = row_sum[0];
        red_sum[c * kBlockM + 16 * warp + (lane >> 2) + 8] = row_sum[1];
      }
      sm90_named_bar_sync(kBarMax, 256);
      row_sum[0] += red_sum[(c ^ 1) * kBlockM + 16 * warp + (lane >> 2)];
      row_sum[1] += red_sum[(c ^ 1) * kBlockM + 16 * warp + (lane >> 2) + 8];
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float l = row_sum[hr];
      const int h = h0 + 16 * warp + (lane >> 2) + 8 * hr;
      const bool empty_row = row_max[hr] == -INFINITY && l == 0.f; /* no valid slot (all-NaN logits: l = NaN, lse NaN) */
      const float lse = empty_row ? INFINITY : (row_max[hr] + log2f(l)) * kLn2;
      float f = 0.f;
      if (!empty_row && h < h_end) {
        f = 1.f / l;
        if (p.sink) f *= 1.f / (1.f + expf(p.sink[h] - lse)); /* -inf sink: 1, +inf: 0 */
      }
      fac[hr] = f;
      if (c == 0 && (lane & 3) == 0 && h < h_end) {
        const int64_t th = tok * p.num_heads + h;
        p.lse[th] = lse;
        if (p.max_logits) p.max_logits[th] = empty_row ? -INFINITY : row_max[hr] * kLn2;
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int h = h0 + 16 * warp + (lane >> 2) + 8 * hr;
      if (h >= h_end) continue;
      uint16_t *orow = p.out + tok * p.out_stride_token + (int64_t)h * p.out_stride_head + c * kDVPerWG +
                       2 * (lane & 3);
#pragma unroll
      for (int cc = 0; cc < kDVPerWG / 8; ++cc) {
        const int i = 4 * cc + 2 * hr;
        *(uint32_t *)(orow + 8 * cc) = sm90_pack_bf16x2(o[i] * fac[hr], o[i + 1] * fac[hr]);
      }
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run silently (the launcher also checks cc 9.0) */
#endif
}

/* One instantiation per supported head dim (D = 64 * NB). */
template <int NB, bool SPLIT, int OVERLAP>
dsa_status launch(const dsa_context *ctx, const dsa_attn_fwd_params *p, cudaStream_t stream, int head_begin,
                  int head_end, int num_hblocks) {
  const char *fn = "dsa_sparse_attn_fwd";
  const int smem_bytes = Smem<NB, SPLIT, OVERLAP>::kBytes;
  if (smem_bytes > ctx->max_smem_optin)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel needs %d bytes of shared memory, device has %d",
                    fn, smem_bytes, ctx->max_smem_optin);
  static int attr_set[DSA_TRACKED_DEVICES]; /* per instantiation: the smem limit set per device */
  DSA_TRY(dsa_kernel_smem_once((const void *)attn_fwd_sm90_kernel<NB, SPLIT, OVERLAP>, smem_bytes, 0, ctx->device,
                               attr_set, fn));
  FwdArgs args;
  args.p = *p;
  args.scale_log2 = p->softmax_scale * kLog2e;
  args.num_hblocks = num_hblocks;
  args.head_begin = head_begin;
  args.head_end = head_end;
  const unsigned grid = (unsigned)(p->num_tokens * num_hblocks);
  attn_fwd_sm90_kernel<NB, SPLIT, OVERLAP><<<grid, kThreads, smem_bytes, stream>>>(args);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}

}  // namespace

extern "C" dsa_status dsa_launch_attn_fwd_sm90_heads(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                                     int head_begin, int head_count, cudaStream_t stream) {
  const char *fn = "dsa_sparse_attn_fwd";
  if (!(ctx->cc_major == 9 && ctx->cc_minor == 0))
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel needs compute capability 9.0, device has %d.%d", fn,
                    ctx->cc_major, ctx->cc_minor);
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
  const int num_hblocks = (head_count + kBlockM - 1) / kBlockM;
  if (p->num_tokens > (int64_t)0x7fffffff / num_hblocks)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel handles at most %d tokens, not %lld", fn,
                    0x7fffffff / num_hblocks, (long long)p->num_tokens);
  const int head_end = head_begin + head_count;
  /* schedule 3: its own kernel (cuda/attn_fwd_sm90_v2.cu), either S mode */
  if (dsa_attn_fwd_sm90_overlap == 3 || dsa_attn_fwd_sm90_overlap == 4)
    return dsa_launch_attn_fwd_sm90_v2(ctx, p, head_begin, head_end, num_hblocks, stream);
  /* dsa_attn_fwd_sm90_overlap (src/attn_fwd.c): the consumer loop's schedule, split mode only */
  const int ov = kSplitS && (dsa_attn_fwd_sm90_overlap == 1 || dsa_attn_fwd_sm90_overlap == 2)
                     ? dsa_attn_fwd_sm90_overlap : 0;
  if (p->head_dim == 576)
    return ov == 1 ? launch<9, kSplitS, kSplitS ? 1 : 0>(ctx, p, stream, head_begin, head_end, num_hblocks)
         : ov == 2 ? launch<9, kSplitS, kSplitS ? 2 : 0>(ctx, p, stream, head_begin, head_end, num_hblocks)
                   : launch<9, kSplitS, 0>(ctx, p, stream, head_begin, head_end, num_hblocks);
  return ov == 1 ? launch<8, kSplitS, kSplitS ? 1 : 0>(ctx, p, stream, head_begin, head_end, num_hblocks)
       : ov == 2 ? launch<8, kSplitS, kSplitS ? 2 : 0>(ctx, p, stream, head_begin, head_end, num_hblocks)
                 : launch<8, kSplitS, 0>(ctx, p, stream, head_begin, head_end, num_hblocks);
}

extern "C" dsa_status dsa_launch_attn_fwd_sm90(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                               cudaStream_t stream) {
  return dsa_launch_attn_fwd_sm90_heads(ctx, p, 0, p->num_heads, stream);
}
