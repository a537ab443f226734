/* test_examples.c - runs the programs of examples/ (built by `make examples`, which `make test` does
 * first) and checks their exit status and output. The binaries are found beside the test binary's
 * build folder: <build>/tests/dsa_tests -> <build>/examples/<name> (also for the ASan binary,
 * <build>/asan/dsa_tests); DSA_EXAMPLES_DIR overrides. Suite examples: train_step's CPU half
 * (train_step --cpu), on every machine. Suite gpu_examples: the whole of train_step; needs a GPU,
 * skipped under compute-sanitizer (the example's kernels are the other suites'). */
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test_common.h"

/* <dir of the test binary>/../examples/<name>, or $DSA_EXAMPLES_DIR/<name>. */
static void example_path(const char *name, char *out, size_t n) {
  const char *env = getenv("DSA_EXAMPLES_DIR");
  if (env != NULL && env[0] != '\0') {
    const int w = snprintf(out, n, "%s/%s", env, name);
    cr_assert(w > 0 && (size_t)w < n, "DSA_EXAMPLES_DIR is too long");
    return;
  }
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  cr_assert(len > 0, "readlink /proc/self/exe failed");
  self[len] = '\0';
  char *slash = strrchr(self, '/');
  if (slash != NULL) *slash = '\0'; /* <build>/tests */
  slash = strrchr(self, '/');
  if (slash != NULL) *slash = '\0'; /* <build> */
  const int w = snprintf(out, n, "%s/examples/%s", self, name);
  cr_assert(w > 0 && (size_t)w < n, "the example's path is too long");
}

/* Runs examples/<name> with its arguments (args: a shell word list, may be ""); returns its exit
 * status, its stdout + stderr in out (truncated to n - 1 bytes), also logged. */
static int run_example(const char *name, const char *args, char *out, size_t n) {
  char path[PATH_MAX], cmd[PATH_MAX + 64];
  example_path(name, path, sizeof path);
  cr_assert(access(path, X_OK) == 0, "%s is missing: build it with `make examples`", path);
  const int w = snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", path, args);
  cr_assert(w > 0 && (size_t)w < sizeof cmd, "path too long");
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f, "popen %s", cmd);
  size_t used = 0, got;
  while (used + 1 < n && (got = fread(out + used, 1, n - 1 - used, f)) > 0) used += got;
  out[used] = '\0';
  char sink[4096];
  while (fread(sink, 1, sizeof sink, f) > 0) {
  }
  int st = pclose(f);
  cr_log_info("%s", out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The example's output holds (or lacks) a line's text; the message shows the whole output. */
static void assert_output_has(const char *out, const char *text) {
  cr_assert(strstr(out, text) != NULL, "no \"%s\" in:\n%s", text, out);
}
static void assert_output_lacks(const char *out, const char *text) {
  cr_assert(strstr(out, text) == NULL, "\"%s\" in:\n%s", text, out);
}

Test(examples, train_step_cpu_half, .timeout = 300) {
  static char out[1 << 16];
  const int rc = run_example("train_step", "--cpu", out, sizeof out);
  cr_assert_eq(rc, 0, "train_step --cpu exited with %d:\n%s", rc, out);
  assert_output_has(out, "320 of 320 rows hold the K best keys");
  assert_output_has(out, "CPU half: OK");
  assert_output_has(out, "GPU half: SKIPPED (--cpu)");
  assert_output_lacks(out, "MISMATCH");
}

Test(gpu_examples, train_step_matches_the_reference, .timeout = 300) {
  TC_REQUIRE_GPU();
  if (tc_sanitize()) cr_skip_test("gpu_examples: skipped under compute-sanitizer");
  static char out[1 << 16];
  const int rc = run_example("train_step", "", out, sizeof out);
  cr_assert_eq(rc, 0, "train_step exited with %d:\n%s", rc, out);
  assert_output_has(out, "CPU half: OK");
  assert_output_has(out, "train_step: OK");
  assert_output_has(out, "320 of 320 rows equal to the reference");
  assert_output_lacks(out, "MISMATCH");
  assert_output_lacks(out, "SKIPPED"); /* the example found no device where the test did */
}
