/* idx_launch.cuh - the indexer's kernels as its dispatch point (cuda/indexer/dispatch.cu) sees them:
 * the cuBLAS engine's two small kernels (cuda/indexer/idx_cublas.cu) and the fused engine's two
 * scoring kernels (cuda/indexer/idx_fused_mma.cu, cuda/indexer/idx_fused_wgmma.cu). */
#ifndef DSA_IDX_LAUNCH_CUH
#define DSA_IDX_LAUNCH_CUH

#include "internal.h"

/* The cuBLAS engine's helpers: copies q rows [tokens, heads, 128] (any strides) into a packed
 * [tokens * heads, 128] bf16 matrix; and the head reduction
 * scores[r * scores_ld + c] = sum_h w[r, h] * ReLU(logits[(r * heads + h) * logits_ld + c])
 * for r < rows, c < cols (ReLU keeps NaN; weights fp32 or bf16). */
extern "C" DSA_HIDDEN dsa_status dsa_idx_launch_pack_q(const uint16_t *q, int64_t stride_token, int64_t stride_head,
                                                      int64_t tokens, int32_t heads, uint16_t *out,
                                                      cudaStream_t stream);
extern "C" DSA_HIDDEN dsa_status dsa_idx_launch_reduce(int64_t rows, int32_t heads, int64_t cols, const float *logits,
                                                      int64_t logits_ld, const void *weights, int weights_bf16,
                                                      int64_t weights_stride, float *scores, int64_t scores_ld,
                                                      cudaStream_t stream);

/* Fused scoring (DSA_INDEXER_ENGINE_FUSED): scores[r * scores_ld + c] for the keys
 * window_start + c (c < window) that query r sees when causal_length[r] > topk; other entries are
 * left as they were. q / weights / starts / causal_lengths point at the chunk's first query. */
typedef struct dsa_indexer_fused_args {
  int64_t rows;
  int32_t heads;
  int32_t topk;
  const uint16_t *q;        /* [rows, heads, 128] */
  int64_t q_stride_token, q_stride_head;
  const uint16_t *k;        /* index_k [T_k, 128] (global rows) */
  int64_t k_stride;
  const void *weights;      /* [rows, heads] fp32 or bf16 */
  int weights_bf16;
  int64_t weights_stride;
  const int32_t *starts;    /* [rows] device */
  const int32_t *causal_lengths; /* [rows] device */
  int64_t window_start, window;
  float *scores;            /* [rows, scores_ld] */
  int64_t scores_ld;
} dsa_indexer_fused_args;
/* On mma.sync (idx_fused, cuda/indexer/idx_fused_mma.cu; sm_80+). */
extern "C" DSA_HIDDEN dsa_status dsa_idx_launch_fused_mma(const dsa_context *ctx, const dsa_indexer_fused_args *a,
                                                         cudaStream_t stream);
/* On sm_90a wgmma (cuda/indexer/idx_fused_wgmma.cu): the check says whether it runs on this context
 * (cc 9.0 and enough opt-in shared memory; else DSA_ERROR_UNSUPPORTED with a message), the launcher
 * takes the args of the mma.sync one. */
extern "C" DSA_HIDDEN dsa_status dsa_idx_fused_wgmma_check(const dsa_context *ctx);
extern "C" DSA_HIDDEN dsa_status dsa_idx_launch_fused_wgmma(const dsa_context *ctx, const dsa_indexer_fused_args *a,
                                                           cudaStream_t stream);

#endif /* DSA_IDX_LAUNCH_CUH */
