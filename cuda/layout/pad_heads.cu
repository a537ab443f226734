/*
 * pad_heads.cu - attention head padding (docs/contract.md section 3, _pad_attention_heads):
 * q [T, H, D] (strided) -> q_out [T, Hp, D] contiguous with heads H..Hp-1 zero, and
 * sink [H] -> sink_out [Hp] with the padded heads -inf (sink NULL: all -inf).
 *
 * One kernel, a pure copy: one warp per output head row (t, h), grid-stride over the T * Hp rows,
 * the lanes striding over the D / 8 16-byte vectors of the row (coalesced loads and stores; the
 * one 64-bit division per row is amortised over the row). All index math is int64: T * Hp * D
 * can exceed 2^31. Block 0 also writes sink_out, so one launch does both (and with T == 0 the
 * launch is one block that only writes the sink).
 */
#include <cuda_runtime.h>
#include <math_constants.h>
#include "internal.h"

namespace {

constexpr int kThreads = 256;             /* 8 warps per CTA: 8 head rows in flight per CTA */
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads)
pad_heads_kernel(const uint4 *__restrict__ q, int64_t stride_token_vec, int64_t stride_head_vec,
                 uint4 *__restrict__ q_out, int64_t rows, int heads, int padded_heads, int vecs,
                 const float *sink, float *sink_out) {
  if (blockIdx.x == 0 && sink_out != NULL)
    for (int h = (int)threadIdx.x; h < padded_heads; h += kThreads)
      sink_out[h] = (sink != NULL && h < heads) ? sink[h] : -CUDART_INF_F;

  int lane = (int)threadIdx.x & 31;
  int64_t warp = (int64_t)blockIdx.x * kWarps + ((int)threadIdx.x >> 5);
  int64_t warps = (int64_t)gridDim.x * kWarps;
  for (int64_t row = warp; row < rows; row += warps) {
    int64_t t = row / padded_heads;
    int h = (int)(row - t * padded_heads);
    uint4 *dst = q_out + row * vecs;
    if (h < heads) {
      const uint4 *src = q + t * stride_token_vec + (int64_t)h * stride_head_vec;
      for (int v = lane; v < vecs; v += 32) dst[v] = src[v];
    } else {
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      for (int v = lane; v < vecs; v += 32) dst[v] = zero;
    }
  }
}

}  // namespace

extern "C" dsa_status dsa_launch_pad_heads(const dsa_context *ctx, const dsa_pad_heads_params *p,
                                           cudaStream_t stream) {
  int64_t rows = p->num_tokens * (int64_t)p->padded_heads;
  if (rows == 0 && p->sink_out == NULL) return DSA_SUCCESS;
  /* enough CTAs for full occupancy (2048 threads per SM); more rows loop */
  int64_t cap = (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 132) * (2048 / kThreads);
  int64_t need = (rows + kWarps - 1) / kWarps;
  int64_t grid = need < cap ? need : cap;
  if (grid < 1) grid = 1;
  /* validated: q, q_out 16-byte aligned, strides and D multiples of 8 elements */
  pad_heads_kernel<<<(unsigned)grid, kThreads, 0, stream>>>(
      (const uint4 *)p->q, p->q_stride_token / 8, p->q_stride_head / 8, (uint4 *)p->q_out, rows,
      p->num_heads, p->padded_heads, p->head_dim / 8, p->sink, p->sink_out);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_pad_heads");
}
