/*
 * bwd_sm90_h64.cu - sparse MLA attention backward on sm_90a tensor cores (wgmma), 64 heads per CTA
 * (dsa_bwd_launch_sm90_h64, cuda/attn_bwd/bwd_launch.cuh): dsa_sparse_attn_bwd's main pass in both
 * modes: non-deterministic (fp32 atomic dkv) and deterministic (per-slot dKV rows to a chunk buffer,
 * then a fixed-order key-major reduction; see "Deterministic mode" below). The portable kernels
 * (cuda/attn_bwd/bwd_portable.cu) cover every configuration this one declines with
 * DSA_ERROR_UNSUPPORTED. The automatic choice runs it only where the warp-specialised kernel declines
 * (no sm_90 device does at D = 576 / 512); it stays as the checkable stand-in that compute-sanitizer
 * racecheck runs in place of the warp-specialised kernel in both modes (tests/test_common.h,
 * docs/reliability.md 3c).
 *
 * Math and workspace are those of cuda/attn_bwd/bwd_portable.cu (docs/design.md section 6): the prep pass writes
 * Delta = sum_{d<512} out*dout, L' = logaddexp(lse, sink) (+inf for rows that contribute nothing)
 * and the dsink partials; the main pass accumulates dkv in an fp32 [T_kv, D] workspace buffer with
 * atomics; a convert pass writes bf16 dkv; a fixed-order per-head reduction writes dsink. The small
 * passes (prep, convert, dsink, and the deterministic mode's keys / offsets) are the portable
 * launcher's own, defined once in cuda/attn_bwd/bwd_common.cuh (same layout: delta, lp, part, acc, each
 * 256-B aligned); only the main pass (and the deterministic mode's reduction) differ.
 * The tile constants, Smem map, MainArgs and its fill, P / dS, the dKV reductions, Q / dO and L' /
 * Delta loads, dQ store and the launch checks are shared with the warp-specialised kernel
 * (bwd_sm90_ws.cu) through cuda/attn_bwd/bwd_sm90_shared.cuh, which also holds this kernel's dKV
 * reductions and dQ wgmmas.
 *
 * Head dims: D = 576 and D = 512, one instantiation each of a template parameter NBT = D / 64 (9 or
 * 8 64-column blocks per q / kv row). At D = 512 there is no rope part: the KV tile is V itself, S
 * and dP read the same 8 blocks, and every dkv column is a value column (dS^T Q + P^T dO on all 8
 * blocks). The two warpgroups split the blocks 4 + 5 (D = 576) or 4 + 4 (D = 512).
 *
 * Main kernel: one CTA = one query token x one block of 64 heads (H = 128: two CTAs per token,
 * adjacent in the 1-D grid; H not a multiple of 64: the missing head rows are zero-filled and get
 * L' = +inf, so they contribute exactly 0). 256 threads = two warpgroups, no warp specialisation:
 * every thread issues cp.async for the gathers, both WGs run wgmma. Heads are the M of the products
 * with heads on M; keys are the M of the dkv products.
 * Shared memory (every tile 1024-B aligned, 128B swizzle, [rows][64-column blocks of 8 KB]):
 *   Q [64 heads x D] 72 / 64 KB, dO [64 heads x 512] 64 KB (loaded once), KV tile [64 keys x D]
 *   72 / 64 KB (single buffer), P and dS [64 heads x 64 keys] bf16 8 KB each, indices [2][64], L'
 *   and Delta [64]: 230400 B (D = 576) / 214016 B (D = 512) + 1024 B alignment slack. D = 512 leaves
 *   16 KB unused: not enough for a second KV buffer (64 KB).
 * Per 64-key tile n (WG c = 0, 1):
 *   1. S = Q K^T and dP = dO V^T for keys [32 c, 32 c + 32): SS wgmma m64n32k16, both operands
 *      K-major (36 / 32 + 32 k-steps).
 *   2. P = exp2(S * scale * log2e - L' * log2e) (0 for invalid slots), dS = scale * P * (dP - Delta);
 *      both rounded to bf16 and written with stmatrix into the shared P / dS tiles (K-major: rows =
 *      heads, columns = keys). Barrier (both WGs' halves).
 *   3. dQ += dS K: SS wgmma, A = dS tile (K-major), B = KV tile read MN-major (tB = 1). WG0 owns dims
 *      [0, 256) (one m64n256 per k16: 128 registers), WG1 dims [256, 576) (m64n256 + m64n64: 160)
 *      or [256, 512) (m64n256: 128).
 *   4. Barrier; the KV tile is no longer read: the gather of tile n + 1 is issued now and lands
 *      while step 5 runs.
 *   5. dKV_tile = dS^T Q + P^T dO (keys on M): per 64-dim block b of this WG's dims, SS wgmma
 *      m64n64k16 with A = dS / P tile read M-major (tA = 1, +2048 B per k16 of heads) and B = Q / dO
 *      read MN-major (tB = 1), 4 + 4 k-steps (block 8 of D = 576 has no dO part); then vector fp32
 *      atomics (red.global.add.v4.f32) into acc[idx[key]] for valid keys.
 * dQ is written (bf16 pairs) from registers after the last tile.
 * dKV accumulator (non-deterministic mode): the columns of each acc row are permuted inside 16-column
 * groups (src/kernels.h dsa_bwd_dkv_slot), and quads q and q ^ 1 swap one 16-column group each
 * (shfl.xor 4), so that every red.global.add.v4.f32 instruction writes 4 rows x 128 contiguous bytes
 * (the fp32 reductions bound this kernel: dev/atomic_probe.cu, docs/bwd-sm90-next.md); the convert
 * pass un-permutes (bwd_convert_lay1_kernel).
 * ptxas (nvcc 13, -Xptxas -v, __launch_bounds__(256, 1)), no spills, no C7511/C7515 in any of the
 * four instantiations: D = 576 225 registers (deterministic: 229), two C7519 notes each
 * (warpgroup.arrive injected around the optional P^T dO chain of block 8's dKV); D = 512 196
 * registers (deterministic: 197), no C7519 (the dO chain is unconditional there).
 * SASS per CTA (D = 576): 136 HGMMA.64x32x16 (S, dP), 8 HGMMA.64x256x16 + 4 HGMMA.64x64x16 (dQ), 16
 * HGMMA.64x64x16 with tnspA.tnspB (dKV), STSM, LDGSTS, REDG (both warpgroups' code).
 * Deterministic mode (same main kernel, template kDet = true; all five products on wgmma):
 *   tokens are processed in chunks of C (C = 2 GiB / (ceil(H / 64) * K * D * 4), clamped to 1..T; DSA_OPTION_BWD_DET_CHUNK_TOKENS > 0 overrides it: tests
 *   force many chunks). Per
 *   chunk starting at token t0:
 *   1. main kernel over the chunk's CTAs (blockIdx.x = token_in_chunk * ceil(H / 64) + head block):
 *      step 5 stores each valid slot's fp32 dKV row (64 x D per tile, as computed for the
 *      atomics) to contrib[blockIdx.x * K + slot][D] instead of adding it (dq as before: every
 *      CTA writes its own token's dq rows, no cross-CTA accumulation);
 *   2. keys kernel (cuda/attn_bwd/bwd_common.cuh, values = entry ids): entry i = token_in_chunk * K +
 *      slot -> key = kv row of a valid slot (the main kernel's exact validity test) or the sentinel
 *      T_kv, value = i;
 *   3. CUB stable radix sort (pairs, bits just covering T_kv): each row's entries in ascending
 *      (token, slot) order; offsets kernel (binary search) -> off[0..T_kv];
 *   4. reduce kernel: one CTA (D / 4 threads x float4) per kv row, acc[r] += the row's entries in
 *      sorted order, each entry's head blocks in order 0, 1 (no atomics).
 *   Then the fp32 -> bf16 convert. Every row's sum is ((0 + c_0) + c_1) + ... over its contributions
 *   in ascending (token, slot, head block) order; an fp32 store / load between chunks is exact, so
 *   the result is bitwise the same run to run AND for every chunk size C (the tests check both).
 *   Workspace (bwd_det_layout, cuda/attn_bwd/bwd_common.cuh; offsets from the 256-B aligned base, every
 *   region 256-B aligned):
 *     delta, lp, part [T, H] f32; acc [T_kv, D] f32         (as in the non-deterministic layout)
 *     contrib [C * ceil(H / 64) * K, D] f32                   (<= 2 GiB unless one token exceeds it)
 *     keys0, keys1 [C * K] u32; vals0, vals1 [C * K] i32; off [T_kv + 1] i64; CUB temp (C * K items)
 *   The op's deterministic size (cuda/attn_bwd/dispatch.cu) is the larger of this and the portable
 *   layout (the op falls back to the portable path where this kernel declines at launch). At bwd-glm-4k (T 4096,
 *   H 64, K 2048, causal topk_length): 9 chunks of 455 tokens, ~6.3 M valid slots x 2304 B = ~14.5 GB
 *   written by the main kernels and read back by the reductions.
 * Declined with DSA_ERROR_UNSUPPORTED: a device other than cc 9.0, D other than 576 / 512,
 * q / kv / dout rows not 16-B aligned, dq rows not 4-B aligned, T * ceil(H / 64) above 2^31 - 1,
 * shared memory above the device's opt-in limit.
 * Limits of this design (docs/bwd-sm90-next.md has the plans):
 *   - the KV tile is single-buffered: tile n + 1's gather overlaps only step 5 of tile n; S / dP of
 *     tile n + 1 wait for it.
 *   - every wgmma group is waited on at once (no overlap of the atomics of block b with the wgmma of
 *     block b + 1).
 *   - D = 576: WG1 does 5/4 of WG0's dQ and dKV work (the 576 dims split on 64-dim block
 *     boundaries); D = 512 is balanced.
 *   - dkv atomics: 64 keys x D fp32 per tile per head block (H = 128 doubles them).
 * The main kernel's max-dynamic-smem attribute is set once per (D, mode, device) (prepare_main,
 * through dsa_kernel_smem_once).
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "attn_bwd/bwd_launch.cuh"
#include "attn_bwd/bwd_common.cuh" /* prep, convert, dsink, keys, offsets, det layout */
#include "attn_bwd/bwd_sm90_shared.cuh" /* Smem, MainArgs, P / dS, reductions, dq store, checks */

namespace {

[[maybe_unused]] constexpr int kBar = 1; /* named barrier over the CTA's 256 threads */

/* One consumer warpgroup's share of a tile loop: dQ and dKV over NB 64-dim blocks starting at block
 * B0 of the NBT blocks of a row (NBT = 9: WG0 <4, 0>, WG1 <5, 4>; NBT = 8: WG0 <4, 0>, WG1 <4, 4>).
 * Both warpgroups run the same sequence of named barriers, each from its own instantiation (different
 * instructions), hence the non-.aligned sm90_named_bar_sync_any (synccheck rejects bar.sync there). */
template <int NBT, int NB, int B0, bool kDet>
__device__ __forceinline__ void bwd_sm90_consumer(const MainArgs &args, uint8_t *smem, int wg, int ntiles,
                                                  int64_t tok, int h0, int klen) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NB == 4 || NB == 5, "dQ: one m64n256 (+ one m64n64) per k16");
  static_assert(B0 + NB <= NBT && NBT >= kNBV, "blocks of this WG inside the row; dP reads the 8 value blocks");
  typedef Smem<NBT> L;
  constexpr int kD = 64 * NBT; /* head dim: row stride of acc / contrib */
  const dsa_attn_bwd_params &p = args.p;
  const int tid = threadIdx.x, t = tid & 127, warp = t >> 5, lane = t & 31;
  const int g = tid >> 3, j = tid & 7; /* gather: chunk j of rows g and g + 32 (same r % 8) */
  const uint32_t sq = sm90_smem_addr(smem + L::kQ), sdo = sm90_smem_addr(smem + L::kDO);
  const uint32_t skv = sm90_smem_addr(smem + L::kKV);
  const uint32_t sp = sm90_smem_addr(smem + L::kP), sds = sm90_smem_addr(smem + L::kDS);
  int32_t *sidx = (int32_t *)(smem + L::kIdx);
  const float *slp = (const float *)(smem + L::kLp), *sdelta = (const float *)(smem + L::kDelta);
  const int32_t *irow = p.indices + tok * p.indices_stride;
  const int key0 = 32 * wg; /* this WG's S / dP columns (keys) */
  const float scale = args.scale, scale_log2 = args.scale_log2;
  constexpr int kDQ = NB * 32; /* dQ accumulator registers: 64 x (64 NB) fp32 over 128 threads */

  float dq[kDQ];
#pragma unroll
  for (int i = 0; i < kDQ; ++i) dq[i] = 0.f;

  for (int n = 0; n < ntiles; ++n) {
    const int s = n & 1;
    /* tile n + 1's indices, read now so their latency hides behind this tile's S / dP */
    int32_t nidx[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int slot = (n + 1) * kBlockN + g + 32 * i;
      nidx[i] = slot < klen ? __ldg(irow + slot) : -1;
    }
    sm90_cp_async_wait_all();  /* this thread's copies of tile n (and of Q / dO) have landed */
    sm90_fence_proxy_async();  /* cp.async (generic proxy) -> wgmma (async proxy) */
    sm90_named_bar_sync_any(kBar, kThreads);

    /* ---- 1. S = Q K^T, dP = dO V^T for keys [key0, key0 + 32): K-major SW128, LBO 16 (unused),
     * SBO 1024, +32 B per k16, +8 KB per 64-column block; B starts at key row key0 (4096 B). */
    float sacc[16], dpacc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
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
        sm90_wgmma_ss_m64n32k16(sacc, sm90_desc_at(sq >> 4, off, 16, 1024),
                                sm90_desc_at(skv >> 4, key0 * 128 + off, 16, 1024), (b | k) != 0);
      }
#pragma unroll
    for (int b = 0; b < kNBV; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t off = b * kBlkBytes + k * 32;
        sm90_wgmma_ss_m64n32k16(dpacc, sm90_desc_at(sdo >> 4, off, 16, 1024),
                                sm90_desc_at(skv >> 4, key0 * 128 + off, 16, 1024), (b | k) != 0);
      }
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      sm90_fence_operand(sacc[i]);
      sm90_fence_operand(dpacc[i]);
    }

    /* ---- 2. P, dS. Register i: head row 16 warp + lane / 4 + 8 ((i >> 1) & 1), key column
     * key0 + 8 (i >> 2) + 2 (lane % 4) + (i & 1) (docs/hopper.md section 2). */
    const int r0 = 16 * warp + (lane >> 2);
    const float lp2[2] = {slp[r0], slp[r0 + 8]};
    const float dl[2] = {sdelta[r0], sdelta[r0 + 8]};
    const int32_t *tidx = sidx + s * kBlockN;
    float pv[16], dsv[16];
    bwd_sm90_p_ds<4>(sacc, dpacc, tidx, key0, lane, lp2, dl, scale, scale_log2, pv, dsv);
    /* stmatrix x4 per k16 slice kk of this WG's 32 keys: register q = the pair (8 kk + 2 q, +1);
     * lane l addresses row 16 warp + l % 8 + 8 ((l / 8) % 2), 16-B chunk 2 (key0 / 16 + kk) + l / 16
     * of the K-major SW128 tile (docs/hopper.md section 2, its test F). */
    {
      const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const int chunk = 2 * (key0 / 16 + kk) + (lane >> 4);
        const uint32_t off = r * 128 + (((chunk ^ r) & 7) << 4);
        sm90_stmatrix_x4(sp + off, sm90_pack_bf16x2(pv[8 * kk + 0], pv[8 * kk + 1]),
                         sm90_pack_bf16x2(pv[8 * kk + 2], pv[8 * kk + 3]),
                         sm90_pack_bf16x2(pv[8 * kk + 4], pv[8 * kk + 5]),
                         sm90_pack_bf16x2(pv[8 * kk + 6], pv[8 * kk + 7]));
        sm90_stmatrix_x4(sds + off, sm90_pack_bf16x2(dsv[8 * kk + 0], dsv[8 * kk + 1]),
                         sm90_pack_bf16x2(dsv[8 * kk + 2], dsv[8 * kk + 3]),
                         sm90_pack_bf16x2(dsv[8 * kk + 4], dsv[8 * kk + 5]),
                         sm90_pack_bf16x2(dsv[8 * kk + 6], dsv[8 * kk + 7]));
      }
    }
    sm90_fence_proxy_async(); /* stmatrix (generic proxy) -> wgmma (async proxy) */
    sm90_named_bar_sync_any(kBar, kThreads);

    /* ---- 3. dQ += dS K: A = dS tile K-major (+32 B per k16 of keys); B = KV tile dims
     * [64 B0, 64 (B0 + NB)) read MN-major: LBO 8192 between 64-dim blocks, SBO 1024 between 8-key
     * groups, +2048 B per k16 of keys. */
#pragma unroll
    for (int i = 0; i < kDQ; ++i) sm90_fence_operand(dq[i]);
    sm90_wgmma_fence();
    bwd_sm90_dq_ss<NB, B0>(dq, sds, skv);
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kDQ; ++i) sm90_fence_operand(dq[i]);

    /* ---- 4. both WGs are done reading the KV tile: gather tile n + 1 into it now. Its indices go
     * to the other half of sidx, last read by tile n - 1's atomics (before this tile's first
     * barrier). */
    sm90_named_bar_sync_any(kBar, kThreads);
    if (n + 1 < ntiles) {
      const int sn = (n + 1) & 1;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = g + 32 * i;
        const int32_t idx = nidx[i];
        const bool ok = idx >= 0 && (int64_t)idx < p.num_kv;
        /* an invalid slot copies 0 bytes from a harmless address */
        const uint16_t *src = ok ? p.kv + (int64_t)idx * p.kv_stride + j * 8 : p.q + j * 8;
#pragma unroll
        for (int b = 0; b < NBT; ++b)
          sm90_cp_async16(skv + b * kBlkBytes + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u);
        if (j == 0) sidx[sn * kBlockN + r] = ok ? idx : -1;
      }
    }

    /* ---- 5. dKV rows of this tile, per 64-dim block b: keys on M. A = dS / P tile read M-major
     * (tA = 1: +2048 B per k16 of heads, SBO 1024, LBO 8192 unused for one 64-key block), B = Q / dO
     * block b read MN-major (tB = 1; docs/hopper.md section 8, its test G). Register i: key row 16 warp + lane / 4 +
     * 8 ((i >> 1) & 1), dim 64 b + 8 (i >> 2) + 2 (lane % 4) + (i & 1). */
    const int32_t kr0 = tidx[r0], kr1 = tidx[r0 + 8];
    int32_t kp0 = 0, kp1 = 0; /* non-deterministic: the peer quad's rows (lane ^ 4) */
    if constexpr (!kDet) {
      kp0 = __shfl_xor_sync(0xffffffffu, kr0, 4);
      kp1 = __shfl_xor_sync(0xffffffffu, kr1, 4);
    }
#pragma unroll 1
    for (int bb = 0; bb < NB; ++bb) {
      const int b = B0 + bb;
      float acc[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        acc[i] = 0.f;
        sm90_fence_operand(acc[i]);
      }
      sm90_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        sm90_wgmma_ss_m64n64k16<1, 1>(acc, sm90_desc_at(sds >> 4, kk * 2048, kBlkBytes, 1024),
                                       sm90_desc_at(sq >> 4, b * kBlkBytes + kk * 2048, kBlkBytes, 1024), kk != 0);
      if (b < kNBV) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          sm90_wgmma_ss_m64n64k16<1, 1>(acc, sm90_desc_at(sp >> 4, kk * 2048, kBlkBytes, 1024),
                                         sm90_desc_at(sdo >> 4, b * kBlkBytes + kk * 2048, kBlkBytes, 1024), 1);
      }
      sm90_wgmma_commit();
      sm90_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) sm90_fence_operand(acc[i]);
      const int c0 = 64 * b + 2 * (lane & 3);
      if constexpr (kDet) {
        /* streaming stores (st.global.cs: the chunk buffer is far larger than L2, keep q / kv
         * there) of this CTA's rows: contrib row blockIdx.x * K + slot (slots of invalid keys are
         * never written and never read: the reduction's sorted list holds valid slots only) */
        float *crow = args.contrib + ((int64_t)blockIdx.x * p.topk + (int64_t)n * kBlockN + r0) * kD + c0;
        if (kr0 >= 0) {
#pragma unroll
          for (int cc = 0; cc < 8; ++cc) __stcs((float2 *)(crow + 8 * cc), make_float2(acc[4 * cc], acc[4 * cc + 1]));
        }
        if (kr1 >= 0) {
          float *row = crow + 8 * kD;
#pragma unroll
          for (int cc = 0; cc < 8; ++cc) __stcs((float2 *)(row + 8 * cc), make_float2(acc[4 * cc + 2], acc[4 * cc + 3]));
        }
      } else {
        bwd_sm90_dkv_red<kD>(args.acc, acc, b, lane, kr0, kr1, kp0, kp1);
      }
    }
  }

  /* ---- dQ out: bf16 pairs, head rows h0 + r0 (+ 8) that exist. */
  bwd_sm90_store_dq<kDQ, B0>(p, dq, tok, h0, warp, lane);
#endif
}

/* The kernel body (kDet: the deterministic mode). */
template <int NBT, bool kDet>
__device__ __forceinline__ void attn_bwd_sm90_main(const MainArgs &args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef Smem<NBT> L;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  const dsa_attn_bwd_params &p = args.p;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int64_t tok = (kDet ? args.tok0 : 0) + blockIdx.x / args.num_hblocks;
  const int h0 = (int)(blockIdx.x % args.num_hblocks) * kBlockM;
  int klen = p.topk; /* slots [0, klen) may be valid */
  if (p.topk_length) klen = min(max(p.topk_length[tok], 0), p.topk);
  const int ntiles = (klen + kBlockN - 1) / kBlockN;

  if (ntiles > 0) {
    const int g = tid >> 3, j = tid & 7;
    const uint32_t sq = sm90_smem_addr(smem + L::kQ), sdo = sm90_smem_addr(smem + L::kDO);
    const uint32_t skv = sm90_smem_addr(smem + L::kKV);
    int32_t *sidx = (int32_t *)(smem + L::kIdx);
    /* Q and dO rows (heads past H: zero rows) */
    bwd_sm90_load_q_do<NBT>(p, sq, sdo, tok, h0, g, j);
    /* tile 0 */
    const int32_t *irow = p.indices + tok * p.indices_stride;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = g + 32 * i;
      const int32_t idx = r < klen ? __ldg(irow + r) : -1;
      const bool ok = idx >= 0 && (int64_t)idx < p.num_kv;
      const uint16_t *src = ok ? p.kv + (int64_t)idx * p.kv_stride + j * 8 : p.q + j * 8;
#pragma unroll
      for (int b = 0; b < NBT; ++b)
        sm90_cp_async16(skv + b * kBlkBytes + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u);
      if (j == 0) sidx[r] = ok ? idx : -1;
    }
    bwd_sm90_load_lp_delta<NBT>(args, smem, tid, tok, h0);
  }
  if (wg == 0)
    bwd_sm90_consumer<NBT, 4, 0, kDet>(args, smem, 0, ntiles, tok, h0, klen);
  else
    bwd_sm90_consumer<NBT, NBT - 4, 4, kDet>(args, smem, 1, ntiles, tok, h0, klen);
  sm90_cp_async_wait_all();
#endif
}

/* kDet: the deterministic mode (contrib rows in real column order); else fp32 atomics into the
 * permuted accumulator in 128-B row segments per warp instruction (quad pairs). */
template <int NBT, bool kDet>
__global__ void __launch_bounds__(kThreads, 1) attn_bwd_sm90_kernel(const __grid_constant__ MainArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  attn_bwd_sm90_main<NBT, kDet>(args);
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run (the launcher checks cc 9.0) */
#endif
}

/* ---- deterministic mode: the fixed-order dKV reduction (bwd_det_reduce_kernel), its workspace
 * layout (bwd_det_layout) and the key lists are in cuda/attn_bwd/bwd_common.cuh, shared with the
 * warp-specialised kernel --------------------------------------------------------------------------- */
constexpr int kMaxHBlocks = DSA_MAX_HEADS / kBlockM; /* 2 */
static_assert(kBlockM == kBwdDetHeadBlock, "contrib head blocks are this kernel's 64-head CTAs");

/* The main kernel's dynamic shared memory limit is a per-device attribute: raise it once per (head
 * dim, mode, device). A flag is set only after a successful call; two threads racing on the first
 * call only repeat the same harmless call. */
template <int NBT, bool kDet>
dsa_status prepare_main(int dev) {
  static int attr_set[DSA_TRACKED_DEVICES]; /* per instantiation: the smem limit set per device */
  const void *fn = (const void *)attn_bwd_sm90_kernel<NBT, kDet>;
  return dsa_kernel_smem_once(fn, Smem<NBT>::kBytes, 0, dev, attr_set, "dsa_sparse_attn_bwd: cudaFuncSetAttribute");
}

/* Everything after the checks, for D = 64 * NBT (one instantiation per head dim). */
template <int NBT>
dsa_status launch_impl(const dsa_context *ctx, const dsa_attn_bwd_params *p, void *workspace, cudaStream_t stream,
                       int num_hblocks) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  constexpr int kD = 64 * NBT;
  const int smem_bytes = Smem<NBT>::kBytes;

  /* workspace regions: delta, lp, part, acc as in cuda/attn_bwd/bwd_portable.cu's make_layout (non-deterministic
   * mode); the deterministic mode's bwd_det_layout keeps those four and appends its own regions */
  unsigned char *ws = bwd_align_workspace(workspace);
  const BwdBaseRegions R = bwd_base_regions(ws, p);
  float *delta = R.delta, *lp = R.lp, *part = R.part, *acc = R.acc;
  if (p->num_tokens == 0) return bwd_zero_tokens(p, part, stream);

  const int det = p->deterministic ? 1 : 0;
  BwdDetLayout DL = BwdDetLayout(); /* value-initialised: filled by bwd_det_layout in the deterministic mode */
  if (det) {
    DSA_TRY(bwd_det_layout(p, ctx->options[DSA_OPTION_BWD_DET_CHUNK_TOKENS], &DL));
    /* bwd_det_layout puts delta, lp, part and acc at the offsets used above (same construction) */
    DSA_TRY((prepare_main<NBT, true>(ctx->device)));
  } else {
    DSA_TRY((prepare_main<NBT, false>(ctx->device)));
  }

  DSA_TRY(bwd_launch_prep(p, delta, lp, part, stream));
  if (p->num_kv > 0)
    DSA_TRY(dsa_cuda_status((int)cudaMemsetAsync(acc, 0, (size_t)p->num_kv * kD * 4, stream), fn));

  MainArgs args = bwd_sm90_main_args(p, R, num_hblocks);
  if (!det) {
    attn_bwd_sm90_kernel<NBT, false><<<(unsigned)(p->num_tokens * num_hblocks), kThreads, smem_bytes, stream>>>(args);
    DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  } else {
    /* chunks of C tokens in ascending order: the main kernel writes the chunk's per-slot dKV rows to
     * contrib; the chunk's valid (token, slot) entries are stably sorted by kv row; the reduction
     * adds them into acc row by row in sorted order. The order of every fp32 sum is fixed by the
     * inputs and C alone. */
    args.contrib = (float *)(ws + DL.contrib);
    for (int64_t t0 = 0; t0 < p->num_tokens; t0 += DL.chunk) {
      const int64_t nt = p->num_tokens - t0 < DL.chunk ? p->num_tokens - t0 : DL.chunk;
      args.tok0 = t0;
      attn_bwd_sm90_kernel<NBT, true><<<(unsigned)(nt * num_hblocks), kThreads, smem_bytes, stream>>>(args);
      DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
      if (p->num_kv == 0) continue; /* every slot invalid: dq only */
      if (num_hblocks == 1)
        DSA_TRY((bwd_det_sort_reduce<kD, 1>(p, DL, ws, t0, nt, args.contrib, acc, stream)));
      else
        DSA_TRY((bwd_det_sort_reduce<kD, kMaxHBlocks>(p, DL, ws, t0, nt, args.contrib, acc, stream)));
    }
  }

  /* the deterministic reduction writes acc in real column order, the atomics the permuted one */
  if (p->num_kv > 0) DSA_TRY(!det ? bwd_launch_convert_lay1<kD>(p, acc, stream) : bwd_launch_convert(p, acc, stream));
  if (p->dsink) DSA_TRY(bwd_launch_dsink(p, part, stream));
  return DSA_SUCCESS;
}

}  // namespace

extern "C" dsa_status dsa_bwd_launch_sm90_h64(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                              void *workspace, cudaStream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  int num_hblocks = 0;
  DSA_TRY(bwd_sm90_check(ctx, p, fn, &num_hblocks));
  return p->head_dim == 576 ? launch_impl<9>(ctx, p, workspace, stream, num_hblocks)
                            : launch_impl<8>(ctx, p, workspace, stream, num_hblocks);
}
