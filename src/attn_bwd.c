/* attn_bwd.c - public entry point dsa_sparse_attn_bwd: validation, the two-phase workspace
 * contract, then the launcher in cuda/attn_bwd.cu (which documents the kernels and the workspace
 * layout).
 *
 * Order: the shared checks; workspace_bytes; a size query (workspace NULL) returns here; otherwise
 * the context is entered BEFORE the size is computed (the deterministic mode's size includes CUB's
 * radix-sort temp size, which depends on the device), then the size is compared and the kernels
 * launched. A workspace pointer of any alignment is accepted (aligned up inside; the slack is part
 * of the size). Both modes try the sm_90a kernel first on cc 9.0 (automatic variant; it runs both
 * head dims, 576 and 512); in the deterministic mode the size covers both that kernel's chunked
 * layout and the portable one. */
#include "internal.h"

/* 0 = automatic (on cc 9.0: the small-H sm_90a kernel for H <= 32 in deterministic mode, else / where it declines the
 * 64-head sm_90a kernel, then the portable kernels), 1 = portable kernels only, 2 = the 64-head sm_90a
 * kernel only, 3 = the small-H sm_90a kernel only (2, 3: DSA_ERROR_UNSUPPORTED where it declines;
 * tests and benchmarks). */
int dsa_attn_bwd_variant = 0;
/* Deterministic mode on the sm_90a kernel: tokens per chunk, 0 = from the kernel's budget. */
int dsa_attn_bwd_det_chunk_tokens = 0;
/* fp32 dKV accumulator layout of the sm_90a kernels' non-deterministic mode (src/internal.h): 0 = real
 * column order, 1 = permuted for 64-B v4 atomics, 2 = the same memory order written in 128-B row
 * segments. Default 2 (H200, 2026-11-29, docs/perf.md: bwd-glm-4k 6.53 ms vs 6.93 for layout 1 and
 * 8.27 for layout 0); the small-H kernel runs 2 as 1, at N = 32 / D = 576 and in the deterministic
 * mode everything uses 0. */
int dsa_attn_bwd_dkv_layout = 2;

/* The deterministic mode may run either the sm_90a chunked path or the portable key-major one (the
 * sm_90a kernel declines at launch time, on device facts a size query does not see): its size is
 * the larger of the two. */
static dsa_status bwd_workspace_size(const dsa_attn_bwd_params *r, size_t *need) {
  size_t a = 0, b = 0;
  DSA_TRY(dsa_attn_bwd_workspace_size(r, &a));
  if (r->deterministic) DSA_TRY(dsa_attn_bwd_sm90_det_workspace_size(r, &b));
  *need = a > b ? a : b;
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_sparse_attn_bwd(dsa_context *ctx, const dsa_attn_bwd_params *p,
                                       void *workspace, size_t *workspace_bytes,
                                       dsa_stream_t stream) {
  static const char fn[] = "dsa_sparse_attn_bwd";
  dsa_attn_bwd_params r;
  size_t need = 0;
  DSA_TRY(dsa_check_attn_bwd(p, fn, &r));
  DSA_REQUIRE(workspace_bytes != NULL, "%s: workspace_bytes is NULL", fn);
  if (workspace == NULL) {
    DSA_TRY(bwd_workspace_size(&r, &need));
    *workspace_bytes = need;
    return DSA_SUCCESS;
  }
  DSA_TRY(dsa_context_enter(ctx, fn));
  DSA_TRY(bwd_workspace_size(&r, &need));
  if (*workspace_bytes < need)
    return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL,
                    "%s: workspace_bytes = %zu is below the %zu bytes this call needs (query the "
                    "size with workspace = NULL)",
                    fn, *workspace_bytes, need);
  if (dsa_attn_bwd_variant == 2) return dsa_launch_attn_bwd_sm90(ctx, &r, workspace, (cudaStream_t)stream);
  if (dsa_attn_bwd_variant == 3)
    return dsa_launch_attn_bwd_sm90_small(ctx, &r, workspace, (cudaStream_t)stream);
  if (dsa_attn_bwd_variant == 0 && ctx->cc_major == 9 && ctx->cc_minor == 0) {
    /* The sm_90a kernels decline configurations they do not run with DSA_ERROR_UNSUPPORTED (before
     * any launch); the call then succeeds on the next one, so a decline's message must not outlive
     * it: the thread's previous message is put back (dsa_declined). */
    dsa_saved_message saved;
    dsa_status s;
    dsa_message_save(&saved);
    /* small-H kernel: deterministic mode only. Measured on an H200 at 7f5821f, bwd-tp-h16 (H = 16):
     * det1 16.4 -> 14.3 ms with it, det0 10.7 -> 10.9 ms (the atomic mode is bound by its 19 GB of
     * fp32 atomics, the same on both kernels, so the 64-head kernel keeps it). */
    if (r.num_heads <= 32 && r.deterministic) {
      s = dsa_launch_attn_bwd_sm90_small(ctx, &r, workspace, (cudaStream_t)stream);
      if (!dsa_declined(s, &saved)) return s;
    }
    s = dsa_launch_attn_bwd_sm90(ctx, &r, workspace, (cudaStream_t)stream);
    if (!dsa_declined(s, &saved)) return s;
  }
  return dsa_launch_attn_bwd(ctx, &r, workspace, (cudaStream_t)stream);
}
