/* test_indexer_layout.c - CPU suite indexer_layout: dsa_indexer_topk's workspace layout rules
 * (src/indexer.c), read through dsa_indexer_layout on a device-free context (src/internal.h's struct,
 * options at their defaults, set through the public dsa_context_set_option):
 *  - the chunk pipeline (DSA_OPTION_INDEXER_PIPELINE = 1) on the bench's indexer shapes: idx-glm-4k
 *    stays serial (its scores fill 32 MiB in all: four chunks would score in launches of half the
 *    SMs), idx-glm-cp8 and idx-32k run 512-row chunks in two buffers, and 300 queries at the end of a
 *    64k sequence stay serial (two buffers would outgrow its one serial chunk);
 *  - on random single-sequence shapes, budgets and both engines: a pipelined layout is never larger
 *    than the serial one and has at least two chunks, and the size query without a context covers
 *    the layout of every context with the default budgets. */
#include "test_common.h"
#include "internal.h"

typedef struct {
  dsa_plan *plan;
  dsa_indexer_params p;
  int64_t scored; /* queries that are scored: causal_length > K */
} lay_case;

/* one sequence of tk keys; queries [qs, qs + nq) (nq = -1: all of them) */
static void lay_make(lay_case *c, int64_t tk, int64_t nq, int64_t qs, int h, int k) {
  c->p = tc_indexer_size_params(tk, nq, qs, h, k, &c->plan);
  c->scored = 0;
  for (int64_t t = 0; t < c->p.plan->num_queries; ++t) c->scored += c->p.plan->causal_lengths[t] > k;
}

static void layout(const dsa_context *ctx, const lay_case *c, int fused, int pipeline, int64_t *total, int *nbuf,
                   int64_t *chunk) {
  dsa_context x = *ctx;
  TC_SET_OPTION(&x, DSA_OPTION_INDEXER_PIPELINE, pipeline);
  TC_OK(dsa_indexer_layout(&x, &c->p, fused, total, nbuf, chunk));
}

Test(indexer_layout, pipeline_on_bench_shapes) {
  dsa_context ctx;
  memset(&ctx, 0, sizeof ctx);
  dsa_context_options_init(&ctx);
  static const struct {
    const char *name;
    int64_t tk, nq, qs;
    int nbuf;       /* with the pipeline on */
    int64_t chunk;  /* queries per scored chunk with it on */
  } shapes[] = {
      {"idx-glm-4k", 4096, -1, 0, 1, 2048},
      {"idx-glm-cp8", 32768, 4096, 28672, 2, 512},
      {"idx-32k", 32768, -1, 0, 2, 512},
      {"300 queries at the end of 64k", 65536, 300, 65236, 1, 300},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
    for (int fused = 0; fused < 2; ++fused) {
      lay_case c;
      lay_make(&c, shapes[i].tk, shapes[i].nq, shapes[i].qs, 32, 2048);
      int64_t total1, chunk1, total0, chunk0;
      int nbuf1, nbuf0;
      layout(&ctx, &c, fused, 1, &total1, &nbuf1, &chunk1);
      layout(&ctx, &c, fused, 0, &total0, &nbuf0, &chunk0);
      cr_assert_eq(nbuf0, 1, "%s: the serial layout has one buffer", shapes[i].name);
      cr_assert_eq(nbuf1, shapes[i].nbuf, "%s, engine %d: %d scores buffers with the pipeline, want %d",
                   shapes[i].name, fused, nbuf1, shapes[i].nbuf);
      cr_assert_eq(chunk1, shapes[i].chunk, "%s, engine %d: %lld queries per chunk with the pipeline, want %lld",
                   shapes[i].name, fused, (long long)chunk1, (long long)shapes[i].chunk);
      cr_assert(total1 <= total0, "%s, engine %d: pipelined %lld B above the serial %lld B", shapes[i].name, fused,
                (long long)total1, (long long)total0);
      if (nbuf1 == 1) cr_assert_eq(total1, total0, "%s: a declined pipeline is the serial layout", shapes[i].name);
      dsa_plan_destroy(c.plan);
    }
}

Test(indexer_layout, pipeline_never_grows_the_workspace) {
  dsa_context ctx;
  memset(&ctx, 0, sizeof ctx);
  dsa_context_options_init(&ctx);
  tc_rng r = tc_seed("indexer_layout.pipeline_never_grows_the_workspace");
  int pipelined = 0;
  for (int it = 0; it < 300; ++it) {
    const int64_t tk = 1 + (int64_t)tc_below(&r, 70000);
    const int whole = tc_below(&r, 3) == 0;
    const int64_t nq = whole ? -1 : 1 + (int64_t)tc_below(&r, tk);
    const int64_t qs = whole ? 0 : (int64_t)tc_below(&r, tk - nq + 1);
    const int h = 1 + (int)tc_below(&r, 64), k = 1 + (int)tc_below(&r, 2048);
    const int own_budgets = tc_below(&r, 2);
    dsa_context x = ctx;
    if (own_budgets) {
      TC_SET_OPTION(&x, DSA_OPTION_INDEXER_SCORES_BUDGET, (int64_t)(1 + tc_below(&r, 256)) << 20);
      TC_SET_OPTION(&x, DSA_OPTION_INDEXER_LOGITS_BUDGET, (int64_t)(1 + tc_below(&r, 128)) << 20);
      TC_SET_OPTION(&x, DSA_OPTION_INDEXER_KEY_TILE, 64 + (int64_t)tc_below(&r, 32768 - 63));
    }
    lay_case c;
    lay_make(&c, tk, nq, qs, h, k);
    for (int fused = 0; fused < 2; ++fused) {
      int64_t total1, chunk1, total0, chunk0;
      int nbuf1, nbuf0;
      layout(&x, &c, fused, 1, &total1, &nbuf1, &chunk1);
      layout(&x, &c, fused, 0, &total0, &nbuf0, &chunk0);
      cr_assert(total1 <= total0, "case %d (T_k %lld, T_q %lld, q_s %lld, H %d, K %d), engine %d: pipelined %lld B "
                "above the serial %lld B", it, (long long)tk, (long long)nq, (long long)qs, h, k, fused,
                (long long)total1, (long long)total0);
      if (nbuf1 == 2) {
        ++pipelined;
        cr_assert(chunk1 >= 1 && chunk1 < c.scored, "case %d, engine %d: a pipeline of one chunk (%lld of %lld "
                  "scored queries)", it, fused, (long long)chunk1, (long long)c.scored);
      } else {
        cr_assert_eq(total1, total0, "case %d: a declined pipeline is the serial layout", it);
      }
      if (!own_budgets) { /* the size query without a context covers any context's layout */
        size_t b = 0;
        dsa_indexer_params q = c.p;
        q.engine = fused ? DSA_INDEXER_ENGINE_FUSED : DSA_INDEXER_ENGINE_CUBLAS;
        TC_OK(dsa_indexer_topk(NULL, &q, NULL, &b, 0));
        cr_assert((int64_t)b >= total1 && (int64_t)b >= total0, "case %d, engine %d: the context-free size %zu "
                  "below a context's %lld / %lld", it, fused, b, (long long)total1, (long long)total0);
      }
    }
    dsa_plan_destroy(c.plan);
  }
  cr_assert(pipelined > 0, "no random case took the pipeline: the property went untested");
}
