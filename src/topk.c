/* topk.c - public entry point dsa_topk. STUB: validates nothing yet and reports that the GPU path is
 * not implemented; replaced by the issue that brings the kernel. */
#include "internal.h"

DSA_API dsa_status dsa_topk(dsa_context *ctx, const dsa_topk_params *p, void *workspace, size_t *workspace_bytes, cudaStream_t stream) {
  DSA_TRY(dsa_context_enter(ctx, "dsa_topk"));
  return dsa_fail(DSA_ERROR_UNSUPPORTED, "dsa_topk: no GPU implementation yet");
}
