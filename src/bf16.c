/* bf16.c - exact bf16 <-> fp32 conversions (round to nearest even, NaN preserved as a quiet NaN). */
#include <string.h>
#include "internal.h"

DSA_API uint16_t dsa_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
  u += 0x7FFFu + ((u >> 16) & 1u);          /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

DSA_API float dsa_bf16_to_f32(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
