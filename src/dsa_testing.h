/*
 * dsa_testing.h - the library's internals that the test suites (tests/, tests/fuzz/) reach, and
 * nothing else of src/internal.h (which includes this header): the kernels' interface (src/kernels.h:
 * the top-k's launch interface that dsa_indexer_topk uses, the dKV accumulator layout), a context on
 * no device for the host-side rules, the argument checks every public op runs, the indexer's
 * workspace layout, the forward's KV L2 policy, the device-code probe, and the CPU reference's
 * double-precision forward. Hidden symbols: the tests link the static library. Nothing here is
 * public.
 */
#ifndef DSA_TESTING_H
#define DSA_TESTING_H

#include <stdint.h>
#include "dsa.h"
#include "dsa_tune.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One past the largest dsa_option id (include/dsa_tune.h). */
#define DSA_OPTION_COUNT 14

/* A context on no device (src/context.c): every option at its default, the device facts zero but
 * the L2 size l2_bytes (what the forward's KV policy compares with); what the host-side rules read
 * (the options through dsa_context_set_option / dsa_context_get_option, and l2_bytes). NULL when
 * out of host memory; dsa_context_destroy frees it. */
DSA_HIDDEN dsa_context *dsa_testing_context(int l2_bytes);
/* Sets the L2 size a device context's host-side rules read (the forward's KV policy, the backward's
 * sweep: cuda/attn_bwd/bwd_sm90_ws.cu), so that a test runs a large shape's path at small sizes. */
DSA_HIDDEN void dsa_testing_set_l2_bytes(dsa_context *ctx, int l2_bytes);

/* Argument checks, one per op, shared by the GPU op and the CPU reference (src/validate.c).
 * `fn` is the public function's name, used in the message. They also resolve the 0 = contiguous
 * strides: each takes the caller's struct and writes a copy with every stride filled in. */
DSA_HIDDEN dsa_status dsa_check_compact(const dsa_compact_params *p, const char *fn,
                                        dsa_compact_params *resolved);
DSA_HIDDEN dsa_status dsa_check_pad_heads(const dsa_pad_heads_params *p, const char *fn,
                                          dsa_pad_heads_params *resolved);
DSA_HIDDEN dsa_status dsa_check_topk(const dsa_topk_params *p, const char *fn,
                                     dsa_topk_params *resolved);
DSA_HIDDEN dsa_status dsa_check_indexer(const dsa_indexer_params *p, const char *fn,
                                        dsa_indexer_params *resolved);
DSA_HIDDEN dsa_status dsa_check_attn_fwd(const dsa_attn_fwd_params *p, const char *fn,
                                         dsa_attn_fwd_params *resolved);
DSA_HIDDEN dsa_status dsa_check_attn_bwd(const dsa_attn_bwd_params *p, const char *fn,
                                         dsa_attn_bwd_params *resolved);
/* Indexer training (src/validate.c, the end). */
DSA_HIDDEN dsa_status dsa_check_slot_target(const dsa_slot_target_params *p, const char *fn,
                                            dsa_slot_target_params *resolved);
DSA_HIDDEN dsa_status dsa_check_indexer_slot_scores(const dsa_indexer_slot_scores_params *p,
                                                    const char *fn,
                                                    dsa_indexer_slot_scores_params *resolved);
DSA_HIDDEN dsa_status dsa_check_indexer_loss(const dsa_indexer_loss_params *p, const char *fn,
                                             dsa_indexer_loss_params *resolved);
DSA_HIDDEN dsa_status dsa_check_indexer_bwd(const dsa_indexer_bwd_params *p, const char *fn,
                                            dsa_indexer_bwd_params *resolved);
/* Section 5 check of a plan view an op is handed (src/plan.c): scalars and pointer presence, never
 * dereferenced. num_queries / total_key_tokens < 0 skip the comparison with the op's sizes. */
DSA_HIDDEN dsa_status dsa_check_plan_view(const dsa_plan_view *v, int64_t num_queries,
                                          int64_t total_key_tokens, const char *fn);

/* CPU-reference internals (src/reference.c): one rounding of a double to bf16
 * (nearest even), and the double-precision forward on contiguous double copies of q [T, H, D],
 * kv [T_kv, D] and sink [H] (sink NULL: the params' sink; indices, topk_length, sizes and scale come
 * from p). out [T, H, 512], lse and max_logits [T, H] are contiguous doubles, each optional. */
DSA_HIDDEN uint16_t dsa_ref_double_to_bf16(double x);
DSA_HIDDEN dsa_status dsa_ref_attn_fwd_f64(const dsa_attn_fwd_params *p, const double *q,
                                           const double *kv, const double *sink, double *out,
                                           double *lse, double *max_logits);

/* dsa_indexer_topk's workspace layout for the budgets of ctx (a device-free context serves: only its
 * options are read) and the engine `fused` (0: cuBLAS, else fused), as the call plans it
 * (cuda/indexer/dispatch.cu): its total bytes and queries per scored chunk (0 when nothing is
 * scored). For host-side tests of the layout rules. */
DSA_HIDDEN dsa_status dsa_indexer_layout(const dsa_context *ctx, const dsa_indexer_params *p, int fused,
                                         int64_t *total, int64_t *chunk);

/* Whether a forward launch's KV gather carries the L2 evict_last policy (DSA_OPTION_FWD_KV_L2_HINT;
 * cuda/attn_fwd/dispatch.cu): what both sm_90a forward kernels follow. */
DSA_HIDDEN int dsa_fwd_kv_evict_last(const dsa_context *ctx, const dsa_attn_fwd_params *p);

/* Device code for the context's device (cuda/common/device_check.cu, src/context.c): the cudaError_t
 * of cudaFuncGetAttributes on a probe kernel built like every other, the build's CUDA architectures
 * ("900, ..."), and the status a probe result maps to: DSA_SUCCESS, or DSA_ERROR_UNSUPPORTED with a
 * message naming the device, its compute capability and the build's targets (separate from the
 * probe so that the CPU tests check the mapping and the message). */
DSA_HIDDEN int dsa_device_code_probe(void);
DSA_HIDDEN const char *dsa_device_code_targets(void);
DSA_HIDDEN dsa_status dsa_device_code_status(int cuda_error, int device, const char *name,
                                             int cc_major, int cc_minor);

#ifdef __cplusplus
}
#endif
#endif /* DSA_TESTING_H */
