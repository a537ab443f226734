/*
 * dispatch.cu - the indexer-training family's dispatch point (src/kernels.h): the kernel choice of
 * dsa_attn_slot_target, dsa_indexer_slot_scores and dsa_indexer_bwd (dsa_indexer_loss has one kernel
 * sequence: cuda/indexer_train/indexer_loss.cu), and the indexer backward's passes in order with its
 * workspace size. DSA_OPTION_TRAIN_KERNEL (include/dsa_tune.h): AUTO tries each op's sm_90a kernel
 * and falls back to its CUDA-core kernel where it declines; SM90 forces it (its decline is the op's
 * error); PORTABLE runs the CUDA-core kernel. The kernels: cuda/indexer_train/train_launch.cuh.
 */
#include "internal.h"
#include "indexer_train/train_common.cuh"
#include "indexer_train/train_launch.cuh"

namespace {

/* An op with one sm_90a and one CUDA-core kernel: DSA_OPTION_TRAIN_KERNEL's choice between them. */
template <class P>
dsa_status sm90_or_portable(const dsa_context *ctx, const P *p, cudaStream_t stream,
                            dsa_status (*sm90)(const dsa_context *, const P *, cudaStream_t),
                            dsa_status (*portable)(const P *, cudaStream_t)) {
  const int64_t kernel = ctx->options[DSA_OPTION_TRAIN_KERNEL];
  if (kernel == DSA_TRAIN_KERNEL_SM90) return sm90(ctx, p, stream);
  if (kernel == DSA_TRAIN_KERNEL_AUTO) {
    dsa_saved_message saved;
    dsa_message_save(&saved);
    const dsa_status s = sm90(ctx, p, stream);
    if (!dsa_declined(s, &saved)) return s;
  }
  return portable(p, stream);
}

}  // namespace

extern "C" dsa_status dsa_launch_slot_target(const dsa_context *ctx, const dsa_slot_target_params *p,
                                             cudaStream_t stream) {
  return sm90_or_portable(ctx, p, stream, dsa_st_launch_sm90, dsa_st_launch_portable);
}

extern "C" dsa_status dsa_launch_indexer_slot_scores(const dsa_context *ctx, const dsa_indexer_slot_scores_params *p,
                                                     cudaStream_t stream) {
  return sm90_or_portable(ctx, p, stream, dsa_ss_launch_sm90, dsa_ss_launch_portable);
}

extern "C" dsa_status dsa_indexer_bwd_workspace_size(const dsa_indexer_bwd_params *p, size_t *bytes) {
  IbLayout L;
  DSA_TRY(dsa_ib_layout(p, &L));
  *bytes = L.total;
  return DSA_SUCCESS;
}

namespace {

/* The per-token pass (d_index_q, d_weights, and d_index_k's reductions into acc when non-NULL):
 * DSA_OPTION_TRAIN_KERNEL AUTO tries the sm_90a kernel (its accumulator in the permuted layout:
 * *lay1 = 1) and falls back to the CUDA-core kernel where it declines; SM90 forces it; PORTABLE runs
 * the CUDA-core kernel (*lay1 = 0). */
dsa_status token_pass(const dsa_context *ctx, const dsa_indexer_bwd_params *p, float *acc, cudaStream_t stream,
                      int *lay1) {
  const int64_t kernel = ctx->options[DSA_OPTION_TRAIN_KERNEL];
  *lay1 = 0;
  if (kernel == DSA_TRAIN_KERNEL_SM90) {
    DSA_TRY(dsa_ib_launch_sm90(ctx, p, acc, stream));
    *lay1 = 1;
    return DSA_SUCCESS;
  }
  if (kernel == DSA_TRAIN_KERNEL_AUTO) {
    dsa_saved_message saved;
    dsa_message_save(&saved);
    const dsa_status s = dsa_ib_launch_sm90(ctx, p, acc, stream);
    if (!dsa_declined(s, &saved)) {
      *lay1 = s == DSA_SUCCESS;
      return s;
    }
  }
  return dsa_ib_launch_token_portable(p, acc, stream);
}

}  // namespace

/* The passes: the per-token pass (its kernel: token_pass), then d_index_k from the accumulator (the
 * non-deterministic mode; zeros at T = 0) or, deterministic, the sort by key and the per-key pass:
 * from the sort (CUDA cores) or from the sm_90a kernel's slot rows chunk by chunk (that kernel then
 * writes d_index_q and d_weights too, and no per-token pass runs). */
extern "C" dsa_status dsa_launch_indexer_bwd(const dsa_context *ctx, const dsa_indexer_bwd_params *p, void *workspace,
                                             cudaStream_t stream) {
  static const char fn[] = "dsa_indexer_bwd";
  IbLayout L;
  DSA_TRY(dsa_ib_layout(p, &L));
  unsigned char *ws = tr_align_workspace(workspace);
  const int64_t T = p->num_tokens, Tk = p->num_keys;
  float *acc = (!p->deterministic && Tk > 0) ? (float *)(ws + L.acc) : nullptr;
  /* the deterministic d_index_k from the sm_90a kernel's slot rows: SM90 forces it (a decline is the
   * op's error, at the first chunk's launch), AUTO takes it where the kernel's launch checks pass,
   * PORTABLE keeps the CUDA-core pass */
  bool rows_pass = false;
  if (p->deterministic && T > 0 && Tk > 0) {
    const int64_t kernel = ctx->options[DSA_OPTION_TRAIN_KERNEL];
    if (kernel == DSA_TRAIN_KERNEL_SM90) {
      rows_pass = true;
    } else if (kernel == DSA_TRAIN_KERNEL_AUTO) {
      dsa_saved_message saved;
      dsa_message_save(&saved);
      const dsa_status s = dsa_ib_sm90_check(ctx, p);
      if (!dsa_declined(s, &saved)) {
        if (s != DSA_SUCCESS) return s;
        rows_pass = true;
      }
    }
  }
  int lay1 = 0;
  if (T > 0 && !rows_pass) {
    if (acc != nullptr)
      DSA_TRY(dsa_cuda_status((int)cudaMemsetAsync(acc, 0, (size_t)Tk * DSA_INDEX_HEAD_DIM * 4, stream), fn));
    DSA_TRY(token_pass(ctx, p, acc, stream, &lay1));
  }
  if (Tk == 0) return DSA_SUCCESS;
  if (T > 0 && !p->deterministic && lay1) return dsa_ib_launch_convert_lay1(p, acc, stream);
  /* d_index_k from the accumulator, or zeros without tokens */
  if (T == 0 || !p->deterministic) return dsa_ib_launch_convert(p, T > 0 ? acc : nullptr, stream);
  const int32_t *vals = nullptr;
  DSA_TRY(dsa_ib_launch_sort(p, ws, &L, &vals, stream));
  const int64_t *off = (const int64_t *)(ws + L.off);
  if (!rows_pass) return dsa_ib_launch_det(p, off, vals, stream);
  float *rows = (float *)(ws + L.rows), *sums = (float *)(ws + L.acc);
  int64_t *cursor = (int64_t *)(ws + L.cursor);
  for (int64_t t0 = 0; t0 < T; t0 += kIbDetChunkTokens) {
    const int64_t t1 = T - t0 < kIbDetChunkTokens ? T : t0 + kIbDetChunkTokens;
    DSA_TRY(dsa_ib_launch_sm90_rows(ctx, p, rows, t0, t1 - t0, stream));
    DSA_TRY(dsa_ib_launch_rows_reduce(p, off, vals, cursor, rows, sums, t0, t1, stream));
  }
  return DSA_SUCCESS;
}
