/* fwd_launch.cuh - the forward's kernels as its dispatch point (cuda/attn_fwd/dispatch.cu) sees them:
 * one launcher per kernel, each taking validated, stride-resolved params and returning
 * DSA_ERROR_UNSUPPORTED with a message, before any launch, for a configuration it does not run.
 * The sm_90a launchers run heads [head_begin, head_begin + head_count) of an H-head problem (q / sink
 * read, out / lse / max_logits written for those heads only; lse indexed t * H + h as always). */
#ifndef DSA_FWD_LAUNCH_CUH
#define DSA_FWD_LAUNCH_CUH

#include "internal.h"

/* The portable kernel (cuda/attn_fwd/fwd_portable.cu): any arch, every H, D 576 / 512. */
extern "C" DSA_HIDDEN dsa_status dsa_fwd_launch_portable(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                                        cudaStream_t stream);
/* The 64-head kernel (cuda/attn_fwd/fwd_sm90_h64.cu): cc 9.0, 64 heads on the wgmma M (zero M rows
 * when head_count is not a multiple of 64). */
extern "C" DSA_HIDDEN dsa_status dsa_fwd_launch_sm90_h64(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                                        int head_begin, int head_count, cudaStream_t stream);
/* The small-H kernel (cuda/attn_fwd/fwd_sm90_small.cu): cc 9.0, at most 64 heads per launch on the
 * wgmma N. */
extern "C" DSA_HIDDEN dsa_status dsa_fwd_launch_sm90_small(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                                          int head_begin, int head_count, cudaStream_t stream);

#endif /* DSA_FWD_LAUNCH_CUH */
