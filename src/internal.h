/*
 * internal.h - what the host C files and the CUDA launchers share: the context struct (with its
 * tuning options), error reporting, the argument checks every public op runs (shared by the GPU op
 * and its dsa_ref_ twin), and the kernels' interface (src/kernels.h: one launcher per op of each
 * kernel family; a family's own kernels are private to cuda/<family>/). The part the tests reach too
 * is src/dsa_testing.h, included here. Nothing here is public.
 */
#ifndef DSA_INTERNAL_H
#define DSA_INTERNAL_H

#include <string.h>
#include <cuda_runtime_api.h>
#include "dsa.h"
#include "dsa_tune.h"
#include "dsa_testing.h" /* with src/kernels.h */

#ifdef __cplusplus
extern "C" {
#endif

struct dsa_context {
  int device;
  int cc_major, cc_minor;
  int sm_count;
  int max_smem_optin;  /* bytes of shared memory a block may opt into */
  int l2_bytes;
  void *cublas;        /* cublasHandle_t, created on first use */
  /* a side stream (highest priority, non-blocking) for work that runs beside the call's stream, and
   * its events: the join, and per double-buffered region b, ready[b] (call stream -> side: the
   * region holds what the side stream reads, or is free for it to write; the first one forks the
   * side stream) and done[b] (side -> call stream: the side stream's work on the region finished).
   * Created with the context. User: the deterministic backward's sort-ahead
   * (cuda/attn_bwd/bwd_sm90_ws.cu). */
  cudaStream_t side;
  cudaEvent_t ev_join, ev_ready[2], ev_done[2];
  int64_t options[DSA_OPTION_COUNT]; /* options[opt]: the value of dsa_option opt (src/options.c) */
};
/* Whether an operand of `bytes` fits in half the device's L2, leaving the other half to what streams
 * past it: the forward keeps its KV gathers evict_last then (dsa_fwd_kv_evict_last), the backward
 * sweeps where its accumulator does not fit (cuda/attn_bwd/bwd_sm90_ws.cu). */
static inline int dsa_fits_half_l2(const dsa_context *ctx, double bytes) {
  return bytes <= 0.5 * (double)ctx->l2_bytes;
}
/* Sets every option of ctx to its default (dsa_context_create; src/options.c). */
DSA_HIDDEN void dsa_context_options_init(dsa_context *ctx);
/* The default value of option opt (0 for an id that is not an option): what a call without a
 * context (a size query) uses. */
DSA_HIDDEN int64_t dsa_option_default(int opt);

/* Records a formatted message for dsa_last_error_message() and returns `status`. */
DSA_HIDDEN dsa_status dsa_fail(dsa_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Launch checks the sm_90a kernels share (fn: the op's name for the message); DSA_ERROR_UNSUPPORTED
 * with a message, else DSA_SUCCESS. A device of compute capability 9.0: */
static inline dsa_status dsa_sm90_check_cc(const dsa_context *ctx, const char *fn) {
  if (ctx->cc_major == 9 && ctx->cc_minor == 0) return DSA_SUCCESS;
  return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel needs compute capability 9.0, device has %d.%d", fn,
                  ctx->cc_major, ctx->cc_minor);
}
/* num_tokens * num_hblocks CTAs within a 1-D grid: */
static inline dsa_status dsa_sm90_check_grid(int64_t num_tokens, int num_hblocks, const char *fn) {
  if (num_tokens <= (int64_t)0x7fffffff / num_hblocks) return DSA_SUCCESS;
  return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel handles at most %d tokens, not %lld", fn,
                  0x7fffffff / num_hblocks, (long long)num_tokens);
}
/* Whether every row of a bf16 [T, H, d] tensor (element strides stride_token, stride_head) starts
 * 16-B aligned: the epilogues that write whole 16-B chunks need it. */
static inline int dsa_rows_16b_aligned(const void *base, int64_t stride_token, int64_t stride_head) {
  return !((uintptr_t)base & 15) && !(stride_token & 7) && !(stride_head & 7);
}
/* smem_bytes of shared memory within the device's opt-in limit: */
static inline dsa_status dsa_sm90_check_smem(const dsa_context *ctx, int smem_bytes, const char *fn) {
  if (smem_bytes <= ctx->max_smem_optin) return DSA_SUCCESS;
  return dsa_fail(DSA_ERROR_UNSUPPORTED, "%s: the sm_90a kernel needs %d bytes of shared memory, device has %d", fn,
                  smem_bytes, ctx->max_smem_optin);
}
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
/* Orders stream `to` after everything stream `from` holds now: records ev on `from`, `to` waits for it
 * (the side stream's fork, a double-buffered region handed from one stream to the other). */
DSA_HIDDEN dsa_status dsa_stream_after(cudaEvent_t ev, cudaStream_t from, cudaStream_t to, const char *fn);
/* Joins the context's side stream into `stream` (ev_join) and returns the call's status: st when st is
 * an error (the join runs all the same, since a graph capture must end joined, and st's message is
 * the one kept), else the join's own. Only after this call forked the side stream from `stream`
 * (dsa_stream_after to ctx->side succeeded): under capture, a wait on an ev_join recorded on an
 * unforked side stream is a wait on an event outside the capture. */
DSA_HIDDEN dsa_status dsa_side_join(const dsa_context *ctx, cudaStream_t stream, dsa_status st, const char *fn);
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

/* The slot target's params for the inputs of a validated, stride-resolved backward call whose
 * slot_target is non-NULL (the backward's optional output; cuda/attn_bwd/dispatch.cu, src/reference.c). */
static inline dsa_slot_target_params dsa_slot_target_of_bwd(const dsa_attn_bwd_params *p) {
  dsa_slot_target_params s;
  memset(&s, 0, sizeof s);
  s.num_tokens = p->num_tokens;
  s.num_heads = p->num_heads;
  s.head_dim = p->head_dim;
  s.num_kv = p->num_kv;
  s.topk = p->topk;
  s.softmax_scale = p->softmax_scale;
  s.q = p->q;
  s.q_stride_token = p->q_stride_token;
  s.q_stride_head = p->q_stride_head;
  s.kv = p->kv;
  s.kv_stride = p->kv_stride;
  s.indices = p->indices;
  s.indices_stride = p->indices_stride;
  s.topk_length = p->topk_length;
  s.sink = p->sink;
  s.lse = p->lse;
  s.target = p->slot_target;
  s.target_stride = p->slot_target_stride;
  return s;
}

#ifdef __cplusplus
}
#endif
#endif /* DSA_INTERNAL_H */
