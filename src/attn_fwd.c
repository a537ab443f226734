/* attn_fwd.c - public entry point dsa_sparse_attn_fwd: validation, then dispatch between the
 * sm_90a tensor-core kernel (cuda/attn_fwd_sm90.cu) and the portable kernel (cuda/attn_fwd.cu). */
#include <string.h>
#include "internal.h"

/* 0 = automatic, 1 = portable kernel only, 2 = sm_90a kernel only, 3 = sm_90a small-H kernel only
 * (H <= 32; tests and benchmarks). */
int dsa_attn_fwd_variant = 0;

DSA_API dsa_status dsa_sparse_attn_fwd(dsa_context *ctx, const dsa_attn_fwd_params *p,
                                       dsa_stream_t stream) {
  dsa_attn_fwd_params r;
  DSA_TRY(dsa_check_attn_fwd(p, "dsa_sparse_attn_fwd", &r));
  DSA_TRY(dsa_context_enter(ctx, "dsa_sparse_attn_fwd"));
  if (r.num_tokens == 0) return DSA_SUCCESS;

  const int hopper = ctx->cc_major == 9 && ctx->cc_minor == 0; /* sm_90a code runs on 9.0 only */
  if (dsa_attn_fwd_variant == 1) return dsa_launch_attn_fwd_simple(ctx, &r, stream);
  if (dsa_attn_fwd_variant == 2) {
    if (!hopper)
      return dsa_fail(DSA_ERROR_UNSUPPORTED,
                      "dsa_sparse_attn_fwd: the sm_90a kernel needs compute capability 9.0, the "
                      "device has %d.%d", ctx->cc_major, ctx->cc_minor);
    return dsa_launch_attn_fwd_sm90(ctx, &r, stream);
  }
  if (dsa_attn_fwd_variant == 3) {
    if (!hopper)
      return dsa_fail(DSA_ERROR_UNSUPPORTED,
                      "dsa_sparse_attn_fwd: the sm_90a small-H kernel needs compute capability 9.0, "
                      "the device has %d.%d", ctx->cc_major, ctx->cc_minor);
    return dsa_launch_attn_fwd_sm90_small(ctx, &r, stream);
  }
  if (hopper) {
    /* The sm_90a kernels decline configurations they do not run with DSA_ERROR_UNSUPPORTED; the
     * call then succeeds on the next one, so its message must not outlive it: keep the thread's
     * previous message and put it back. H <= 32 tries the small-H kernel (keys on the wgmma M
     * dimension, no padded heads) first. */
    char saved[512];
    dsa_status s;
    strncpy(saved, dsa_last_error_message(), sizeof saved - 1);
    saved[sizeof saved - 1] = '\0';
    if (r.num_heads <= 32) {
      s = dsa_launch_attn_fwd_sm90_small(ctx, &r, stream);
      if (s != DSA_ERROR_UNSUPPORTED) return s;
      (void)dsa_fail(DSA_SUCCESS, "%s", saved);
    }
    s = dsa_launch_attn_fwd_sm90(ctx, &r, stream);
    if (s != DSA_ERROR_UNSUPPORTED) return s;
    (void)dsa_fail(DSA_SUCCESS, "%s", saved);
  }
  return dsa_launch_attn_fwd_simple(ctx, &r, stream);
}
