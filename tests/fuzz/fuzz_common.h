/* fuzz_common.h - a byte reader shared by the libFuzzer harnesses: each call takes the next bytes
 * of the input (zeros once it is used up), so every input decodes to some call. */
#ifndef DSA_FUZZ_COMMON_H
#define DSA_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const uint8_t *p;
  size_t n;
} fz_in;

static inline uint64_t fz_bytes(fz_in *in, int nbytes) {
  uint64_t v = 0;
  for (int i = 0; i < nbytes; ++i) {
    uint8_t b = 0;
    if (in->n > 0) {
      b = *in->p++;
      --in->n;
    }
    v |= (uint64_t)b << (8 * i);
  }
  return v;
}
static inline uint8_t fz_u8(fz_in *in) { return (uint8_t)fz_bytes(in, 1); }
static inline uint16_t fz_u16(fz_in *in) { return (uint16_t)fz_bytes(in, 2); }
static inline int32_t fz_i32(fz_in *in) { return (int32_t)(uint32_t)fz_bytes(in, 4); }
static inline int64_t fz_i64(fz_in *in) { return (int64_t)fz_bytes(in, 8); }
static inline float fz_f32(fz_in *in) {
  uint32_t u = (uint32_t)fz_bytes(in, 4);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* An int64 that is usually small (mode byte picks: small, edge value, raw). */
static inline int64_t fz_size(fz_in *in, int64_t small_max) {
  static const int64_t edges[] = {0, -1, 1, 2147483647LL, 2147483646LL, 2147483648LL,
                                  65535, 65536, 1LL << 40, INT64_MAX, INT64_MIN, -2147483648LL};
  uint8_t m = fz_u8(in);
  if (m < 200) return (int64_t)(fz_u16(in) % (uint64_t)(small_max + 1));
  if (m < 240) return edges[fz_u8(in) % (sizeof edges / sizeof edges[0])];
  return fz_i64(in);
}

/* A failed invariant: print and abort (libFuzzer saves the input as a crash). */
#define FZ_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) {                                                 \
      fprintf(stderr, "invariant failed: %s: ", #cond);            \
      fprintf(stderr, __VA_ARGS__);                                \
      fputc('\n', stderr);                                         \
      abort();                                                     \
    }                                                              \
  } while (0)

#endif /* DSA_FUZZ_COMMON_H */
