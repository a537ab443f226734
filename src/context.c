/* context.c - the per-device context: cached device attributes, a check that this build has
 * device code for the device (docs/contract.md section 13.4), a lazily created cuBLAS handle, and
 * a side stream with its events (src/internal.h; created with the context, so that no call creates
 * CUDA objects, which a graph capture may forbid). */
#include <stdlib.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include "internal.h"

dsa_status dsa_device_code_status(int cuda_error, int device, const char *name,
                                             int cc_major, int cc_minor) {
  static const char fn[] = "dsa_context_create";
  const cudaError_t e = (cudaError_t)cuda_error;
  const char *targets = dsa_device_code_targets();
  if (e == cudaSuccess) return DSA_SUCCESS;
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: device %d (%s) has compute capability %d.%d, for which this build of libdsa "
                    "has no device code: it was built for the CUDA architectures %s (the default ARCH "
                    "is sm_90a machine code, which runs on 9.0 only, plus compute_90 PTX for 9.0 and "
                    "newer); rebuild with an ARCH that covers this device (%s)",
                    fn, device, name, cc_major, cc_minor, targets, cudaGetErrorString(e));
  if (e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidPtx ||
      e == cudaErrorJitCompilerNotFound || e == cudaErrorJitCompilationDisabled)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "%s: device %d (%s, compute capability %d.%d) would run libdsa's PTX (built for "
                    "the CUDA architectures %s), but the driver cannot compile it: %s (a driver older "
                    "than the CUDA toolkit that built the library?)",
                    fn, device, name, cc_major, cc_minor, targets, cudaGetErrorString(e));
  return dsa_cuda_status(cuda_error, fn);
}

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
  {
    /* the fatbin must have code for this device: report it here, not as a launch failure later */
    const int probe = dsa_device_code_probe();
    if (probe != (int)cudaSuccess) {
      struct cudaDeviceProp prop;
      const char *name = "unknown name";
      if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) name = prop.name;
      else (void)cudaGetLastError();
      dsa_status st = dsa_device_code_status(probe, device, name, c->cc_major, c->cc_minor);
      free(c);
      return st;
    }
  }
  {
    /* the side stream at the device's highest priority: its CTAs (the deterministic backward's
     * sorts) take the SMs that free up ahead of the call stream's waiting CTAs */
    int lo = 0, hi = 0;
    cudaEvent_t *evs[5] = {&c->ev_join, &c->ev_ready[0], &c->ev_ready[1], &c->ev_done[0], &c->ev_done[1]};
    e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, hi);
    for (int i = 0; i < 5 && e == cudaSuccess; ++i) e = cudaEventCreateWithFlags(evs[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
      dsa_context_destroy(c);
      return dsa_cuda_status(e, "dsa_context_create");
    }
  }
  *ctx = c;
  return DSA_SUCCESS;
}

dsa_context *dsa_testing_context(int l2_bytes) {
  dsa_context *c = (dsa_context *)calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  dsa_context_options_init(c);
  c->l2_bytes = l2_bytes;
  return c;
}

void dsa_testing_set_l2_bytes(dsa_context *ctx, int l2_bytes) {
  if (ctx != NULL) ctx->l2_bytes = l2_bytes;
}

DSA_API void dsa_context_destroy(dsa_context *ctx) {
  if (ctx == NULL) return;
  if (ctx->cublas != NULL) cublasDestroy((cublasHandle_t)ctx->cublas);
  {
    cudaEvent_t evs[5] = {ctx->ev_join, ctx->ev_ready[0], ctx->ev_ready[1], ctx->ev_done[0], ctx->ev_done[1]};
    for (int i = 0; i < 5; ++i)
      if (evs[i] != NULL) cudaEventDestroy(evs[i]);
  }
  if (ctx->side != NULL) cudaStreamDestroy(ctx->side);
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

dsa_status dsa_stream_after(cudaEvent_t ev, cudaStream_t from, cudaStream_t to, const char *fn) {
  DSA_TRY(dsa_cuda_status(cudaEventRecord(ev, from), fn));
  return dsa_cuda_status(cudaStreamWaitEvent(to, ev, 0), fn);
}

dsa_status dsa_side_join(const dsa_context *ctx, cudaStream_t stream, dsa_status st, const char *fn) {
  dsa_saved_message saved;
  dsa_message_save(&saved);
  const dsa_status j = dsa_stream_after(ctx->ev_join, ctx->side, stream, fn);
  if (st == DSA_SUCCESS) return j;
  dsa_message_restore(&saved);
  return st;
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
