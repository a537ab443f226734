/*
 * bwd_portable.cu - sparse MLA attention backward, the portable kernels (dsa_bwd_launch_portable,
 * cuda/attn_bwd/bwd_launch.cuh; docs/contract.md section 9.3 with this project's rules): dq, dkv,
 * dsink, with a deterministic mode for dkv.
 *
 * Math per row t, head h (L' = logaddexp(lse, sink[h]); slot j valid iff j < clamp(len[t], 0, K)
 * and 0 <= idx < T_kv):
 *   Delta = sum_{d<512} out*dout,  P_j = exp(scale*q.kv[idx_j] - L'),  dP_j = dout.kv[idx_j,:512],
 *   dS_j = P_j*(dP_j - Delta);  dq = scale*sum_j dS_j kv[idx_j];  dkv[idx_j] += scale*dS_j q (+ P_j dout
 *   on the first 512 dims);  dsink[h] = -sum_{rows with a valid slot} exp(sink - L')*Delta.
 * Rows without a valid slot, or with lse = +inf, get dq = 0 and contribute nothing.
 *
 * Kernels (all portable: plain fp32 CUDA cores, any arch >= sm_70; the sm_90a tensor-core kernels are
 * cuda/attn_bwd/bwd_sm90_ws.cu and bwd_sm90_h64.cu). prep, convert, keys, offsets and dsink are
 * defined once, in cuda/attn_bwd/bwd_common.cuh, and shared with them; main and the key-major dkv
 * kernel are here.
 *  - prep:      one CTA per token (block-stride loop): Delta, L' and the per-(t,h) dsink partial into
 *               the workspace.
 *  - main<HG>:  one CTA per (token, group of HG heads). The kv rows of NS slots at a time are gathered
 *               into shared memory and shared by the HG heads; s, P, dP, dS recomputed in fp32; dq
 *               accumulated in registers (each thread owns up to 3 of the D dims for all HG heads).
 *               Non-deterministic mode: the dkv contributions of each (t, slot, head group) are fp32
 *               atomicAdds into the [T_kv, D] workspace accumulator. Deterministic mode: dq only.
 *  - convert:   fp32 accumulator -> bf16 dkv for all T_kv rows (non-deterministic mode; with a NULL
 *               source it writes zeros, used for T = 0).
 *  - det path:  keys[i = t*K + j] = idx (invalid slots: the sentinel T_kv), values = t; a stable CUB
 *               radix sort by key (so each kv row's list of referencing tokens is in ascending (t, j)
 *               order, fixed run to run); offsets by binary search; then one CTA per kv row sums
 *               sum_{t in list} sum_{h} [scale*dS*q[t,h] + P*dout[t,h]] in that fixed order,
 *               recomputing s and dP itself (no [T,H,K] P/dS storage: the workspace stays O(T*K))
 *               and writes bf16 dkv directly (rows never referenced get 0).
 *  - dsink:     one CTA per head sums the per-token partials in a fixed order (deterministic in both
 *               modes).
 *
 * Workspace (every region 256-byte aligned; the caller's pointer is aligned up inside, and the
 * 256-byte slack is counted in the size, so any alignment is accepted):
 *   delta   [T, H] f32
 *   lp      [T, H] f32   L', +inf for rows that contribute nothing
 *   part    [T, H] f32   exp(sink - L')*Delta, 0 where excluded
 *   non-deterministic mode:  acc [T_kv, D] f32
 *   deterministic mode:      keys0, keys1 [T*K] u32; vals0, vals1 [T*K] i32; off [T_kv + 1] i64;
 *                            CUB radix-sort temp storage
 * The size therefore depends on `deterministic` (query with the flag you will run with). In the
 * deterministic mode it includes CUB's radix-sort temp size, which CUB derives from the current
 * device: a size query there needs a CUDA device (DSA_ERROR_NO_DEVICE without one); the public op
 * enters the context before sizing a real call.
 */
#include <stdint.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "internal.h"
#include "attn_bwd/bwd_launch.cuh"
#include "attn_bwd/bwd_common.cuh" /* prep, convert, dsink, keys, offsets */

namespace {

constexpr int kThreads = 256;  /* 8 warps; each thread owns dims tid, tid+256, tid+512 of D <= 576 */
constexpr int kWarps = kThreads / 32;
constexpr int kDimsPerThread = 3;
constexpr int kNS = 8;         /* slots gathered per tile in the main kernel (8 x 576 bf16 = 9 KB) */
constexpr int kNE = 8;         /* token entries per step of the deterministic dkv kernel */
constexpr int kValueDim = 512;
constexpr int kMaxD = 576;
constexpr int kMaxHeads = 128;
constexpr size_t kAlign = kBwdAlign;

struct BwdArgs {
  int64_t T, T_kv;
  int H, D, K;
  float scale;
  const uint16_t *q; int64_t q_st, q_sh;
  const uint16_t *kv; int64_t kv_s;
  const int32_t *idx; int64_t idx_s;
  const int32_t *len;
  const float *sink;
  const uint16_t *out; int64_t out_st, out_sh;
  const uint16_t *dout; int64_t dout_st, dout_sh;
  const float *lse;
  uint16_t *dq; int64_t dq_st, dq_sh;
  uint16_t *dkv; int64_t dkv_s;
  float *dsink;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int eff_len(const BwdArgs &a, int64_t t) {
  if (a.len == nullptr) return a.K;
  int l = a.len[t];
  return l < 0 ? 0 : (l > a.K ? a.K : l);
}

__device__ __forceinline__ int slot_idx(const BwdArgs &a, int64_t t, int j, int len) {
  if (j >= len) return -1;
  int v = a.idx[t * a.idx_s + j];
  return (v >= 0 && (int64_t)v < a.T_kv) ? v : -1;
}

/* ---- main: dq (+ atomic dkv) per (token, head group) ----------------------------------------- */
template <int HG>
__global__ void __launch_bounds__(kThreads) bwd_main_kernel(BwdArgs a, const float *delta,
                                                           const float *lp, float *acc_ws,
                                                           int kv_vec) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.D;
  uint16_t *sq = (uint16_t *)smem;        /* [HG][D] */
  uint16_t *sdo = sq + HG * D;            /* [HG][512] */
  uint16_t *skv = sdo + HG * kValueDim;   /* [NS][D], 16-byte aligned (HG*(D+512)*2 % 16 == 0) */
  float *sP = (float *)(skv + kNS * D);   /* [NS][HG] */
  float *sdS = sP + kNS * HG;             /* [NS][HG], scale folded in */
  float *sLp = sdS + kNS * HG;            /* [HG] */
  float *sDelta = sLp + HG;               /* [HG] */
  int *sidx = (int *)(sDelta + HG);       /* [NS] */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = (a.H + HG - 1) / HG;
  const int64_t nblocks = a.T * G;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t t = b / G;
    const int h0 = (int)(b % G) * HG;
    __syncthreads(); /* the previous block iteration's readers are done */
    for (int e = tid; e < HG * D; e += kThreads) {
      const int h = e / D, d = e - h * D;
      sq[e] = (h0 + h < a.H) ? a.q[t * a.q_st + (int64_t)(h0 + h) * a.q_sh + d] : (uint16_t)0;
    }
    for (int e = tid; e < HG * kValueDim; e += kThreads) {
      const int h = e / kValueDim, d = e - h * kValueDim;
      sdo[e] = (h0 + h < a.H) ? a.dout[t * a.dout_st + (int64_t)(h0 + h) * a.dout_sh + d] : (uint16_t)0;
    }
    if (tid < HG) {
      const bool live = h0 + tid < a.H;
      sLp[tid] = live ? lp[t * a.H + h0 + tid] : INFINITY;
      sDelta[tid] = live ? delta[t * a.H + h0 + tid] : 0.f;
    }
    const int len = eff_len(a, t);

    float acc[HG][kDimsPerThread];
#pragma unroll
    for (int h = 0; h < HG; ++h)
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) acc[h][k] = 0.f;

    for (int j0 = 0; j0 < len; j0 += kNS) {
      __syncthreads(); /* previous tile's readers are done (and the q/dout loads on the first) */
      if (tid < kNS) sidx[tid] = slot_idx(a, t, j0 + tid, len);
      __syncthreads();
      if (kv_vec) {
        const int vpr = D / 8; /* uint4 per row */
        for (int e = tid; e < kNS * vpr; e += kThreads) {
          const int j = e / vpr, c = e - j * vpr;
          const int r = sidx[j];
          uint4 v = make_uint4(0, 0, 0, 0);
          if (r >= 0) v = *(const uint4 *)(a.kv + (int64_t)r * a.kv_s + c * 8);
          *(uint4 *)(skv + j * D + c * 8) = v;
        }
      } else {
        for (int e = tid; e < kNS * D; e += kThreads) {
          const int j = e / D, d = e - j * D;
          const int r = sidx[j];
          skv[e] = r >= 0 ? a.kv[(int64_t)r * a.kv_s + d] : (uint16_t)0;
        }
      }
      __syncthreads();
      /* s and dP for every (slot, head) pair: one warp per pair, lanes over dim pairs */
      for (int pr = warp; pr < kNS * HG; pr += kWarps) {
        const int j = pr / HG, h = pr - j * HG;
        float P = 0.f, dS = 0.f;
        const float L = sLp[h];
        if (sidx[j] >= 0 && L != INFINITY) {
          const uint32_t *q2 = (const uint32_t *)(sq + h * D);
          const uint32_t *k2 = (const uint32_t *)(skv + j * D);
          const uint32_t *g2 = (const uint32_t *)(sdo + h * kValueDim);
          float s = 0.f, dp = 0.f;
          for (int d2 = lane; d2 < D / 2; d2 += 32) {
            const uint32_t kk = k2[d2], qq = q2[d2];
            const float k_lo = __uint_as_float(kk << 16), k_hi = __uint_as_float(kk & 0xffff0000u);
            s = fmaf(__uint_as_float(qq << 16), k_lo, s);
            s = fmaf(__uint_as_float(qq & 0xffff0000u), k_hi, s);
            if (d2 < kValueDim / 2) {
              const uint32_t gg = g2[d2];
              dp = fmaf(__uint_as_float(gg << 16), k_lo, dp);
              dp = fmaf(__uint_as_float(gg & 0xffff0000u), k_hi, dp);
            }
          }
          s = warp_sum(s);
          dp = warp_sum(dp);
          P = expf(a.scale * s - L);
          dS = a.scale * P * (dp - sDelta[h]);
        }
        if (lane == 0) {
          sP[j * HG + h] = P;
          sdS[j * HG + h] = dS;
        }
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        const int d = tid + k * kThreads;
        if (d < D) {
          float kvv[kNS];
#pragma unroll
          for (int j = 0; j < kNS; ++j) kvv[j] = bf2f(skv[j * D + d]);
#pragma unroll
          for (int h = 0; h < HG; ++h) {
            float x = acc[h][k];
#pragma unroll
            for (int j = 0; j < kNS; ++j) x = fmaf(sdS[j * HG + h], kvv[j], x);
            acc[h][k] = x;
          }
          if (acc_ws != nullptr) {
            float qv[HG], gv[HG];
#pragma unroll
            for (int h = 0; h < HG; ++h) {
              qv[h] = bf2f(sq[h * D + d]);
              gv[h] = d < kValueDim ? bf2f(sdo[h * kValueDim + d]) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < kNS; ++j) {
              const int r = sidx[j];
              if (r >= 0) {
                float c = 0.f;
#pragma unroll
                for (int h = 0; h < HG; ++h) c = fmaf(sdS[j * HG + h], qv[h], fmaf(sP[j * HG + h], gv[h], c));
                atomicAdd(acc_ws + (int64_t)r * D + d, c);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
      const int d = tid + k * kThreads;
      if (d < D) {
#pragma unroll
        for (int h = 0; h < HG; ++h)
          if (h0 + h < a.H) a.dq[t * a.dq_st + (int64_t)(h0 + h) * a.dq_sh + d] = f2bf(acc[h][k]);
      }
    }
  }
}

/* ---- deterministic dkv: key-major sum over the sorted (token) lists of cuda/attn_bwd/bwd_common.cuh -- */
__global__ void __launch_bounds__(kThreads) bwd_dkv_det_kernel(BwdArgs a, const float *delta,
                                                              const float *lp, const int64_t *off,
                                                              const int32_t *vals) {
  __shared__ float skv[kMaxD];
  __shared__ float sP[kNE * kMaxHeads];
  __shared__ float sdS[kNE * kMaxHeads];
  __shared__ int st[kNE];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int D = a.D, H = a.H;
  for (int64_t r = blockIdx.x; r < a.T_kv; r += gridDim.x) {
    __syncthreads();
    for (int d = tid; d < D; d += kThreads) skv[d] = bf2f(a.kv[r * a.kv_s + d]);
    float acc[kDimsPerThread] = {0.f, 0.f, 0.f};
    const int64_t e1 = off[r + 1];
    for (int64_t e = off[r]; e < e1; e += kNE) {
      const int ne = (int)(e1 - e < kNE ? e1 - e : kNE);
      __syncthreads(); /* skv loaded; the previous step's readers of sP/sdS/st are done */
      if (tid < ne) st[tid] = vals[e + tid];
      __syncthreads();
      for (int pr = warp; pr < ne * H; pr += kWarps) {
        const int i = pr / H, h = pr - i * H;
        const int64_t t = st[i];
        const float L = lp[t * H + h];
        float P = 0.f, dS = 0.f;
        if (L != INFINITY) {
          const uint16_t *qp = a.q + t * a.q_st + (int64_t)h * a.q_sh;
          const uint16_t *gp = a.dout + t * a.dout_st + (int64_t)h * a.dout_sh;
          float s = 0.f, dp = 0.f;
          for (int d = lane; d < D; d += 32) s = fmaf(bf2f(qp[d]), skv[d], s);
          for (int d = lane; d < kValueDim; d += 32) dp = fmaf(bf2f(gp[d]), skv[d], dp);
          s = warp_sum(s);
          dp = warp_sum(dp);
          P = expf(a.scale * s - L);
          dS = a.scale * P * (dp - delta[t * H + h]);
        }
        if (lane == 0) {
          sP[i * H + h] = P;
          sdS[i * H + h] = dS;
        }
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        const int d = tid + k * kThreads;
        if (d < D) {
          float x = acc[k];
          for (int i = 0; i < ne; ++i) {
            const int64_t t = st[i];
            const uint16_t *qp = a.q + t * a.q_st + d;
            const uint16_t *gp = a.dout + t * a.dout_st + d;
            for (int h = 0; h < H; ++h) {
              const float ds = sdS[i * H + h], p = sP[i * H + h];
              if (ds != 0.f || p != 0.f) {
                x = fmaf(ds, bf2f(qp[(int64_t)h * a.q_sh]), x);
                if (d < kValueDim) x = fmaf(p, bf2f(gp[(int64_t)h * a.dout_sh]), x);
              }
            }
          }
          acc[k] = x;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
      const int d = tid + k * kThreads;
      if (d < D) a.dkv[r * a.dkv_s + d] = f2bf(acc[k]);
    }
  }
}

/* ---- host side -------------------------------------------------------------------------------- */
struct Layout {
  size_t delta, lp, part, acc;
  BwdSortLayout sort; /* deterministic mode only (keys0 .. temp; cuda/attn_bwd/bwd_common.cuh) */
  size_t total;
};

dsa_status make_layout(const dsa_attn_bwd_params *p, Layout *L) {
  const size_t th = (size_t)p->num_tokens * (size_t)p->num_heads;
  size_t o = 0;
  *L = Layout();
  L->delta = o; o += bwd_align_up(th * 4);
  L->lp = o; o += bwd_align_up(th * 4);
  L->part = o; o += bwd_align_up(th * 4);
  o += bwd_align_up((size_t)p->num_tokens * 4); /* len (bwd_base_regions) */
  if (!p->deterministic) {
    /* T_kv rows and the sm_90a ws kernel's spare rows (kBwdSpareRows; none without tokens: then no
     * kernel reduces, bwd_zero_tokens) */
    const int64_t rows = p->num_kv + (p->num_tokens > 0 ? kBwdSpareRows : 0);
    L->acc = o; o += bwd_align_up((size_t)rows * (size_t)p->head_dim * 4);
    o += bwd_split_bytes(p); /* the ws kernel's split dQ partials, right after acc */
  } else {
    if (p->num_tokens > INT32_MAX)
      return dsa_fail(DSA_ERROR_UNSUPPORTED,
                      "dsa_sparse_attn_bwd: num_tokens = %lld exceeds 2^31-1 in deterministic mode",
                      (long long)p->num_tokens);
    DSA_TRY(bwd_sort_layout(p->num_tokens * (int64_t)p->topk, p->num_kv, &o, &L->sort));
  }
  L->total = o + kAlign; /* slack: the caller's pointer is aligned up inside */
  return DSA_SUCCESS;
}

BwdArgs make_args(const dsa_attn_bwd_params *p) {
  BwdArgs a;
  a.T = p->num_tokens; a.T_kv = p->num_kv; a.H = p->num_heads; a.D = p->head_dim; a.K = p->topk;
  a.scale = p->softmax_scale;
  a.q = p->q; a.q_st = p->q_stride_token; a.q_sh = p->q_stride_head;
  a.kv = p->kv; a.kv_s = p->kv_stride;
  a.idx = p->indices; a.idx_s = p->indices_stride;
  a.len = p->topk_length; a.sink = p->sink;
  a.out = p->out; a.out_st = p->out_stride_token; a.out_sh = p->out_stride_head;
  a.dout = p->dout; a.dout_st = p->dout_stride_token; a.dout_sh = p->dout_stride_head;
  a.lse = p->lse;
  a.dq = p->dq; a.dq_st = p->dq_stride_token; a.dq_sh = p->dq_stride_head;
  a.dkv = p->dkv; a.dkv_s = p->dkv_stride;
  a.dsink = p->dsink;
  return a;
}

/* Dynamic shared memory of bwd_main_kernel<HG> at head dim D: at most 45216 B (HG = 16, D = 576),
 * under the 48 KB every device grants without opting in, so no cudaFuncSetAttribute is ever needed
 * (asserted here; the launcher runs none). */
constexpr size_t main_smem_bytes(int HG, int D) {
  return (size_t)HG * (D + kValueDim) * 2 + (size_t)kNS * D * 2 + (size_t)(2 * kNS * HG + 2 * HG) * 4 + kNS * 4;
}
static_assert(main_smem_bytes(16, kMaxD) <= 48 * 1024, "portable main kernel: no opt-in shared memory");

template <int HG>
cudaError_t launch_main(const BwdArgs &a, const float *delta, const float *lp, float *acc,
                        int kv_vec, cudaStream_t stream) {
  const size_t smem = main_smem_bytes(HG, a.D);
  const int G = (a.H + HG - 1) / HG;
  bwd_main_kernel<HG><<<bwd_grid_for(a.T * G, 1, INT32_MAX), kThreads, smem, stream>>>(a, delta, lp,
                                                                                      acc, kv_vec);
  return cudaGetLastError();
}

}  // namespace

extern "C" dsa_status dsa_bwd_portable_workspace_size(const dsa_attn_bwd_params *p, size_t *bytes) {
  Layout L;
  DSA_TRY(make_layout(p, &L));
  *bytes = L.total;
  return DSA_SUCCESS;
}

extern "C" dsa_status dsa_bwd_launch_portable(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                              void *workspace, cudaStream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  Layout L;
  DSA_TRY(make_layout(p, &L));
  const BwdArgs a = make_args(p);
  unsigned char *ws = bwd_align_workspace(workspace);
  float *delta = (float *)(ws + L.delta), *lp = (float *)(ws + L.lp), *part = (float *)(ws + L.part);
  cudaError_t e;

  if (a.T == 0) return bwd_zero_tokens(p, part, stream); /* dkv = 0, dsink = 0 */

  DSA_TRY(bwd_launch_prep(p, delta, lp, part, stream));

  float *acc = p->deterministic ? nullptr : (float *)(ws + L.acc);
  if (acc != nullptr && a.T_kv > 0)
    DSA_TRY(dsa_cuda_status(cudaMemsetAsync(acc, 0, (size_t)a.T_kv * a.D * 4, stream), fn));

  const int kv_vec = ((uintptr_t)a.kv % 16 == 0) && (a.kv_s % 8 == 0) && (a.D % 8 == 0);
  const int hm = a.H < 16 ? a.H : 16;
  if (hm <= 1) e = launch_main<1>(a, delta, lp, acc, kv_vec, stream);
  else if (hm <= 2) e = launch_main<2>(a, delta, lp, acc, kv_vec, stream);
  else if (hm <= 4) e = launch_main<4>(a, delta, lp, acc, kv_vec, stream);
  else if (hm <= 8) e = launch_main<8>(a, delta, lp, acc, kv_vec, stream);
  else e = launch_main<16>(a, delta, lp, acc, kv_vec, stream);
  DSA_TRY(dsa_cuda_status(e, fn));

  if (a.T_kv > 0) {
    if (!p->deterministic) {
      DSA_TRY(bwd_launch_convert(p, acc, stream));
    } else {
      /* keys = kv rows of all T * K slots, values = tokens; stable sort; then one CTA per kv row */
      const int64_t n = a.T * (int64_t)a.K;
      const int32_t *vals = nullptr;
      const int64_t *off = (const int64_t *)(ws + L.sort.off);
      DSA_TRY(bwd_launch_sorted_keys(p, 0, n, 1, L.sort, ws, &vals, stream));
      bwd_dkv_det_kernel<<<bwd_grid_for(a.T_kv, 1, kBwdGridCap), kThreads, 0, stream>>>(a, delta, lp, off, vals);
      DSA_TRY(dsa_cuda_status(cudaGetLastError(), fn));
    }
  }
  if (a.dsink) DSA_TRY(bwd_launch_dsink(p, part, stream));
  (void)ctx;
  return DSA_SUCCESS;
}
