/* test_basic.c - version, status strings, bf16 conversions, and context creation without a device. */
#include "test_common.h"

Test(basic, version) {
  cr_assert_str_eq(dsa_version_string(), "0.1.0");
  cr_assert_eq(dsa_version_number(), DSA_VERSION_NUMBER);
}

Test(basic, status_strings_are_distinct_and_pinned) {
  cr_assert_eq(DSA_SUCCESS, 0);
  cr_assert_eq(DSA_ERROR_INVALID_ARGUMENT, 1);
  cr_assert_eq(DSA_ERROR_UNSUPPORTED, 2);
  cr_assert_eq(DSA_ERROR_WORKSPACE_TOO_SMALL, 3);
  cr_assert_eq(DSA_ERROR_CUDA, 4);
  cr_assert_eq(DSA_ERROR_CUBLAS, 5);
  cr_assert_eq(DSA_ERROR_NO_DEVICE, 6);
  cr_assert_eq(DSA_ERROR_OUT_OF_HOST_MEMORY, 7);
  for (int a = 0; a < DSA_STATUS_COUNT_; ++a)
    for (int b = a + 1; b < DSA_STATUS_COUNT_; ++b)
      cr_assert_str_neq(dsa_status_string((dsa_status)a), dsa_status_string((dsa_status)b));
  cr_assert_str_eq(dsa_status_string((dsa_status)99), "unknown status");
}

Test(basic, bf16_round_to_nearest_even) {
  cr_assert_eq(dsa_f32_to_bf16(1.0f), 0x3F80);
  cr_assert_eq(dsa_f32_to_bf16(-2.0f), 0xC000);
  /* 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1.0 */
  cr_assert_eq(dsa_f32_to_bf16(1.00390625f), 0x3F80);
  /* 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> rounds up */
  cr_assert_eq(dsa_f32_to_bf16(1.01171875f), 0x3F82);
  cr_assert_eq(dsa_f32_to_bf16(INFINITY), 0x7F80);
  cr_assert_eq(dsa_f32_to_bf16(-INFINITY), 0xFF80);
  cr_assert(isnan(dsa_bf16_to_f32(dsa_f32_to_bf16(nanf("")))));
  cr_assert_eq(dsa_bf16_to_f32(0x3FC0), 1.5f);
  /* the largest finite float rounds to +inf in bf16 */
  cr_assert_eq(dsa_f32_to_bf16(3.4028235e38f), 0x7F80);
}

Test(basic, context_create_without_device_or_bad_args) {
  dsa_context *ctx = (dsa_context *)0x1;
  cr_assert_eq(dsa_context_create(NULL, 0), DSA_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(dsa_last_error_message(), "ctx") != NULL);
  if (!tc_have_gpu()) {
    cr_assert_eq(dsa_context_create(&ctx, 0), DSA_ERROR_NO_DEVICE);
    cr_assert_null(ctx);
  } else {
    cr_assert_eq(dsa_context_create(&ctx, -1), DSA_ERROR_INVALID_ARGUMENT);
    cr_assert_null(ctx);
    cr_assert_eq(dsa_context_create(&ctx, 1 << 20), DSA_ERROR_INVALID_ARGUMENT);
    TC_OK(dsa_context_create(&ctx, 0));
    int major = 0, minor = 0, sms = 0;
    TC_OK(dsa_context_device_info(ctx, &major, &minor, &sms));
    cr_assert(major >= 1 && sms >= 1);
    dsa_context_destroy(ctx);
  }
  dsa_context_destroy(NULL);
}
