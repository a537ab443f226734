/* attn_fwd.c - public entry point dsa_sparse_attn_fwd: validation, the context, then the forward's
 * dispatch point (dsa_launch_attn_fwd, cuda/attn_fwd/dispatch.cu: which kernel for which shape and
 * option). */
#include "internal.h"

DSA_API dsa_status dsa_sparse_attn_fwd(dsa_context *ctx, const dsa_attn_fwd_params *p,
                                       dsa_stream_t stream) {
  dsa_attn_fwd_params r;
  DSA_TRY(dsa_check_attn_fwd(p, "dsa_sparse_attn_fwd", &r));
  DSA_TRY(dsa_context_enter(ctx, "dsa_sparse_attn_fwd"));
  if (r.num_tokens == 0) return DSA_SUCCESS;
  return dsa_launch_attn_fwd(ctx, &r, stream);
}
