/* test_device.c - contract section 13.4 (a device this build has no code for) and 13.2 (size
 * queries with and without a context).
 *  - suite `device` (CPU): the mapping from the device-code probe's CUDA error to a status and a
 *    message naming the device, its compute capability and the build's targets.
 *  - suite `gpu_device` (needs a GPU): the probe finds code for the device the tests run on, and
 *    every size query gives the same answer with ctx = NULL as with a context (the indexer's
 *    DEFAULT engine: at least the context's answer). */
#include "test_common.h"
#include "dsa_testing.h" /* the device-code probe (hidden; the tests link the static library) */

Test(device, targets_are_known) {
  const char *t = dsa_device_code_targets();
  cr_assert(t != NULL && t[0] != '\0' && strcmp(t, "unknown") != 0, "targets \"%s\"", t ? t : "(null)");
}

Test(device, no_code_for_the_device_is_unsupported) {
  const dsa_status s = dsa_device_code_status((int)cudaErrorNoKernelImageForDevice, 1, "Some GPU", 8, 0);
  cr_assert_eq(s, DSA_ERROR_UNSUPPORTED, "status %d", (int)s);
  const char *m = dsa_last_error_message();
  cr_assert(strncmp(m, "dsa_context_create: ", 20) == 0, "%s", m);
  cr_assert(strstr(m, "device 1 (Some GPU)") != NULL, "%s", m);
  cr_assert(strstr(m, "compute capability 8.0") != NULL, "%s", m);
  cr_assert(strstr(m, "no device code") != NULL, "%s", m);
  cr_assert(strstr(m, dsa_device_code_targets()) != NULL, "%s", m);
  TC_FAILS(dsa_device_code_status((int)cudaErrorInvalidDeviceFunction, 0, "X", 7, 5),
           DSA_ERROR_UNSUPPORTED, "compute capability 7.5");
}

Test(device, driver_that_cannot_jit_is_unsupported) {
  TC_FAILS(dsa_device_code_status((int)cudaErrorUnsupportedPtxVersion, 0, "New GPU", 12, 0),
           DSA_ERROR_UNSUPPORTED, "driver cannot compile it");
  TC_FAILS(dsa_device_code_status((int)cudaErrorJitCompilerNotFound, 0, "New GPU", 12, 0),
           DSA_ERROR_UNSUPPORTED, "compute capability 12.0");
}

Test(device, other_errors_and_success) {
  TC_OK(dsa_device_code_status((int)cudaSuccess, 0, "H200", 9, 0));
  TC_FAILS(dsa_device_code_status((int)cudaErrorMemoryAllocation, 0, "H200", 9, 0), DSA_ERROR_CUDA,
           "dsa_context_create");
}

Test(gpu_device, this_device_has_code) {
  TC_REQUIRE_GPU();
  dsa_context *ctx = NULL;
  TC_OK(dsa_context_create(&ctx, 0));
  cr_assert_eq(dsa_device_code_probe(), (int)cudaSuccess);
  dsa_context_destroy(ctx);
}

/* Contract section 13.2 on a real device: ctx = NULL answers like a context (top-k, the indexer's
 * explicit engines, the backward in both modes); DEFAULT without a context is the cuBLAS size,
 * at least the device's DEFAULT size. */
Test(gpu_device, size_queries_match_with_and_without_context) {
  TC_REQUIRE_GPU();
  dsa_context *ctx = NULL;
  TC_OK(dsa_context_create(&ctx, 0));
  size_t a = 0, b = 0;
  /* top-k */
  dsa_topk_params tp = {0};
  tp.rows = 64, tp.columns = 5000, tp.k = 100;
  tp.scores = (const float *)(uintptr_t)0x10000000; /* never read by a size query */
  tp.indices = (int32_t *)(uintptr_t)0x20000000;
  TC_OK(dsa_topk(NULL, &tp, NULL, &a, 0));
  TC_OK(dsa_topk(ctx, &tp, NULL, &b, 0));
  cr_assert_eq(a, b, "top-k: %zu without a context, %zu with", a, b);
  /* indexer over a real plan: one causal document of 6000 tokens, K = 100 (so queries score) */
  const int32_t cu[2] = {0, 6000};
  dsa_plan_desc d = {cu, NULL, 1, 6000, 0, -1, NULL, 0};
  dsa_plan *plan = NULL;
  TC_OK(dsa_plan_create(&d, &plan));
  dsa_indexer_params ip = {0};
  ip.plan = dsa_plan_host_view(plan); /* only the scalars and pointer presence matter here */
  ip.num_heads = 32, ip.topk = 100, ip.weights_dtype = DSA_DTYPE_F32;
  ip.index_q = (const uint16_t *)(uintptr_t)0x10000000;
  ip.index_k = (const uint16_t *)(uintptr_t)0x10000000;
  ip.weights = (const void *)(uintptr_t)0x10000000;
  ip.indices = (int32_t *)(uintptr_t)0x800000000ull;
  ip.lengths = (int32_t *)(uintptr_t)0x900000000ull;
  const dsa_indexer_engine engines[2] = {DSA_INDEXER_ENGINE_CUBLAS, DSA_INDEXER_ENGINE_FUSED};
  size_t cublas_null = 0;
  for (int e = 0; e < 2; ++e) {
    ip.engine = engines[e];
    TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &a, 0));
    TC_OK(dsa_indexer_topk(ctx, &ip, NULL, &b, 0));
    cr_assert_eq(a, b, "indexer engine %d: %zu without a context, %zu with", (int)engines[e], a, b);
    if (e == 0) cublas_null = a;
  }
  ip.engine = DSA_INDEXER_ENGINE_DEFAULT;
  TC_OK(dsa_indexer_topk(NULL, &ip, NULL, &a, 0));
  TC_OK(dsa_indexer_topk(ctx, &ip, NULL, &b, 0));
  cr_assert(a == cublas_null && a >= b, "indexer DEFAULT: %zu without a context, %zu with (cuBLAS %zu)",
            a, b, cublas_null);
  dsa_plan_destroy(plan);
  /* backward, both modes */
  dsa_attn_bwd_params bp = {0};
  bp.num_tokens = 256, bp.num_heads = 16, bp.head_dim = 576, bp.num_kv = 1024, bp.topk = 64;
  bp.softmax_scale = 0.0625f;
  bp.q = bp.kv = bp.out = bp.dout = (const uint16_t *)(uintptr_t)0x10000000;
  bp.indices = (const int32_t *)(uintptr_t)0x10000000;
  bp.lse = (const float *)(uintptr_t)0x10000000;
  bp.dq = (uint16_t *)(uintptr_t)0x800000000ull;
  bp.dkv = (uint16_t *)(uintptr_t)0x900000000ull;
  for (int det = 0; det < 2; ++det) {
    bp.deterministic = det;
    TC_OK(dsa_sparse_attn_bwd(NULL, &bp, NULL, &a, 0));
    TC_OK(dsa_sparse_attn_bwd(ctx, &bp, NULL, &b, 0));
    cr_assert_eq(a, b, "backward det %d: %zu without a context, %zu with", det, a, b);
  }
  dsa_context_destroy(ctx);
}
