/* radix_sort.cuh - what the deterministic modes (the attention backward's and the indexer backward's)
 * share around CUB's radix sort of (u32 key, i32 value) pairs: the key bits, the temp-storage size
 * query (host code) and the per-key offsets of the sorted keys (a kernel; each including file
 * compiles its own copy in an anonymous namespace). */
#ifndef DSA_CUDA_RADIX_SORT_CUH
#define DSA_CUDA_RADIX_SORT_CUH

#include <stdio.h>
#include <cub/device/device_radix_sort.cuh>
#include "internal.h"

/* Bits of the sort's keys: enough for the sentinel num_keys (keys are in [0, num_keys]). */
inline int dsa_radix_key_bits(int64_t num_keys) {
  int bits = 1;
  while (bits < 32 && ((uint64_t)num_keys >> bits) != 0) ++bits;
  return bits;
}

/* CUB's radix-sort temp size for n (u32 key, i32 value) pairs. CUB derives it from the current
 * device, so without one the size query fails with DSA_ERROR_NO_DEVICE; fn names the op. */
inline dsa_status dsa_radix_sort_temp_bytes(int64_t n, int bits, size_t *temp, const char *fn) {
  *temp = 0;
  CUB_NS_QUALIFIER::DoubleBuffer<uint32_t> kb(nullptr, nullptr); /* CUB lives in dsa_cub::cub */
  CUB_NS_QUALIFIER::DoubleBuffer<int32_t> vb(nullptr, nullptr);
  const cudaError_t e = CUB_NS_QUALIFIER::DeviceRadixSort::SortPairs(nullptr, *temp, kb, vb, n, 0, bits);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaErrorNoDevice || e == cudaErrorInvalidDevice || e == cudaErrorInsufficientDriver)
      return dsa_fail(DSA_ERROR_NO_DEVICE,
                      "%s: the deterministic mode's workspace size needs a CUDA device (radix sort size "
                      "query: %s)", fn, cudaGetErrorString(e));
    char where[160];
    snprintf(where, sizeof where, "%s: radix sort size query", fn);
    return dsa_cuda_status((int)e, where);
  }
  return DSA_SUCCESS;
}

namespace {
/* off[r] = first position of the n sorted keys with key >= r, r = 0..num_keys (binary search). */
__global__ void dsa_sorted_key_offsets_kernel(const uint32_t *keys, int64_t n, int64_t num_keys, int64_t *off) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r <= num_keys; r += (int64_t)gridDim.x * blockDim.x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if ((int64_t)keys[mid] < r) lo = mid + 1;
      else hi = mid;
    }
    off[r] = lo;
  }
}
}  // namespace

#endif /* DSA_CUDA_RADIX_SORT_CUH */
