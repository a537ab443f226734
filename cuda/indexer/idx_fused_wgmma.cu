/*
 * idx_fused_wgmma.cu - the lightning indexer's fused scoring on sm_90a tensor cores (wgmma), the
 * second fused kernel beside idx_fused (cuda/indexer/idx_fused_mma.cu, mma.sync). Same contract as
 * idx_fused (dsa_indexer_fused_args, cuda/indexer/idx_launch.cuh): for each chunk query r that scores
 * (causal_length > K), scores[r, c] = sum_h w[r, h] ReLU(q[r, h, :] . k[window_start + c, :]) for
 * the window columns c in [starts[r] - window_start, + causal_length); every other entry is left as
 * it was. The automatic fused kernel on cc 9.0 for H_idx > 16 (cuda/indexer/dispatch.cu);
 * DSA_OPTION_INDEXER_FUSED_KERNEL = DSA_INDEXER_FUSED_WGMMA forces it.
 *
 * Operand map (docs/hopper.md section 8, as DeepGEMM's sm90 mqa logits): keys on the wgmma M, (query, head)
 * pairs on N:
 *   S^T [64 keys x 256] = K_tile [64 x 128] . Q_c^T      SS wgmma m64n256k16, 8 k16 steps,
 *                                                        A = the key tile (K-major SW128),
 *                                                        B = Q_c [256 x 128] (K-major SW128)
 * Column n of consumer c's N = 256 is (query c G + n / HP, head n % HP), HP = H_idx rounded up to
 * 32 or 64 (one instantiation each, and a padded one for H_idx < HP), G = 256 / HP queries per
 * consumer (8 / 4). H_idx <= 16 runs as HP = 32 too (16 queries per consumer would need more
 * registers than a consumer has; small H_idx is not a fast path). Accumulator
 * map (docs/hopper.md section 2): register i of thread (warp w, lane l) is key row 16w + l/4 + 8((i >> 1) & 1),
 * column 8(i >> 2) + 2(l % 4) + (i & 1); so the HP columns of one query are registers
 * [4 HP/8 g, 4 HP/8 (g + 1)) of the 4 lanes of a quad: ReLU (max.NaN keeps NaN, as idx_relu) and the
 * weight are applied in place, the head sum is an in-thread sum over the thread's HP/4 columns, then
 * a reduce-scatter over the quad (shfl_xor 2 then 1: 3G/2 shuffles for the 2G (row, query) sums
 * instead of 4G for an all-reduce) leaves lane l with key row 16w + l/4 + 8(l & 2)/2 and queries
 * [G/2 (l & 1), + G/2): one store instruction writes two queries x 16 consecutive keys (2 x 64 B).
 * Padded heads (h >= H_idx, PAD instantiations) are zero Q rows with weight 0, and their
 * accumulators are replaced by 0 before the ReLU (0 * inf in a key would make them NaN).
 * Weights live in registers for the whole CTA (64 per thread). Summation order is fixed (per thread:
 * heads in order; then the fixed butterfly): deterministic and independent of the other rows.
 *
 * CTA = 384 threads, one per SM (__launch_bounds__(384, 1), setmaxnreg 232 / 232 / 40):
 *   WG0, WG1 consumers: WG c owns the G queries [c G, c G + G) of the CTA's 2G (its own 64-KB Q
 *        slab, B of its wgmma); both read every key tile (the K traffic per FLOP is halved by the
 *        two slabs: 512 columns per 16-KB tile). Per tile: wait full[s], proxy fence, wait
 *        for its turn, 8 wgmma, commit, hand the turn to the other WG, wait, arrive empty[s],
 *        epilogue. The turns (ping-pong, two named barriers) make one WG's epilogue (ReLU, weights, head sum,
 *        stores: ~350 instructions a thread) run during the other's wgmma (1024 tensor clocks for
 *        m64n256k128) instead of both computing, then both idling the tensor cores, in lockstep.
 *   WG2 producer: cp.async 16 B with the manual 128B swizzle (docs/hopper.md section 5): both Q slabs once,
 *        then the key tiles [64 keys x 128] into kStages stages; keys past the window zero-filled.
 * Grid: x = blocks of kTilesPerCta * 64 window columns, y = groups of 2G chunk queries. A CTA runs
 * the tiles of its column block that meet the union of its queries' visible windows (nothing: it
 * exits); a consumer WG whose own queries miss a tile skips its wgmma (it still waits full[s] and
 * arrives empty[s], so no barrier phase is lapped).
 *
 * Barriers (mbarriers, parities as docs/hopper.md section 4):
 *   q_full   : 128 .noinc cp.async arrivals (producer threads) -> both Q slabs landed.
 *   full[s]  : 128 .noinc cp.async arrivals -> key tile in stage s landed (the consumers then run
 *              fence.proxy.async: cp.async is generic proxy, wgmma async).
 *   empty[s] : 256 plain arrivals (every consumer thread, after its wgmma.wait_group 0) -> stage free.
 * Named barriers 1 + c (256 threads: WG c barrier.sync, the other WG barrier.arrive): WG c's turn.
 * Shared memory: Q 2 x 64 KB + 4 stages x 16 KB + windows + barriers + 1 KB alignment slack =
 * 197832 B. ptxas (nvcc 13, -Xptxas -v): 168 registers at entry (the launch cap), no spills, no
 * wgmma serialisation warning, in all four instantiations (HP 32 / 64, padded or not).
 * Declined (DSA_ERROR_UNSUPPORTED, by dsa_idx_fused_wgmma_check before anything is launched): a
 * device other than cc 9.0, or less opt-in shared memory than the kernel needs. The validator
 * already guarantees 16-B aligned q / k rows (cp.async) and H_idx <= 64.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "internal.h"
#include "common/sm90_common.cuh"
#include "indexer/idx_launch.cuh"

namespace {

constexpr int kN = 256;                /* (query, head) columns per consumer WG: the largest wgmma N */
constexpr int kBlockK = 64;            /* keys per tile: the wgmma M */
constexpr int kStages = 4;             /* 4 x 16 KB; a tile lasts ~2048 tensor clocks (two WGs) */
constexpr int kConsumers = 2;          /* two Q slabs share every key tile */
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kTilesPerCta = 32;       /* 2048 keys per CTA: the Q load (128 KB) is ~3% of its work */
constexpr int kConsumerRegs = 232;     /* accumulators 128 + weights 64 + sums and addresses */
constexpr int kProducerRegs = 40;      /* cp.async address math */
constexpr int kBlkBytes = 64 * 128;    /* a [64 rows x 64 dims] bf16 SW128 block: 8 atoms */
constexpr int kTileBytes = 2 * kBlkBytes;      /* a key tile [64 x 128]: blocks dims 0-63, 64-127 */
constexpr int kQBlk = kN * 128;                /* [256 rows x 64 dims] of a Q slab */
constexpr int kQSlab = 2 * kQBlk;              /* a consumer's Q [256 x 128] */
constexpr int kMaxQ = kConsumers * (kN / 32);  /* queries per CTA at most (HP = 32) */
constexpr int kOffQ = 0;                       /* slab c at kOffQ + c kQSlab, block b at + b kQBlk */
constexpr int kOffK = kOffQ + kConsumers * kQSlab;     /* stage s at kOffK + s kTileBytes */
constexpr int kOffWin = kOffK + kStages * kTileBytes;  /* int32 lo[kMaxQ], hi[kMaxQ] */
constexpr int kOffBars = kOffWin + 2 * kMaxQ * 4;      /* q_full, full[kStages], empty[kStages] */
constexpr int kSmemBytes = kOffBars + 8 * (1 + 2 * kStages) + 1024; /* + slack to align the base */

static_assert(kBlockK == 64 && kN == 256, "the fragment maps below assume m64n256 tiles");
static_assert(kQBlk % 1024 == 0 && kTileBytes % 1024 == 0 && kOffK % 1024 == 0, "SW128 tiles 1024-B aligned");
static_assert(kOffBars % 8 == 0, "mbarriers are 8-B aligned");
/* the CTA's register pool is what the launch allocated, 384 x 168 (the __launch_bounds__(384, 1) cap)
 * = 128 x 504: the consumers' setmaxnreg.inc would wait forever for more */
static_assert(2 * kConsumerRegs + kProducerRegs <= 504, "setmaxnreg: per-WG counts within the launch's 384 x 168");
static_assert(kConsumerRegs % 8 == 0 && kProducerRegs % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(kSmemBytes <= 227 * 1024, "fits the H200's 227 KB opt-in shared memory");
static_assert(kTilesPerCta >= 1, "at least one tile per CTA");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* The first k16 step: D = A * B^T (scale-d false). Write-only outputs, so the accumulators are dead
 * between the epilogue that reads them and the next tile's first wgmma (no register is held across
 * the tile loop for them). Kept "=f" on purpose (reviewed against "+f", the other wrappers' form):
 * with scale-d = 0 the instruction never reads D, so "=f" states exactly what it does; the hazards
 * of an async wgmma (its registers written after issue) are ptxas's to track and are the same for
 * both forms: the chain's later steps are "+f", and sm90_fence_operand after the wait pins the
 * results before the epilogue reads them. "+f" would only add a fake read of undefined values on
 * the first tile and keep 128 registers live around the loop (skipped tiles, barrier waits). Tried
 * (nvcc 13): same opcode counts in the PTX, 168 registers at entry and no spills either way, but
 * different register allocation / scheduling in all four kernels' machine code (one 8 instructions
 * longer): a change with no safety gain, not taken without a GPU run. */
__device__ __forceinline__ void wgmma_ss_m64n256k16_first(float *d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 0, 1, 1, 0, 0;\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
      "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
      "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
      "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]),
      "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]),
      "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]),
      "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
      "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63]),
      "=f"(d[64]), "=f"(d[65]), "=f"(d[66]), "=f"(d[67]), "=f"(d[68]), "=f"(d[69]), "=f"(d[70]), "=f"(d[71]),
      "=f"(d[72]), "=f"(d[73]), "=f"(d[74]), "=f"(d[75]), "=f"(d[76]), "=f"(d[77]), "=f"(d[78]), "=f"(d[79]),
      "=f"(d[80]), "=f"(d[81]), "=f"(d[82]), "=f"(d[83]), "=f"(d[84]), "=f"(d[85]), "=f"(d[86]), "=f"(d[87]),
      "=f"(d[88]), "=f"(d[89]), "=f"(d[90]), "=f"(d[91]), "=f"(d[92]), "=f"(d[93]), "=f"(d[94]), "=f"(d[95]),
      "=f"(d[96]), "=f"(d[97]), "=f"(d[98]), "=f"(d[99]), "=f"(d[100]), "=f"(d[101]), "=f"(d[102]), "=f"(d[103]),
      "=f"(d[104]), "=f"(d[105]), "=f"(d[106]), "=f"(d[107]), "=f"(d[108]), "=f"(d[109]), "=f"(d[110]), "=f"(d[111]),
      "=f"(d[112]), "=f"(d[113]), "=f"(d[114]), "=f"(d[115]), "=f"(d[116]), "=f"(d[117]), "=f"(d[118]), "=f"(d[119]),
      "=f"(d[120]), "=f"(d[121]), "=f"(d[122]), "=f"(d[123]), "=f"(d[124]), "=f"(d[125]), "=f"(d[126]), "=f"(d[127])
      : "l"(desc_a), "l"(desc_b));
}

/* Named-barrier arrive without waiting (the partner of the other WG's barrier.sync). The two WGs
 * reach the turn barriers from different code, so both sides use the non-.aligned forms
 * (barrier.arrive here, sm90_named_bar_sync_any there): bar.arrive / bar.sync are the .aligned ones,
 * which require every warp at the same instruction (compute-sanitizer synccheck flags them). */
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* ReLU that keeps NaN (idx_relu of cuda/indexer/idx_common.cuh): max.NaN returns NaN when an input is NaN. */
__device__ __forceinline__ float relu_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif

template <int HP, bool PAD>
__global__ void __launch_bounds__(kThreads, 1) idx_sm90_kernel(const __grid_constant__ dsa_indexer_fused_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int G = kN / HP;        /* queries per consumer WG */
  constexpr int QC = kConsumers * G; /* queries per CTA */
  constexpr int JQ = HP / 8;        /* 8-column groups (register quads) per query */
  constexpr int kBarTurn = 1;       /* named barriers kBarTurn + c: consumer c's turn for its wgmma */
  static_assert((HP == 32 || HP == 64) && QC <= kMaxQ, "HP in {32, 64}");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t *smem = sm90_smem_align1024(smem_raw);
  int32_t *s_lo = (int32_t *)(smem + kOffWin), *s_hi = s_lo + kMaxQ;
  uint64_t *bars = (uint64_t *)(smem + kOffBars);
  uint64_t *q_full = bars, *full = bars + 1, *empty = bars + 1 + kStages;
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  const int64_t r0 = (int64_t)blockIdx.y * QC;              /* first chunk query of the CTA */
  const int64_t tb = (int64_t)blockIdx.x * kTilesPerCta;    /* first tile of the CTA's column block */

  /* visible window (columns of the chunk's scores rows) of each query; empty when it selects all */
  if (tid < QC) {
    int32_t lo = 0, hi = 0;
    const int64_t r = r0 + tid;
    if (r < a.rows) {
      const int32_t cl = a.causal_lengths[r];
      if (cl > a.topk) {
        lo = (int32_t)((int64_t)a.starts[r] - a.window_start);
        hi = lo + cl;
      }
    }
    s_lo[tid] = lo;
    s_hi[tid] = hi;
  }
  if (tid == 0) {
    sm90_mbar_init(q_full, 128);
    for (int s = 0; s < kStages; ++s) {
      sm90_mbar_init(&full[s], 128);
      sm90_mbar_init(&empty[s], 128 * kConsumers);
    }
    sm90_mbar_init_fence();
  }
  __syncthreads();
  /* the CTA's tiles [n0, n1): its column block met with the union of its queries' windows */
  int64_t ulo = INT64_MAX, uhi = 0;
  for (int g = 0; g < QC; ++g)
    if (s_hi[g] > s_lo[g]) {
      ulo = min(ulo, (int64_t)s_lo[g]);
      uhi = max(uhi, (int64_t)s_hi[g]);
    }
  const int64_t n0 = max(tb, ulo / kBlockK);
  const int64_t n1 = min(tb + kTilesPerCta, (uhi + kBlockK - 1) / kBlockK);
  if (n0 >= n1) return; /* block-uniform, before any barrier use */

  if (wg == kConsumers) {
    /* ================= producer ================= */
    sm90_setmaxnreg_dec<kProducerRegs>();
    /* thread (g8, j): 16-B chunk j of both 64-dim blocks of rows g8, g8 + 16, ... (rows 16 apart
     * share r % 8: 8 consecutive threads fill one swizzled 128-B row piece, conflict free) */
    const int g8 = t >> 3, j = t & 7;
    const uint32_t sq = sm90_smem_addr(smem + kOffQ);
    /* Q slab c row n = (query r0 + c G + n / HP, head n % HP); padded heads and queries past the
     * chunk are zero rows. Thread rows n = g8 + 16 i: head g8 % HP + 16 i % HP, query (g8 + 16 i) / HP. */
#pragma unroll 1
    for (int i = 0; i < kConsumers * kN / 16; ++i) {
      const int cn = g8 + 16 * i, c = cn / kN, n = cn % kN, h = n % HP; /* powers of two */
      const int64_t qr = r0 + c * G + n / HP;
      const bool ok = qr < a.rows && h < a.heads;
      const uint16_t *src = a.q + (ok ? qr * a.q_stride_token + (int64_t)h * a.q_stride_head + j * 8 : 0);
      const uint32_t dst = sq + c * kQSlab + sm90_sw128_chunk_off(n, j);
      sm90_cp_async16(dst, src, ok ? 16u : 0u);
      sm90_cp_async16(dst + kQBlk, src + 64, ok ? 16u : 0u);
    }
    sm90_cp_async_mbar_arrive_noinc(q_full);

    /* key rows: this thread's row g8 + 16 i of tile n is window column 64 n + g8 + 16 i */
    const uint32_t sk = sm90_smem_addr(smem + kOffK) + sm90_sw128_chunk_off(g8, j); /* rows 16 apart: same XOR */
    const int64_t kstep = 16 * a.k_stride;
    const uint16_t *kp = a.k + (a.window_start + n0 * kBlockK + g8) * a.k_stride + j * 8;
    int64_t col = n0 * kBlockK + g8;
#pragma unroll 1
    for (int64_t n = n0; n < n1; ++n) {
      const int it = (int)(n - n0), s = it % kStages;
      sm90_mbar_wait(&empty[s], ((uint32_t)(it / kStages) & 1) ^ 1); /* first use: returns at once */
      const uint32_t st = sk + s * kTileBytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = col < a.window; /* keys past the window: zero rows (never stored) */
        const uint16_t *src = ok ? kp : a.k;
        sm90_cp_async16(st + i * 16 * 128, src, ok ? 16u : 0u);
        sm90_cp_async16(st + i * 16 * 128 + kBlkBytes, src + 64, ok ? 16u : 0u);
        kp += kstep;
        col += 16;
      }
      sm90_cp_async_mbar_arrive_noinc(&full[s]); /* fires when this thread's copies have landed */
    }
    sm90_cp_async_wait_all();
    return;
  }

  /* ================= consumer c = wg: queries [c G, c G + G) of the CTA ================= */
  sm90_setmaxnreg_inc<kConsumerRegs>();
  const int c = wg, warp = t >> 5, lane = t & 31, hq = 2 * (lane & 3);
  /* weights of this thread's columns: w[2 jj + e] is column 8 jj + hq + e = (query jj / JQ,
   * head 8 (jj % JQ) + hq + e); 0 for padded heads and queries past the chunk */
  float w[2 * (kN / 8)];
  {
    const int64_t qb = r0 + c * G;
#pragma unroll
    for (int jj = 0; jj < kN / 8; ++jj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * (jj % JQ) + hq + e;
        const int64_t qr = qb + jj / JQ;
        float v = 0.0f;
        if (qr < a.rows && h < a.heads) {
          const int64_t off = qr * a.weights_stride + h;
          v = a.weights_bf16 ? __uint_as_float((uint32_t)__ldg((const unsigned short *)a.weights + off) << 16)
                             : __ldg((const float *)a.weights + off);
        }
        w[2 * jj + e] = v;
      }
  }
  /* the union of this WG's windows: tiles outside it skip the wgmma */
  int64_t wlo = INT64_MAX, whi = 0;
  for (int g = c * G; g < c * G + G; ++g)
    if (s_hi[g] > s_lo[g]) {
      wlo = min(wlo, (int64_t)s_lo[g]);
      whi = max(whi, (int64_t)s_hi[g]);
    }
  const bool b1 = (lane & 2) != 0, b0 = (lane & 1) != 0;
  const int row = 16 * warp + (lane >> 2) + (b1 ? 8 : 0); /* the key row this lane stores */
  const int gbase = c * G + (b0 ? G / 2 : 0);             /* ... and its first query of the CTA */

  float acc[kN / 2];

  sm90_mbar_wait(q_full, 0);
  sm90_fence_proxy_async(); /* cp.async (generic proxy) -> wgmma (async proxy) */
  const uint32_t sq = sm90_smem_addr(smem + kOffQ + c * kQSlab);
  const uint32_t sk = sm90_smem_addr(smem + kOffK);
  /* Ping-pong: the WGs take turns on the tensor cores (WG0 first), so one's epilogue runs while the
   * other's wgmma does; without it both would issue together, finish together and leave the
   * tensor cores idle during their epilogues. Turn c = named barrier kBarTurn + c: WG c syncs on
   * it before its wgmma, the other WG arrives on it as soon as its own wgmma is committed (not
   * after waiting for it: the other WG's wgmma then queues behind this one instead of starting only
   * once this group retired and the epilogue math ptxas would schedule ahead of a later arrive ran).
   * Every tile takes a turn (also a skipped one), so the arrivals match the syncs; WG1 arrives once
   * before its first tile and not after its last. */
  if (c == 1) named_bar_arrive(kBarTurn + 0, 256);

#pragma unroll 1
  for (int64_t n = n0; n < n1; ++n) {
    const int it = (int)(n - n0), s = it % kStages;
    sm90_mbar_wait(&full[s], (uint32_t)(it / kStages) & 1);
    const int64_t cb = n * kBlockK; /* window column of the tile's first key */
    /* cp.async (generic proxy) -> wgmma (async proxy); ahead of the turn wait, so that this fence
     * (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC, which waits for the previous tile's score stores) is off
     * the hand-off */
    sm90_fence_proxy_async();
    sm90_named_bar_sync_any(kBarTurn + c, 256);
    if (cb + kBlockK <= wlo || cb >= whi) { /* WG-uniform: none of this WG's queries sees the tile */
      if (c == 0 || n + 1 < n1) named_bar_arrive(kBarTurn + (c ^ 1), 256);
      sm90_mbar_arrive(&empty[s]);
      continue;
    }
    const uint32_t st = sk + s * kTileBytes;
    /* S^T = K Q_c^T: both K-major SW128, LBO 16 (unused), SBO 1024, +32 B per k16 step; the first
     * step overwrites the accumulators (the previous tile's epilogue has read them: the asm
     * statements keep their order, and acc is an output of the first) */
    sm90_wgmma_fence();
    wgmma_ss_m64n256k16_first(acc, sm90_desc_at(st >> 4, 0, 16, 1024), sm90_desc_at(sq >> 4, 0, 16, 1024));
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (b | k)
          sm90_wgmma_ss_m64n256k16<0>(acc, sm90_desc_at(st >> 4, b * kBlkBytes + k * 32, 16, 1024),
                              sm90_desc_at(sq >> 4, b * kQBlk + k * 32, 16, 1024), 1);
    sm90_wgmma_commit();
    if (c == 0 || n + 1 < n1) named_bar_arrive(kBarTurn + (c ^ 1), 256); /* the other WG's turn */
    sm90_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) sm90_fence_operand(acc[i]);
    sm90_mbar_arrive(&empty[s]); /* this thread's reads of the stage are complete */

    /* heads 8 q + hq + e < H_idx are real; hlim is recomputed per tile (opaque to the compiler) so
     * the 64 compares are not hoisted out of the loop into spilled predicates */
    int hlim = a.heads - hq;
    if (PAD) asm volatile("" : "+r"(hlim));
    /* per (row, query) sums over the thread's columns: part[g] row 16w + l/4, part[G + g] row + 8 */
    float part[2 * G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float p0 = 0.0f, p1 = 0.0f; /* +0: an fma chain from +0 never yields -0 */
#pragma unroll
      for (int q = 0; q < JQ; ++q) {
        const int jj = g * JQ + q;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x0 = acc[4 * jj + e], x1 = acc[4 * jj + 2 + e];
          if (PAD) { /* head 8 q + hq + e: a padded head adds nothing, even for inf / NaN keys */
            const bool real = 8 * q + e < hlim;
            x0 = real ? x0 : 0.0f;
            x1 = real ? x1 : 0.0f;
          }
          p0 = fmaf(w[2 * jj + e], relu_nan(x0), p0);
          p1 = fmaf(w[2 * jj + e], relu_nan(x1), p1);
        }
      }
      part[g] = p0;
      part[G + g] = p1;
    }
    /* reduce-scatter over the quad: xor 2 splits the rows (b1), xor 1 the queries (b0) */
    float h1[G];
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const float send = b1 ? part[k] : part[G + k], keep = b1 ? part[G + k] : part[k];
      h1[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
    float h2[G / 2];
#pragma unroll
    for (int k = 0; k < G / 2; ++k) {
      const float send = b0 ? h1[k] : h1[G / 2 + k], keep = b0 ? h1[G / 2 + k] : h1[k];
      h2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
    }
    /* lane: key row `row`, queries gbase + k; causal window of each query, as idx_fused */
    const int64_t col = cb + row;
#pragma unroll
    for (int k = 0; k < G / 2; ++k) {
      const int g = gbase + k;
      if (col >= s_lo[g] && col < s_hi[g] && col < a.window)
        a.scores[(r0 + g) * a.scores_ld + col] = h2[k];
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); /* built without sm_90a machine code: never run silently (the check requires cc 9.0) */
#endif
}

template <int HP, bool PAD>
dsa_status launch(const dsa_context *ctx, const dsa_indexer_fused_args *a, cudaStream_t stream) {
  constexpr int QC = kConsumers * (kN / HP);
  static int attr_set[DSA_TRACKED_DEVICES]; /* per instantiation: the smem limit set per device */
  DSA_TRY(dsa_kernel_smem_once((const void *)idx_sm90_kernel<HP, PAD>, kSmemBytes, 0, ctx->device, attr_set,
                               "dsa_indexer_topk (cudaFuncSetAttribute)"));
  dim3 grid;
  grid.x = (unsigned)((a->window + (int64_t)kBlockK * kTilesPerCta - 1) / ((int64_t)kBlockK * kTilesPerCta));
  grid.y = (unsigned)((a->rows + QC - 1) / QC); /* rows <= 65535 (the chunk bound): <= 8192 */
  grid.z = 1;
  idx_sm90_kernel<HP, PAD><<<grid, kThreads, kSmemBytes, stream>>>(*a);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_indexer_topk (sm_90a fused kernel launch)");
}

}  // namespace

extern "C" dsa_status dsa_idx_fused_wgmma_check(const dsa_context *ctx) {
  if (!(ctx->cc_major == 9 && ctx->cc_minor == 0))
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_indexer_topk: the sm_90a fused scoring kernel needs compute capability 9.0, device has %d.%d",
                    ctx->cc_major, ctx->cc_minor);
  if (ctx->max_smem_optin < kSmemBytes)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_indexer_topk: the sm_90a fused scoring kernel needs %d bytes of shared memory, device has %d",
                    kSmemBytes, ctx->max_smem_optin);
  return DSA_SUCCESS;
}

extern "C" dsa_status dsa_idx_launch_fused_wgmma(const dsa_context *ctx, const dsa_indexer_fused_args *a,
                                                 cudaStream_t stream) {
  if (a->rows <= 0 || a->window <= 0) return DSA_SUCCESS;
  if (a->heads < 32) return launch<32, true>(ctx, a, stream);
  if (a->heads == 32) return launch<32, false>(ctx, a, stream);
  if (a->heads < 64) return launch<64, true>(ctx, a, stream);
  return launch<64, false>(ctx, a, stream);
}
