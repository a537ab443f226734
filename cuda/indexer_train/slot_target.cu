/*
 * slot_target.cu - dsa_attn_slot_target's CUDA-core kernel (dsa_st_launch_portable,
 * cuda/indexer_train/train_launch.cuh; docs/indexer-training.md section 1): the attention's probability mass at each selected slot, summed over the heads,
 *   a[t, j] = sum_h exp(scale * q[t, h, :D] . kv[s_j, :D] - L'[t, h]),  L' = logaddexp(lse, sink[h]),
 * a head with lse = +inf contributing 0, invalid slots 0 (read nothing).
 *
 * One CTA per token (block-stride over tokens), 256 threads. Per token: L' of every head into shared
 * memory; then the valid prefix of the row (j < clamp(topk_length, 0, K)) in tiles of 16 slots: the
 * tile's kv rows are gathered into shared memory (16-byte vectors; a slot whose index is out of range
 * gets zeros and is skipped), one warp per (slot, head) pair computes the fp32 dot product (q read
 * from global memory, 16-byte vectors), and P lands in a [16][H] shared array; then thread j sums
 * its slot's P over the heads in ascending order and writes a[t, j]. No atomics, every sum in a fixed
 * order: bitwise reproducible. Slots past the row's length are written 0 up front.
 *
 * The CUDA-core kernel: q is re-read (through L1 / L2) once per slot. Every device and configuration;
 * on cc 9.0 the tensor-core kernel of slot_target_sm90.cu runs instead where it can.
 */
#include <math.h>
#include "internal.h"
#include "indexer_train/train_common.cuh"
#include "indexer_train/train_launch.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kNS = 16;        /* slots per tile: 16 x 576 bf16 = 18 KB of kv */
constexpr int kMaxD = 576;
constexpr int kMaxHeads = DSA_MAX_HEADS;
static_assert(kNS <= kThreads, "one thread per slot sums the heads");
static_assert(kMaxHeads <= kThreads, "one thread per head computes L'");

/* logaddexp as the reference computes it (src/reference_train.c), in fp32. */
__device__ __forceinline__ float logaddexp_f(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  return fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

__global__ void __launch_bounds__(kThreads) slot_target_kernel(const __grid_constant__ dsa_slot_target_params p) {
  __shared__ __align__(16) uint16_t skv[kNS * kMaxD];
  __shared__ float sP[kNS * kMaxHeads]; /* [slot][head] */
  __shared__ float sL[kMaxHeads];       /* L'; +inf: the head contributes nothing */
  __shared__ int sidx[kNS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads, D = p.head_dim, K = p.topk;
  const int vpr = D / 8; /* 16-byte vectors per row: 72 or 64 */
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    __syncthreads(); /* the previous token's readers of sL / sP are done */
    if (tid < H) {
      const float lse = p.lse[t * H + tid];
      sL[tid] = lse == INFINITY ? INFINITY : logaddexp_f(lse, p.sink ? p.sink[tid] : -INFINITY);
    }
    const int len = tr_eff_len(p.topk_length, t, K);
    const int32_t *row = p.indices + t * p.indices_stride;
    float *out = p.target + t * p.target_stride;
    for (int j = len + tid; j < K; j += kThreads) out[j] = 0.f;
    for (int j0 = 0; j0 < len; j0 += kNS) {
      const int ns = len - j0 < kNS ? len - j0 : kNS;
      __syncthreads(); /* the previous tile's readers are done (and sL written on the first) */
      if (tid < kNS) sidx[tid] = tid < ns ? tr_slot_row(row, j0 + tid, len, p.num_kv) : -1;
      __syncthreads();
      for (int e = tid; e < ns * vpr; e += kThreads) {
        const int j = e / vpr, c = e - j * vpr;
        const int r = sidx[j];
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r >= 0) v = __ldg((const uint4 *)(p.kv + (int64_t)r * p.kv_stride) + c);
        *(uint4 *)(skv + j * D + c * 8) = v;
      }
      __syncthreads();
      for (int pr = warp; pr < ns * H; pr += kWarps) {
        const int j = pr / H, h = pr - j * H;
        float P = 0.f;
        const float L = sL[h];
        if (sidx[j] >= 0 && L != INFINITY) { /* warp-uniform */
          const uint4 *q4 = (const uint4 *)(p.q + t * p.q_stride_token + (int64_t)h * p.q_stride_head);
          const uint4 *k4 = (const uint4 *)(skv + j * D);
          float s = 0.f;
          for (int c = lane; c < vpr; c += 32) s = tr_dot8(__ldg(q4 + c), k4[c], s);
          s = tr_warp_sum(s);
          P = expf(p.softmax_scale * s - L);
        }
        if (lane == 0) sP[j * H + h] = P;
      }
      __syncthreads();
      if (tid < ns) {
        float a = 0.f;
        for (int h = 0; h < H; ++h) a += sP[tid * H + h];
        out[j0 + tid] = sidx[tid] >= 0 ? a : 0.f;
      }
    }
  }
}

}  // namespace

extern "C" dsa_status dsa_st_launch_portable(const dsa_slot_target_params *p, cudaStream_t stream) {
  slot_target_kernel<<<tr_grid_for(p->num_tokens, 1), kThreads, 0, stream>>>(*p);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_attn_slot_target");
}
