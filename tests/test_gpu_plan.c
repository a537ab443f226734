/* test_gpu_plan.c - dsa_plan_upload on a device: the blob lands in a poisoned cudaMalloc'd buffer on a
 * non-default stream, every array is read back through the device view and compared with the host
 * view, at the buffer start and at a 16-byte offset. */
#include "test_common.h"

typedef struct gpu_env {
  dsa_context *ctx;
  cudaStream_t stream;
} gpu_env;

static gpu_env env_open(void) {
  gpu_env e;
  TC_OK(dsa_context_create(&e.ctx, 0));
  TC_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamDefault));
  return e;
}

static void env_close(gpu_env *e) {
  TC_CUDA(cudaStreamDestroy(e->stream));
  dsa_context_destroy(e->ctx);
}

/* Copies n elements of `elem` bytes from the device array d and compares them with the host array h;
 * both NULL or both present. d must lie inside [buf, buf + bytes). */
static void compare_array(const void *d, const void *h, int64_t n, size_t elem, const char *name,
                          const unsigned char *buf, size_t bytes) {
  cr_assert_eq(d == NULL, h == NULL, "%s: device %p, host %p (presence differs)", name, d, h);
  if (d == NULL) return;
  size_t sz = (size_t)n * elem;
  cr_assert((const unsigned char *)d >= buf && (const unsigned char *)d + sz <= buf + bytes,
            "%s at %p outside the buffer [%p, +%zu)", name, d, (const void *)buf, bytes);
  cr_assert_eq((uintptr_t)d % 16, 0, "%s not 16-byte aligned on the device", name);
  if (sz == 0) return;
  unsigned char *back = (unsigned char *)malloc(sz);
  cr_assert_not_null(back);
  memset(back, 0x5A, sz);
  TC_CUDA(cudaMemcpy(back, d, sz, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < sz; ++i)
    cr_assert_eq(back[i], ((const unsigned char *)h)[i], "%s: byte %zu is 0x%02x, host has 0x%02x", name,
                 i, back[i], ((const unsigned char *)h)[i]);
  free(back);
}

static void compare_views(const dsa_plan_view *dv, const dsa_plan_view *hv, const unsigned char *buf,
                          size_t bytes) {
  cr_assert_eq(dv->num_queries, hv->num_queries);
  cr_assert_eq(dv->total_key_tokens, hv->total_key_tokens);
  cr_assert_eq(dv->query_start, hv->query_start);
  cr_assert_eq(dv->num_segments, hv->num_segments);
  cr_assert_eq(dv->num_valid, hv->num_valid);
  cr_assert_eq(dv->num_key_sources, hv->num_key_sources);
  cr_assert_eq(dv->max_seqlen_q, hv->max_seqlen_q);
  cr_assert_eq(dv->max_seqlen_k, hv->max_seqlen_k);
  cr_assert_eq(dv->all_rows_nonempty, hv->all_rows_nonempty);
  int64_t tq = hv->num_queries, ns = hv->num_segments;
  compare_array(dv->starts, hv->starts, tq, 4, "starts", buf, bytes);
  compare_array(dv->causal_lengths, hv->causal_lengths, tq, 4, "causal_lengths", buf, bytes);
  compare_array(dv->query_valid, hv->query_valid, tq, 1, "query_valid", buf, bytes);
  compare_array(dv->valid_row_indices, hv->valid_row_indices, hv->num_valid, 8, "valid_row_indices",
                buf, bytes);
  compare_array(dv->segment_cu_q, hv->segment_cu_q, ns + 1, 4, "segment_cu_q", buf, bytes);
  compare_array(dv->segment_cu_k, hv->segment_cu_k, ns + 1, 4, "segment_cu_k", buf, bytes);
  compare_array(dv->q_causal_offsets, hv->q_causal_offsets, ns, 4, "q_causal_offsets", buf, bytes);
  compare_array(dv->key_source_indices, hv->key_source_indices, hv->num_key_sources, 8,
                "key_source_indices", buf, bytes);
}

/* Uploads `d`'s plan at buffer offsets 0 and 16 of a poisoned buffer and checks the device copy. */
static void upload_and_compare(gpu_env *e, const dsa_plan_desc *d) {
  dsa_plan *p = NULL;
  size_t need = 0, bytes;
  unsigned char *buf = NULL;
  dsa_plan_view dv;
  TC_OK(dsa_plan_create(d, &p));
  TC_OK(dsa_plan_upload(e->ctx, p, NULL, &need, NULL, e->stream));
  cr_assert(need >= 1);
  TC_CUDA(cudaMalloc((void **)&buf, need + 16));
  for (size_t off = 0; off <= 16; off += 16) {
    TC_CUDA(cudaMemsetAsync(buf, 0xA5, need + 16, e->stream)); /* poison */
    bytes = need;
    memset(&dv, 0, sizeof dv);
    TC_OK(dsa_plan_upload(e->ctx, p, buf + off, &bytes, &dv, e->stream));
    TC_CUDA(cudaStreamSynchronize(e->stream));
    cr_assert_eq(bytes, need, "buffer_bytes changed by the upload");
    compare_views(&dv, dsa_plan_host_view(p), buf + off, need);
  }
  TC_CUDA(cudaFree(buf));
  dsa_plan_destroy(p); /* after the stream sync: the copy has read the blob */
}

Test(gpu_plan, upload_example_a_on_stream) {
  TC_REQUIRE_GPU();
  static const int32_t cu[] = {0, 3, 7, 9}, P[] = {0, 4, 9, 12};
  gpu_env e = env_open();
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu, d.cu_seqlens_padded = P, d.num_seqs = 3, d.total_key_tokens = 12;
  d.query_start = 2, d.num_queries = 8;
  upload_and_compare(&e, &d);
  env_close(&e);
}

/* Identity with a padding mask (key_source_indices absent, valid_row_indices present) and a plain
 * identity (both absent): absent arrays stay NULL in the device view. */
Test(gpu_plan, upload_identity_plans) {
  TC_REQUIRE_GPU();
  static const int32_t cu_b[] = {0, 3, 8}, cu_c[] = {0, 2, 5};
  static const uint8_t mask[] = {0, 0, 0, 0, 0, 1, 1, 1};
  gpu_env e = env_open();
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu_b, d.num_seqs = 2, d.total_key_tokens = 8, d.num_queries = -1;
  d.padding_mask = mask;
  upload_and_compare(&e, &d);
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu_c, d.num_seqs = 2, d.total_key_tokens = 5, d.num_queries = -1;
  upload_and_compare(&e, &d);
  env_close(&e);
}

/* A large CP slice: many documents, a few thousand queries. */
Test(gpu_plan, upload_large_random_slice) {
  TC_REQUIRE_GPU();
  tc_rng r = tc_seed("gpu_plan large slice");
  enum { S = 300 };
  int32_t cu[S + 1], P[S + 1];
  cu[0] = P[0] = 0;
  for (int s = 0; s < S; ++s) {
    int32_t real = 1 + (int32_t)tc_below(&r, 100), pad = (int32_t)tc_below(&r, 8);
    cu[s + 1] = cu[s] + real;
    P[s + 1] = P[s] + real + pad;
  }
  int64_t T = P[S] + (4 - P[S] % 4) % 4; /* T_k a multiple of cp = 4: pad the last document */
  P[S] = (int32_t)T;
  uint8_t *mask = (uint8_t *)malloc((size_t)T);
  int64_t L = T / 4;
  for (int64_t i = 0; i < L; ++i) mask[i] = tc_uniform(&r) < 0.1;
  gpu_env e = env_open();
  dsa_plan_desc d;
  memset(&d, 0, sizeof d);
  d.cu_seqlens = cu, d.cu_seqlens_padded = P, d.num_seqs = S, d.total_key_tokens = T;
  d.query_start = 2 * L, d.num_queries = L, d.padding_mask = mask;
  upload_and_compare(&e, &d);
  env_close(&e);
  free(mask);
}
