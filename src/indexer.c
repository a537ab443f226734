/* indexer.c - public entry point dsa_indexer_topk: the lightning indexer with segmented causal
 * top-k. The checks and the two-phase workspace contract here; the engine and kernel choice, the
 * workspace layout and the chunked scoring and selection in the indexer's dispatch point
 * (cuda/indexer/dispatch.cu, which documents them).
 *
 * Order: the shared checks; workspace_bytes; a size query without a context returns the default
 * budgets' size here; otherwise the context is entered, the engine chosen (a forced engine or kernel
 * that does not run on the device fails before anything is written), the size returned or compared,
 * then the call runs (nothing with no queries). A workspace of any alignment is accepted. */
#include "internal.h"

DSA_API dsa_status dsa_indexer_topk(dsa_context *ctx, const dsa_indexer_params *p, void *workspace,
                                    size_t *workspace_bytes, cudaStream_t stream) {
  const char *fn = "dsa_indexer_topk";
  dsa_indexer_params r;
  size_t need = 0;
  DSA_TRY(dsa_check_indexer(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  if (workspace == NULL && ctx == NULL) { /* a size query without a context: docs/contract.md section 13.2 */
    DSA_TRY(dsa_indexer_workspace_size(NULL, &r, &need));
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  DSA_TRY(dsa_context_enter(ctx, fn));
  DSA_TRY(dsa_indexer_workspace_size(ctx, &r, &need));
  if (workspace == NULL) {
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  if (*workspace_bytes < need)
    return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL, "%s: workspace_bytes = %zu is below the %lld needed",
                    fn, *workspace_bytes, (long long)need);
  if (r.plan->num_queries == 0) return DSA_SUCCESS;
  return dsa_launch_indexer(ctx, &r, workspace, stream);
}
