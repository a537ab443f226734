/* example.c - a plain C99 program using the installed libdsa through pkg-config (make check-install).
 * It runs the CPU reference on a tiny case, and the GPU forward when a device is present. */
#include <math.h>
#include <stdio.h>
#include <dsa.h>

int main(void) {
  /* one query, one head, D = 512, two slots: a textbook softmax over two keys */
  static uint16_t q[512], kv[2 * 512], out[512];
  int32_t idx[2] = {0, 1};
  float lse = 0.0f;
  dsa_attn_fwd_params p = {0};
  dsa_context *ctx = NULL;
  dsa_status s;
  int i;
  for (i = 0; i < 512; ++i) {
    q[i] = dsa_f32_to_bf16(i == 0 ? 1.0f : 0.0f);
    kv[i] = dsa_f32_to_bf16(i == 0 ? 1.0f : 0.5f);
    kv[512 + i] = dsa_f32_to_bf16(0.0f);
  }
  p.num_tokens = 1; p.num_heads = 1; p.head_dim = 512; p.num_kv = 2; p.topk = 2;
  p.softmax_scale = 1.0f; p.q = q; p.kv = kv; p.indices = idx; p.out = out; p.lse = &lse;
  s = dsa_ref_sparse_attn_fwd(&p);
  if (s != DSA_SUCCESS) {
    fprintf(stderr, "dsa_ref_sparse_attn_fwd: %s: %s\n", dsa_status_string(s), dsa_last_error_message());
    return 1;
  }
  /* logits 1 and 0: lse = ln(e + 1) */
  if (fabs(lse - log(exp(1.0) + 1.0)) > 1e-5) { fprintf(stderr, "lse %f wrong\n", lse); return 1; }
  printf("libdsa %s: reference lse = %.6f (expected %.6f)\n", dsa_version_string(), lse, log(exp(1.0) + 1.0));
  s = dsa_context_create(&ctx, 0);
  printf("dsa_context_create: %s\n", dsa_status_string(s));
  dsa_context_destroy(ctx);
  return 0;
}
