/* compact.c - index compaction (docs/contract.md section 8) and attention head padding (section 3):
 * the argument checks shared by the GPU ops and their CPU references, the references themselves,
 * the public entry points, and dsa_padded_head_count. The kernels are in cuda/layout/compact.cu and
 * cuda/layout/pad_heads.cu. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "internal.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static int misaligned(const void *ptr, uintptr_t bytes) { return ((uintptr_t)ptr % bytes) != 0; }

/* Do byte ranges [a, a + an) and [b, b + bn) intersect? */
static int ranges_intersect(uintptr_t a, uint64_t an, uintptr_t b, uint64_t bn) {
  return a < b + bn && b < a + an;
}

/* Exact test for two row sets with the same stride s >= k (elements): rows of a start at a + i*s,
 * rows of b at b + j*s, i, j in [0, rows), each row k elements. They overlap iff some
 * m = j - i in [-(rows-1), rows-1] gives |d + m*s| < k, d = b - a (elements). */
static int equal_stride_rows_overlap(int64_t d, int64_t s, int64_t rows, int64_t k) {
  int64_t lo = -(rows - 1), hi = rows - 1, m0, i;
  /* |d + m*s| is convex in m: its minimum over [lo, hi] is at floor(-d/s) or floor(-d/s) + 1,
   * clamped into the range (s > 0) */
  m0 = -d / s;
  if (-d % s != 0 && -d < 0) m0 -= 1;
  for (i = 0; i < 2; ++i) {
    int64_t m = m0 + i, off;
    m = m < lo ? lo : (m > hi ? hi : m);
    off = d + m * s;
    if (off > -k && off < k) return 1;
  }
  return 0;
}

/* ---- validation ------------------------------------------------------------------------------- */

dsa_status dsa_check_compact(const dsa_compact_params *p, const char *fn, dsa_compact_params *resolved) {
  dsa_compact_params r;
  DSA_REQUIRE(p != NULL, "%s: p is NULL", fn);
  r = *p;
  DSA_REQUIRE(r.rows >= 0 && r.rows <= INT32_MAX, "%s: rows = %lld is outside 0..%d", fn,
              (long long)r.rows, INT32_MAX);
  DSA_REQUIRE(r.k >= 1 && r.k <= DSA_MAX_TOPK, "%s: k = %d is outside 1..%d", fn, (int)r.k,
              DSA_MAX_TOPK);
  DSA_REQUIRE(r.key_count >= 0 && r.key_count < INT32_MAX,
              "%s: key_count = %lld is outside 0..%d (it must be below 2^31 - 1)", fn,
              (long long)r.key_count, INT32_MAX - 1);
  if (r.indices_stride == 0) r.indices_stride = r.k;
  if (r.out_stride == 0) r.out_stride = r.k;
  if (r.rows == 0) {
    if (resolved) *resolved = r;
    return DSA_SUCCESS;
  }
  DSA_REQUIRE(r.indices != NULL, "%s: indices is NULL (rows = %lld)", fn, (long long)r.rows);
  DSA_REQUIRE(r.out != NULL, "%s: out is NULL (rows = %lld)", fn, (long long)r.rows);
  DSA_REQUIRE(!misaligned(r.indices, 4), "%s: indices = %p is not 4-byte aligned", fn,
              (const void *)r.indices);
  DSA_REQUIRE(!misaligned(r.out, 4), "%s: out = %p is not 4-byte aligned", fn, (void *)r.out);
  DSA_REQUIRE(r.lengths == NULL || !misaligned(r.lengths, 4),
              "%s: lengths = %p is not 4-byte aligned", fn, (void *)r.lengths);
  DSA_REQUIRE(r.indices_stride >= r.k, "%s: indices_stride = %lld is below k = %d", fn,
              (long long)r.indices_stride, (int)r.k);
  DSA_REQUIRE(r.out_stride >= r.k, "%s: out_stride = %lld is below k = %d", fn,
              (long long)r.out_stride, (int)r.k);
  /* the last element's byte offset must fit in int64 (rows - 1 < 2^31, so this bounds the stride) */
  DSA_REQUIRE(r.indices_stride <= (INT64_MAX / 4 - r.k) / (r.rows > 1 ? r.rows - 1 : 1),
              "%s: indices_stride = %lld is too large for rows = %lld", fn,
              (long long)r.indices_stride, (long long)r.rows);
  DSA_REQUIRE(r.out_stride <= (INT64_MAX / 4 - r.k) / (r.rows > 1 ? r.rows - 1 : 1),
              "%s: out_stride = %lld is too large for rows = %lld", fn, (long long)r.out_stride,
              (long long)r.rows);
  {
    uintptr_t a = (uintptr_t)r.indices, b = (uintptr_t)r.out;
    uint64_t an = ((uint64_t)(r.rows - 1) * (uint64_t)r.indices_stride + (uint64_t)r.k) * 4u;
    uint64_t bn = ((uint64_t)(r.rows - 1) * (uint64_t)r.out_stride + (uint64_t)r.k) * 4u;
    int in_place = a == b && r.indices_stride == r.out_stride;
    if (!in_place && ranges_intersect(a, an, b, bn)) {
      int overlap = 1;
      /* equal strides, different bases: interleaved rows may still be disjoint (exact test) */
      if (r.indices_stride == r.out_stride && (b > a ? b - a : a - b) % 4u == 0) {
        int64_t d = b >= a ? (int64_t)((b - a) / 4u) : -(int64_t)((a - b) / 4u);
        overlap = equal_stride_rows_overlap(d, r.out_stride, r.rows, r.k);
      }
      DSA_REQUIRE(!overlap,
                  "%s: out overlaps indices (out = %p, indices = %p, strides %lld and %lld); "
                  "only out == indices with equal strides is allowed",
                  fn, (void *)r.out, (const void *)r.indices, (long long)r.out_stride,
                  (long long)r.indices_stride);
    }
    /* lengths is written too: it may not overlap the indices read or the rows written */
    if (r.lengths != NULL) {
      uintptr_t c = (uintptr_t)r.lengths;
      uint64_t cn = (uint64_t)r.rows * 4u;
      DSA_REQUIRE(!ranges_intersect(c, cn, a, an), "%s: lengths = %p overlaps indices = %p", fn,
                  (void *)r.lengths, (const void *)r.indices);
      DSA_REQUIRE(!ranges_intersect(c, cn, b, bn), "%s: lengths = %p overlaps out = %p", fn,
                  (void *)r.lengths, (void *)r.out);
    }
  }
  if (resolved) *resolved = r;
  return DSA_SUCCESS;
}

dsa_status dsa_check_pad_heads(const dsa_pad_heads_params *p, const char *fn,
                               dsa_pad_heads_params *resolved) {
  dsa_pad_heads_params r;
  int64_t small, large, small_extent;
  DSA_REQUIRE(p != NULL, "%s: p is NULL", fn);
  r = *p;
  DSA_REQUIRE(r.num_tokens >= 0 && r.num_tokens <= INT32_MAX,
              "%s: num_tokens = %lld is outside 0..%d", fn, (long long)r.num_tokens, INT32_MAX);
  DSA_REQUIRE(r.num_heads >= 1 && r.num_heads <= DSA_MAX_HEADS,
              "%s: num_heads = %d is outside 1..%d", fn, (int)r.num_heads, DSA_MAX_HEADS);
  DSA_REQUIRE(r.padded_heads >= r.num_heads && r.padded_heads <= 1024,
              "%s: padded_heads = %d is outside num_heads..1024 (num_heads = %d)", fn,
              (int)r.padded_heads, (int)r.num_heads);
  DSA_REQUIRE(r.head_dim >= 1 && r.head_dim % 8 == 0,
              "%s: head_dim = %d is not a positive multiple of 8 (16-byte vectors)", fn,
              (int)r.head_dim);
  DSA_REQUIRE((int64_t)r.head_dim <= INT64_MAX / 2 / 1024 / ((int64_t)INT32_MAX + 1),
              "%s: head_dim = %d is too large", fn, (int)r.head_dim);
  if (r.q_stride_head == 0) r.q_stride_head = r.head_dim;
  if (r.q_stride_token == 0) r.q_stride_token = (int64_t)r.num_heads * r.head_dim;
  DSA_REQUIRE(r.sink_out == NULL || !misaligned(r.sink_out, 4),
              "%s: sink_out = %p is not 4-byte aligned", fn, (void *)r.sink_out);
  DSA_REQUIRE(r.sink == NULL || !misaligned(r.sink, 4), "%s: sink = %p is not 4-byte aligned", fn,
              (const void *)r.sink);
  /* sink_out is written even without tokens: it may not overlap the sink it copies */
  DSA_REQUIRE(r.sink == NULL || r.sink_out == NULL ||
                  !ranges_intersect((uintptr_t)r.sink_out, (uint64_t)r.padded_heads * 4u,
                                    (uintptr_t)r.sink, (uint64_t)r.num_heads * 4u),
              "%s: sink_out = %p overlaps sink = %p", fn, (void *)r.sink_out, (const void *)r.sink);
  if (r.num_tokens == 0) {
    if (resolved) *resolved = r;
    return DSA_SUCCESS;
  }
  DSA_REQUIRE(r.q != NULL, "%s: q is NULL (num_tokens = %lld)", fn, (long long)r.num_tokens);
  DSA_REQUIRE(r.q_out != NULL, "%s: q_out is NULL (num_tokens = %lld)", fn,
              (long long)r.num_tokens);
  DSA_REQUIRE(!misaligned(r.q, 16), "%s: q = %p is not 16-byte aligned", fn, (const void *)r.q);
  DSA_REQUIRE(!misaligned(r.q_out, 16), "%s: q_out = %p is not 16-byte aligned", fn,
              (void *)r.q_out);
  DSA_REQUIRE(r.q_stride_token > 0 && r.q_stride_token % 8 == 0,
              "%s: q_stride_token = %lld is not a positive multiple of 8", fn,
              (long long)r.q_stride_token);
  DSA_REQUIRE(r.q_stride_head > 0 && r.q_stride_head % 8 == 0,
              "%s: q_stride_head = %lld is not a positive multiple of 8", fn,
              (long long)r.q_stride_head);
  /* bound the strides so every offset below fits in int64 bytes (T, H < 2^31) */
  DSA_REQUIRE(r.q_stride_token <= INT64_MAX / 8 / (r.num_tokens + 1),
              "%s: q_stride_token = %lld is too large for num_tokens = %lld", fn,
              (long long)r.q_stride_token, (long long)r.num_tokens);
  DSA_REQUIRE(r.q_stride_head <= INT64_MAX / 8 / (r.num_tokens + 1) / (r.num_heads + 1),
              "%s: q_stride_head = %lld is too large", fn, (long long)r.q_stride_head);
  /* non-overlapping q: the smaller stride covers one head vector, the larger covers the smaller
   * dimension's full extent */
  if (r.q_stride_head <= r.q_stride_token) {
    small = r.q_stride_head, large = r.q_stride_token, small_extent = r.num_heads;
    DSA_REQUIRE(small >= r.head_dim, "%s: q_stride_head = %lld is below head_dim = %d", fn,
                (long long)small, (int)r.head_dim);
    DSA_REQUIRE(large >= small * small_extent,
                "%s: q_stride_token = %lld is below q_stride_head * num_heads = %lld (heads overlap)",
                fn, (long long)large, (long long)(small * small_extent));
  } else {
    small = r.q_stride_token, large = r.q_stride_head, small_extent = r.num_tokens;
    DSA_REQUIRE(small >= r.head_dim, "%s: q_stride_token = %lld is below head_dim = %d", fn,
                (long long)small, (int)r.head_dim);
    DSA_REQUIRE(large >= small * small_extent,
                "%s: q_stride_head = %lld is below q_stride_token * num_tokens = %lld (tokens overlap)",
                fn, (long long)large, (long long)(small * small_extent));
  }
  {
    uint64_t qn = ((uint64_t)(r.num_tokens - 1) * (uint64_t)r.q_stride_token +
                   (uint64_t)(r.num_heads - 1) * (uint64_t)r.q_stride_head + (uint64_t)r.head_dim) * 2u;
    uint64_t on = (uint64_t)r.num_tokens * (uint64_t)r.padded_heads * (uint64_t)r.head_dim * 2u;
    DSA_REQUIRE(!ranges_intersect((uintptr_t)r.q, qn, (uintptr_t)r.q_out, on),
                "%s: q_out = %p overlaps q = %p", fn, (void *)r.q_out, (const void *)r.q);
    /* sink_out [Hp] is written as well: disjoint from q, sink and q_out */
    if (r.sink_out != NULL) {
      uintptr_t so = (uintptr_t)r.sink_out;
      uint64_t son = (uint64_t)r.padded_heads * 4u;
      DSA_REQUIRE(!ranges_intersect(so, son, (uintptr_t)r.q, qn), "%s: sink_out = %p overlaps q = %p",
                  fn, (void *)r.sink_out, (const void *)r.q);
      DSA_REQUIRE(!ranges_intersect(so, son, (uintptr_t)r.q_out, on),
                  "%s: sink_out = %p overlaps q_out = %p", fn, (void *)r.sink_out, (void *)r.q_out);
    }
    DSA_REQUIRE(r.sink == NULL || !ranges_intersect((uintptr_t)r.sink, (uint64_t)r.num_heads * 4u,
                                                    (uintptr_t)r.q_out, on),
                "%s: q_out = %p overlaps sink = %p", fn, (void *)r.q_out, (const void *)r.sink);
  }
  if (resolved) *resolved = r;
  return DSA_SUCCESS;
}

/* ---- CPU references --------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

DSA_API dsa_status dsa_ref_compact_indices(const dsa_compact_params *p) {
  dsa_compact_params r;
  int32_t row[DSA_MAX_TOPK];
  int64_t t;
  DSA_TRY(dsa_check_compact(p, "dsa_ref_compact_indices", &r));
  for (t = 0; t < r.rows; ++t) {
    const int32_t *in = r.indices + t * r.indices_stride;
    int32_t *out = r.out + t * r.out_stride;
    int32_t n = 0, j;
    /* stable compaction into a copy first: out may be the same row (in place) */
    for (j = 0; j < r.k; ++j)
      if (in[j] >= 0 && (int64_t)in[j] < r.key_count) row[n++] = in[j];
    qsort(row, (size_t)n, sizeof row[0], cmp_i32);
    for (j = 0; j < n; ++j) out[j] = row[j];
    for (j = n; j < r.k; ++j) out[j] = -1;
    if (r.lengths) r.lengths[t] = n;
  }
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_ref_pad_heads(const dsa_pad_heads_params *p) {
  dsa_pad_heads_params r;
  int64_t t;
  int32_t h;
  DSA_TRY(dsa_check_pad_heads(p, "dsa_ref_pad_heads", &r));
  for (t = 0; t < r.num_tokens; ++t)
    for (h = 0; h < r.padded_heads; ++h) {
      uint16_t *dst = r.q_out + (t * r.padded_heads + h) * (int64_t)r.head_dim;
      if (h < r.num_heads)
        memcpy(dst, r.q + t * r.q_stride_token + h * r.q_stride_head,
               (size_t)r.head_dim * sizeof *dst);
      else
        memset(dst, 0, (size_t)r.head_dim * sizeof *dst);
    }
  if (r.sink_out)
    for (h = 0; h < r.padded_heads; ++h)
      r.sink_out[h] = (r.sink != NULL && h < r.num_heads) ? r.sink[h] : -INFINITY;
  return DSA_SUCCESS;
}

/* ---- public GPU entry points ------------------------------------------------------------------ */

DSA_API dsa_status dsa_compact_indices(dsa_context *ctx, const dsa_compact_params *p,
                                       cudaStream_t stream) {
  dsa_compact_params r;
  DSA_TRY(dsa_check_compact(p, "dsa_compact_indices", &r));
  DSA_TRY(dsa_context_enter(ctx, "dsa_compact_indices"));
  if (r.rows == 0) return DSA_SUCCESS;
  return dsa_launch_compact(ctx, &r, stream);
}

/* Work is zero only when there are no tokens AND no sink to write: with num_tokens == 0 a given
 * sink_out [Hp] is still filled, as the reference does. */
DSA_API dsa_status dsa_pad_heads(dsa_context *ctx, const dsa_pad_heads_params *p,
                                 cudaStream_t stream) {
  dsa_pad_heads_params r;
  DSA_TRY(dsa_check_pad_heads(p, "dsa_pad_heads", &r));
  DSA_TRY(dsa_context_enter(ctx, "dsa_pad_heads"));
  if (r.num_tokens == 0 && r.sink_out == NULL) return DSA_SUCCESS;
  return dsa_launch_pad_heads(ctx, &r, stream);
}

DSA_API int dsa_padded_head_count(int num_heads) {
  if (num_heads <= 0) return -1;
  if (num_heads % 64 == 0) return num_heads;
  if (num_heads < 64 && 64 % num_heads == 0) return 64;
  return -1;
}
