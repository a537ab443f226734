/* test_gpu_examples.c - suite gpu_examples: runs the programs of examples/ (built by `make examples`,
 * which `make test` does first) and checks their exit status and output. The binaries are found
 * beside the test binary's build folder: <build>/tests/dsa_tests -> <build>/examples/<name> (also
 * for the ASan binary, <build>/asan/dsa_tests); DSA_EXAMPLES_DIR overrides. Needs a GPU (without
 * one the example only says so); skipped under compute-sanitizer (the example's kernels are the
 * other suites'). */
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

/* Runs `path`, returns its exit status and its stdout + stderr (truncated to n - 1 bytes). */
static int run_capture(const char *path, char *out, size_t n) {
  char cmd[PATH_MAX + 16];
  const int w = snprintf(cmd, sizeof cmd, "'%s' 2>&1", path);
  cr_assert(w > 0 && (size_t)w < sizeof cmd, "path too long");
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f, "popen %s", path);
  size_t used = 0, got;
  while (used + 1 < n && (got = fread(out + used, 1, n - 1 - used, f)) > 0) used += got;
  out[used] = '\0';
  char sink[4096];
  while (fread(sink, 1, sizeof sink, f) > 0) {
  }
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

Test(gpu_examples, train_step_matches_the_reference, .timeout = 300) {
  TC_REQUIRE_GPU();
  if (tc_sanitize()) cr_skip_test("gpu_examples: skipped under compute-sanitizer");
  char path[PATH_MAX];
  example_path("train_step", path, sizeof path);
  cr_assert(access(path, X_OK) == 0, "%s is missing: build it with `make examples`", path);
  static char out[1 << 16];
  const int rc = run_capture(path, out, sizeof out);
  cr_log_info("%s", out);
  cr_assert_eq(rc, 0, "train_step exited with %d:\n%s", rc, out);
  cr_assert(strstr(out, "train_step: OK") != NULL, "no \"train_step: OK\" in:\n%s", out);
  cr_assert(strstr(out, "320 of 320 rows equal to the reference") != NULL, "indexer rows:\n%s", out);
  cr_assert(strstr(out, "MISMATCH") == NULL, "%s", out);
  cr_assert(strstr(out, "SKIPPED") == NULL, "the example found no device where the test did:\n%s", out);
}
