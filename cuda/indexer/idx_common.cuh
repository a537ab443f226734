/* idx_common.cuh - what the indexer's kernels share (cuda/indexer/). */
#ifndef DSA_IDX_COMMON_CUH
#define DSA_IDX_COMMON_CUH

/* ReLU that keeps NaN (as the reference does). */
static __device__ __forceinline__ float idx_relu(float x) {
  return x > 0.0f ? x : (x != x ? x : 0.0f);
}

#endif /* DSA_IDX_COMMON_CUH */
