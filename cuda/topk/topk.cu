/*
 * topk.cu - the top-k's dispatch point: dsa_launch_topk (src/kernels.h), one launch of the per-row
 * top-k for dsa_topk and dsa_indexer_topk, on the kernel DSA_OPTION_TOPK_KERNEL names. Automatic:
 * where the device has the filter kernel's 2 x 90 KB of shared memory per SM, the bisection kernel
 * for a launch whose rows all have at most TKB_CAP = 4096 columns and some row is read (scores
 * given), else the filter kernel (both cuda/topk/topk_filter.cu); on a device without that memory the
 * radix kernel (cuda/topk/topk_radix.cu), which a forced filter kernel also falls back to. All give
 * the same output (the rule of docs/design.md section 4). No workspace.
 */
#include "topk/topk_common.cuh"

extern "C" dsa_status dsa_launch_topk(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream) {
  if (a->rows <= 0) return DSA_SUCCESS;
  /* the filter kernel takes any rows (no scores: every row has L <= k, never read) */
  if (ctx->options[DSA_OPTION_TOPK_KERNEL] != DSA_TOPK_KERNEL_RADIX && ctx->max_smem_optin >= TKF_SMEM + 2048) {
    if (a->scores != NULL && a->columns <= TKB_CAP) return dsa_topk_launch_bisect(ctx, a, stream);
    return dsa_topk_launch_filter(ctx, a, stream);
  }
  return dsa_topk_launch_radix(ctx, a, stream);
}
