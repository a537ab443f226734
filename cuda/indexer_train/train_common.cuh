/*
 * train_common.cuh - what the indexer-training kernels (the .cu files of cuda/indexer_train/) share:
 * bf16 <-> fp32, the 8-wide bf16 dot product in fp32, the warp sum (a fixed butterfly, so every sum
 * built on it is bitwise reproducible), ReLU, slot validity (docs/indexer-training.md: slot j of row
 * t is valid iff j < clamp(lengths[t], 0, K) and 0 <= indices[t, j] < the key count), weights of
 * either dtype, and the host helpers for grids and 256-byte workspace regions. Each .cu compiles its
 * own copy (anonymous namespace, no relocatable device code).
 */
#ifndef DSA_INDEXER_TRAIN_COMMON_CUH
#define DSA_INDEXER_TRAIN_COMMON_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "internal.h"

namespace {

constexpr size_t kTrainAlign = 256;        /* workspace region alignment (and the size's slack) */
constexpr unsigned kTrainGridCap = 1u << 20; /* block-stride loops above this many CTAs */

__device__ __forceinline__ float tr_bf2f(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
__device__ __forceinline__ uint16_t tr_f2bf(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x)); /* round to nearest even, NaN stays NaN */
}

/* s + sum_{i<8} a_i * b_i over two 16-byte vectors of bf16 (fp32 fma, element order 0..7). */
__device__ __forceinline__ float tr_dot8(uint4 a, uint4 b, float s) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = fmaf(__uint_as_float(aw[i] << 16), __uint_as_float(bw[i] << 16), s);
    s = fmaf(__uint_as_float(aw[i] & 0xffff0000u), __uint_as_float(bw[i] & 0xffff0000u), s);
  }
  return s;
}

/* Butterfly sum over the 32 lanes: every lane gets the same value, in a fixed order. */
__device__ __forceinline__ float tr_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* ReLU that keeps NaN (x for x > 0 or NaN, else 0) and its derivative [x > 0] (0 for NaN). */
__device__ __forceinline__ float tr_relu(float x) { return (x > 0.f || x != x) ? x : 0.f; }

/* lengths[t] clamped to [0, K] (K without lengths). */
__device__ __forceinline__ int tr_eff_len(const int32_t *lengths, int64_t t, int K) {
  if (lengths == nullptr) return K;
  const int l = lengths[t];
  return l < 0 ? 0 : (l > K ? K : l);
}

/* The key row of slot j (< len) of a row of indices, or -1 when it is out of [0, num_keys). */
__device__ __forceinline__ int tr_slot_row(const int32_t *row, int j, int len, int64_t num_keys) {
  if (j >= len) return -1;
  const int v = row[j];
  return (v >= 0 && (int64_t)v < num_keys) ? v : -1;
}

/* Weight w[t, h] as fp32 from an fp32 or bf16 [T, H] tensor with row stride `stride`. */
__device__ __forceinline__ float tr_weight(const void *w, int bf16, int64_t stride, int64_t t, int h) {
  return bf16 ? tr_bf2f(((const uint16_t *)w)[t * stride + h]) : ((const float *)w)[t * stride + h];
}

/* ---- host helpers ---- */
inline size_t tr_align_up(size_t x) { return (x + kTrainAlign - 1) / kTrainAlign * kTrainAlign; }

inline unsigned char *tr_align_workspace(void *workspace) {
  return (unsigned char *)(((uintptr_t)workspace + kTrainAlign - 1) & ~(uintptr_t)(kTrainAlign - 1));
}

inline unsigned tr_grid_for(int64_t n, int64_t per_block) {
  int64_t g = (n + per_block - 1) / per_block;
  if (g > (int64_t)kTrainGridCap) g = kTrainGridCap;
  if (g < 1) g = 1;
  return (unsigned)g;
}

}  // namespace

#endif /* DSA_INDEXER_TRAIN_COMMON_CUH */
