/*
 * dsa_tune.h - libdsa's tuning interface, for kernel research, benchmarks and tests (C99).
 *
 * Every op picks its kernel automatically (docs/design.md section 8); nothing here is needed to use
 * the library. A context carries one value per option below, set to the default at
 * dsa_context_create; dsa_context_set_option changes it for the work later launched through that
 * context, and for nothing else (no process-wide state). Options are per context and not
 * synchronised: set them before launching work with the context, from the thread that uses it.
 *
 * A forced choice that the device or the configuration cannot run returns DSA_ERROR_UNSUPPORTED from
 * the op (nothing written), where the automatic choice would fall back; the exceptions are noted per
 * value. Option ids and values are pinned: they do not change meaning between versions.
 *
 * Checks (both functions): opt first (an id below, else DSA_ERROR_INVALID_ARGUMENT naming opt), then
 * value (set: outside the option's range -> DSA_ERROR_INVALID_ARGUMENT naming the range; get: NULL),
 * then ctx (NULL -> DSA_ERROR_INVALID_ARGUMENT). A rejected set changes nothing. Neither function
 * touches the device.
 */
#ifndef DSA_TUNE_H
#define DSA_TUNE_H

#include <stdint.h>
#include "dsa.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsa_option {
  /* dsa_sparse_attn_fwd's kernel: a dsa_fwd_kernel value. Default DSA_FWD_KERNEL_AUTO. */
  DSA_OPTION_FWD_KERNEL = 1,
  /* Hand-offs between the two consumer warpgroups of the 64-head sm_90a forward: a dsa_fwd_handoff
   * value. Default DSA_FWD_HANDOFF_NAMED_BARRIER. */
  DSA_OPTION_FWD_SM90_HANDOFF = 2,
  /* L2 policy of the sm_90a forward kernels' KV gather: a dsa_fwd_kv_l2_hint value. Default
   * DSA_FWD_KV_L2_EVICT_LAST. */
  DSA_OPTION_FWD_KV_L2_HINT = 3,
  /* Automatic forward on cc 9.0: the largest remainder r = H mod 64 (1..r) that runs on the small-H
   * kernel; larger remainders run on the 64-head kernel with 64 - r zero head rows. 0..63, default 56
   * (48 trades zero heads for speed at r = 49..56: docs/design.md section 8). */
  DSA_OPTION_FWD_SMALL_AUTO_MAX = 4,
  /* dsa_sparse_attn_bwd's kernel: a dsa_bwd_kernel value. Default DSA_BWD_KERNEL_AUTO. */
  DSA_OPTION_BWD_KERNEL = 5,
  /* Tokens per chunk of the sm_90a backward's deterministic mode: 0 = from its 2 GiB budget, rounded
   * down to whole waves of the device's SMs (the default), else 1..2^31-1 (clamped to the token
   * count). The workspace size query reads it from
   * the ctx it is given (query with the value you will run with). For tests: many small chunks. */
  DSA_OPTION_BWD_DET_CHUNK_TOKENS = 6,
  /* The top-k kernel of dsa_topk and dsa_indexer_topk: a dsa_topk_kernel value. Default
   * DSA_TOPK_KERNEL_AUTO. */
  DSA_OPTION_TOPK_KERNEL = 7,
  /* The radix kernel's rows longer than its shared-memory key cache: 1 = the two-read compaction path
   * when their candidates fit in shared memory (the default), 0 = always the five-read streaming
   * path. For tests: both paths. */
  DSA_OPTION_TOPK_COMPACT_LONG_ROWS = 8,
  /* The fused indexer engine's kernel (DSA_INDEXER_ENGINE_FUSED, and DEFAULT where it runs the fused
   * engine): a dsa_indexer_fused_kernel value. Default DSA_INDEXER_FUSED_AUTO. */
  DSA_OPTION_INDEXER_FUSED_KERNEL = 9,
  /* Workspace budgets of the indexer, in bytes: the fp32 scores of one query chunk (both engines;
   * default 256 MiB) and the cuBLAS engine's fp32 logits of one GEMM (default 64 MiB); 1..2^62. A
   * budget is exceeded only when one query's row alone does not fit (the scores: and by each row's
   * padding to a multiple of 4 columns). They bound dsa_indexer_topk's workspace whatever T_q (with
   * the cuBLAS engine's packed q copy and 768 bytes of alignment): a caller that must bound that
   * memory lowers them (smaller chunks, more of them: slower at long windows); a larger scores budget
   * takes fewer chunks. The workspace size query reads them from the ctx it is given (without a ctx:
   * the defaults). For tests: many chunks. */
  DSA_OPTION_INDEXER_SCORES_BUDGET = 10,
  DSA_OPTION_INDEXER_LOGITS_BUDGET = 11,
  /* Keys per GEMM of the indexer's cuBLAS engine: 1..2^30, default 32768. */
  DSA_OPTION_INDEXER_KEY_TILE = 12,
  /* The indexer-training kernels of dsa_attn_slot_target and dsa_indexer_bwd (and of the backward's
   * slot target after a backward kernel that does not sum it itself), and of dsa_indexer_slot_scores
   * (AUTO: the sm_90a kernels on cc 9.0, the CUDA-core ones elsewhere): a dsa_train_kernel value.
   * Default DSA_TRAIN_KERNEL_AUTO. */
  DSA_OPTION_TRAIN_KERNEL = 13
} dsa_option;

typedef enum dsa_fwd_kernel {
  DSA_FWD_KERNEL_AUTO = 0,     /* docs/design.md section 8: sm_90a kernels on cc 9.0, else portable */
  DSA_FWD_KERNEL_PORTABLE = 1, /* the CUDA-core kernel (any device, any configuration) */
  DSA_FWD_KERNEL_SM90_H64 = 2, /* the 64-head sm_90a kernel on the whole H (zero head rows allowed) */
  DSA_FWD_KERNEL_SM90_SMALL = 3, /* the small-H sm_90a kernel alone (H <= 64) */
  DSA_FWD_KERNEL_SM90_SPLIT = 4  /* heads [0, 64 floor(H / 64)) on the 64-head kernel, the rest on the
                                  * small-H kernel */
} dsa_fwd_kernel;

typedef enum dsa_fwd_handoff {
  DSA_FWD_HANDOFF_NAMED_BARRIER = 0, /* barrier.arrive / barrier.sync (the fast one) */
  DSA_FWD_HANDOFF_MBARRIER = 1       /* mbarriers: slower, the twin compute-sanitizer racecheck can
                                      * follow (it does not follow barrier.arrive -> barrier.sync) */
} dsa_fwd_handoff;

typedef enum dsa_fwd_kv_l2_hint {
  DSA_FWD_KV_L2_NONE = 0,       /* no cache policy */
  DSA_FWD_KV_L2_EVICT_LAST = 1, /* evict_last on every KV gather */
  DSA_FWD_KV_L2_IF_FITS = 2     /* evict_last when num_kv x kv_stride x 2 bytes fit half the L2 */
} dsa_fwd_kv_l2_hint;

typedef enum dsa_bwd_kernel {
  DSA_BWD_KERNEL_AUTO = 0,      /* docs/design.md section 6 */
  DSA_BWD_KERNEL_PORTABLE = 1,  /* the CUDA-core kernels */
  DSA_BWD_KERNEL_SM90_H64 = 2,  /* the 64-head sm_90a kernel */
  /* retired: the small-H sm_90a kernel left the library (the warp-specialised kernel runs every H);
   * forcing it makes dsa_sparse_attn_bwd return DSA_ERROR_UNSUPPORTED, writing nothing */
  DSA_BWD_KERNEL_SM90_SMALL = 3,
  /* the warp-specialised 64-head sm_90a kernel, both modes; the automatic choice on cc 9.0 */
  DSA_BWD_KERNEL_SM90_WS = 4
} dsa_bwd_kernel;

typedef enum dsa_topk_kernel {
  DSA_TOPK_KERNEL_AUTO = 0,   /* FILTER where the device has its shared memory, else RADIX */
  DSA_TOPK_KERNEL_RADIX = 1,  /* one CTA per row, radix select (shared-memory key cache) */
  DSA_TOPK_KERNEL_FILTER = 2  /* sampled threshold, one filtering read, exact select on the candidates;
                               * runs RADIX on a device without its 2 x 90 KB of shared memory */
} dsa_topk_kernel;

typedef enum dsa_indexer_fused_kernel {
  DSA_INDEXER_FUSED_AUTO = 0,     /* WGMMA on cc 9.0 for more than 16 indexer heads, else MMA_SYNC */
  DSA_INDEXER_FUSED_MMA_SYNC = 1, /* mma.sync m16n8k16 (sm_80+) */
  DSA_INDEXER_FUSED_WGMMA = 2     /* sm_90a wgmma (cc 9.0 and enough shared memory) */
} dsa_indexer_fused_kernel;

typedef enum dsa_train_kernel {
  DSA_TRAIN_KERNEL_AUTO = 0,     /* SM90 on cc 9.0 where it runs, else PORTABLE */
  DSA_TRAIN_KERNEL_PORTABLE = 1, /* the CUDA-core kernels (any device, any configuration) */
  DSA_TRAIN_KERNEL_SM90 = 2      /* the sm_90a wgmma kernels (cc 9.0; the slot target at D 576 / 512) */
} dsa_train_kernel;

DSA_API dsa_status dsa_context_set_option(dsa_context *ctx, dsa_option opt, int64_t value);
DSA_API dsa_status dsa_context_get_option(const dsa_context *ctx, dsa_option opt, int64_t *value);

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* DSA_TUNE_H */
