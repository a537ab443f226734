/*
 * topk.cu - dsa_launch_topk (src/internal.h): one launch of the per-row top-k for dsa_topk and
 * dsa_indexer_topk, on the kernel DSA_OPTION_TOPK_KERNEL names. Automatic: the filter kernel
 * (cuda/topk/topk_filter.cu, whose launcher runs launches of rows of at most 4096 columns on its
 * bisection kernel) where the device has its 2 x 90 KB of shared memory per SM, else the
 * radix kernel (cuda/topk/topk_radix.cu), which a forced filter kernel also falls back to on a
 * device without that memory. Both give the same output (the rule of docs/design.md section 4).
 */
#include "topk/topk_common.cuh"

extern "C" dsa_status dsa_launch_topk(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  if (a->rows <= 0) return DSA_SUCCESS;
  /* the filter kernel takes any rows (no scores: every row has L <= k, never read) */
  if (ctx->options[DSA_OPTION_TOPK_KERNEL] != DSA_TOPK_KERNEL_RADIX && ctx->max_smem_optin >= TKF_SMEM + 2048)
    return dsa_topk_launch_filter(ctx, a, stream);
  return dsa_topk_launch_radix(ctx, a, stream);
}
