/*
 * bwd_sm90_shared.cuh - the pieces of the 64-head sm_90a backward's two kernels:
 * cuda/attn_bwd/bwd_sm90_h64.cu (lockstep) and cuda/attn_bwd/bwd_sm90_ws.cu (warp-specialised),
 * both modes each. Each translation unit compiles its own copy (anonymous namespace, no relocatable
 * device code). bwd_sm90_dkv_red and bwd_sm90_dq_ss serve the lockstep kernel only (the
 * warp-specialised one reduces with sm90_red_block_lay1 and issues its dQ wgmmas itself).
 * The small passes both launchers run (prep, convert, dsink, workspace regions) are in
 * cuda/attn_bwd/bwd_common.cuh.
 *
 *  - the tile constants and the shared-memory map Smem<NB> (NB = D / 64 64-column blocks per row);
 *  - MainArgs, the kernels' argument block;
 *  - bwd_sm90_p_ds: P and dS of an S / dP accumulator pair (heads on M, keys on N);
 *  - bwd_sm90_dkv_red: the fp32 dKV reductions of one 64-dim block (keys on M) into the permuted
 *    accumulator, 128-B row segments per warp instruction (the non-deterministic mode);
 *  - bwd_sm90_load_q_do: the token's Q / dO rows into smem (cp.async, 256 threads);
 *  - bwd_sm90_load_lp_delta: the head block's L' log2e and Delta into smem;
 *  - bwd_sm90_dq_ss: the SS wgmmas of dQ += dS K over a range of 64-dim blocks;
 *  - bwd_sm90_store_dq: a warpgroup's dQ accumulator to bf16 dq rows;
 *  - bwd_sm90_check: the launch checks both launchers share (cc 9.0, D, H, alignment, grid, smem);
 *  - bwd_sm90_main_args: MainArgs of a launch over the workspace's base regions.
 * Fragment maps are those of docs/hopper.md section 2.
 */
#ifndef DSA_ATTN_BWD_SM90_SHARED_CUH
#define DSA_ATTN_BWD_SM90_SHARED_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "attn_bwd/bwd_common.cuh" /* BwdBaseRegions */

namespace {

constexpr int kThreads = 256;        /* two warpgroups */
constexpr int kBlockM = 64;          /* heads per CTA: the M of one wgmma */
constexpr int kBlockN = 64;          /* keys per KV tile */
/* Head dims: NB 64-column blocks per q / kv row, a template parameter: 9 (D = 576: 512 latent + 64
 * rope) or 8 (D = 512: no rope part, every dim is a value dim). */
constexpr int kNBV = DSA_VALUE_DIM / 64; /* 8 value blocks */
constexpr int kBlkBytes = 64 * 128;  /* one 64 x 64 bf16 SW128 block: 8 atoms of 1024 B */
constexpr float kLog2e = 1.4426950408889634f;

/* Shared-memory layout for NB 64-column blocks per row (byte offsets from the 1024-B aligned base):
 * 231424 B at NB = 9, 215040 B at NB = 8 (each with 1024 B of alignment slack). */
template <int NB>
struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kDO = kQ + NB * kBlkBytes;
  static constexpr int kKV = kDO + kNBV * kBlkBytes;
  static constexpr int kP = kKV + NB * kBlkBytes;
  static constexpr int kDS = kP + kBlkBytes;
  static constexpr int kIdx = kDS + kBlkBytes;       /* int32 [2][64]: kv row or -1 */
  static constexpr int kLp = kIdx + 2 * kBlockN * 4; /* f32 [64]: L' * log2e, +inf for dead rows */
  static constexpr int kDelta = kLp + kBlockM * 4;   /* f32 [64] */
  static constexpr int kEnd = kDelta + kBlockM * 4;
  static constexpr int kBytes = kEnd + 1024;         /* + slack to align the base */
};
static_assert(Smem<9>::kKV % 1024 == 0 && Smem<9>::kP % 1024 == 0 && Smem<9>::kDS % 1024 == 0, "1024-B tiles");
static_assert(Smem<8>::kKV % 1024 == 0 && Smem<8>::kP % 1024 == 0 && Smem<8>::kDS % 1024 == 0, "1024-B tiles");
static_assert(Smem<9>::kBytes == 231424 && Smem<8>::kBytes == 215040, "the sizes the comments quote");
static_assert(Smem<9>::kBytes <= 232448 && Smem<8>::kBytes <= 232448, "fits the 227 KB opt-in");

struct MainArgs {
  dsa_attn_bwd_params p;
  const float *delta, *lp; /* [T, H] from the prep pass */
  float *acc;              /* [T_kv, D] fp32 (non-deterministic mode: the atomics' target) */
  float *contrib;          /* deterministic mode: [chunk CTAs][K][D] fp32 per-slot dKV rows (the
                              * warp-specialised kernel: rows in sorted order, det_pos) */
  const int32_t *det_pos;  /* warp-specialised deterministic mode: entry (token in chunk) K + slot's
                              * rank in the chunk's sort by kv row (bwd_det_sort_pos) */
  int64_t tok0;            /* deterministic mode: first token of this chunk (0 otherwise) */
  float scale, scale_log2;
  int num_hblocks;
  float *part;             /* warp-specialised kernel: the dsink partials [T, H] it writes (NULL without
                              * dsink); it computes Delta and L' itself */
  float *dq_part;          /* warp-specialised kernel, the split tail: [2][split_tokens][H][D] fp32 */
  int64_t split_cta0;      /* first CTA of the split tokens' halves (the grid size: none) */
  int split_tokens;
  int sweep;               /* warp-specialised kernel, non-deterministic mode: each CTA starts its row
                              * at the tile the resident CTAs are at (ws_sweep_phase) */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* P and dS of keys [key0, key0 + 8 NCC) from a completed m64n(8 NCC)k16 S / dP accumulator pair:
 * P = exp2(S * scale * log2e - L' * log2e) (0 for invalid slots), dS = scale * P * (dP - Delta).
 * The exponential is one ex2.approx.ftz (sm90_exp2, as the forward's): a P below 2^-126 is 0, which
 * changes no bf16 result, and exp2f's subnormal scaling would cost three more instructions each.
 * Register i: head row 16 warp + lane / 4 + 8 ((i >> 1) & 1), key column key0 + 8 (i >> 2) +
 * 2 (lane % 4) + (i & 1) (docs/hopper.md section 2); tidx: the tile's kv rows (-1 = invalid), lp2 / dl:
 * L' log2e and Delta of this thread's two head rows. */
template <int NCC>
__device__ __forceinline__ void bwd_sm90_p_ds(const float *sacc, const float *dpacc, const int32_t *tidx, int key0,
                                              int lane, const float lp2[2], const float dl[2], float scale,
                                              float scale_log2, float *pv, float *dsv) {
#pragma unroll
  for (int cc = 0; cc < NCC; ++cc) {
    const int col = key0 + 8 * cc + 2 * (lane & 3);
    const bool v0 = tidx[col] >= 0, v1 = tidx[col + 1] >= 0;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * cc + 2 * hr + e;
        const float pr = (e ? v1 : v0) ? sm90_exp2(sacc[i] * scale_log2 - lp2[hr]) : 0.f;
        pv[i] = pr;
        dsv[i] = scale * pr * (dpacc[i] - dl[hr]);
      }
  }
}

/* The fp32 reductions of one completed 64-dim dKV block b (an m64n64 accumulator, keys on M:
 * register i = key row 16 warp + lane / 4 + 8 ((i >> 1) & 1), dim 64 b + 8 (i >> 2) + 2 (lane % 4) +
 * (i & 1)) into the fp32 accumulator gacc [T_kv][kD]. kr0 / kr1: this thread's two key rows' kv rows
 * (-1 = invalid: nothing added), kp0 / kp1: the same of lane ^ 4.
 * The permuted accumulator (src/kernels.h dsa_bwd_dkv_slot: for 16-column group g the registers
 * 8 g + {0, 1, 4, 5} (row r0; + 2 for row r0 + 8) are real columns 64 b + 16 g + {2 q, 2 q + 1,
 * 8 + 2 q, 9 + 2 q}, q = lane % 4, at slots 64 b + 16 g + 4 q + {0..3}), each warp instruction 4 rows
 * x 128 contiguous bytes: the quads q and q ^ 1 (lanes l, l ^ 4) pair up. Per 32-column pair G (groups
 * 2G, 2G + 1 of this block) the even quad's lanes write group 2G, the odd quad's group 2G + 1: one
 * instruction for the even quad's row, one for the odd quad's row; each quad hands its peer the 4
 * values of the group it does not write (shfl.xor 4). 8 v4 per thread per block plus 16 shuffles.
 * Row stride 2304 / 2048 B and the 256-B aligned acc keep every vector 16-B aligned. */
template <int kD>
__device__ __forceinline__ void bwd_sm90_dkv_red(float *gacc, const float *acc, int b, int lane, int32_t kr0,
                                                  int32_t kr1, int32_t kp0, int32_t kp1) {
  const int odd = (lane >> 2) & 1;
  float *const abase = gacc + 64 * b + 16 * odd + 4 * (lane & 3);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int32_t kme = hr ? kr1 : kr0, kpe = hr ? kp1 : kp0;
    const int32_t ka = odd ? kpe : kme, kb = odd ? kme : kpe; /* the even / the odd quad's row */
#pragma unroll
    for (int G = 0; G < 2; ++G) {
      /* the group written (2G + odd) and the one handed over (2G + 1 - odd), by selects: a
       * run-time register index would put acc in local memory */
      float own[4], rcv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ri = (e & 1) + 4 * (e >> 1) + 2 * hr; /* {0, 1, 4, 5} (+ 2 for row r0 + 8) */
        const float lo = acc[16 * G + ri], hi = acc[16 * G + 8 + ri]; /* groups 2G, 2G + 1 */
        own[e] = odd ? hi : lo;
        rcv[e] = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 4);
      }
      const float4 va = odd ? make_float4(rcv[0], rcv[1], rcv[2], rcv[3]) : make_float4(own[0], own[1], own[2], own[3]);
      const float4 vb = odd ? make_float4(own[0], own[1], own[2], own[3]) : make_float4(rcv[0], rcv[1], rcv[2], rcv[3]);
      if (ka >= 0) atomicAdd((float4 *)(abase + (int64_t)ka * kD + 32 * G), va);
      if (kb >= 0) atomicAdd((float4 *)(abase + (int64_t)kb * kD + 32 * G), vb);
    }
  }
}

/* Q and dO rows of heads [h0, h0 + 64) into the SW128 tiles at sq / sdo by all 256 threads: thread
 * (g = tid / 8, j = tid % 8) copies 16-B chunk j of every block of rows g and g + 32 (cp.async; heads
 * past H are zero rows, src-size 0 from head h0). */
template <int NBT>
__device__ __forceinline__ void bwd_sm90_load_q_do(const dsa_attn_bwd_params &p, uint32_t sq, uint32_t sdo,
                                                   int64_t tok, int h0, int g, int j) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = g + 32 * i, h = h0 + r;
    const bool ok = h < p.num_heads;
    const int hh = ok ? h : h0;
    const uint16_t *qs = p.q + tok * p.q_stride_token + (int64_t)hh * p.q_stride_head + j * 8;
    const uint16_t *gs = p.dout + tok * p.dout_stride_token + (int64_t)hh * p.dout_stride_head + j * 8;
#pragma unroll
    for (int b = 0; b < NBT; ++b)
      sm90_cp_async16(sq + b * kBlkBytes + sm90_sw128_chunk_off(r, j), qs + b * 64, ok ? 16u : 0u);
#pragma unroll
    for (int b = 0; b < kNBV; ++b)
      sm90_cp_async16(sdo + b * kBlkBytes + sm90_sw128_chunk_off(r, j), gs + b * 64, ok ? 16u : 0u);
  }
}

/* L' log2e (+inf for heads past H: P = dS = 0 there) and Delta of heads [h0, h0 + 64) of token tok into
 * the Smem<NBT> map, by threads 0..63. */
template <int NBT>
__device__ __forceinline__ void bwd_sm90_load_lp_delta(const MainArgs &args, uint8_t *smem, int tid, int64_t tok,
                                                       int h0) {
  typedef Smem<NBT> L;
  const dsa_attn_bwd_params &p = args.p;
  if (tid < kBlockM) {
    const int h = h0 + tid;
    float *slp = (float *)(smem + L::kLp), *sdelta = (float *)(smem + L::kDelta);
    const bool live = h < p.num_heads;
    slp[tid] = live ? args.lp[tok * p.num_heads + h] * kLog2e : INFINITY; /* +inf * log2e = +inf */
    sdelta[tid] = live ? args.delta[tok * p.num_heads + h] : 0.f;
  }
}

/* Issues dQ[:, 64 B0 : 64 (B0 + NB)) += dS K over the tile's 64 keys (NB = 4: one m64n256 per k16, 5:
 * + one m64n64): SS, A = dS tile K-major (+32 B per k16 of keys); B = KV tile dims [64 B0, 64 (B0 +
 * NB)) read MN-major: LBO 8192 between 64-dim blocks, SBO 1024 between 8-key groups, +2048 B per k16 of
 * keys. No fence / commit / wait: the caller's. */
template <int NB, int B0>
__device__ __forceinline__ void bwd_sm90_dq_ss(float *dq, uint32_t sds, uint32_t skv) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t da = sm90_desc_at(sds >> 4, kk * 32, 16, 1024);
    sm90_wgmma_ss_m64n256k16<1>(dq, da, sm90_desc_at(skv >> 4, B0 * kBlkBytes + kk * 2048, kBlkBytes, 1024),
                                 1);
    if constexpr (NB == 5)
      sm90_wgmma_ss_m64n64k16<0, 1>(dq + 128, da,
                                 sm90_desc_at(skv >> 4, (B0 + 4) * kBlkBytes + kk * 2048, kBlkBytes, 1024), 1);
  }
}

/* A warpgroup's dQ accumulator (kDQ registers: dims [64 B0, 64 B0 + 2 kDQ) of its 64 head rows, the
 * m64nN map) to bf16 pairs of the head rows h0 + r0 (+ 8) that exist. */
template <int kDQ, int B0>
__device__ __forceinline__ void bwd_sm90_store_dq(const dsa_attn_bwd_params &p, const float *dq, int64_t tok, int h0,
                                                  int warp, int lane) {
  const int r0 = 16 * warp + (lane >> 2);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int h = h0 + r0 + 8 * hr;
    if (h >= p.num_heads) continue;
    uint16_t *orow = p.dq + tok * p.dq_stride_token + (int64_t)h * p.dq_stride_head + 64 * B0 + 2 * (lane & 3);
#pragma unroll
    for (int cc = 0; cc < kDQ / 4; ++cc) {
      const int i = 4 * cc + 2 * hr;
      *(uint32_t *)(orow + 8 * cc) = sm90_pack_bf16x2(dq[i], dq[i + 1]);
    }
  }
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL || !__CUDA_ARCH__ */

/* The launch checks of the 64-head sm_90a kernels (fn: the op's name for the messages): a device of
 * cc 9.0, D = 576 / 512, H 1..128, 16-B aligned q / kv / dout rows (cp.async), 4-B aligned dq rows,
 * T * ceil(H / 64) CTAs within a 1-D grid, Smem<D / 64>::kBytes within the opt-in limit.
 * DSA_ERROR_UNSUPPORTED (with a message) otherwise; *num_hblocks = ceil(H / 64) on success. */
inline dsa_status bwd_sm90_check(const dsa_context *ctx, const dsa_attn_bwd_params *p, const char *fn,
                                 int *num_hblocks) {
  DSA_TRY(dsa_sm90_check_cc(ctx, fn));
  if (p->head_dim != 576 && p->head_dim != 512)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel supports head_dim 576 and 512, not %d", fn,
                    (int)p->head_dim);
  if (p->num_heads < 1 || p->num_heads > DSA_MAX_HEADS)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel supports num_heads 1..%d, not %d", fn,
                    DSA_MAX_HEADS, (int)p->num_heads);
  /* cp.async moves 16 B: q / kv / dout rows must start 16-B aligned; dq is written as bf16 pairs */
  if (((uintptr_t)p->q & 15) || ((uintptr_t)p->kv & 15) || ((uintptr_t)p->dout & 15) || (p->q_stride_token & 7) ||
      (p->q_stride_head & 7) || (p->kv_stride & 7) || (p->dout_stride_token & 7) || (p->dout_stride_head & 7))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a kernel needs 16-byte aligned q / kv / dout rows (q strides %lld, %lld; "
                    "kv_stride %lld; dout strides %lld, %lld)",
                    fn, (long long)p->q_stride_token, (long long)p->q_stride_head, (long long)p->kv_stride,
                    (long long)p->dout_stride_token, (long long)p->dout_stride_head);
  if (((uintptr_t)p->dq & 3) || (p->dq_stride_token & 1) || (p->dq_stride_head & 1))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: the sm_90a kernel needs 4-byte aligned dq rows (dq strides %lld, %lld)", fn,
                    (long long)p->dq_stride_token, (long long)p->dq_stride_head);
  const int nhb = (p->num_heads + kBlockM - 1) / kBlockM;
  DSA_TRY(dsa_sm90_check_grid(p->num_tokens, nhb, fn));
  const int smem_bytes = p->head_dim == 576 ? Smem<9>::kBytes : Smem<8>::kBytes;
  DSA_TRY(dsa_sm90_check_smem(ctx, smem_bytes, fn));
  *num_hblocks = nhb;
  return DSA_SUCCESS;
}

/* The kernels' arguments for params p over the workspace's delta / lp / acc regions (bwd_base_regions,
 * cuda/attn_bwd/bwd_common.cuh): no contrib buffer, first token 0 (the deterministic mode sets both per
 * chunk). */
inline MainArgs bwd_sm90_main_args(const dsa_attn_bwd_params *p, const BwdBaseRegions &R, int num_hblocks) {
  MainArgs args;
  args.p = *p;
  args.delta = R.delta;
  args.lp = R.lp;
  args.acc = R.acc;
  args.contrib = nullptr;
  args.det_pos = nullptr;
  args.tok0 = 0;
  args.part = nullptr;
  args.scale = p->softmax_scale;
  args.scale_log2 = p->softmax_scale * kLog2e;
  args.num_hblocks = num_hblocks;
  args.dq_part = nullptr; /* no token split (the warp-specialised launcher sets these) */
  args.split_cta0 = INT64_MAX;
  args.split_tokens = 0;
  args.sweep = 0;
  return args;
}

}  // namespace

#endif /* DSA_ATTN_BWD_SM90_SHARED_CUH */
