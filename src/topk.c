/* topk.c - public entry point dsa_topk: checks, the two-phase workspace contract, one launch of the
 * top-k (dsa_launch_topk, cuda/topk/topk.cu). The kernels need no scratch, so the workspace size is the
 * contract's minimum of 1 byte; a workspace of any alignment (a 1-byte offset included) is
 * accepted because it is never touched. */
#include "internal.h"

DSA_API dsa_status dsa_topk(dsa_context *ctx, const dsa_topk_params *p, void *workspace,
                            size_t *workspace_bytes, cudaStream_t stream) {
  const char *fn = "dsa_topk";
  dsa_topk_params r;
  dsa_topk_launch a;
  DSA_TRY(dsa_check_topk(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  if (workspace == NULL) { /* a size query: no context needed (docs/contract.md section 13.2) */
    *workspace_bytes = 1;
    return DSA_SUCCESS;
  }
  DSA_TRY(dsa_context_enter(ctx, fn));
  if (*workspace_bytes < 1)
    return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL, "%s: workspace_bytes = %zu is below 1", fn,
                    *workspace_bytes);
  if (r.rows == 0) return DSA_SUCCESS;
  a.rows = r.rows;
  a.columns = r.columns;
  a.k = r.k;
  a.scores = r.columns > 0 ? r.scores : NULL;
  a.scores_stride = r.scores_stride;
  a.lengths = r.lengths;
  a.starts = NULL;
  a.start_base = 0;
  a.indices = r.indices;
  a.indices_stride = r.indices_stride;
  a.out_lengths = NULL;
  return dsa_launch_topk(ctx, &a, stream);
}
