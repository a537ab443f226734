/* train_launch.cuh - the indexer-training kernels as the family's dispatch point
 * (cuda/indexer_train/dispatch.cu) sees them: per op its CUDA-core kernel (every device) and its
 * sm_90a kernel (cc 9.0; DSA_ERROR_UNSUPPORTED with a message, before any launch, where it declines),
 * and the indexer backward's passes and workspace layout. Params validated and stride-resolved,
 * T > 0 unless said otherwise; every launch checked. */
#ifndef DSA_TRAIN_LAUNCH_CUH
#define DSA_TRAIN_LAUNCH_CUH

#include "internal.h"

/* ---- slot target ----
 * The CUDA-core kernel (cuda/indexer_train/slot_target.cu) and the sm_90a one
 * (cuda/indexer_train/slot_target_sm90.cu: D 576 / 512, 16-B aligned q / kv rows). */
extern "C" DSA_HIDDEN dsa_status dsa_st_launch_portable(const dsa_slot_target_params *p, cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_st_launch_sm90(const dsa_context *ctx, const dsa_slot_target_params *p,
                                                   cudaStream_t stream);

/* ---- slot scores ----
 * The CUDA-core kernel (cuda/indexer_train/indexer_bwd.cu) and the sm_90a one
 * (cuda/indexer_train/indexer_bwd_sm90.cu: zeroes the scores, then one warpgroup per token computes
 * X = K q^T by wgmma and sum_h w ReLU(X) per slot). */
extern "C" DSA_HIDDEN dsa_status dsa_ss_launch_portable(const dsa_indexer_slot_scores_params *p, cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ss_launch_sm90(const dsa_context *ctx, const dsa_indexer_slot_scores_params *p,
                                                   cudaStream_t stream);

/* ---- indexer backward ----
 * Its workspace layout (cuda/indexer_train/indexer_bwd.cu documents it; offsets from the 256-B
 * aligned base, tr_align_workspace): the same whichever kernels run (the size query has no
 * context); the deterministic one asks CUB for its sort's temp size, which needs a device. */
struct IbLayout {
  size_t acc;                              /* deterministic = 0; = 1: the rows pass's fp32 sums */
  size_t keys0, keys1, vals0, vals1, off;  /* deterministic = 1 */
  size_t rows, cursor;                     /* deterministic = 1: the slot-rows pass */
  size_t temp, temp_bytes;
  int end_bit;                             /* radix sort key bits: the sentinel T_k fits */
  size_t total;
};
/* Tokens per chunk of the deterministic slot-rows pass: two CTAs per SM on 132 SMs. */
constexpr int64_t kIbDetChunkTokens = 264;
extern "C" DSA_HIDDEN dsa_status dsa_ib_layout(const dsa_indexer_bwd_params *p, IbLayout *L);
/* The CUDA-core passes (cuda/indexer_train/indexer_bwd.cu): the per-token pass (d_index_q,
 * d_weights, and with acc non-NULL d_index_k's fp32 atomics into the zeroed [T_k, 128] acc, real
 * column order); the convert of acc into d_index_k (acc NULL: zeros; T_k > 0); the deterministic
 * d_index_k's sort (keys, CUB's stable radix sort, per-key offsets at ws + L.off; *vals: the sorted
 * entry ids) and its per-key pass from the sort (T_k > 0), or from the sm_90a kernel's slot rows
 * (dsa_ib_launch_sm90_rows) of tokens [t0, t1), onto the fp32 sums with a per-key cursor (the
 * first chunk starts them, the last writes d_index_k). */
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_token_portable(const dsa_indexer_bwd_params *p, float *acc,
                                                             cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_convert(const dsa_indexer_bwd_params *p, const float *acc,
                                                      cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_sort(const dsa_indexer_bwd_params *p, unsigned char *ws,
                                                   const IbLayout *L, const int32_t **vals, cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_det(const dsa_indexer_bwd_params *p, const int64_t *off,
                                                  const int32_t *vals, cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_rows_reduce(const dsa_indexer_bwd_params *p, const int64_t *off,
                                                          const int32_t *vals, int64_t *cursor, const float *rows,
                                                          float *sums, int64_t t0, int64_t t1, cudaStream_t stream);
/* The sm_90a per-token kernel (cuda/indexer_train/indexer_bwd_sm90.cu, T > 0 or nothing): d_index_q,
 * d_weights and, with acc non-NULL (zeroed [T_k, 128] fp32), d_index_k's fp32 reductions into acc in
 * the permuted layout of dsa_bwd_dkv_slot, which dsa_ib_launch_convert_lay1 turns into d_index_k;
 * _rows: the same over tokens [t0, t0 + count), writing each valid slot's fp32 dK row at
 * rows[((t - t0) topk + j) 128] instead of reducing it (the deterministic d_index_k's chunked pass);
 * _check: both launchers' checks alone (where they decline: DSA_ERROR_UNSUPPORTED with a message). */
extern "C" DSA_HIDDEN dsa_status dsa_ib_sm90_check(const dsa_context *ctx, const dsa_indexer_bwd_params *p);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_sm90(const dsa_context *ctx, const dsa_indexer_bwd_params *p,
                                                   float *acc, cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_sm90_rows(const dsa_context *ctx, const dsa_indexer_bwd_params *p,
                                                        float *rows, int64_t t0, int64_t count, cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_ib_launch_convert_lay1(const dsa_indexer_bwd_params *p, const float *acc,
                                                           cudaStream_t stream);

#endif /* DSA_TRAIN_LAUNCH_CUH */
