/* status.c - version, status strings and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "internal.h"

#define DSA_STR2_(x) #x
#define DSA_STR_(x) DSA_STR2_(x)

DSA_API const char *dsa_version_string(void) {
  return DSA_STR_(DSA_VERSION_MAJOR) "." DSA_STR_(DSA_VERSION_MINOR) "." DSA_STR_(DSA_VERSION_PATCH);
}

DSA_API int dsa_version_number(void) { return DSA_VERSION_NUMBER; }

DSA_API const char *dsa_status_string(dsa_status status) {
  switch (status) {
#define DSA_STATUS_CASE_(name, value, text) \
  case name:                                \
    return text;
    DSA_STATUS_MAP(DSA_STATUS_CASE_)
#undef DSA_STATUS_CASE_
    default:
      return "unknown status";
  }
}

static __thread char dsa_last_message[512];

DSA_API const char *dsa_last_error_message(void) { return dsa_last_message; }

dsa_status dsa_fail(dsa_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dsa_last_message, sizeof dsa_last_message, fmt, ap);
  va_end(ap);
  return status;
}

void dsa_message_save(dsa_saved_message *m) {
  strncpy(m->text, dsa_last_message, sizeof m->text - 1);
  m->text[sizeof m->text - 1] = '\0';
}

void dsa_message_restore(const dsa_saved_message *m) { (void)dsa_fail(DSA_SUCCESS, "%s", m->text); }

int dsa_declined(dsa_status s, const dsa_saved_message *m) {
  if (s != DSA_ERROR_UNSUPPORTED) return 0;
  dsa_message_restore(m);
  return 1;
}

dsa_status dsa_cuda_status(int cuda_error, const char *where) {
  if (cuda_error == (int)cudaSuccess) return DSA_SUCCESS;
  return dsa_fail(DSA_ERROR_CUDA, "%s: %s (%s)", where, cudaGetErrorString((cudaError_t)cuda_error),
                  cudaGetErrorName((cudaError_t)cuda_error));
}

dsa_status dsa_kernel_smem_once(const void *fn, int bytes, int max_carveout, int device,
                                int set[DSA_TRACKED_DEVICES], const char *where) {
  const int tracked = device >= 0 && device < DSA_TRACKED_DEVICES;
  if (tracked && set[device] >= bytes) return DSA_SUCCESS;
  DSA_TRY(dsa_cuda_status((int)cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                          where));
  if (max_carveout)
    DSA_TRY(dsa_cuda_status((int)cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                      (int)cudaSharedmemCarveoutMaxShared),
                            where));
  if (tracked) set[device] = bytes;
  return DSA_SUCCESS;
}
