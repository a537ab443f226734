/* attn_bwd.c - public entry point dsa_sparse_attn_bwd: validation, the two-phase workspace
 * contract, then the launchers in cuda/attn_bwd/ (bwd_portable.cu documents the kernels and the
 * workspace layout). DSA_OPTION_BWD_KERNEL (include/dsa_tune.h) forces one.
 *
 * Order: the shared checks; workspace_bytes; a size query (workspace NULL) returns here; otherwise
 * the context is entered BEFORE the size is computed (the deterministic mode's size includes CUB's
 * radix-sort temp size, which depends on the device), then the size is compared and the kernels
 * launched. A workspace pointer of any alignment is accepted (aligned up inside; the slack is part
 * of the size). Both modes try the sm_90a kernels first on cc 9.0 (automatic choice; they run both
 * head dims, 576 and 512); in the deterministic mode the size covers both that kernel's chunked
 * layout and the portable one. */
#include "internal.h"

/* The deterministic mode may run either the sm_90a chunked path or the portable key-major one (the
 * sm_90a kernel declines at launch time, on device facts a size query does not see): its size is
 * the larger of the two. */
static dsa_status bwd_workspace_size(const dsa_context *ctx, const dsa_attn_bwd_params *r, size_t *need) {
  size_t a = 0, b = 0;
  /* a size query may pass a NULL ctx: the chunk option's default then */
  const int64_t chunk = ctx != NULL ? ctx->options[DSA_OPTION_BWD_DET_CHUNK_TOKENS] : 0;
  DSA_TRY(dsa_attn_bwd_workspace_size(r, &a));
  if (r->deterministic) DSA_TRY(dsa_attn_bwd_sm90_det_workspace_size(r, chunk, &b));
  *need = a > b ? a : b;
  return DSA_SUCCESS;
}

static dsa_status bwd_dispatch(dsa_context *ctx, const dsa_attn_bwd_params *r, void *workspace, cudaStream_t stream,
                               int *target_done);

DSA_API dsa_status dsa_sparse_attn_bwd(dsa_context *ctx, const dsa_attn_bwd_params *p,
                                       void *workspace, size_t *workspace_bytes,
                                       dsa_stream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  dsa_attn_bwd_params r;
  size_t need = 0;
  DSA_TRY(dsa_check_attn_bwd(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  if (workspace == NULL) {
    DSA_TRY(bwd_workspace_size(ctx, &r, &need));
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  DSA_TRY(dsa_context_enter(ctx, fn));
  DSA_TRY(bwd_workspace_size(ctx, &r, &need));
  if (*workspace_bytes < need)
    return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL,
                    "%s: workspace_bytes = %zu is below the %zu bytes this call needs (query the "
                    "size with workspace = NULL)",
                    fn, *workspace_bytes, need);
  /* The optional slot target: the warp-specialised kernel sums it from the P it recomputes; after
   * any other kernel the slot target's own kernel runs on the same stream. */
  int target_done = r.slot_target == NULL || r.num_tokens == 0;
  const dsa_status s = bwd_dispatch(ctx, &r, workspace, (cudaStream_t)stream, &target_done);
  if (s != DSA_SUCCESS || target_done) return s;
  const dsa_slot_target_params sp = dsa_slot_target_of_bwd(&r);
  return dsa_launch_slot_target(ctx, &sp, (cudaStream_t)stream);
}

/* The kernel choice (DSA_OPTION_BWD_KERNEL, else automatic); *target_done = 1 when the kernel that
 * ran wrote the slot target too. */
static dsa_status bwd_dispatch(dsa_context *ctx, const dsa_attn_bwd_params *r, void *workspace, cudaStream_t stream,
                               int *target_done) {
  const int64_t kernel = ctx->options[DSA_OPTION_BWD_KERNEL];
  if (kernel == DSA_BWD_KERNEL_SM90_H64) return dsa_launch_attn_bwd_sm90(ctx, r, workspace, stream);
  if (kernel == DSA_BWD_KERNEL_SM90_SMALL)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_sparse_attn_bwd: DSA_OPTION_BWD_KERNEL = DSA_BWD_KERNEL_SM90_SMALL (3) names a kernel that "
                    "left the library (the warp-specialised kernel, DSA_BWD_KERNEL_SM90_WS, runs every H)");
  if (kernel == DSA_BWD_KERNEL_SM90_WS) {
    const dsa_status s = dsa_launch_attn_bwd_sm90_ws(ctx, r, workspace, stream);
    if (s == DSA_SUCCESS) *target_done = 1;
    return s;
  }
  if (kernel == DSA_BWD_KERNEL_AUTO && ctx->cc_major == 9 && ctx->cc_minor == 0) {
    /* The sm_90a kernels decline configurations they do not run with DSA_ERROR_UNSUPPORTED (before
     * any launch); the call then succeeds on the next one, so a decline's message must not outlive
     * it: the thread's previous message is put back (dsa_declined). */
    dsa_saved_message saved;
    dsa_status s;
    dsa_message_save(&saved);
    /* Both modes: the warp-specialised kernel, every H (below 64 heads as zero rows: the fp32
     * reductions, or in the deterministic mode the per-slot rows' HBM traffic, bind, not the MMA;
     * docs/design.md section 6). */
    s = dsa_launch_attn_bwd_sm90_ws(ctx, r, workspace, stream);
    if (!dsa_declined(s, &saved)) {
      if (s == DSA_SUCCESS) *target_done = 1;
      return s;
    }
    s = dsa_launch_attn_bwd_sm90(ctx, r, workspace, stream);
    if (!dsa_declined(s, &saved)) return s;
  }
  return dsa_launch_attn_bwd(ctx, r, workspace, stream);
}
