/*
 * internal.h - what the host C files and the CUDA launchers share: the context struct, error
 * reporting, the argument checks every public op runs (shared by the GPU op and its dsa_ref_ twin),
 * and the launchers the .cu files export. Nothing here is public.
 */
#ifndef DSA_INTERNAL_H
#define DSA_INTERNAL_H

#include <cuda_runtime_api.h>
#include "dsa.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSA_HIDDEN __attribute__((visibility("hidden")))

struct dsa_context {
  int device;
  int cc_major, cc_minor;
  int sm_count;
  int max_smem_optin;  /* bytes of shared memory a block may opt into */
  int l2_bytes;
  void *cublas;        /* cublasHandle_t, created on first use */
};

/* Records a formatted message for dsa_last_error_message() and returns `status`. */
DSA_HIDDEN dsa_status dsa_fail(dsa_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Trying an sm_90a launcher that may decline (DSA_ERROR_UNSUPPORTED, before any launch) and falling
 * back: a declined attempt's message must not outlive a call that then succeeds on another path.
 *   dsa_saved_message saved;
 *   dsa_message_save(&saved);
 *   s = try_launch(...);
 *   if (!dsa_declined(s, &saved)) return s;   (declined: the thread's message is back, fall back)
 * dsa_message_save copies the thread's last message; dsa_message_restore puts it back;
 * dsa_declined(s, m): 0 for any status but DSA_ERROR_UNSUPPORTED, else restores m and returns 1. */
typedef struct {
  char text[512];
} dsa_saved_message;
DSA_HIDDEN void dsa_message_save(dsa_saved_message *m);
DSA_HIDDEN void dsa_message_restore(const dsa_saved_message *m);
DSA_HIDDEN int dsa_declined(dsa_status s, const dsa_saved_message *m);
/* Maps a cudaError_t (as int) to DSA_ERROR_CUDA with the runtime's message; success passes. */
DSA_HIDDEN dsa_status dsa_cuda_status(int cuda_error, const char *where);
/* Raises kernel `fn`'s dynamic shared memory limit to `bytes` (and, when max_carveout, asks for the
 * largest shared-memory carveout) once per device: set[device] remembers the largest size set so
 * far, so later launches skip the host call. A race between threads only repeats the same harmless
 * call; devices past DSA_TRACKED_DEVICES call every time. `where` names the op for the message. */
#define DSA_TRACKED_DEVICES 64
DSA_HIDDEN dsa_status dsa_kernel_smem_once(const void *fn, int bytes, int max_carveout, int device,
                                           int set[DSA_TRACKED_DEVICES], const char *where);

/* Returns DSA_ERROR_INVALID_ARGUMENT with a message unless cond holds. */
#define DSA_REQUIRE(cond, ...)                                        \
  do {                                                                \
    if (!(cond)) return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)
#define DSA_TRY(expr)                         \
  do {                                        \
    dsa_status dsa_try_s_ = (expr);           \
    if (dsa_try_s_ != DSA_SUCCESS) return dsa_try_s_; \
  } while (0)

/* Context checks for GPU entry points: non-NULL, and the calling thread bound to its device. */
DSA_HIDDEN dsa_status dsa_context_enter(dsa_context *ctx, const char *fn);
/* Lazily creates the cuBLAS handle of the context. */
DSA_HIDDEN dsa_status dsa_context_cublas(dsa_context *ctx, void **handle);

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

/* CPU-reference internals (src/reference.c) the tests use: one rounding of a double to bf16
 * (nearest even), and the double-precision forward on contiguous double copies of q [T, H, D],
 * kv [T_kv, D] and sink [H] (sink NULL: the params' sink; indices, topk_length, sizes and scale come
 * from p). out [T, H, 512], lse and max_logits [T, H] are contiguous doubles, each optional. */
DSA_HIDDEN uint16_t dsa_ref_double_to_bf16(double x);
DSA_HIDDEN dsa_status dsa_ref_attn_fwd_f64(const dsa_attn_fwd_params *p, const double *q,
                                           const double *kv, const double *sink, double *out,
                                           double *lse, double *max_logits);

/* Launchers exported by the cuda/ files (C linkage). They take already-validated, stride-resolved
 * params, enqueue on `stream`, and return the launch status. */
DSA_HIDDEN dsa_status dsa_launch_compact(const dsa_context *ctx, const dsa_compact_params *p,
                                         cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_pad_heads(const dsa_context *ctx, const dsa_pad_heads_params *p,
                                           cudaStream_t stream);

/* Sparse attention forward: the portable kernel (any arch, any H, D) and the sm_90a tensor-core
 * kernels, which return DSA_ERROR_UNSUPPORTED for a configuration they do not handle (the public
 * op then falls back to the portable one). dsa_attn_fwd_variant: 0 = automatic (src/attn_fwd.c,
 * docs/design.md section 8), 1 = force the portable kernel, 2 = force the 64-head sm_90a kernel on
 * the whole H (zero M rows when 64 does not divide H), 3 = force the sm_90a small-H kernel
 * (cuda/attn_fwd_sm90_small.cu, H <= 64), 4 = force the split: the 64-head kernel on heads
 * [0, 64 floor(H / 64)), the small-H kernel on the rest (tests and benchmarks set it).
 * The _heads launchers run heads [head_begin, head_begin + head_count) of an H-head problem (q / sink
 * read, out / lse / max_logits written for those heads only; lse indexed t * H + h as always); the
 * small-H one takes at most 64 heads per launch. */
DSA_HIDDEN dsa_status dsa_launch_attn_fwd_simple(const dsa_context *ctx,
                                                 const dsa_attn_fwd_params *p, cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_attn_fwd_sm90(const dsa_context *ctx,
                                               const dsa_attn_fwd_params *p, cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_attn_fwd_sm90_heads(const dsa_context *ctx,
                                                     const dsa_attn_fwd_params *p, int head_begin,
                                                     int head_count, cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_attn_fwd_sm90_small(const dsa_context *ctx,
                                                     const dsa_attn_fwd_params *p, cudaStream_t stream);
DSA_HIDDEN dsa_status dsa_launch_attn_fwd_sm90_small_heads(const dsa_context *ctx,
                                                           const dsa_attn_fwd_params *p, int head_begin,
                                                           int head_count, cudaStream_t stream);
DSA_HIDDEN extern int dsa_attn_fwd_variant;
/* The sm_90a small-H forward's two-consumer shape (N = 40..64, cuda/attn_fwd_sm90_small.cu): 1 = the
 * WGs split the 512 value dims (WG 0 computes S^T and the softmax for every column once), 0 = they
 * split the columns (each computes its own S^T; the KV tile is read twice). Other values mean 1
 * (tests and benchmarks set it). */
DSA_HIDDEN extern int dsa_attn_fwd_small_split;
/* The automatic forward choice on cc 9.0 (src/attn_fwd.c): H mod 64 in 1..DSA_FWD_SMALL_AUTO_MAX runs
 * on the small-H kernel, larger remainders on the 64-head kernel's zero rows (tests follow it). */
#define DSA_FWD_SMALL_AUTO_MAX 56
/* The L2 policy of the sm_90a forward's KV gather (schedules 3 / 4 and the small-H kernel): 0 = none,
 * 1 = evict_last always (the default), 2 = evict_last when the KV rows fit in half the L2 (tests and
 * benchmarks set it); dsa_fwd_kv_evict_last applies it to a launch. */
DSA_HIDDEN extern int dsa_attn_fwd_kv_l2_hint;
DSA_HIDDEN int dsa_fwd_kv_evict_last(const dsa_context *ctx, const dsa_attn_fwd_params *p);
/* The 64-head sm_90a kernel's consumer schedule (cuda/attn_fwd_sm90.cu header, split-S mode only):
 * 0 = serial, 1 = overlapped (S(n+1) and PV(n) in flight while softmax(n+1) runs), 2 = serial with
 * S(n+1) issued right behind PV(n), 3 = tile split between the WGs (its own kernel, below; the
 * default), 4 = schedule 3 with mbarrier hand-offs between the WGs; other values mean 0 (tests and
 * benchmarks set it). */
DSA_HIDDEN extern int dsa_attn_fwd_sm90_overlap;
/* Schedule 3 of the 64-head sm_90a forward (cuda/attn_fwd_sm90_v2.cu: WG0 / WG1 take alternate 64-key
 * tiles, one chained row max, own P by RS and the peer's by SS; docs/fwd-sm90-next.md), launched by
 * dsa_launch_attn_fwd_sm90_heads when dsa_attn_fwd_sm90_overlap is 3 or 4, after its checks; heads
 * [head_begin, head_end) in num_hblocks blocks of 64, num_tokens > 0. */
DSA_HIDDEN dsa_status dsa_launch_attn_fwd_sm90_v2(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                                  int head_begin, int head_end, int num_hblocks,
                                                  cudaStream_t stream);

/* Sparse attention backward (cuda/attn_bwd.cu): the workspace size for validated, stride-resolved
 * params (it depends on p->deterministic; >= 1, includes 256 bytes of alignment slack), and the
 * launcher (workspace: at least that many bytes, any alignment). */
DSA_HIDDEN dsa_status dsa_attn_bwd_workspace_size(const dsa_attn_bwd_params *p, size_t *bytes);
DSA_HIDDEN dsa_status dsa_launch_attn_bwd(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                          void *workspace, cudaStream_t stream);
/* The sm_90a tensor-core variant of the same launcher (cuda/attn_bwd_sm90.cu): both modes, D = 576
 * and 512, cc 9.0; same workspace layout (deterministic mode: see below); DSA_ERROR_UNSUPPORTED for anything else
 * (the op then runs dsa_launch_attn_bwd). dsa_attn_bwd_variant: 0 = automatic, 1 = force the
 * portable kernels, 2 = force the 64-head sm_90a kernel, 3 = force the small-H sm_90a kernel (tests
 * and benchmarks set it). */
DSA_HIDDEN dsa_status dsa_launch_attn_bwd_sm90(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                               void *workspace, cudaStream_t stream);
/* The sm_90a small-H variant (cuda/attn_bwd_sm90_small.cu, keys on the wgmma M, heads on N): H 1..32,
 * D 576 / 512, both modes, the same workspace (deterministic: the 64-head kernel's layout with one
 * head block, which dsa_attn_bwd_sm90_det_workspace_size covers); DSA_ERROR_UNSUPPORTED otherwise.
 * dsa_attn_bwd_variant 3 forces it (tests, benchmarks); automatic mode tries it first for H <= 32. */
DSA_HIDDEN dsa_status dsa_launch_attn_bwd_sm90_small(const dsa_context *ctx, const dsa_attn_bwd_params *p,
                                                     void *workspace, cudaStream_t stream);
DSA_HIDDEN extern int dsa_attn_bwd_variant;
/* The sm_90a kernel's deterministic mode (cuda/attn_bwd_sm90.cu): its workspace size for validated
 * params (0 where it never runs: not deterministic, D not 576 / 512); the op's deterministic size is the
 * larger of this and dsa_attn_bwd_workspace_size. dsa_attn_bwd_det_chunk_tokens: tokens per chunk
 * of that mode (0 = from its 2 GiB contribution budget; tests set it small to force many chunks). */
DSA_HIDDEN dsa_status dsa_attn_bwd_sm90_det_workspace_size(const dsa_attn_bwd_params *p, size_t *bytes);
DSA_HIDDEN extern int dsa_attn_bwd_det_chunk_tokens;
/* The sm_90a kernels' fp32 dKV accumulator layout in the non-deterministic mode (the deterministic
 * mode always uses layout 0): 0 = real column order (today's; red.global.add.v2.f32 in the 64-head
 * kernel, v4 after one lane-pair shfl in the small-H kernel: 32 contiguous bytes of a row per quad per
 * instruction), 1 = permuted "fake-column" order inside every aligned 16-column group, so that the 4
 * lanes of a quad write 64 contiguous bytes of a row with one red.global.add.v4.f32 each (docs/
 * bwd-sm90-next.md P1); the convert pass un-permutes. 2 = layout 1's memory order, written by the
 * 64-head kernel in 128-B row segments per warp instruction (quads q and q ^ 1 swap the 16-column
 * group they do not write; the small-H kernel runs 2 as 1). Other values mean 0. Default 2
 * (src/attn_bwd.c); tests and benchmarks set it. */
DSA_HIDDEN extern int dsa_attn_bwd_dkv_layout;
/* Layout 1's permutation, one formula for host and device (a bijection of [16 g, 16 g + 16) onto
 * itself for every g, so of [0, D) for any D that is a multiple of 16: 576 and 512). Within a group,
 * real column c = 8 h + 2 q + e (h, e in {0, 1}, q in 0..3; bits c3 | c2 c1 | c0) lives in slot
 * 4 q + 2 h + e (bits c2 c1 | c3 | c0): a rotation of bits 1..3. Why: in the wgmma m64nNk16
 * accumulator fragment (hopper-notes 2) lane l of a quad (q = l % 4) holds, of row 16 w + l / 4 (and
 * + 8), the columns 8 j + 2 q + {0, 1} for j = 0 .. N / 8 - 1; for j = 2 g + h these are the 4 real
 * columns 16 g + {2 q, 2 q + 1, 8 + 2 q, 8 + 2 q + 1}, i.e. slots 16 g + 4 q + {0, 1, 2, 3}: one 16-B
 * vector per lane, and the quad's 4 vectors are slots 16 g .. 16 g + 15 = 64 contiguous bytes.
 * Worked example, q = 1, g = 2 (columns 32..47 of a 64-column block): the lane holds real columns
 * 34, 35 (j = 4) and 42, 43 (j = 5); slots 32 + 4 + {0, 1, 2, 3} = 36, 37, 38, 39 (so slot 38 holds
 * real column 42). dsa_bwd_dkv_col is the inverse (slot -> real column), checked by the CPU test;
 * the convert pass gathers with dsa_bwd_dkv_slot (dkv[r][c] = acc[r][slot(c)]).
 * Checked by the CPU test bwd_dkv_layout (tests/test_bwd_dkv_layout.c). */
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

/* ---- top-k and indexer launchers (cuda/topk.cu, cuda/indexer.cu; used by src/topk.c and
 * src/indexer.c) ---- */
/* One launch of the radix top-k: row r reads scores[r * scores_stride + off_r + c] for
 * c < L_r = clamp(lengths[r], 0, columns) (lengths NULL: columns) with off_r = starts[r] - start_base
 * (starts NULL: 0), writes its selected columns c + starts[r] ascending then -1 to
 * indices[r * indices_stride + 0..k), and min(L_r, k) to out_lengths[r] when given. scores may be
 * NULL when every row has L_r <= k. No workspace. */
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
DSA_HIDDEN dsa_status dsa_launch_topk(const dsa_context *ctx, const dsa_topk_launch *a,
                                      cudaStream_t stream);
/* 1 (default): rows longer than the key cache take the two-read compaction path when their
 * candidates fit in shared memory; 0: the five-read path (tests run both). cuda/topk.cu */
DSA_HIDDEN extern int dsa_topk_compact_long_rows;
/* Top-k kernel (cuda/topk.cu): 0 = automatic (3 where every row has <= 32768 columns, else 1),
 * 1 = the shared-memory key-cache kernel, 2 = register-resident (1024 threads, one CTA per SM),
 * 3 = registers + shared memory (512 threads, two CTAs per SM); 2 and 3 fall back to 1 for longer
 * rows; 4 = sampled threshold + one filtering read + exact select on the candidates (any row, its
 * own exact fallback; the automatic choice where the device has its shared memory). Tests run each; dsa_bench
 * sets it from DSA_TOPK_VARIANT. */
DSA_HIDDEN extern int dsa_topk_variant;
/* Top-k variant 4's next-row L2 prefetch: 1 whole rows up to 32768 columns, 0 samples only (the
 * default; cuda/topk.cu). */
DSA_HIDDEN extern int dsa_topk_v4_whole_prefetch;
/* Indexer helpers: copies q rows [tokens, heads, 128] (any strides) into a packed
 * [tokens * heads, 128] bf16 matrix; and the head reduction
 * scores[r * scores_ld + c] = sum_h w[r, h] * ReLU(logits[(r * heads + h) * logits_ld + c])
 * for r < rows, c < cols (ReLU keeps NaN; weights fp32 or bf16). */
DSA_HIDDEN dsa_status dsa_launch_indexer_pack_q(const uint16_t *q, int64_t stride_token,
                                                int64_t stride_head, int64_t tokens, int32_t heads,
                                                uint16_t *out, cudaStream_t stream);
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
DSA_HIDDEN dsa_status dsa_launch_indexer_fused(const dsa_context *ctx, const dsa_indexer_fused_args *a,
                                               cudaStream_t stream);
/* The same scoring on sm_90a wgmma (cuda/indexer_sm90.cu): the check says whether it runs on this
 * context (cc 9.0 and enough opt-in shared memory; else DSA_ERROR_UNSUPPORTED with a message), the
 * launcher takes the args of dsa_launch_indexer_fused. dsa_indexer_fused_variant (src/indexer.c)
 * picks the fused kernel: 0 = automatic (the mma.sync kernel for now), 1 = the mma.sync kernel,
 * 2 = the wgmma kernel (declines with DSA_ERROR_UNSUPPORTED before anything is written where the
 * check fails). Tests and benchmarks set it. */
DSA_HIDDEN dsa_status dsa_indexer_fused_sm90_check(const dsa_context *ctx);
DSA_HIDDEN dsa_status dsa_launch_indexer_fused_sm90(const dsa_context *ctx, const dsa_indexer_fused_args *a,
                                                    cudaStream_t stream);
DSA_HIDDEN extern int dsa_indexer_fused_variant;
/* Workspace budgets of the indexer's cuBLAS engine in bytes (scores, logits) and its GEMM key tile;
 * defaults 128 MiB, 64 MiB, 32768 (src/indexer.c). Tests shrink them to force many chunks. */
DSA_HIDDEN extern int64_t dsa_indexer_scores_budget, dsa_indexer_logits_budget, dsa_indexer_key_tile;
DSA_HIDDEN dsa_status dsa_launch_indexer_reduce(int64_t rows, int32_t heads, int64_t cols,
                                                const float *logits, int64_t logits_ld,
                                                const void *weights, int weights_bf16,
                                                int64_t weights_stride, float *scores,
                                                int64_t scores_ld, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* DSA_INTERNAL_H */
