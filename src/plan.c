/*
 * plan.c - the host planner for packed-sequence metadata (docs/contract.md sections 2, 4 and 5) and
 * its upload to the device.
 *
 *  - dsa_plan_create validates a dsa_plan_desc (every check of section 4, int64 arithmetic
 *    throughout) and computes the per-segment and per-query metadata of section 4 on the host.
 *  - The plan is ONE host allocation: the struct dsa_plan header, then a "blob" holding every array
 *    at a 16-byte-aligned offset, laid out byte for byte as it will be on the device. The planner
 *    allocates once per plan; it is not a hot-path call (plan once per batch, reuse in every layer).
 *  - dsa_plan_upload copies the blob with one cudaMemcpyAsync into caller memory and rebases the
 *    view's pointers into it. The copy reads the host blob asynchronously, so the plan must outlive
 *    the copy (synchronise the stream, or record an event, before dsa_plan_destroy).
 *  - dsa_check_plan_view is the section 5 check of a view handed to an op (host or device view):
 *    scalars and pointer presence only, it never dereferences. dsa_check_indexer (src/validate.c)
 *    runs it for dsa_indexer_topk and its references.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "internal.h"

#define PLAN_ALIGN ((size_t)16)
#define PLAN_MAX_TOKENS ((int64_t)2147483647) /* T_k must be below 2^31 - 1 */

struct dsa_plan {
  dsa_plan_view view;  /* scalars, and pointers into blob (NULL for absent arrays) */
  unsigned char *blob; /* 16-byte aligned, inside this allocation, right after the header */
  size_t blob_bytes;   /* >= 1 */
};

/* Byte offsets of each array inside the blob; SIZE_MAX marks an absent array. */
typedef struct plan_layout {
  size_t starts, causal_lengths, query_valid, valid_row_indices;
  size_t segment_cu_q, segment_cu_k, q_causal_offsets, key_source_indices;
  size_t bytes;
} plan_layout;

/* Counts gathered by the first pass over the segments; they size the blob. */
typedef struct plan_counts {
  int64_t num_segments, key_count_sum, num_valid;
  int64_t max_query_count, max_key_count;
} plan_counts;

static size_t align_up(size_t x) { return (x + PLAN_ALIGN - 1) & ~(PLAN_ALIGN - 1); }

/* Appends an array of n elements of `elem` bytes at the next aligned offset (SIZE_MAX if absent). */
static size_t place(size_t *cursor, int present, int64_t n, size_t elem) {
  size_t at;
  if (!present) return SIZE_MAX;
  at = align_up(*cursor);
  *cursor = at + (size_t)n * elem;
  return at;
}

/* valid_row_indices is present (possibly empty) unless every query is valid; key_source_indices is
 * present unless the query set is the identity 0..T_k-1. */
static plan_layout make_layout(int64_t tq, int64_t nseg, int has_vri, int64_t nvalid,
                               int has_ksi, int64_t nks) {
  plan_layout l;
  size_t c = 0;
  /* the int64 arrays first, then int32, then bytes: each at a 16-byte boundary anyway */
  l.valid_row_indices = place(&c, has_vri, nvalid, sizeof(int64_t));
  l.key_source_indices = place(&c, has_ksi, nks, sizeof(int64_t));
  l.starts = place(&c, 1, tq, sizeof(int32_t));
  l.causal_lengths = place(&c, 1, tq, sizeof(int32_t));
  l.segment_cu_q = place(&c, 1, nseg + 1, sizeof(int32_t));
  l.segment_cu_k = place(&c, 1, nseg + 1, sizeof(int32_t));
  l.q_causal_offsets = place(&c, 1, nseg, sizeof(int32_t));
  l.query_valid = place(&c, 1, tq, sizeof(uint8_t));
  l.bytes = align_up(c); /* T_q >= 1, so this is >= 16 */
  return l;
}

/* Largest d in [0, S) with P[d] <= g: searchsorted(P, g, right=True) - 1, clamped to a valid id.
 * P is strictly increasing with P[0] = 0 and P[S] = T_k > g after validation. */
static int64_t find_doc(const int32_t *P, int64_t S, int64_t g) {
  int64_t lo = 0, hi = S; /* invariant: P[lo] <= g < P[hi] */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if ((int64_t)P[mid] <= g) lo = mid;
    else hi = mid;
  }
  return lo;
}

static const char *const FN = "dsa_plan_create";

/* Every check of section 4. On success *tq_out is T_q and *P_out the padded offsets (P = cu when
 * cu_seqlens_padded is NULL). */
static dsa_status validate_desc(const dsa_plan_desc *d, int64_t *tq_out, const int32_t **P_out) {
  const int32_t *cu = d->cu_seqlens, *P;
  int64_t S = d->num_seqs, tk = d->total_key_tokens, qs = d->query_start, nq = d->num_queries;
  int64_t max_r = 0;

  DSA_REQUIRE(cu != NULL, "%s: cu_seqlens is NULL", FN);
  DSA_REQUIRE(S >= 1, "%s: num_seqs = %lld is below 1", FN, (long long)S);
  DSA_REQUIRE(tk > 0 && tk < PLAN_MAX_TOKENS,
              "%s: total_key_tokens = %lld is outside 1..%lld", FN, (long long)tk,
              (long long)(PLAN_MAX_TOKENS - 1));
  DSA_REQUIRE(cu[0] == 0, "%s: cu_seqlens[0] = %d is not 0", FN, (int)cu[0]);
  for (int64_t s = 0; s < S; ++s) {
    int64_t r = (int64_t)cu[s + 1] - (int64_t)cu[s];
    DSA_REQUIRE(r > 0,
                "%s: cu_seqlens[%lld] = %d is %s cu_seqlens[%lld] = %d "
                "(empty or negative sequence %lld)",
                FN, (long long)(s + 1), (int)cu[s + 1], r == 0 ? "equal to" : "below", (long long)s,
                (int)cu[s], (long long)s);
    if (r > max_r) max_r = r;
  }
  P = d->cu_seqlens_padded != NULL ? d->cu_seqlens_padded : cu;
  if (d->cu_seqlens_padded != NULL) {
    DSA_REQUIRE(P[0] == 0, "%s: cu_seqlens_padded[0] = %d is not 0", FN, (int)P[0]);
    for (int64_t s = 0; s < S; ++s) {
      int64_t pl = (int64_t)P[s + 1] - (int64_t)P[s];
      int64_t r = (int64_t)cu[s + 1] - (int64_t)cu[s];
      DSA_REQUIRE(pl > 0,
                  "%s: cu_seqlens_padded[%lld] = %d is %s cu_seqlens_padded[%lld] = %d "
                  "(empty or negative padded sequence %lld)",
                  FN, (long long)(s + 1), (int)P[s + 1], pl == 0 ? "equal to" : "below",
                  (long long)s, (int)P[s], (long long)s);
      DSA_REQUIRE(pl >= r,
                  "%s: cu_seqlens_padded gives sequence %lld a padded length of %lld "
                  "(cu_seqlens_padded[%lld] - cu_seqlens_padded[%lld]), "
                  "below its real length %lld from cu_seqlens",
                  FN, (long long)s, (long long)pl, (long long)(s + 1), (long long)s, (long long)r);
    }
    DSA_REQUIRE((int64_t)P[S] == tk,
                "%s: cu_seqlens_padded[%lld] = %d differs from total_key_tokens = %lld",
                FN, (long long)S, (int)P[S], (long long)tk);
  } else {
    DSA_REQUIRE((int64_t)cu[S] == tk,
                "%s: cu_seqlens[%lld] = %d differs from total_key_tokens = %lld "
                "(cu_seqlens_padded is NULL, so cu_seqlens must cover every key)",
                FN, (long long)S, (int)cu[S], (long long)tk);
  }
  DSA_REQUIRE(nq != 0, "%s: num_queries = 0: the query set must be non-empty", FN);
  DSA_REQUIRE(nq >= -1, "%s: num_queries = %lld is below -1", FN, (long long)nq);
  if (nq == -1) {
    DSA_REQUIRE(qs == 0,
                "%s: query_start = %lld with num_queries = -1 (all of 0..T_k-1); it must be 0", FN,
                (long long)qs);
    nq = tk;
  }
  /* [qs, qs + nq) inside [0, T_k), written so that nothing overflows */
  DSA_REQUIRE(qs >= 0 && qs < tk && nq <= tk - qs,
              "%s: query_start = %lld, num_queries = %lld: the query range "
              "[query_start, query_start + num_queries) is outside [0, total_key_tokens = %lld)",
              FN, (long long)qs, (long long)nq, (long long)tk);
  DSA_REQUIRE(d->max_seqlen <= 0 || d->max_seqlen == max_r,
              "%s: max_seqlen = %lld differs from the longest real sequence %lld in cu_seqlens", FN,
              (long long)d->max_seqlen, (long long)max_r);
  *tq_out = nq;
  *P_out = P;
  return DSA_SUCCESS;
}

/* Walks the segments of [qs, qs + tq). With out == NULL it only counts (and checks the segment
 * sizes like the reference); with out it fills the arrays of the plan. */
static dsa_status walk(const dsa_plan_desc *d, const int32_t *P, int64_t tq, plan_counts *cnt,
                       struct dsa_plan *out) {
  const int32_t *cu = d->cu_seqlens;
  const uint8_t *mask = d->padding_mask;
  int64_t S = d->num_seqs, qs = d->query_start, qend = qs + tq, g = qs;
  int64_t j = 0, cu_k = 0, nvalid = 0, ks = 0;
  dsa_plan_view *v = out ? &out->view : NULL;
  int32_t *starts = NULL, *causal = NULL, *scq = NULL, *sck = NULL, *qco = NULL;
  uint8_t *valid = NULL;
  int64_t *vri = NULL, *ksi = NULL;

  if (v) {
    starts = (int32_t *)v->starts;
    causal = (int32_t *)v->causal_lengths;
    valid = (uint8_t *)v->query_valid;
    vri = (int64_t *)v->valid_row_indices;
    scq = (int32_t *)v->segment_cu_q;
    sck = (int32_t *)v->segment_cu_k;
    qco = (int32_t *)v->q_causal_offsets;
    ksi = (int64_t *)v->key_source_indices;
    scq[0] = 0;
    sck[0] = 0;
  }
  memset(cnt, 0, sizeof *cnt);
  while (g < qend) {
    int64_t doc = find_doc(P, S, g);
    int64_t doc_start = P[doc], doc_end = P[doc + 1];
    int64_t real_end = doc_start + ((int64_t)cu[doc + 1] - (int64_t)cu[doc]);
    int64_t seg_end = doc_end < qend ? doc_end : qend; /* one past the segment's last query */
    int64_t qcount = seg_end - g, kcount = seg_end - doc_start;
    /* cannot fail after validation; checked like the reference does */
    if (qcount <= 0 || kcount <= 0 || g < doc_start)
      return dsa_fail(DSA_ERROR_INVALID_ARGUMENT,
                      "%s: segment %lld (document %lld) has query count %lld and key count %lld",
                      FN, (long long)j, (long long)doc, (long long)qcount, (long long)kcount);
    if (qcount > cnt->max_query_count) cnt->max_query_count = qcount;
    if (kcount > cnt->max_key_count) cnt->max_key_count = kcount;
    for (int64_t q = g; q < seg_end; ++q) {
      int64_t i = q - qs;
      int ok = q < real_end && !(mask != NULL && mask[i] != 0);
      if (v) {
        starts[i] = (int32_t)doc_start;
        causal[i] = ok ? (int32_t)((q + 1 < real_end ? q + 1 : real_end) - doc_start) : 0;
        valid[i] = (uint8_t)ok;
        if (ok && vri) vri[nvalid] = i;
      }
      nvalid += ok;
    }
    if (v) {
      cu_k += kcount;
      scq[j + 1] = (int32_t)(seg_end - qs);
      sck[j + 1] = (int32_t)cu_k;
      qco[j] = (int32_t)(g - doc_start);
      if (ksi)
        for (int64_t k = 0; k < kcount; ++k) ksi[ks++] = doc_start + k;
    }
    cnt->key_count_sum += kcount;
    ++j;
    g = seg_end;
  }
  cnt->num_segments = j;
  cnt->num_valid = nvalid;
  return DSA_SUCCESS;
}

DSA_API dsa_status dsa_plan_create(const dsa_plan_desc *desc, dsa_plan **plan) {
  int64_t tq = 0;
  const int32_t *P = NULL;
  plan_counts cnt, cnt2;
  plan_layout lay;
  int identity, all_valid;
  size_t header;
  unsigned char *mem, *blob;
  struct dsa_plan *p;
  dsa_plan_view *v;

  if (plan != NULL) *plan = NULL;
  DSA_REQUIRE(desc != NULL, "%s: desc is NULL", FN);
  DSA_REQUIRE(plan != NULL, "%s: plan is NULL", FN);
  DSA_TRY(validate_desc(desc, &tq, &P));
  DSA_TRY(walk(desc, P, tq, &cnt, NULL));

  identity = desc->query_start == 0 && tq == desc->total_key_tokens;
  all_valid = cnt.num_valid == tq;
  lay = make_layout(tq, cnt.num_segments, !all_valid, cnt.num_valid, !identity, cnt.key_count_sum);

  /* header, up to 15 bytes to align the blob, then the blob: one allocation */
  header = sizeof(struct dsa_plan);
  mem = (unsigned char *)malloc(header + PLAN_ALIGN - 1 + lay.bytes);
  if (mem == NULL)
    return dsa_fail(DSA_ERROR_OUT_OF_HOST_MEMORY, "%s: malloc of %zu bytes failed", FN,
                    header + PLAN_ALIGN - 1 + lay.bytes);
  p = (struct dsa_plan *)mem;
  blob = (unsigned char *)(((uintptr_t)(mem + header) + PLAN_ALIGN - 1) & ~(uintptr_t)(PLAN_ALIGN - 1));
  /* zero the blob: the alignment gaps then upload as zeros, not as stale heap bytes */
  memset(blob, 0, lay.bytes);
  p->blob = blob;
  p->blob_bytes = lay.bytes;

  v = &p->view;
  memset(v, 0, sizeof *v);
  v->num_queries = tq;
  v->total_key_tokens = desc->total_key_tokens;
  v->query_start = desc->query_start;
  v->num_segments = cnt.num_segments;
  v->num_valid = cnt.num_valid;
  v->num_key_sources = identity ? 0 : cnt.key_count_sum;
  v->max_seqlen_q = (int32_t)cnt.max_query_count;
  v->max_seqlen_k = (int32_t)cnt.max_key_count;
  v->all_rows_nonempty = all_valid;
#define PLAN_AT_(field, type) \
  v->field = lay.field == SIZE_MAX ? NULL : (const type *)(blob + lay.field)
  PLAN_AT_(starts, int32_t);
  PLAN_AT_(causal_lengths, int32_t);
  PLAN_AT_(query_valid, uint8_t);
  PLAN_AT_(valid_row_indices, int64_t);
  PLAN_AT_(segment_cu_q, int32_t);
  PLAN_AT_(segment_cu_k, int32_t);
  PLAN_AT_(q_causal_offsets, int32_t);
  PLAN_AT_(key_source_indices, int64_t);
#undef PLAN_AT_

  {
    dsa_status s = walk(desc, P, tq, &cnt2, p);
    if (s != DSA_SUCCESS) {
      free(mem);
      return s;
    }
  }
  *plan = p;
  return DSA_SUCCESS;
}

DSA_API void dsa_plan_destroy(dsa_plan *plan) { free(plan); }

DSA_API const dsa_plan_view *dsa_plan_host_view(const dsa_plan *plan) {
  return plan != NULL ? &plan->view : NULL;
}

/* p rebased from the host blob into the device buffer (NULL stays NULL). */
static const void *rebase(const void *p, const unsigned char *blob, unsigned char *dev) {
  return p == NULL ? NULL : (const void *)(dev + ((const unsigned char *)p - blob));
}

DSA_API dsa_status dsa_plan_upload(dsa_context *ctx, const dsa_plan *plan, void *device_buffer,
                                   size_t *buffer_bytes, dsa_plan_view *device_view,
                                   dsa_stream_t stream) {
  static const char *const fn = "dsa_plan_upload";
  dsa_plan_view v;
  unsigned char *dev = (unsigned char *)device_buffer;
  cudaError_t e;

  DSA_REQUIRE(plan != NULL, "%s: plan is NULL", fn);
  DSA_REQUIRE(buffer_bytes != NULL, "%s: buffer_bytes is NULL", fn);
  DSA_REQUIRE(device_buffer == NULL || device_view != NULL,
              "%s: device_view is NULL (required when device_buffer is given)", fn);
  if (device_buffer == NULL) { /* size query */
    *buffer_bytes = plan->blob_bytes;
    return DSA_SUCCESS;
  }
  DSA_REQUIRE(((uintptr_t)device_buffer & (PLAN_ALIGN - 1)) == 0,
              "%s: device_buffer = %p is not 16-byte aligned", fn, device_buffer);
  if (*buffer_bytes < plan->blob_bytes)
    return dsa_fail(DSA_ERROR_WORKSPACE_TOO_SMALL, "%s: buffer_bytes = %zu is below the plan size %zu",
                    fn, *buffer_bytes, plan->blob_bytes);
  DSA_TRY(dsa_context_enter(ctx, fn));
  e = cudaMemcpyAsync(device_buffer, plan->blob, plan->blob_bytes, cudaMemcpyHostToDevice,
                      (cudaStream_t)stream);
  DSA_TRY(dsa_cuda_status((int)e, fn));

  v = plan->view;
  v.starts = (const int32_t *)rebase(v.starts, plan->blob, dev);
  v.causal_lengths = (const int32_t *)rebase(v.causal_lengths, plan->blob, dev);
  v.query_valid = (const uint8_t *)rebase(v.query_valid, plan->blob, dev);
  v.valid_row_indices = (const int64_t *)rebase(v.valid_row_indices, plan->blob, dev);
  v.segment_cu_q = (const int32_t *)rebase(v.segment_cu_q, plan->blob, dev);
  v.segment_cu_k = (const int32_t *)rebase(v.segment_cu_k, plan->blob, dev);
  v.q_causal_offsets = (const int32_t *)rebase(v.q_causal_offsets, plan->blob, dev);
  v.key_source_indices = (const int64_t *)rebase(v.key_source_indices, plan->blob, dev);
  *device_view = v;
  return DSA_SUCCESS;
}

/* Contract section 5: the checks an op runs on the view it is handed, before anything else runs.
 * Scalars and pointer presence only: a device view is never dereferenced on the host. Every
 * message names the field as plan-><field>. num_queries = 0 is zero-size work (only the scalars'
 * ranges are checked). num_queries / total_key_tokens < 0 skip the comparison with the op's own
 * sizes. */
dsa_status dsa_check_plan_view(const dsa_plan_view *v, int64_t num_queries,
                               int64_t total_key_tokens, const char *fn) {
  int64_t tq, tk;
  DSA_REQUIRE(v != NULL, "%s: plan is NULL", fn);
  tq = v->num_queries;
  tk = v->total_key_tokens;
  DSA_REQUIRE(tq >= 0 && tq <= INT32_MAX, "%s: plan->num_queries = %lld is outside 0..%d", fn,
              (long long)tq, INT32_MAX);
  DSA_REQUIRE(tk >= 0 && tk < PLAN_MAX_TOKENS, "%s: plan->total_key_tokens = %lld is outside 0..%lld",
              fn, (long long)tk, (long long)(PLAN_MAX_TOKENS - 1));
  DSA_REQUIRE(v->all_rows_nonempty == 0 || v->all_rows_nonempty == 1,
              "%s: plan->all_rows_nonempty = %d is not 0 or 1", fn, (int)v->all_rows_nonempty);
  DSA_REQUIRE(num_queries < 0 || tq == num_queries,
              "%s: plan->num_queries = %lld differs from the op's query count %lld", fn,
              (long long)tq, (long long)num_queries);
  DSA_REQUIRE(total_key_tokens < 0 || tk == total_key_tokens,
              "%s: plan->total_key_tokens = %lld differs from the op's key count %lld", fn,
              (long long)tk, (long long)total_key_tokens);
  if (tq == 0) return DSA_SUCCESS;
  DSA_REQUIRE(tk >= 1, "%s: plan->total_key_tokens = 0 with plan->num_queries = %lld (the queries are "
              "rows of the keys)", fn, (long long)tq);
  DSA_REQUIRE(v->query_start >= 0 && v->query_start <= tk - tq,
              "%s: plan->query_start = %lld with plan->num_queries = %lld: the query rows "
              "[query_start, query_start + num_queries) are outside [0, plan->total_key_tokens = %lld)",
              fn, (long long)v->query_start, (long long)tq, (long long)tk);
  DSA_REQUIRE(v->starts != NULL, "%s: plan->starts is NULL", fn);
  DSA_REQUIRE(v->causal_lengths != NULL, "%s: plan->causal_lengths is NULL", fn);
  DSA_REQUIRE(v->query_valid != NULL, "%s: plan->query_valid is NULL", fn);
  if (v->all_rows_nonempty) {
    DSA_REQUIRE(v->valid_row_indices == NULL,
                "%s: plan->valid_row_indices is set although plan->all_rows_nonempty = 1", fn);
    DSA_REQUIRE(v->num_valid == tq,
                "%s: plan->num_valid = %lld differs from plan->num_queries = %lld although "
                "plan->all_rows_nonempty = 1", fn, (long long)v->num_valid, (long long)tq);
  } else {
    DSA_REQUIRE(v->valid_row_indices != NULL,
                "%s: plan->valid_row_indices is NULL although plan->all_rows_nonempty = 0", fn);
    DSA_REQUIRE(v->num_valid >= 0 && v->num_valid < tq,
                "%s: plan->num_valid = %lld is outside 0..%lld (plan->all_rows_nonempty = 0)", fn,
                (long long)v->num_valid, (long long)(tq - 1));
  }
  DSA_REQUIRE(v->num_segments >= 1 && v->num_segments <= tq,
              "%s: plan->num_segments = %lld is outside 1..%lld (plan->num_queries)", fn,
              (long long)v->num_segments, (long long)tq);
  DSA_REQUIRE(v->segment_cu_q != NULL, "%s: plan->segment_cu_q is NULL", fn);
  DSA_REQUIRE(v->segment_cu_k != NULL, "%s: plan->segment_cu_k is NULL", fn);
  DSA_REQUIRE(v->q_causal_offsets != NULL, "%s: plan->q_causal_offsets is NULL", fn);
  DSA_REQUIRE(v->max_seqlen_q >= 1 && v->max_seqlen_q <= tq,
              "%s: plan->max_seqlen_q = %d is outside 1..%lld (plan->num_queries)", fn,
              (int)v->max_seqlen_q, (long long)tq);
  DSA_REQUIRE(v->max_seqlen_k >= 1 && v->max_seqlen_k <= tk,
              "%s: plan->max_seqlen_k = %d is outside 1..%lld (plan->total_key_tokens)", fn,
              (int)v->max_seqlen_k, (long long)tk);
  DSA_REQUIRE(v->num_key_sources >= 0, "%s: plan->num_key_sources = %lld is negative", fn,
              (long long)v->num_key_sources);
  DSA_REQUIRE((v->key_source_indices == NULL) == (v->num_key_sources == 0),
              "%s: plan->key_source_indices is %s but plan->num_key_sources = %lld", fn,
              v->key_source_indices == NULL ? "NULL" : "set", (long long)v->num_key_sources);
  return DSA_SUCCESS;
}
