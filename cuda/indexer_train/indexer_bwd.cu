/*
 * indexer_bwd.cu - the indexer's side of indexer training (docs/indexer-training.md sections 2 and 4):
 * dsa_indexer_slot_scores' CUDA-core kernel and dsa_indexer_bwd's CUDA-core passes and workspace
 * layout (cuda/indexer_train/train_launch.cuh; the family's dispatch point,
 * cuda/indexer_train/dispatch.cu, chooses between them and the sm_90a kernels). One file because both recompute the same per-(slot, head) logit
 * x = q_idx[t, h] . k_idx[s_j] with the same code (head_dot: fp32 fma in dimension order), so the
 * backward's ReLU' = [x > 0] decisions are those of the forward scores and are identical in all of
 * its kernels.
 *
 * Kernels (CUDA cores, fp32 accumulation; 256-thread CTAs unless said):
 *  - slot scores: one CTA per token (block-stride). q_idx[t] (H <= 64 rows of 128, padded to 136
 *    bf16 in shared memory: conflict-free 16-byte reads when each lane reads another head) and
 *    w[t] are staged; one warp per slot loads its key row into registers (16 x 16 B, a broadcast
 *    load), lane l computes the heads l and l + 32, z = warp butterfly of sum w ReLU(x).
 *  - bwd token<NI>: one CTA per token, no atomics for its own outputs. Tiles of 8 slots, one warp
 *    per slot: the warp computes x for every head and stores c = g w [x > 0] and r = g ReLU(x) per
 *    (slot, head) plus the key row (fp32) in shared memory; then thread h sums d_weights[t, h] over
 *    the slots in ascending order, and each thread owns NI of the H x 128 d_index_q elements
 *    (element e = tid + 256 i: head e / 128, dim e % 128) and adds sum_slot c k in slot order.
 *    Non-deterministic mode: the tile's d_index_k contributions sum_h c q[h] (slot, dim) are fp32
 *    atomicAdds into the [T_k, 128] accumulator.
 *  - convert: fp32 accumulator -> bf16 d_index_k for every key row (a NULL source writes zeros:
 *    T = 0).
 *  - deterministic d_index_k: keys[i] = the key row of slot i = t K + j (valid slots; invalid:
 *    the sentinel T_k), values = i; a stable CUB radix sort by key (each key's entries in ascending
 *    (t, j) order, fixed run to run); off[r] = first sorted position with key >= r (binary search);
 *    then one CTA of 128 threads (one per dim) per key row: 4 entries at a time (one warp each)
 *    recompute x for every head of the entry's token and store c = g w [x > 0]; thread d adds
 *    c q[t, h, d] over the entries in sorted order and the heads in ascending order, then writes
 *    bf16 d_index_k[r, d] (0 for rows nothing references). No atomics: bitwise reproducible.
 *  - deterministic d_index_k from slot rows (where the sm_90a kernel runs: the automatic choice on
 *    cc 9.0, DSA_OPTION_TRAIN_KERNEL forces either pass): the same sort and offsets, then per chunk
 *    of kIbDetChunkTokens tokens the sm_90a kernel writes each valid slot's fp32 dK row (the
 *    tensor-core G q of the non-deterministic mode) and dk_rows_reduce_kernel adds them per key in
 *    sorted order onto the key's fp32 sum (one warp per key, a cursor per key carried between
 *    chunks); the last chunk writes bf16 d_index_k.
 *
 * Workspace (the caller's pointer aligned up to 256 B; regions 256-B aligned; the slack counted):
 *   deterministic = 0: acc [T_k, 128] f32;
 *   deterministic = 1: keys0, keys1 [T K] u32, vals0, vals1 [T K] i32, off [T_k + 1] i64, CUB's
 *   radix-sort temp for T K pairs (CUB sizes it from the current device: the size query needs one),
 *   and for the slot-rows pass (T K > 0) rows [min(T, kIbDetChunkTokens) K, 128] f32, cursor [T_k]
 *   i64, acc [T_k, 128] f32 (counted whichever pass runs: the size query has no context).
 */
#include <math.h>
#include <cub/device/device_radix_sort.cuh>
#include "internal.h"
#include "indexer_train/train_common.cuh"
#include "indexer_train/train_launch.cuh"
#include "common/radix_sort.cuh"

/* CUB lives in dsa_cub::cub (-DCUB_WRAPPED_NAMESPACE); CUB_NS_QUALIFIER names it either way. */
namespace cub = CUB_NS_QUALIFIER;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kD = DSA_INDEX_HEAD_DIM; /* 128 */
constexpr int kVec = kD / 8;           /* 16-byte vectors per row */
constexpr int kQPad = kD + 8;          /* padded shared q row: 272 B, 68 banks apart */
constexpr int kMaxH = 64;
constexpr int kNS = kWarps;            /* slots per backward tile: one per warp */
constexpr int kDetThreads = kD;        /* deterministic d_index_k: one thread per dim */
constexpr int kNE = kDetThreads / 32;  /* entries per step: one per warp */
static_assert(kMaxH <= kThreads && kD % 32 == 0, "thread h sums d_weights; lanes split the dims");

/* Stages q_idx[t] (padded rows) and w[t] (fp32) of either params struct in shared memory. */
template <class P>
__device__ __forceinline__ void load_token(const P &p, int64_t t, uint16_t *sq, float *sw) {
  const int tid = threadIdx.x, H = p.num_heads;
  for (int e = tid; e < H * kVec; e += blockDim.x) {
    const int h = e / kVec, c = e - h * kVec;
    const uint4 *q4 = (const uint4 *)(p.index_q + t * p.q_stride_token + (int64_t)h * p.q_stride_head);
    *(uint4 *)(sq + h * kQPad + c * 8) = __ldg(q4 + c);
  }
  if (tid < H) sw[tid] = tr_weight(p.weights, p.weights_dtype == DSA_DTYPE_BF16, p.weights_stride, t, tid);
}

/* x = q . k for a q row in 16-byte vectors (shared or global) and a key row in registers or shared
 * memory; the one summation order of every kernel here. */
__device__ __forceinline__ float head_dot(const uint4 *q4, const uint4 *k4) {
  float x = 0.f;
#pragma unroll
  for (int c = 0; c < kVec; ++c) x = tr_dot8(q4[c], k4[c], x);
  return x;
}

__device__ __forceinline__ void load_key(const uint16_t *k, int64_t stride, int r, uint4 kk[kVec]) {
  const uint4 *k4 = (const uint4 *)(k + (int64_t)r * stride);
#pragma unroll
  for (int c = 0; c < kVec; ++c) kk[c] = __ldg(k4 + c);
}

/* ---- slot scores ------------------------------------------------------------------------------- */
__global__ void __launch_bounds__(kThreads) slot_scores_kernel(const __grid_constant__ dsa_indexer_slot_scores_params p) {
  __shared__ __align__(16) uint16_t sq[kMaxH * kQPad];
  __shared__ float sw[kMaxH];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads, K = p.topk;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    __syncthreads(); /* the previous token's readers are done */
    load_token(p, t, sq, sw);
    __syncthreads();
    const int len = tr_eff_len(p.lengths, t, K);
    const int32_t *row = p.indices + t * p.indices_stride;
    float *out = p.scores + t * p.scores_stride;
    for (int j = warp; j < K; j += kWarps) {
      const int r = tr_slot_row(row, j, len, p.num_keys);
      float z = 0.f;
      if (r >= 0) { /* warp-uniform */
        uint4 kk[kVec];
        load_key(p.index_k, p.k_stride, r, kk);
        for (int h = lane; h < H; h += 32)
          z = fmaf(sw[h], tr_relu(head_dot((const uint4 *)(sq + h * kQPad), kk)), z);
        z = tr_warp_sum(z);
      }
      if (lane == 0) out[j] = z;
    }
  }
}

/* ---- backward, per token: d_weights, d_index_q (+ atomic d_index_k) ----------------------------- */
template <int NI>
__global__ void __launch_bounds__(kThreads) bwd_token_kernel(const __grid_constant__ dsa_indexer_bwd_params p,
                                                             float *acc_ws) {
  __shared__ __align__(16) uint16_t sq[kMaxH * kQPad];
  __shared__ float sw[kMaxH];
  __shared__ float sk[kNS * kD];    /* the tile's key rows, fp32 (0 for invalid slots) */
  __shared__ float sc[kNS * kMaxH]; /* g w [x > 0] */
  __shared__ float sr[kNS * kMaxH]; /* g ReLU(x) */
  __shared__ int sidx[kNS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads, K = p.topk;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    __syncthreads(); /* the previous token's readers are done */
    load_token(p, t, sq, sw);
    const int len = tr_eff_len(p.lengths, t, K);
    const int32_t *row = p.indices + t * p.indices_stride;
    const float *g = p.grad + t * p.grad_stride;
    float dq[NI];
#pragma unroll
    for (int i = 0; i < NI; ++i) dq[i] = 0.f;
    float dw = 0.f;
    for (int j0 = 0; j0 < len; j0 += kNS) {
      __syncthreads(); /* the previous tile's readers are done (q and w staged on the first) */
      {
        const int r = tr_slot_row(row, j0 + warp, len, p.num_keys);
        if (lane == 0) sidx[warp] = r;
        if (r >= 0) { /* warp-uniform */
          const float gj = g[j0 + warp];
          uint4 kk[kVec];
          load_key(p.index_k, p.k_stride, r, kk);
          for (int h = lane; h < kMaxH; h += 32) {
            float c = 0.f, rr = 0.f;
            if (h < H) {
              const float x = head_dot((const uint4 *)(sq + h * kQPad), kk);
              c = x > 0.f ? gj * sw[h] : 0.f; /* ReLU' = [x > 0]: 0 at 0 and for NaN */
              rr = gj * tr_relu(x);
            }
            sc[warp * kMaxH + h] = c;
            sr[warp * kMaxH + h] = rr;
          }
          const uint16_t *kr = p.index_k + (int64_t)r * p.k_stride;
          for (int d = lane; d < kD; d += 32) sk[warp * kD + d] = tr_bf2f(kr[d]);
        } else { /* an invalid slot reads nothing and contributes nothing */
          for (int h = lane; h < kMaxH; h += 32) sc[warp * kMaxH + h] = sr[warp * kMaxH + h] = 0.f;
          for (int d = lane; d < kD; d += 32) sk[warp * kD + d] = 0.f;
        }
      }
      __syncthreads();
      if (tid < H)
        for (int s = 0; s < kNS; ++s) dw += sr[s * kMaxH + tid];
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int e = tid + i * kThreads, h = e / kD, d = e % kD;
        if (h < H) {
          float x = dq[i];
#pragma unroll
          for (int s = 0; s < kNS; ++s) x = fmaf(sc[s * kMaxH + h], sk[s * kD + d], x);
          dq[i] = x;
        }
      }
      if (acc_ws != nullptr) {
        for (int e = tid; e < kNS * kD; e += kThreads) {
          const int s = e / kD, d = e % kD, r = sidx[s];
          if (r >= 0) {
            float c = 0.f;
            for (int h = 0; h < H; ++h) c = fmaf(sc[s * kMaxH + h], tr_bf2f(sq[h * kQPad + d]), c);
            atomicAdd(acc_ws + (int64_t)r * kD + d, c);
          }
        }
      }
    }
    if (tid < H) p.d_weights[t * p.dw_stride + tid] = dw;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int e = tid + i * kThreads, h = e / kD, d = e % kD;
      if (h < H) p.d_index_q[t * p.dq_stride_token + (int64_t)h * p.dq_stride_head + d] = tr_f2bf(dq[i]);
    }
  }
}

/* ---- fp32 accumulator [T_k, 128] -> bf16 d_index_k (src NULL: zeros) ---------------------------- */
__global__ void dk_convert_kernel(const __grid_constant__ dsa_indexer_bwd_params p, const float *src) {
  const int64_t n = p.num_keys * kD;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / kD, d = i % kD;
    p.d_index_k[r * p.dk_stride + d] = src ? tr_f2bf(src[i]) : (uint16_t)0;
  }
}

/* ---- deterministic d_index_k ------------------------------------------------------------------ */
/* Entry i < T K (token i / K, slot i % K): key = its key row when valid, else the sentinel T_k. */
__global__ void dk_keys_kernel(const __grid_constant__ dsa_indexer_bwd_params p, int64_t n, uint32_t *keys,
                               int32_t *vals) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / p.topk;
    const int j = (int)(i - t * p.topk);
    const int r = tr_slot_row(p.indices + t * p.indices_stride, j, tr_eff_len(p.lengths, t, p.topk), p.num_keys);
    keys[i] = r >= 0 ? (uint32_t)r : (uint32_t)p.num_keys;
    vals[i] = (int32_t)i;
  }
}


__global__ void __launch_bounds__(kDetThreads) dk_det_kernel(const __grid_constant__ dsa_indexer_bwd_params p,
                                                             const int64_t *off, const int32_t *vals) {
  __shared__ __align__(16) uint16_t sk[kD];
  __shared__ float sc[kNE * kMaxH]; /* g w [x > 0] per (entry, head) */
  __shared__ int64_t st[kNE];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads, K = p.topk;
  const int wbf16 = p.weights_dtype == DSA_DTYPE_BF16;
  for (int64_t r = blockIdx.x; r < p.num_keys; r += gridDim.x) {
    __syncthreads(); /* the previous row's readers of sk are done */
    if (tid < kVec) ((uint4 *)sk)[tid] = __ldg((const uint4 *)(p.index_k + r * p.k_stride) + tid);
    float acc = 0.f;
    const int64_t e1 = off[r + 1];
    for (int64_t e = off[r]; e < e1; e += kNE) {
      const int ne = e1 - e < kNE ? (int)(e1 - e) : kNE;
      __syncthreads(); /* sk loaded; the previous step's readers of sc / st are done */
      if (warp < ne) { /* warp-uniform */
        const int v = vals[e + warp];
        const int64_t t = v / K;
        const int j = (int)(v - t * K);
        const float gj = p.grad[t * p.grad_stride + j];
        for (int h = lane; h < kMaxH; h += 32) {
          float c = 0.f;
          if (h < H) {
            const uint4 *q4 = (const uint4 *)(p.index_q + t * p.q_stride_token + (int64_t)h * p.q_stride_head);
            uint4 qq[kVec];
#pragma unroll
            for (int i = 0; i < kVec; ++i) qq[i] = __ldg(q4 + i);
            const float x = head_dot(qq, (const uint4 *)sk);
            if (x > 0.f) c = gj * tr_weight(p.weights, wbf16, p.weights_stride, t, h);
          }
          sc[warp * kMaxH + h] = c;
        }
        if (lane == 0) st[warp] = t;
      }
      __syncthreads();
      for (int i = 0; i < ne; ++i) {
        const uint16_t *qt = p.index_q + st[i] * p.q_stride_token + tid;
        for (int h = 0; h < H; ++h) {
          const float c = sc[i * kMaxH + h];
          if (c != 0.f) acc = fmaf(c, tr_bf2f(qt[(int64_t)h * p.q_stride_head]), acc);
        }
      }
    }
    p.d_index_k[r * p.dk_stride + tid] = tr_f2bf(acc);
  }
}

/* The deterministic d_index_k from the sm_90a kernel's slot rows, one chunk of tokens [t0, t1) at a
 * time: one warp per key row r (lane l: dims 4 l .. 4 l + 3) continues where the previous chunk
 * stopped in r's sorted entries (cursor[r]; off[r] for the first chunk), adds the rows of the entries
 * whose token is below t1 in that order onto its fp32 sum (acc[r], 0 for the first chunk), and keeps
 * the sum (acc) and the position (cursor), or writes bf16 d_index_k after the last chunk. Every key's
 * terms are added one at a time in ascending (t, j): bitwise reproducible. The entries are read
 * kDkRedBatch at a time (their rows' loads in flight together, then added in order): a key's entries
 * of one chunk are a prefix of what is left (ascending v = t K + j, so v < t1 K), and one load per
 * round trip left the pass latency-bound. */
constexpr int kDkRedBatch = 8;
__global__ void dk_rows_reduce_kernel(const __grid_constant__ dsa_indexer_bwd_params p, const int64_t *off,
                                      const int32_t *vals, int64_t *cursor, const float *rows, float *acc, int64_t t0,
                                      int64_t t1, int first, int last) {
  const int lane = threadIdx.x & 31;
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int64_t K = p.topk;
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < p.num_keys; r += nw) {
    int64_t e = first ? off[r] : cursor[r];
    const int64_t e1 = off[r + 1];
    const bool any = e < e1 && vals[e] / K < t1;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!first && (any || last)) a = ((const float4 *)(acc + r * kD))[lane];
    if (any) {
      const int64_t vend = t1 * K; /* entries of tokens below t1 */
      for (;;) {
        int64_t v[kDkRedBatch];
        float4 u[kDkRedBatch];
#pragma unroll
        for (int i = 0; i < kDkRedBatch; ++i) v[i] = e + i < e1 ? (int64_t)vals[e + i] : vend;
#pragma unroll
        for (int i = 0; i < kDkRedBatch; ++i)
          if (v[i] < vend) u[i] = ((const float4 *)(rows + (v[i] - t0 * K) * kD))[lane];
        int n = 0;
#pragma unroll
        for (int i = 0; i < kDkRedBatch; ++i) {
          if (v[i] < vend) {
            a.x += u[i].x;
            a.y += u[i].y;
            a.z += u[i].z;
            a.w += u[i].w;
            ++n;
          }
        }
        e += n;
        if (n < kDkRedBatch) break;
      }
    }
    if (last) {
      uint16_t *d = p.d_index_k + r * p.dk_stride + 4 * lane;
      d[0] = tr_f2bf(a.x);
      d[1] = tr_f2bf(a.y);
      d[2] = tr_f2bf(a.z);
      d[3] = tr_f2bf(a.w);
    } else {
      if (first || any) ((float4 *)(acc + r * kD))[lane] = a;
      if (lane == 0) cursor[r] = e;
    }
  }
}

/* ---- host side -------------------------------------------------------------------------------- */
template <int NI>
cudaError_t launch_token(const dsa_indexer_bwd_params *p, float *acc, cudaStream_t stream) {
  bwd_token_kernel<NI><<<tr_grid_for(p->num_tokens, 1), kThreads, 0, stream>>>(*p, acc);
  return cudaGetLastError();
}

}  // namespace

extern "C" dsa_status dsa_ib_layout(const dsa_indexer_bwd_params *p, IbLayout *L) {
  *L = IbLayout();
  size_t o = 0;
  if (!p->deterministic) {
    L->acc = o; o += tr_align_up((size_t)p->num_keys * kD * 4);
  } else {
    const int64_t n = p->num_tokens * (int64_t)p->topk;
    if (n > INT32_MAX)
      return dsa_fail(DSA_ERROR_UNSUPPORTED,
                      "dsa_indexer_bwd: num_tokens * topk = %lld exceeds 2^31-1 in deterministic mode",
                      (long long)n);
    L->end_bit = dsa_radix_key_bits(p->num_keys);
    L->keys0 = o; o += tr_align_up((size_t)n * 4);
    L->keys1 = o; o += tr_align_up((size_t)n * 4);
    L->vals0 = o; o += tr_align_up((size_t)n * 4);
    L->vals1 = o; o += tr_align_up((size_t)n * 4);
    L->off = o; o += tr_align_up(((size_t)p->num_keys + 1) * 8);
    if (n > 0 && p->num_keys > 0) DSA_TRY(dsa_radix_sort_temp_bytes(n, L->end_bit, &L->temp_bytes, "dsa_indexer_bwd"));
    L->temp = o; o += tr_align_up(L->temp_bytes);
    if (n > 0) { /* the slot-rows pass (nothing to sum without a slot) */
      const int64_t chunk = p->num_tokens < kIbDetChunkTokens ? p->num_tokens : kIbDetChunkTokens;
      L->rows = o; o += tr_align_up((size_t)chunk * (size_t)p->topk * kD * 4);
      L->cursor = o; o += tr_align_up((size_t)p->num_keys * 8);
      L->acc = o; o += tr_align_up((size_t)p->num_keys * kD * 4);
    }
  }
  L->total = o + kTrainAlign; /* slack: the caller's pointer is aligned up inside */
  return DSA_SUCCESS;
}

extern "C" dsa_status dsa_ss_launch_portable(const dsa_indexer_slot_scores_params *p, cudaStream_t stream) {
  slot_scores_kernel<<<tr_grid_for(p->num_tokens, 1), kThreads, 0, stream>>>(*p);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_indexer_slot_scores");
}

extern "C" dsa_status dsa_ib_launch_token_portable(const dsa_indexer_bwd_params *p, float *acc, cudaStream_t stream) {
  const int H = p->num_heads; /* NI >= ceil(H * 128 / 256) elements of d_index_q per thread */
  cudaError_t e;
  if (H <= 2) e = launch_token<1>(p, acc, stream);
  else if (H <= 4) e = launch_token<2>(p, acc, stream);
  else if (H <= 8) e = launch_token<4>(p, acc, stream);
  else if (H <= 16) e = launch_token<8>(p, acc, stream);
  else if (H <= 32) e = launch_token<16>(p, acc, stream);
  else e = launch_token<32>(p, acc, stream);
  return dsa_cuda_status((int)e, "dsa_indexer_bwd");
}

extern "C" dsa_status dsa_ib_launch_convert(const dsa_indexer_bwd_params *p, const float *acc, cudaStream_t stream) {
  dk_convert_kernel<<<tr_grid_for(p->num_keys * kD, kThreads), kThreads, 0, stream>>>(*p, acc);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_indexer_bwd");
}

extern "C" dsa_status dsa_ib_launch_sort(const dsa_indexer_bwd_params *p, unsigned char *ws, const IbLayout *L,
                                         const int32_t **vals, cudaStream_t stream) {
  static const char fn[] = "dsa_indexer_bwd";
  const int64_t Tk = p->num_keys;
  const int64_t n = p->num_tokens * (int64_t)p->topk;
  uint32_t *k0 = (uint32_t *)(ws + L->keys0), *k1 = (uint32_t *)(ws + L->keys1);
  int32_t *v0 = (int32_t *)(ws + L->vals0), *v1 = (int32_t *)(ws + L->vals1);
  int64_t *off = (int64_t *)(ws + L->off);
  dk_keys_kernel<<<tr_grid_for(n, kThreads), kThreads, 0, stream>>>(*p, n, k0, v0);
  DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  cub::DoubleBuffer<uint32_t> kb(k0, k1);
  cub::DoubleBuffer<int32_t> vb(v0, v1);
  size_t tb = L->temp_bytes;
  DSA_TRY(dsa_cuda_status((int)cub::DeviceRadixSort::SortPairs(ws + L->temp, tb, kb, vb, n, 0, L->end_bit, stream), fn));
  dsa_sorted_key_offsets_kernel<<<tr_grid_for(Tk + 1, kThreads), kThreads, 0, stream>>>(kb.Current(), n, Tk, off);
  DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  *vals = vb.Current();
  return DSA_SUCCESS;
}

extern "C" dsa_status dsa_ib_launch_det(const dsa_indexer_bwd_params *p, const int64_t *off, const int32_t *vals,
                                        cudaStream_t stream) {
  dk_det_kernel<<<tr_grid_for(p->num_keys, 1), kDetThreads, 0, stream>>>(*p, off, vals);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_indexer_bwd");
}

extern "C" dsa_status dsa_ib_launch_rows_reduce(const dsa_indexer_bwd_params *p, const int64_t *off,
                                                const int32_t *vals, int64_t *cursor, const float *rows, float *sums,
                                                int64_t t0, int64_t t1, cudaStream_t stream) {
  dk_rows_reduce_kernel<<<tr_grid_for(p->num_keys, kThreads / 32), kThreads, 0, stream>>>(
      *p, off, vals, cursor, rows, sums, t0, t1, t0 == 0, t1 == p->num_tokens);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_indexer_bwd");
}
