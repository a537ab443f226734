/* attn_bwd.c - public entry point dsa_sparse_attn_bwd. STUB: validates nothing yet and reports that the GPU path is
 * not implemented; replaced by the issue that brings the kernel. */
#include "internal.h"

DSA_API dsa_status dsa_sparse_attn_bwd(dsa_context *ctx, const dsa_attn_bwd_params *p, void *workspace, size_t *workspace_bytes, cudaStream_t stream) {
  DSA_TRY(dsa_context_enter(ctx, "dsa_sparse_attn_bwd"));
  return dsa_fail(DSA_ERROR_UNSUPPORTED, "dsa_sparse_attn_bwd: no GPU implementation yet");
}
