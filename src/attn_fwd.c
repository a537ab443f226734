/* attn_fwd.c - public entry point dsa_sparse_attn_fwd. STUB: validates nothing yet and reports that the GPU path is
 * not implemented; replaced by the issue that brings the kernel. */
#include "internal.h"

DSA_API dsa_status dsa_sparse_attn_fwd(dsa_context *ctx, const dsa_attn_fwd_params *p, cudaStream_t stream) {
  DSA_TRY(dsa_context_enter(ctx, "dsa_sparse_attn_fwd"));
  return dsa_fail(DSA_ERROR_UNSUPPORTED, "dsa_sparse_attn_fwd: no GPU implementation yet");
}
