/*
 * dsa_layer.c - `make run`: one DSA attention layer end to end at the GLM-5 training shape, the way
 * the model calls the library (docs/contract.md section 10): plan the packed batch on the host, upload
 * the plan, indexer top-k, sparse forward with topk_length from the indexer, sparse backward.
 * Each stage is timed (CUDA events after an L2 flush, median of --reps) and reports its rate by the
 * counting rules of docs/perf.md, and a sample of rows is checked against the CPU reference.
 *
 *   (a) packed:  one micro-batch of 4096 tokens in 4 documents (1536, 1024, 900, 636)
 *   (b) cp8:     the last of eight context-parallel ranks of one 32768-token sequence
 *                (query_start 28672, 4096 queries, T_k 32768)
 *   H = 64, H_idx = 32, K = 2048, D = 576, softmax scale 0.0625 (GLM-5), no sink.
 *
 *   dsa_layer [--config packed|cp8|both|small] [--reps N] [--sample N] [--seed S] [--cpu]
 *             [--train-indexer]   (the indexer-training stages after the backward)
 *
 * A stage whose op is not on the GPU yet says so and the layer continues with the CPU reference's
 * output where that is affordable, else with constructed stand-ins (said plainly). Without a GPU
 * (or with --cpu) it runs the CPU reference on a small GLM-shaped problem. Exit status 1 means a
 * GPU result failed its check against the reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_common.h"

#define DIM 576
#define VDIM 512
#define SCALE 0.0625f
#define TOL 1e-2 /* bf16 results: relative error bound of the test suite */

typedef struct layer_cfg {
  const char *name;
  const char *title;
  int num_docs;
  int32_t docs[8];
  int64_t query_start, num_queries;
  int32_t heads, idx_heads, topk;
} layer_cfg;

static const layer_cfg cfg_packed = {
    "packed", "one packed micro-batch of 4096 tokens in 4 documents (1536, 1024, 900, 636)", 4,
    {1536, 1024, 900, 636}, 0, 4096, 64, 32, 2048};
static const layer_cfg cfg_cp8 = {
    "cp8", "context parallel: last of 8 ranks of one 32768-token sequence (queries 28672..32767)", 1,
    {32768}, 28672, 4096, 64, 32, 2048};
/* --config small: the same stages at a size where a quick GPU sanity run (or a CPU emulation of
 * the harness) finishes in seconds; K is below the longest document so the indexer must score. */
static const layer_cfg cfg_small = {
    "small", "small packed batch: 1250 tokens in 3 documents (700, 300, 250), H=16, H_idx=8, K=256", 3,
    {700, 300, 250}, 0, 1250, 16, 8, 256};
static const layer_cfg cfg_small_cp = {
    "small-cp", "small context parallel: last of 4 ranks of one 2048-token sequence, H=16, H_idx=8, K=256", 1,
    {2048}, 1536, 512, 16, 8, 256};

/* Sizes of the configuration being run (set by run_gpu_layer). */
static int32_t H_ATTN = 64, H_IDX = 32, TOPK = 2048;

static int failed_checks, passed_checks;

/* ---- small host helpers ---- */
static const char *verdict(double err, double tol) {
  if (!(err <= tol)) {
    ++failed_checks;
    return "CHECK FAILED";
  }
  ++passed_checks;
  return "ok";
}

static void stage_line(const char *stage, double ms, double flops, double gemm_tflops) {
  printf("  %-22s %9.3f ms", stage, ms);
  if (flops > 0) {
    double tf = flops / (ms * 1e-3) / 1e12;
    printf("  %7.1f TFLOP/s", tf);
    if (isfinite(gemm_tflops) && gemm_tflops > 0) printf(" (%4.1f%% of GEMM)", 100.0 * tf / gemm_tflops);
  }
  printf("\n");
}

static void not_on_gpu(const char *stage, dsa_status st) {
  const char *msg = dsa_last_error_message();
  if (st == DSA_ERROR_UNSUPPORTED)
    printf("  %-22s not on the GPU yet%s%s%s\n", stage, *msg ? " (" : "", msg, *msg ? ")" : "");
  else
    printf("  %-22s failed: %s: %s\n", stage, dsa_status_string(st), dsa_last_error_message());
}

static dsa_status make_plan(const layer_cfg *c, dsa_plan **plan, int64_t *T_k) {
  int32_t cu[9];
  cu[0] = 0;
  for (int d = 0; d < c->num_docs; ++d) cu[d + 1] = cu[d] + c->docs[d];
  *T_k = cu[c->num_docs];
  dsa_plan_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.cu_seqlens = cu;
  desc.num_seqs = c->num_docs;
  desc.total_key_tokens = *T_k;
  desc.query_start = c->query_start;
  desc.num_queries = c->num_queries;
  return dsa_plan_create(&desc, plan);
}

/* Rows to check: the first, the last, and random valid ones (distinct). */
static int pick_rows(tc_rng *r, const dsa_plan_view *v, int want, int64_t *rows) {
  int n = 0;
  int64_t T = v->num_queries;
  const int64_t cand[2] = {0, T - 1};
  for (int i = 0; i < 2 && n < want; ++i)
    if (v->query_valid[cand[i]] && (n == 0 || rows[0] != cand[i])) rows[n++] = cand[i];
  for (int tries = 0; n < want && tries < 100 * want; ++tries) {
    int64_t t = tc_below(r, T), dup = 0;
    for (int i = 0; i < n; ++i) dup |= rows[i] == t;
    if (!dup && v->query_valid[t]) rows[n++] = t;
  }
  return n;
}

/* ---- indexer check: is each sampled row's selection a top-K of the reference scores? ---- */
typedef struct {
  double score;
  int32_t col;
} ranked;
static int rank_cmp(const void *pa, const void *pb) {
  const ranked *a = pa, *b = pb;
  if (a->score != b->score) return a->score > b->score ? -1 : 1;
  return (a->col > b->col) - (a->col < b->col);
}

/* Returns 1 if the row is a valid top-K within tol (relative to the row's largest |score|);
 * *exact = 1 if it is exactly the reference's selection (ties by the smaller key). */
static int check_index_row(const dsa_indexer_params *hp, const dsa_plan_view *v, int64_t t,
                           const int32_t *row, int32_t len, int *exact, double *worst_gap) {
  int64_t n = v->causal_lengths[t], s0 = v->starts[t];
  int32_t want = (int32_t)(n < TOPK ? n : TOPK);
  *exact = 0;
  *worst_gap = 0;
  if (len != want) return 0;
  for (int32_t j = 0; j < len; ++j)
    if (row[j] < s0 || row[j] >= s0 + n || (j > 0 && row[j] <= row[j - 1])) return 0;
  for (int32_t j = len; j < TOPK; ++j)
    if (row[j] != -1) return 0;
  if (n <= TOPK) { /* every visible key */
    *exact = 1;
    return 1;
  }
  double *sc = bc_malloc((size_t)n * sizeof(double));
  ranked *rk = bc_malloc((size_t)n * sizeof(ranked));
  unsigned char *sel = calloc((size_t)n, 1);
  if (!sel) bc_die("out of host memory");
  if (dsa_ref_indexer_scores(hp, t, sc) != DSA_SUCCESS)
    bc_die("dsa_ref_indexer_scores: %s", dsa_last_error_message());
  double amax = 0, min_sel = INFINITY, max_unsel = -INFINITY;
  for (int64_t c = 0; c < n; ++c) {
    rk[c].score = sc[c];
    rk[c].col = (int32_t)c;
    if (fabs(sc[c]) > amax) amax = fabs(sc[c]);
  }
  for (int32_t j = 0; j < len; ++j) sel[row[j] - s0] = 1;
  for (int64_t c = 0; c < n; ++c) {
    if (sel[c] && sc[c] < min_sel) min_sel = sc[c];
    if (!sel[c] && sc[c] > max_unsel) max_unsel = sc[c];
  }
  qsort(rk, (size_t)n, sizeof(ranked), rank_cmp);
  int same = 1;
  for (int32_t j = 0; j < TOPK; ++j) same &= sel[rk[j].col];
  *exact = same;
  double tol = 1e-3 * (amax > 0 ? amax : 1.0);
  *worst_gap = max_unsel - min_sel; /* > 0: a better key was left out by this much */
  int ok = min_sel >= max_unsel - tol;
  free(sc);
  free(rk);
  free(sel);
  return ok;
}

/* ---- the small extra problem that checks dkv (it needs every row) ---- */
/* Params of a GLM-shaped problem (T queries over T keys, causal indices with topk_length, no sink):
 * one fill for host pointers (the reference) and device pointers (the GPU op) alike. */
static dsa_attn_fwd_params layer_fwd_params(int64_t T, int32_t H, int32_t K, const uint16_t *q,
                                            const uint16_t *kv, const int32_t *idx, const int32_t *len,
                                            uint16_t *out, float *lse) {
  dsa_attn_fwd_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = T;
  p.num_heads = H;
  p.head_dim = DIM;
  p.num_kv = T;
  p.topk = K;
  p.softmax_scale = SCALE;
  p.q = q;
  p.kv = kv;
  p.indices = idx;
  p.topk_length = len;
  p.out = out;
  p.lse = lse;
  return p;
}
/* The deterministic backward of the forward problem f (its out and lse are the backward's inputs). */
static dsa_attn_bwd_params layer_bwd_params(const dsa_attn_fwd_params *f, const uint16_t *dout,
                                            uint16_t *dq, uint16_t *dkv) {
  dsa_attn_bwd_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = f->num_tokens;
  p.num_heads = f->num_heads;
  p.head_dim = f->head_dim;
  p.num_kv = f->num_kv;
  p.topk = f->topk;
  p.softmax_scale = f->softmax_scale;
  p.deterministic = 1;
  p.q = f->q;
  p.kv = f->kv;
  p.indices = f->indices;
  p.topk_length = f->topk_length;
  p.out = f->out;
  p.dout = dout;
  p.lse = f->lse;
  p.dq = dq;
  p.dkv = dkv;
  return p;
}

static void check_dkv_small(dsa_context *ctx, tc_rng *rng, cudaStream_t stream) {
  const int32_t docs[2] = {180, 123};
  const int64_t T = 303;
  const int32_t H = 16, K = 128;
  size_t nq = (size_t)T * H * DIM, nkv = (size_t)T * DIM, no = (size_t)T * H * VDIM, nl = (size_t)T * H;
  uint16_t *q = bc_malloc(nq * 2), *kv = bc_malloc(nkv * 2), *out = bc_malloc(no * 2), *dout = bc_malloc(no * 2);
  uint16_t *dq_ref = bc_malloc(nq * 2), *dkv_ref = bc_malloc(nkv * 2), *dq = bc_malloc(nq * 2), *dkv = bc_malloc(nkv * 2);
  float *lse = bc_malloc(nl * 4);
  int32_t *idx = bc_malloc((size_t)T * K * 4), *len = bc_malloc((size_t)T * 4);
  bc_fill_bf16_host(rng, q, nq, -1, 1);
  bc_fill_bf16_host(rng, kv, nkv, -1, 1);
  bc_fill_bf16_host(rng, dout, no, -1, 1);
  int64_t t = 0;
  for (int d = 0, start = 0; d < 2; start += docs[d], ++d)
    for (int64_t i = 0; i < docs[d]; ++i, ++t) {
      bc_causal_row(rng, idx + t * K, K, start, i + 1);
      len[t] = (int32_t)(i + 1 < K ? i + 1 : K);
    }
  dsa_attn_fwd_params fp = layer_fwd_params(T, H, K, q, kv, idx, len, out, lse);
  if (dsa_ref_sparse_attn_fwd(&fp) != DSA_SUCCESS) bc_die("dsa_ref_sparse_attn_fwd: %s", dsa_last_error_message());
  dsa_attn_bwd_params bp = layer_bwd_params(&fp, dout, dq_ref, dkv_ref);
  if (dsa_ref_sparse_attn_bwd(&bp) != DSA_SUCCESS) bc_die("dsa_ref_sparse_attn_bwd: %s", dsa_last_error_message());

  /* The same on the GPU. */
  void *d_q = bc_dmalloc(nq * 2), *d_kv = bc_dmalloc(nkv * 2), *d_out = bc_dmalloc(no * 2), *d_dout = bc_dmalloc(no * 2);
  void *d_dq = bc_dmalloc(nq * 2), *d_dkv = bc_dmalloc(nkv * 2), *d_lse = bc_dmalloc(nl * 4);
  void *d_idx = bc_dmalloc((size_t)T * K * 4), *d_len = bc_dmalloc((size_t)T * 4), *ws = NULL;
  BC_CUDA(cudaMemcpy(d_q, q, nq * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_kv, kv, nkv * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_out, out, no * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_dout, dout, no * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_lse, lse, nl * 4, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_idx, idx, (size_t)T * K * 4, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_len, len, (size_t)T * 4, cudaMemcpyHostToDevice));
  dsa_attn_fwd_params dfp = layer_fwd_params(T, H, K, d_q, d_kv, d_idx, d_len, d_out, d_lse);
  bp = layer_bwd_params(&dfp, d_dout, d_dq, d_dkv);
  size_t ws_bytes = 0;
  dsa_status st = dsa_sparse_attn_bwd(ctx, &bp, NULL, &ws_bytes, stream);
  if (st == DSA_SUCCESS) {
    ws = bc_dmalloc(ws_bytes);
    st = dsa_sparse_attn_bwd(ctx, &bp, ws, &ws_bytes, stream);
  }
  if (st == DSA_SUCCESS) {
    BC_CUDA(cudaStreamSynchronize(stream));
    BC_CUDA(cudaMemcpy(dq, d_dq, nq * 2, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(dkv, d_dkv, nkv * 2, cudaMemcpyDeviceToHost));
    double e_dq = tc_rel_err_bf16(dq, dq_ref, nq), e_dkv = tc_rel_err_bf16(dkv, dkv_ref, nkv);
    printf("  %-22s small problem (T=303 in 2 documents, H=16, K=128, every row): "
           "dq rel err %.2e %s, dkv rel err %.2e %s\n",
           "dkv check", e_dq, verdict(e_dq, TOL), e_dkv, verdict(e_dkv, TOL));
  } else {
    not_on_gpu("dkv check", st);
  }
  cudaFree(d_q); cudaFree(d_kv); cudaFree(d_out); cudaFree(d_dout); cudaFree(d_dq); cudaFree(d_dkv);
  cudaFree(d_lse); cudaFree(d_idx); cudaFree(d_len); cudaFree(ws);
  free(q); free(kv); free(out); free(dout); free(dq_ref); free(dkv_ref); free(dq); free(dkv);
  free(lse); free(idx); free(len);
}

/* ---- op wrappers for the timer ---- */
typedef struct {
  dsa_context *ctx;
  const dsa_plan *plan;
  void *buf;
  size_t bytes;
  dsa_plan_view view;
} upload_arg;
static dsa_status upload_run(void *a, cudaStream_t s) {
  upload_arg *u = a;
  return dsa_plan_upload(u->ctx, u->plan, u->buf, &u->bytes, &u->view, s);
}
typedef struct {
  dsa_context *ctx;
  dsa_indexer_params p;
  void *ws;
  size_t ws_bytes;
} idx_arg;
static dsa_status idx_run(void *a, cudaStream_t s) {
  idx_arg *x = a;
  return dsa_indexer_topk(x->ctx, &x->p, x->ws, &x->ws_bytes, s);
}
typedef struct {
  dsa_context *ctx;
  dsa_attn_fwd_params p;
} fwd_arg;
static dsa_status fwd_run(void *a, cudaStream_t s) {
  fwd_arg *x = a;
  return dsa_sparse_attn_fwd(x->ctx, &x->p, s);
}
typedef struct {
  dsa_context *ctx;
  dsa_attn_bwd_params p;
  void *ws;
  size_t ws_bytes;
} bwd_arg;
static dsa_status bwd_run(void *a, cudaStream_t s) {
  bwd_arg *x = a;
  return dsa_sparse_attn_bwd(x->ctx, &x->p, x->ws, &x->ws_bytes, s);
}

/* ---------------------------------------------------------------------------------------------
 * The layer on the GPU
 * ------------------------------------------------------------------------------------------- */
/* --train-indexer: the indexer-training stages after the backward (docs/indexer-training.md): the
 * slot target from the forward's lse, the indexer's slot scores, the KL loss and its score gradient,
 * and the indexer backward in both modes. Sampled rows are checked against the references (the
 * target, the scores, d_index_q and d_weights of a row need only that row); the loss and g over every
 * row against the reference run on the device's target and scores; d_index_k for bitwise
 * reproducibility in the deterministic mode. */
static int train_indexer;

static void run_train_stages(dsa_context *ctx, bc_timer *tm, int64_t T, int64_t T_k, const uint16_t *d_q,
                             const uint16_t *d_kv, const float *d_lse, const uint16_t *d_iq, const uint16_t *d_ik,
                             const float *d_w, const int32_t *d_idx, const int32_t *d_len, const uint16_t *h_kv,
                             const uint16_t *h_iq, const uint16_t *h_ik, const float *h_w, const int32_t *h_idx,
                             const int32_t *h_len, const int64_t *rows, int nrows) {
  cudaStream_t stream = tm->stream;
  const size_t n_s = (size_t)T * TOPK;
  float *d_a = bc_dmalloc(n_s * 4), *d_z = bc_dmalloc(n_s * 4), *d_g = bc_dmalloc(n_s * 4);
  float *d_loss = bc_dmalloc(4), *d_dw = bc_dmalloc((size_t)T * H_IDX * 4);
  uint16_t *d_diq = bc_dmalloc((size_t)T * H_IDX * 128 * 2), *d_dik = bc_dmalloc((size_t)T_k * 128 * 2);
  bc_train_arg ta;
  memset(&ta, 0, sizeof ta);
  ta.ctx = ctx;
  double ms = NAN, slots = 0;
  for (int64_t t = 0; t < T; ++t) slots += h_len[t];

  /* 6. slot target: the forward's P summed over the heads */
  dsa_slot_target_params *sp = &ta.st;
  sp->num_tokens = T;
  sp->num_heads = H_ATTN;
  sp->head_dim = DIM;
  sp->num_kv = T_k;
  sp->topk = TOPK;
  sp->softmax_scale = SCALE;
  sp->q = d_q;
  sp->kv = d_kv;
  sp->indices = d_idx;
  sp->topk_length = d_len;
  sp->lse = d_lse;
  sp->target = d_a;
  const dsa_status st1 = bc_time_op(tm, bc_slot_target_run, &ta, &ms);
  if (st1 != DSA_SUCCESS) not_on_gpu("slot target", st1);
  else stage_line("slot target", ms, 2.0 * H_ATTN * slots * DIM, NAN);

  /* 7. the indexer's scores at the slots */
  dsa_indexer_slot_scores_params *cp = &ta.sc;
  cp->num_tokens = T;
  cp->num_keys = T_k;
  cp->num_heads = H_IDX;
  cp->topk = TOPK;
  cp->index_q = d_iq;
  cp->index_k = d_ik;
  cp->weights = d_w;
  cp->weights_dtype = DSA_DTYPE_F32;
  cp->indices = d_idx;
  cp->lengths = d_len;
  cp->scores = d_z;
  const dsa_status st2 = bc_time_op(tm, bc_slot_scores_run, &ta, &ms);
  if (st2 != DSA_SUCCESS) not_on_gpu("indexer slot scores", st2);
  else stage_line("indexer slot scores", ms, bc_flops_idx(slots, H_IDX), NAN);

  /* 8. loss and score gradient */
  dsa_indexer_loss_params *lp = &ta.ls;
  lp->num_tokens = T;
  lp->topk = TOPK;
  lp->num_keys = T_k;
  lp->indices = d_idx;
  lp->lengths = d_len;
  lp->target = d_a;
  lp->scores = d_z;
  lp->coeff = 1.0f;
  lp->loss = d_loss;
  lp->grad = d_g;
  dsa_status st3 = DSA_ERROR_UNSUPPORTED;
  if (st1 == DSA_SUCCESS && st2 == DSA_SUCCESS) {
    st3 = dsa_indexer_loss(ctx, lp, NULL, &ta.ws_bytes, stream);
    if (st3 == DSA_SUCCESS) {
      ta.ws = bc_dmalloc(ta.ws_bytes);
      st3 = bc_time_op(tm, bc_indexer_loss_run, &ta, &ms);
      cudaFree(ta.ws);
      ta.ws = NULL;
    }
    if (st3 != DSA_SUCCESS) not_on_gpu("indexer KL loss", st3);
    else stage_line("indexer KL loss", ms, 0, NAN);
  }

  /* 9. indexer backward: atomic, then deterministic d_index_k */
  dsa_status st4 = DSA_ERROR_UNSUPPORTED;
  for (int det = 0; det <= 1 && st3 == DSA_SUCCESS; ++det) {
    dsa_indexer_bwd_params *bp = &ta.bw;
    const char *stage = det ? "indexer backward (det)" : "indexer backward";
    memset(bp, 0, sizeof *bp);
    bp->num_tokens = T;
    bp->num_keys = T_k;
    bp->num_heads = H_IDX;
    bp->topk = TOPK;
    bp->deterministic = det;
    bp->index_q = d_iq;
    bp->index_k = d_ik;
    bp->weights = d_w;
    bp->weights_dtype = DSA_DTYPE_F32;
    bp->indices = d_idx;
    bp->lengths = d_len;
    bp->grad = d_g;
    bp->d_index_q = d_diq;
    bp->d_weights = d_dw;
    bp->d_index_k = d_dik;
    st4 = dsa_indexer_bwd(ctx, bp, NULL, &ta.ws_bytes, stream);
    if (st4 == DSA_SUCCESS) {
      ta.ws = bc_dmalloc(ta.ws_bytes);
      st4 = bc_time_op(tm, bc_indexer_bwd_run, &ta, &ms);
    }
    if (st4 != DSA_SUCCESS) {
      not_on_gpu(stage, st4);
      cudaFree(ta.ws);
      ta.ws = NULL;
      break;
    }
    stage_line(stage, ms, 2.0 * bc_flops_idx(slots, H_IDX), NAN);
    if (det) {
      const size_t n_k = (size_t)T_k * 128;
      uint16_t *a = bc_malloc(n_k * 2), *b = bc_malloc(n_k * 2);
      BC_CUDA(cudaMemcpy(a, d_dik, n_k * 2, cudaMemcpyDeviceToHost));
      const dsa_status again = bc_indexer_bwd_run(&ta, stream);
      BC_CUDA(cudaStreamSynchronize(stream));
      BC_CUDA(cudaMemcpy(b, d_dik, n_k * 2, cudaMemcpyDeviceToHost));
      const int same = again == DSA_SUCCESS && memcmp(a, b, n_k * 2) == 0;
      if (same) ++passed_checks;
      else ++failed_checks;
      printf("  %-22s d_index_k bitwise identical run to run: %s\n", "", same ? "yes" : "NO (CHECK FAILED)");
      free(a);
      free(b);
    }
    cudaFree(ta.ws);
    ta.ws = NULL;
  }

  /* the loss and g against the reference on the device's target and scores; sampled rows */
  if (st3 == DSA_SUCCESS) {
    float *h_a = bc_malloc(n_s * 4), *h_z = bc_malloc(n_s * 4), *h_g = bc_malloc(n_s * 4), *r_g = bc_malloc(n_s * 4);
    float loss = NAN, rloss = NAN;
    BC_CUDA(cudaMemcpy(h_a, d_a, n_s * 4, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(h_z, d_z, n_s * 4, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(h_g, d_g, n_s * 4, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(&loss, d_loss, 4, cudaMemcpyDeviceToHost));
    dsa_indexer_loss_params rl = *lp;
    rl.indices = h_idx;
    rl.lengths = h_len;
    rl.target = h_a;
    rl.scores = h_z;
    rl.loss = &rloss;
    rl.grad = r_g;
    if (dsa_ref_indexer_loss(&rl) != DSA_SUCCESS) bc_die("dsa_ref_indexer_loss: %s", dsa_last_error_message());
    const double e_loss = fabs((double)loss - rloss) / fmax(fabs((double)rloss), 1e-30);
    const double e_g = tc_max_rel_err_f32(h_g, r_g, n_s);
    uint16_t *h_q = bc_malloc((size_t)H_ATTN * DIM * 2), *r_dq = bc_malloc((size_t)H_IDX * 128 * 2);
    uint16_t *g_dq = bc_malloc((size_t)H_IDX * 128 * 2), *r_dk = bc_malloc((size_t)T_k * 128 * 2);
    float *h_lse = bc_malloc((size_t)H_ATTN * 4), *r_a = bc_malloc((size_t)TOPK * 4), *r_z = bc_malloc((size_t)TOPK * 4);
    float *r_dw = bc_malloc((size_t)H_IDX * 4), *g_dw = bc_malloc((size_t)H_IDX * 4);
    double e_a = 0, e_z = 0, e_dq = 0, e_dw = 0;
    for (int i = 0; i < nrows; ++i) {
      const int64_t t = rows[i];
      BC_CUDA(cudaMemcpy(h_q, d_q + t * H_ATTN * DIM, (size_t)H_ATTN * DIM * 2, cudaMemcpyDeviceToHost));
      BC_CUDA(cudaMemcpy(h_lse, d_lse + t * H_ATTN, (size_t)H_ATTN * 4, cudaMemcpyDeviceToHost));
      dsa_slot_target_params rs = *sp;
      rs.num_tokens = 1;
      rs.q = h_q;
      rs.kv = h_kv;
      rs.indices = h_idx + t * TOPK;
      rs.topk_length = h_len + t;
      rs.lse = h_lse;
      rs.target = r_a;
      if (dsa_ref_attn_slot_target(&rs) != DSA_SUCCESS) bc_die("dsa_ref_attn_slot_target: %s", dsa_last_error_message());
      e_a = fmax(e_a, tc_max_rel_err_f32(h_a + t * TOPK, r_a, TOPK));
      dsa_indexer_slot_scores_params rc = *cp;
      rc.num_tokens = 1;
      rc.index_q = h_iq + t * H_IDX * 128;
      rc.index_k = h_ik;
      rc.weights = h_w + t * H_IDX;
      rc.indices = h_idx + t * TOPK;
      rc.lengths = h_len + t;
      rc.scores = r_z;
      if (dsa_ref_indexer_slot_scores(&rc) != DSA_SUCCESS) bc_die("dsa_ref_indexer_slot_scores: %s", dsa_last_error_message());
      e_z = fmax(e_z, tc_max_rel_err_f32(h_z + t * TOPK, r_z, TOPK));
      if (st4 == DSA_SUCCESS) {
        /* the row's d_index_q and d_weights from the device's g of that row */
        dsa_indexer_bwd_params rb = ta.bw;
        rb.num_tokens = 1;
        rb.deterministic = 0;
        rb.index_q = h_iq + t * H_IDX * 128;
        rb.index_k = h_ik;
        rb.weights = h_w + t * H_IDX;
        rb.indices = h_idx + t * TOPK;
        rb.lengths = h_len + t;
        rb.grad = h_g + t * TOPK;
        rb.d_index_q = r_dq;
        rb.d_weights = r_dw;
        rb.d_index_k = r_dk;
        if (dsa_ref_indexer_bwd(&rb) != DSA_SUCCESS) bc_die("dsa_ref_indexer_bwd: %s", dsa_last_error_message());
        BC_CUDA(cudaMemcpy(g_dq, d_diq + t * H_IDX * 128, (size_t)H_IDX * 128 * 2, cudaMemcpyDeviceToHost));
        BC_CUDA(cudaMemcpy(g_dw, d_dw + t * H_IDX, (size_t)H_IDX * 4, cudaMemcpyDeviceToHost));
        e_dq = fmax(e_dq, tc_rel_err_bf16(g_dq, r_dq, (size_t)H_IDX * 128));
        e_dw = fmax(e_dw, tc_max_rel_err_f32(g_dw, r_dw, (size_t)H_IDX));
      }
    }
    printf("  %-22s loss %.6g (reference on the device's target and scores: %.6g), rel err %.1e %s\n", "",
           (double)loss, (double)rloss, e_loss, verdict(e_loss, 1e-4));
    printf("  %-22s g rel err %.1e %s; %d sampled rows: target %.1e %s, scores %.1e %s", "", e_g,
           verdict(e_g, 1e-4), nrows, e_a, verdict(e_a, 1e-4), e_z, verdict(e_z, 1e-4));
    if (st4 == DSA_SUCCESS)
      printf(", d_index_q %.1e %s, d_weights %.1e %s", e_dq, verdict(e_dq, TOL), e_dw, verdict(e_dw, 1e-4));
    printf("\n");
    free(h_a); free(h_z); free(h_g); free(r_g); free(h_q); free(r_dq); free(g_dq); free(r_dk);
    free(h_lse); free(r_a); free(r_z); free(r_dw); free(g_dw);
  }
  cudaFree(d_a); cudaFree(d_z); cudaFree(d_g); cudaFree(d_loss); cudaFree(d_dw); cudaFree(d_diq); cudaFree(d_dik);
}

static void run_gpu_layer(dsa_context *ctx, bc_timer *tm, const bc_ceilings *ceil, const layer_cfg *c,
                          tc_rng *rng, int sample) {
  cudaStream_t stream = tm->stream;
  H_ATTN = c->heads;
  H_IDX = c->idx_heads;
  TOPK = c->topk;
  printf("\n== DSA layer, %s\n   H=%d H_idx=%d K=%d D=%d scale %g, no sink; %d reps (median), L2 flushed\n",
         c->title, H_ATTN, H_IDX, TOPK, DIM, (double)SCALE, tm->reps);

  /* 1. plan (host) */
  dsa_plan *plan = NULL;
  int64_t T_k = 0;
  double times[16];
  int nt = tm->reps < 16 ? tm->reps : 16;
  dsa_status st = DSA_SUCCESS;
  for (int i = 0; i < nt && st == DSA_SUCCESS; ++i) {
    dsa_plan_destroy(plan);
    plan = NULL;
    double t0 = bc_now_s();
    st = make_plan(c, &plan, &T_k);
    times[i] = (bc_now_s() - t0) * 1e3;
  }
  if (st != DSA_SUCCESS) {
    not_on_gpu("plan (host)", st);
    printf("  the layer stops here: every later stage needs the plan\n");
    return;
  }
  const dsa_plan_view *hv = dsa_plan_host_view(plan);
  const int64_t T = hv->num_queries;
  double pairs = 0, slots_expected = 0;
  for (int64_t t = 0; t < T; ++t) {
    pairs += hv->causal_lengths[t];
    slots_expected += hv->causal_lengths[t] < TOPK ? hv->causal_lengths[t] : TOPK;
  }
  stage_line("plan (host)", bc_median(times, nt), 0, NAN);
  printf("  %-22s %lld queries, %lld segments, %lld valid, max_seqlen_k %d, %.0f visible pairs\n", "",
         (long long)T, (long long)hv->num_segments, (long long)hv->num_valid, hv->max_seqlen_k, pairs);

  /* 2. upload */
  upload_arg up;
  memset(&up, 0, sizeof up);
  up.ctx = ctx;
  up.plan = plan;
  double ms = NAN;
  st = dsa_plan_upload(ctx, plan, NULL, &up.bytes, &up.view, stream);
  if (st == DSA_SUCCESS) {
    up.buf = bc_dmalloc(up.bytes);
    st = bc_time_op(tm, upload_run, &up, &ms);
  }
  if (st != DSA_SUCCESS) {
    not_on_gpu("plan upload", st);
    printf("  the layer stops here: the GPU ops need the uploaded plan\n");
    cudaFree(up.buf);
    dsa_plan_destroy(plan);
    return;
  }
  stage_line("plan upload", ms, 0, NAN);
  printf("  %-22s %zu bytes\n", "", up.bytes);

  int64_t rows[64];
  int nrows = pick_rows(rng, hv, sample < 64 ? sample : 64, rows);

  /* Inputs. q and dout live on the device only (the checks copy back the sampled rows). */
  size_t n_iq = (size_t)T * H_IDX * 128, n_ik = (size_t)T_k * 128, n_w = (size_t)T * H_IDX;
  size_t n_q = (size_t)T * H_ATTN * DIM, n_kv = (size_t)T_k * DIM, n_o = (size_t)T * H_ATTN * VDIM;
  size_t n_l = (size_t)T * H_ATTN, n_i = (size_t)T * TOPK;
  uint16_t *h_iq = bc_malloc(n_iq * 2), *h_ik = bc_malloc(n_ik * 2), *h_kv = bc_malloc(n_kv * 2);
  float *h_w = bc_malloc(n_w * 4);
  int32_t *h_idx = bc_malloc(n_i * 4), *h_len = bc_malloc((size_t)T * 4);
  bc_fill_bf16_host(rng, h_iq, n_iq, -1, 1);
  bc_fill_bf16_host(rng, h_ik, n_ik, -1, 1);
  bc_fill_bf16_host(rng, h_kv, n_kv, -1, 1);
  float ws_scale = (float)(1.0 / sqrt(H_IDX * 128.0));
  bc_fill_f32_host(rng, h_w, n_w, -ws_scale, ws_scale);
  uint16_t *d_iq = bc_dmalloc(n_iq * 2), *d_ik = bc_dmalloc(n_ik * 2), *d_kv = bc_dmalloc(n_kv * 2);
  uint16_t *d_q = bc_dmalloc(n_q * 2), *d_out = bc_dmalloc(n_o * 2), *d_dout = bc_dmalloc(n_o * 2);
  uint16_t *d_dq = bc_dmalloc(n_q * 2), *d_dkv = bc_dmalloc(n_kv * 2);
  float *d_w = bc_dmalloc(n_w * 4), *d_lse = bc_dmalloc(n_l * 4);
  int32_t *d_idx = bc_dmalloc(n_i * 4), *d_len = bc_dmalloc((size_t)T * 4);
  BC_CUDA(cudaMemcpy(d_iq, h_iq, n_iq * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_ik, h_ik, n_ik * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_kv, h_kv, n_kv * 2, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_w, h_w, n_w * 4, cudaMemcpyHostToDevice));
  bc_fill_bf16_device(rng, d_q, n_q, -1, 1);
  bc_fill_bf16_device(rng, d_dout, n_o, -1, 1);

  /* 3. indexer top-k */
  idx_arg ia;
  memset(&ia, 0, sizeof ia);
  ia.ctx = ctx;
  dsa_indexer_params *ip = &ia.p;
  ip->plan = &up.view;
  ip->num_heads = H_IDX;
  ip->topk = TOPK;
  ip->index_q = d_iq;
  ip->index_k = d_ik;
  ip->weights = d_w;
  ip->weights_dtype = DSA_DTYPE_F32;
  ip->indices = d_idx;
  ip->lengths = d_len;
  ip->engine = DSA_INDEXER_ENGINE_DEFAULT;
  dsa_indexer_params hp = *ip; /* host twin for the reference */
  hp.plan = hv;
  hp.index_q = h_iq;
  hp.index_k = h_ik;
  hp.weights = h_w;
  hp.indices = h_idx;
  hp.lengths = h_len;
  st = dsa_indexer_topk(ctx, ip, NULL, &ia.ws_bytes, stream);
  if (st == DSA_SUCCESS) {
    ia.ws = bc_dmalloc(ia.ws_bytes);
    st = bc_time_op(tm, idx_run, &ia, &ms);
  }
  if (st == DSA_SUCCESS) {
    /* every document fits in K keys: every visible key is selected and nothing is scored, so a
     * scoring rate would count work the op rightly skips: none is printed */
    const int select_all = hv->max_seqlen_k <= TOPK;
    stage_line("indexer top-k", ms, select_all ? 0.0 : bc_flops_idx(pairs, H_IDX), ceil->gemm_tflops);
    if (select_all)
      printf("  %-22s select-all: every document fits in K = %d keys, no score is computed\n", "", TOPK);
    BC_CUDA(cudaMemcpy(h_idx, d_idx, n_i * 4, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(h_len, d_len, (size_t)T * 4, cudaMemcpyDeviceToHost));
    int valid = 0, exact = 0;
    double worst = -INFINITY;
    for (int i = 0; i < nrows; ++i) {
      int ex = 0;
      double gap = 0;
      valid += check_index_row(&hp, hv, rows[i], h_idx + rows[i] * TOPK, h_len[rows[i]], &ex, &gap);
      exact += ex;
      if (gap > worst) worst = gap;
    }
    printf("  %-22s workspace %.1f MiB; %d sampled rows: %d/%d a valid top-K of the reference scores "
           "(tol 1e-3 of the row's max |score|), %d/%d exactly the reference's set %s\n",
           "", (double)ia.ws_bytes / (1 << 20), nrows, valid, nrows, exact, nrows,
           valid == nrows ? (++passed_checks, "ok") : (++failed_checks, "CHECK FAILED"));
  } else {
    not_on_gpu("indexer top-k", st);
    /* The reference scores only rows with more than K visible keys: estimate its cost. */
    double macs = 0;
    for (int64_t t = 0; t < T; ++t)
      if (hv->causal_lengths[t] > TOPK) macs += (double)hv->causal_lengths[t] * H_IDX * 128;
    if (macs < 2e10) {
      double t0 = bc_now_s();
      if (dsa_ref_indexer_topk(&hp) != DSA_SUCCESS) bc_die("dsa_ref_indexer_topk: %s", dsa_last_error_message());
      printf("  %-22s the next stages use the CPU reference's indices (%.1f s on the CPU)\n", "",
             bc_now_s() - t0);
    } else {
      for (int64_t t = 0; t < T; ++t) {
        int64_t n = hv->causal_lengths[t];
        bc_causal_row(rng, h_idx + t * TOPK, TOPK, hv->starts[t], n);
        h_len[t] = (int32_t)(n < TOPK ? n : TOPK);
      }
      printf("  %-22s the CPU reference would take too long here (%.0f G multiply-adds): the next stages use\n"
             "  %-22s constructed causal indices (a random ascending K-subset of each row's visible keys)\n",
             "", macs / 1e9, "");
    }
    BC_CUDA(cudaMemcpy(d_idx, h_idx, n_i * 4, cudaMemcpyHostToDevice));
    BC_CUDA(cudaMemcpy(d_len, h_len, (size_t)T * 4, cudaMemcpyHostToDevice));
  }
  double slots = 0;
  for (int64_t t = 0; t < T; ++t) slots += h_len[t];
  if (slots != slots_expected)
    printf("  note: sum(topk_length) = %.0f, expected sum(min(causal_length, K)) = %.0f\n", slots, slots_expected);

  /* 4. sparse forward (topk_length = the indexer's lengths) */
  fwd_arg fa;
  memset(&fa, 0, sizeof fa);
  fa.ctx = ctx;
  dsa_attn_fwd_params *fp = &fa.p;
  fp->num_tokens = T;
  fp->num_heads = H_ATTN;
  fp->head_dim = DIM;
  fp->num_kv = T_k;
  fp->topk = TOPK;
  fp->softmax_scale = SCALE;
  fp->q = d_q;
  fp->kv = d_kv;
  fp->indices = d_idx;
  fp->topk_length = d_len;
  fp->out = d_out;
  fp->lse = d_lse;
  st = bc_time_op(tm, fwd_run, &fa, &ms);
  uint16_t *h_q = bc_malloc((size_t)H_ATTN * DIM * 2), *h_out = bc_malloc((size_t)H_ATTN * VDIM * 2);
  uint16_t *h_dout = bc_malloc((size_t)H_ATTN * VDIM * 2), *r_out = bc_malloc((size_t)H_ATTN * VDIM * 2);
  float *h_lse = bc_malloc((size_t)H_ATTN * 4), *r_lse = bc_malloc((size_t)H_ATTN * 4);
  int fwd_on_gpu = st == DSA_SUCCESS;
  if (fwd_on_gpu) {
    stage_line("sparse forward", ms, bc_flops_fwd(slots, H_ATTN), ceil->gemm_tflops);
    double worst_out = 0, worst_lse = 0;
    for (int i = 0; i < nrows; ++i) {
      int64_t t = rows[i];
      BC_CUDA(cudaMemcpy(h_q, d_q + t * H_ATTN * DIM, (size_t)H_ATTN * DIM * 2, cudaMemcpyDeviceToHost));
      BC_CUDA(cudaMemcpy(h_out, d_out + t * H_ATTN * VDIM, (size_t)H_ATTN * VDIM * 2, cudaMemcpyDeviceToHost));
      BC_CUDA(cudaMemcpy(h_lse, d_lse + t * H_ATTN, (size_t)H_ATTN * 4, cudaMemcpyDeviceToHost));
      dsa_attn_fwd_params rp = *fp;
      rp.num_tokens = 1;
      rp.q = h_q;
      rp.kv = h_kv;
      rp.indices = h_idx + t * TOPK;
      rp.topk_length = h_len + t;
      rp.out = r_out;
      rp.lse = r_lse;
      if (dsa_ref_sparse_attn_fwd(&rp) != DSA_SUCCESS) bc_die("dsa_ref_sparse_attn_fwd: %s", dsa_last_error_message());
      double e = tc_rel_err_bf16(h_out, r_out, (size_t)H_ATTN * VDIM);
      if (!(e <= worst_out)) worst_out = e;
      for (int h = 0; h < H_ATTN; ++h) {
        double d = fabs((double)h_lse[h] - (double)r_lse[h]);
        if (isinf(r_lse[h]) && h_lse[h] == r_lse[h]) d = 0;
        if (!(d <= worst_lse)) worst_lse = d;
      }
    }
    printf("  %-22s %d sampled rows: out rel err (worst row) %.2e %s, lse max abs err %.2e %s\n", "", nrows,
           worst_out, verdict(worst_out, TOL), worst_lse, verdict(worst_lse, 1e-3));
  } else {
    not_on_gpu("sparse forward", st);
    /* A full CPU forward is ~1e12 multiply-adds here: not affordable. Stand-ins that keep the
     * backward's softmax well scaled: lse ~ ln(n) + var(s)/2 (s ~ N(0, 0.5^2) for these inputs). */
    float *lse = bc_malloc(n_l * 4);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H_ATTN; ++h)
        lse[t * H_ATTN + h] = h_len[t] > 0 ? (float)log((double)h_len[t]) + 0.125f : INFINITY;
    BC_CUDA(cudaMemcpy(d_lse, lse, n_l * 4, cudaMemcpyHostToDevice));
    free(lse);
    bc_fill_bf16_device(rng, d_out, n_o, -0.05f, 0.05f);
    printf("  %-22s a CPU forward of this size is not affordable: the backward runs on synthetic out and lse\n"
           "  %-22s (its timing is meaningful; its dq check uses the same synthetic inputs)\n", "", "");
  }

  /* 5. sparse backward (dout random), deterministic mode then the atomic mode */
  int bwd_ran = 0;
  for (int det = 1; det >= 0; --det) {
    bwd_arg ba;
    memset(&ba, 0, sizeof ba);
    ba.ctx = ctx;
    dsa_attn_bwd_params *bp = &ba.p;
    bp->num_tokens = T;
    bp->num_heads = H_ATTN;
    bp->head_dim = DIM;
    bp->num_kv = T_k;
    bp->topk = TOPK;
    bp->softmax_scale = SCALE;
    bp->deterministic = det;
    bp->q = d_q;
    bp->kv = d_kv;
    bp->indices = d_idx;
    bp->topk_length = d_len;
    bp->out = d_out;
    bp->dout = d_dout;
    bp->lse = d_lse;
    bp->dq = d_dq;
    bp->dkv = d_dkv;
    const char *stage = det ? "sparse backward (det)" : "sparse backward";
    st = dsa_sparse_attn_bwd(ctx, bp, NULL, &ba.ws_bytes, stream);
    if (st == DSA_SUCCESS) {
      ba.ws = bc_dmalloc(ba.ws_bytes);
      st = bc_time_op(tm, bwd_run, &ba, &ms);
    }
    if (st != DSA_SUCCESS) {
      not_on_gpu(stage, st);
      cudaFree(ba.ws);
      continue;
    }
    stage_line(stage, ms, bc_flops_bwd(slots, H_ATTN), ceil->gemm_tflops);
    bwd_ran = 1;
    if (det) {
      /* Bitwise stability: dkv of the last timed run against one more run. */
      uint16_t *a = bc_malloc(n_kv * 2), *b = bc_malloc(n_kv * 2);
      BC_CUDA(cudaMemcpy(a, d_dkv, n_kv * 2, cudaMemcpyDeviceToHost));
      dsa_status s2 = bwd_run(&ba, stream);
      BC_CUDA(cudaStreamSynchronize(stream));
      BC_CUDA(cudaMemcpy(b, d_dkv, n_kv * 2, cudaMemcpyDeviceToHost));
      int same = s2 == DSA_SUCCESS && memcmp(a, b, n_kv * 2) == 0;
      if (!same) ++failed_checks;
      else ++passed_checks;
      free(a);
      free(b);
      /* dq of the sampled rows against the reference (dq of a row needs only that row). */
      uint16_t *h_dq = bc_malloc((size_t)H_ATTN * DIM * 2), *r_dq = bc_malloc((size_t)H_ATTN * DIM * 2);
      uint16_t *r_dkv = bc_malloc(n_kv * 2);
      double worst = 0;
      for (int i = 0; i < nrows; ++i) {
        int64_t t = rows[i];
        BC_CUDA(cudaMemcpy(h_q, d_q + t * H_ATTN * DIM, (size_t)H_ATTN * DIM * 2, cudaMemcpyDeviceToHost));
        BC_CUDA(cudaMemcpy(h_out, d_out + t * H_ATTN * VDIM, (size_t)H_ATTN * VDIM * 2, cudaMemcpyDeviceToHost));
        BC_CUDA(cudaMemcpy(h_dout, d_dout + t * H_ATTN * VDIM, (size_t)H_ATTN * VDIM * 2, cudaMemcpyDeviceToHost));
        BC_CUDA(cudaMemcpy(h_lse, d_lse + t * H_ATTN, (size_t)H_ATTN * 4, cudaMemcpyDeviceToHost));
        BC_CUDA(cudaMemcpy(h_dq, d_dq + t * H_ATTN * DIM, (size_t)H_ATTN * DIM * 2, cudaMemcpyDeviceToHost));
        dsa_attn_bwd_params rp = *bp;
        rp.num_tokens = 1;
        rp.q = h_q;
        rp.kv = h_kv;
        rp.indices = h_idx + t * TOPK;
        rp.topk_length = h_len + t;
        rp.out = h_out;
        rp.dout = h_dout;
        rp.lse = h_lse;
        rp.dq = r_dq;
        rp.dkv = r_dkv;
        if (dsa_ref_sparse_attn_bwd(&rp) != DSA_SUCCESS) bc_die("dsa_ref_sparse_attn_bwd: %s", dsa_last_error_message());
        double e = tc_rel_err_bf16(h_dq, r_dq, (size_t)H_ATTN * DIM);
        if (!(e <= worst)) worst = e;
      }
      printf("  %-22s %d sampled rows: dq rel err (worst row) %.2e %s; dkv bitwise identical run to run: %s\n",
             "", nrows, worst, verdict(worst, TOL), same ? "yes" : "NO (CHECK FAILED)");
      free(h_dq);
      free(r_dq);
      free(r_dkv);
    }
    cudaFree(ba.ws);
  }
  if (!fwd_on_gpu && bwd_ran) printf("  %-22s (dq was checked against the reference on the same synthetic out/lse)\n", "");
  if (train_indexer)
    run_train_stages(ctx, tm, T, T_k, d_q, d_kv, d_lse, d_iq, d_ik, d_w, d_idx, d_len, h_kv, h_iq, h_ik, h_w,
                     h_idx, h_len, rows, nrows);

  free(h_q); free(h_out); free(h_dout); free(r_out); free(h_lse); free(r_lse);
  free(h_iq); free(h_ik); free(h_kv); free(h_w); free(h_idx); free(h_len);
  cudaFree(d_iq); cudaFree(d_ik); cudaFree(d_kv); cudaFree(d_q); cudaFree(d_out); cudaFree(d_dout);
  cudaFree(d_dq); cudaFree(d_dkv); cudaFree(d_w); cudaFree(d_lse); cudaFree(d_idx); cudaFree(d_len);
  cudaFree(ia.ws);
  cudaFree(up.buf);
  dsa_plan_destroy(plan);
}

/* ---------------------------------------------------------------------------------------------
 * Without a GPU: the CPU reference on a small GLM-shaped problem
 * ------------------------------------------------------------------------------------------- */
static int run_cpu_small(tc_rng *rng) {
  const int32_t docs[3] = {100, 90, 66};
  const int32_t H = 4, HI = 4, K = 64;
  int32_t cu[4] = {0, docs[0], docs[0] + docs[1], docs[0] + docs[1] + docs[2]};
  const int64_t T = cu[3];
  printf("CPU reference, small GLM-shaped problem: T=%lld in 3 documents (%d, %d, %d), H=%d, H_idx=%d, K=%d, "
         "D=%d, scale %g\n", (long long)T, docs[0], docs[1], docs[2], H, HI, K, DIM, (double)SCALE);
  dsa_plan_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.cu_seqlens = cu;
  desc.num_seqs = 3;
  desc.total_key_tokens = T;
  desc.num_queries = -1;
  dsa_plan *plan = NULL;
  double t0 = bc_now_s();
  dsa_status st = dsa_plan_create(&desc, &plan);
  if (st != DSA_SUCCESS) {
    printf("plan: %s: %s\n", dsa_status_string(st), dsa_last_error_message());
    return 1;
  }
  const dsa_plan_view *v = dsa_plan_host_view(plan);
  printf("  plan                 %8.3f ms  %lld segments, %lld valid queries, max_seqlen_k %d\n",
         (bc_now_s() - t0) * 1e3, (long long)v->num_segments, (long long)v->num_valid, v->max_seqlen_k);

  size_t n_iq = (size_t)T * HI * 128, n_ik = (size_t)T * 128, n_q = (size_t)T * H * DIM, n_kv = (size_t)T * DIM;
  size_t n_o = (size_t)T * H * VDIM;
  uint16_t *iq = bc_malloc(n_iq * 2), *ik = bc_malloc(n_ik * 2), *q = bc_malloc(n_q * 2), *kv = bc_malloc(n_kv * 2);
  uint16_t *out = bc_malloc(n_o * 2), *dout = bc_malloc(n_o * 2), *dq = bc_malloc(n_q * 2), *dkv = bc_malloc(n_kv * 2);
  float *w = bc_malloc((size_t)T * HI * 4), *lse = bc_malloc((size_t)T * H * 4);
  int32_t *idx = bc_malloc((size_t)T * K * 4), *len = bc_malloc((size_t)T * 4);
  bc_fill_bf16_host(rng, iq, n_iq, -1, 1);
  bc_fill_bf16_host(rng, ik, n_ik, -1, 1);
  bc_fill_bf16_host(rng, q, n_q, -1, 1);
  bc_fill_bf16_host(rng, kv, n_kv, -1, 1);
  bc_fill_bf16_host(rng, dout, n_o, -1, 1);
  float ws = (float)(1.0 / sqrt(HI * 128.0));
  bc_fill_f32_host(rng, w, (size_t)T * HI, -ws, ws);

  dsa_indexer_params ip;
  memset(&ip, 0, sizeof ip);
  ip.plan = v;
  ip.num_heads = HI;
  ip.topk = K;
  ip.index_q = iq;
  ip.index_k = ik;
  ip.weights = w;
  ip.weights_dtype = DSA_DTYPE_F32;
  ip.indices = idx;
  ip.lengths = len;
  t0 = bc_now_s();
  st = dsa_ref_indexer_topk(&ip);
  if (st != DSA_SUCCESS) {
    printf("dsa_ref_indexer_topk: %s: %s\n", dsa_status_string(st), dsa_last_error_message());
    return 1;
  }
  int hist[5] = {0};
  double slots = 0;
  for (int64_t t = 0; t < T; ++t) {
    slots += len[t];
    hist[len[t] <= 16 ? 0 : len[t] <= 32 ? 1 : len[t] <= 48 ? 2 : len[t] < K ? 3 : 4]++;
  }
  printf("  indexer top-k (ref)  %8.3f ms  topk_length histogram: 1-16: %d, 17-32: %d, 33-48: %d, 49-%d: %d, "
         "=%d: %d (sum %.0f)\n", (bc_now_s() - t0) * 1e3, hist[0], hist[1], hist[2], K - 1, hist[3], K, hist[4], slots);

  dsa_attn_fwd_params fp = layer_fwd_params(T, H, K, q, kv, idx, len, out, lse);
  t0 = bc_now_s();
  st = dsa_ref_sparse_attn_fwd(&fp);
  if (st != DSA_SUCCESS) {
    printf("dsa_ref_sparse_attn_fwd: %s: %s\n", dsa_status_string(st), dsa_last_error_message());
    return 1;
  }
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < (size_t)T * H; ++i) {
    if (lse[i] < lo) lo = lse[i];
    if (lse[i] > hi) hi = lse[i];
  }
  printf("  sparse forward (ref) %8.3f ms  lse in [%.4f, %.4f], |out| = %.4f\n", (bc_now_s() - t0) * 1e3, lo, hi,
         tc_norm_bf16(out, n_o));

  dsa_attn_bwd_params bp = layer_bwd_params(&fp, dout, dq, dkv);
  t0 = bc_now_s();
  st = dsa_ref_sparse_attn_bwd(&bp);
  if (st != DSA_SUCCESS) {
    printf("dsa_ref_sparse_attn_bwd: %s: %s\n", dsa_status_string(st), dsa_last_error_message());
    return 1;
  }
  printf("  sparse backward (ref)%8.3f ms  |dq| = %.4f, |dkv| = %.4f (|dout| = %.4f)\n", (bc_now_s() - t0) * 1e3,
         tc_norm_bf16(dq, n_q), tc_norm_bf16(dkv, n_kv), tc_norm_bf16(dout, n_o));
  if (train_indexer) {
    /* the indexer-training references on the same problem (docs/indexer-training.md) */
    const size_t n_s = (size_t)T * K;
    float *a = bc_malloc(n_s * 4), *z = bc_malloc(n_s * 4), *g = bc_malloc(n_s * 4), *dw = bc_malloc((size_t)T * HI * 4);
    uint16_t *diq = bc_malloc(n_iq * 2), *dik = bc_malloc(n_ik * 2);
    float loss = NAN;
    dsa_slot_target_params sp = {0};
    sp.num_tokens = T; sp.num_heads = H; sp.head_dim = DIM; sp.num_kv = T; sp.topk = K; sp.softmax_scale = SCALE;
    sp.q = q; sp.kv = kv; sp.indices = idx; sp.topk_length = len; sp.lse = lse; sp.target = a;
    dsa_indexer_slot_scores_params cp = {0};
    cp.num_tokens = T; cp.num_keys = T; cp.num_heads = HI; cp.topk = K; cp.index_q = iq; cp.index_k = ik;
    cp.weights = w; cp.weights_dtype = DSA_DTYPE_F32; cp.indices = idx; cp.lengths = len; cp.scores = z;
    dsa_indexer_loss_params lp = {0};
    lp.num_tokens = T; lp.topk = K; lp.num_keys = T; lp.indices = idx; lp.lengths = len; lp.target = a;
    lp.scores = z; lp.coeff = 1.0f; lp.loss = &loss; lp.grad = g;
    dsa_indexer_bwd_params ib = {0};
    ib.num_tokens = T; ib.num_keys = T; ib.num_heads = HI; ib.topk = K; ib.index_q = iq; ib.index_k = ik;
    ib.weights = w; ib.weights_dtype = DSA_DTYPE_F32; ib.indices = idx; ib.lengths = len; ib.grad = g;
    ib.d_index_q = diq; ib.d_weights = dw; ib.d_index_k = dik;
    t0 = bc_now_s();
    st = dsa_ref_attn_slot_target(&sp);
    if (st == DSA_SUCCESS) st = dsa_ref_indexer_slot_scores(&cp);
    if (st == DSA_SUCCESS) st = dsa_ref_indexer_loss(&lp);
    if (st == DSA_SUCCESS) st = dsa_ref_indexer_bwd(&ib);
    if (st != DSA_SUCCESS) {
      printf("indexer training (ref): %s: %s\n", dsa_status_string(st), dsa_last_error_message());
      return 1;
    }
    double sa = 0;
    for (size_t i = 0; i < n_s; ++i) sa += a[i];
    printf("  indexer training (ref) %8.3f ms  target sum %.4f (H = %d per counted row), KL loss %.6f, "
           "|d_index_q| = %.4f, |d_index_k| = %.4f\n", (bc_now_s() - t0) * 1e3, sa, H, (double)loss,
           tc_norm_bf16(diq, n_iq), tc_norm_bf16(dik, n_ik));
    free(a); free(z); free(g); free(dw); free(diq); free(dik);
  }
  free(iq); free(ik); free(q); free(kv); free(out); free(dout); free(dq); free(dkv);
  free(w); free(lse); free(idx); free(len);
  dsa_plan_destroy(plan);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress survives a crash when the output is a file */
  const char *config = "both";
  int reps = 5, sample = 8, force_cpu = 0;
  uint64_t seed = 0x1a7e5eedull;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--sample") && i + 1 < argc) sample = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--cpu")) force_cpu = 1;
    else if (!strcmp(argv[i], "--train-indexer")) train_indexer = 1;
    else {
      fprintf(stderr, "usage: dsa_layer [--config packed|cp8|both|small] [--reps N] [--sample N] [--seed S] [--cpu]\n"
                      "                 [--train-indexer]\n");
      return 2;
    }
  }
  if (reps < 1 || sample < 1 ||
      (strcmp(config, "both") && strcmp(config, "packed") && strcmp(config, "cp8") && strcmp(config, "small"))) {
    fprintf(stderr, "dsa_layer: --reps and --sample must be >= 1, --config packed, cp8, both or small\n");
    return 2;
  }
  tc_rng rng = {seed};
  printf("libdsa %s end-to-end DSA layer (seed %llu)\n", dsa_version_string(), (unsigned long long)seed);
  if (force_cpu || !tc_have_gpu()) {
    printf(force_cpu ? "--cpu: running the CPU reference at a small size\n"
                     : "no CUDA device: running the CPU reference at a small size\n");
    return run_cpu_small(&rng);
  }
  dsa_context *ctx = NULL;
  dsa_status st = dsa_context_create(&ctx, 0);
  if (st != DSA_SUCCESS) {
    fprintf(stderr, "dsa_context_create: %s: %s\n", dsa_status_string(st), dsa_last_error_message());
    return 1;
  }
  char card[128], commit[64];
  bc_card_name(card, sizeof card, 0);
  bc_commit(commit, sizeof commit);
  bc_timer tm;
  bc_timer_init(&tm, reps);
  bc_ceilings ceil;
  bc_measure_ceilings(&tm, &ceil);
  printf("%s, commit %s; same-run ceilings: cuBLAS bf16 GEMM %.1f TFLOP/s, D2D copy %.1f GB/s\n", card, commit,
         ceil.gemm_tflops, ceil.copy_gbps);
  double t0 = bc_now_s();
  if (!strcmp(config, "small")) {
    run_gpu_layer(ctx, &tm, &ceil, &cfg_small, &rng, sample);
    run_gpu_layer(ctx, &tm, &ceil, &cfg_small_cp, &rng, sample);
  } else {
    if (strcmp(config, "cp8")) run_gpu_layer(ctx, &tm, &ceil, &cfg_packed, &rng, sample);
    if (strcmp(config, "packed")) run_gpu_layer(ctx, &tm, &ceil, &cfg_cp8, &rng, sample);
  }
  printf("\n");
  check_dkv_small(ctx, &rng, tm.stream);
  printf("\ndone in %.1f s: %s\n", bc_now_s() - t0,
         failed_checks   ? "SOME CHECKS FAILED (see above)"
         : passed_checks ? "every GPU result that ran matched the reference"
                         : "no stage ran on a GPU, so nothing was checked");
  bc_timer_free(&tm);
  dsa_context_destroy(ctx);
  return failed_checks ? 1 : 0;
}
