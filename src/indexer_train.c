/* indexer_train.c - public entry points of the indexer-training ops (docs/indexer-training.md):
 * dsa_attn_slot_target, dsa_indexer_slot_scores, dsa_indexer_loss, dsa_indexer_bwd. Each runs the
 * same dsa_check_* as its dsa_ref_ twin (src/reference_train.c), then the launchers of
 * cuda/indexer_train/ (the kernels and workspace layouts are documented there).
 *
 * Order, as in src/attn_bwd.c: the shared checks; for the workspace ops workspace_bytes, and a size
 * query (workspace NULL) returns here without a context (ctx may be NULL); otherwise the context is
 * entered, then the size compared (DSA_ERROR_WORKSPACE_TOO_SMALL), then the launches. Zero-size work
 * launches nothing, except what the op still defines: the loss (0) at T = 0 and d_index_k (zeros) at
 * T = 0 with T_k > 0. */
#include "internal.h"

DSA_API dsa_status dsa_attn_slot_target(dsa_context *ctx, const dsa_slot_target_params *p,
                                        dsa_stream_t stream) {
  static const char fn[] = "dsa_attn_slot_target";
  dsa_slot_target_params r;
  DSA_TRY(dsa_check_slot_target(p, fn, &r));
  DSA_TRY(dsa_context_enter(ctx, fn));
  if (r.num_tokens == 0) return DSA_SUCCESS;
  return dsa_launch_slot_target(ctx, &r, (cudaStream_t)stream);
}

DSA_API dsa_status dsa_indexer_slot_scores(dsa_context *ctx, const dsa_indexer_slot_scores_params *p,
                                           dsa_stream_t stream) {
  static const char fn[] = "dsa_indexer_slot_scores";
  dsa_indexer_slot_scores_params r;
  DSA_TRY(dsa_check_indexer_slot_scores(p, fn, &r));
  DSA_TRY(dsa_context_enter(ctx, fn));
  if (r.num_tokens == 0) return DSA_SUCCESS;
  return dsa_launch_indexer_slot_scores(ctx, &r, (cudaStream_t)stream);
}

static dsa_status too_small(const char *fn, size_t have, size_t need) {
  return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL,
                  "%s: workspace_bytes = %zu is below the %zu bytes this call needs (query the size "
                  "with workspace = NULL)",
                  fn, have, need);
}

DSA_API dsa_status dsa_indexer_loss(dsa_context *ctx, const dsa_indexer_loss_params *p,
                                    void *workspace, size_t *workspace_bytes, dsa_stream_t stream) {
  static const char fn[] = "dsa_indexer_loss";
  dsa_indexer_loss_params r;
  DSA_TRY(dsa_check_indexer_loss(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  const size_t need = dsa_indexer_loss_workspace_size(&r);
  if (workspace == NULL) {
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  DSA_TRY(dsa_context_enter(ctx, fn));
  if (*workspace_bytes < need) return too_small(fn, *workspace_bytes, need);
  return dsa_launch_indexer_loss(ctx, &r, workspace, (cudaStream_t)stream); /* T = 0: loss = 0 */
}

DSA_API dsa_status dsa_indexer_bwd(dsa_context *ctx, const dsa_indexer_bwd_params *p,
                                   void *workspace, size_t *workspace_bytes, dsa_stream_t stream) {
  static const char fn[] = "dsa_indexer_bwd";
  dsa_indexer_bwd_params r;
  size_t need = 0;
  DSA_TRY(dsa_check_indexer_bwd(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  if (workspace == NULL) {
    DSA_TRY(dsa_indexer_bwd_workspace_size(&r, &need));
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  /* the deterministic size includes CUB's sort temp, which CUB sizes for the current device */
  DSA_TRY(dsa_context_enter(ctx, fn));
  DSA_TRY(dsa_indexer_bwd_workspace_size(&r, &need));
  if (*workspace_bytes < need) return too_small(fn, *workspace_bytes, need);
  if (r.num_tokens == 0 && r.num_keys == 0) return DSA_SUCCESS;
  return dsa_launch_indexer_bwd(ctx, &r, workspace, (cudaStream_t)stream); /* T = 0: d_index_k = 0 */
}
