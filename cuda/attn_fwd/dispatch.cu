/*
 * dispatch.cu - the forward's dispatch point: dsa_launch_attn_fwd (src/kernels.h) picks the kernel
 * for the shape and the context's options (include/dsa_tune.h: DSA_OPTION_FWD_KERNEL forces one,
 * DSA_OPTION_FWD_SMALL_AUTO_MAX moves the automatic rule's threshold), falls back where a kernel
 * declines, and sets the KV gather's L2 policy (DSA_OPTION_FWD_KV_L2_HINT) both sm_90a kernels
 * follow. The kernels: the portable kernel (fwd_portable.cu: any arch, any H, D) and the sm_90a
 * tensor-core kernels, the 64-head kernel (fwd_sm90_h64.cu; zero M rows when the head range is not a
 * multiple of 64) and the small-H kernel (fwd_sm90_small.cu, at most 64 heads per launch). The
 * forward needs no workspace.
 *
 * Automatic choice on cc 9.0 (docs/design.md section 8 has the table with the reasons), by the
 * remainder r = H mod 64 and m = DSA_OPTION_FWD_SMALL_AUTO_MAX (default 56):
 *   r = 0          64-head kernel (every M row a real head)
 *   r in 1..m      the 64-head kernel on heads [0, 64 floor(H / 64)) (none when H < 64) + the small-H
 *                  kernel on the r others, N = r rounded up to 8 (at most 7 zero columns): one
 *                  consumer warpgroup up to N = 32, the value-dim split at N = 40..56; two launches
 *                  on the stream (disjoint outputs). No zero head rows, even where the 64-head
 *                  kernel's zero rows are faster (r = 49..56: docs/design.md section 8)
 *   r in m+1..63   64-head kernel on the whole H (64 - r <= 7 zero M rows at m = 56: what rounding N
 *                  up to 8 costs the small-H kernel too)
 * Each kernel declines what it does not run with DSA_ERROR_UNSUPPORTED; the choice then falls back
 * to the 64-head kernel on the whole H, then to the portable kernel.
 */
#include "internal.h"
#include "attn_fwd/fwd_launch.cuh"

extern "C" int dsa_fwd_kv_evict_last(const dsa_context *ctx, const dsa_attn_fwd_params *p) {
  const int64_t hint = ctx->options[DSA_OPTION_FWD_KV_L2_HINT];
  if (hint == DSA_FWD_KV_L2_EVICT_LAST) return 1;
  if (hint != DSA_FWD_KV_L2_IF_FITS) return 0;
  return dsa_fits_half_l2(ctx, (double)p->num_kv * (double)p->kv_stride * 2.0);
}

namespace {

enum { FWD_HEAD_BLOCK = 64 }; /* heads per CTA of the 64-head kernel */

/* DSA_FWD_KERNEL_SM90_SPLIT and the automatic H in 65..127: the first `big` heads on the 64-head
 * kernel, the rest on the small-H kernel. The small launch goes first: if it declines, nothing has
 * been written and the caller can fall back on the whole H. */
dsa_status fwd_split(const dsa_context *ctx, const dsa_attn_fwd_params *r, cudaStream_t stream) {
  const int H = r->num_heads, big = FWD_HEAD_BLOCK * (H / FWD_HEAD_BLOCK);
  if (big < H) DSA_TRY(dsa_fwd_launch_sm90_small(ctx, r, big, H - big, stream));
  if (big > 0) DSA_TRY(dsa_fwd_launch_sm90_h64(ctx, r, 0, big, stream));
  return DSA_SUCCESS;
}

}  // namespace

extern "C" dsa_status dsa_launch_attn_fwd(const dsa_context *ctx, const dsa_attn_fwd_params *r, cudaStream_t stream) {
  const int hopper = ctx->cc_major == 9 && ctx->cc_minor == 0; /* sm_90a code runs on 9.0 only */
  const int64_t kernel = ctx->options[DSA_OPTION_FWD_KERNEL];
  if (kernel == DSA_FWD_KERNEL_PORTABLE) return dsa_fwd_launch_portable(ctx, r, stream);
  if (kernel != DSA_FWD_KERNEL_AUTO && !hopper)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_sparse_attn_fwd: the sm_90a kernels need compute capability 9.0, the "
                    "device has %d.%d", ctx->cc_major, ctx->cc_minor);
  if (kernel == DSA_FWD_KERNEL_SM90_H64) return dsa_fwd_launch_sm90_h64(ctx, r, 0, r->num_heads, stream);
  if (kernel == DSA_FWD_KERNEL_SM90_SMALL) return dsa_fwd_launch_sm90_small(ctx, r, 0, r->num_heads, stream);
  if (kernel == DSA_FWD_KERNEL_SM90_SPLIT) return fwd_split(ctx, r, stream);
  if (hopper) {
    /* The sm_90a kernels decline configurations they do not run with DSA_ERROR_UNSUPPORTED; the
     * call then succeeds on the next one, so its message must not outlive it: keep the thread's
     * previous message and put it back (dsa_declined). */
    dsa_saved_message saved;
    dsa_status s;
    dsa_message_save(&saved);
    const int64_t rem = r->num_heads % FWD_HEAD_BLOCK;
    if (rem != 0 && rem <= ctx->options[DSA_OPTION_FWD_SMALL_AUTO_MAX]) {
      /* H < 64: the small-H kernel alone; 64 < H < 128: the split (no zero M rows either way) */
      s = r->num_heads < FWD_HEAD_BLOCK ? dsa_fwd_launch_sm90_small(ctx, r, 0, r->num_heads, stream)
                                        : fwd_split(ctx, r, stream);
      if (!dsa_declined(s, &saved)) return s;
    }
    s = dsa_fwd_launch_sm90_h64(ctx, r, 0, r->num_heads, stream);
    if (!dsa_declined(s, &saved)) return s;
  }
  return dsa_fwd_launch_portable(ctx, r, stream);
}
