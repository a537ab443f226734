/* attn_fwd.c - public entry point dsa_sparse_attn_fwd: validation, then dispatch between the
 * sm_90a tensor-core kernels (cuda/attn_fwd_sm90.cu: 64 heads on the wgmma M; cuda/attn_fwd_sm90_small.cu:
 * up to 64 heads on the wgmma N) and the portable kernel (cuda/attn_fwd.cu). */
#include <string.h>
#include "internal.h"

/* 0 = automatic, 1 = portable kernel only, 2 = 64-head sm_90a kernel only (whole H, zero M rows
 * allowed), 3 = sm_90a small-H kernel only (H <= 64), 4 = the split forced: 64-head kernel on heads
 * [0, 64 floor(H / 64)), small-H kernel on the rest (tests and benchmarks). */
int dsa_attn_fwd_variant = 0;
/* The small-H kernel's two-consumer shape for N = 40..64 (src/internal.h): 1 value-dim split, 0 column split. */
int dsa_attn_fwd_small_split = 1;
/* The KV gather's L2 policy (src/internal.h). 1 (evict_last always): session 5 run 10, same run, two
 * rounds each, against 0: fwd-v32-8k +0.7%, -32k +1.0%, -128k +1.8% (the KV does not even fit the L2
 * there), glm-4k / cp8 +0.5%, tp-h8 +2.9%, tp-h16 +0.5%, tp-h32 / h48 +0.1%: never slower. */
int dsa_attn_fwd_kv_l2_hint = 1;

int dsa_fwd_kv_evict_last(const dsa_context *ctx, const dsa_attn_fwd_params *p) {
  if (dsa_attn_fwd_kv_l2_hint == 1) return 1;
  if (dsa_attn_fwd_kv_l2_hint != 2) return 0;
  const double kv_bytes = (double)p->num_kv * (double)p->kv_stride * 2.0;
  return kv_bytes <= 0.5 * (double)ctx->l2_bytes;
}
/* The 64-head sm_90a kernel's consumer schedule (src/internal.h): 0 serial, 1 overlapped, 2 S(n+1)
 * hoisted behind PV(n), 3 tile split between the WGs (cuda/attn_fwd_sm90_v2.cu), 4 = 3 with mbarrier
 * hand-offs. Default 3 since its first H200 run (2026-11-29: fwd-v32-8k 541.7 vs 465.7 TFLOP/s for
 * schedule 0, never slower on the fwd shapes; docs/perf.md). */
int dsa_attn_fwd_sm90_overlap = 3;

/* Automatic choice on cc 9.0 (docs/design.md section 8 has the table with the reasons), by the
 * remainder r = H mod 64:
 *   r = 0          64-head kernel (every M row a real head)
 *   r in 1..56     the 64-head kernel on heads [0, 64 floor(H / 64)) (none when H < 64) + the small-H
 *                  kernel on the r others, N = r rounded up to 8 (at most 7 zero columns): one
 *                  consumer warpgroup up to N = 32, the value-dim split at N = 40..56; two launches
 *                  on the stream (disjoint outputs). Session 7 run 9 (same run): fwd-tp-h40 1.89 vs
 *                  2.01 ms for the 64-head kernel's zero rows, -h48 2.00 vs 2.04, -h56 2.16 vs 2.08:
 *                  at N = 56 the no-zero-head kernel is 4.2% slower, and runs anyway, since issue 4
 *                  asks for no wasted heads (docs/design.md section 8 has the trade; set
 *                  DSA_FWD_SMALL_AUTO_MAX (src/internal.h) to 48 for the faster zero rows at
 *                  r = 49..56)
 *   r in 57..63    64-head kernel on the whole H (64 - r <= 7 zero M rows: what rounding N up to 8
 *                  costs the small-H kernel too, and faster); variants 3 / 4 run the small-H one
 * Each kernel declines what it does not run with DSA_ERROR_UNSUPPORTED; the choice then falls back
 * to the 64-head kernel on the whole H, then to the portable kernel. */
enum {
  FWD_HEAD_BLOCK = 64,                       /* heads per CTA of the 64-head kernel */
  FWD_SMALL_AUTO_MAX = DSA_FWD_SMALL_AUTO_MAX /* largest remainder the automatic choice gives the small-H
                                                 kernel (src/internal.h) */
};

/* Variant 4 and the automatic H in 65..127: the first `big` heads on the 64-head kernel, the rest on
 * the small-H kernel. The small launch goes first: if it declines, nothing has been written and the
 * caller can fall back on the whole H. */
static dsa_status fwd_split(const dsa_context *ctx, const dsa_attn_fwd_params *r, cudaStream_t stream) {
  const int H = r->num_heads, big = FWD_HEAD_BLOCK * (H / FWD_HEAD_BLOCK);
  if (big < H) DSA_TRY(dsa_launch_attn_fwd_sm90_small_heads(ctx, r, big, H - big, stream));
  if (big > 0) DSA_TRY(dsa_launch_attn_fwd_sm90_heads(ctx, r, 0, big, stream));
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_sparse_attn_fwd(dsa_context *ctx, const dsa_attn_fwd_params *p,
                                       dsa_stream_t stream) {
  dsa_attn_fwd_params r;
  DSA_TRY(dsa_check_attn_fwd(p, "dsa_sparse_attn_fwd", &r));
  DSA_TRY(dsa_context_enter(ctx, "dsa_sparse_attn_fwd"));
  if (r.num_tokens == 0) return DSA_SUCCESS;

  const int hopper = ctx->cc_major == 9 && ctx->cc_minor == 0; /* sm_90a code runs on 9.0 only */
  if (dsa_attn_fwd_variant == 1) return dsa_launch_attn_fwd_simple(ctx, &r, stream);
  if (dsa_attn_fwd_variant >= 2 && dsa_attn_fwd_variant <= 4 && !hopper)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_sparse_attn_fwd: the sm_90a kernels need compute capability 9.0, the "
                    "device has %d.%d", ctx->cc_major, ctx->cc_minor);
  if (dsa_attn_fwd_variant == 2) return dsa_launch_attn_fwd_sm90(ctx, &r, stream);
  if (dsa_attn_fwd_variant == 3) return dsa_launch_attn_fwd_sm90_small(ctx, &r, stream);
  if (dsa_attn_fwd_variant == 4) return fwd_split(ctx, &r, stream);
  if (hopper) {
    /* The sm_90a kernels decline configurations they do not run with DSA_ERROR_UNSUPPORTED; the
     * call then succeeds on the next one, so its message must not outlive it: keep the thread's
     * previous message and put it back (dsa_declined). */
    dsa_saved_message saved;
    dsa_status s;
    dsa_message_save(&saved);
    if (r.num_heads % FWD_HEAD_BLOCK != 0 && r.num_heads % FWD_HEAD_BLOCK <= FWD_SMALL_AUTO_MAX) {
      /* H < 64: the small-H kernel alone; 64 < H < 128: the split (no zero M rows either way) */
      s = r.num_heads < FWD_HEAD_BLOCK ? dsa_launch_attn_fwd_sm90_small(ctx, &r, stream)
                                       : fwd_split(ctx, &r, stream);
      if (!dsa_declined(s, &saved)) return s;
    }
    s = dsa_launch_attn_fwd_sm90(ctx, &r, stream);
    if (!dsa_declined(s, &saved)) return s;
  }
  return dsa_launch_attn_fwd_simple(ctx, &r, stream);
}
