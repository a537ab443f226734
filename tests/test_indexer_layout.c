/* test_indexer_layout.c - CPU suite indexer_layout: dsa_indexer_topk's workspace layout rules
 * (cuda/indexer/dispatch.cu), read through dsa_indexer_layout on a device-free context
 * (dsa_testing_context: options at their defaults, set through the public dsa_context_set_option):
 *  - the bench's indexer shapes at the default budgets (256 MiB of scores, 64 MiB of cuBLAS logits):
 *    idx-glm-4k in one chunk of 2048 scored queries (32 MiB), idx-glm-cp8 and idx-32k in chunks of
 *    2048 rows of 32768 columns (the whole 256 MiB), 300 queries at the end of a 64k sequence in one
 *    chunk (75 MiB), and the exact bytes of both engines;
 *  - on random single-sequence shapes, budgets and both engines: a chunk's scores fit the budget
 *    (one row when none fits) and it holds at least the rows that fit at T_k columns, the
 *    workspace is bounded by the budgets, the cuBLAS layout holds the fused one, and the size query
 *    without a context is the layout of a context with the default budgets. */
#include "test_common.h"
#include "dsa_testing.h"

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

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

Test(indexer_layout, bench_shapes) {
  dsa_context *ctx = dsa_testing_context(0);
  cr_assert_not_null(ctx);
  static const struct {
    const char *name;
    int64_t tk, nq, qs;
    int64_t chunk; /* queries per scored chunk */
  } shapes[] = {
      {"idx-glm-4k", 4096, -1, 0, 2048},
      {"idx-glm-cp8", 32768, 4096, 28672, 2048},
      {"idx-32k", 32768, -1, 0, 2048},
      {"300 queries at the end of 64k", 65536, 300, 65236, 300},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
    lay_case c;
    lay_make(&c, shapes[i].tk, shapes[i].nq, shapes[i].qs, 32, 2048);
    /* every window is the whole sequence: rows of tk columns; q is read in place (no packed copy);
     * the cuBLAS logits: the largest sub-chunk whose 32 heads x min(32768, tk) keys fit 64 MiB */
    const int64_t scores = shapes[i].chunk * shapes[i].tk * 4;
    const int64_t tile = shapes[i].tk < 32768 ? shapes[i].tk : 32768;
    int64_t sub = ((int64_t)64 << 20) / (32 * tile * 4);
    if (sub > shapes[i].chunk) sub = shapes[i].chunk;
    const int64_t want[2] = {scores + sub * 32 * tile * 4 + 256, scores + 256};
    for (int fused = 0; fused < 2; ++fused) {
      int64_t total, chunk;
      TC_OK(dsa_indexer_layout(ctx, &c.p, fused, &total, &chunk));
      cr_assert_eq(chunk, shapes[i].chunk, "%s, engine %d: %lld queries per chunk, want %lld", shapes[i].name, fused,
                   (long long)chunk, (long long)shapes[i].chunk);
      cr_assert_eq(total, want[fused], "%s, engine %d: %lld B, want %lld", shapes[i].name, fused, (long long)total,
                   (long long)want[fused]);
      cr_assert(scores <= ((int64_t)256 << 20), "%s: the scores exceed the budget", shapes[i].name);
    }
    dsa_plan_destroy(c.plan);
  }
  dsa_context_destroy(ctx);
}

Test(indexer_layout, chunks_fit_the_budgets) {
  tc_rng r = tc_seed("indexer_layout.chunks_fit_the_budgets");
  int multi = 0; /* cases of more than one chunk */
  for (int it = 0; it < 300; ++it) {
    const int64_t tk = 1 + (int64_t)tc_below(&r, 70000);
    const int whole = tc_below(&r, 3) == 0;
    const int64_t nq = whole ? -1 : 1 + (int64_t)tc_below(&r, tk);
    const int64_t qs = whole ? 0 : (int64_t)tc_below(&r, tk - nq + 1);
    const int h = 1 + (int)tc_below(&r, 64), k = 1 + (int)tc_below(&r, 2048);
    const int own_budgets = tc_below(&r, 2);
    dsa_context *x = dsa_testing_context(0); /* the default budgets unless own_budgets */
    cr_assert_not_null(x);
    if (own_budgets) {
      TC_SET_OPTION(x, DSA_OPTION_INDEXER_SCORES_BUDGET, (int64_t)(1 + tc_below(&r, 512)) << 20);
      TC_SET_OPTION(x, DSA_OPTION_INDEXER_LOGITS_BUDGET, (int64_t)(1 + tc_below(&r, 128)) << 20);
      TC_SET_OPTION(x, DSA_OPTION_INDEXER_KEY_TILE, 64 + (int64_t)tc_below(&r, 32768 - 63));
    }
    int64_t sbud = 0, lbud = 0;
    TC_OK(dsa_context_get_option(x, DSA_OPTION_INDEXER_SCORES_BUDGET, &sbud));
    TC_OK(dsa_context_get_option(x, DSA_OPTION_INDEXER_LOGITS_BUDGET, &lbud));
    lay_case c;
    lay_make(&c, tk, nq, qs, h, k);
    int64_t total[2], chunk[2];
    for (int fused = 0; fused < 2; ++fused) TC_OK(dsa_indexer_layout(x, &c.p, fused, &total[fused], &chunk[fused]));
    cr_assert_eq(chunk[0], chunk[1], "case %d: the engines chunk the queries differently", it);
    /* a chunk of n queries sees at most min(T_k, max_seqlen_k - 1 + n) keys (src/indexer.c) */
    const int64_t msk = c.p.plan->max_seqlen_k > 0 && c.p.plan->max_seqlen_k < tk ? c.p.plan->max_seqlen_k : tk;
    const int64_t cq = chunk[0], w = tk < msk - 1 + cq ? tk : msk - 1 + cq;
    const int64_t ld = round_up(w, 4);
    if (c.scored == 0) {
      cr_assert_eq(cq, 0, "case %d: nothing is scored, yet %lld queries per chunk", it, (long long)cq);
      cr_assert_eq(total[1], 1, "case %d: nothing is scored, yet %lld B", it, (long long)total[1]);
    } else {
      /* a chunk (of at most 65535 queries) whose rows of its widest window fit, and at least as many
       * rows as fit at T_k columns */
      cr_assert(cq >= 1 && cq <= c.scored && cq <= 65535, "case %d: %lld queries per chunk of %lld scored", it,
                (long long)cq, (long long)c.scored);
      cr_assert(cq == 1 || cq * w * 4 <= sbud, "case %d (T_k %lld): %lld rows of %lld exceed the %lld B budget", it,
                (long long)tk, (long long)cq, (long long)w, (long long)sbud);
      int64_t floor_rows = sbud / (4 * tk); /* rows of T_k columns: a window is never wider */
      floor_rows = floor_rows < 1 ? 1 : floor_rows > 65535 ? 65535 : floor_rows;
      cr_assert(cq >= (c.scored < floor_rows ? c.scored : floor_rows),
                "case %d (T_k %lld): %lld rows per chunk, %lld rows of T_k columns fit %lld B", it, (long long)tk,
                (long long)cq, (long long)floor_rows, (long long)sbud);
      multi += cq < c.scored;
      /* fused: the scores (rows padded to 4 columns) and 512 B of alignment at most; cuBLAS: plus
       * the logits (within their budget unless one query's row alone exceeds it) and the packed q */
      cr_assert(total[1] >= 1 && total[1] <= cq * ld * 4 + 512, "case %d: fused %lld B for %lld rows of %lld", it,
                (long long)total[1], (long long)cq, (long long)ld);
      const int64_t one_row = (int64_t)h * 4 * round_up(w < 32768 ? w : 32768, 4); /* a 1-query GEMM, widest tile */
      cr_assert(total[0] >= total[1] && total[0] <= total[1] + (lbud > one_row ? lbud : one_row) + 512,
                "case %d: cuBLAS %lld B, fused %lld B, logits budget %lld B", it, (long long)total[0],
                (long long)total[1], (long long)lbud);
    }
    if (!own_budgets) /* the size query without a context: a context with the default budgets */
      for (int fused = 0; fused < 2; ++fused) {
        size_t b = 0;
        dsa_indexer_params q = c.p;
        q.engine = fused ? DSA_INDEXER_ENGINE_FUSED : DSA_INDEXER_ENGINE_CUBLAS;
        TC_OK(dsa_indexer_topk(NULL, &q, NULL, &b, 0));
        cr_assert_eq((int64_t)b, total[fused], "case %d, engine %d: the context-free size %zu, a context's %lld", it,
                     fused, b, (long long)total[fused]);
        q.engine = DSA_INDEXER_ENGINE_DEFAULT; /* either engine: the cuBLAS size */
        TC_OK(dsa_indexer_topk(NULL, &q, NULL, &b, 0));
        cr_assert_eq((int64_t)b, total[0], "case %d: DEFAULT's context-free size %zu, cuBLAS's %lld", it, b,
                     (long long)total[0]);
      }
    dsa_plan_destroy(c.plan);
    dsa_context_destroy(x);
  }
  cr_assert(multi > 0, "no random case took more than one chunk: the budget bound went untested");
}
