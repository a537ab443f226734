/*
 * idx_cublas.cu - the small kernels of the lightning indexer's cuBLAS engine (the indexer's
 * dispatch point, cuda/indexer/dispatch.cu, drives it; the GEMM is cublasGemmEx, bf16 in, fp32
 * accumulate):
 *
 *  - idx_pack_q: copies a chunk of index_q [tokens, heads, 128] with arbitrary (validated) strides
 *    into a plain [tokens * heads, 128] matrix, for layouts cuBLAS cannot read as one matrix
 *    (head-major, or a token stride that is not heads * head stride). 16-byte vector copies (the
 *    validator guarantees 16-byte aligned rows).
 *  - idx_reduce: scores[r, c] = sum_h w[r, h] * ReLU(logits[r * H + h, c]) from the fp32 GEMM
 *    output. One thread per (row, column), heads summed in order h = 0..H-1 (deterministic); reads
 *    are coalesced along the columns. ReLU keeps NaN (as the reference does).
 * Both engines select with the top-k of cuda/topk/.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include "internal.h"
#include "indexer/idx_common.cuh"
#include "indexer/idx_launch.cuh"

#define IDX_REDUCE_THREADS 256 /* columns per CTA; heads loop inside the thread */
#define IDX_PACK_THREADS 256

static __global__ void __launch_bounds__(IDX_PACK_THREADS)
idx_pack_q(const uint16_t *__restrict__ q, int64_t st, int64_t sh, int64_t rows, int32_t heads,
           uint16_t *__restrict__ out) {
  /* one uint4 = 8 bf16; a row of 128 is 16 vectors */
  const int64_t n = rows * 16;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i >> 4, v = i & 15;
    const int64_t t = row / heads, h = row - t * heads;
    const uint4 x = *(const uint4 *)(q + t * st + h * sh + v * 8);
    *(uint4 *)(out + row * DSA_INDEX_HEAD_DIM + v * 8) = x;
  }
}

template <bool W_BF16>
static __global__ void __launch_bounds__(IDX_REDUCE_THREADS)
idx_reduce(int32_t heads, int64_t cols, const float *__restrict__ logits, int64_t logits_ld,
           const void *__restrict__ weights, int64_t weights_stride, float *__restrict__ scores,
           int64_t scores_ld) {
  __shared__ float s_w[64];
  const int64_t r = blockIdx.y;
  const int64_t c = (int64_t)blockIdx.x * IDX_REDUCE_THREADS + threadIdx.x;
  if (threadIdx.x < heads) {
    if (W_BF16) {
      const uint16_t b = ((const uint16_t *)weights)[r * weights_stride + threadIdx.x];
      s_w[threadIdx.x] = __uint_as_float((uint32_t)b << 16);
    } else {
      s_w[threadIdx.x] = ((const float *)weights)[r * weights_stride + threadIdx.x];
    }
  }
  __syncthreads();
  if (c >= cols) return;
  const float *src = logits + r * heads * logits_ld + c;
  float acc = 0.0f;
  for (int h = 0; h < heads; ++h) acc = fmaf(s_w[h], idx_relu(__ldg(src + (int64_t)h * logits_ld)), acc);
  scores[r * scores_ld + c] = acc;
}

extern "C" dsa_status dsa_idx_launch_pack_q(const uint16_t *q, int64_t stride_token, int64_t stride_head,
                                            int64_t tokens, int32_t heads, uint16_t *out, cudaStream_t stream) {
  int64_t n = tokens * heads * 16, blocks = (n + IDX_PACK_THREADS - 1) / IDX_PACK_THREADS;
  if (n <= 0) return DSA_SUCCESS;
  if (blocks > 65536) blocks = 65536;
  idx_pack_q<<<(unsigned)blocks, IDX_PACK_THREADS, 0, stream>>>(q, stride_token, stride_head,
                                                                 tokens * heads, heads, out);
  return dsa_cuda_status(cudaGetLastError(), "dsa_indexer_topk (pack kernel launch)");
}

extern "C" dsa_status dsa_idx_launch_reduce(int64_t rows, int32_t heads, int64_t cols, const float *logits,
                                            int64_t logits_ld, const void *weights, int weights_bf16,
                                            int64_t weights_stride, float *scores, int64_t scores_ld,
                                            cudaStream_t stream) {
  dim3 grid;
  if (rows <= 0 || cols <= 0) return DSA_SUCCESS;
  /* rows is a GEMM sub-chunk (the caller keeps it <= 65535); columns are at most 2^31 */
  grid.x = (unsigned)((cols + IDX_REDUCE_THREADS - 1) / IDX_REDUCE_THREADS);
  grid.y = (unsigned)rows;
  grid.z = 1;
  if (weights_bf16)
    idx_reduce<true><<<grid, IDX_REDUCE_THREADS, 0, stream>>>(heads, cols, logits, logits_ld, weights,
                                                             weights_stride, scores, scores_ld);
  else
    idx_reduce<false><<<grid, IDX_REDUCE_THREADS, 0, stream>>>(heads, cols, logits, logits_ld, weights,
                                                              weights_stride, scores, scores_ld);
  return dsa_cuda_status(cudaGetLastError(), "dsa_indexer_topk (reduce kernel launch)");
}

