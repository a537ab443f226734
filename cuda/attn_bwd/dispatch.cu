/*
 * dispatch.cu - the backward's dispatch point: dsa_attn_bwd_workspace_size and dsa_launch_attn_bwd
 * (src/kernels.h). The kernels (cuda/attn_bwd/bwd_portable.cu documents the math and the workspace
 * layout): the warp-specialised 64-head sm_90a kernel (bwd_sm90_ws.cu), the lockstep 64-head sm_90a
 * kernel (bwd_sm90_h64.cu) and the portable kernels (bwd_portable.cu). DSA_OPTION_BWD_KERNEL
 * (include/dsa_tune.h) forces one; the automatic choice on cc 9.0 runs the warp-specialised kernel in
 * both modes at every H (below 64 heads as zero rows: the fp32 reductions, or in the deterministic
 * mode the per-slot rows' HBM traffic, bind, not the MMA; docs/design.md section 6), falling back to
 * the lockstep kernel, then to the portable ones, where a kernel declines. Off cc 9.0 the portable
 * kernels run.
 *
 * Workspace: the sm_90a kernels decline at launch time, on device facts a size query does not see,
 * so the size covers every kernel the mode may run: the portable layout (which holds every kernel's
 * non-deterministic regions), and in the deterministic mode the larger of it and the sm_90a kernels'
 * chunked layout (DSA_OPTION_BWD_DET_CHUNK_TOKENS sets its chunk).
 *
 * The optional slot target (dsa_attn_bwd_params.slot_target): the warp-specialised kernel sums it
 * from the P it recomputes; after any other kernel the slot target's own launcher
 * (cuda/indexer_train/) runs on the same stream.
 */
#include "internal.h"
#include "attn_bwd/bwd_launch.cuh"

extern "C" dsa_status dsa_attn_bwd_workspace_size(const dsa_context *ctx, const dsa_attn_bwd_params *r, size_t *need) {
  size_t a = 0, b = 0;
  /* a size query may pass a NULL ctx: the chunk option's default then */
  const int64_t chunk = ctx != NULL ? ctx->options[DSA_OPTION_BWD_DET_CHUNK_TOKENS] : 0;
  DSA_TRY(dsa_bwd_portable_workspace_size(r, &a));
  if (r->deterministic) DSA_TRY(dsa_bwd_sm90_det_workspace_size(r, chunk, &b));
  *need = a > b ? a : b;
  return DSA_SUCCESS;
}

namespace {

/* The kernel choice (DSA_OPTION_BWD_KERNEL, else automatic); *target_done = 1 when the kernel that
 * ran wrote the slot target too. */
dsa_status bwd_dispatch(const dsa_context *ctx, const dsa_attn_bwd_params *r, void *workspace, cudaStream_t stream,
                        int *target_done) {
  const int64_t kernel = ctx->options[DSA_OPTION_BWD_KERNEL];
  if (kernel == DSA_BWD_KERNEL_SM90_H64) return dsa_bwd_launch_sm90_h64(ctx, r, workspace, stream);
  if (kernel == DSA_BWD_KERNEL_SM90_SMALL)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_sparse_attn_bwd: DSA_OPTION_BWD_KERNEL = DSA_BWD_KERNEL_SM90_SMALL (3) names a kernel that "
                    "left the library (the warp-specialised kernel, DSA_BWD_KERNEL_SM90_WS, runs every H)");
  if (kernel == DSA_BWD_KERNEL_SM90_WS) {
    const dsa_status s = dsa_bwd_launch_sm90_ws(ctx, r, workspace, stream);
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
    s = dsa_bwd_launch_sm90_ws(ctx, r, workspace, stream);
    if (!dsa_declined(s, &saved)) {
      if (s == DSA_SUCCESS) *target_done = 1;
      return s;
    }
    s = dsa_bwd_launch_sm90_h64(ctx, r, workspace, stream);
    if (!dsa_declined(s, &saved)) return s;
  }
  return dsa_bwd_launch_portable(ctx, r, workspace, stream);
}

}  // namespace

extern "C" dsa_status dsa_launch_attn_bwd(const dsa_context *ctx, const dsa_attn_bwd_params *r, void *workspace,
                                          cudaStream_t stream) {
  int target_done = r->slot_target == NULL || r->num_tokens == 0;
  const dsa_status s = bwd_dispatch(ctx, r, workspace, stream, &target_done);
  if (s != DSA_SUCCESS || target_done) return s;
  const dsa_slot_target_params sp = dsa_slot_target_of_bwd(r);
  return dsa_launch_slot_target(ctx, &sp, stream);
}
