/* test_fwd_dispatch.c - CPU suite fwd_dispatch: host-side choices of the sm_90a forward that do not
 * need a GPU to check.
 *  - dsa_fwd_kv_evict_last (cuda/attn_fwd/dispatch.cu): the KV gather's L2 policy per launch from the context's
 *    DSA_OPTION_FWD_KV_L2_HINT: NONE never, EVICT_LAST always (the default), IF_FITS when
 *    num_kv x kv_stride x 2 bytes fit half the device's L2 (boundary included). The context is a
 *    device-free one (dsa_testing_context: options at their defaults), set through the public
 *    dsa_context_set_option. */
#include "test_common.h"
#include "dsa_testing.h"

Test(fwd_dispatch, kv_l2_policy_rule) {
  dsa_context *ctx = dsa_testing_context(50 * 1024 * 1024); /* an H200's 50 MiB of L2 */
  cr_assert_not_null(ctx);
  dsa_attn_fwd_params p;
  memset(&p, 0, sizeof p);
  p.kv_stride = 576;
  int64_t def = -1;
  TC_OK(dsa_context_get_option(ctx, DSA_OPTION_FWD_KV_L2_HINT, &def));
  cr_assert_eq(def, DSA_FWD_KV_L2_EVICT_LAST, "the default is evict_last always");
  /* exactly half the L2: 25 MiB = num_kv x 1152 B */
  const int64_t half_rows = (int64_t)(25 * 1024 * 1024) / 1152;
  const struct { int hint; int64_t num_kv; int want; } cases[] = {
      {DSA_FWD_KV_L2_NONE, 1, 0},          {DSA_FWD_KV_L2_NONE, 1 << 20, 0},
      {DSA_FWD_KV_L2_EVICT_LAST, 1, 1},    {DSA_FWD_KV_L2_EVICT_LAST, 1 << 20, 1},
      {DSA_FWD_KV_L2_IF_FITS, 8192, 1},    {DSA_FWD_KV_L2_IF_FITS, half_rows, 1},
      {DSA_FWD_KV_L2_IF_FITS, half_rows + 1, 0}, {DSA_FWD_KV_L2_IF_FITS, 131072, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    TC_SET_OPTION(ctx, DSA_OPTION_FWD_KV_L2_HINT, cases[i].hint);
    p.num_kv = cases[i].num_kv;
    const int got = dsa_fwd_kv_evict_last(ctx, &p);
    cr_assert_eq(got, cases[i].want, "hint %d, num_kv %lld: got %d, want %d", cases[i].hint,
                 (long long)cases[i].num_kv, got, cases[i].want);
  }
  /* 25 MiB is 22755.55 rows of 1152 B: the boundary row count itself fits, one more does not */
  cr_assert_eq(half_rows, 22755);
  dsa_context_destroy(ctx);
}
