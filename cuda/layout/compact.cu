/*
 * compact.cu - index compaction (docs/contract.md section 8): per row keep 0 <= idx < key_count, sort
 * the kept entries ascending, fill the rest with -1, lengths[r] = kept count (duplicates kept).
 *
 * One CTA per row, grid-stride over rows (1-D grid capped at a few waves, so any row count works).
 * Each row is loaded whole into registers (striped, coalesced), turned into unsigned keys
 * (valid: idx, invalid: key_count, which sorts after every valid key), sorted with
 * cub::BlockRadixSort over only the bits key_count needs, and stored striped (coalesced).
 * Because the whole row is in registers before the first store, out == indices (in place) works.
 * Compaction order does not matter: the kept prefix is sorted, and equal keys are identical.
 *
 * Variants: one instantiation per K tier (threads x items per thread >= K), table below.
 */
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>
#include "internal.h"

/* With -DCUB_WRAPPED_NAMESPACE=dsa_cub (the Makefile) CUB lives in dsa_cub::cub: alias it so the
 * code says cub:: either way. */
#ifdef CUB_WRAPPED_NAMESPACE
namespace cub = CUB_NS_QUALIFIER;
#endif

namespace {

struct CompactTier {
  int max_k;    /* largest K this tier covers */
  int threads;  /* CTA size */
  int items;    /* keys per thread; threads * items >= max_k */
};

/* Tiers, smallest first. The row is tiny, so the sort is latency-bound: the fewest radix passes
 * over the fewest keys per thread wins, while keeping each thread's registers low. */
constexpr CompactTier kTiers[] = {
    {128, 128, 1},   /* K <= 128: one key per thread, four warps, minimal registers */
    {512, 128, 4},   /* K <= 512 (typical 256/512): four keys per thread keep the CTA at 4 warps */
    {1024, 256, 4},  /* K <= 1024: double the CTA rather than the registers per thread */
    {2048, 256, 8},  /* K <= 2048 (DSA_MAX_TOPK): 8 keys per thread, ~9 KB of sort smem (ptxas) */
};

template <int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS)
compact_kernel(const int32_t *__restrict__ indices, int64_t indices_stride, int32_t *out,
               int64_t out_stride, int32_t *__restrict__ lengths, int64_t rows, int k,
               uint32_t key_count, int end_bit) {
  typedef cub::BlockRadixSort<uint32_t, THREADS, ITEMS> Sort;
  typedef cub::BlockReduce<int, THREADS> Reduce;
  __shared__ typename Sort::TempStorage sort_storage;
  __shared__ typename Reduce::TempStorage reduce_storage;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    /* indices is not __restrict__-qualified against out: in place reads and writes one row */
    const int32_t *in = indices + row * indices_stride;
    uint32_t keys[ITEMS];
    int kept = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      int pos = j * THREADS + (int)threadIdx.x; /* striped load: coalesced */
      uint32_t key = key_count;
      if (pos < k) {
        int32_t idx = in[pos];
        /* idx >= 0 first, so the unsigned compare is a range check */
        if (idx >= 0 && (uint32_t)idx < key_count) {
          key = (uint32_t)idx;
          ++kept;
        }
      }
      keys[j] = key;
    }
    int total = Reduce(reduce_storage).Sum(kept);
    /* sort order of the input does not matter, so the striped registers are treated as blocked */
    Sort(sort_storage).SortBlockedToStriped(keys, 0, end_bit);
    int32_t *dst = out + row * out_stride;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      int pos = j * THREADS + (int)threadIdx.x;
      if (pos < k) dst[pos] = keys[j] < key_count ? (int32_t)keys[j] : -1;
    }
    if (lengths != NULL && threadIdx.x == 0) lengths[row] = total;
    __syncthreads(); /* the temp storage is reused by the next row */
  }
}

template <int THREADS, int ITEMS>
dsa_status launch_tier(const dsa_context *ctx, const dsa_compact_params *p, cudaStream_t stream) {
  /* bits needed for the sentinel key_count, so every valid key (< key_count) fits too */
  uint32_t kc = (uint32_t)p->key_count;
  int end_bit = 1;
  while (end_bit < 32 && (kc >> end_bit) != 0) ++end_bit;
  /* enough CTAs to fill every SM at full occupancy; more rows loop */
  int64_t cap = (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 132) * (2048 / THREADS);
  int64_t grid = p->rows < cap ? p->rows : cap;
  compact_kernel<THREADS, ITEMS><<<(unsigned)grid, THREADS, 0, stream>>>(
      p->indices, p->indices_stride, p->out, p->out_stride, p->lengths, p->rows, p->k, kc, end_bit);
  return dsa_cuda_status((int)cudaGetLastError(), "dsa_compact_indices");
}

}  // namespace

extern "C" dsa_status dsa_launch_compact(const dsa_context *ctx, const dsa_compact_params *p,
                                         cudaStream_t stream) {
  static_assert(kTiers[0].threads * kTiers[0].items >= kTiers[0].max_k, "tier 0 too small");
  static_assert(kTiers[1].threads * kTiers[1].items >= kTiers[1].max_k, "tier 1 too small");
  static_assert(kTiers[2].threads * kTiers[2].items >= kTiers[2].max_k, "tier 2 too small");
  static_assert(kTiers[3].threads * kTiers[3].items >= kTiers[3].max_k, "tier 3 too small");
  static_assert(kTiers[3].max_k == DSA_MAX_TOPK, "the last tier must cover DSA_MAX_TOPK");
  if (p->rows <= 0) return DSA_SUCCESS;
  if (p->k <= kTiers[0].max_k) return launch_tier<kTiers[0].threads, kTiers[0].items>(ctx, p, stream);
  if (p->k <= kTiers[1].max_k) return launch_tier<kTiers[1].threads, kTiers[1].items>(ctx, p, stream);
  if (p->k <= kTiers[2].max_k) return launch_tier<kTiers[2].threads, kTiers[2].items>(ctx, p, stream);
  return launch_tier<kTiers[3].threads, kTiers[3].items>(ctx, p, stream);
}
