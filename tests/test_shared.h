/*
 * test_shared.h - the helpers the Criterion suites (tests/test_common.h includes this header) and
 * the benchmark programs (bench/bench_common.h) share, so that both draw inputs and judge results
 * the same way: the splitmix64 generator, random fills, the poison values and their checks, the NaN
 * test of a bf16, the relative errors (NaN never passes) and the GPU presence test. Plain C99: the
 * public header and the CUDA runtime API only, no Criterion.
 */
#ifndef DSA_TEST_SHARED_H
#define DSA_TEST_SHARED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "dsa.h"

/* ---- random numbers: splitmix64 (the suites seed it from DSA_TEST_SEED or the clock: tc_seed) ---- */
typedef struct { uint64_t s; } tc_rng;

static inline uint64_t tc_next(tc_rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double tc_uniform(tc_rng *r) { return (double)(tc_next(r) >> 11) * (1.0 / 9007199254740992.0); }
/* Uniform in [lo, hi). */
static inline double tc_range(tc_rng *r, double lo, double hi) { return lo + (hi - lo) * tc_uniform(r); }
/* Integer in [0, n). */
static inline int64_t tc_below(tc_rng *r, int64_t n) { return (int64_t)(tc_next(r) % (uint64_t)n); }

/* ---- random fills: one draw per element, uniform in [lo, hi), bf16 rounded to nearest even ---- */
static inline void tc_fill_bf16(tc_rng *r, uint16_t *x, size_t n, double lo, double hi) {
  for (size_t i = 0; i < n; ++i) x[i] = dsa_f32_to_bf16((float)tc_range(r, lo, hi));
}
static inline void tc_fill_f32(tc_rng *r, float *x, size_t n, double lo, double hi) {
  for (size_t i = 0; i < n; ++i) x[i] = (float)tc_range(r, lo, hi);
}

/* ---- poison: a NaN bit pattern for floats, 0x7FC1 (NaN) for bf16, a marker for ints ---- */
#define TC_POISON_I32 ((int32_t)0x5A5A5A5A)
#define TC_POISON_BF16 ((uint16_t)0x7FC1)
static inline void tc_poison_f32(float *x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = nanf("");
}
/* Whether all n bytes at p are `byte` (a buffer poisoned by memset, untouched). */
static inline int tc_bytes_are(const void *p, size_t n, unsigned char byte) {
  const unsigned char *c = (const unsigned char *)p;
  for (size_t i = 0; i < n; ++i)
    if (c[i] != byte) return 0;
  return 1;
}

/* A bf16 NaN: exponent all ones, mantissa not zero. */
static inline int tc_bf16_isnan(uint16_t x) { return (x & 0x7F80) == 0x7F80 && (x & 0x7F) != 0; }

/* ---- errors ---- */
/* Relative Frobenius error ||a - b|| / max(||b||, tiny); returns INFINITY if any NaN appears
 * where the reference has none (NaN never passes). */
static inline double tc_rel_err_bf16(const uint16_t *got, const uint16_t *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double g = dsa_bf16_to_f32(got[i]), e = dsa_bf16_to_f32(ref[i]);
    if (isnan(g) != isnan(e)) return INFINITY;
    if (isnan(g)) continue;
    num += (g - e) * (g - e);
    den += e * e;
  }
  return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1.0);
}
/* The same for fp32 (a NaN on one side only: INFINITY). */
static inline double tc_rel_err_f32(const float *got, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (isnan(got[i]) != isnan(ref[i])) return INFINITY;
    num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1.0);
}
/* The largest |got - ref| relative to the largest |ref| (or absolute when ref is all zeros); a NaN
 * in got: INFINITY. */
static inline double tc_max_rel_err_f32(const float *got, const float *ref, size_t n) {
  double m = 0, e = 0;
  for (size_t i = 0; i < n; ++i) {
    if (isnan(got[i])) return INFINITY;
    m = fmax(m, fabs((double)ref[i]));
    e = fmax(e, fabs((double)got[i] - (double)ref[i]));
  }
  return m > 0 ? e / m : e;
}
/* The Frobenius norm of a bf16 vector. */
static inline double tc_norm_bf16(const uint16_t *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    double v = dsa_bf16_to_f32(x[i]);
    s += v * v;
  }
  return sqrt(s);
}

/* ---- whether a CUDA device is there (the runtime's sticky error cleared when not) ---- */
static inline int tc_have_gpu(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n > 0;
}

#endif /* DSA_TEST_SHARED_H */
