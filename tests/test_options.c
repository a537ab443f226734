/* test_options.c - the tuning options of include/dsa_tune.h.
 * CPU suite options: dsa_context_set_option / dsa_context_get_option check opt, then value, then ctx
 * (dsa_tune.h), so every rejection is testable without a device: with ctx = NULL, an unknown option
 * or an out-of-range value is reported as such (the message names it and the allowed range), and a
 * valid one reaches the ctx check. Defaults, round trips and "a rejected set changes nothing" run on
 * a device-free context (dsa_testing_context: the options as dsa_context_create sets them up).
 * GPU suite gpu_options: the same defaults on a context from dsa_context_create, independent
 * per context, and the zero-size ops accept every kernel choice. */
#include <limits.h>
#include "test_common.h"
#include "dsa_testing.h" /* the device-free context */

/* Every option with its range and default, as documented in include/dsa_tune.h. */
static const struct {
  dsa_option opt;
  int64_t lo, hi, def;
} kOptions[] = {
    {DSA_OPTION_FWD_KERNEL, 0, 4, DSA_FWD_KERNEL_AUTO},
    {DSA_OPTION_FWD_SM90_HANDOFF, 0, 1, DSA_FWD_HANDOFF_NAMED_BARRIER},
    {DSA_OPTION_FWD_KV_L2_HINT, 0, 2, DSA_FWD_KV_L2_EVICT_LAST},
    {DSA_OPTION_FWD_SMALL_AUTO_MAX, 0, 63, 56},
    {DSA_OPTION_BWD_KERNEL, 0, 4, DSA_BWD_KERNEL_AUTO},
    {DSA_OPTION_BWD_DET_CHUNK_TOKENS, 0, INT32_MAX, 0},
    {DSA_OPTION_TOPK_KERNEL, 0, 2, DSA_TOPK_KERNEL_AUTO},
    {DSA_OPTION_TOPK_COMPACT_LONG_ROWS, 0, 1, 1},
    {DSA_OPTION_INDEXER_FUSED_KERNEL, 0, 2, DSA_INDEXER_FUSED_AUTO},
    {DSA_OPTION_INDEXER_SCORES_BUDGET, 1, (int64_t)1 << 62, (int64_t)256 << 20},
    {DSA_OPTION_INDEXER_LOGITS_BUDGET, 1, (int64_t)1 << 62, (int64_t)64 << 20},
    {DSA_OPTION_INDEXER_KEY_TILE, 1, (int64_t)1 << 30, 32768},
    {DSA_OPTION_TRAIN_KERNEL, 0, 2, DSA_TRAIN_KERNEL_AUTO},
};
#define NOPT (sizeof kOptions / sizeof kOptions[0])

static dsa_context *device_free_context(void) {
  dsa_context *ctx = dsa_testing_context(0);
  cr_assert_not_null(ctx);
  return ctx;
}

Test(options, ids_are_pinned) {
  /* the values are ABI: they must never change meaning */
  cr_assert_eq(DSA_OPTION_FWD_KERNEL, 1);
  cr_assert_eq(DSA_OPTION_FWD_SM90_HANDOFF, 2);
  cr_assert_eq(DSA_OPTION_FWD_KV_L2_HINT, 3);
  cr_assert_eq(DSA_OPTION_FWD_SMALL_AUTO_MAX, 4);
  cr_assert_eq(DSA_OPTION_BWD_KERNEL, 5);
  cr_assert_eq(DSA_OPTION_BWD_DET_CHUNK_TOKENS, 6);
  cr_assert_eq(DSA_OPTION_TOPK_KERNEL, 7);
  cr_assert_eq(DSA_OPTION_TOPK_COMPACT_LONG_ROWS, 8);
  cr_assert_eq(DSA_OPTION_INDEXER_FUSED_KERNEL, 9);
  cr_assert_eq(DSA_OPTION_INDEXER_SCORES_BUDGET, 10);
  cr_assert_eq(DSA_OPTION_INDEXER_LOGITS_BUDGET, 11);
  cr_assert_eq(DSA_OPTION_INDEXER_KEY_TILE, 12);
  cr_assert_eq(DSA_OPTION_TRAIN_KERNEL, 13);
  cr_assert_eq(DSA_TRAIN_KERNEL_SM90, 2);
  cr_assert_eq(NOPT, DSA_OPTION_COUNT - 1, "every option id has a row in this test");
  cr_assert_eq(DSA_FWD_KERNEL_SM90_SPLIT, 4);
  cr_assert_eq(DSA_BWD_KERNEL_SM90_SMALL, 3);
  cr_assert_eq(DSA_BWD_KERNEL_SM90_WS, 4);
  cr_assert_eq(DSA_TOPK_KERNEL_FILTER, 2);
  cr_assert_eq(DSA_INDEXER_FUSED_WGMMA, 2);
  cr_assert_eq(DSA_FWD_HANDOFF_MBARRIER, 1);
  cr_assert_eq(DSA_FWD_KV_L2_IF_FITS, 2);
}

Test(options, unknown_option_rejected) {
  static const int bad[] = {0, -1, DSA_OPTION_COUNT, 100, INT_MAX, INT_MIN};
  dsa_context *ctx = device_free_context();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    int64_t v = 12345;
    TC_FAILS(dsa_context_set_option(ctx, (dsa_option)bad[i], 0), DSA_ERROR_INVALID_ARGUMENT, "opt =");
    TC_FAILS(dsa_context_set_option(NULL, (dsa_option)bad[i], 0), DSA_ERROR_INVALID_ARGUMENT, "opt =");
    TC_FAILS(dsa_context_get_option(ctx, (dsa_option)bad[i], &v), DSA_ERROR_INVALID_ARGUMENT, "opt =");
    TC_FAILS(dsa_context_get_option(NULL, (dsa_option)bad[i], NULL), DSA_ERROR_INVALID_ARGUMENT, "opt =");
    cr_assert_eq(v, 12345, "a rejected get wrote its value");
  }
  dsa_context_destroy(ctx);
}

Test(options, out_of_range_values_rejected_without_a_context) {
  for (size_t i = 0; i < NOPT; ++i) {
    const int64_t below = kOptions[i].lo - 1, above = kOptions[i].hi + 1;
    char range[64];
    snprintf(range, sizeof range, "outside %lld..%lld", (long long)kOptions[i].lo, (long long)kOptions[i].hi);
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, below), DSA_ERROR_INVALID_ARGUMENT, range);
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, above), DSA_ERROR_INVALID_ARGUMENT, range);
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, INT64_MIN), DSA_ERROR_INVALID_ARGUMENT, "value =");
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, INT64_MAX), DSA_ERROR_INVALID_ARGUMENT, "value =");
    /* in-range values pass the value check and stop at the NULL context */
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, kOptions[i].lo), DSA_ERROR_INVALID_ARGUMENT, "ctx");
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, kOptions[i].hi), DSA_ERROR_INVALID_ARGUMENT, "ctx");
    TC_FAILS(dsa_context_set_option(NULL, kOptions[i].opt, kOptions[i].def), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  }
  /* the message names the option */
  TC_FAILS(dsa_context_set_option(NULL, DSA_OPTION_TOPK_KERNEL, 3), DSA_ERROR_INVALID_ARGUMENT,
           "DSA_OPTION_TOPK_KERNEL");
}

Test(options, get_checks_its_arguments) {
  int64_t v = 0;
  TC_FAILS(dsa_context_get_option(NULL, DSA_OPTION_FWD_KERNEL, &v), DSA_ERROR_INVALID_ARGUMENT, "ctx");
  TC_FAILS(dsa_context_get_option(NULL, DSA_OPTION_FWD_KERNEL, NULL), DSA_ERROR_INVALID_ARGUMENT, "value");
  dsa_context *ctx = device_free_context();
  TC_FAILS(dsa_context_get_option(ctx, DSA_OPTION_FWD_KERNEL, NULL), DSA_ERROR_INVALID_ARGUMENT, "value");
  dsa_context_destroy(ctx);
}

Test(options, defaults_round_trip_and_rejected_sets) {
  dsa_context *ctx = device_free_context();
  for (size_t i = 0; i < NOPT; ++i) {
    const dsa_option o = kOptions[i].opt;
    int64_t v = -7;
    TC_OK(dsa_context_get_option(ctx, o, &v));
    cr_assert_eq(v, kOptions[i].def, "option %d: default %lld, documented %lld", (int)o, (long long)v,
                 (long long)kOptions[i].def);
    const int64_t vals[] = {kOptions[i].lo, kOptions[i].hi, kOptions[i].def};
    for (size_t j = 0; j < 3; ++j) {
      TC_OK(dsa_context_set_option(ctx, o, vals[j]));
      TC_OK(dsa_context_get_option(ctx, o, &v));
      cr_assert_eq(v, vals[j], "option %d: set %lld, got %lld", (int)o, (long long)vals[j], (long long)v);
      /* a rejected set leaves the value as it was */
      TC_FAILS(dsa_context_set_option(ctx, o, kOptions[i].hi + 1), DSA_ERROR_INVALID_ARGUMENT, "outside");
      TC_OK(dsa_context_get_option(ctx, o, &v));
      cr_assert_eq(v, vals[j], "option %d: a rejected set changed the value to %lld", (int)o, (long long)v);
    }
  }
  /* options are independent of each other */
  dsa_context *other = device_free_context();
  TC_OK(dsa_context_set_option(ctx, DSA_OPTION_TOPK_KERNEL, DSA_TOPK_KERNEL_RADIX));
  for (size_t i = 0; i < NOPT; ++i) {
    int64_t v;
    TC_OK(dsa_context_get_option(other, kOptions[i].opt, &v));
    cr_assert_eq(v, kOptions[i].def);
  }
  dsa_context_destroy(other);
  dsa_context_destroy(ctx);
}

/* ---- with a device ---- */
Test(gpu_options, defaults_on_a_real_context_and_per_context) {
  TC_REQUIRE_GPU();
  dsa_context *a = NULL, *b = NULL;
  TC_OK(dsa_context_create(&a, 0));
  TC_OK(dsa_context_create(&b, 0));
  for (size_t i = 0; i < NOPT; ++i) {
    int64_t v;
    TC_OK(dsa_context_get_option(a, kOptions[i].opt, &v));
    cr_assert_eq(v, kOptions[i].def, "option %d: default %lld on a new context", (int)kOptions[i].opt,
                 (long long)v);
  }
  TC_OK(dsa_context_set_option(a, DSA_OPTION_FWD_KERNEL, DSA_FWD_KERNEL_PORTABLE));
  int64_t va, vb;
  TC_OK(dsa_context_get_option(a, DSA_OPTION_FWD_KERNEL, &va));
  TC_OK(dsa_context_get_option(b, DSA_OPTION_FWD_KERNEL, &vb));
  cr_assert_eq(va, DSA_FWD_KERNEL_PORTABLE);
  cr_assert_eq(vb, DSA_FWD_KERNEL_AUTO, "options are per context");
  /* zero-size work succeeds under every kernel choice */
  dsa_attn_fwd_params z = {.num_tokens = 0, .num_heads = 8, .head_dim = 576, .num_kv = 0, .topk = 16,
                           .softmax_scale = 1.0f};
  for (int k = DSA_FWD_KERNEL_AUTO; k <= DSA_FWD_KERNEL_SM90_SPLIT; ++k) {
    TC_SET_OPTION(a, DSA_OPTION_FWD_KERNEL, k);
    TC_OK(dsa_sparse_attn_fwd(a, &z, 0));
  }
  dsa_context_destroy(a);
  dsa_context_destroy(b);
}
