/*
 * bwd_sm90_ws.cu - sparse MLA attention backward on sm_90a, warp-specialised, 64 heads per CTA
 * (dsa_bwd_launch_sm90_ws, cuda/attn_bwd/bwd_launch.cuh; the design: docs/bwd-sm90-v3.md part II): the
 * automatic choice of both modes on cc 9.0 at every H (DSA_BWD_KERNEL_SM90_WS, 4, include/dsa_tune.h,
 * forces it). Non-deterministic: fp32 L2 reductions into the permuted dKV accumulator, 128-B row
 * segments per warp instruction. Deterministic: the same instructions as plain stores of every slot's
 * fp32 dKV row to a chunk buffer (kDet; below), at the slot's rank in the chunk's sort by kv row,
 * then summed per kv row in that fixed order (cuda/attn_bwd/bwd_common.cuh).
 *
 * Why: the lockstep kernel (cuda/attn_bwd/bwd_sm90_h64.cu) issues each tile's 147 KB of dKV reductions in a
 * burst after all of its MMAs, so the SM's share of the L2 reduction stream idles ~40% of the tile.
 * Here one warpgroup (WG1) does nothing but dKV and the upper part of dQ and keeps the reductions
 * streaming: each chunk's reductions are issued while the next chunk's wgmmas run; the other (WG0)
 * gathers, computes S / dP / softmax / dS and the lower part of dQ underneath.
 *
 * Same math, workspace, small passes and checks as dsa_bwd_launch_sm90_h64 in the non-deterministic
 * mode (memset of acc; main; bwd_convert_lay1_kernel; dsink; all from cuda/attn_bwd/bwd_common.cuh),
 * so the op's workspace size (cuda/attn_bwd/dispatch.cu) holds. Pieces shared with that kernel (tile
 * constants, Smem map, MainArgs and its fill, P / dS, Q / dO and L' / Delta loads, dq store, launch checks) are in
 * cuda/attn_bwd/bwd_sm90_shared.cuh.
 * No prep pass for the row statistics: each CTA sums its rows' Delta from out and the dO it loads and
 * computes L' and the dsink partials (bwd_row_stats) in its prologue (ws_stats_issue /
 * ws_stats_finish), which spares a pass over out and dout before the main kernel; the prep runs only
 * without topk_length, for the row lengths. Split tail (non-deterministic mode): the last S tokens of
 * the CTA order (bwd_split_tokens: about one wave of CTAs) run as two CTAs each, one per half of the
 * row's tiles, so that the last wave's CTAs are half as long; each half stores its fp32 dQ partial
 * (ws_dq_out) and ws_dq_combine_kernel writes their sum to dq.
 * Declined with DSA_ERROR_UNSUPPORTED before any launch: everything bwd_sm90_check declines (a device
 * other than cc 9.0, D not 576 / 512, H outside 1..128, unaligned rows, too many tokens, smem above
 * the opt-in). No fallback: a forced kernel that declines returns the error (cuda/attn_bwd/dispatch.cu).
 *
 * Deterministic mode (kDet; ws_launch): tokens run in chunks of C (bwd_det_layout's C, rounded down to
 * whole waves of sm_count / ceil(H / 64) tokens: bwd_det_run_chunk), the part-filled chunk first. Per
 * chunk: bwd_det_sort_pos sorts the chunk's (token, slot) entries stably by kv row (the keys kernel
 * marks every invalid slot with the sentinel T_kv, sorted last) and writes each entry's rank to
 * det_pos; the kernel sees the chunk's tokens as 0..C-1 (ws_chunk_args moves every per-token pointer)
 * and WG1 stores each tile's 64 x D fp32 rows, as computed for the reductions and in the same
 * permuted column order, to contrib rows det_pos[entry] ceil(H / 64) + head block (a partial last
 * tile's slots past K: one of 64 dump rows after the entries'), so every kv row's contributions lie
 * in one contiguous run in sorted order; bwd_det_reduce_sorted then adds each run into acc[r] in
 * order, column by column (acc keeps the permuted order, which bwd_convert_lay1_kernel undoes): the
 * reads stream instead of gathering 2304-B rows. Every fp32 sum runs in ascending (token,
 * slot, head block) order whatever C is: bitwise reproducible run to run and across chunk sizes. dq,
 * the slot target (at most two adds per slot, which commute) and dsink are those of the
 * non-deterministic mode, which are reproducible already. The rows' DRAM traffic (2304 B per valid
 * slot and head block written, then read back) bounds the mode.
 *
 * Grid: one CTA per (token, block of 64 heads), non-persistent, blockIdx order = token order (H = 128:
 * the two head blocks of a token adjacent); heads past H are zero rows with L' = +inf (P = dS = 0,
 * never written). 256 threads, __launch_bounds__(256, 1), templated on NBT = D / 64 (9 or 8).
 * Tile = 64 heads (wgmma M) x 64 keys.
 *
 * Tile order: a row's tiles run 0, 1, .., ntiles - 1, or, with args.sweep (the non-deterministic mode
 * where the accumulator exceeds half the L2: ws_launch), from tile phi = ws_sweep_phase around to
 * phi - 1: every resident CTA then works on the same part of its row at once (g_ws_sweep_tiles). Step
 * n below (tile n, gather(n + 1)) is the n-th tile in that order; in the non-deterministic mode only
 * WG0 (the gather's indices, the slot target's slots) needs the tile's index. The deterministic mode's
 * WG1 reads det_pos at slot 64 n + r: there the order must stay 0, 1, .. (phi = 0, never swept). WG0
 * hands phi from thread 0 to its other threads through spart and one extra kBarKV (128) before the
 * prologue's gather.
 *
 * Roles, per 64-key tile n (s = n & 1):
 *   WG0 (threads 0..127, "front"):
 *     1. cp.async.wait_all + fence.proxy.async + bar.sync kBarKV (128): KV(n) landed and idx[s] (plain
 *        shared stores) written by every WG0 thread (tile 0: before the role split, with Q / dO).
 *     2. S = Q K^T: 4 NBT SS m64n64k16; dP = dO V^T: 32 SS m64n64k16 (both K-major; all 64 keys);
 *        one commit, wait<0>.
 *     3. P = exp2(S scale log2e - L' log2e) (0 for invalid slots), dS = scale P (dP - Delta); packed to
 *        bf16 pairs (pp, dsp: 16 registers each, the stmatrix and RS-A register order). With the
 *        optional slot target (p.slot_target, zeroed by the launcher): P summed over the 64 head rows
 *        per key (ws_target_tile: shuffles, spart, named barrier kBarTgt) and added to the slot.
 *     4. dQ[:, 0:256) += dS K[:, 0:256): 4 RS m64n256k16 (A = dsp, B = KV MN-major), wait<0>.
 *     5. n > 0: bar.sync kBarPdSFree. stmatrix P, dS (4 x4 each) -> fence.proxy.async ->
 *        bar.arrive kBarPdSFull.
 *     6. n + 1 < ntiles: bar.sync kBarKVFree, then gather(n + 1): 4 NBT cp.async.cg 16 B per thread
 *        (rows g, g + 16, g + 32, g + 48), kv indices to idx[s ^ 1].
 *     After the loop: dq dims [0, 256) from registers (128 fp32).
 *   WG1 (threads 128..255, "back"):
 *     1. bar.sync kBarPdSFull; this thread's key rows kr (idx[s][r0], [r0 + 8]) and lane ^ 4's (the
 *        deterministic mode reads no idx: its rows are contrib rows from det_pos).
 *     2. dQ[:, 256:D) += dS K[:, 256:D): 4 SS m64n256k16 (+ 4 SS m64n64k16 at D = 576; A = sdS
 *        K-major, B = KV MN-major), wait<0>; n + 1 < ntiles: bar.arrive kBarKVFree.
 *     3. dKV chunks c = 0..NBT-1 (64 dims each; D = 576: c = 8 is the rope block, dS^T Q only): chunk c
 *        into accumulator c % 2 (acc0 / acc1, 32 fp32 each): 4 SS m64n64k16 dS^T Q[:, c] (+ 4 P^T
 *        dO[:, c] for c < 8), tA = tB = 1, first one scale-d 0; commit; for c > 0: wait<1> (chunk c - 1
 *        done, chunk c still running) and chunk c - 1's reductions into the permuted accumulator
 *        (sm90_red_block_lay1: 8 red.global.add.v4.f32 + 16 shfl.xor 4 per thread, 4 rows x 128 B per
 *        warp instruction). After the last chunk: wait<0>, n + 1 < ntiles: bar.arrive kBarPdSFree,
 *        its reductions.
 *     After the loop: dq dims [256, D) from registers (160 / 128 fp32).
 *
 * Shared memory (Smem<NBT>, cuda/attn_bwd/bwd_sm90_shared.cuh; 1024-B aligned SW128 tiles
 * [rows][64-column blocks of 8 KB]): Q [64 x D] 72 / 64 KB at 0, dO [64 x 512] 64 KB, KV [64 x D] 72 / 64 KB (single
 * buffer), P, dS [64 heads x 64 keys] 8 KB each, idx int32 [2][64], L' log2e [64], Delta [64], and
 * after the map spart f32 [4][64] (the slot target's per-warp sums): 231424 / 215040 B + 1024 B
 * alignment slack = 232448 / 216064 B, the whole 232448 B opt-in at D = 576. No mbarriers.
 *
 * Barrier protocol (named barriers, non-.aligned barrier.sync / barrier.arrive; 256 = both WGs, the
 * waiting side syncs, the other arrives): kBarPdSFull 1 (WG0 arrives, WG1 syncs, every tile),
 * kBarPdSFree 2 (WG1 arrives after tile n for n < ntiles - 1; WG0 syncs before storing P / dS of tile
 * n >= 1), kBarKVFree 3 (WG1 arrives after its dQ wgmmas of tile n for n < ntiles - 1; WG0 syncs before
 * gather(n + 1)), kBarKV 4 and kBarTgt 5 (WG0 only, 128; spart is rewritten only after the next
 * tile's kBarKV, which every WG0 thread reaches after its reads of it). Arrivals and syncs pair up one
 * to one per tile, so no barrier is left half-arrived at exit. Why there is no race:
 *   - P / dS smem: written only by WG0's stmatrix of tile n, after kBarPdSFree(n - 1), which WG1 arrives
 *     after wait<0> on its last chunk of tile n - 1 (every wgmma reading P / dS(n - 1), the dQ ones
 *     waited earlier, has completed). Read by WG1 only after kBarPdSFull(n), which WG0 arrives after its
 *     stmatrix + fence.proxy.async (generic -> async proxy).
 *   - KV smem and idx[s ^ 1]: written only by WG0's gather(n + 1), after kBarKVFree(n), which WG1
 *     arrives after wait<0> on its dQ wgmmas of tile n; every WG0 warp reads all of KV(n) (S, dP, dQ
 *     RS) and syncs kBarKVFree(n) (256 threads) only after its own wait<0>, so no warp's gather starts
 *     before all four WG0 warps' reads retired. idx[s ^ 1] = idx of tile n - 1: WG0 read it in tile n - 1, WG1 read it right after
 *     kBarPdSFull(n - 1), before arriving kBarKVFree(n - 1). The copies land before WG0 reads them
 *     (each thread's cp.async.wait_all + fence.proxy.async, then kBarKV) and before WG1 reads them
 *     (WG0 arrives kBarPdSFull(n + 1) after that wait: the barrier orders every WG0 thread's landed
 *     copies and idx stores before WG1's reads).
 *   - Q, dO, L', Delta: written once before the __syncthreads that precedes the role split (a CTA
 *     without tiles skips that prologue; WG0's loads of L' / Delta before its tile loop then read
 *     values nothing uses).
 *   - No lapping: WG1 arrives kBarKVFree(n + 1) / kBarPdSFree(n + 1) only after kBarPdSFull(n + 1),
 *     which WG0 arrives only after it passed kBarKVFree(n) and kBarPdSFree(n); WG0 arrives
 *     kBarPdSFull(n + 1) only after kBarPdSFree(n), which WG1 arrives after its kBarPdSFull(n). So
 *     each barrier has at most one phase in flight.
 *   - Registers: the RS wgmma's A registers (dsp) are read by stmatrix only after its wait<0>; the
 *     reductions read accumulator (c - 1) % 2 only after wait<1> retired chunk c - 1, and chunk c + 1
 *     writes that accumulator only after a wgmma.fence that follows those reads.
 * dev/bwd_ws_model.py (CI) checks the shared-memory part of this per warp under random interleavings
 * (racecheck cannot follow the arrive / sync hand-offs: docs/reliability.md section 3c).
 *
 * Registers (ptxas, nvcc 13, -Xptxas -v, __launch_bounds__(256, 1), both warpgroups share one
 * allocation): D = 576 252 registers (deterministic 255), D = 512 249 (250); 0 spill
 * bytes, no C7510 / C7511 / C7515 / C7519 (no serialised wgmma, no injected warpgroup.arrive), 6 named
 * barriers. 252 and 255 of 255 leave no headroom at D = 576: recheck spills after any change to WG1's loop
 * (the dq store re-reads %ctaid instead of keeping token / head live, which would spill 4 B).
 * Live fp32 at the peak: WG1 dQ 160 + 2 x 32 dKV = 224 (D = 512: 192); WG0 dQ 128 + S 32 + dP 32 = 192.
 *
 * What sets the tile time: the larger of WG1's instruction stream (one warp per SM sub-partition,
 * nothing to switch to: ~7-8 cycles per instruction; the chunk loop is ~1250 static instructions) and
 * the SM's share of the L2 reduction stream (147 KB per tile); the two are close, so WG1 stays lean:
 * every wgmma descriptor is one add on one base register (sm90_desc_at), each reduced value costs three
 * selects and one shuffle (sm90_red_block_lay1), a key row's two accumulator row pointers are the only
 * per-chunk address arithmetic, and no reduction is behind a branch (ws_gather's ~f rows)
 * (docs/bwd-sm90-v3.md part III).
 * Later steps (docs/bwd-sm90-v3.md part II section 5): persistent LPT grid, a kv_full mbarrier instead
 * of WG0's cp.async.wait, Q / dO by TMA with evict_first, softmax under dP (wait<1>).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "attn_bwd/bwd_launch.cuh"
#include "attn_bwd/bwd_common.cuh"       /* prep, convert (permuted accumulator), dsink, workspace regions */
#include "attn_bwd/bwd_sm90_shared.cuh" /* Smem, MainArgs, P / dS, reductions, Q / dO load, dq, checks */

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Named barriers (0 is __syncthreads). The three hand-offs count 256 threads: one warpgroup syncs
 * (waits), the other arrives (does not wait); kBarKV is WG0's own (128). */
constexpr int kBarPdSFull = 1; /* WG0 -> WG1: P(n), dS(n) in smem, KV(n) and idx(n) landed */
constexpr int kBarPdSFree = 2; /* WG1 -> WG0: WG1's wgmmas reading P(n), dS(n) have completed */
constexpr int kBarKVFree = 3;  /* WG1 -> WG0: WG1's dQ wgmmas reading KV(n) have completed */
constexpr int kBarKV = 4;      /* WG0: every WG0 thread's copies of KV(n), idx(n) landed and fenced */
constexpr int kBarTgt = 5;     /* WG0: the four warps' slot-target partial sums in spart */
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* The sweep (MainArgs::sweep): tiles finished by the sweeping CTAs of every launch (it wraps, and
 * concurrent launches share it: it only sets a phase). A CTA starts its row at tile (finished /
 * resident CTAs) mod ntiles, the tile index the resident CTAs are at, so they all work on the same part
 * of their rows at once; with ascending rows (the indexer's output, causal subsets) the keys they
 * gather and reduce into then stay a narrow window of KV and of the accumulator, which L2 holds where
 * the whole accumulator would not. The order of a row's tiles changes only dq's fp32 summation order. */
/* Declared in every compilation pass: nvcc registers a __device__ variable from the host pass too,
 * and a declaration seen only by the sm_90a pass leaves the registration naming an undefined symbol
 * in a build for sm_90a alone. */
__device__ uint32_t g_ws_sweep_tiles;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void ws_sweep_add() { atomicAdd(&g_ws_sweep_tiles, 1u); }
__device__ __forceinline__ uint32_t ws_sweep_read() { return *(volatile uint32_t *)&g_ws_sweep_tiles; }
__device__ __forceinline__ uint32_t ws_sweep_phase(uint32_t swept, int ntiles) {
  uint32_t nsm;
  asm("mov.u32 %0, %%nsmid;\n" : "=r"(nsm));
  const uint32_t r = gridDim.x < nsm ? gridDim.x : nsm;
  return (swept / (r > 0 ? r : 1u)) % (uint32_t)ntiles;
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* This kernel's shared memory: the Smem<NBT> map, then spart, f32 [4][64] (the slot target's per-warp
 * column sums), at the map's end: 232448 / 216064 B with the alignment slack (the D = 576 one is the
 * whole 227 KB opt-in). */
template <int NBT>
constexpr int kWsTgt = Smem<NBT>::kEnd;
template <int NBT>
constexpr int kWsBytes = Smem<NBT>::kBytes + 4 * kBlockN * 4;
static_assert(kWsBytes<9> == 232448 && kWsBytes<8> == 216064, "the sizes the comments quote");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Arrive on named barrier `id` without waiting (non-.aligned: the two warpgroups reach a barrier from
 * different code, as sm90_named_bar_sync_any). Release: this thread's earlier memory accesses are
 * performed relative to the threads that the barrier's completion releases. */
__device__ __forceinline__ void ws_bar_arrive(int id, int count) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}



/* The split tail (bwd_split_tokens, cuda/attn_bwd/bwd_common.cuh): the S split tokens are the last S
 * of the CTA order; split index i -> its token. */
__device__ __forceinline__ int64_t ws_split_token(int64_t i, int64_t S, int64_t T) {
  return T - S + i;
}

/* CTA b -> (token, first head, half, split index): CTAs from split_cta0 are half h = 0 (tiles [0,
 * ceil(n / 2))) or 1 (the rest) of split token i, in the order (h, i, head block); the others as
 * ws_token_of / the default order, half -1. */
__device__ __forceinline__ void ws_cta_decode(const MainArgs &args, uint32_t b, int64_t *tok, int *h0, int *half,
                                              int *si) {
  const int nhb = args.num_hblocks;
  if ((int64_t)b >= args.split_cta0) {
    const uint32_t r = b - (uint32_t)args.split_cta0, per = (uint32_t)args.split_tokens * (uint32_t)nhb;
    const uint32_t hf = r / per, q = r - hf * per, i = q / (uint32_t)nhb;
    *half = (int)hf;
    *si = (int)i;
    *h0 = (int)(q - i * (uint32_t)nhb) * kBlockM;
    *tok = ws_split_token(i, args.split_tokens, args.p.num_tokens);
    return;
  }
  *half = -1;
  *si = 0;
  *tok = (int64_t)(b / (uint32_t)nhb);
  *h0 = (int)(b % (uint32_t)nhb) * kBlockM;
}

/* A warpgroup's dQ accumulator out after the tile loop (the CTA re-derived from %ctaid, as
 * ws_cta_token_head): bf16 dq rows (bwd_sm90_store_dq), or for a split token's half its fp32
 * partial rows dq_part[half][i][h][D], dims [64 B0, 64 B0 + 2 kDQ), heads below H, with
 * bwd_sm90_store_dq's fragment walk (a shared walk taking a store lambda costs the default kernels
 * ~1000 instructions: the captured accumulator is no longer register-resident). */
template <int kDQ, int B0, int kD>
__device__ __forceinline__ void ws_dq_out(const MainArgs &args, const float *dq, int warp, int lane) {
  uint32_t b;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(b));
  int64_t tok;
  int h0, half, si;
  ws_cta_decode(args, b, &tok, &h0, &half, &si);
  if (half < 0) {
    bwd_sm90_store_dq<kDQ, B0>(args.p, dq, tok, h0, warp, lane);
    return;
  }
  const int H = args.p.num_heads, r0 = 16 * warp + (lane >> 2);
  float *base = args.dq_part + ((int64_t)half * args.split_tokens + si) * H * kD + 64 * B0 + 2 * (lane & 3);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int h = h0 + r0 + 8 * hr;
    if (h >= H) continue;
    float *orow = base + (int64_t)h * kD;
#pragma unroll
    for (int cc = 0; cc < kDQ / 4; ++cc) {
      const int i = 4 * cc + 2 * hr;
      *(float2 *)(orow + 8 * cc) = make_float2(dq[i], dq[i + 1]);
    }
  }
}

/* The slot target's share of one tile (p.slot_target non-NULL): WG0's P summed over the CTA's 64 head
 * rows per key column, added to target[tok][64 n + c] for the valid slots (the launcher zeroes the
 * target first; a key column gets one add per head block, at most two, and (0 + a) + b = a + b in
 * either order, so the result does not depend on which block adds first).
 * Per warp: each thread adds its two rows, then sm90_warp_colsum64 leaves lane l with columns 2l,
 * 2l + 1 of the warp's 16 rows; the four warps' sums meet in spart [4][64] (named barrier kBarTgt)
 * and thread c < 64 adds them in warp order. Fixed order throughout: bitwise reproducible. */
__device__ __forceinline__ void ws_target_tile(const dsa_attn_bwd_params &p, const float *pv, float *spart,
                                               const int32_t *tidx, int64_t tok, int n, int t, int warp,
                                               int lane) {
  float v[16], z[2];
#pragma unroll
  for (int cc = 0; cc < 8; ++cc)
#pragma unroll
    for (int e = 0; e < 2; ++e) v[2 * cc + e] = pv[4 * cc + e] + pv[4 * cc + 2 + e];
  sm90_warp_colsum64(v, lane, z);
  *(float2 *)(spart + 64 * warp + 2 * lane) = make_float2(z[0], z[1]);
  sm90_named_bar_sync(kBarTgt, 128);
  if (t < kBlockN && tidx[t] >= 0) {
    const float a = ((spart[t] + spart[64 + t]) + spart[128 + t]) + spart[192 + t];
    atomicAdd(p.slot_target + tok * p.slot_target_stride + kBlockN * n + t, a);
  }
}

/* The prologue's row statistics (no prep pass): Delta = out . dO over the 512 value dims of each of
 * the CTA's 64 head rows, L' and the dsink partial (bwd_row_stats), for a row with a valid slot in
 * [0, klen). Thread (r = tid / 4, q = tid % 4) takes the 16-B chunks q + 4 i (i < 16) of head row
 * h0 + r. ws_stats_issue runs before the barrier that lands Q / dO: it loads this thread's out chunks
 * (16-B streaming loads: the op's checks require 16-B aligned out rows; zeros past H), the row's lse and
 * sink (q = 0) and tests its share of the index row's slots; ws_stats_finish runs after it, with
 * `any` the barrier's OR of the tests: dO chunks from the SW128 tile, the sum over the thread's 128
 * dims, then over the row's 4 threads; thread q = 0 writes L' log2e (+inf past H) and Delta to smem
 * and the partial to args.part. */
struct WsStats {
  uint4 o[16];
  float lse, sink;
  int any;
};

__device__ __forceinline__ void ws_stats_issue(const MainArgs &args, int64_t tok, int h0, int klen, WsStats &st) {
  const dsa_attn_bwd_params &p = args.p;
  const int tid = threadIdx.x, q = tid & 3, h = h0 + (tid >> 2);
  const bool live = h < p.num_heads;
  const uint16_t *src = p.out + tok * p.out_stride_token + (int64_t)(live ? h : 0) * p.out_stride_head + 8 * q;
#pragma unroll
  for (int i = 0; i < 16; ++i) st.o[i] = live ? __ldcs((const uint4 *)(src + 32 * i)) : make_uint4(0u, 0u, 0u, 0u);
  st.lse = live && q == 0 ? __ldg(p.lse + tok * p.num_heads + h) : 0.f;
  st.sink = live && q == 0 && p.sink ? __ldg(p.sink + h) : -INFINITY;
  const int32_t *irow = p.indices + tok * p.indices_stride;
  int any = 0;
#pragma unroll 4
  for (int j = tid; j < klen; j += kThreads) {
    const int v = __ldg(irow + j);
    any |= v >= 0 && (int64_t)v < p.num_kv;
  }
  st.any = any;
}

__device__ __forceinline__ float ws_dot8(uint4 a, uint4 b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    s = fmaf(__uint_as_float(x[e] << 16), __uint_as_float(y[e] << 16), s);
    s = fmaf(__uint_as_float(x[e] & 0xffff0000u), __uint_as_float(y[e] & 0xffff0000u), s);
  }
  return s;
}

template <int NBT>
__device__ __forceinline__ void ws_stats_finish(const MainArgs &args, uint8_t *smem, int64_t tok, int h0, bool any,
                                                bool write_part, const WsStats &st) {
  typedef Smem<NBT> L;
  const dsa_attn_bwd_params &p = args.p;
  const int tid = threadIdx.x, q = tid & 3, r = tid >> 2, h = h0 + r;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int c = q + 4 * i;
    const uint4 d = *(const uint4 *)(smem + L::kDO + (c >> 3) * kBlkBytes + sm90_sw128_chunk_off(r, c & 7));
    s += ws_dot8(st.o[i], d);
  }
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  if (q == 0) {
    const bool live = h < p.num_heads;
    float Lp, pt;
    bwd_row_stats(st.lse, st.sink, any, s, &Lp, &pt);
    ((float *)(smem + L::kLp))[r] = live ? Lp * kLog2e : INFINITY; /* +inf * log2e = +inf */
    ((float *)(smem + L::kDelta))[r] = live ? s : 0.f;
    if (args.part != nullptr && live && write_part) args.part[tok * p.num_heads + h] = pt;
  }
}

/* WG0's gather of one 64-key tile into the SW128 KV tile at skv (rows g, g + 16, g + 32, g + 48 of
 * thread (g = t / 8, j = t % 8), 4 NBT cp.async per thread, zero fill for invalid slots: idxs -1 past
 * the row's length) and of the tile's kv indices into tidx. An invalid slot's entry is ~f (negative, so
 * WG0's masks and the slot target's tests see it as invalid), f one of the accumulator's spare rows
 * after its T_kv real ones (T_kv + (64 blockIdx.x + r) % kBwdSpareRows): WG1 decodes it once per tile
 * and reduces the slot's zeros into row f with no test and no branch per reduction; a per-reduction
 * `row < 0` test made every reduction its own branch region, which kept ptxas from batching a block's
 * shuffles ahead of its reds. The spare rows are never read, so a NaN from 0 * (non-finite q / dO)
 * reaches no real dkv row (docs/design.md "NaN and infinity"). */
template <int NBT>
__device__ __forceinline__ void ws_gather(const dsa_attn_bwd_params &p, uint32_t skv, int32_t *tidx,
                                          const int32_t idxs[4], int g, int j) {
  const uint32_t base = (uint32_t)min(p.num_kv, (int64_t)INT32_MAX - kBwdSpareRows);
  sm90_gather_tile_idx<NBT, true>(skv, tidx, idxs, g, j, p.kv, p.kv_stride, p.num_kv, p.q, (uint32_t)blockIdx.x * 64u,
                                  (uint32_t)kBwdSpareRows, base);
}

/* Issues dKV chunk c = dims [64 c, 64 c + 64) of the tile's 64 key rows into acc: dS^T Q (+ P^T dO for
 * c < 8), keys on M; A = dS / P tile read M-major (tA = 1: +2048 B per k16 of heads, SBO 1024, LBO 8192
 * unused for one 64-key block), B = Q / dO block c read MN-major (tB = 1); the first wgmma overwrites
 * (scale-d 0). No fence / commit / wait: the caller's. */
template <int NBT>
__device__ __forceinline__ void ws_dkv_chunk(float *acc, uint32_t b4, int c) {
  typedef Smem<NBT> L;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90_wgmma_ss_m64n64k16<1, 1>(acc, sm90_desc_at(b4, L::kDS + kk * 2048, kBlkBytes, 1024),
                                  sm90_desc_at(b4, L::kQ + c * kBlkBytes + kk * 2048, kBlkBytes, 1024), kk != 0);
  if (c < kNBV) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90_wgmma_ss_m64n64k16<1, 1>(acc, sm90_desc_at(b4, L::kP + kk * 2048, kBlkBytes, 1024),
                                    sm90_desc_at(b4, L::kDO + c * kBlkBytes + kk * 2048, kBlkBytes, 1024), 1);
  }
}

/* WG0 ("front"): gather, S, dP, P / dS, dQ dims [0, 256) by RS wgmma, P / dS to smem. */
template <int NBT>
__device__ __forceinline__ void ws_front(const MainArgs &args, uint8_t *smem, int ntiles, int64_t tok, int h0,
                                         int klen
                                         , int k0 /* first slot of this CTA's tiles (a multiple of 64) */
                                         , int phi /* the first tile; tiles phi, phi + 1, .. mod ntiles */
) {
  typedef Smem<NBT> L;
  const dsa_attn_bwd_params &p = args.p;
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const int g = t >> 3, j = t & 7;
  const uint32_t sq = sm90_smem_addr(smem + L::kQ), sdo = sm90_smem_addr(smem + L::kDO);
  const uint32_t skv = sm90_smem_addr(smem + L::kKV);
  const uint32_t sp = sm90_smem_addr(smem + L::kP), sds = sm90_smem_addr(smem + L::kDS);
  int32_t *sidx = (int32_t *)(smem + L::kIdx);
  float *spart = (float *)(smem + kWsTgt<NBT>);
  const float *slp = (const float *)(smem + L::kLp), *sdelta = (const float *)(smem + L::kDelta);
  const int32_t *irow = p.indices + tok * p.indices_stride;
  irow += k0;
  const float scale = args.scale, scale_log2 = args.scale_log2;
  const int r0 = 16 * warp + (lane >> 2);
  const float lp2[2] = {slp[r0], slp[r0 + 8]};
  const float dl[2] = {sdelta[r0], sdelta[r0 + 8]};
  /* every descriptor is the shared base + a compile-time offset (sm90_desc_at): one live register */
  const uint32_t b4 = sm90_smem_addr(smem) >> 4;

  float dq[128]; /* dims [0, 256) of the 64 head rows, the m64n256 map */
#pragma unroll
  for (int i = 0; i < 128; ++i) dq[i] = 0.f;

  int tcur = phi; /* the row's tile that step n works on */
  for (int n = 0; n < ntiles; ++n) {
    const int s = n & 1;
    const int tnext = tcur + 1 == ntiles ? 0 : tcur + 1;
    /* the next step's indices (-1 past the row's length), read now: the latency hides behind S / dP */
    int32_t nidx[4];
    sm90_gather_read_indices(irow, tnext, g, klen, nidx);
    if (n > 0) { /* tile 0 landed before the role split */
      sm90_cp_async_wait_all(); /* this thread's copies of tile n */
      sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
      sm90_named_bar_sync_any(kBarKV, 128);
    }

    /* ---- S = Q K^T, dP = dO V^T over all 64 keys: SS m64n64k16, both K-major SW128 (LBO 16 unused,
     * SBO 1024, +32 B per k16, +8 KB per 64-column block). */
    float sacc[32], dpacc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sacc[i] = 0.f;
      dpacc[i] = 0.f;
      sm90_fence_operand(sacc[i]);
      sm90_fence_operand(dpacc[i]);
    }
    sm90_wgmma_fence();
#pragma unroll
    for (int b = 0; b < NBT; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t off = b * kBlkBytes + k * 32;
        sm90_wgmma_ss_m64n64k16<0, 0>(sacc, sm90_desc_at(b4, L::kQ + off, 16, 1024), sm90_desc_at(b4, L::kKV + off, 16, 1024),
                                      (b | k) != 0);
      }
#pragma unroll
    for (int b = 0; b < kNBV; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t off = b * kBlkBytes + k * 32;
        sm90_wgmma_ss_m64n64k16<0, 0>(dpacc, sm90_desc_at(b4, L::kDO + off, 16, 1024), sm90_desc_at(b4, L::kKV + off, 16, 1024),
                                      (b | k) != 0);
      }
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sm90_fence_operand(sacc[i]);
      sm90_fence_operand(dpacc[i]);
    }

    /* ---- P, dS (fp32), then bf16 pairs: register 4 kk + m of pp / dsp = accumulator pair
     * (8 kk + 2 m, + 1), which is both stmatrix register m of k16 slice kk and RS A register m of
     * k16 slice kk (docs/hopper.md section 2). */
    float pv[32], dsv[32];
    bwd_sm90_p_ds<8>(sacc, dpacc, sidx + s * kBlockN, 0, lane, lp2, dl, scale, scale_log2, pv, dsv);
    if (p.slot_target) ws_target_tile(p, pv, spart, sidx + s * kBlockN, tok, tcur + (k0 >> 6), t, warp, lane);
    uint32_t pp[16], dsp[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      pp[i] = sm90_pack_bf16x2(pv[2 * i], pv[2 * i + 1]);
      dsp[i] = sm90_pack_bf16x2(dsv[2 * i], dsv[2 * i + 1]);
    }

    /* ---- dQ[:, 0:256) += dS K[:, 0:256): RS m64n256k16, A = dS from registers, B = KV tile dims
     * [0, 256) read MN-major (LBO 8192 between 64-dim blocks, SBO 1024 between 8-key groups, +2048 B
     * per k16 of keys). Waited before the stmatrix below reads dsp (A registers of an unfinished
     * wgmma must not be accessed); in the steady state WG0 would wait on kBarPdSFree here anyway. */
#pragma unroll
    for (int i = 0; i < 128; ++i) sm90_fence_operand(dq[i]);
#pragma unroll
    for (int i = 0; i < 16; ++i) sm90_fence_operand_u32(dsp[i]);
    sm90_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90_wgmma_rs_m64n256k16_tb1(dq, dsp + 4 * kk, sm90_desc_at(b4, L::kKV + kk * 2048, kBlkBytes, 1024), 1);
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) sm90_fence_operand(dq[i]);
#pragma unroll
    for (int i = 0; i < 16; ++i) sm90_fence_operand_u32(dsp[i]);

    /* ---- P, dS -> smem (K-major SW128 [64 heads][64 keys]) for WG1, once WG1's wgmmas on P(n - 1),
     * dS(n - 1) have completed. stmatrix x4 per k16 slice kk: lane l addresses row 16 warp + l % 8 +
     * 8 ((l / 8) % 2), 16-B chunk 2 kk + l / 16 (docs/hopper.md section 2, its test F). */
    if (n > 0) sm90_named_bar_sync_any(kBarPdSFree, kThreads);
    {
      const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int chunk = 2 * kk + (lane >> 4);
        const uint32_t off = r * 128 + (((chunk ^ r) & 7) << 4);
        sm90_stmatrix_x4(sp + off, pp[4 * kk], pp[4 * kk + 1], pp[4 * kk + 2], pp[4 * kk + 3]);
        sm90_stmatrix_x4(sds + off, dsp[4 * kk], dsp[4 * kk + 1], dsp[4 * kk + 2], dsp[4 * kk + 3]);
      }
    }
    sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> WG1's wgmma (async proxy) */
    ws_bar_arrive(kBarPdSFull, kThreads);

    /* ---- gather tile n + 1 into the single KV buffer once WG1's dQ wgmmas on KV(n) have completed
     * (WG0's own S / dP / dQ reads of it are waited above). Its indices go to the other half of sidx,
     * whose last readers (WG0's P of tile n - 1, WG1's row reads of tile n - 1) are behind. */
    if (n + 1 < ntiles) {
      sm90_named_bar_sync_any(kBarKVFree, kThreads);
      ws_gather<NBT>(p, skv, sidx + (s ^ 1) * kBlockN, nidx, g, j);
    }
    if (args.sweep && t == 0) ws_sweep_add();
    tcur = tnext;
  }
  ws_dq_out<128, 0, 64 * NBT>(args, dq, warp, lane);
}

/* WG1 ("back"): dQ dims [256, 64 NBT) by SS wgmma, then the NBT 64-dim dKV chunks with two alternating
 * accumulators, each chunk's dKV reductions issued under the next chunk's wgmmas. kDet: the chunk's
 * rows are stored instead, at their entries' sorted ranks (det_pos; every slot of every tile: the
 * invalid ones' rows, sorted last, and the dump rows are never read). */
template <int NBT, bool kDet>
__device__ __forceinline__ void ws_back(const MainArgs &args, uint8_t *smem, int ntiles) {
  typedef Smem<NBT> L;
  constexpr int kD = 64 * NBT;          /* row stride of acc */
  constexpr int kDQ = (NBT - 4) * 32;   /* dQ registers: 160 (D = 576) / 128 (D = 512) */
  const dsa_attn_bwd_params &p = args.p;
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const uint32_t sq = sm90_smem_addr(smem + L::kQ), sdo = sm90_smem_addr(smem + L::kDO);
  const uint32_t skv = sm90_smem_addr(smem + L::kKV);
  const uint32_t sp = sm90_smem_addr(smem + L::kP), sds = sm90_smem_addr(smem + L::kDS);
  const int32_t *sidx = (const int32_t *)(smem + L::kIdx);
  const int r0 = 16 * warp + (lane >> 2), odd = (lane >> 2) & 1;
  float *const rowp = (kDet ? args.contrib : args.acc) + 16 * odd + 4 * (lane & 3);
  /* reductions: evict_last; the deterministic mode's rows: evict_first */
  const uint64_t pol = kDet ? sm90_l2_policy_evict_first() : sm90_l2_policy(true);
  /* no T_kv rows: nothing to reduce (the spare rows aside); contrib rows exist whenever T > 0. A
   * runtime test in both modes: with a constant the reductions leave their branch region and ptxas
   * hoists their shuffles further, which spills at D = 576 */
  const bool red_on = kDet ? p.topk > 0 : p.num_kv > 0;
  /* every descriptor is the shared base + a compile-time offset (sm90_desc_at): one live register */
  const uint32_t b4 = sm90_smem_addr(smem) >> 4;

  float dq[kDQ]; /* dims [256, 64 NBT): m64n256 (+ m64n64 at D = 576) */
#pragma unroll
  for (int i = 0; i < kDQ; ++i) dq[i] = 0.f;

  for (int n = 0; n < ntiles; ++n) {
    const int s = n & 1;
    sm90_named_bar_sync_any(kBarPdSFull, kThreads); /* P(n), dS(n), KV(n), idx(n) */
    int32_t ka[2], kb[2], dr[2];
    if constexpr (kDet) {
      /* key rows r0, r0 + 8 are slots 64 n + r0 (+ 8) of the CTA's token: their rows are
       * det_pos[slot] nhb + hb (bwd_det_sort_pos); a slot past K stores to a dump row after the
       * chunk's T K nhb entry rows. Loaded here, arranged after the dQ wgmmas (their latency under
       * them). */
      const int nhb = args.num_hblocks, tl = (int)blockIdx.x / nhb, hb = (int)blockIdx.x - tl * nhb;
      const int32_t *pp = args.det_pos + (int64_t)tl * p.topk;
      const int32_t dump = (int32_t)p.num_tokens * p.topk * nhb;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int j = kBlockN * n + r0 + 8 * hr;
        dr[hr] = j < p.topk ? __ldg(pp + j) * nhb + hb : dump + r0 + 8 * hr;
      }
    } else {
      sm90_lay1_key_rows(sidx + s * kBlockN, r0, odd, ka, kb);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) { /* ~f -> f (ws_gather): every row valid */
        ka[hr] ^= ka[hr] >> 31;
        kb[hr] ^= kb[hr] >> 31;
      }
    }

    /* ---- dQ[:, 256:) += dS K[:, 256:): SS, A = dS tile K-major (+32 B per k16 of keys), B = KV tile
     * dims [256, 64 NBT) MN-major (as WG0's B). Waited at once: KV(n) is then free for gather(n + 1). */
#pragma unroll
    for (int i = 0; i < kDQ; ++i) sm90_fence_operand(dq[i]);
    sm90_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t da = sm90_desc_at(b4, L::kDS + kk * 32, 16, 1024);
      sm90_wgmma_ss_m64n256k16<1>(dq, da, sm90_desc_at(b4, L::kKV + 4 * kBlkBytes + kk * 2048, kBlkBytes, 1024), 1);
      if constexpr (kDQ == 160)
        sm90_wgmma_ss_m64n64k16<0, 1>(dq + 128, da,
                                        sm90_desc_at(b4, L::kKV + 8 * kBlkBytes + kk * 2048, kBlkBytes, 1024), 1);
    }
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kDQ; ++i) sm90_fence_operand(dq[i]);
    if (n + 1 < ntiles) ws_bar_arrive(kBarKVFree, kThreads);
    if constexpr (kDet) sm90_lay1_pair_rows(dr[0], dr[1], odd, ka, kb);

    /* ---- dKV chunks (ws_dkv_chunk). Chunk c runs in accumulator c % 2: issue chunk c, wait until at
     * most 1 group is pending (chunk c - 1 done), reduce chunk c - 1 while chunk c runs. */
    float acc0[32], acc1[32];
#pragma unroll
    for (int c = 0; c < NBT; ++c) {
      float *acc = (c & 1) ? acc1 : acc0;
#pragma unroll
      for (int i = 0; i < 32; ++i) sm90_fence_operand(acc[i]);
      sm90_wgmma_fence(); /* orders the reductions' reads of this accumulator (chunk c - 2) */
      ws_dkv_chunk<NBT>(acc, b4, c);
      sm90_wgmma_commit();
      if (c > 0) {
        float *prev = (c & 1) ? acc0 : acc1;
        sm90_wgmma_wait<1>(); /* chunk c - 1 */
#pragma unroll
        for (int i = 0; i < 32; ++i) sm90_fence_operand(prev[i]);
        if (red_on) sm90_red_block_lay1<kD, true, kDet>(rowp, prev, c - 1, odd, ka, kb, pol);
      }
    }
    float *last = ((NBT - 1) & 1) ? acc1 : acc0;
    sm90_wgmma_wait<0>(); /* chunk NBT - 1: every WG1 wgmma reading P(n), dS(n) has completed */
#pragma unroll
    for (int i = 0; i < 32; ++i) sm90_fence_operand(last[i]);
    if (n + 1 < ntiles) ws_bar_arrive(kBarPdSFree, kThreads);
    if (red_on) sm90_red_block_lay1<kD, true, kDet>(rowp, last, NBT - 1, odd, ka, kb, pol);
  }
  ws_dq_out<kDQ, 4, kD>(args, dq, warp, lane);
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

template <int NBT, bool kDet>
__global__ void __launch_bounds__(kThreads, 1) attn_bwd_sm90_ws_kernel(const __grid_constant__ MainArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef Smem<NBT> L;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  const dsa_attn_bwd_params &p = args.p;
  const int tid = threadIdx.x, wg = tid >> 7;
  int64_t tok;
  int h0, half, si;
  ws_cta_decode(args, blockIdx.x, &tok, &h0, &half, &si);
  int klen = p.topk; /* slots [0, klen) may be valid */
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  /* a split token's half: tiles [0, ceil(n / 2)) or the rest, as slots [k0, k0 + klen) */
  const int klen_row = klen;
  int k0 = 0;
  if (half >= 0) {
    const int m = kBlockN * ((klen + 2 * kBlockN - 1) / (2 * kBlockN));
    if (half == 0) {
      klen = min(klen, m);
    } else {
      k0 = m;
      klen = max(klen - m, 0);
    }
  }
  (void)si;
  (void)klen_row;
  const int ntiles = (klen + kBlockN - 1) / kBlockN;
  int phi = 0; /* WG0's first tile */

  if (ntiles > 0) {
    /* Q and dO rows by all 256 threads (thread (g, j): rows g, g + 32, chunk j; heads past H: zero
     * rows), tile 0's KV by WG0 (ws_gather), the row statistics' loads (ws_stats_issue) under them,
     * then Delta, L' log2e and the dsink partials from the landed dO (ws_stats_finish) */
    const int g = tid >> 3, j = tid & 7;
    const bool sweep = !kDet && args.sweep && ntiles > 1;
    uint32_t swept = 0;
    if (sweep && tid == 0) swept = ws_sweep_read(); /* its latency under the Q / dO copies */
    bwd_sm90_load_q_do<NBT>(p, sm90_smem_addr(smem + L::kQ), sm90_smem_addr(smem + L::kDO), tok, h0, g, j);
    if (wg == 0) {
      if (sweep) { /* spart is free until the tile loop */
        volatile uint32_t *sw = (volatile uint32_t *)(smem + kWsTgt<NBT>);
        if (tid == 0) *sw = ws_sweep_phase(swept, ntiles);
        sm90_named_bar_sync_any(kBarKV, 128);
        phi = (int)*sw;
      }
      int32_t idxs[4];
      sm90_gather_read_indices(p.indices + tok * p.indices_stride + k0, phi, tid >> 3, klen, idxs);
      ws_gather<NBT>(p, sm90_smem_addr(smem + L::kKV), (int32_t *)(smem + L::kIdx), idxs, tid >> 3, tid & 7);
    }
    WsStats st;
    ws_stats_issue(args, tok, h0, klen_row, st); /* the whole row's slots decide L' */
    const bool write_part = half <= 0;            /* one half of a split token adds to dsink */
    sm90_cp_async_wait_all();
    sm90_fence_proxy_async();
    const bool any = __syncthreads_or(st.any) != 0;
    ws_stats_finish<NBT>(args, smem, tok, h0, any, write_part, st);
    __syncthreads();
  }
  else if (args.part != nullptr && half <= 0 && tid < kBlockM && h0 + tid < p.num_heads) {
    args.part[tok * p.num_heads + h0 + tid] = 0.f; /* no slot: the row adds nothing to dsink */
  }
  if (wg == 0)
    ws_front<NBT>(args, smem, ntiles, tok, h0, klen, k0, phi);
  else
    ws_back<NBT, kDet>(args, smem, ntiles);
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run (the launcher checks cc 9.0) */
#endif
}

/* dq rows of the S split tokens = bf16(half 0's partial + half 1's) (fixed order: reproducible), 8
 * dims per work item: two 16-B loads of each partial, one 16-B store (the op's checks require 16-B
 * aligned dq rows). */
template <int kD>
__global__ void ws_dq_combine_kernel(const __grid_constant__ dsa_attn_bwd_params p, const float *part, int S) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kG = kD / 8;
  const int64_t H = p.num_heads, n = (int64_t)S * H * kG;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / kG; /* split index * H + head */
    const int g = (int)(i - row * kG);
    const int64_t si = row / H;
    const int h = (int)(row - si * H);
    const float4 *a = (const float4 *)(part + row * kD + 8 * g);
    const float4 *b = (const float4 *)(part + ((int64_t)S * H + row) * kD + 8 * g);
    const float4 a0 = a[0], a1 = a[1], b0 = b[0], b1 = b[1];
    const int64_t tok = ws_split_token(si, S, p.num_tokens);
    *(uint4 *)(p.dq + tok * p.dq_stride_token + (int64_t)h * p.dq_stride_head + 8 * g) =
        make_uint4(sm90_pack_bf16x2(a0.x + b0.x, a0.y + b0.y), sm90_pack_bf16x2(a0.z + b0.z, a0.w + b0.w),
                   sm90_pack_bf16x2(a1.x + b1.x, a1.y + b1.y), sm90_pack_bf16x2(a1.z + b1.z, a1.w + b1.w));
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

/* The kernel's max-dynamic-smem attribute, once per (head dim, mode, device). */
template <int NBT, bool kDet>
dsa_status ws_prepare(int dev) {
  static int attr_set[DSA_TRACKED_DEVICES];
  const void *fn = (const void *)attn_bwd_sm90_ws_kernel<NBT, kDet>;
  return dsa_kernel_smem_once(fn, kWsBytes<NBT>, 0, dev, attr_set, "dsa_sparse_attn_bwd: cudaFuncSetAttribute");
}


/* A chunk's sort (tokens [t0, t0 + nt), region S, ranks at pos) on the context's side stream, once
 * everything so far on `stream` is done (ready), then done recorded there; *forked is set once the
 * handoff to the side stream succeeded (the caller joins it at the end only then). */
inline dsa_status ws_det_sort_on_side(const dsa_context *ctx, const dsa_attn_bwd_params *p, const BwdSortLayout &S,
                                      size_t pos, unsigned char *ws, int64_t t0, int64_t nt, cudaEvent_t ready,
                                      cudaEvent_t done, cudaStream_t stream, int *forked) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  DSA_TRY(dsa_stream_after(ready, stream, ctx->side, fn));
  *forked = 1;
  DSA_TRY(bwd_det_sort_pos(p, S, pos, ws, t0, nt, ctx->side));
  return dsa_cuda_status((int)cudaEventRecord(done, ctx->side), fn);
}

/* The deterministic mode's arguments for the chunk of nt tokens from t0: every per-token operand
 * the main kernel reads or writes starts at token t0 (q, dout, out, lse, indices, the row lengths, dq,
 * the slot target, the dsink partials), so the kernel sees tokens 0..nt-1 and carries no chunk offset (a register WG1
 * does not have at D = 576). */
inline MainArgs ws_chunk_args(const MainArgs &a, int64_t t0, int64_t nt) {
  MainArgs c = a;
  dsa_attn_bwd_params &p = c.p;
  p.num_tokens = nt;
  p.q += t0 * p.q_stride_token;
  p.dout += t0 * p.dout_stride_token;
  p.out += t0 * p.out_stride_token;
  p.indices += t0 * p.indices_stride;
  if (p.topk_length) p.topk_length += t0;
  p.lse += t0 * p.num_heads;
  p.dq += t0 * p.dq_stride_token;
  if (p.slot_target) p.slot_target += t0 * p.slot_target_stride;
  c.delta += t0 * p.num_heads;
  c.lp += t0 * p.num_heads;
  if (c.part) c.part += t0 * p.num_heads;
  return c;
}

static_assert(kBlockM == kBwdDetHeadBlock, "contrib head blocks are this kernel's 64-head CTAs");
static_assert(kBlockN == kBwdDetDumpRows, "a partial last tile's slots store to the dump rows");

/* The sequence: the prep (only without topk_length: the row lengths), memset of the fp32 accumulator, the
 * main kernel (deterministic: per chunk of tokens, after the chunk's sort and before its fixed-order
 * reduction), the convert of the permuted accumulator, dsink. */
template <int NBT>
dsa_status ws_launch(const dsa_context *ctx, const dsa_attn_bwd_params *p, void *workspace, cudaStream_t stream,
                     int num_hblocks) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  constexpr int kD = 64 * NBT;
  unsigned char *ws = bwd_align_workspace(workspace);
  const BwdBaseRegions R = bwd_base_regions(ws, p);
  if (p->num_tokens == 0) return bwd_zero_tokens(p, R.part, stream);
  if (kWsBytes<NBT> > ctx->max_smem_optin)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the warp-specialised sm_90a kernel needs %d bytes of shared memory, "
                    "device has %d", fn, kWsBytes<NBT>, ctx->max_smem_optin);
  const bool det = p->deterministic != 0;
  const int64_t split_s = bwd_split_tokens(p); /* 0 in the deterministic mode */
  DSA_TRY(dsa_sm90_check_grid(p->num_tokens + split_s, num_hblocks, fn));
  BwdDetLayout DL = BwdDetLayout();
  if (det) {
    DSA_TRY(bwd_det_layout(p, ctx->options[DSA_OPTION_BWD_DET_CHUNK_TOKENS], &DL));
    DSA_TRY((ws_prepare<NBT, true>(ctx->device)));
  } else {
    DSA_TRY((ws_prepare<NBT, false>(ctx->device)));
  }
  /* without topk_length the prep finds each row's last valid slot, and the main kernel walks the row
   * up to it: a -1-padded list then costs what its valid prefix costs (the kernel tests every slot's
   * index either way, so the results are those of the whole row) */
  int32_t *const found_len = p->topk_length ? nullptr : R.len;
  if (found_len) DSA_TRY(bwd_launch_prep(p, nullptr, nullptr, nullptr, stream, found_len)); /* lengths only */
  /* the T_kv rows, and the spare rows that the non-deterministic mode's invalid slots reduce into
   * (ws_gather) */
  const int64_t acc_rows = p->num_kv + (det ? 0 : kBwdSpareRows);
  if (acc_rows > 0) DSA_TRY(dsa_cuda_status((int)cudaMemsetAsync(R.acc, 0, (size_t)acc_rows * kD * 4, stream), fn));
  if (p->slot_target)
    DSA_TRY(dsa_cuda_status((int)cudaMemset2DAsync(p->slot_target, (size_t)p->slot_target_stride * 4, 0,
                                                   (size_t)p->topk * 4, (size_t)p->num_tokens, stream),
                            fn));
  MainArgs args = bwd_sm90_main_args(p, R, num_hblocks);
  if (found_len) args.p.topk_length = found_len;
  /* the last S tokens as two half CTAs each (det0 only: bwd_split_tokens is 0 in the deterministic
   * mode); their dQ partials right after acc (make_layout, cuda/attn_bwd/bwd_portable.cu) */
  if (!det) {
    args.split_tokens = (int)split_s;
    args.split_cta0 = (p->num_tokens - split_s) * num_hblocks;
    args.dq_part = R.acc + bwd_align_up((size_t)acc_rows * kD * 4) / 4;
  }
  args.part = p->dsink ? R.part : nullptr;
  /* the sweep where the accumulator (T_kv rows of D fp32) does not fit half the L2: below that it
   * stays in L2 in any order, and the sweep only costs its start-tile reads and counts (docs/perf.md,
   * the ledger's sweep line) */
  args.sweep = !det && !dsa_fits_half_l2(ctx, (double)p->num_kv * kD * 4);
  if (!det) {
    const unsigned grid = (unsigned)((p->num_tokens + split_s) * num_hblocks);
    attn_bwd_sm90_ws_kernel<NBT, false><<<grid, kThreads, kWsBytes<NBT>, stream>>>(args);
    DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
    if (split_s > 0) {
      ws_dq_combine_kernel<kD><<<bwd_grid_for(split_s * p->num_heads * (kD / 8), kBwdSmallThreads, kBwdGridCap),
                                 kBwdSmallThreads, 0, stream>>>(*p, args.dq_part, (int)split_s);
      DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
    }
  } else {
    /* chunks of C tokens in ascending order: the chunk's (token, slot) entries are stably sorted by kv
     * row first (the keys kernel's validity test is the gather's: index in [0, T_kv), slot below
     * topk_length, or below K without it, where every slot past the prep's found length is invalid
     * too) and each entry's rank goes to det_pos; the main kernel stores the chunk's per-slot dKV rows
     * at their ranks (every kv row's rows one contiguous run), in the permuted column order; the
     * reduction adds each run into acc row by row in order, column by column, so acc keeps the
     * permuted order the convert undoes. */
    /* one CTA per SM (kWsBytes): a wave is sm_count / num_hblocks tokens */
    const int64_t C = bwd_det_run_chunk(DL, ctx->options[DSA_OPTION_BWD_DET_CHUNK_TOKENS],
                                        ctx->sm_count / num_hblocks);
    args.contrib = (float *)(ws + DL.contrib);
    args.det_pos = (const int32_t *)(ws + DL.pos);
    /* the part-filled chunk (T mod C tokens) runs first: under a causal mask the first tokens are
     * the shortest, so its part-filled last wave costs least there */
    const int64_t first = p->num_tokens % C != 0 ? p->num_tokens % C : C;
    /* chunk c's sort and ranks in region c % 2; chunk c + 1's sort runs on the context's side stream
     * once chunk c's main kernel is done (so beside chunk c's reduction, which reads region c % 2,
     * not under the main kernels, which leave no room on an SM); it overwrites region (c + 1) % 2,
     * whose last readers (chunk c - 1's main kernel and reduction) precede chunk c's main kernel on the
     * call's stream. Chunk c's main kernel waits for its sort (done[c % 2]). The side stream joins the
     * call's stream before the function returns, after an error too, once it was forked (chunk 1's
     * handoff): a single chunk never touches it, so that a captured call never waits on an event
     * recorded outside its capture. */
    const BwdSortLayout *sr[2] = {&DL.sort, &DL.sort2};
    const size_t pr[2] = {DL.pos, DL.pos2};
    dsa_status st = bwd_det_sort_pos(p, *sr[0], pr[0], ws, 0, first, stream);
    int64_t c = 0;
    int forked = 0;
    for (int64_t t0 = 0, nt = first; t0 < p->num_tokens && st == DSA_SUCCESS; t0 += nt, nt = C, ++c) {
      const int r = (int)(c & 1);
      if (c > 0) st = dsa_cuda_status((int)cudaStreamWaitEvent(stream, ctx->ev_done[r], 0), fn);
      if (st != DSA_SUCCESS) break;
      args.det_pos = (const int32_t *)(ws + pr[r]);
      const MainArgs ca = ws_chunk_args(args, t0, nt);
      attn_bwd_sm90_ws_kernel<NBT, true><<<(unsigned)(nt * num_hblocks), kThreads, kWsBytes<NBT>, stream>>>(ca);
      st = dsa_cuda_status((int)cudaGetLastError(), fn);
      if (st == DSA_SUCCESS && t0 + nt < p->num_tokens) { /* chunk c + 1's sort, beside this reduction */
        const int64_t nt1 = C < p->num_tokens - (t0 + nt) ? C : p->num_tokens - (t0 + nt);
        st = ws_det_sort_on_side(ctx, p, *sr[r ^ 1], pr[r ^ 1], ws, t0 + nt, nt1, ctx->ev_ready[r],
                                 ctx->ev_done[r ^ 1], stream, &forked);
      }
      if (st != DSA_SUCCESS || p->num_kv == 0) continue; /* every slot invalid: dq only */
      st = bwd_det_reduce_sorted<kD>(p, *sr[r], ws, args.contrib, R.acc, num_hblocks, stream);
    }
    DSA_TRY(forked ? dsa_side_join(ctx, stream, st, fn) : st);
  }
  if (p->num_kv > 0) DSA_TRY(bwd_launch_convert_lay1<kD>(p, R.acc, stream));
  if (p->dsink) DSA_TRY(bwd_launch_dsink(p, R.part, stream));
  return DSA_SUCCESS;
}

}  // namespace

extern "C" dsa_status dsa_bwd_launch_sm90_ws(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                             void *workspace, cudaStream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  int num_hblocks = 0;
  DSA_TRY(bwd_sm90_check(ctx, p, fn, &num_hblocks));
  return p->head_dim == 576 ? ws_launch<9>(ctx, p, workspace, stream, num_hblocks)
                            : ws_launch<8>(ctx, p, workspace, stream, num_hblocks);
}

extern "C" dsa_status dsa_bwd_sm90_det_workspace_size(const dsa_attn_bwd_params *p, int64_t chunk_tokens,
                                                      size_t *bytes) {
  *bytes = 0;
  if (!p->deterministic || (p->head_dim != 576 && p->head_dim != 512) || p->num_heads < 1 ||
      p->num_heads > DSA_MAX_HEADS)
    return DSA_SUCCESS;
  BwdDetLayout L;
  DSA_TRY(bwd_det_layout(p, chunk_tokens, &L));
  *bytes = L.total;
  return DSA_SUCCESS;
}
