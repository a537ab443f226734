/* test_gpu_indexer.c - dsa_indexer_topk (cuBLAS engine) on the device against dsa_ref_indexer_topk,
 * exact equality of indices and lengths. Exactness on both sides: q and k are small integers
 * (-4..4) in bf16 and the weights multiples of 1/8 in [-1, 1] (fp32 or bf16), so every dot
 * product, product and head sum is exact in fp32 and equals the fp64 reference; the many exact 0
 * after ReLU (and negative weights) make ties that the deterministic rule decides.
 *
 * Both engines run every case, the fused one with each of its kernels (DSA_OPTION_INDEXER_FUSED_KERNEL
 * 1 = mma.sync, 2 = the sm_90a wgmma kernel, which declines off cc 9.0: logged and skipped, a failure
 * with DSA_TEST_REQUIRE_SM90=1). Layouts: docs/contract.md section 4 worked examples A-D, one causal sequence, several documents (one of
 * length 1), padded storage, a context-parallel query range, a padding mask, T_q > 65535 (short
 * documents). H_idx in {1, 12, 20, 32, 40, 64}, K in {1, 7, 64, 100, 2048}, fp32 and bf16 weights, q layouts
 * cuBLAS reads directly and ones that are packed first, the default budgets and shrunken ones
 * (DSA_OPTION_INDEXER_*_BUDGET / _KEY_TILE: many chunks, also across documents and a CP range, key
 * tiles, one-query GEMMs). The reference is slow, so rows that need scoring are sampled;
 * rows that select all their keys are all checked. Also: bitwise reruns, a row alone (a one-query
 * plan) equals the row inside the batch, the workspace contract (stable, >= 1, bounded at idx-32k
 * sizes, a 1-byte offset workspace is accepted), bad arguments (status, nothing written), CUDA graph
 * capture of both engines (one chunk and many). */
#include "test_common.h"

typedef struct {
  dsa_context *ctx;
  cudaStream_t stream;
} ix_env;

static ix_env ix_open(void) {
  ix_env e;
  TC_OK(tc_context_create(&e.ctx));
  TC_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
  return e;
}

static void ix_close(ix_env *e) {
  TC_CUDA(cudaStreamDestroy(e->stream));
  dsa_context_destroy(e->ctx);
}

enum { QL_PLAIN = 0, QL_PADDED = 1, QL_HEAD_MAJOR = 2, QL_TOKEN_GAP = 3 };

typedef struct {
  /* plan */
  const int32_t *cu, *cup;
  int64_t S, Tk, qs, Tq; /* Tq -1: all keys are queries */
  const uint8_t *mask;
  /* op */
  int32_t H, K;
  dsa_dtype wdt;
  int qlayout;
  int sample;            /* scored rows checked (evenly spread, plus the last) */
  const char *what;
} ix_case;

/* 1: data_make gives every 97th key row one inf, -inf or NaN element (nonfinite_keys_padded_heads) */
static int ix_nonfinite;

/* Host inputs and device copies of one case. */
typedef struct {
  dsa_plan *plan;
  const dsa_plan_view *hv;
  dsa_plan_view dv;
  void *dplan;
  int64_t Tq, Tk;
  int64_t qst, qsh, kst, wst, ist;
  uint16_t *q, *k;
  void *w;
  uint16_t *dq, *dk;
  void *dw;
  size_t qn, kn, wn; /* elements */
} ix_data;

static void plan_up(ix_env *e, const dsa_plan_desc *d, ix_data *x) {
  size_t need = 0;
  TC_OK(dsa_plan_create(d, &x->plan));
  x->hv = dsa_plan_host_view(x->plan);
  TC_OK(dsa_plan_upload(e->ctx, x->plan, NULL, &need, NULL, e->stream));
  TC_CUDA(cudaMalloc(&x->dplan, need));
  TC_OK(dsa_plan_upload(e->ctx, x->plan, x->dplan, &need, &x->dv, e->stream));
  TC_CUDA(cudaStreamSynchronize(e->stream));
}

static void desc_of(const ix_case *c, dsa_plan_desc *d) {
  memset(d, 0, sizeof *d);
  d->cu_seqlens = c->cu;
  d->cu_seqlens_padded = c->cup;
  d->num_seqs = c->S;
  d->total_key_tokens = c->Tk;
  d->query_start = c->qs;
  d->num_queries = c->Tq;
  d->padding_mask = c->mask;
}

static void data_make(ix_env *e, tc_rng *r, const ix_case *c, ix_data *x) {
  dsa_plan_desc d;
  const int64_t H = c->H, D = 128;
  memset(x, 0, sizeof *x);
  desc_of(c, &d);
  plan_up(e, &d, x);
  x->Tq = x->hv->num_queries;
  x->Tk = x->hv->total_key_tokens;
  switch (c->qlayout) {
    case QL_PLAIN: x->qst = H * D; x->qsh = D; break;
    case QL_PADDED: x->qst = H * 136; x->qsh = 136; break;           /* plain, ld 136 */
    case QL_HEAD_MAJOR: x->qst = D; x->qsh = x->Tq * D; break;       /* packed first */
    default: x->qst = H * D + 64; x->qsh = D; break;                 /* packed when H > 1 */
  }
  x->kst = c->qlayout == QL_PLAIN ? D : 136;
  x->wst = c->qlayout == QL_PLAIN ? H : H + 3;
  x->ist = c->qlayout == QL_PLAIN ? c->K : c->K + 5;
  x->qn = (size_t)((x->Tq - 1) * x->qst + (H - 1) * x->qsh + D);
  x->kn = (size_t)(x->Tk * x->kst);
  x->wn = (size_t)(x->Tq * x->wst);
  x->q = (uint16_t *)calloc(x->qn, 2);
  x->k = (uint16_t *)calloc(x->kn, 2);
  x->w = malloc(x->wn * 4);
  cr_assert(x->q && x->k && x->w);
  for (int64_t t = 0; t < x->Tq; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i)
        x->q[t * x->qst + h * x->qsh + i] = dsa_f32_to_bf16((float)(tc_below(r, 9) - 4));
  for (int64_t s = 0; s < x->Tk; ++s)
    for (int64_t i = 0; i < D; ++i) x->k[s * x->kst + i] = dsa_f32_to_bf16((float)(tc_below(r, 9) - 4));
  if (ix_nonfinite) {
    static const uint16_t nf[3] = {0x7F80u, 0xFF80u, 0x7FC0u}; /* bf16 +inf, -inf, NaN */
    for (int64_t s = 5; s < x->Tk; s += 97) x->k[s * x->kst + tc_below(r, D)] = nf[s % 3];
  }
  for (size_t i = 0; i < x->wn; ++i) {
    float v = (float)(tc_below(r, 17) - 8) / 8.0f;
    if (c->wdt == DSA_DTYPE_F32) ((float *)x->w)[i] = v;
    else ((uint16_t *)x->w)[i] = dsa_f32_to_bf16(v);
  }
  TC_CUDA(cudaMalloc((void **)&x->dq, x->qn * 2));
  TC_CUDA(cudaMalloc((void **)&x->dk, x->kn * 2 + 16));
  TC_CUDA(cudaMalloc(&x->dw, x->wn * 4));
  TC_CUDA(cudaMemcpy(x->dq, x->q, x->qn * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(x->dk, x->k, x->kn * 2, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(x->dw, x->w, x->wn * 4, cudaMemcpyHostToDevice));
  /* a pageable cudaMemcpy may return before its DMA lands, on the legacy default stream, which the
   * cudaStreamNonBlocking test stream does not wait for */
  TC_CUDA(cudaDeviceSynchronize());
}

static void data_free(ix_data *x) {
  cudaFree(x->dq);
  cudaFree(x->dk);
  cudaFree(x->dw);
  cudaFree(x->dplan);
  free(x->q);
  free(x->k);
  free(x->w);
  dsa_plan_destroy(x->plan);
}

/* Params for the device (dev = 1) or host pointers. */
static dsa_indexer_params params_of(const ix_case *c, const ix_data *x, int dev) {
  dsa_indexer_params p;
  memset(&p, 0, sizeof p);
  p.plan = dev ? &x->dv : x->hv;
  p.num_heads = c->H;
  p.topk = c->K;
  p.index_q = dev ? x->dq : x->q;
  p.q_stride_token = x->qst;
  p.q_stride_head = x->qsh;
  p.index_k = dev ? x->dk : x->k;
  p.k_stride = x->kst;
  p.weights = dev ? x->dw : x->w;
  p.weights_dtype = c->wdt;
  p.weights_stride = x->wst;
  p.indices_stride = x->ist;
  p.engine = DSA_INDEXER_ENGINE_CUBLAS;
  return p;
}

/* The fused kernels (DSA_OPTION_INDEXER_FUSED_KERNEL): 1 mma.sync, 2 sm_90a wgmma. */
enum { FV_MMA = DSA_INDEXER_FUSED_MMA_SYNC, FV_WGMMA = DSA_INDEXER_FUSED_WGMMA };

/* A status of a forced wgmma run: 1 when it declined (not cc 9.0), which is logged, or a failure
 * under DSA_TEST_REQUIRE_SM90=1; 0 to go on. */
static int wgmma_declined(dsa_status st, const char *what) {
  if (st != DSA_ERROR_UNSUPPORTED) return 0;
  if (getenv("DSA_TEST_REQUIRE_SM90") != NULL)
    cr_assert_fail("%s: the sm_90a wgmma indexer kernel declined (it must run): %s", what,
                   dsa_last_error_message());
  cr_log_info("%s: the sm_90a wgmma indexer kernel declined: %s", what, dsa_last_error_message());
  return 1;
}

/* Runs the GPU op with fused kernel `variant` (0: automatic); returns host copies of indices
 * [Tq, ist] and lengths [Tq] (caller frees) and 1, or 0 (outputs NULL) when the forced wgmma kernel
 * declined. ws_offset: byte offset of the workspace inside its allocation (1 tests any alignment). */
static int gpu_run(ix_env *e, const ix_case *c, const ix_data *x, dsa_indexer_engine engine, int variant,
                   size_t ws_offset, int32_t **idx_out, int32_t **len_out) {
  dsa_indexer_params p = params_of(c, x, 1);
  size_t in = (size_t)(x->Tq * x->ist), need = 0, need2 = 0;
  int32_t *di = NULL, *dl = NULL;
  unsigned char *ws = NULL;
  dsa_status st;
  p.engine = engine;
  TC_CUDA(cudaMalloc((void **)&di, in * 4));
  TC_CUDA(cudaMalloc((void **)&dl, (size_t)x->Tq * 4));
  TC_CUDA(cudaMemset(di, 0x5A, in * 4));
  TC_CUDA(cudaMemset(dl, 0x5A, (size_t)x->Tq * 4));
  /* the poison (legacy default stream, asynchronous) must land before the op runs on e->stream
   * (cudaStreamNonBlocking: no implicit ordering with the legacy stream) */
  TC_CUDA(cudaDeviceSynchronize());
  p.indices = di;
  p.lengths = dl;
  TC_SET_OPTION(e->ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, variant);
  st = dsa_indexer_topk(e->ctx, &p, NULL, &need, e->stream);
  if (variant == FV_WGMMA && engine != DSA_INDEXER_ENGINE_CUBLAS && wgmma_declined(st, c->what)) {
    TC_SET_OPTION(e->ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, DSA_INDEXER_FUSED_AUTO);
    cudaFree(di);
    cudaFree(dl);
    *idx_out = *len_out = NULL;
    return 0;
  }
  TC_OK(st);
  TC_OK(dsa_indexer_topk(e->ctx, &p, NULL, &need2, e->stream));
  cr_assert(need >= 1 && need == need2, "workspace size %zu then %zu", need, need2);
  TC_CUDA(cudaMalloc((void **)&ws, need + ws_offset));
  TC_OK(dsa_indexer_topk(e->ctx, &p, ws + ws_offset, &need, e->stream));
  TC_SET_OPTION(e->ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, DSA_INDEXER_FUSED_AUTO);
  TC_CUDA(cudaStreamSynchronize(e->stream));
  *idx_out = (int32_t *)malloc(in * 4);
  *len_out = (int32_t *)malloc((size_t)x->Tq * 4);
  TC_CUDA(cudaMemcpy(*idx_out, di, in * 4, cudaMemcpyDeviceToHost));
  TC_CUDA(cudaMemcpy(*len_out, dl, (size_t)x->Tq * 4, cudaMemcpyDeviceToHost));
  cudaFree(ws);
  cudaFree(di);
  cudaFree(dl);
  return 1;
}

/* Reference of one local row t through a one-query view of the host plan. */
static void ref_row(const ix_case *c, const ix_data *x, int64_t t, int32_t *want, int32_t *wlen) {
  dsa_indexer_params p = params_of(c, x, 0);
  dsa_plan_view v = tc_view_row(x->hv, t);
  const size_t welem = c->wdt == DSA_DTYPE_F32 ? 4 : 2;
  p.plan = &v;
  p.index_q = x->q + t * x->qst;
  p.weights = (const char *)x->w + (size_t)(t * x->wst) * welem;
  p.indices = want;
  p.indices_stride = c->K;
  p.lengths = wlen;
  TC_OK(dsa_ref_indexer_topk(&p));
}

/* Runs case c with both engines (the fused one with each kernel) and compares: every row that
 * selects all its keys, and c->sample scored rows (evenly spread, plus the last). */
static void run_case(ix_env *e, tc_rng *r, const ix_case *c) {
  static const dsa_indexer_engine engines[3] = {DSA_INDEXER_ENGINE_CUBLAS, DSA_INDEXER_ENGINE_FUSED,
                                                DSA_INDEXER_ENGINE_FUSED};
  static const int variants[3] = {0, FV_MMA, FV_WGMMA};
  static const char *const names[3] = {"cublas", "fused mma.sync", "fused wgmma"};
  ix_data x;
  int64_t scored = 0, every, nchk = 0;
  ix_case shrunk;
  if (tc_racecheck()) {
    /* racecheck: the last 48 queries of the case's query range (a CP range: every key, window and
     * chunk path stays, the per-row top-k and scoring work shrinks ~50x; the whole cases ran past
     * 496 s on the H200) */
    const int64_t nq0 = c->Tq < 0 ? c->Tk : c->Tq, qs0 = c->Tq < 0 ? 0 : c->qs;
    if (nq0 > 48) {
      shrunk = *c;
      shrunk.Tq = 48;
      shrunk.qs = qs0 + nq0 - 48;
      c = &shrunk;
    }
  }
  data_make(e, r, c, &x);
  int64_t *rows = (int64_t *)malloc((size_t)x.Tq * 8);
  for (int64_t t = 0; t < x.Tq; ++t) scored += x.hv->causal_lengths[t] > c->K;
  every = c->sample > 0 && scored > c->sample ? scored / c->sample : 1;
  for (int64_t t = 0, s = 0; t < x.Tq; ++t) {
    if (x.hv->causal_lengths[t] <= c->K) {
      rows[nchk++] = t;
    } else {
      if (s % every == 0 || s == scored - 1) rows[nchk++] = t;
      ++s;
    }
  }
  int32_t *want = (int32_t *)malloc((size_t)(nchk * c->K) * 4), *wlen = (int32_t *)malloc((size_t)nchk * 4);
  for (int64_t i = 0; i < nchk; ++i) {
    wlen[i] = -7;
    ref_row(c, &x, rows[i], want + i * c->K, wlen + i);
  }
  for (int en = 0; en < 3; ++en) {
    int32_t *got, *glen;
    if (engines[en] == DSA_INDEXER_ENGINE_CUBLAS && tc_sanitize_skips_cublas()) continue; /* test_common.h */
    if (!gpu_run(e, c, &x, engines[en], variants[en], 0, &got, &glen)) continue;
    for (int64_t i = 0; i < nchk; ++i) {
      const int64_t t = rows[i];
      cr_assert_eq(glen[t], wlen[i], "%s [%s]: lengths[%lld] = %d, want %d", c->what, names[en],
                   (long long)t, glen[t], wlen[i]);
      for (int64_t j = 0; j < c->K; ++j)
        cr_assert_eq(got[t * x.ist + j], want[i * c->K + j],
                     "%s [%s] (H %d K %d): row %lld slot %lld is %d, want %d", c->what, names[en], c->H,
                     c->K, (long long)t, (long long)j, got[t * x.ist + j], want[i * c->K + j]);
      for (int64_t j = c->K; j < x.ist; ++j)
        cr_assert_eq(got[t * x.ist + j], TC_POISON_I32, "%s [%s]: row %lld gap slot %lld written",
                     c->what, names[en], (long long)t, (long long)j);
    }
    free(got);
    free(glen);
  }
  free(rows);
  free(want);
  free(wlen);
  data_free(&x);
}

static void set_budgets(ix_env *e, int64_t scores, int64_t logits, int64_t tile) {
  TC_SET_OPTION(e->ctx, DSA_OPTION_INDEXER_SCORES_BUDGET, scores);
  TC_SET_OPTION(e->ctx, DSA_OPTION_INDEXER_LOGITS_BUDGET, logits);
  TC_SET_OPTION(e->ctx, DSA_OPTION_INDEXER_KEY_TILE, tile);
}
/* the defaults of include/dsa_tune.h */
static void default_budgets(ix_env *e) { set_budgets(e, (int64_t)256 << 20, (int64_t)64 << 20, 32768); }

/* ---- section 4 worked examples A-D, every row ---- */
Test(gpu_indexer, worked_examples) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.worked_examples");
  static const int32_t cuA[] = {0, 3, 7, 9}, PA[] = {0, 4, 9, 12};
  static const int32_t cuB[] = {0, 3, 8}, cuC[] = {0, 2, 5}, cuD[] = {0, 64, 128};
  static const uint8_t maskB[] = {0, 0, 0, 0, 0, 1, 1, 1};
  for (int k = 1; k <= 2; ++k) {
    ix_case a = {cuA, PA, 3, 12, 2, 8, NULL, 32, k, DSA_DTYPE_F32, QL_PLAIN, 0, "example A"};
    ix_case b = {cuB, NULL, 2, 8, 0, -1, maskB, 1, k, DSA_DTYPE_BF16, QL_PADDED, 0, "example B"};
    ix_case c = {cuC, NULL, 2, 5, 0, -1, NULL, 64, k, DSA_DTYPE_F32, QL_HEAD_MAJOR, 0, "example C"};
    ix_case d = {cuD, NULL, 2, 128, 96, 32, NULL, 32, k * 7, DSA_DTYPE_BF16, QL_TOKEN_GAP, 0, "example D"};
    run_case(&e, &r, &a);
    run_case(&e, &r, &b);
    run_case(&e, &r, &c);
    run_case(&e, &r, &d);
  }
  ix_close(&e);
}

/* ---- one causal sequence, every K, default and shrunken budgets ---- */
Test(gpu_indexer, single_sequence_all_k) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.single_sequence_all_k");
  static const int32_t cu[] = {0, 2600};
  static const int32_t ks[] = {1, 7, 64, 100, 2048};
  for (int i = 0; i < 5; ++i) {
    ix_case c = {cu, NULL, 1, 2600, 0, -1, NULL, 32, ks[i], i & 1 ? DSA_DTYPE_BF16 : DSA_DTYPE_F32,
                 QL_PLAIN, 12, "single sequence"};
    run_case(&e, &r, &c);
  }
  /* many chunks, key tiles and one-query GEMMs */
  set_budgets(&e, 300 << 10, 200 << 10, 700);
  {
    ix_case c = {cu, NULL, 1, 2600, 0, -1, NULL, 32, 100, DSA_DTYPE_F32, QL_PADDED, 12, "small budgets"};
    run_case(&e, &r, &c);
    c.K = 2048;
    c.qlayout = QL_HEAD_MAJOR;
    run_case(&e, &r, &c);
  }
  {
    /* H_idx not a multiple of 8 (fused: 24 padded heads, 5 queries per CTA) */
    ix_case c = {cu, NULL, 1, 2600, 0, -1, NULL, 20, 64, DSA_DTYPE_BF16, QL_TOKEN_GAP, 6, "H 20"};
    run_case(&e, &r, &c);
  }
  {
    /* the wgmma kernel's other padded shapes: H 12 -> 32 columns per query, H 40 -> 64 */
    ix_case c = {cu, NULL, 1, 2600, 0, -1, NULL, 12, 100, DSA_DTYPE_F32, QL_PLAIN, 6, "H 12"};
    run_case(&e, &r, &c);
    c.H = 40;
    c.K = 7;
    c.wdt = DSA_DTYPE_BF16;
    c.qlayout = QL_HEAD_MAJOR;
    c.what = "H 40";
    run_case(&e, &r, &c);
  }
  set_budgets(&e, 1 << 20, 1 << 20, 1000);
  {
    ix_case c = {cu, NULL, 1, 2600, 0, -1, NULL, 1, 7, DSA_DTYPE_BF16, QL_TOKEN_GAP, 12, "H 1, small budgets"};
    run_case(&e, &r, &c);
  }
  default_budgets(&e);
  ix_close(&e);
}

/* ---- many chunks across documents and a CP range: chunk boundaries inside a document, in the
 * middle of the local queries, each chunk's window its own ---- */
Test(gpu_indexer, chunks_across_documents_and_cp_range) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.chunks_across_documents_and_cp_range");
  static const int32_t cu[] = {0, 2600}, cuD[] = {0, 1200, 1201, 3100, 3400};
  set_budgets(&e, 1 << 20, 1 << 20, 1000); /* ~128-row chunks over the documents, 100 over the CP range */
  {
    ix_case c = {cuD, NULL, 4, 3400, 0, -1, NULL, 64, 64, DSA_DTYPE_F32, QL_PLAIN, 10, "chunks, documents"};
    run_case(&e, &r, &c);
  }
  {
    ix_case c = {cu, NULL, 1, 2600, 900, 1500, NULL, 32, 64, DSA_DTYPE_BF16, QL_TOKEN_GAP, 10, "chunks, CP range"};
    run_case(&e, &r, &c);
  }
  default_budgets(&e);
  ix_close(&e);
}

/* ---- several documents (one of length 1), padded storage, CP range, padding mask ---- */
Test(gpu_indexer, documents_padding_cp_mask) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.documents_padding_cp_mask");
  static const int32_t cu[] = {0, 1200, 1201, 3100, 3400};
  static const int32_t cuP[] = {0, 1000, 2500, 2600}, P[] = {0, 1100, 2608, 2800};
  uint8_t *mask = (uint8_t *)malloc(3400);
  for (int i = 0; i < 3400; ++i) mask[i] = tc_below(&r, 5) == 0;
  {
    ix_case c = {cu, NULL, 4, 3400, 0, -1, NULL, 64, 100, DSA_DTYPE_F32, QL_PLAIN, 10, "documents"};
    run_case(&e, &r, &c);
    c.K = 1;
    c.wdt = DSA_DTYPE_BF16;
    run_case(&e, &r, &c);
    c.mask = mask;
    c.K = 64;
    c.what = "documents, padding mask";
    run_case(&e, &r, &c);
  }
  {
    ix_case c = {cuP, P, 3, 2800, 0, -1, NULL, 32, 64, DSA_DTYPE_F32, QL_TOKEN_GAP, 10, "padded storage"};
    run_case(&e, &r, &c);
    c.qs = 700; /* context-parallel range: queries 700..2199 */
    c.Tq = 1500;
    c.what = "padded storage, CP range";
    c.wdt = DSA_DTYPE_BF16;
    run_case(&e, &r, &c);
    set_budgets(&e, 256 << 10, 128 << 10, 300);
    c.what = "padded storage, CP range, small budgets";
    c.K = 7;
    run_case(&e, &r, &c);
    default_budgets(&e);
  }
  {
    /* CP range on one long sequence: the first local query already sees more than K keys */
    static const int32_t one[] = {0, 6000};
    ix_case c = {one, NULL, 1, 6000, 4000, 1000, NULL, 64, 2048, DSA_DTYPE_F32, QL_HEAD_MAJOR, 8,
                 "CP range, long sequence"};
    run_case(&e, &r, &c);
  }
  free(mask);
  ix_close(&e);
}

/* ---- inf / NaN keys with padded heads (H 20, 40: the fused kernels' zero head columns must add
 * nothing, not 0 * inf = NaN): GPU = reference index for index (NaN ranks below every number) ---- */
Test(gpu_indexer, nonfinite_keys_padded_heads) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.nonfinite_keys_padded_heads");
  static const int32_t cu[] = {0, 2600};
  ix_case c = {cu, NULL, 1, 2600, 0, -1, NULL, 20, 64, DSA_DTYPE_F32, QL_PLAIN, 12, "non-finite keys, H 20"};
  ix_nonfinite = 1;
  run_case(&e, &r, &c);
  c.H = 40;
  c.K = 100;
  c.wdt = DSA_DTYPE_BF16;
  c.what = "non-finite keys, H 40";
  run_case(&e, &r, &c);
  ix_nonfinite = 0;
  ix_close(&e);
}

/* ---- T_q above 65535 with short documents: cheap, every row checked ---- */
Test(gpu_indexer, many_queries) {
  TC_REQUIRE_GPU();
  if (tc_racecheck()) cr_skip_test("T_q > 65535 is skipped under racecheck (grid and 64-bit offsets, no shared-memory question; memcheck runs it)");
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.many_queries");
  const int64_t docs = 1751, len = 40, T = docs * len;
  int32_t *cu = (int32_t *)malloc((size_t)(docs + 1) * 4);
  for (int64_t d = 0; d <= docs; ++d) cu[d] = (int32_t)(d * len - (d > 0 && d < docs ? d % 7 : 0));
  cu[docs] = (int32_t)T;
  {
    ix_case c = {cu, NULL, docs, T, 0, -1, NULL, 1, 7, DSA_DTYPE_F32, QL_PLAIN, 0, "T_q > 65535, K 7"};
    run_case(&e, &r, &c);
    c.K = 64; /* every row selects all its keys: no scoring */
    c.what = "T_q > 65535, K 64";
    run_case(&e, &r, &c);
  }
  free(cu);
  ix_close(&e);
}

/* ---- bitwise reruns; a row alone equals the row in the batch ---- */
Test(gpu_indexer, deterministic_and_batch_independent) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  if (tc_sanitize_skips_cublas()) /* its baseline is the cuBLAS engine (test_common.h) */
    cr_skip_test("skipped under initcheck / racecheck: the baseline runs cuBLAS; memcheck and synccheck run it");
  tc_rng r = tc_seed("gpu_indexer.deterministic_and_batch_independent");
  static const int32_t cu[] = {0, 1500, 3000};
  ix_case c = {cu, NULL, 2, 3000, 0, -1, NULL, 32, 100, DSA_DTYPE_F32, QL_PLAIN, 0, "rerun"};
  ix_data x;
  int32_t *a, *al, *b, *bl;
  data_make(&e, &r, &c, &x);
  gpu_run(&e, &c, &x, DSA_INDEXER_ENGINE_CUBLAS, 0, 0, &a, &al);
  gpu_run(&e, &c, &x, DSA_INDEXER_ENGINE_CUBLAS, 0, 1, &b, &bl); /* workspace at a 1-byte offset */
  cr_assert(memcmp(a, b, (size_t)(x.Tq * x.ist) * 4) == 0, "two runs differ");
  cr_assert(memcmp(al, bl, (size_t)x.Tq * 4) == 0, "two runs differ in lengths");
  {
    int32_t *f1, *f1l, *f2, *f2l;
    gpu_run(&e, &c, &x, DSA_INDEXER_ENGINE_FUSED, FV_MMA, 0, &f1, &f1l);
    gpu_run(&e, &c, &x, DSA_INDEXER_ENGINE_DEFAULT, 0, 1, &f2, &f2l); /* fused on sm_80+ */
    cr_assert(memcmp(f1, f2, (size_t)(x.Tq * x.ist) * 4) == 0, "two fused runs differ");
    cr_assert(memcmp(f1, a, (size_t)(x.Tq * x.ist) * 4) == 0, "fused and cuBLAS engines differ (exact inputs)");
    cr_assert(memcmp(f1l, al, (size_t)x.Tq * 4) == 0, "fused and cuBLAS lengths differ");
    free(f1);
    free(f1l);
    free(f2);
    free(f2l);
    /* the wgmma kernel: two runs (the second through DEFAULT + the forced variant, workspace at a
     * 1-byte offset) bitwise equal, and equal to cuBLAS on exact inputs */
    if (gpu_run(&e, &c, &x, DSA_INDEXER_ENGINE_FUSED, FV_WGMMA, 0, &f1, &f1l)) {
      gpu_run(&e, &c, &x, DSA_INDEXER_ENGINE_DEFAULT, FV_WGMMA, 1, &f2, &f2l);
      cr_assert(f2 != NULL, "the wgmma kernel ran once, then declined");
      cr_assert(memcmp(f1, f2, (size_t)(x.Tq * x.ist) * 4) == 0, "two wgmma runs differ");
      cr_assert(memcmp(f1, a, (size_t)(x.Tq * x.ist) * 4) == 0, "wgmma and cuBLAS engines differ (exact inputs)");
      cr_assert(memcmp(f1l, al, (size_t)x.Tq * 4) == 0, "wgmma and cuBLAS lengths differ");
      free(f1);
      free(f1l);
      free(f2);
      free(f2l);
    }
  }
  static const int64_t rows[] = {0, 99, 100, 777, 1499, 1500, 1600, 2999};
  for (int i = 0; i < 8; ++i) {
    /* the same query as a one-query plan (query_start = its position), its own q and weights rows */
    ix_case c1 = c;
    ix_data y = x;
    dsa_plan_desc d;
    int32_t *oi, *ol;
    const int64_t t = rows[i];
    c1.qs = t;
    c1.Tq = 1;
    desc_of(&c1, &d);
    y.plan = NULL;
    y.dplan = NULL;
    plan_up(&e, &d, &y);
    y.Tq = 1;
    y.dq = x.dq + t * x.qst;
    y.dw = (char *)x.dw + (size_t)(t * x.wst) * 4;
    for (int en = 0; en < 3; ++en) {
      if (!gpu_run(&e, &c1, &y, en ? DSA_INDEXER_ENGINE_FUSED : DSA_INDEXER_ENGINE_CUBLAS, en, 0, &oi, &ol))
        continue; /* en = 2: the wgmma kernel declined */
      cr_assert_eq(ol[0], al[t], "row %lld alone (engine %d): length %d, in batch %d", (long long)t, en,
                   ol[0], al[t]);
      cr_assert(memcmp(oi, a + t * x.ist, (size_t)c.K * 4) == 0,
                "row %lld alone (engine %d) differs from the batch", (long long)t, en);
      free(oi);
      free(ol);
    }
    cudaFree(y.dplan);
    dsa_plan_destroy(y.plan);
  }
  free(a);
  free(al);
  free(b);
  free(bl);
  data_free(&x);
  ix_close(&e);
}

/* ---- workspace: >= 1, stable, bounded at the canonical sizes (no device memory needed) ---- */
Test(gpu_indexer, workspace_bounded) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  /* the default budgets (include/dsa_tune.h): the scores of a chunk, and the cuBLAS engine's logits */
  const size_t scores = (size_t)256 << 20, logits = (size_t)64 << 20;
  /* whole sequences of 4k / 32k / 128k, and 300 queries at the end of a 64k sequence (few scored
   * rows over long windows: one chunk below the budget) */
  static const struct { int64_t len, nq; } shapes[] = {{4096, -1}, {32768, -1}, {131072, -1}, {65536, 300}};
  for (int i = 0; i < 4; ++i)
    for (int h = 32; h <= 64; h += 32) {
      const int64_t len = shapes[i].len, nq = shapes[i].nq;
      dsa_plan *plan = NULL;
      dsa_indexer_params p = tc_indexer_size_params(len, nq, len - nq, h, 2048, &plan);
      size_t b1 = 0, b2 = 0;
      TC_OK(dsa_indexer_topk(e.ctx, &p, NULL, &b1, e.stream));
      TC_OK(dsa_indexer_topk(e.ctx, &p, NULL, &b2, e.stream));
      cr_assert(b1 >= 1 && b1 == b2, "size %zu then %zu", b1, b2);
      cr_assert(b1 <= scores + logits + 768, "T %lld H %d: workspace %zu above the budgets", (long long)len, h, b1);
      for (int eng = 0; eng < 2; ++eng) {
        size_t b0 = 0;
        p.engine = eng ? DSA_INDEXER_ENGINE_FUSED : DSA_INDEXER_ENGINE_CUBLAS;
        TC_OK(dsa_indexer_topk(e.ctx, &p, NULL, &b2, e.stream));
        /* fused: the scores alone (at most the budget: these windows are multiples of 4 columns);
         * cuBLAS: plus the logits (q is read in place, not packed) */
        cr_assert(b2 >= 1 && b2 <= (eng ? scores + 512 : scores + logits + 768), "engine %d: T %lld H %d: workspace %zu",
                  eng, (long long)len, h, b2);
        /* the size without a context (the option defaults) is the default context's */
        TC_OK(dsa_indexer_topk(NULL, &p, NULL, &b0, e.stream));
        cr_assert_eq(b0, b2, "engine %d: T %lld Tq %lld H %d: workspace %zu without a context, %zu with one", eng,
                     (long long)len, (long long)nq, h, b0, b2);
      }
      dsa_plan_destroy(plan);
    }
  ix_close(&e);
}

/* ---- bad arguments: a status, a message naming the argument, outputs untouched ---- */
Test(gpu_indexer, bad_arguments_write_nothing) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.bad_arguments_write_nothing");
  static const int32_t cu[] = {0, 300};
  ix_case c = {cu, NULL, 1, 300, 0, -1, NULL, 32, 64, DSA_DTYPE_F32, QL_PLAIN, 0, "bad"};
  ix_data x;
  int32_t *di, *dl, host[300];
  size_t need = 0, small;
  unsigned char *ws;
  data_make(&e, &r, &c, &x);
  dsa_indexer_params p = params_of(&c, &x, 1);
  TC_CUDA(cudaMalloc((void **)&di, 300 * 64 * 4));
  TC_CUDA(cudaMalloc((void **)&dl, 300 * 4));
  TC_CUDA(cudaMemset(di, 0x5A, 300 * 64 * 4));
  TC_CUDA(cudaMemset(dl, 0x5A, 300 * 4));
  p.indices = di;
  p.lengths = dl;
  TC_OK(dsa_indexer_topk(e.ctx, &p, NULL, &need, e.stream));
  TC_CUDA(cudaMalloc((void **)&ws, need));
  p.topk = 0;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "topk");
  p.topk = 2049;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "topk");
  p.topk = 64;
  p.num_heads = 65;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "num_heads");
  p.num_heads = 0;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "num_heads");
  p.num_heads = 32;
  p.plan = NULL;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "plan");
  p.plan = &x.dv;
  p.index_q = NULL;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "index_q");
  p.index_q = x.dq;
  p.weights_dtype = (dsa_dtype)7;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "weights_dtype");
  p.weights_dtype = DSA_DTYPE_F32;
  TC_FAILS(dsa_indexer_topk(NULL, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, NULL, e.stream), DSA_ERROR_INVALID_ARGUMENT, "workspace_bytes");
  p.engine = (dsa_indexer_engine)9;
  TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream), DSA_ERROR_INVALID_ARGUMENT, "engine");
  p.engine = DSA_INDEXER_ENGINE_CUBLAS;
  small = need - 1;
  if (need > 1)
    TC_FAILS(dsa_indexer_topk(e.ctx, &p, ws, &small, e.stream), DSA_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  TC_CUDA(cudaDeviceSynchronize());
  TC_CUDA(cudaMemcpy(host, dl, sizeof host, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 300; ++i) cr_assert_eq(host[i], TC_POISON_I32, "a failed call wrote lengths[%d]", i);
  for (int t = 0; t < 300; ++t) {
    int32_t row[64];
    TC_CUDA(cudaMemcpy(row, di + t * 64, sizeof row, cudaMemcpyDeviceToHost));
    for (int j = 0; j < 64; ++j) cr_assert_eq(row[j], TC_POISON_I32, "a failed call wrote indices[%d][%d]", t, j);
  }
  cudaFree(ws);
  cudaFree(di);
  cudaFree(dl);
  data_free(&x);
  ix_close(&e);
}

/* ---- both engines are capturable: a CUDA graph replays to the eager result ---- */
Test(gpu_indexer, graph_capture) {
  TC_REQUIRE_GPU();
  ix_env e = ix_open();
  tc_rng r = tc_seed("gpu_indexer.graph_capture");
  static const int32_t cu[] = {0, 900, 2500};
  ix_case c = {cu, NULL, 2, 2500, 0, -1, NULL, 32, 100, DSA_DTYPE_BF16, QL_HEAD_MAJOR, 0, "graph"};
  ix_data x;
  data_make(&e, &r, &c, &x);
  for (int run = 0; run < 5; ++run) {
    /* cuBLAS, fused mma.sync, fused wgmma at the default budgets (one chunk); then both fused kernels
     * over many chunks (one scores buffer, rewritten by each chunk) */
    const int en = run < 3 ? run : run - 2, many = run >= 3;
    if (many) set_budgets(&e, 300 << 10, 200 << 10, 700);
    else default_budgets(&e);
    dsa_indexer_params p = params_of(&c, &x, 1);
    const size_t in = (size_t)(x.Tq * x.ist);
    int32_t *a, *al, *di, *dl;
    int32_t *got = (int32_t *)malloc(in * 4), *glen = (int32_t *)malloc((size_t)x.Tq * 4);
    unsigned char *ws;
    size_t need = 0;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    p.engine = en ? DSA_INDEXER_ENGINE_FUSED : DSA_INDEXER_ENGINE_CUBLAS;
    if ((en == 0 && tc_sanitize_skips_cublas()) || !gpu_run(&e, &c, &x, p.engine, en, 0, &a, &al)) {
      free(got);
      free(glen);
      continue; /* en = 2: the wgmma kernel declined */
    }
    TC_CUDA(cudaMalloc((void **)&di, in * 4));
    TC_CUDA(cudaMalloc((void **)&dl, (size_t)x.Tq * 4));
    TC_CUDA(cudaMemset(di, 0x5A, in * 4));
    TC_CUDA(cudaMemset(dl, 0x5A, (size_t)x.Tq * 4));
    TC_CUDA(cudaDeviceSynchronize()); /* poison lands before the non-blocking stream runs */
    p.indices = di;
    p.lengths = dl;
    TC_OK(dsa_indexer_topk(e.ctx, &p, NULL, &need, e.stream));
    TC_CUDA(cudaMalloc((void **)&ws, need));
    TC_CUDA(cudaStreamBeginCapture(e.stream, cudaStreamCaptureModeGlobal));
    TC_SET_OPTION(e.ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, en);
    TC_OK(dsa_indexer_topk(e.ctx, &p, ws, &need, e.stream));
    TC_SET_OPTION(e.ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, DSA_INDEXER_FUSED_AUTO);
    TC_CUDA(cudaStreamEndCapture(e.stream, &g));
    TC_CUDA(cudaGraphInstantiate(&ge, g, 0));
    TC_CUDA(cudaGraphLaunch(ge, e.stream));
    TC_CUDA(cudaStreamSynchronize(e.stream));
    TC_CUDA(cudaMemcpy(got, di, in * 4, cudaMemcpyDeviceToHost));
    TC_CUDA(cudaMemcpy(glen, dl, (size_t)x.Tq * 4, cudaMemcpyDeviceToHost));
    cr_assert(memcmp(got, a, in * 4) == 0, "engine %d, many chunks %d: graph replay differs from the eager run", en,
              many);
    cr_assert(memcmp(glen, al, (size_t)x.Tq * 4) == 0, "engine %d, many chunks %d: graph replay lengths differ", en,
              many);
    TC_CUDA(cudaGraphExecDestroy(ge));
    TC_CUDA(cudaGraphDestroy(g));
    cudaFree(ws);
    cudaFree(di);
    cudaFree(dl);
    free(a);
    free(al);
    free(got);
    free(glen);
  }
  default_budgets(&e);
  data_free(&x);
  ix_close(&e);
}
