/* test_fwd_dispatch.c - CPU suite fwd_dispatch: host-side choices of the sm_90a forward that do not
 * need a GPU to check.
 *  - dsa_fwd_kv_evict_last (src/attn_fwd.c): the KV gather's L2 policy per launch from
 *    dsa_attn_fwd_kv_l2_hint: 0 never, 1 always (the default), 2 when num_kv x kv_stride x 2 bytes fit
 *    half the device's L2 (boundary included), any other value never. */
#include "test_common.h"
#include "internal.h"

Test(fwd_dispatch, kv_l2_policy_rule) {
  struct dsa_context ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.l2_bytes = 50 * 1024 * 1024; /* an H200's 50 MiB */
  dsa_attn_fwd_params p;
  memset(&p, 0, sizeof p);
  p.kv_stride = 576;
  const int saved = dsa_attn_fwd_kv_l2_hint;
  cr_assert_eq(saved, 1, "the default is 1 (evict_last always), as measured in session 5 run 10");
  /* exactly half the L2: 25 MiB = num_kv x 1152 B */
  const int64_t half_rows = (int64_t)(25 * 1024 * 1024) / 1152;
  const struct { int hint; int64_t num_kv; int want; } cases[] = {
      {0, 1, 0},          {0, 1 << 20, 0},          {1, 1, 1},        {1, 1 << 20, 1},
      {2, 8192, 1},       {2, half_rows, 1},        {2, half_rows + 1, 0},
      {2, 131072, 0},     {3, 1, 0},                {-1, 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    dsa_attn_fwd_kv_l2_hint = cases[i].hint;
    p.num_kv = cases[i].num_kv;
    const int got = dsa_fwd_kv_evict_last(&ctx, &p);
    dsa_attn_fwd_kv_l2_hint = saved;
    cr_assert_eq(got, cases[i].want, "hint %d, num_kv %lld: got %d, want %d", cases[i].hint,
                 (long long)cases[i].num_kv, got, cases[i].want);
  }
  /* 25 MiB is 22755.55 rows of 1152 B: the boundary row count itself fits, one more does not */
  cr_assert_eq(half_rows, 22755);
}
