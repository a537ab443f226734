/* bwd_launch.cuh - the backward's kernels as its dispatch point (cuda/attn_bwd/dispatch.cu) sees
 * them: the workspace layouts' sizes and one launcher per kernel. Params validated and
 * stride-resolved; a workspace of at least the op's size (dsa_attn_bwd_workspace_size), any
 * alignment (aligned up inside). The sm_90a launchers return DSA_ERROR_UNSUPPORTED with a message,
 * before any launch, for a configuration they do not run. */
#ifndef DSA_BWD_LAUNCH_CUH
#define DSA_BWD_LAUNCH_CUH

#include "internal.h"

/* The layout every kernel's non-deterministic mode runs in (its regions hold the warp-specialised
 * kernel's spare accumulator rows and split dQ partials too) and the portable kernels' deterministic
 * one (cuda/attn_bwd/bwd_portable.cu's make_layout): its bytes (>= 1, includes 256 bytes of alignment
 * slack). The deterministic mode's size asks CUB, which needs a device. */
extern "C" DSA_HIDDEN dsa_status dsa_bwd_portable_workspace_size(const dsa_attn_bwd_params *p, size_t *bytes);
/* The sm_90a kernels' deterministic layout (bwd_det_layout, cuda/attn_bwd/bwd_common.cuh; defined in
 * cuda/attn_bwd/bwd_sm90_ws.cu, whose sort-ahead its second sort region serves): its bytes for
 * chunk_tokens tokens per chunk (0: from the 2 GiB contribution budget; DSA_OPTION_BWD_DET_CHUNK_TOKENS),
 * 0 where those kernels never run (not deterministic, D not 576 / 512). */
extern "C" DSA_HIDDEN dsa_status dsa_bwd_sm90_det_workspace_size(const dsa_attn_bwd_params *p, int64_t chunk_tokens,
                                                                size_t *bytes);

/* The portable kernels (cuda/attn_bwd/bwd_portable.cu): any arch, every configuration. */
extern "C" DSA_HIDDEN dsa_status dsa_bwd_launch_portable(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                                        void *workspace, cudaStream_t stream);
/* The lockstep 64-head sm_90a kernel (cuda/attn_bwd/bwd_sm90_h64.cu): both modes, D 576 / 512,
 * cc 9.0. */
extern "C" DSA_HIDDEN dsa_status dsa_bwd_launch_sm90_h64(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                                        void *workspace, cudaStream_t stream);
/* The warp-specialised 64-head sm_90a kernel (cuda/attn_bwd/bwd_sm90_ws.cu): both modes, D 576 / 512,
 * H 1..128, cc 9.0, the same checks as the lockstep kernel; it writes the slot target too when the
 * params ask for one. */
extern "C" DSA_HIDDEN dsa_status dsa_bwd_launch_sm90_ws(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                                       void *workspace, cudaStream_t stream);

#endif /* DSA_BWD_LAUNCH_CUH */
