/* attn_bwd.c - public entry point dsa_sparse_attn_bwd: validation, the two-phase workspace
 * contract, then the backward's dispatch point (cuda/attn_bwd/dispatch.cu: which kernel for which
 * shape and option, the workspace size, the slot target).
 *
 * Order: the shared checks; workspace_bytes; a size query (workspace NULL) returns here; otherwise
 * the context is entered BEFORE the size is computed (the deterministic mode's size includes CUB's
 * radix-sort temp size, which depends on the device), then the size is compared and the kernels
 * launched. A workspace pointer of any alignment is accepted (aligned up inside; the slack is part
 * of the size). */
#include "internal.h"

DSA_API dsa_status dsa_sparse_attn_bwd(dsa_context *ctx, const dsa_attn_bwd_params *p,
                                       void *workspace, size_t *workspace_bytes,
                                       dsa_stream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  dsa_attn_bwd_params r;
  size_t need = 0;
  DSA_TRY(dsa_check_attn_bwd(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  if (workspace == NULL) {
    DSA_TRY(dsa_attn_bwd_workspace_size(ctx, &r, &need));
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  DSA_TRY(dsa_context_enter(ctx, fn));
  DSA_TRY(dsa_attn_bwd_workspace_size(ctx, &r, &need));
  if (*workspace_bytes < need)
    return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL,
                    "%s: workspace_bytes = %zu is below the %zu bytes this call needs (query the "
                    "size with workspace = NULL)",
                    fn, *workspace_bytes, need);
  return dsa_launch_attn_bwd(ctx, &r, workspace, (cudaStream_t)stream);
}
