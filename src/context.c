/* context.c - the per-device context: cached device attributes and a lazily created cuBLAS handle. */
#include <stdlib.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include "internal.h"

DSA_API dsa_status dsa_context_create(dsa_context **ctx, int device) {
  int count = 0;
  cudaError_t e;
  dsa_context *c;
  if (ctx == NULL) return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "dsa_context_create: ctx is NULL");
  *ctx = NULL;
  e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError(); /* clear the sticky "no device" error */
    return dsa_fail(DSA_ERROR_NO_DEVICE, "dsa_context_create: no CUDA device (%s)",
                    e == cudaSuccess ? "device count is 0" : cudaGetErrorString(e));
  }
  if (device < 0 || device >= count)
    return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "dsa_context_create: device = %d is outside 0..%d",
                    device, count - 1);
  c = (dsa_context *)calloc(1, sizeof *c);
  if (c == NULL) return dsa_fail(DSA_ERROR_OUT_OF_HOST_MEMORY, "dsa_context_create: calloc failed");
  c->device = device;
  dsa_context_options_init(c); /* include/dsa_tune.h defaults */
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->l2_bytes, cudaDevAttrL2CacheSize, device);
  if (e != cudaSuccess) {
    free(c);
    return dsa_cuda_status(e, "dsa_context_create");
  }
  *ctx = c;
  return DSA_SUCCESS;
}

DSA_API void dsa_context_destroy(dsa_context *ctx) {
  if (ctx == NULL) return;
  if (ctx->cublas != NULL) cublasDestroy((cublasHandle_t)ctx->cublas);
  free(ctx);
}

DSA_API dsa_status dsa_context_device_info(const dsa_context *ctx, int *cc_major, int *cc_minor,
                                           int *sm_count) {
  if (ctx == NULL) return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "dsa_context_device_info: ctx is NULL");
  if (cc_major) *cc_major = ctx->cc_major;
  if (cc_minor) *cc_minor = ctx->cc_minor;
  if (sm_count) *sm_count = ctx->sm_count;
  return DSA_SUCCESS;
}

dsa_status dsa_context_enter(dsa_context *ctx, const char *fn) {
  int current = -1;
  if (ctx == NULL) return dsa_fail(DSA_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
  /* cudaGetDevice is a cheap host-side read; switch only when the thread is elsewhere. */
  if (cudaGetDevice(&current) != cudaSuccess || current != ctx->device)
    return dsa_cuda_status(cudaSetDevice(ctx->device), fn);
  return DSA_SUCCESS;
}

dsa_status dsa_context_cublas(dsa_context *ctx, void **handle) {
  if (ctx->cublas == NULL) {
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
      return dsa_fail(DSA_ERROR_CUBLAS, "cublasCreate failed (status %d)", (int)s);
    ctx->cublas = h;
  }
  *handle = ctx->cublas;
  return DSA_SUCCESS;
}
