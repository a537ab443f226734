/*
 * kernels.h - the kernels as the host C files see them: one launcher per op of each kernel family
 * in cuda/ (plus its workspace size where the op takes a workspace). A family's dispatch point in
 * cuda/<family>/ decides which of its kernels runs for which shape and option (include/dsa_tune.h),
 * which configurations each kernel is eligible for, and how much workspace the op needs; the
 * per-kernel launchers are private to the family (its *_launch.cuh or *_common.cuh).
 * Every launcher takes validated, stride-resolved params (dsa_check_*, src/validate.c), enqueues on
 * `stream` and returns the launch status; the options it honours are read from ctx->options.
 * Nothing here is public.
 */
#ifndef DSA_KERNELS_H
#define DSA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "dsa.h"

/* Every declaration of the library's internal headers: hidden in libdsa.so (the library also builds
 * with -fvisibility=hidden; only DSA_API is exported). */
#define DSA_HIDDEN __attribute__((visibility("hidden")))

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layout: compaction and head padding (cuda/layout/compact.cu, cuda/layout/pad_heads.cu) ----
 * One kernel each (the compaction's launcher picks its tier by row length); no workspace. */
DSA_HIDDEN dsa_status dsa_launch_compact(const dsa_context *ctx, const dsa_compact_params *p, cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_pad_heads(const dsa_context *ctx, const dsa_pad_heads_params *p,
                                           cudaStream_t stream);

/* ---- sparse attention forward (cuda/attn_fwd/dispatch.cu) ----
 * T > 0; no workspace. DSA_OPTION_FWD_KERNEL forces a kernel (a forced sm_90a kernel off cc 9.0, or
 * one that declines the configuration, is the call's DSA_ERROR_UNSUPPORTED). */
DSA_HIDDEN dsa_status dsa_launch_attn_fwd(const dsa_context *ctx, const dsa_attn_fwd_params *p, cudaStream_t stream);

/* ---- sparse attention backward (cuda/attn_bwd/dispatch.cu) ----
 * The workspace a call needs (ctx NULL: a size query without a context, the options' defaults; it
 * depends on p->deterministic; >= 1, includes 256 bytes of alignment slack; the deterministic size
 * asks CUB, which needs a device), and the launch: the kernel (DSA_OPTION_BWD_KERNEL, else
 * automatic), then the slot target's kernel where the params ask for the target and the kernel did
 * not write it (workspace: at least that many bytes, any alignment; T = 0 writes the zero dkv /
 * dsink). */
DSA_HIDDEN dsa_status dsa_attn_bwd_workspace_size(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                                  size_t *bytes);
DSA_HIDDEN dsa_status dsa_launch_attn_bwd(const dsa_context *ctx, const dsa_attn_bwd_params *p, void *workspace,
                                          cudaStream_t stream);

/* ---- top-k (cuda/topk/topk.cu) ----
 * One launch of the top-k (dsa_topk, and dsa_indexer_topk per chunk): row r reads
 * scores[r * scores_stride + off_r + c] for c < L_r = clamp(lengths[r], 0, columns) (lengths NULL:
 * columns) with off_r = starts[r] - start_base (starts NULL: 0), writes its selected columns
 * c + starts[r] ascending then -1 to indices[r * indices_stride + 0..k), and min(L_r, k) to
 * out_lengths[r] when given. scores may be NULL when every row has L_r <= k. rows 0 launches
 * nothing. No workspace. The kernel follows DSA_OPTION_TOPK_KERNEL (the radix kernel's long rows
 * DSA_OPTION_TOPK_COMPACT_LONG_ROWS). */
typedef struct dsa_topk_launch {
  int64_t rows;
  int64_t columns;
  int32_t k;
  const float *scores;
  int64_t scores_stride;
  const int32_t *lengths;  /* [rows] or NULL */
  const int32_t *starts;   /* [rows] or NULL */
  int64_t start_base;
  int32_t *indices;        /* [rows, k], row stride indices_stride */
  int64_t indices_stride;
  int32_t *out_lengths;    /* [rows] or NULL */
} dsa_topk_launch;
DSA_HIDDEN dsa_status dsa_launch_topk(const dsa_context *ctx, const dsa_topk_launch *a, cudaStream_t stream);

/* ---- indexer (cuda/indexer/dispatch.cu) ----
 * dsa_indexer_topk's work: the workspace a call needs (>= 1, any alignment accepted) and the call.
 * ctx NULL: the size at the default budgets, valid on every device (DEFAULT gets the cuBLAS size,
 * which holds the fused one). With a ctx, the engine and its fused kernel are chosen as the launch
 * chooses them, so a forced engine or kernel the device does not run fails here
 * (DSA_ERROR_UNSUPPORTED) before anything is written. The launch: plan->num_queries > 0, a workspace
 * of at least that size; the cuBLAS engine creates the context's cuBLAS handle on first use. */
DSA_HIDDEN dsa_status dsa_indexer_workspace_size(const dsa_context *ctx, const dsa_indexer_params *p,
                                                 size_t *bytes);
DSA_HIDDEN dsa_status dsa_launch_indexer(dsa_context *ctx, const dsa_indexer_params *p, void *workspace,
                                         cudaStream_t stream);

/* ---- indexer training (cuda/indexer_train/dispatch.cu; the loss: cuda/indexer_train/indexer_loss.cu) ----
 * T > 0 for the slot target and the slot scores. Workspace pointers: at least the size below, any
 * alignment (aligned up inside). The loss: its workspace size (>= 1, no device needed); its launcher
 * also runs T = 0 (loss = 0). The indexer backward: its workspace size (depends on p->deterministic;
 * the deterministic one asks CUB, which needs a device); its launcher also runs T = 0
 * (d_index_k = 0). */
DSA_HIDDEN dsa_status dsa_launch_slot_target(const dsa_context *ctx, const dsa_slot_target_params *p,
                                             cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_indexer_slot_scores(const dsa_context *ctx, const dsa_indexer_slot_scores_params *p,
                                                     cudaStream_t stream);
DSA_HIDDEN size_t dsa_indexer_loss_workspace_size(const dsa_indexer_loss_params *p);
DSA_HIDDEN dsa_status dsa_launch_indexer_loss(const dsa_context *ctx, const dsa_indexer_loss_params *p,
                                              void *workspace, cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_indexer_bwd_workspace_size(const dsa_indexer_bwd_params *p, size_t *bytes);
DSA_HIDDEN dsa_status dsa_launch_indexer_bwd(const dsa_context *ctx, const dsa_indexer_bwd_params *p,
                                             void *workspace, cudaStream_t stream);

/* ---- the kernels' fp32 dKV accumulator layout (host and device) ---- */
/* The sm_90a backward kernels' fp32 dKV accumulator in the non-deterministic mode: the 64-head kernels write
 * the permuted layout below in 128-B row segments per warp instruction (quads q and q ^ 1 swap the
 * 16-column group they do not write); the warp-specialised kernel's deterministic mode stores its
 * per-slot rows in the same order (its sums are per column, so acc keeps it), the lockstep kernel's
 * deterministic mode keeps the real column order. The convert pass un-permutes.
 * The permutation, one formula for host and device (a bijection of [16 g, 16 g + 16) onto
 * itself for every g, so of [0, D) for any D that is a multiple of 16: 576 and 512). Within a group,
 * real column c = 8 h + 2 q + e (h, e in {0, 1}, q in 0..3; bits c3 | c2 c1 | c0) lives in slot
 * 4 q + 2 h + e (bits c2 c1 | c3 | c0): a rotation of bits 1..3. Why: in the wgmma m64nNk16
 * accumulator fragment (docs/hopper.md section 2) lane l of a quad (q = l % 4) holds, of row 16 w + l / 4 (and
 * + 8), the columns 8 j + 2 q + {0, 1} for j = 0 .. N / 8 - 1; for j = 2 g + h these are the 4 real
 * columns 16 g + {2 q, 2 q + 1, 8 + 2 q, 8 + 2 q + 1}, i.e. slots 16 g + 4 q + {0, 1, 2, 3}: one 16-B
 * vector per lane, and the quad's 4 vectors are slots 16 g .. 16 g + 15 = 64 contiguous bytes.
 * Worked example, q = 1, g = 2 (columns 32..47 of a 64-column block): the lane holds real columns
 * 34, 35 (j = 4) and 42, 43 (j = 5); slots 32 + 4 + {0, 1, 2, 3} = 36, 37, 38, 39 (so slot 38 holds
 * real column 42). dsa_bwd_dkv_col is the inverse (slot -> real column), checked by the CPU test;
 * the convert pass gathers with dsa_bwd_dkv_slot (dkv[r][c] = acc[r][slot(c)]).
 * Checked by the CPU test bwd_dkv_layout (tests/test_bwd_dkv_layout.c). The indexer backward's sm_90a
 * kernel keeps its fp32 d_index_k accumulator in the same layout. */
#ifdef __CUDACC__
#define DSA_HOST_DEVICE __host__ __device__
#else
#define DSA_HOST_DEVICE
#endif
static inline DSA_HOST_DEVICE int dsa_bwd_dkv_slot(int c) {
  return (c & ~15) | (((c >> 1) & 3) << 2) | (((c >> 3) & 1) << 1) | (c & 1);
}
static inline DSA_HOST_DEVICE int dsa_bwd_dkv_col(int s) {
  return (s & ~15) | (((s >> 1) & 1) << 3) | (((s >> 2) & 3) << 1) | (s & 1);
}


#ifdef __cplusplus
}
#endif
#endif /* DSA_KERNELS_H */
