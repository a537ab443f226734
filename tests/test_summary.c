/* test_summary.c - one line after Criterion's "Synthesis" line that counts what the synthesis leaves
 * out: the tests that skipped (the GPU suites skip through TC_REQUIRE_GPU without a CUDA device,
 * some tests skip under compute-sanitizer). On stderr:
 *
 *   Criterion: 124 passed, 0 failed, 130 skipped (without a CUDA device)
 *
 * It only reports: the exit status stays Criterion's (non-zero iff a test failed or crashed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include "test_common.h"

static size_t n_passed, n_failed, n_crashed, n_skipped, n_no_gpu, n_unselected;

/* At exit, so that the line follows the synthesis (Criterion logs it after the POST_ALL hooks). */
static void print_summary(void) {
  fprintf(stderr, "Criterion: %zu passed, %zu failed", n_passed, n_failed);
  if (n_crashed > 0) fprintf(stderr, " (%zu of them crashed)", n_crashed);
  fprintf(stderr, ", %zu skipped", n_skipped);
  if (n_skipped > 0 && n_no_gpu == n_skipped)
    fprintf(stderr, " (without a CUDA device)");
  else if (n_skipped > 0)
    fprintf(stderr, " (%zu without a CUDA device, %zu for other reasons)", n_no_gpu, n_skipped - n_no_gpu);
  if (n_unselected > 0) fprintf(stderr, "; the tests --filter left out are not counted");
  fprintf(stderr, "\n");
}

/* Runs once, in the runner process, after the last test. Criterion counts the tests that --filter
 * leaves out as skipped too (a parameterized test once, not once per parameter): they are the
 * disabled ones here, and the line leaves them out. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
  for (struct criterion_suite_stats *s = stats->suites; s != NULL; s = s->next)
    for (struct criterion_test_stats *t = s->tests; t != NULL; t = t->next) {
      if (t->test_status != CR_STATUS_SKIPPED) continue;
      if (t->test->data->disabled) {
        ++n_unselected;
        continue;
      }
      ++n_skipped;
      n_no_gpu += t->message != NULL && strncmp(t->message, TC_NO_GPU_SKIP, strlen(TC_NO_GPU_SKIP)) == 0;
    }
  n_passed = stats->tests_passed, n_failed = stats->tests_failed, n_crashed = stats->tests_crashed;
  atexit(print_summary);
}
