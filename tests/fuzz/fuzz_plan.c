/* fuzz_plan.c - libFuzzer harness of dsa_plan_create (src/plan.c): the input decodes to a
 * dsa_plan_desc (structured documents with occasional corruption, or raw int32 offsets and int64
 * sizes); a rejected desc must give a status, a "dsa_plan_create: " message and no plan; an
 * accepted one must satisfy every invariant of the plan view (causal windows inside [0, T_k) and
 * causal, monotone segment arrays, consistent counts) and pass dsa_check_plan_view. */
#include "fuzz_common.h"
#include "dsa_testing.h"

#define MAX_SEQS 64

static void check_plan(const dsa_plan_desc *d, int64_t tq, const dsa_plan *plan) {
  const dsa_plan_view *v = dsa_plan_host_view(plan);
  const int64_t tk = d->total_key_tokens, qs = d->query_start;
  int64_t nvalid = 0, j = 0;
  FZ_CHECK(v != NULL, "no view");
  FZ_CHECK(v->num_queries == tq && v->total_key_tokens == tk && v->query_start == qs,
           "scalars %lld %lld %lld", (long long)v->num_queries, (long long)v->total_key_tokens,
           (long long)v->query_start);
  for (int64_t i = 0; i < tq; ++i) {
    const int64_t s = v->starts[i], c = v->causal_lengths[i], g = qs + i;
    FZ_CHECK(c >= 0 && c <= tk, "causal_lengths[%lld] = %lld", (long long)i, (long long)c);
    FZ_CHECK(s >= 0 && s + c <= tk, "starts[%lld] = %lld + %lld > T_k", (long long)i,
             (long long)s, (long long)c);
    FZ_CHECK(s <= g, "starts[%lld] = %lld after the query", (long long)i, (long long)s);
    FZ_CHECK(v->query_valid[i] <= 1, "query_valid[%lld]", (long long)i);
    if (v->query_valid[i]) {
      FZ_CHECK(c >= 1 && s + c <= g + 1, "row %lld sees the future or nothing", (long long)i);
      FZ_CHECK(d->padding_mask == NULL || d->padding_mask[i] == 0, "masked row %lld valid",
               (long long)i);
      if (!v->all_rows_nonempty) {
        FZ_CHECK(nvalid < v->num_valid && v->valid_row_indices[nvalid] == i,
                 "valid_row_indices[%lld]", (long long)nvalid);
      }
      ++nvalid;
    } else {
      FZ_CHECK(c == 0, "invalid row %lld has causal length %lld", (long long)i, (long long)c);
    }
  }
  FZ_CHECK(nvalid == v->num_valid, "num_valid %lld vs %lld", (long long)v->num_valid,
           (long long)nvalid);
  FZ_CHECK(v->all_rows_nonempty == (nvalid == tq), "all_rows_nonempty");
  FZ_CHECK((v->valid_row_indices == NULL) == (v->all_rows_nonempty != 0), "valid_row_indices");
  FZ_CHECK(v->num_segments >= 1 && v->num_segments <= tq, "num_segments %lld",
           (long long)v->num_segments);
  FZ_CHECK(v->segment_cu_q[0] == 0 && v->segment_cu_k[0] == 0, "segment arrays start at 0");
  int64_t maxq = 0, maxk = 0;
  for (j = 0; j < v->num_segments; ++j) {
    const int64_t nq = (int64_t)v->segment_cu_q[j + 1] - v->segment_cu_q[j];
    const int64_t nk = (int64_t)v->segment_cu_k[j + 1] - v->segment_cu_k[j];
    FZ_CHECK(nq >= 1 && nk >= 1, "segment %lld: %lld queries, %lld keys", (long long)j,
             (long long)nq, (long long)nk);
    FZ_CHECK(v->q_causal_offsets[j] >= 0 && v->q_causal_offsets[j] + nq == nk,
             "segment %lld: offset %d, %lld queries, %lld keys", (long long)j,
             (int)v->q_causal_offsets[j], (long long)nq, (long long)nk);
    if (nq > maxq) maxq = nq;
    if (nk > maxk) maxk = nk;
  }
  FZ_CHECK(v->segment_cu_q[v->num_segments] == tq, "segment_cu_q ends at %d",
           (int)v->segment_cu_q[v->num_segments]);
  FZ_CHECK(v->max_seqlen_q == maxq && v->max_seqlen_k == maxk, "max_seqlen_q/k");
  const int identity = qs == 0 && tq == tk;
  FZ_CHECK((v->key_source_indices == NULL) == identity, "key_source_indices vs identity");
  if (!identity) {
    FZ_CHECK(v->num_key_sources == v->segment_cu_k[v->num_segments], "num_key_sources");
    for (int64_t k = 0; k < v->num_key_sources; ++k)
      FZ_CHECK(v->key_source_indices[k] >= 0 && v->key_source_indices[k] < tk,
               "key_source_indices[%lld] = %lld", (long long)k,
               (long long)v->key_source_indices[k]);
  }
  FZ_CHECK(dsa_check_plan_view(v, tq, tk, "fuzz_plan") == DSA_SUCCESS, "dsa_check_plan_view: %s",
           dsa_last_error_message());
  /* the upload's size query needs no context; the upload itself fails on ctx = NULL before any
   * copy (the fake buffer is never touched) */
  size_t bytes = 0;
  FZ_CHECK(dsa_plan_upload(NULL, plan, NULL, &bytes, NULL, NULL) == DSA_SUCCESS && bytes >= 1,
           "upload size query");
  dsa_plan_view dv;
  FZ_CHECK(dsa_plan_upload(NULL, plan, (void *)(uintptr_t)0x100000, &bytes, &dv, NULL) ==
               DSA_ERROR_INVALID_ARGUMENT,
           "upload with ctx = NULL");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size};
  int32_t cu[MAX_SEQS + 1], pad[MAX_SEQS + 1];
  const uint8_t mode = fz_u8(&in);
  const int raw = mode & 1, use_pad = (mode >> 1) & 1, use_mask = (mode >> 2) & 1;
  int64_t S = 1 + fz_u8(&in) % MAX_SEQS;
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  cu[0] = pad[0] = 0;
  if (raw) { /* arbitrary offsets and sizes: mostly rejected */
    for (int64_t s = 0; s <= S; ++s) cu[s] = (s == 0 && (mode & 8)) ? fz_i32(&in) : (s ? fz_i32(&in) : 0);
    for (int64_t s = 0; s <= S; ++s) pad[s] = s ? fz_i32(&in) : (mode & 16 ? fz_i32(&in) : 0);
    d.total_key_tokens = fz_size(&in, 4096);
    if (mode & 32) d.num_seqs = fz_size(&in, S) ; else d.num_seqs = S;
    if (d.num_seqs > S) d.num_seqs = S; /* the arrays hold S + 1 entries */
  } else { /* well-formed documents, then at most one corrupted field */
    int64_t m = 0;
    for (int64_t s = 0; s < S; ++s) {
      int64_t r = 1 + fz_u8(&in), extra = fz_u8(&in);
      if (extra == 0xFF) r += (int64_t)fz_u8(&in) << 8; /* rarely a long document */
      extra = (extra & 3) == 0 ? (extra >> 2) % 8 : 0;
      cu[s + 1] = (int32_t)(cu[s] + r);
      pad[s + 1] = (int32_t)(pad[s] + r + extra);
      if (r > m) m = r;
    }
    d.num_seqs = S;
    d.total_key_tokens = use_pad ? pad[S] : cu[S];
    d.max_seqlen = (mode & 8) ? m : 0;
    const uint8_t corrupt = fz_u8(&in);
    if (corrupt >= 224) {
      const int64_t at = fz_u8(&in) % (S + 1);
      const int32_t delta = (int32_t)(int8_t)fz_u8(&in);
      switch (corrupt % 5) {
        case 0: cu[at] += delta; break;
        case 1: pad[at] += delta; break;
        case 2: d.total_key_tokens += delta; break;
        case 3: d.max_seqlen = m + delta; break;
        default: d.num_seqs = fz_size(&in, S); if (d.num_seqs > S) d.num_seqs = S; break;
      }
    }
  }
  d.cu_seqlens = cu;
  d.cu_seqlens_padded = use_pad ? pad : NULL;
  /* query range: all, or a slice (usually inside [0, T_k)) */
  const int64_t tk = d.total_key_tokens;
  const uint8_t qmode = fz_u8(&in);
  if (qmode < 64) {
    d.query_start = 0;
    d.num_queries = -1;
  } else if (qmode < 224 && tk > 0) {
    d.query_start = (int64_t)(fz_bytes(&in, 4) % (uint64_t)tk);
    d.num_queries = 1 + (int64_t)(fz_bytes(&in, 4) % (uint64_t)(tk - d.query_start));
  } else {
    d.query_start = fz_size(&in, 4096);
    d.num_queries = fz_size(&in, 4096);
  }
  /* huge key counts only with short query ranges: the planner's work is linear in T_q */
  if (tk > (1 << 16) && (d.num_queries == -1 || d.num_queries > 4096))
    d.num_queries = 1 + (d.num_queries & 4095);
  const int64_t tq = d.num_queries == -1 ? tk : d.num_queries;
  uint8_t *mask = NULL;
  if (use_mask && tq > 0 && tq <= (1 << 16)) {
    mask = (uint8_t *)malloc((size_t)tq);
    if (mask == NULL) return 0;
    const uint8_t density = fz_u8(&in);
    for (int64_t i = 0; i < tq; ++i) mask[i] = (uint8_t)((in.n ? fz_u8(&in) : (uint8_t)(i * 37)) < density);
  }
  d.padding_mask = mask;
  d.max_seqlen = raw ? fz_size(&in, 300) : d.max_seqlen;

  dsa_plan *plan = (dsa_plan *)(uintptr_t)1; /* must be reset to NULL on failure */
  const dsa_status s = dsa_plan_create(&d, &plan);
  if (s == DSA_SUCCESS) {
    FZ_CHECK(plan != NULL, "success without a plan");
    check_plan(&d, tq, plan);
    dsa_plan_destroy(plan);
  } else {
    FZ_CHECK(s == DSA_ERROR_INVALID_ARGUMENT || s == DSA_ERROR_OUT_OF_HOST_MEMORY, "status %d", (int)s);
    FZ_CHECK(plan == NULL, "failed call left a plan");
    FZ_CHECK(strncmp(dsa_last_error_message(), "dsa_plan_create: ", 17) == 0, "message \"%s\"",
             dsa_last_error_message());
  }
  free(mask);
  return 0;
}
