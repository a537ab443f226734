/*
 * attn_fwd_sm90.cu - sparse MLA attention forward on sm_90a tensor cores (wgmma).
 * Stub: returns DSA_ERROR_UNSUPPORTED so the public op falls back to the portable kernel.
 */
#include <cuda_runtime.h>

#include "internal.h"

extern "C" dsa_status dsa_launch_attn_fwd_sm90(const dsa_context *ctx,
                                               const dsa_attn_fwd_params *p, cudaStream_t stream) {
  (void)ctx;
  (void)stream;
  return dsa_fail(DSA_ERROR_UNSUPPORTED,
                  "dsa_sparse_attn_fwd: the sm_90a kernel is not built yet (head_dim = %d)",
                  (int)p->head_dim);
}
