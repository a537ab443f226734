/*
 * fwd_sm90_small.cu - sparse MLA attention forward on sm_90a tensor cores for few heads (H = 1..64,
 * or any range of up to 64 heads of a larger H): dsa_fwd_launch_sm90_small (cuda/attn_fwd/fwd_launch.cuh).
 * Same contract as fwd_sm90_h64.cu (see its top
 * comment and docs/design.md section 5); declines with DSA_ERROR_UNSUPPORTED what it does not run
 * (the dispatch point, cuda/attn_fwd/dispatch.cu, then falls back to the 64-head sm_90a kernel or the
 * portable one).
 *
 * Why a second kernel: the 64-head kernel puts heads on the wgmma M dimension (m64), so H = 8..32
 * does the tensor work of H = 64. Here keys go on M and heads on N (N = H rounded up to 8):
 *   S^T [64 keys x N] = K_tile [64 x D] . Q^T            SS wgmma m64nNk16, D/16 k-steps,
 *                                                        A = the gathered KV tile (K-major SW128),
 *                                                        B = Q [N x D] (K-major SW128)
 *   O^T [512 x N]    += V^T [512 x 64 keys] . P [64 x N]  SS wgmma m64nNk16, 8 m64 blocks x 4 k16,
 *                                                        A = the same KV tile's dims 0..511 read
 *                                                        MN-major (tA = 1, docs/hopper.md section 1 and its test G),
 *                                                        B = P stored [N heads][64 keys] K-major SW128
 * The softmax runs per head = per COLUMN of S^T: a column's 64 keys live in 8 lanes (lane / 4) of each
 * of the 4 warps, so its max is an in-thread max over the rows r, r + 8, shfl_xor 4 / 8 / 16, then one
 * exchange between the 4 warps through shared memory (named barrier). That exchange, the rescale
 * factors and the O rescale are the softmax's cost here, so they run only when the frame has to move:
 * P = exp2(S - frame) with a per-column frame that moves only when a logit of the tile exceeds it by
 * more than 8 (log2 units; P <= 256 otherwise), decided by one barrier with an OR reduction
 * (small_softmax; the true column max for max_logits is tracked per thread and reduced once). P
 * reaches shared memory with stmatrix .trans (the accumulator fragment is [keys][heads]; .trans
 * writes [heads][keys]).
 *
 * One CTA = one query token, heads [head_begin, head_begin + head_count) of it (the launch's head
 * range; the whole H unless the dispatch splits H > 64 between this kernel and the 64-head one).
 * Kernel column h < N is head head_begin + h; columns >= head_count are zero Q rows, never written.
 * Two shapes (SmallCfg below, one constexpr row per N):
 *   N <= 32: 256 threads, WG0 consumer (all N columns), WG1 producer. O^T [512 x N] = 8 m64 tiles x
 *        N/2 registers in the consumer. Two CTAs per SM, one KV stage each, refilled block by block
 *        (the block ring, below); at N = 24 / 32 setmaxnreg splits the registers and, at D = 576, P
 *        lives in the stage's RoPE block.
 *   N = 40..64: 384 threads, WG0 and WG1 consumers, WG2 producer, the value-dim split (template
 *        SPLIT, setmaxnreg 256 / 192 / 56): WG0 computes S^T [64 x N] once per tile for every column,
 *        the softmax, P and the rescale factors, and O^T dims [0, 64 kMB0); WG1 only O^T dims
 *        [64 kMB0, 512) from the same P (kMB0 = 3 at N = 40, else 4, and two P buffers at N = 48 / 56:
 *        SplitCfg; split_s_consumer / split_pv_consumer below, with their hand-offs). Each KV element
 *        is read from shared memory once per tile (238 KB of wgmma operand reads per tile at N = 48).
 *   WG producer: cp.async 16 B with a manual 128B swizzle (docs/hopper.md section 5), exactly as the 64-head
 *        kernel: Q [N x D] once (columns >= head_count zero-filled), then 64 KV rows per tile into the
 *        stages; invalid slots zero-filled and flagged in a byte mask (per stage, or per tile parity in
 *        the ring).
 *   WG consumer (N <= 32): per tile S^T (D/16 HGMMA.64xNx16), mask, online softmax, P -> smem, O^T
 *        rescale, 32 HGMMA.64xNx16 for P V. Epilogue: O^T / l * sink factor staged through shared
 *        memory (reusing the KV stage) as [head][512] bf16 rows, then 16-B coalesced stores to out.
 * Registers at N <= 32: two CTAs of 256 threads leave 128 per thread; N = 8 / 16 need no more, N = 24 /
 * 32 split them by setmaxnreg, kTwoConsRegs 208 for the consumer (at N = 32: O^T 128 + S^T / P 16 +
 * softmax state) and kTwoProdRegs 48 for the producer.
 * ptxas (nvcc 13, -Xptxas -v, D = 576): 64 / 116 registers for N = 8 / 16; N = 24 / 32: 128 at entry
 * (the __launch_bounds__(256, 2) cap), raised to 208 in the consumer (producer 48); N = 40..64: 168 at
 * entry (the __launch_bounds__(384, 1) cap), raised to 256 / 192 in the consumers (producer 56); no
 * spills, no wgmma serialisation warning. SASS per 64-key tile at N <= 32: 36 (D = 576) or 32 (D =
 * 512) HGMMA.64xNx16 for S^T, 32 HGMMA.64xNx16 with gdesc.tnspA for P V, N / 8 STSM.16.MT88.2 (N =
 * 48: 68 HGMMA.64x48x16 in the kernel, 36 + 16 in WG0's loop and 16 in WG1's).
 * Shared memory at D = 576: 85480 B (N = 8) .. 112872 B (N = 32), two CTAs per SM; 200824 B (N = 40)
 * .. 232120 B (N = 64; at N = 56 with two P buffers 229088 B), one CTA per SM.
 *
 * Pipeline barriers (mbarriers in shared memory, parities as in docs/hopper.md section 4):
 *   q_full   : 128 .noinc cp.async arrivals (producer threads) -> Q landed.
 *   N <= 32, the block ring (one stage):
 *   full[g]  : per landing group g (small_ring_group): full[0] 128 .noinc cp.async arrivals + 128
 *              plain arrivals (release the mask bytes), full[1] / full[2] 128 .noinc arrivals each.
 *   empty[b] : per 64-column block b, 4 arrivals (lane 0 of each consumer warp after its wait).
 *   N = 40..64 (two stages):
 *   full[s]  : 128 .noinc cp.async arrivals + 128 plain arrivals (release the mask bytes) -> stage s.
 *   empty[s] : 128 plain arrivals per consumer WG (after its P V wgmma completed) -> stage s free.
 * Named barriers (128 threads, consumer WG 0): kBarMax (column maxima exchanged; also the column sums
 * in the epilogue), kBarP (P tile complete, after each writer's fence.proxy.async; also the staged
 * out tile in the epilogue). The value-dim split uses no barrier between the WGs but mbarriers:
 * p_full (P and alpha of the tile ready) and fac_full (the out factors written, WG0's P V all done),
 * plus WG0's waits on empty[s] (WG1's P V done): racecheck follows mbarrier hand-offs
 * (docs/reliability.md 3c).
 * Declined with DSA_ERROR_UNSUPPORTED: a device other than cc 9.0, D other than 576 / 512, a head
 * range of more than 64 heads (or outside 0..H), q / kv rows not 16-B aligned, out rows not 4-B
 * aligned, T above 2^31 - 1, shared memory above the device's opt-in limit.
 * Limits of this design: a consumer WG serialises S^T(n) -> softmax -> P V(n) (at N <= 32 the SM's
 * other CTA fills the gaps); N = 40..64 have 2 KV stages only (3 x 72 KB + Q does not fit beside the
 * 1 KB alignment slack at D = 576).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "attn_fwd/fwd_launch.cuh"

/* The block ring (N <= 32: two CTAs per SM, one KV stage per CTA): the stage is a ring of its
 * 64-column blocks, each with its own empty mbarrier. The consumer releases the RoPE block once S^T
 * retired and value block m once the P V of block m retired (one commit group per block); the
 * producer refills each block of the next tile as it is freed, in the order the next S^T reads them
 * (small_ring_block: the RoPE block first, last when it holds P), and the consumer waits for them in
 * three groups (small_ring_group). The gather of tile n + 1 thus overlaps the P V of tile n, and the
 * SM's other CTA fills the gaps of this CTA's serial chain (S^T -> softmax -> P V).
 * At N = 24 / 32, to fit two CTAs (<= 113 KB each at D = 576), P lives in the stage's RoPE block,
 * free once S^T retired, and the registers are split by setmaxnreg (consumer kTwoConsRegs, producer
 * kTwoProdRegs); the RoPE block, holding P, is then the last block freed and refilled. */

namespace {

/* ---- tile and launch configuration ----------------------------------------------------------- */
constexpr int kBlockK = 64;         /* keys per KV tile: the M of one wgmma (m64) */
constexpr int kMaxN = 64;           /* heads per CTA: wgmma N = head count rounded up to 8, at most 64 */
constexpr int kMaxNOneWG = 32;      /* one consumer WG up to N = 32 (O^T = 4 N registers per thread) */
constexpr int kDV = DSA_VALUE_DIM;  /* 512 value dims = 8 m64 blocks of O^T */
constexpr int kDVBlocks = kDV / 64; /* 8 */
constexpr int kBlkBytes = 64 * 128; /* one 64 x 64 bf16 SW128 block: 8 atoms of 1024 B */
constexpr int kOutPitch = 1040;     /* staged out row: 1024 B + 16 so the 4 heads of a store are 8 banks apart */
constexpr int kBarMax = 1, kBarP = 2; /* named barrier ids of consumer WG 0; 0 is __syncthreads */
constexpr int kProducerRegs = 56;   /* N > 32: the gather and the next tile's indices (at 40: 4-8 B of spills) */
constexpr int kSplitSRegs = 256;    /* SPLIT WG 0: O^T half 2N + S^T / P N/2 + frame, sums, logit max 3 N/4 (N = 56: 210) */
constexpr int kSplitPVRegs = 192;   /* SPLIT WG 1: O^T half 2N (N = 64: 128) + addressing; 256 + 192 + 56 = 504 */
constexpr int kTwoConsRegs = 208;   /* N = 24 / 32: O^T 4N + S^T / P N/2 + softmax state */
constexpr int kTwoProdRegs = 48;    /* its producer: 208 + 48 = 256 = 2 x 128 (two CTAs of 256 threads) */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kBlockK == 64, "the fragment maps below assume m64 tiles of 64 keys");
static_assert(kDVBlocks == 8, "O^T is 8 m64 blocks");
static_assert(kMaxNOneWG * kOutPitch <= 8 * kBlkBytes, "the staged out tile (N <= 32) fits in KV stage 0");
static_assert(kMaxN * kOutPitch <= 2 * 8 * kBlkBytes, "the staged out tile (N <= 64) fits in two KV stages");
static_assert(kBarMax > 0 && kBarP > 0 && kBarMax != kBarP && kBarP < 16, "named barrier ids 1..15");
static_assert(kSplitSRegs + kSplitPVRegs + kProducerRegs <= 504 && kSplitSRegs % 8 == 0 && kSplitPVRegs % 8 == 0 &&
                  kProducerRegs % 8 == 0,
              "setmaxnreg of the value-dim split fits the launch's pool, 384 threads x 168 registers = 128 x 504");
static_assert(2 * 128 * (kTwoConsRegs + kTwoProdRegs) <= 65536 && kTwoConsRegs % 8 == 0 && kTwoProdRegs % 8 == 0,
              "two CTAs of 256 threads fit the SM's registers after setmaxnreg");
static_assert(kLog2e * kLn2 > 0.9999f && kLog2e * kLn2 < 1.0001f, "log2(e) and ln(2) are reciprocal");

/* Launch shape per N (wgmma N = head count rounded up to 8), one row each:
 *   N       consumers  CTAs/SM  KV stages  why
 *   8, 16   1          2        1 (ring)   <= 97 KB of smem and <= 128 registers: the two CTAs overlap
 *                                          each other's gather, softmax and token ends
 *   24, 32  1          2        1 (ring)   the same, with setmaxnreg 208 / 48 and (D = 576) P in the
 *                                          stage's RoPE block: <= 113 KB
 *   40..64  2          1        2          O^T [512 x N] (4N registers) does not fit one WG: the
 *                                          value-dim split (WG0 S^T, both WGs part of the value dims)
 *                                          reads each KV element from shared memory once; 2 x 72 KB +
 *                                          Q 72 KB fills the 227 KB. */
template <int N>
struct SmallCfg {
  static constexpr bool kTwo = N <= kMaxNOneWG;          /* two CTAs per SM */
  static constexpr bool kRegs = kTwo && N > 16;          /* setmaxnreg: consumer kTwoConsRegs */
  static constexpr bool kTwoWG = N > kMaxNOneWG;         /* two consumer WGs: the value-dim split */
  static constexpr int kStages = kTwo ? 1 : 2;           /* KV stages per CTA */
  static constexpr int kCtas = kTwo ? 2 : 1;             /* CTAs per SM: __launch_bounds__ min blocks */
  static constexpr int kConsumers = kTwoWG ? 2 : 1;      /* consumer WGs; the producer is WG kConsumers */
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr bool kRing = kTwo;                    /* the block ring (top of file) */
};

/* The value-dim split's choices per N (SPLIT below; measurements in docs/perf.md):
 *   N    WG 0 / WG 1 value blocks   P buffers
 *   40   3 / 5                     1
 *   48   4 / 4                     2
 *   56   4 / 4                     2
 *   64   4 / 4                     1           (two P buffers do not fit beside Q: 231.5 KB)
 * Fewer value blocks in WG 0 shorten its per-tile chain (S, softmax, P, its P V); two P buffers let WG 0
 * write P(n) while WG 1's P V(n - 1) still reads P(n - 1). WG 1 skips its rescale when each alpha of
 * the warp is 1 (a warp vote on the alphas it loads anyway, no flag from WG 0). */
template <int N>
struct SplitCfg {
  static constexpr int kMB0 = N == 40 ? 3 : 4;                 /* WG 0's value-dim blocks of 64 */
  static constexpr int kPBufs = N == 48 || N == 56 ? 2 : 1;    /* P / alpha buffers */
  static_assert(kMB0 >= 1 && kMB0 < kDVBlocks, "both WGs own value dims");
};

/* Shared-memory layout for NB 64-column blocks per row (D = 64 NB) and N heads. Every operand tile
 * is 1024-B aligned (SW128 atoms, descriptor base offset 0): N is a multiple of 8, so N * 128 is a
 * multiple of 1024. */
template <int NB, int N, bool SPLIT = false>
struct SmallSmem {
  static constexpr bool kTwoWG = SmallCfg<N>::kTwoWG;
  static constexpr int kStages = SmallCfg<N>::kStages;
  static constexpr bool kRing = SmallCfg<N>::kRing;
  static constexpr bool kPInRope = SmallCfg<N>::kRegs && NB > kDVBlocks; /* P in the stage's RoPE block */
  static constexpr int kMasks = kRing ? 2 : kStages;         /* validity masks: per stage, or per tile
                                                                parity in the ring */
  static constexpr int kFullBars = kRing ? 3 : kStages;      /* full mbarriers: per stage, or per
                                                                group of blocks in the ring */
  static constexpr int kEmptyBars = kRing ? NB : kStages;    /* empty: per stage, or per block */
  static constexpr int kTileBytes = NB * kBlkBytes;          /* KV stage: [64 keys x D] bf16 */
  static constexpr int kQBlk = N * 128;                      /* one 64-column block of Q: N rows */
  static constexpr int kKV = 0;                              /* stage s at kKV + s * kTileBytes */
  static constexpr int kQ = kKV + kStages * kTileBytes;      /* Q [N x D], block b at kQ + b * kQBlk */
  static constexpr int kPBufs = SPLIT ? SplitCfg<N>::kPBufs : 1; /* SPLIT: P and alpha of tiles n, n + 1 */
  static constexpr int kP = kPInRope ? kKV + kDVBlocks * kBlkBytes /* P [N heads x 64 keys] bf16 SW128 */
                                     : kQ + NB * kQBlk;
  static constexpr int kValid = kPInRope ? kQ + NB * kQBlk   /* [kMasks][64] bytes, 1 = valid slot */
                                         : kP + kPBufs * N * 128;
  static constexpr int kRed = kValid + kMasks * kBlockK;    /* f32 red_max[4][N], red_sum[4][N]; the
                                                                split: one [4][N] for both (227 KB) */
  static constexpr int kAlpha = kRed + (kTwoWG ? 1 : 2) * 4 * N * 4; /* SPLIT: f32 alpha[kPBufs][N], fac[N] */
  static constexpr int kBars = kAlpha + (SPLIT ? (kPBufs + 1) * N * 4 : 0); /* q_full, full[kFullBars],
                                                  empty[kEmptyBars], SPLIT: p_full[kPBufs], fac_full */
  static constexpr int kEnd = kBars + 8 * (1 + kFullBars + kEmptyBars + (SPLIT ? kPBufs + 1 : 0));
  static constexpr int kBytes = kEnd + 1024;                 /* + slack to align the base */
  static_assert(N % 8 == 0 && N >= 8 && N <= kMaxN, "wgmma N: multiple of 8, at most 64 here");
  static_assert(!SPLIT || (kTwoWG && kStages == 2), "the value-dim split runs N = 40..64 on two stages");
  static_assert(!kRing || (kStages == 1 && !SPLIT && NB >= 6), "the block ring runs the one stage of N <= 32");
  static_assert(kBars % 8 == 0, "mbarriers are 8-B aligned");
  static_assert(!SmallCfg<N>::kTwo || kBytes <= (233472 - 2 * 1024) / 2,
                "two CTAs per SM: each within half of the SM's 228 KB less 1 KB reserved per CTA");
  /* one WG: stage 0 is free once the consumer passed its epilogue barrier; the split: every stage is
   * free once both WGs consumed every tile (the producer issues nothing more) */
  static_assert(N * kOutPitch <= (kTwoWG ? kStages : 1) * kTileBytes, "staged out tile fits in the KV stages");
};

/* Kernel arguments: the resolved public params plus what the host precomputes. */
struct SmallArgs {
  dsa_attn_fwd_params p;
  float scale_log2; /* softmax_scale * log2(e): the softmax runs on exp2 */
  int out_vec16;    /* 1: out rows 16-B aligned (uint4 stores), else 4-B stores */
  int head_begin;   /* kernel column h is head head_begin + h of q / sink / out / lse / max_logits */
  int head_count;   /* columns [0, head_count) are real heads (<= N); the rest are zero rows */
  int kv_evict_last; /* the KV gather's L2 policy (dsa_fwd_kv_evict_last) */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* stmatrix m8n8.x2 .trans: lanes 0-7 address the rows of matrix 0, lanes 8-15 those of matrix 1;
 * memory row q of a matrix receives column q of the thread-distributed 8 x 8 fragment. */
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

/* Fragment maps of an m64nNW accumulator (docs/hopper.md section 2): register i is row 16 warp + lane / 4 +
 * 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (lane % 4) + (i & 1). Column slot c = 2 (i >> 2) + (i & 1)
 * (0..NW/4-1) names this thread's columns: col(c) = 8 (c >> 1) + 2 (lane % 4) + (c & 1). */
__device__ __forceinline__ int small_slot(int i) { return 2 * (i >> 2) + (i & 1); }
__device__ __forceinline__ int small_col(int c, int lane) { return 8 * (c >> 1) + 2 * (lane & 3) + (c & 1); }

/* Column totals over the WG from per-thread partials v[c] (this thread's rows of column slot c): the
 * lanes holding the column (shfl_xor 4 / 8 / 16), then the 4 warps through red [4][N] and named
 * barrier `bar` (128 threads); MAX: max, else sum (in the order warp 0 + 1 + 2 + 3); fin(c, total)
 * receives each slot's total. WAR: a barrier before the stores, for a caller that read red since its
 * last barrier; otherwise the caller's next barrier must come after every warp read red and before
 * any warp writes it again. */
template <int N, bool MAX, bool WAR, class Fin>
__device__ __forceinline__ void small_col_reduce(const float *v, float *red, int bar, int warp, int lane, Fin fin) {
  constexpr int NC = N / 4;
  float part[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    float a = v[c];
    a = MAX ? fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4)) : a + __shfl_xor_sync(0xffffffffu, a, 4);
    a = MAX ? fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8)) : a + __shfl_xor_sync(0xffffffffu, a, 8);
    a = MAX ? fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 16)) : a + __shfl_xor_sync(0xffffffffu, a, 16);
    part[c] = a;
  }
  if (WAR) sm90_named_bar_sync(bar, 128);
  if (lane < 4) {
#pragma unroll
    for (int c = 0; c < NC; ++c) red[warp * N + small_col(c, lane)] = part[c];
  }
  sm90_named_bar_sync(bar, 128);
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int col = small_col(c, lane);
    fin(c, MAX ? fmaxf(fmaxf(red[col], red[N + col]), fmaxf(red[2 * N + col], red[3 * N + col]))
               : red[col] + red[N + col] + red[2 * N + col] + red[3 * N + col]);
  }
}

/* One completed S^T tile [64 keys x N columns]: mask the
 * invalid keys (rows), then the online softmax per column in the log2 domain, against a lazily moved
 * frame: col_max (identical in every thread holding the column) is the max P and col_sum are relative
 * to, and it moves only when some logit of the tile exceeds it by more than kSm90RescaleSlack (8; P <=
 * 2^8 otherwise; the 4-warp max exchange, the rescale factors and the caller's O rescale are skipped:
 * returns false, alpha = 1). The decision is one barrier with an OR reduction (named barrier `bar`,
 * 128 threads); when it says move, the tile's column max is exchanged as before: in-thread over rows
 * r0 / r0 + 8, shfl_xor 4 / 8 / 16, then the 4 warps through red [4][N] and `bar` again, and the frame
 * becomes max(col_max, the tile's max). The first tile with a valid key always moves it (-inf before).
 * tmax: this thread's running max of its logits per column slot (max_logits, reduced in the epilogue).
 * LAZY = false: the frame follows the running max on every tile (the exchange always runs, tmax is
 * not touched and col_max is the max_logits).
 * x = this thread's unnormalised P fragment, col_sum (this thread's rows) updated. WAR on red: the
 * caller's next barrier (the P barrier) comes after every warp read it and before any warp writes it
 * again. */
template <int N, bool LAZY = true>
__device__ __forceinline__ bool small_softmax(const float *sacc, const uint8_t *vs, float scale_log2, int warp, int lane,
                                              float *red, int bar, float *col_max, float *col_sum, float *alpha,
                                              float *x, float *tmax) {
  constexpr int NR = N / 2, NC = N / 4;
  const int r0 = 16 * warp + (lane >> 2);
  const bool ok0 = vs[r0] != 0, ok1 = vs[r0 + 8] != 0;
  bool over = false;
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    x[i] = (((i >> 1) & 1) ? ok1 : ok0) ? sacc[i] * scale_log2 : -INFINITY;
    if (LAZY) {
      tmax[small_slot(i)] = fmaxf(tmax[small_slot(i)], x[i]);
      over |= sm90_frame_moves(col_max[small_slot(i)], x[i]);
    }
  }
  /* !LAZY (the value-dim split at N = 64: no registers left for tmax): the frame is the running max */
  const bool move = LAZY ? sm90_named_bar_or(bar, 128, over) : true;
  float m_use[NC];
  if (move) {
    float mx[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int i = 4 * (c >> 1) + (c & 1); /* rows r0 (i) and r0 + 8 (i + 2) */
      mx[c] = fmaxf(x[i], x[i + 2]);
    }
    small_col_reduce<N, true, false>(mx, red, bar, warp, lane, [&](int c, float tile_max) {
      const float v = fmaxf(tile_max, col_max[c]);
      m_use[c] = v == -INFINITY ? 0.f : v; /* no valid slot yet: avoid (-inf) - (-inf) */
      alpha[c] = exp2f(col_max[c] - m_use[c]);
      col_max[c] = v;
    });
  } else {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      m_use[c] = col_max[c] == -INFINITY ? 0.f : col_max[c];
      alpha[c] = 1.f;
    }
  }
  float psum[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) psum[c] = 0.f;
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    x[i] = sm90_exp2(x[i] - m_use[small_slot(i)]);
    psum[small_slot(i)] += x[i];
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) col_sum[c] = col_sum[c] * alpha[c] + psum[c];
  return move;
}

/* O^T blocks [0, MB) x this thread's column factors (alpha of each column slot). */
template <int NW, int MB>
__device__ __forceinline__ void small_rescale_o(float (*o)[NW / 2], const float *alpha) {
#pragma unroll
  for (int m = 0; m < MB; ++m)
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) o[m][i] *= alpha[small_slot(i)];
}

/* P -> shared memory as [NW heads][64 keys] bf16, K-major SW128 (the B operand of P V), rows from sp.
 * For heads 8j..8j+7 the warp's fragment is two 8 x 8 matrices [keys][heads] (rows r0, r0 + 8);
 * stmatrix .trans stores each transposed: memory row q = head 8j + q, 16 B = 8 keys, at chunk
 * 2 warp + (matrix) of the 128-B row, swizzled by q. Lanes 0-7 / 8-15 address matrix 0 / 1. */
template <int NW>
__device__ __forceinline__ void small_store_p(uint32_t sp, const float *x, int warp, int lane) {
  const int q = lane & 7, mat = (lane >> 3) & 1;
  const int chunk = 2 * warp + mat;
#pragma unroll
  for (int j = 0; j < NW / 8; ++j) {
    const int h = 8 * j + q;
    const uint32_t addr = sp + h * 128 + (((chunk ^ q) & 7) << 4);
    stmatrix_x2_trans(addr, sm90_pack_bf16x2(x[4 * j], x[4 * j + 1]), sm90_pack_bf16x2(x[4 * j + 2], x[4 * j + 3]));
  }
}

/* Register fences on one m64nNW accumulator (NW / 2 floats per thread) and on MB of them (O^T's
 * blocks): they keep the compiler from moving the accumulator's reads and writes across a wgmma
 * issue or wait. No instruction of their own. */
template <int NW>
__device__ __forceinline__ void small_fence_acc(float *a) {
#pragma unroll
  for (int i = 0; i < NW / 2; ++i) sm90_fence_operand(a[i]);
}
template <int NW, int MB>
__device__ __forceinline__ void small_fence_o(float (*o)[NW / 2]) {
#pragma unroll
  for (int m = 0; m < MB; ++m) small_fence_acc<NW>(o[m]);
}

/* S^T's four k16 steps over the KV tile's 64-column block b: K at skv and the Q rows at sq (64-column
 * blocks qblk bytes apart), both K-major SW128, LBO 16 (unused), SBO 1024, +32 B per k16; the KV tile
 * has 8 KB per 64-column block. acc = 0: the block's first step overwrites sacc (the tile's first
 * block). */
template <int NW>
__device__ __forceinline__ void small_s_block(float *sacc, uint32_t skv, uint32_t sq, int qblk, int b, bool acc) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint64_t da = sm90_desc_at(skv >> 4, b * kBlkBytes + k * 32, 16, 1024);
    const uint64_t db = sm90_desc_at(sq >> 4, b * qblk + k * 32, 16, 1024);
    sm90_wgmma_ss_nN<NW, 0>(sacc, da, db, acc || k != 0);
  }
}

/* O^T block += V^T P over the KV tile's 64-column block blk (A = the block read M-major, tA = 1: dims
 * contiguous in the 128-B rows, keys = rows; LBO 8192, unused at m64, SBO 1024 = next 8 keys, +2048 B
 * per k16 of keys. B = P at sp, K-major: +32 B per k16): four k16 steps. */
template <int NW>
__device__ __forceinline__ void small_pv_block(float *o_blk, uint32_t skv, uint32_t sp, int blk) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t da = sm90_desc_at(skv >> 4, blk * kBlkBytes + kk * 2048, kBlkBytes, 1024);
    const uint64_t db = sm90_desc_at(sp >> 4, kk * 32, 16, 1024);
    sm90_wgmma_ss_nN<NW, 1>(o_blk, da, db, 1);
  }
}

/* S^T [64 keys x NW] = K Q^T over the NB blocks of the KV tile at skv (small_s_block). Issued and
 * committed; the caller waits. */
template <int NB, int NW>
__device__ __forceinline__ void small_issue_s(float *sacc, uint32_t skv, uint32_t sq, int qblk) {
  small_fence_acc<NW>(sacc);
  sm90_wgmma_fence();
#pragma unroll
  for (int b = 0; b < NB; ++b) small_s_block<NW>(sacc, skv, sq, qblk, b, b != 0);
  sm90_wgmma_commit();
}

/* O^T [64 MB dims x NW] += V^T P for the value-dim blocks [MB0, MB0 + MB) of the KV tile at skv
 * (small_pv_block). Issued and committed, not waited for; the caller rescaled o. */
template <int NW, int MB, int MB0>
__device__ __forceinline__ void small_issue_pv(float (*o)[NW / 2], uint32_t skv, uint32_t sp) {
  small_fence_o<NW, MB>(o);
  sm90_wgmma_fence();
#pragma unroll
  for (int m = 0; m < MB; ++m) small_pv_block<NW>(o[m], skv, sp, MB0 + m);
  sm90_wgmma_commit();
}

/* The block ring: the order in which the producer refills a tile's 64-column blocks and S^T reads
 * them. At D = 576 the RoPE block (8) is freed first, once S^T retired, so it leads; then the value
 * blocks in the order their P V groups retire. RL (P in the RoPE block, N = 24 / 32 at D = 576): the
 * RoPE block holds P until the last P V group retired, so it comes last. */
template <int NB, bool RL>
__device__ __forceinline__ constexpr int small_ring_block(int ord) {
  return NB > kDVBlocks && !RL ? (ord == 0 ? kDVBlocks : ord - 1) : ord;
}
/* The three landing groups of the ring's order: {0} (with the tile's mask), {1 .. NB - 5}, {NB - 4 ..
 * NB - 1}; full[g] completes when every producer thread's copies up to the group's last block landed
 * (a .noinc arrival counts all of the thread's earlier cp.async). One wait, proxy fence and wgmma
 * fence per group instead of per block. */
template <int NB>
__device__ __forceinline__ constexpr int small_ring_group(int ord) {
  return ord == 0 ? 0 : ord <= NB - 5 ? 1 : 2;
}
template <int NB>
__device__ __forceinline__ constexpr bool small_ring_group_first(int ord) {
  return ord == 0 || ord == 1 || ord == NB - 4;
}
template <int NB>
__device__ __forceinline__ constexpr bool small_ring_group_last(int ord) {
  return ord == 0 || ord == NB - 5 || ord == NB - 1;
}

/* The ring's S^T: small_issue_s with the blocks in small_ring_block order, each landing group's
 * k-steps issued once its full[g] completed the phase of parity `par` (this tile's fill). Issued and
 * committed. */
template <int NB, int NW, bool RL>
__device__ __forceinline__ void small_issue_s_ring(float *sacc, uint32_t skv, uint32_t sq, int qblk, uint64_t *full,
                                                   uint32_t par) {
  small_fence_acc<NW>(sacc);
#pragma unroll
  for (int o = 0; o < NB; ++o) {
    const int b = small_ring_block<NB, RL>(o);
    if (small_ring_group_first<NB>(o)) {
      sm90_mbar_wait(&full[small_ring_group<NB>(o)], par);
      sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
      sm90_wgmma_fence();       /* after each wait loop: ptxas would otherwise insert one in a divergent
                                   path and serialise the chain (C7519 / C7520) */
    }
    small_s_block<NW>(sacc, skv, sq, qblk, b, o != 0);
  }
  sm90_wgmma_commit();
}

/* The ring's release of the value blocks: waits for the P V commit groups in order (group m = value
 * block m) and frees block m as soon as its group retired, one arrival per warp (lane 0 after the
 * warp's wait; the ring's empties count the 4 warps). */
template <int R>
__device__ __forceinline__ void small_ring_release_pv(uint64_t *empty, int lane) {
  sm90_wgmma_wait<R>();
  if (lane == 0) sm90_mbar_arrive(&empty[kDVBlocks - 1 - R]);
  if constexpr (R > 0) small_ring_release_pv<R - 1>(empty, lane);
}

/* The ring's P V: small_issue_pv over the 8 value blocks with one commit group per block, each block
 * released as its group retires. Returns with every group retired; the caller rescaled o. */
template <int NW>
__device__ __forceinline__ void small_pv_ring(float (*o)[NW / 2], uint32_t skv, uint32_t sp, uint64_t *empty,
                                              int lane) {
  small_fence_o<NW, kDVBlocks>(o);
  sm90_wgmma_fence();
#pragma unroll
  for (int m = 0; m < kDVBlocks; ++m) {
    small_pv_block<NW>(o[m], skv, sp, m);
    sm90_wgmma_commit();
  }
  small_ring_release_pv<kDVBlocks - 1>(empty, lane);
  small_fence_o<NW, kDVBlocks>(o);
}

/* The ring's gather of one tile (thread (g, j) as sm90_gather_kv_rows): block by block in
 * small_ring_block order, each once empty[b] completed the phase of parity `par` (its previous
 * tile's readers are done), its four cp.async, and after a landing group's last block the .noinc
 * arrival on the group's full barrier; with the first block the validity bytes of the tile's mask
 * (vmask) and a plain arrival on full[0] that releases them. */
template <int NB, bool RL>
__device__ __forceinline__ void small_ring_gather(uint32_t skv, uint8_t *vmask, const int32_t idxs[4], int g, int j,
                                                  const uint16_t *kv, int64_t kv_stride, int64_t num_kv,
                                                  const uint16_t *harmless, uint64_t pol, uint64_t *full,
                                                  uint64_t *empty, uint32_t par) {
  const uint16_t *src[4];
  uint32_t bytes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    bool ok;
    src[i] = sm90_gather_src(idxs[i], j, kv, kv_stride, num_kv, harmless, &ok);
    bytes[i] = ok ? 16u : 0u;
  }
#pragma unroll
  for (int o = 0; o < NB; ++o) {
    const int b = small_ring_block<NB, RL>(o);
    sm90_mbar_wait(&empty[b], par);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      sm90_cp_async16_hint(skv + b * kBlkBytes + sm90_sw128_chunk_off(g + 16 * i, j), src[i] + b * 64, bytes[i], pol);
    if (small_ring_group_last<NB>(o)) sm90_cp_async_mbar_arrive_noinc(&full[small_ring_group<NB>(o)]);
    if (o == 0) {
      if (j == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) vmask[g + 16 * i] = bytes[i] != 0u;
      }
      sm90_mbar_arrive(&full[0]);
    }
  }
}

/* Epilogue per column: sums across lanes and warps (red [4][N], barrier `bar`), lse, max_logits (lanes
 * 0-3 of warp 0 hold every column once: they write them, and fac_s[col] when fac_s is given) and the
 * out factor 1 / l x sink factor of each column slot (0 for empty columns and columns >= head_count).
 * col_max is the softmax frame (lse = frame + log2 l); max_logits comes from tmax, this thread's running
 * max of the column's logits, reduced over the WG here (a second exchange through red, only when
 * max_logits is requested); tmax = nullptr: the frame is the running max (small_softmax's !LAZY).
 * WAR on red: every warp read the last tile's maxima before that tile's P barrier. */
template <int N>
__device__ __forceinline__ void small_col_factors(const SmallArgs &args, const float *col_max, const float *col_sum,
                                                  const float *tmax, float *red, int bar, int warp, int lane, float *fac,
                                                  float *fac_s) {
  constexpr int NC = N / 4;
  const dsa_attn_fwd_params &p = args.p;
  const int Hc = args.head_count, hbeg = args.head_begin;
  float l_col[NC], t_col[NC];
  small_col_reduce<N, false, false>(col_sum, red, bar, warp, lane, [&](int c, float l) { l_col[c] = l; });
  /* the true column max (the frame col_max may lag it by up to kSm90RescaleSlack); WAR: the sums were read */
  if (p.max_logits && tmax)
    small_col_reduce<N, true, true>(tmax, red, bar, warp, lane, [&](int c, float t) { t_col[c] = t; });
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int h = small_col(c, lane); /* kernel column = head hbeg + h */
    const float l = l_col[c];
    const bool empty_col = col_max[c] == -INFINITY && l == 0.f; /* no valid slot (all-NaN logits: l = NaN, lse NaN) */
    const float lse = empty_col ? INFINITY : (col_max[c] + log2f(l)) * kLn2;
    float f = 0.f;
    if (!empty_col && h < Hc) {
      f = 1.f / l;
      if (p.sink) f *= 1.f / (1.f + expf(p.sink[hbeg + h] - lse)); /* -inf sink: 1, +inf: 0 */
    }
    fac[c] = f;
    if (warp == 0 && lane < 4) {
      if (fac_s) fac_s[h] = f;
      if (h < Hc) {
        const int64_t th = (int64_t)blockIdx.x * p.num_heads + hbeg + h;
        p.lse[th] = lse;
        if (p.max_logits) p.max_logits[th] = empty_col ? -INFINITY : (tmax ? t_col[c] : col_max[c]) * kLn2;
      }
    }
  }
}

/* O^T [64 MB dims x NW] x fac -> the staged out tile [NW heads][kOutPitch B] bf16, dims from DIM0.
 * For one register the 32 lanes write 8 consecutive dims x 4 heads; the 16-B pad puts
 * the heads 8 banks apart. */
template <int NW, int MB, int DIM0>
__device__ __forceinline__ void small_stage_out(uint8_t *stage, const float (*o)[NW / 2], const float *fac, int warp,
                                                int lane) {
  const int r0 = 16 * warp + (lane >> 2);
#pragma unroll
  for (int m = 0; m < MB; ++m)
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) {
      const int dim = DIM0 + 64 * m + r0 + 8 * ((i >> 1) & 1);
      const int h = small_col(small_slot(i), lane);
      *(uint16_t *)(stage + h * kOutPitch + dim * 2) =
          (uint16_t)(sm90_pack_bf16x2(o[m][i] * fac[small_slot(i)], 0.f) & 0xffffu);
    }
}

/* Coalesced copy-out of staged rows [h0, h1) (below head_count), 16-B chunks [ch0, ch0 + NCH) of each
 * (64 chunks = 512 dims), by the 128 threads of one WG. */
template <int NCH>
__device__ __forceinline__ void small_copy_out(const SmallArgs &args, const uint8_t *stage, int t, int h0, int h1,
                                               int ch0) {
  const dsa_attn_fwd_params &p = args.p;
  const int hend = min(h1, args.head_count);
  for (int cidx = h0 * NCH + t; cidx < hend * NCH; cidx += 128) {
    const int h = cidx / NCH, ch = ch0 + cidx % NCH;
    const uint4 v = *(const uint4 *)(stage + h * kOutPitch + ch * 16);
    uint16_t *dst = p.out + (int64_t)blockIdx.x * p.out_stride_token + (int64_t)(args.head_begin + h) * p.out_stride_head +
                    ch * 8;
    sm90_store_16b(dst, v, args.out_vec16);
  }
}

/* The consumer of N <= 32 (one consumer WG, all N kernel columns): per tile S^T = K Q^T by landing
 * group of the block ring, mask, online softmax per column, P -> the P tile, O^T [512 x N] += V^T P
 * with each block released as its P V retires; then the epilogue. t = thread index in the WG. (NW:
 * the accumulators' column count, here all N columns.) */
template <int NB, int N>
__device__ __forceinline__ void small_consumer(const SmallArgs &args, uint8_t *smem, int t, int ntiles) {
  typedef SmallSmem<NB, N> L;
  constexpr int NW = N;
  constexpr int NR = NW / 2; /* accumulator registers per thread of one m64nNW tile */
  constexpr int NC = NW / 4; /* distinct columns (heads) per thread */
  static_assert(NW % 8 == 0 && NW >= 8 && NW <= kMaxNOneWG, "one consumer WG owns every column");
  static_assert(L::kRing, "N <= 32 runs the block ring");
  const uint8_t *valid = smem + L::kValid;
  float *red_max = (float *)(smem + L::kRed);    /* [4 warps][N columns] */
  float *red_sum = red_max + 4 * N;              /* [4 warps][N columns] */
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + L::kFullBars;
  const int warp = t >> 5, lane = t & 31;

  float o[kDVBlocks][NR]; /* O^T: block m = value dims [64 m, 64 m + 64) x NW heads */
  float sacc[NR];         /* S^T: 64 keys x NW heads */
#pragma unroll
  for (int m = 0; m < kDVBlocks; ++m)
#pragma unroll
    for (int i = 0; i < NR; ++i) o[m][i] = 0.f;
#pragma unroll
  for (int i = 0; i < NR; ++i) sacc[i] = 0.f;
  /* the softmax frame per column (log2 units; small_softmax), this thread's partial column sums over
   * its rows and its running max of the column's logits */
  float col_max[NC], col_sum[NC], tmax[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    col_max[c] = -INFINITY;
    col_sum[c] = 0.f;
    tmax[c] = -INFINITY;
  }

  sm90_mbar_wait(q_full, 0);
  sm90_fence_proxy_async();
  const uint32_t sq = sm90_smem_addr(smem + L::kQ);
  const uint32_t sp = sm90_smem_addr(smem + L::kP);
  const uint32_t skv = sm90_smem_addr(smem + L::kKV); /* the one KV stage, a ring of its blocks */

  for (int n = 0; n < ntiles; ++n) {
    small_issue_s_ring<NB, NW, L::kPInRope>(sacc, skv, sq, L::kQBlk, full, (uint32_t)n & 1);
    sm90_wgmma_wait<0>();
    small_fence_acc<NW>(sacc);
    if constexpr (NB > kDVBlocks && !L::kPInRope) {
      if (lane == 0) sm90_mbar_arrive(&empty[kDVBlocks]); /* the RoPE block: read by S^T only */
    }

    float alpha[NC];
    float *x = sacc; /* P in place of S^T: sacc is rewritten by the next tile's S^T only */
    const uint8_t *vmask = valid + (n & 1) * kBlockK; /* the mask of tile n: buffer n & 1 */
    const bool moved = small_softmax<N>(sacc, vmask, args.scale_log2, warp, lane, red_max, kBarMax, col_max,
                                                col_sum, alpha, x, tmax);
    /* WAR on the P tile (this WG's rows only): every warp passed its wait on the previous P V before
     * the kBarMax barrier inside small_softmax. */
    small_store_p<NW>(sp, x, warp, lane);
    sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> wgmma (async proxy) */
    sm90_named_bar_sync(kBarP, 128);

    if (moved) small_rescale_o<NW, kDVBlocks>(o, alpha); /* the frame moved: O follows (WG-uniform branch) */
    small_pv_ring<NW>(o, skv, sp, empty, lane); /* frees each value block as its P V retires */
    if constexpr (L::kPInRope) {
      if (lane == 0) sm90_mbar_arrive(&empty[kDVBlocks]); /* the RoPE block held P(n) */
    }
  }

  /* ---- epilogue. After small_col_factors' barrier every warp has also finished its last P V. */
  float fac[NC];
  small_col_factors<N>(args, col_max, col_sum, tmax, red_sum, kBarMax, warp, lane, fac, nullptr);
  uint8_t *stage = smem + L::kKV;
  small_stage_out<NW, kDVBlocks, 0>(stage, o, fac, warp, lane);
  sm90_named_bar_sync(kBarP, 128);
  small_copy_out<64>(args, stage, t, 0, NW, 0);
}

/* ---- SPLIT (N = 40..64): two consumer WGs split the 512 value dims. WG 0 computes S^T [64 keys x N]
 * once per tile for every column, runs the softmax, writes P [N][64] and the per-column rescale factors alpha [N] to shared memory (p_full) and
 * accumulates O^T dims [0, 64 kMB0); WG 1 waits on p_full and accumulates O^T dims [64 kMB0, 512) from
 * the same P (kMB0 and the number of P / alpha buffers per N: SplitCfg). Each KV element is read from
 * shared memory once per tile. Hand-offs (mbarriers), tile n in P buffer b = n % kPBufs:
 *   WG 0 -> WG 1: p_full[b] (128 arrivals of WG 0, after its P stmatrix / alpha stores and their
 *                 fence.proxy.async): P(n) and alpha(n) ready; WG 1 waits with parity (n / kPBufs) & 1.
 *   WG 1 -> WG 0: empty[s] (the producer's barrier, 128 arrivals of each WG after its P V(n) completed).
 *                 One buffer: WG 0 waits on it (parity of tile n - 1) before it overwrites P and alpha
 *                 with tile n's. Two: buffer b last held tile n - 2, and WG 1 finished its P V(n - 2)
 *                 before the producer could refill stage s with tile n, which WG 0 waited for; the
 *                 same chain keeps WG 0 from completing a phase of p_full[b] that WG 1 has not seen.
 *   epilogue:     fac_full (WG 0: out factors in fac_s, its P V all done) and WG 0's wait on the last
 *                 tile's empty barrier (WG 1's P V all done) before either overwrites the KV stages.
 * WG 0's order per tile: S(n) issued, then wgmma.wait 1 retires its P V(n - 1) (stage of n - 1
 * released at once: the producer's gather of n + 1 overlaps S(n), the softmax and both P V(n)),
 * wait 0, softmax, P(n), P V(n) issued without waiting. */
template <int NB, int N>
__device__ __forceinline__ void split_s_consumer(const SmallArgs &args, uint8_t *smem, int t, int ntiles) {
  typedef SmallSmem<NB, N, true> L;
  constexpr int kStages = L::kStages;
  constexpr int NR = N / 2, NC = N / 4, kHalf = SplitCfg<N>::kMB0; /* value-dim blocks [0, kHalf) */
  const uint8_t *valid = smem + L::kValid;
  float *red = (float *)(smem + L::kRed); /* [4 warps][N]: column maxima per tile, then column sums */
  constexpr int kPB = L::kPBufs;
  float *alpha_s = (float *)(smem + L::kAlpha), *fac_s = alpha_s + kPB * N;
  constexpr bool kLazy = N < 64 || kHalf < 4; /* N = 64, 4 blocks: the lazy frame's tmax does not fit 256 registers */
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + kStages, *p_full = bars + 1 + 2 * kStages;
  uint64_t *fac_full = p_full + kPB;
  const int warp = t >> 5, lane = t & 31;
  float o[kHalf][NR]; /* O^T dims [0, 64 kHalf) x N heads */
  float sacc[NR];
#pragma unroll
  for (int m = 0; m < kHalf; ++m)
#pragma unroll
    for (int i = 0; i < NR; ++i) o[m][i] = 0.f;
#pragma unroll
  for (int i = 0; i < NR; ++i) sacc[i] = 0.f;
  float col_max[NC], col_sum[NC], tmax[NC]; /* as in small_consumer */
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    col_max[c] = -INFINITY;
    col_sum[c] = 0.f;
    tmax[c] = -INFINITY;
  }
  sm90_mbar_wait(q_full, 0);
  sm90_fence_proxy_async();
  const uint32_t sq = sm90_smem_addr(smem + L::kQ), sp = sm90_smem_addr(smem + L::kP);

  for (int n = 0; n < ntiles; ++n) {
    const int s = n % kStages;
    sm90_mbar_wait(&full[s], (uint32_t)(n / kStages) & 1);
    sm90_fence_proxy_async();
    const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTileBytes);
    small_issue_s<NB, N>(sacc, skv, sq, L::kQBlk);
    if (n > 0) { /* P V(n - 1) done: this WG is through with stage n - 1 */
      sm90_wgmma_wait<1>();
      small_fence_o<N, kHalf>(o);
      sm90_mbar_arrive(&empty[(n - 1) % kStages]);
    }
    sm90_wgmma_wait<0>();
    small_fence_acc<N>(sacc);

    float alpha[NC];
    float *x = sacc; /* P in place of S^T: sacc is rewritten by the next tile's S^T only */
    const bool moved = small_softmax<N, kLazy>(sacc, valid + s * kBlockK, args.scale_log2, warp, lane, red,
                                                     kBarMax, col_max, col_sum, alpha, x, tmax);
    /* P and alpha -> shared memory. WAR: one buffer: wait until WG 1 has finished P V(n - 1) (it read
     * P(n - 1) and alpha(n - 1) before issuing it); two: WG 1 finished P V(n - 2) before the producer
     * could refill stage s with tile n. This WG's own P V(n - 1) was retired above. */
    if (kPB == 1 && n > 0) sm90_mbar_wait(&empty[(n - 1) % kStages], (uint32_t)((n - 1) / kStages) & 1);
    const int pb = n % kPB;
    const uint32_t spn = sp + pb * (N * 128);
    small_store_p<N>(spn, x, warp, lane);
    if (warp == 0 && lane < 4) { /* lanes 0-3 of a warp hold every column once */
#pragma unroll
      for (int c = 0; c < NC; ++c) alpha_s[pb * N + small_col(c, lane)] = alpha[c];
    }
    sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> wgmma (async proxy) of both WGs */
    sm90_mbar_arrive(&p_full[pb]);
    sm90_named_bar_sync(kBarP, 128); /* this WG's P V reads the rows of every warp */

    if (moved) small_rescale_o<N, kHalf>(o, alpha); /* the frame moved: O follows (WG 1 votes on alpha) */
    small_issue_pv<N, kHalf, 0>(o, skv, spn); /* dims [0, 64 kHalf), not waited for here */
  }
  sm90_wgmma_wait<0>();
  small_fence_o<N, kHalf>(o);
  if (ntiles > 0) sm90_mbar_arrive(&empty[(ntiles - 1) % kStages]);

  float fac[NC];
  small_col_factors<N>(args, col_max, col_sum, kLazy ? tmax : nullptr, red, kBarMax, warp, lane, fac, fac_s);
  /* -> WG 1: fac_s written and every P V of this WG done (WG 1 may overwrite the KV stages with its
   * staged half). <- WG 1: its last P V done (the empty barrier of the last tile; it completes
   * every P V of WG 1, which retires them in order). An mbarrier, not a named barrier, so that
   * racecheck follows the hand-off (docs/reliability.md section 3c). */
  sm90_mbar_arrive(fac_full);
  if (ntiles > 0) sm90_mbar_wait(&empty[(ntiles - 1) % kStages], (uint32_t)((ntiles - 1) / kStages) & 1);
  uint8_t *stage = smem + L::kKV;
  small_stage_out<N, kHalf, 0>(stage, o, fac, warp, lane);
  sm90_named_bar_sync(kBarP, 128);
  small_copy_out<8 * kHalf>(args, stage, t, 0, N, 0);
}

/* SPLIT: consumer WG 1, O^T dims [64 kMB0, 512) from WG 0's P and alpha; then its part of the out rows. */
template <int NB, int N>
__device__ __forceinline__ void split_pv_consumer(const SmallArgs &args, uint8_t *smem, int t, int ntiles) {
  typedef SmallSmem<NB, N, true> L;
  constexpr int kStages = L::kStages;
  constexpr int kMB0 = SplitCfg<N>::kMB0;
  constexpr int NR = N / 2, NC = N / 4, kHalf = kDVBlocks - kMB0; /* value-dim blocks [kMB0, 8) */
  constexpr int kPB = L::kPBufs;
  const float *alpha_s = (const float *)(smem + L::kAlpha), *fac_s = alpha_s + kPB * N;
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *full = bars + 1, *empty = bars + 1 + kStages, *p_full = bars + 1 + 2 * kStages;
  uint64_t *fac_full = p_full + kPB;
  const int warp = t >> 5, lane = t & 31;
  float o[kHalf][NR]; /* O^T dims [64 kMB0, 512) x N heads */
#pragma unroll
  for (int m = 0; m < kHalf; ++m)
#pragma unroll
    for (int i = 0; i < NR; ++i) o[m][i] = 0.f;
  const uint32_t sp = sm90_smem_addr(smem + L::kP);

  for (int n = 0; n < ntiles; ++n) {
    const int s = n % kStages;
    sm90_mbar_wait(&full[s], (uint32_t)(n / kStages) & 1); /* complete already: WG 0 waited on it */
    const int pb = n % kPB;
    sm90_mbar_wait(&p_full[pb], (uint32_t)(n / kPB) & 1);
    sm90_fence_proxy_async();
    const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTileBytes);
    /* alpha = 1 when WG 0's frame did not move: a vote on the loaded alphas, which costs WG 0 nothing
     * (a flag from WG 0 measured slower: docs/perf.md) */
    float alpha[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) alpha[c] = alpha_s[pb * N + small_col(c, lane)];
    if (sm90_warp_any_factor<NC>(alpha)) small_rescale_o<N, kHalf>(o, alpha); /* else alpha = 1 in the warp */
    small_issue_pv<N, kHalf, kMB0>(o, skv, sp + pb * (N * 128)); /* dims [64 kMB0, 512) */
    sm90_wgmma_wait<0>();
    small_fence_o<N, kHalf>(o);
    sm90_mbar_arrive(&empty[s]); /* stage s, P(n) and alpha(n) are free as far as this WG goes */
  }
  /* WG 0's fac_s, and every P V of WG 0 done (this WG's staged half overlays the KV stages); this
   * WG's own P V all retired above */
  sm90_mbar_wait(fac_full, 0);
  float fac[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) fac[c] = fac_s[small_col(c, lane)];
  uint8_t *stage = smem + L::kKV;
  small_stage_out<N, kHalf, 64 * kMB0>(stage, o, fac, warp, lane);
  sm90_named_bar_sync(kBarP + 2, 128);
  small_copy_out<8 * kHalf>(args, stage, t, 0, N, 8 * kMB0);
}
#endif

template <int NB, int N, bool SPLIT>
__global__ void __launch_bounds__(SmallCfg<N>::kThreads, SmallCfg<N>::kCtas)
    attn_fwd_sm90_small_kernel(const __grid_constant__ SmallArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef SmallSmem<NB, N, SPLIT> L;
  typedef SmallCfg<N> C;
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  uint8_t *valid = smem + L::kValid;
  uint64_t *bars = (uint64_t *)(smem + L::kBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + L::kFullBars;

  const dsa_attn_fwd_params &p = args.p;
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  const int64_t tok = blockIdx.x;
  int klen = p.topk; /* slots [0, klen) may be valid; the rest never are */
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + kBlockK - 1) / kBlockK;

  if (tid == 0) {
    sm90_mbar_init(q_full, 128);
    if constexpr (L::kRing) {
      /* per landing group: 128 .noinc cp.async arrivals (+ 128 plain ones releasing the mask on group
       * 0); per block an empty: one arrival per consumer warp */
      for (int g = 0; g < 3; ++g) sm90_mbar_init(&full[g], g == 0 ? 256 : 128);
      for (int b = 0; b < NB; ++b) sm90_mbar_init(&empty[b], 4);
    } else {
      for (int s = 0; s < kStages; ++s) {
        sm90_mbar_init(&full[s], 256);
        sm90_mbar_init(&empty[s], 128 * C::kConsumers);
      }
    }
    if constexpr (SPLIT) {
      for (int b = 0; b <= L::kPBufs; ++b) sm90_mbar_init(bars + 1 + 2 * kStages + b, 128); /* p_full[], fac_full: WG 0 */
    }
    sm90_mbar_init_fence();
  }
  __syncthreads();

  if (wg == C::kConsumers) {
    /* ================= producer ================= */
    if constexpr (C::kTwoWG) sm90_setmaxnreg_dec<kProducerRegs>();
    if constexpr (C::kRegs) sm90_setmaxnreg_dec<kTwoProdRegs>();
    /* Thread (g, j): 16-B chunk j of every 64-column block of rows g, g+16, g+32, g+48 (rows 16
     * apart share r % 8: 8 consecutive threads fill one 128-B swizzled row piece, conflict free). */
    const int g = t >> 3, j = t & 7;
    const uint32_t sq = sm90_smem_addr(smem + L::kQ);
    const int Hc = args.head_count;
#pragma unroll
    for (int i = 0; i < (N + 15) / 16; ++i) {
      const int r = g + 16 * i;
      if (r < N) {
        const bool ok = r < Hc; /* columns head_count..N-1: zero rows, never written out */
        const uint16_t *src =
            p.q + tok * p.q_stride_token + (int64_t)(args.head_begin + (ok ? r : 0)) * p.q_stride_head + j * 8;
#pragma unroll
        for (int b = 0; b < NB; ++b)
          sm90_cp_async16(sq + b * L::kQBlk + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u);
      }
    }
    sm90_cp_async_mbar_arrive_noinc(q_full);

    const int32_t *irow = p.indices + tok * p.indices_stride;
    /* tile n's indices are read right after tile n - 1's copies are issued, before tile n's wait
     * (the latency overlaps the consumers' work); the same order as reading them at the loop head */
    int32_t idxs[4];
    sm90_gather_read_indices(irow, 0, g, klen, idxs);
    const uint64_t pol = sm90_l2_policy(args.kv_evict_last != 0);
    if constexpr (C::kRing) {
      for (int n = 0; n < ntiles; ++n) {
        /* parity ((n & 1) ^ 1): the first fill's waits return at once; the mask of tile n goes to
         * buffer n & 1 (the consumer read tile n - 2's before it freed any block of tile n - 1) */
        small_ring_gather<NB, L::kPInRope>(sm90_smem_addr(smem + L::kKV), valid + (n & 1) * kBlockK, idxs, g, j, p.kv, p.kv_stride,
                              p.num_kv, p.q, pol, full, empty, ((uint32_t)n & 1) ^ 1);
        sm90_gather_read_indices(irow, n + 1, g, klen, idxs); /* -1 past klen */
      }
    } else {
      for (int n = 0; n < ntiles; ++n) {
        const int s = n % kStages;
        const uint32_t use = (uint32_t)(n / kStages);
        sm90_mbar_wait(&empty[s], (use & 1) ^ 1); /* first use of a stage: parity 1 returns at once */
        const uint32_t skv = sm90_smem_addr(smem + L::kKV + s * L::kTileBytes);
        sm90_gather_kv_rows<NB>(skv, valid + s * kBlockK, idxs, g, j, p.kv, p.kv_stride, p.num_kv, p.q, pol);
        sm90_cp_async_mbar_arrive_noinc(&full[s]); /* fires when this thread's copies have landed */
        sm90_mbar_arrive(&full[s]);                /* releases the mask bytes written above */
        sm90_gather_read_indices(irow, n + 1, g, klen, idxs); /* -1 past klen */
      }
    }
    sm90_cp_async_wait_all();
  } else if constexpr (!C::kTwoWG) {
    /* ================= consumer (all N columns) ================= */
    if constexpr (C::kRegs) sm90_setmaxnreg_inc<kTwoConsRegs>();
    small_consumer<NB, N>(args, smem, t, ntiles);
  } else {
    /* ================= consumers: WG0 S^T, softmax, value dims [0, 64 kMB0); WG1 the rest ===== */
    if (wg == 0) {
      sm90_setmaxnreg_inc<kSplitSRegs>();
      split_s_consumer<NB, N>(args, smem, t, ntiles);
    } else {
      sm90_setmaxnreg_inc<kSplitPVRegs>();
      split_pv_consumer<NB, N>(args, smem, t, ntiles);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run silently (the launcher also checks cc 9.0) */
#endif
}

/* One instantiation per (head dim D = 64 NB, N = head count rounded up to 8). */
template <int NB, int N, bool SPLIT>
dsa_status launch(const dsa_context *ctx, const dsa_attn_fwd_params *p, int head_begin, int head_count,
                  cudaStream_t stream) {
  const char *fn = "dsa_sparse_attn_fwd";
  const int smem_bytes = SmallSmem<NB, N, SPLIT>::kBytes;
  if (smem_bytes > ctx->max_smem_optin)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H kernel needs %d bytes of shared memory, device has %d", fn,
                    smem_bytes, ctx->max_smem_optin);
  /* two CTAs per SM need the largest shared-memory carveout */
  static int attr_set[DSA_TRACKED_DEVICES]; /* per instantiation: the smem limit set per device */
  DSA_TRY(dsa_kernel_smem_once((const void *)attn_fwd_sm90_small_kernel<NB, N, SPLIT>, smem_bytes,
                               SmallCfg<N>::kCtas > 1, ctx->device, attr_set, fn));
  SmallArgs args;
  args.p = *p;
  args.scale_log2 = p->softmax_scale * kLog2e;
  args.out_vec16 = dsa_rows_16b_aligned(p->out, p->out_stride_token, p->out_stride_head);
  args.head_begin = head_begin;
  args.head_count = head_count;
  args.kv_evict_last = dsa_fwd_kv_evict_last(ctx, p);
  attn_fwd_sm90_small_kernel<NB, N, SPLIT><<<(unsigned)p->num_tokens, SmallCfg<N>::kThreads, smem_bytes, stream>>>(args);
  return dsa_cuda_status((int)cudaGetLastError(), fn);
}

template <int NB>
dsa_status launch_nb(const dsa_context *ctx, const dsa_attn_fwd_params *p, int head_begin, int head_count,
                     cudaStream_t stream) {
  switch ((head_count + 7) / 8) {
    case 1: return launch<NB, 8, false>(ctx, p, head_begin, head_count, stream);
    case 2: return launch<NB, 16, false>(ctx, p, head_begin, head_count, stream);
    case 3: return launch<NB, 24, false>(ctx, p, head_begin, head_count, stream);
    case 4: return launch<NB, 32, false>(ctx, p, head_begin, head_count, stream);
    case 5: return launch<NB, 40, true>(ctx, p, head_begin, head_count, stream);
    case 6: return launch<NB, 48, true>(ctx, p, head_begin, head_count, stream);
    case 7: return launch<NB, 56, true>(ctx, p, head_begin, head_count, stream);
    default: return launch<NB, 64, true>(ctx, p, head_begin, head_count, stream);
  }
}

}  // namespace

extern "C" dsa_status dsa_fwd_launch_sm90_small(const dsa_context *ctx, const dsa_attn_fwd_params *p, int head_begin,
                                                int head_count, cudaStream_t stream) {
  const char *fn = "dsa_sparse_attn_fwd";
  if (!(ctx->cc_major == 9 && ctx->cc_minor == 0))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H kernel needs compute capability 9.0, device has %d.%d", fn,
                    ctx->cc_major, ctx->cc_minor);
  if (p->head_dim != 576 && p->head_dim != 512)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a small-H kernel supports head_dim 576 or 512, not %d", fn,
                    (int)p->head_dim);
  if (head_count < 1 || head_count > kMaxN || head_begin < 0 || head_begin > p->num_heads - head_count)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H kernel runs 1..%d heads per launch, not heads [%d, %d) of %d", fn,
                    kMaxN, head_begin, head_begin + head_count, (int)p->num_heads);
  /* cp.async moves 16 B: q / kv rows must start 16-B aligned. out is written at least 4 B at a time. */
  if (((uintptr_t)p->q & 15) || ((uintptr_t)p->kv & 15) || (p->q_stride_token & 7) || (p->q_stride_head & 7) ||
      (p->kv_stride & 7))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H kernel needs 16-byte aligned q / kv rows (q_stride_token = %lld, "
                    "q_stride_head = %lld, kv_stride = %lld)",
                    fn, (long long)p->q_stride_token, (long long)p->q_stride_head, (long long)p->kv_stride);
  if (((uintptr_t)p->out & 3) || (p->out_stride_token & 1) || (p->out_stride_head & 1))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a small-H kernel needs 4-byte aligned out rows (out_stride_token = %lld, "
                    "out_stride_head = %lld)",
                    fn, (long long)p->out_stride_token, (long long)p->out_stride_head);
  if (p->num_tokens <= 0) return DSA_SUCCESS;
  if (p->num_tokens > (int64_t)0x7fffffff)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a small-H kernel handles at most %d tokens, not %lld", fn,
                    0x7fffffff, (long long)p->num_tokens);
  return p->head_dim == 576 ? launch_nb<9>(ctx, p, head_begin, head_count, stream)
                             : launch_nb<8>(ctx, p, head_begin, head_count, stream);
}
