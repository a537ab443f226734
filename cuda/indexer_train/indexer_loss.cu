/*
 * indexer_loss.cu - dsa_indexer_loss's kernels (dsa_launch_indexer_loss, src/kernels.h: the op has
 * one kernel sequence, so its launcher is the family's for this op; docs/indexer-training.md section 3): the KL loss between the normalised attention target and the indexer's softmax over
 * each row's valid slots, in log-softmax form, and its score gradient. Three launches, all in a
 * fixed summation order (no atomics), so the loss and g are bitwise reproducible run to run:
 *  - rows:   one CTA per row (block-stride), 256 threads over the slots. Block reductions (warp
 *            butterfly, then warp 0 over the 8 warp partials in order) give the valid count,
 *            sum_V a and m = max_V z; the row counts iff it has a valid slot and sum_V a > 0. For a
 *            counted row: lz = m + log sum_V exp(z - m) and the row's KL term
 *            sum_V tgt (log tgt - (z - lz)) (tgt = a / sum_V a; a term with tgt = 0 is 0, a negative
 *            tgt makes it NaN). Writes the term (0 for rows that do not count), lz, sum_V a and
 *            the counted flag per row into the workspace.
 *  - reduce: one CTA of 256 threads: thread i sums the row terms i, i + 256, ... in ascending order
 *            in double (and counts N), then a fixed shared-memory tree; thread 0 writes
 *            loss = coeff / N * sum (0 when N = 0) and the gradient factor grad_loss * coeff / N.
 *  - grad:   (when grad is given) one CTA per row: g = factor * (exp(z - lz) - a / sum_V a) on the
 *            valid slots of counted rows, 0 elsewhere (every slot of the row written).
 * T = 0: only the reduce runs (loss = 0).
 *
 * Workspace (from the caller's pointer aligned up to 256 B; every region 256-B aligned; the slack
 * is counted): term, lz, suma [T] f32, counted [T] i32, then 256 B of scalars (the factor):
 * 4 * align256(4 T) + 256 + 256 bytes.
 */
#include <math.h>
#include "internal.h"
#include "indexer_train/train_common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct LossLayout {
  size_t term, lz, suma, counted, scal, total;
};

LossLayout loss_layout(int64_t T) {
  const size_t row = tr_align_up((size_t)T * 4);
  LossLayout L;
  L.term = 0;
  L.lz = row;
  L.suma = 2 * row;
  L.counted = 3 * row;
  L.scal = 4 * row;
  L.total = L.scal + kTrainAlign + kTrainAlign; /* scalars, then the alignment slack */
  return L;
}

/* Block reductions over kThreads threads in a fixed order; `red` holds kWarps floats; every thread
 * gets the result. */
__device__ __forceinline__ float block_sum(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = tr_warp_sum(v);
  __syncthreads(); /* red's previous readers are done */
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}

__device__ __forceinline__ float block_max(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w]);
  return m;
}

__device__ __forceinline__ bool slot_valid(const dsa_indexer_loss_params &p, const int32_t *row, int j,
                                           int len) {
  return tr_slot_row(row, j, len, p.num_keys) >= 0;
}

__global__ void __launch_bounds__(kThreads) loss_rows_kernel(const __grid_constant__ dsa_indexer_loss_params p,
                                                             float *term, float *lz_out, float *suma_out,
                                                             int32_t *counted_out) {
  __shared__ float red[kWarps];
  const int tid = threadIdx.x, K = p.topk;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int len = tr_eff_len(p.lengths, t, K);
    const int32_t *row = p.indices + t * p.indices_stride;
    const float *a = p.target + t * p.target_stride, *z = p.scores + t * p.scores_stride;
    int n = 0;
    float sa = 0.f, m = -INFINITY;
    for (int j = tid; j < len; j += kThreads)
      if (slot_valid(p, row, j, len)) {
        ++n;
        sa += a[j];
        m = fmaxf(m, z[j]); /* fmax ignores NaN, as the reference's fmax */
      }
    n = __syncthreads_count(n > 0);
    sa = block_sum(sa, red);
    m = block_max(m, red);
    const bool counted = n > 0 && sa > 0.f;
    float lz = 0.f, kl = 0.f;
    if (counted) {
      float se = 0.f;
      for (int j = tid; j < len; j += kThreads)
        if (slot_valid(p, row, j, len)) se += expf(z[j] - m);
      lz = m + logf(block_sum(se, red));
      float part = 0.f;
      for (int j = tid; j < len; j += kThreads)
        if (slot_valid(p, row, j, len)) {
          const float tgt = a[j] / sa;
          if (tgt > 0.f) part += tgt * (logf(tgt) - (z[j] - lz));
          else if (tgt != 0.f) part = NAN; /* a negative target has no KL term */
        }
      kl = block_sum(part, red);
    }
    if (tid == 0) {
      term[t] = kl;
      lz_out[t] = lz;
      suma_out[t] = sa;
      counted_out[t] = counted;
    }
  }
}

constexpr int kRedThreads = 256;

__global__ void __launch_bounds__(kRedThreads) loss_reduce_kernel(const __grid_constant__ dsa_indexer_loss_params p,
                                                                  const float *term, const int32_t *counted,
                                                                  float *factor) {
  __shared__ double rs[kRedThreads];
  __shared__ long long rn[kRedThreads];
  const int tid = threadIdx.x;
  double s = 0.0;
  long long n = 0;
  for (int64_t t = tid; t < p.num_tokens; t += kRedThreads) {
    s += (double)term[t];
    n += counted[t];
  }
  rs[tid] = s;
  rn[tid] = n;
  __syncthreads();
  for (int w = kRedThreads / 2; w > 0; w >>= 1) {
    if (tid < w) {
      rs[tid] += rs[tid + w];
      rn[tid] += rn[tid + w];
    }
    __syncthreads();
  }
  if (tid == 0) {
    const double f = rn[0] > 0 ? (double)p.coeff / (double)rn[0] : 0.0;
    const double gl = p.grad_loss ? (double)p.grad_loss[0] : 1.0;
    p.loss[0] = (float)(f * rs[0]);
    factor[0] = (float)(gl * f);
  }
}

__global__ void __launch_bounds__(kThreads) loss_grad_kernel(const __grid_constant__ dsa_indexer_loss_params p,
                                                             const float *lz_in, const float *suma_in,
                                                             const int32_t *counted_in, const float *factor) {
  const int tid = threadIdx.x, K = p.topk;
  const float f = factor[0];
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int len = tr_eff_len(p.lengths, t, K);
    const int32_t *row = p.indices + t * p.indices_stride;
    const float *a = p.target + t * p.target_stride, *z = p.scores + t * p.scores_stride;
    float *g = p.grad + t * p.grad_stride;
    const bool counted = counted_in[t] != 0;
    const float lz = lz_in[t], sa = suma_in[t];
    for (int j = tid; j < K; j += kThreads)
      g[j] = counted && slot_valid(p, row, j, len) ? f * (expf(z[j] - lz) - a[j] / sa) : 0.f;
  }
}

}  // namespace

extern "C" size_t dsa_indexer_loss_workspace_size(const dsa_indexer_loss_params *p) {
  return loss_layout(p->num_tokens).total;
}

extern "C" dsa_status dsa_launch_indexer_loss(const dsa_context *ctx, const dsa_indexer_loss_params *p,
                                              void *workspace, cudaStream_t stream) {
  static const char fn[] = "dsa_indexer_loss";
  (void)ctx;
  const int64_t T = p->num_tokens;
  const LossLayout L = loss_layout(T);
  unsigned char *ws = tr_align_workspace(workspace);
  float *term = (float *)(ws + L.term), *lz = (float *)(ws + L.lz), *suma = (float *)(ws + L.suma);
  int32_t *counted = (int32_t *)(ws + L.counted);
  float *factor = (float *)(ws + L.scal);
  if (T > 0) {
    loss_rows_kernel<<<tr_grid_for(T, 1), kThreads, 0, stream>>>(*p, term, lz, suma, counted);
    DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  }
  loss_reduce_kernel<<<1, kRedThreads, 0, stream>>>(*p, term, counted, factor);
  DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  if (T > 0 && p->grad != nullptr) {
    loss_grad_kernel<<<tr_grid_for(T, 1), kThreads, 0, stream>>>(*p, lz, suma, counted, factor);
    DSA_TRY(dsa_cuda_status((int)cudaGetLastError(), fn));
  }
  return DSA_SUCCESS;
}
