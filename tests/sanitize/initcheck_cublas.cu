// Repro of an initcheck false positive (docs/reliability.md section 3): a kernel reading the output of a
// cuBLAS bf16 GEMM (same call shape as the indexer's cuBLAS engine) is reported as reading uninitialized
// global memory on an H200 (presumably cuBLAS stores it with TMA, which initcheck does not track). Build: nvcc -arch=sm_90a -o icr initcheck_cublas.cu -lcublas;
// run: compute-sanitizer --tool initcheck ./icr: 2048000 errors on an H200 (compute-sanitizer 2025.3.1).
// --kernel-name-exclude does not help (an excluded kernel's stores are not tracked either), so under
// initcheck the suites skip the indexer's cuBLAS engine (tc_sanitize_skips_cublas, tests/test_common.h).
#include <cstdio>
#include <cublas_v2.h>
#include <cuda_bf16.h>
__global__ void rd(const float *c, long n, float *o) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x; float a = 0;
  for (; i < n; i += (long)gridDim.x * blockDim.x) a += c[i];
  if (a == 12345.f) *o = a;
}
int main() {
  int n = 1000, m = 64 * 32, k = 128;
  __nv_bfloat16 *A, *B; float *C, *o;
  cudaMalloc(&A, sizeof(__nv_bfloat16) * n * k); cudaMalloc(&B, sizeof(__nv_bfloat16) * m * k);
  cudaMalloc(&C, sizeof(float) * n * m); cudaMalloc(&o, 4);
  cudaMemset(A, 0, sizeof(__nv_bfloat16) * n * k); cudaMemset(B, 0, sizeof(__nv_bfloat16) * m * k);
  cublasHandle_t h; cublasCreate(&h); float one = 1, zero = 0;
  cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  rd<<<64, 256>>>(C, (long)n * m, o);
  printf("gemm status %d, sync %s\n", (int)s, cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
