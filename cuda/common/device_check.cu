/* device_check.cu - does this build of libdsa have device code for the current device?
 * (docs/contract.md section 13.4). dsa_context_create asks once, so that a device the fatbin has
 * no code for is DSA_ERROR_UNSUPPORTED at context creation rather than a launch failure later.
 *
 * The probe kernel is built with the same ARCH flags as every other kernel of the library, so its
 * image exists exactly where theirs do: cudaFuncGetAttributes on it fails with
 * cudaErrorNoKernelImageForDevice (or cudaErrorInvalidDeviceFunction) when the device can run
 * neither the machine code (sm_90a runs on 9.0 only) nor JIT the PTX (compute_90: 9.0 and newer),
 * and with a PTX / JIT error when the driver is too old for the PTX. Host side: src/context.c. */
#include <cuda_runtime.h>
#include "internal.h"

#define DSA_DC_STR2_(x) #x
#define DSA_DC_STR_(x) DSA_DC_STR2_(x)

namespace {
__global__ void dsa_device_probe_kernel(int *p) {
  if (p != nullptr) *p = 0;
}
}  // namespace

/* The cudaError_t of cudaFuncGetAttributes on the probe kernel, for the current device; the
 * (non-sticky) error is cleared. */
extern "C" DSA_HIDDEN int dsa_device_code_probe(void) {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, dsa_device_probe_kernel);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return (int)e;
}

/* The CUDA architectures this file (and so the library) was compiled for, as nvcc lists them in
 * __CUDA_ARCH_LIST__ (e.g. "900" for the default sm_90a code + compute_90 PTX). */
extern "C" DSA_HIDDEN const char *dsa_device_code_targets(void) {
#ifdef __CUDA_ARCH_LIST__
  return DSA_DC_STR_(__CUDA_ARCH_LIST__);
#else
  return "unknown";
#endif
}
