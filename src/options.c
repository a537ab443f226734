/* options.c - the per-context tuning options of include/dsa_tune.h: their ranges and defaults, and
 * dsa_context_set_option / dsa_context_get_option. The launchers read ctx->options[opt]. */
#include "internal.h"

/* One row per option id: name, allowed range, default (the automatic choices of the ops). */
typedef struct {
  const char *name;
  int64_t lo, hi, def;
} option_row;

static const option_row option_table[DSA_OPTION_COUNT] = {
    [DSA_OPTION_FWD_KERNEL] = {"DSA_OPTION_FWD_KERNEL", DSA_FWD_KERNEL_AUTO, DSA_FWD_KERNEL_SM90_SPLIT,
                               DSA_FWD_KERNEL_AUTO},
    [DSA_OPTION_FWD_SM90_HANDOFF] = {"DSA_OPTION_FWD_SM90_HANDOFF", DSA_FWD_HANDOFF_NAMED_BARRIER,
                                     DSA_FWD_HANDOFF_MBARRIER, DSA_FWD_HANDOFF_NAMED_BARRIER},
    [DSA_OPTION_FWD_KV_L2_HINT] = {"DSA_OPTION_FWD_KV_L2_HINT", DSA_FWD_KV_L2_NONE, DSA_FWD_KV_L2_IF_FITS,
                                   DSA_FWD_KV_L2_EVICT_LAST},
    [DSA_OPTION_FWD_SMALL_AUTO_MAX] = {"DSA_OPTION_FWD_SMALL_AUTO_MAX", 0, 63, 56},
    [DSA_OPTION_BWD_KERNEL] = {"DSA_OPTION_BWD_KERNEL", DSA_BWD_KERNEL_AUTO, DSA_BWD_KERNEL_SM90_WS,
                               DSA_BWD_KERNEL_AUTO},
    [DSA_OPTION_BWD_DET_CHUNK_TOKENS] = {"DSA_OPTION_BWD_DET_CHUNK_TOKENS", 0, INT32_MAX, 0},
    [DSA_OPTION_TOPK_KERNEL] = {"DSA_OPTION_TOPK_KERNEL", DSA_TOPK_KERNEL_AUTO, DSA_TOPK_KERNEL_FILTER,
                                DSA_TOPK_KERNEL_AUTO},
    [DSA_OPTION_TOPK_COMPACT_LONG_ROWS] = {"DSA_OPTION_TOPK_COMPACT_LONG_ROWS", 0, 1, 1},
    [DSA_OPTION_INDEXER_FUSED_KERNEL] = {"DSA_OPTION_INDEXER_FUSED_KERNEL", DSA_INDEXER_FUSED_AUTO,
                                         DSA_INDEXER_FUSED_WGMMA, DSA_INDEXER_FUSED_AUTO},
    [DSA_OPTION_INDEXER_SCORES_BUDGET] = {"DSA_OPTION_INDEXER_SCORES_BUDGET", 1, (int64_t)1 << 62,
                                          (int64_t)256 << 20},
    [DSA_OPTION_INDEXER_LOGITS_BUDGET] = {"DSA_OPTION_INDEXER_LOGITS_BUDGET", 1, (int64_t)1 << 62,
                                          (int64_t)64 << 20},
    [DSA_OPTION_INDEXER_KEY_TILE] = {"DSA_OPTION_INDEXER_KEY_TILE", 1, (int64_t)1 << 30, 32768},
    [DSA_OPTION_TRAIN_KERNEL] = {"DSA_OPTION_TRAIN_KERNEL", DSA_TRAIN_KERNEL_AUTO,
                                       DSA_TRAIN_KERNEL_SM90, DSA_TRAIN_KERNEL_AUTO},
};

/* Ids 1 .. DSA_OPTION_COUNT - 1 have a row (every row has a name). */
static const option_row *option_find(int opt) {
  if (opt < 1 || opt >= DSA_OPTION_COUNT || option_table[opt].name == NULL) return NULL;
  return &option_table[opt];
}

int64_t dsa_option_default(int opt) {
  const option_row *r = option_find(opt);
  return r ? r->def : 0;
}

void dsa_context_options_init(dsa_context *ctx) {
  for (int i = 0; i < DSA_OPTION_COUNT; ++i) ctx->options[i] = option_find(i) ? option_table[i].def : 0;
}

DSA_API dsa_status dsa_context_set_option(dsa_context *ctx, dsa_option opt, int64_t value) {
  static const char fn[] = "dsa_context_set_option";
  const option_row *r = option_find((int)opt);
  DSA_REQUIRE(r != NULL, "%s: opt = %d is not an option (dsa_tune.h: 1..%d)", fn, (int)opt,
              DSA_OPTION_COUNT - 1);
  DSA_REQUIRE(value >= r->lo && value <= r->hi, "%s: value = %lld for %s is outside %lld..%lld", fn,
              (long long)value, r->name, (long long)r->lo, (long long)r->hi);
  DSA_REQUIRE(ctx != NULL, "%s: ctx is NULL", fn);
  ctx->options[opt] = value;
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_context_get_option(const dsa_context *ctx, dsa_option opt, int64_t *value) {
  static const char fn[] = "dsa_context_get_option";
  DSA_REQUIRE(option_find((int)opt) != NULL, "%s: opt = %d is not an option (dsa_tune.h: 1..%d)", fn, (int)opt,
              DSA_OPTION_COUNT - 1);
  DSA_REQUIRE(value != NULL, "%s: value is NULL", fn);
  DSA_REQUIRE(ctx != NULL, "%s: ctx is NULL", fn);
  *value = ctx->options[opt];
  return DSA_SUCCESS;
}
