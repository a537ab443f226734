/*
 * dsa_bench.c - `make bench`: every canonical shape (docs/perf.md, "Targets") for
 * every op, timed with CUDA events after an L2 flush (median of --reps, after one warm-up call, the
 * call's host work queued outside the events), with the same-run ceilings (cuBLAS bf16 GEMM 8192^3,
 * 1 GiB device-to-device copy). Writes a table and bench/results/YYYY-MM-DD-<card>.json (rewritten
 * after every row, so a crash keeps what ran).
 *
 * Peers run in the same process on the same inputs, each in its own loop of reps: given
 * --flashmla PATH (or DSA_BENCH_FLASHMLA=PATH) naming FlashMLA's libflashmla_sparse.so, every fwd
 * row also times FlashMLA's SM90 sparse forward (loaded with dlopen; never linked into libdsa) and
 * checks its output against libdsa's. The bwd, idx and topk peers (cuDNN FE, torch.topk) are Python:
 * bench/cudnn_peer.py writes rows of the same schema. A row's peer_ratio (peer ms / libdsa ms, > 1:
 * libdsa faster) is present only when peer_same_run is true.
 *
 *   dsa_bench [--shapes a,b,c] [--reps N] [--out FILE] [--flashmla PATH] [--constructed-indices]
 *             [--fwd-variant N] [--fwd-handoff LIST] [--list]
 *
 * Kernel choices for A/B runs go through the public tuning interface (include/dsa_tune.h) on the
 * bench's context: --fwd-variant, --fwd-handoff and the environment knobs below.
 *
 * An op that returns DSA_ERROR_UNSUPPORTED is reported as "not on the GPU yet", never a failure.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_common.h"
#include "dsa_tune.h"

/* DSA_OPTION_FWD_KERNEL from --fwd-variant N (0 automatic, 1 portable, 2 sm_90a 64-head, 3 sm_90a
 * small-H, 4 split); fwd rows then get ,portable / ,sm90 / ,small / ,split. */
static int fwd_variant_forced; /* 0: automatic */
/* DSA_OPTION_FWD_SM90_HANDOFF from --fwd-handoff LIST or DSA_FWD_HANDOFF=LIST ("0,1": 0 named
 * barriers, 1 mbarriers): every fwd row runs once per listed hand-off and its variant gets ",ho<N>";
 * neither given: the library default, no suffix. */
static int fwd_handoff_list[4], fwd_handoff_count; /* count 0: library default, no suffix */
/* Parses a list of single digits 0..max_digit, "0,1,2", into list (at most cap entries), count set;
 * 0 on success, -1 on a malformed or empty list. */
static int parse_digit_list(const char *s, int max_digit, int *list, int cap, int *count) {
  *count = 0;
  while (*s) {
    if (*s < '0' || *s > '0' + max_digit || *count == cap) return -1;
    list[(*count)++] = *s++ - '0';
    if (*s == ',') ++s;
    else if (*s) return -1;
  }
  return *count > 0 ? 0 : -1;
}
static int parse_handoff_list(const char *s) {
  return parse_digit_list(s, DSA_FWD_HANDOFF_MBARRIER, fwd_handoff_list, 4, &fwd_handoff_count);
}
/* Options from the environment (unset: the library's default), each adding to the rows' variant:
 * DSA_BWD_VARIANT -> DSA_OPTION_BWD_KERNEL (1 portable, 2 sm_90a lockstep 64-head, 4 sm_90a
 * warp-specialised 64-head; 3, the retired small-H kernel, fails; ",bv<N>"),
 * DSA_FWD_KV_L2_HINT -> DSA_OPTION_FWD_KV_L2_HINT (0 none, 1 evict_last, 2 if it fits; ",l2h<N>"),
 * DSA_FWD_SMALL_AUTO_MAX -> DSA_OPTION_FWD_SMALL_AUTO_MAX (0..63; ",sam<N>"),
 * DSA_TOPK_KERNEL -> DSA_OPTION_TOPK_KERNEL (1 radix, 2 filter; ",radix" / ",filter"). The idx rows
 * "fused,mma" / "fused,wgmma" set DSA_OPTION_INDEXER_FUSED_KERNEL themselves.
 * DSA_INDEXER_SCORES_BUDGET -> DSA_OPTION_INDEXER_SCORES_BUDGET (bytes, below 2^31) leaves the
 * variant as it is (printed only), so that bench/ab_multi.sh pairs the rows of processes run with
 * and without it. */
static int bwd_variant_forced = -1, fwd_l2_hint_forced = -1, fwd_small_max_forced = -1, topk_kernel_forced = -1;
/* Sets option `opt` on ctx from the environment variable `name` when it is set: prints it and
 * returns the value, -1 when unset; exits on a value the library rejects. */
static int env_option(dsa_context *ctx, const char *name, dsa_option opt, const char *what) {
  const char *s = getenv(name);
  if (!s || !*s) return -1;
  const int v = atoi(s);
  const dsa_status st = dsa_context_set_option(ctx, opt, v);
  if (st != DSA_SUCCESS) {
    fprintf(stderr, "%s=%s: %s\n", name, s, dsa_last_error_message());
    exit(2);
  }
  printf("%s %d (%s)\n", what, v, name);
  return v;
}
/* dsa_context_set_option where the value was checked already (the bench's own lists). */
static void set_option(dsa_context *ctx, dsa_option opt, int64_t value) {
  if (dsa_context_set_option(ctx, opt, value) != DSA_SUCCESS) {
    fprintf(stderr, "dsa_context_set_option: %s\n", dsa_last_error_message());
    exit(2);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Canonical shapes (names are stable: results are compared over time by name).
 * ------------------------------------------------------------------------------------------- */
typedef enum { OP_FWD, OP_BWD, OP_IDX, OP_TOPK, OP_TRAIN } op_kind;
static const char *const op_names[] = {"sparse fwd", "sparse bwd", "indexer+topk", "topk", "indexer train"};

typedef struct shape {
  const char *name;
  op_kind op;
  int64_t tokens;      /* T (queries / rows) */
  int32_t heads;       /* H (attention) or H_idx (indexer) */
  int32_t k;           /* K */
  int64_t keys;        /* s_kv / T_k / columns */
  int v32;             /* 1: random distinct indices over all keys + sink (DeepSeek V3.2 shapes) */
  const char *desc;
  int d;               /* attention head dim; 0 = 576 */
} shape;

/* GLM shapes with keys > tokens are the last context-parallel rank: query_start = keys - tokens. */
static const shape shapes[] = {
    {"fwd-v32-8k", OP_FWD, 4096, 128, 2048, 8192, 1, "T=4096 H=128 K=2048 s_kv=8192, random distinct indices, sink", 0},
    {"fwd-v32-32k", OP_FWD, 4096, 128, 2048, 32768, 1, "T=4096 H=128 K=2048 s_kv=32768, random distinct indices, sink", 0},
    {"fwd-v32-128k", OP_FWD, 4096, 128, 2048, 131072, 1, "T=4096 H=128 K=2048 s_kv=131072, random distinct indices, sink", 0},
    {"fwd-v32-8k-h64", OP_FWD, 4096, 64, 2048, 8192, 1, "T=4096 H=64 K=2048 s_kv=8192, random distinct indices, sink", 0},
    {"fwd-glm-4k", OP_FWD, 4096, 64, 2048, 4096, 0, "T=4096 H=64 K=2048 s_kv=4096, causal indices, topk_length", 0},
    {"fwd-glm-cp8", OP_FWD, 4096, 64, 2048, 32768, 0, "T=4096 (last of 8 CP ranks) H=64 K=2048 s_kv=32768", 0},
    {"fwd-tp-h8", OP_FWD, 4096, 8, 2048, 32768, 0, "T=4096 (last CP rank) H=8 K=2048 s_kv=32768", 0},
    {"fwd-tp-h16", OP_FWD, 4096, 16, 2048, 32768, 0, "T=4096 (last CP rank) H=16 K=2048 s_kv=32768", 0},
    {"fwd-tp-h32", OP_FWD, 4096, 32, 2048, 32768, 0, "T=4096 (last CP rank) H=32 K=2048 s_kv=32768", 0},
    {"bwd-glm-4k", OP_BWD, 4096, 64, 2048, 4096, 0, "T=4096 H=64 K=2048 s_kv=4096, topk_length, det 0 and 1", 0},
    {"bwd-glm-16k", OP_BWD, 4096, 64, 2048, 16384, 0, "T=4096 (last rank) H=64 K=2048 s_kv=16384", 0},
    {"bwd-glm-32k", OP_BWD, 4096, 64, 2048, 32768, 0, "T=4096 (last rank) H=64 K=2048 s_kv=32768", 0},
    {"bwd-tp-h16", OP_BWD, 4096, 16, 2048, 32768, 0, "T=4096 (last rank) H=16 K=2048 s_kv=32768", 0},
    {"bwd-v32-8k", OP_BWD, 4096, 128, 2048, 8192, 1, "T=4096 H=128 K=2048 s_kv=8192, random distinct indices, sink", 0},
    {"idx-glm-4k", OP_IDX, 4096, 32, 2048, 4096, 0, "one causal sequence T_q=T_k=4096, H_idx=32, engines cublas and fused", 0},
    {"idx-glm-cp8", OP_IDX, 4096, 32, 2048, 32768, 0, "T_q=4096 (last of 8 ranks) of a 32768-token sequence, H_idx=32", 0},
    {"idx-32k", OP_IDX, 32768, 32, 2048, 32768, 0, "one causal sequence of 32768 tokens, H_idx=32", 0},
    {"idx-32k-h64", OP_IDX, 32768, 64, 2048, 32768, 0, "one causal sequence of 32768 tokens, H_idx=64", 0},
    {"topk-32k", OP_TOPK, 4096, 0, 2048, 32768, 0, "4096 rows x 32768 fp32, K=2048, causal lengths and full rows", 0},
    {"topk-128k", OP_TOPK, 4096, 0, 2048, 131072, 0, "4096 rows x 131072 fp32, K=2048, causal lengths and full rows", 0},
    {"train-glm-4k", OP_TRAIN, 4096, 32, 2048, 4096, 0, "indexer training on idx-glm-4k's indices: slot scores, KL loss, indexer bwd det 0 / 1", 0},
    {"train-glm-cp8", OP_TRAIN, 4096, 32, 2048, 32768, 0, "indexer training on idx-glm-cp8's indices (last of 8 ranks)", 0},
    {"train-32k", OP_TRAIN, 32768, 32, 2048, 32768, 0, "indexer training on idx-32k's indices", 0},
    /* Not canonical: head counts between the kernels' native blocks, and D = 512. */
    {"fwd-tp-h40", OP_FWD, 4096, 40, 2048, 32768, 0, "T=4096 (last CP rank) H=40 K=2048 s_kv=32768 (not canonical)", 0},
    {"fwd-tp-h48", OP_FWD, 4096, 48, 2048, 32768, 0, "T=4096 (last CP rank) H=48 K=2048 s_kv=32768 (not canonical)", 0},
    {"fwd-tp-h56", OP_FWD, 4096, 56, 2048, 32768, 0, "T=4096 (last CP rank) H=56 K=2048 s_kv=32768 (not canonical)", 0},
    {"fwd-v32-8k-h96", OP_FWD, 4096, 96, 2048, 8192, 1, "T=4096 H=96 K=2048 s_kv=8192, V3.2 indices (not canonical)", 0},
    {"fwd-glm-cp8-k4096", OP_FWD, 4096, 64, 4096, 32768, 0, "fwd-glm-cp8 at K=4096 (DSA_MAX_ATTN_TOPK; constructed indices; not canonical)", 0},
    {"bwd-glm-16k-k2051", OP_BWD, 4096, 64, 2051, 16384, 0, "bwd-glm-16k at K=2051 (a pooled indexer's width; constructed indices; not canonical)", 0},
    {"bwd-glm-4k-d512", OP_BWD, 4096, 64, 2048, 4096, 0, "bwd-glm-4k at head dim 512 (not canonical)", 512},
};
#define NUM_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* ---------------------------------------------------------------------------------------------
 * FlashMLA, the forward's peer: its C entry point (flashmla_sparse.h of the peers' folder), resolved
 * with dlopen at run time. Rules it enforces: h_q 64 or 128, d_qk 512 or 576, topk a multiple of 128,
 * contiguous tensors, 16-byte aligned pointers; lse natural log without the sink.
 * ------------------------------------------------------------------------------------------- */
typedef int (*flashmla_fwd_fn)(const void *q, const void *kv, const int32_t *indices, const float *attn_sink,
                               const int32_t *topk_length, void *out, float *max_logits, float *lse, int s_q,
                               int s_kv, int h_q, int d_qk, int topk, float sm_scale, int num_sm,
                               struct CUstream_st *stream);
typedef struct flashmla_peer {
  flashmla_fwd_fn fwd;
  const char *(*last_error)(void);
  char path[512];
} flashmla_peer;
static const char *const FLASHMLA_NAME = "FlashMLA 9241ae3 SM90 sparse fwd";

/* 0 on success; else prints why and returns -1 (the bench then runs without the peer). */
static int flashmla_load(flashmla_peer *f, const char *path) {
  memset(f, 0, sizeof *f);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "--flashmla: cannot load %s: %s\n", path, dlerror());
    return -1;
  }
  *(void **)&f->fwd = dlsym(h, "flashmla_sparse_fwd");
  *(void **)&f->last_error = dlsym(h, "flashmla_sparse_last_error");
  if (!f->fwd || !f->last_error) {
    fprintf(stderr, "--flashmla: %s lacks flashmla_sparse_fwd / flashmla_sparse_last_error\n", path);
    dlclose(h);
    memset(f, 0, sizeof *f);
    return -1;
  }
  snprintf(f->path, sizeof f->path, "%s", path);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Results
 * ------------------------------------------------------------------------------------------- */
typedef struct result {
  const char *shape;
  const char *op;
  char variant[32];
  char note[160];
  double ms;
  double work;      /* FLOP or bytes by the counting rules */
  int is_bytes;     /* 1: GB/s, 0: TFLOP/s */
  double rate;      /* TFLOP/s or GB/s */
  double ceiling_ratio;
  /* The peer of this row, when one ran or was meant to (peer_name NULL: none in this program). */
  const char *peer_name;
  double peer_ms, peer_rate, peer_ratio; /* peer_ratio = peer_ms / ms, same-run peers only */
  int peer_same_run;
  double peer_max_rel_diff;  /* max |out_peer - out| / max |out| over the useful heads */
  double peer_lse_max_diff;  /* max |lse_peer - lse| over the finite entries */
  char peer_status[200];
  char status[200];
} result;

/* What a peer's run of a row gave: ms NAN (and status saying why) when it did not run. */
typedef struct peer_result {
  const char *name;
  double ms;
  int same_run;
  double max_rel_diff, lse_max_diff;
  char status[200];
} peer_result;

typedef struct bench {
  dsa_context *ctx;
  bc_timer timer;
  bc_ceilings ceil;
  tc_rng rng;
  int constructed_indices;
  char card[128], card_file[128], commit[64], date[16];
  const char *out_path;
  flashmla_peer *flashmla; /* NULL: FlashMLA not given */
  result *rows;
  int num_rows, cap_rows;
} bench;

static void status_text(char *buf, size_t n, dsa_status s) {
  const char *msg = dsa_last_error_message();
  if (s == DSA_SUCCESS) snprintf(buf, n, "ok");
  else if (s == DSA_ERROR_UNSUPPORTED) snprintf(buf, n, "not on the GPU yet%s%s%s", *msg ? " (" : "", msg, *msg ? ")" : "");
  else snprintf(buf, n, "error: %s: %s", dsa_status_string(s), dsa_last_error_message());
}

static void write_json(const bench *b) {
  FILE *f = fopen(b->out_path, "w");
  if (!f) {
    fprintf(stderr, "warning: cannot write %s\n", b->out_path);
    return;
  }
  fprintf(f, "[\n");
  for (int i = 0; i < b->num_rows; ++i) {
    const result *r = &b->rows[i];
    fprintf(f, "  {\"shape\": ");
    bc_json_string(f, r->shape);
    fprintf(f, ", \"op\": ");
    bc_json_string(f, r->op);
    fprintf(f, ", \"variant\": ");
    bc_json_string(f, r->variant);
    fprintf(f, ", \"ms\": ");
    bc_json_number(f, r->ms);
    fprintf(f, ", \"tflops\": ");
    bc_json_number(f, r->is_bytes ? NAN : r->rate);
    fprintf(f, ", \"gbps\": ");
    bc_json_number(f, r->is_bytes ? r->rate : NAN);
    fprintf(f, ", \"unit\": ");
    bc_json_string(f, r->is_bytes ? "GB/s" : "TFLOP/s");
    fprintf(f, ", \"work\": ");
    bc_json_number(f, r->work);
    fprintf(f, ", \"ceiling_ratio\": ");
    bc_json_number(f, r->ceiling_ratio);
    fprintf(f, ", \"gemm_ceiling_tflops\": ");
    bc_json_number(f, b->ceil.gemm_tflops);
    fprintf(f, ", \"copy_ceiling_gbps\": ");
    bc_json_number(f, b->ceil.copy_gbps);
    fprintf(f, ", \"peer\": ");
    if (r->peer_name) bc_json_string(f, r->peer_name);
    else fputs("null", f);
    fprintf(f, ", \"peer_ms\": ");
    bc_json_number(f, r->peer_ms);
    fprintf(f, ", \"peer_rate\": ");
    bc_json_number(f, r->peer_rate);
    fprintf(f, ", \"peer_same_run\": %s", r->peer_same_run ? "true" : "false");
    fprintf(f, ", \"peer_ratio\": ");
    bc_json_number(f, r->peer_ratio);
    fprintf(f, ", \"peer_max_rel_diff\": ");
    bc_json_number(f, r->peer_max_rel_diff);
    fprintf(f, ", \"peer_lse_max_diff\": ");
    bc_json_number(f, r->peer_lse_max_diff);
    fprintf(f, ", \"peer_status\": ");
    bc_json_string(f, r->peer_status);
    fprintf(f, ", \"process\": \"dsa_bench\"");
    fprintf(f, ", \"note\": ");
    bc_json_string(f, r->note);
    fprintf(f, ", \"reps\": %d, \"card\": ", b->timer.reps);
    bc_json_string(f, b->card);
    fprintf(f, ", \"commit\": ");
    bc_json_string(f, b->commit);
    fprintf(f, ", \"date\": ");
    bc_json_string(f, b->date);
    fprintf(f, ", \"status\": ");
    bc_json_string(f, r->status);
    fprintf(f, "}%s\n", i + 1 < b->num_rows ? "," : "");
  }
  fprintf(f, "]\n");
  fclose(f);
}

/* Records a finished (or failed) measurement and its peer's (pr NULL: the op's peer is not run by
 * this program), prints its line, rewrites the JSON. */
/* add_result for a row whose op is not its shape's (op: the row's op name). */
static void add_result_op(bench *b, const shape *sh, const char *op, const char *variant, const char *note,
                          dsa_status s, double ms, double work, int is_bytes, const peer_result *pr);
static void add_result(bench *b, const shape *sh, const char *variant, const char *note, dsa_status s, double ms,
                       double work, int is_bytes, const peer_result *pr) {
  add_result_op(b, sh, op_names[sh->op], variant, note, s, ms, work, is_bytes, pr);
}

static void add_result_op(bench *b, const shape *sh, const char *op, const char *variant, const char *note,
                          dsa_status s, double ms, double work, int is_bytes, const peer_result *pr) {
  if (b->num_rows == b->cap_rows) {
    b->cap_rows = b->cap_rows ? 2 * b->cap_rows : 64;
    b->rows = realloc(b->rows, (size_t)b->cap_rows * sizeof(result));
    if (!b->rows) bc_die("out of host memory");
  }
  result *r = &b->rows[b->num_rows++];
  memset(r, 0, sizeof *r);
  r->shape = sh->name;
  r->op = op;
  snprintf(r->variant, sizeof r->variant, "%s", variant);
  snprintf(r->note, sizeof r->note, "%s", note ? note : "");
  r->work = work;
  r->is_bytes = is_bytes;
  r->ms = r->rate = r->ceiling_ratio = r->peer_ms = r->peer_rate = r->peer_ratio = NAN;
  r->peer_max_rel_diff = r->peer_lse_max_diff = NAN;
  status_text(r->status, sizeof r->status, s);
  if (pr) {
    r->peer_name = pr->name;
    snprintf(r->peer_status, sizeof r->peer_status, "%s", pr->status);
    r->peer_max_rel_diff = pr->max_rel_diff;
    r->peer_lse_max_diff = pr->lse_max_diff;
    if (isfinite(pr->ms) && pr->ms > 0) {
      r->peer_ms = pr->ms;
      r->peer_same_run = pr->same_run;
      r->peer_rate = is_bytes ? work / (pr->ms * 1e-3) / 1e9 : work / (pr->ms * 1e-3) / 1e12;
    }
  } else {
    snprintf(r->peer_status, sizeof r->peer_status, "peer run by bench/cudnn_peer.py");
  }
  if (s == DSA_SUCCESS && isfinite(ms) && ms > 0) {
    r->ms = ms;
    r->rate = is_bytes ? work / (ms * 1e-3) / 1e9 : work / (ms * 1e-3) / 1e12;
    r->ceiling_ratio = r->rate / (is_bytes ? b->ceil.copy_gbps : b->ceil.gemm_tflops);
    if (r->peer_same_run) r->peer_ratio = r->peer_ms / ms;
    printf("%.3f ms, %.1f %s (%.0f%% of %s)", r->ms, r->rate, is_bytes ? "GB/s" : "TFLOP/s",
           100.0 * r->ceiling_ratio, is_bytes ? "copy" : "GEMM");
    if (r->peer_same_run)
      printf("; %s %.3f ms: %.2fx (same run), out rel diff %.1e", r->peer_name, r->peer_ms, r->peer_ratio,
             r->peer_max_rel_diff);
    else if (pr)
      printf("; peer: %s", r->peer_status);
    printf("\n");
  } else {
    printf("%s\n", r->status);
  }
  fflush(stdout);
  write_json(b);
}

static int job_index, job_count;
static void progress(const shape *sh, const char *variant) {
  printf("[%d/%d] %s: %s %s ... ", ++job_index, job_count, sh->name, op_names[sh->op], variant);
  fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
 * Indexer setup (used by the idx-* rows and to make realistic indices for the GLM attention rows)
 * ------------------------------------------------------------------------------------------- */
typedef struct idx_setup {
  dsa_plan *plan;
  void *plan_buf;
  dsa_plan_view dview;
  uint16_t *q, *k;
  float *w;
  void *ws;
  size_t ws_bytes;
  dsa_indexer_params p;
  dsa_context *ctx;
} idx_setup;

static void idx_setup_free(idx_setup *s) {
  cudaFree(s->plan_buf);
  cudaFree(s->q);
  cudaFree(s->k);
  cudaFree(s->w);
  cudaFree(s->ws);
  dsa_plan_destroy(s->plan);
  memset(s, 0, sizeof *s);
}

/* One causal sequence of T_k tokens; queries query_start .. query_start + T_q - 1. */
static dsa_status idx_setup_create(bench *b, idx_setup *s, int64_t T_q, int64_t T_k, int64_t query_start,
                                   int32_t idx_heads, int32_t k, int32_t *d_idx, int32_t *d_len,
                                   dsa_indexer_engine engine) {
  memset(s, 0, sizeof *s);
  s->ctx = b->ctx;
  int32_t cu[2] = {0, (int32_t)T_k};
  dsa_plan_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.cu_seqlens = cu;
  desc.num_seqs = 1;
  desc.total_key_tokens = T_k;
  desc.query_start = query_start;
  desc.num_queries = T_q;
  dsa_status st = dsa_plan_create(&desc, &s->plan);
  if (st != DSA_SUCCESS) return st;
  size_t plan_bytes = 0;
  st = dsa_plan_upload(b->ctx, s->plan, NULL, &plan_bytes, &s->dview, b->timer.stream);
  if (st != DSA_SUCCESS) return st;
  s->plan_buf = bc_dmalloc(plan_bytes);
  st = dsa_plan_upload(b->ctx, s->plan, s->plan_buf, &plan_bytes, &s->dview, b->timer.stream);
  if (st != DSA_SUCCESS) return st;
  BC_CUDA(cudaStreamSynchronize(b->timer.stream)); /* the upload reads the host plan */

  size_t nq = (size_t)T_q * idx_heads * 128, nk = (size_t)T_k * 128, nw = (size_t)T_q * idx_heads;
  s->q = bc_dmalloc(nq * 2);
  s->k = bc_dmalloc(nk * 2);
  s->w = bc_dmalloc(nw * 4);
  bc_fill_bf16_device(&b->rng, s->q, nq, -1.0f, 1.0f);
  bc_fill_bf16_device(&b->rng, s->k, nk, -1.0f, 1.0f);
  /* Weights arrive already scaled by H_idx^-0.5 * 128^-0.5 (docs/contract.md section 6). */
  float wscale = (float)(1.0 / sqrt((double)idx_heads * 128.0));
  bc_fill_f32_device(&b->rng, s->w, nw, -wscale, wscale);

  dsa_indexer_params *p = &s->p;
  p->plan = &s->dview;
  p->num_heads = idx_heads;
  p->topk = k;
  p->index_q = s->q;
  p->index_k = s->k;
  p->weights = s->w;
  p->weights_dtype = DSA_DTYPE_F32;
  p->indices = d_idx;
  p->lengths = d_len;
  p->engine = engine;
  st = dsa_indexer_topk(b->ctx, p, NULL, &s->ws_bytes, b->timer.stream);
  if (st != DSA_SUCCESS) return st;
  s->ws = bc_dmalloc(s->ws_bytes);
  return DSA_SUCCESS;
}

static dsa_status idx_run(void *arg, cudaStream_t stream) {
  idx_setup *s = arg;
  return dsa_indexer_topk(s->ctx, &s->p, s->ws, &s->ws_bytes, stream);
}

/* Indices for a GLM attention shape (one causal sequence of s_kv tokens, the last T queries):
 * from the indexer (DEFAULT engine, random inputs) when it runs, else constructed on the host.
 * h_len gets the lengths; the note says which, and so does the result (1: the indexer's). */
static int glm_indices(bench *b, int64_t T, int64_t s_kv, int32_t k, int32_t *d_idx, int32_t *d_len,
                       int32_t *h_len, char *note, size_t note_n) {
  int64_t qs = s_kv - T;
  if (!b->constructed_indices) {
    idx_setup s;
    dsa_status st = idx_setup_create(b, &s, T, s_kv, qs, 32, k, d_idx, d_len, DSA_INDEXER_ENGINE_DEFAULT);
    if (st == DSA_SUCCESS) st = idx_run(&s, b->timer.stream);
    if (st == DSA_SUCCESS) BC_CUDA(cudaStreamSynchronize(b->timer.stream));
    idx_setup_free(&s);
    int bad = 0;
    if (st == DSA_SUCCESS) {
      /* The lengths must be min(g + 1, K): anything else means the indexer is broken, and its
       * indices would make the attention rows measure something else. */
      BC_CUDA(cudaMemcpy(h_len, d_len, (size_t)T * 4, cudaMemcpyDeviceToHost));
      for (int64_t t = 0; t < T; ++t) bad += h_len[t] != (qs + t + 1 < k ? qs + t + 1 : k);
      if (!bad) {
        snprintf(note, note_n, "indices from dsa_indexer_topk (H_idx=32, random inputs)");
        return 1;
      }
    }
    snprintf(note, note_n, "indices constructed (indexer: %s)",
             bad ? "wrong lengths, see its tests"
                 : st == DSA_ERROR_UNSUPPORTED ? "not on the GPU yet" : dsa_status_string(st));
  } else {
    snprintf(note, note_n, "indices constructed (--constructed-indices)");
  }
  int32_t *h_idx = bc_malloc((size_t)T * k * 4);
  bc_causal_indices(&b->rng, h_idx, h_len, T, qs, k);
  BC_CUDA(cudaMemcpy(d_idx, h_idx, (size_t)T * k * 4, cudaMemcpyHostToDevice));
  BC_CUDA(cudaMemcpy(d_len, h_len, (size_t)T * 4, cudaMemcpyHostToDevice));
  free(h_idx);
  return 0;
}

static double sum_i32(const int32_t *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

/* ---------------------------------------------------------------------------------------------
 * Sparse forward
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  dsa_context *ctx;
  dsa_attn_fwd_params p;
} fwd_arg;
static dsa_status fwd_run(void *arg, cudaStream_t stream) {
  fwd_arg *a = arg;
  return dsa_sparse_attn_fwd(a->ctx, &a->p, stream);
}

/* Attention inputs shared by the forward and backward rows. */
typedef struct attn_inputs {
  int64_t T, s_kv;
  int32_t H, K, D;    /* D: head dim (576 or 512; buffers are sized for 576 either way) */
  uint16_t *q, *kv;
  int32_t *idx, *len; /* len NULL for the V3.2 shapes */
  int32_t *h_len;
  int from_indexer;   /* GLM shapes: idx is dsa_indexer_topk's choice (else constructed) */
  float *sink;
  double slots;       /* counted slots: T*K or sum(topk_length) */
  float scale;
  char note[160];
} attn_inputs;

static void attn_inputs_create(bench *b, const shape *sh, attn_inputs *in) {
  memset(in, 0, sizeof *in);
  in->T = sh->tokens;
  in->s_kv = sh->keys;
  in->H = sh->heads;
  in->K = sh->k;
  in->D = sh->d ? sh->d : 576;
  size_t nq = (size_t)in->T * in->H * 576, nkv = (size_t)in->s_kv * 576, ni = (size_t)in->T * in->K;
  in->q = bc_dmalloc(nq * 2);
  in->kv = bc_dmalloc(nkv * 2);
  in->idx = bc_dmalloc(ni * 4);
  bc_fill_bf16_device(&b->rng, in->q, nq, -1.0f, 1.0f);
  bc_fill_bf16_device(&b->rng, in->kv, nkv, -1.0f, 1.0f);
  if (sh->v32) {
    /* DeepSeek V3.2 shapes: every slot valid, FlashMLA's test convention scale = d_qk^-0.5. */
    int32_t *h = bc_malloc(ni * 4);
    bc_random_distinct_indices(&b->rng, h, in->T, in->K, in->s_kv);
    BC_CUDA(cudaMemcpy(in->idx, h, ni * 4, cudaMemcpyHostToDevice));
    free(h);
    in->sink = bc_dmalloc((size_t)in->H * 4);
    bc_fill_f32_device(&b->rng, in->sink, (size_t)in->H, -1.0f, 1.0f);
    in->slots = (double)in->T * in->K;
    in->scale = (float)(1.0 / sqrt(576.0));
    snprintf(in->note, sizeof in->note, "random distinct indices (unsorted), random finite sink, scale 576^-0.5");
  } else {
    in->len = bc_dmalloc((size_t)in->T * 4);
    in->h_len = bc_malloc((size_t)in->T * 4);
    in->from_indexer = glm_indices(b, in->T, in->s_kv, in->K, in->idx, in->len, in->h_len, in->note, sizeof in->note);
    in->slots = sum_i32(in->h_len, in->T);
    in->scale = 0.0625f;
  }
}

static void attn_inputs_free(attn_inputs *in) {
  cudaFree(in->q);
  cudaFree(in->kv);
  cudaFree(in->idx);
  cudaFree(in->len);
  cudaFree(in->sink);
  free(in->h_len);
  memset(in, 0, sizeof *in);
}

static void fill_fwd_params(const attn_inputs *in, dsa_attn_fwd_params *p, uint16_t *out, float *lse) {
  memset(p, 0, sizeof *p);
  p->num_tokens = in->T;
  p->num_heads = in->H;
  p->head_dim = in->D;
  p->num_kv = in->s_kv;
  p->topk = in->K;
  p->softmax_scale = in->scale;
  p->q = in->q;
  p->kv = in->kv;
  p->indices = in->idx;
  p->topk_length = in->len;
  p->sink = in->sink;
  p->out = out;
  p->lse = lse;
}

/* FlashMLA on the inputs of a fwd row: q padded with zero heads to 64 (H < 64) or 128 (64 < H < 128)
 * with -inf sinks for the padded heads (dsa_pad_heads), timed in its own loop of reps, and its out
 * and lse compared with libdsa's (out_ref [T, H, 512], lse_ref [T, H], already computed). Credited
 * with the useful heads' FLOP only (the row's work). */
typedef struct {
  const flashmla_peer *f;
  const void *q, *kv;
  const int32_t *idx, *len;
  const float *sink;
  void *out;
  float *max_logits, *lse;
  int s_q, s_kv, h_q, d_qk, topk;
  float scale;
  int rc;
} fm_arg;
static dsa_status fm_run(void *arg, cudaStream_t stream) {
  fm_arg *a = arg;
  a->rc = a->f->fwd(a->q, a->kv, a->idx, a->sink, a->len, a->out, a->max_logits, a->lse, a->s_q, a->s_kv,
                    a->h_q, a->d_qk, a->topk, a->scale, 0, stream);
  return a->rc == 0 ? DSA_SUCCESS : DSA_ERROR_CUDA;
}

static void flashmla_row(bench *b, const attn_inputs *in, const uint16_t *out_ref, const float *lse_ref,
                         peer_result *pr) {
  memset(pr, 0, sizeof *pr);
  pr->name = FLASHMLA_NAME;
  pr->ms = pr->max_rel_diff = pr->lse_max_diff = NAN;
  if (!b->flashmla) {
    snprintf(pr->status, sizeof pr->status, "not run (no --flashmla PATH / DSA_BENCH_FLASHMLA)");
    return;
  }
  const int64_t T = in->T;
  const int H = in->H, Hp = H == 64 || H == 128 ? H : H < 64 ? 64 : 128;
  uint16_t *q = in->q, *q_pad = NULL;
  const float *sink = in->sink;
  float *sink_pad = NULL;
  if (Hp != H) {
    q_pad = bc_dmalloc((size_t)T * Hp * 576 * 2);
    sink_pad = bc_dmalloc((size_t)Hp * 4);
    dsa_pad_heads_params pp;
    memset(&pp, 0, sizeof pp);
    pp.num_tokens = T;
    pp.num_heads = H;
    pp.padded_heads = Hp;
    pp.head_dim = 576;
    pp.q = in->q;
    pp.q_out = q_pad;
    pp.sink = in->sink; /* NULL: every head's sink -inf, which is no sink */
    pp.sink_out = sink_pad;
    dsa_status st = dsa_pad_heads(b->ctx, &pp, b->timer.stream);
    if (st != DSA_SUCCESS) {
      snprintf(pr->status, sizeof pr->status, "dsa_pad_heads: %s", dsa_last_error_message());
      cudaFree(q_pad);
      cudaFree(sink_pad);
      return;
    }
    q = q_pad;
    sink = sink_pad;
  }
  fm_arg a;
  memset(&a, 0, sizeof a);
  a.f = b->flashmla;
  a.q = q;
  a.kv = in->kv;
  a.idx = in->idx;
  a.len = in->len;
  a.sink = sink;
  a.out = bc_dmalloc((size_t)T * Hp * 512 * 2);
  a.max_logits = bc_dmalloc((size_t)T * Hp * 4);
  a.lse = bc_dmalloc((size_t)T * Hp * 4);
  a.s_q = (int)T;
  a.s_kv = (int)in->s_kv;
  a.h_q = Hp;
  a.d_qk = in->D;
  a.topk = in->K;
  a.scale = in->scale;
  double ms = NAN;
  dsa_status st = bc_time_op(&b->timer, fm_run, &a, &ms);
  if (st != DSA_SUCCESS) {
    snprintf(pr->status, sizeof pr->status, "flashmla_sparse_fwd returned %d: %s", a.rc, b->flashmla->last_error());
  } else {
    pr->ms = ms;
    pr->same_run = 1;
    /* Agreement on the useful heads: out relative to its largest magnitude, lse absolute. */
    const size_t no = (size_t)T * H * 512;
    uint16_t *ho = bc_malloc(no * 2), *hp = bc_malloc((size_t)T * Hp * 512 * 2);
    float *lo = bc_malloc((size_t)T * H * 4), *lp = bc_malloc((size_t)T * Hp * 4);
    BC_CUDA(cudaMemcpy(ho, out_ref, no * 2, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(hp, a.out, (size_t)T * Hp * 512 * 2, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(lo, lse_ref, (size_t)T * H * 4, cudaMemcpyDeviceToHost));
    BC_CUDA(cudaMemcpy(lp, a.lse, (size_t)T * Hp * 4, cudaMemcpyDeviceToHost));
    double max_ref = 0, max_diff = 0, lse_diff = 0;
    int64_t nan_count = 0, lse_mismatch = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const uint16_t *x = ho + ((size_t)t * H + h) * 512, *y = hp + ((size_t)t * Hp + h) * 512;
        for (int c = 0; c < 512; ++c) {
          const double u = dsa_bf16_to_f32(x[c]), v = dsa_bf16_to_f32(y[c]);
          if (isnan(u) || isnan(v)) {
            ++nan_count;
            continue;
          }
          max_ref = fmax(max_ref, fabs(u));
          max_diff = fmax(max_diff, fabs(u - v));
        }
        const double l0 = lo[(size_t)t * H + h], l1 = lp[(size_t)t * Hp + h];
        if (isfinite(l0) && isfinite(l1)) lse_diff = fmax(lse_diff, fabs(l0 - l1));
        else if (!(l0 == l1)) ++lse_mismatch; /* +inf on empty rows on both sides */
      }
    pr->max_rel_diff = nan_count ? NAN : max_ref > 0 ? max_diff / max_ref : max_diff;
    pr->lse_max_diff = lse_mismatch ? INFINITY : lse_diff;
    char padded[48] = "";
    if (Hp != H) snprintf(padded, sizeof padded, ", q padded %d -> %d heads", H, Hp);
    snprintf(pr->status, sizeof pr->status, "ok%s; out max rel diff %.2e, lse max diff %.2e%s%s", padded,
             pr->max_rel_diff, lse_diff, nan_count ? "; NaN in an output" : "",
             lse_mismatch ? "; lse finite on one side only" : "");
    free(ho);
    free(hp);
    free(lo);
    free(lp);
  }
  cudaFree(a.out);
  cudaFree(a.max_logits);
  cudaFree(a.lse);
  cudaFree(q_pad);
  cudaFree(sink_pad);
}

static void bench_fwd(bench *b, const shape *sh) {
  attn_inputs in;
  peer_result peer; /* FlashMLA, run once after the first row */
  int created = 0;
  const int rows = fwd_handoff_count ? fwd_handoff_count : 1;
  int64_t ho_default = 0;
  (void)dsa_context_get_option(b->ctx, DSA_OPTION_FWD_SM90_HANDOFF, &ho_default);
  for (int k = 0; k < rows; ++k) {
    char variant[48];
    snprintf(variant, sizeof variant, "%s%s", sh->v32 ? "sink" : "topk_length",
             fwd_variant_forced == 1 ? ",portable" : fwd_variant_forced == 2 ? ",sm90" : fwd_variant_forced == 3 ? ",small" : fwd_variant_forced == 4 ? ",split" : "");
    if (fwd_small_max_forced >= 0)
      snprintf(variant + strlen(variant), sizeof variant - strlen(variant), ",sam%d", fwd_small_max_forced);
    if (fwd_l2_hint_forced >= 0)
      snprintf(variant + strlen(variant), sizeof variant - strlen(variant), ",l2h%d", fwd_l2_hint_forced);
    if (fwd_handoff_count) {
      set_option(b->ctx, DSA_OPTION_FWD_SM90_HANDOFF, fwd_handoff_list[k]);
      snprintf(variant + strlen(variant), sizeof variant - strlen(variant), ",ho%d", fwd_handoff_list[k]);
    }
    progress(sh, variant);
    if (!created) {
      attn_inputs_create(b, sh, &in);
      created = 1;
    }
    uint16_t *out = bc_dmalloc((size_t)in.T * in.H * 512 * 2);
    float *lse = bc_dmalloc((size_t)in.T * in.H * 4);
    fwd_arg a;
    a.ctx = b->ctx;
    fill_fwd_params(&in, &a.p, out, lse);
    double ms = NAN;
    dsa_status st = bc_time_op(&b->timer, fwd_run, &a, &ms);
    if (k == 0) {
      if (st == DSA_SUCCESS) flashmla_row(b, &in, out, lse, &peer);
      else {
        memset(&peer, 0, sizeof peer);
        peer.name = FLASHMLA_NAME;
        peer.ms = peer.max_rel_diff = peer.lse_max_diff = NAN;
        snprintf(peer.status, sizeof peer.status, "not run (libdsa's forward failed)");
      }
    }
    add_result(b, sh, variant, in.note, st, ms, bc_flops_fwd(in.slots, in.H), 0, &peer);
    cudaFree(out);
    cudaFree(lse);
  }
  if (fwd_handoff_count) set_option(b->ctx, DSA_OPTION_FWD_SM90_HANDOFF, ho_default);
  attn_inputs_free(&in);
}

/* ---------------------------------------------------------------------------------------------
 * Sparse backward (deterministic 0 and 1)
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  dsa_context *ctx;
  dsa_attn_bwd_params p;
  void *ws;
  size_t ws_bytes;
} bwd_arg;
static dsa_status bwd_run(void *arg, cudaStream_t stream) {
  bwd_arg *a = arg;
  return dsa_sparse_attn_bwd(a->ctx, &a->p, a->ws, &a->ws_bytes, stream);
}

/* out and lse of in's indices from the forward when it runs, else consistent-looking stand-ins; note
 * gets in's note and which of the two. */
static void bwd_fwd_outputs(bench *b, const attn_inputs *in, uint16_t *out, float *lse, char *note, size_t note_n) {
  size_t no = (size_t)in->T * in->H * 512, nl = (size_t)in->T * in->H;
  fwd_arg fa;
  fa.ctx = b->ctx;
  fill_fwd_params(in, &fa.p, out, lse);
  const dsa_status fst = dsa_sparse_attn_fwd(b->ctx, &fa.p, b->timer.stream);
  if (fst == DSA_SUCCESS) {
    BC_CUDA(cudaStreamSynchronize(b->timer.stream));
    snprintf(note, note_n, "%s; out, lse from the forward", in->note);
    return;
  }
  /* lse ~ ln(n) + var(s)/2 with s ~ N(0, 0.5^2) for these inputs; out ~ a small average of kv. */
  bc_fill_bf16_device(&b->rng, out, no, -0.05f, 0.05f);
  float *h = bc_malloc(nl * 4);
  for (int64_t t = 0; t < in->T; ++t)
    for (int32_t hh = 0; hh < in->H; ++hh)
      h[t * in->H + hh] = (float)log(in->h_len ? (in->h_len[t] > 0 ? in->h_len[t] : 1) : in->K) + 0.125f;
  BC_CUDA(cudaMemcpy(lse, h, nl * 4, cudaMemcpyHostToDevice));
  free(h);
  snprintf(note, note_n, "%s; forward not on the GPU yet: synthetic out, lse", in->note);
}

/* The backward's buffers, shared by every row of a shape. */
typedef struct {
  uint16_t *out, *dout, *dq, *dkv;
  float *lse, *target;
} bwd_bufs;

/* One timed backward row on in's indices: det 0 / 1, with the slot target (tgt), or without
 * topk_length (pad: the lists read as -1-padded). */
static void bwd_row(bench *b, const shape *sh, const attn_inputs *in, const bwd_bufs *f, const char *variant_,
                    const char *note, int det, int tgt, int pad) {
  char variant[48];
  snprintf(variant, sizeof variant, "%s", variant_);
  if (bwd_variant_forced > 0) snprintf(variant + strlen(variant), sizeof variant - strlen(variant), ",bv%d", bwd_variant_forced);
  progress(sh, variant);
  bwd_arg a;
  memset(&a, 0, sizeof a);
  a.ctx = b->ctx;
  dsa_attn_bwd_params *p = &a.p;
  p->num_tokens = in->T;
  p->num_heads = in->H;
  p->head_dim = in->D;
  p->num_kv = in->s_kv;
  p->topk = in->K;
  p->softmax_scale = in->scale;
  p->deterministic = det;
  p->q = in->q;
  p->kv = in->kv;
  p->indices = in->idx;
  p->topk_length = pad ? NULL : in->len;
  p->sink = in->sink;
  p->out = f->out;
  p->dout = f->dout;
  p->lse = f->lse;
  p->dq = f->dq;
  p->dkv = f->dkv;
  p->slot_target = tgt ? f->target : NULL;
  double ms = NAN;
  dsa_status st = dsa_sparse_attn_bwd(b->ctx, p, NULL, &a.ws_bytes, b->timer.stream);
  if (st == DSA_SUCCESS) {
    a.ws = bc_dmalloc(a.ws_bytes);
    st = bc_time_op(&b->timer, bwd_run, &a, &ms);
    cudaFree(a.ws);
  }
  add_result(b, sh, variant, note, st, ms, bc_flops_bwd_d(in->slots, in->H, in->D), 0, NULL);
}

/* The GLM shapes run on two index distributions, named as bench/cudnn_peer.py names them: rows det0 /
 * det1 (and det0,tgt, det0,pad, slot-target) on uniform causal subsets (an ascending uniform K-subset
 * of 0..g per row, as cuDNN's and FlashMLA's tests draw them), rows det0,indexer / det1,indexer on the
 * indices dsa_indexer_topk chooses (when it runs; --constructed-indices: the uniform rows only). The
 * V3.2 shapes: random distinct indices, rows det0 / det1 / det0,tgt / slot-target. */
static void bench_bwd(bench *b, const shape *sh) {
  attn_inputs in;
  printf("[setup] %s: inputs and forward ... ", sh->name);
  fflush(stdout);
  attn_inputs_create(b, sh, &in);
  size_t no = (size_t)in.T * in.H * 512, nl = (size_t)in.T * in.H, ni = (size_t)in.T * in.K;
  bwd_bufs f;
  f.out = bc_dmalloc(no * 2);
  f.dout = bc_dmalloc(no * 2);
  f.dq = bc_dmalloc((size_t)in.T * in.H * 576 * 2);
  f.dkv = bc_dmalloc((size_t)in.s_kv * 576 * 2);
  f.lse = bc_dmalloc(nl * 4);
  f.target = bc_dmalloc(ni * 4);
  bc_fill_bf16_device(&b->rng, f.dout, no, -1.0f, 1.0f);

  /* the indexer's set aside, the uniform subsets in in.idx (the lengths, min(g + 1, K), are the same) */
  int32_t *ix_idx = NULL;
  char ix_note[sizeof in.note];
  if (in.from_indexer) {
    ix_idx = in.idx;
    snprintf(ix_note, sizeof ix_note, "%s", in.note);
    in.idx = bc_dmalloc(ni * 4);
    int32_t *h = bc_malloc(ni * 4);
    bc_causal_indices(&b->rng, h, NULL, in.T, in.s_kv - in.T, in.K);
    BC_CUDA(cudaMemcpy(in.idx, h, ni * 4, cudaMemcpyHostToDevice));
    free(h);
    snprintf(in.note, sizeof in.note, "uniform causal subsets (ascending)");
  }
  char note[400];
  bwd_fwd_outputs(b, &in, f.out, f.lse, note, sizeof note);
  printf("done\n");

  /* det0, det1, det0 with the slot target (dsa_attn_bwd_params.slot_target: what the fused target
   * costs the backward), and, where some row holds fewer than K keys, det0 without topk_length: the
   * same lists read as -1-padded (how a caller that passes no lengths sees them; the kernels then
   * walk every slot of every row) */
  int padded = 0;
  for (int64_t t = 0; in.h_len && t < in.T && !padded; ++t) padded = in.h_len[t] < in.K;
  bwd_row(b, sh, &in, &f, "det0", note, 0, 0, 0);
  bwd_row(b, sh, &in, &f, "det1", note, 1, 0, 0);
  bwd_row(b, sh, &in, &f, "det0,tgt", note, 0, 1, 0);
  if (padded) bwd_row(b, sh, &in, &f, "det0,pad", note, 0, 0, 1);
  { /* the standalone slot target on the same inputs (op "slot target"; FLOP 2 H D per slot: S only) */
    progress(sh, "slot-target");
    bc_train_arg ta;
    memset(&ta, 0, sizeof ta);
    ta.ctx = b->ctx;
    dsa_slot_target_params *tp = &ta.st;
    tp->num_tokens = in.T;
    tp->num_heads = in.H;
    tp->head_dim = in.D;
    tp->num_kv = in.s_kv;
    tp->topk = in.K;
    tp->softmax_scale = in.scale;
    tp->q = in.q;
    tp->kv = in.kv;
    tp->indices = in.idx;
    tp->topk_length = in.len;
    tp->sink = in.sink;
    tp->lse = f.lse;
    tp->target = f.target;
    double ms = NAN;
    const dsa_status st = bc_time_op(&b->timer, bc_slot_target_run, &ta, &ms);
    add_result_op(b, sh, "slot target", "slot-target", note, st, ms, 2.0 * in.H * in.slots * in.D, 0, NULL);
  }
  if (ix_idx) { /* the indexer's indices: out and lse from their own forward */
    cudaFree(in.idx);
    in.idx = ix_idx;
    snprintf(in.note, sizeof in.note, "%s", ix_note);
    bwd_fwd_outputs(b, &in, f.out, f.lse, note, sizeof note);
    bwd_row(b, sh, &in, &f, "det0,indexer", note, 0, 0, 0);
    bwd_row(b, sh, &in, &f, "det1,indexer", note, 1, 0, 0);
  }
  cudaFree(f.target);
  cudaFree(f.out);
  cudaFree(f.dout);
  cudaFree(f.dq);
  cudaFree(f.dkv);
  cudaFree(f.lse);
  attn_inputs_free(&in);
}

/* ---------------------------------------------------------------------------------------------
 * Indexer + top-k (engines cuBLAS and fused)
 * ------------------------------------------------------------------------------------------- */
static void bench_idx(bench *b, const shape *sh) {
  int64_t T_q = sh->tokens, T_k = sh->keys, qs = T_k - T_q;
  int32_t *d_idx = bc_dmalloc((size_t)T_q * sh->k * 4), *d_len = bc_dmalloc((size_t)T_q * 4);
  /* Visible (query, key) pairs of one causal sequence: query g sees g + 1 keys. */
  double pairs = 0;
  for (int64_t g = qs; g < T_k; ++g) pairs += (double)(g + 1);
  static const struct {
    dsa_indexer_engine e;
    const char *name;
    int fused_variant; /* DSA_OPTION_INDEXER_FUSED_KERNEL while the row runs; 0 = automatic */
  } engines[] = {{DSA_INDEXER_ENGINE_CUBLAS, "cublas", 0},
                 {DSA_INDEXER_ENGINE_FUSED, "fused", 0},
                 {DSA_INDEXER_ENGINE_FUSED, "fused,mma", 1},
                 {DSA_INDEXER_ENGINE_FUSED, "fused,wgmma", 2}};
  for (int e = 0; e < (int)(sizeof engines / sizeof engines[0]); ++e) {
    set_option(b->ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, engines[e].fused_variant);
    progress(sh, engines[e].name);
    idx_setup s;
    double ms = NAN;
    dsa_status st = idx_setup_create(b, &s, T_q, T_k, qs, sh->heads, sh->k, d_idx, d_len, engines[e].e);
    char note[160];
    snprintf(note, sizeof note, "random bf16 q/k, fp32 weights; workspace %.1f MiB",
             (double)s.ws_bytes / (1 << 20));
    if (st == DSA_SUCCESS) st = bc_time_op(&b->timer, idx_run, &s, &ms);
    idx_setup_free(&s);
    set_option(b->ctx, DSA_OPTION_INDEXER_FUSED_KERNEL, DSA_INDEXER_FUSED_AUTO);
    add_result(b, sh, engines[e].name, note, st, ms, bc_flops_idx(pairs, sh->heads), 0, NULL);
  }
  cudaFree(d_idx);
  cudaFree(d_len);
}

/* ---------------------------------------------------------------------------------------------
 * Indexer training (docs/indexer-training.md): the slot scores, the KL loss and the indexer backward
 * on the indexer's own indices and inputs (random bf16 index q / k, fp32 weights; the target uniform
 * in [0, 1]); the backward in the default mode, the deterministic one (on cc 9.0 its d_index_k from
 * the sm_90a kernel's slot rows), and the deterministic one with DSA_OPTION_TRAIN_KERNEL = PORTABLE
 * ("det1,portable": the CUDA-core sorted pass, what other devices run).
 * The slot target needs the attention's inputs: the bwd-* shapes time it ("slot-target" rows).
 * ------------------------------------------------------------------------------------------- */
static void bench_train(bench *b, const shape *sh) {
  const int64_t T = sh->tokens, Tk = sh->keys, qs = Tk - T;
  const int32_t H = sh->heads, K = sh->k;
  int32_t *d_idx = bc_dmalloc((size_t)T * K * 4), *d_len = bc_dmalloc((size_t)T * 4);
  idx_setup s;
  dsa_status st = idx_setup_create(b, &s, T, Tk, qs, H, K, d_idx, d_len, DSA_INDEXER_ENGINE_DEFAULT);
  if (st == DSA_SUCCESS) st = idx_run(&s, b->timer.stream);
  if (st == DSA_SUCCESS) BC_CUDA(cudaStreamSynchronize(b->timer.stream));
  double slots = 0;
  if (st == DSA_SUCCESS) {
    int32_t *h_len = bc_malloc((size_t)T * 4);
    BC_CUDA(cudaMemcpy(h_len, d_len, (size_t)T * 4, cudaMemcpyDeviceToHost));
    slots = sum_i32(h_len, T);
    free(h_len);
  }
  char note[200];
  snprintf(note, sizeof note, "indices from dsa_indexer_topk (H_idx=%d, random inputs), %.0f valid slots; target uniform [0, 1]",
           (int)H, slots);
  const size_t tk = (size_t)T * K;
  float *scores = bc_dmalloc(tk * 4), *target = bc_dmalloc(tk * 4), *grad = bc_dmalloc(tk * 4), *loss = bc_dmalloc(4);
  bc_fill_f32_device(&b->rng, target, tk, 0.f, 1.f);

  bc_train_arg ta;
  memset(&ta, 0, sizeof ta);
  ta.ctx = b->ctx;
  /* slot scores: 2 H 128 FLOP per valid slot */
  progress(sh, "slot-scores");
  ta.sc.num_tokens = T;
  ta.sc.num_keys = Tk;
  ta.sc.num_heads = H;
  ta.sc.topk = K;
  ta.sc.index_q = s.q;
  ta.sc.index_k = s.k;
  ta.sc.weights = s.w;
  ta.sc.weights_dtype = DSA_DTYPE_F32;
  ta.sc.indices = d_idx;
  ta.sc.lengths = d_len;
  ta.sc.scores = scores;
  double ms = NAN;
  dsa_status s2 = st == DSA_SUCCESS ? bc_time_op(&b->timer, bc_slot_scores_run, &ta, &ms) : st;
  add_result_op(b, sh, "indexer slot scores", "default", note, s2, ms, 2.0 * H * 128 * slots, 0, NULL);

  /* the KL loss and g: bytes = the target and scores read, g written */
  progress(sh, "loss");
  ta.ls.num_tokens = T;
  ta.ls.topk = K;
  ta.ls.num_keys = Tk;
  ta.ls.indices = d_idx;
  ta.ls.lengths = d_len;
  ta.ls.target = target;
  ta.ls.scores = scores;
  ta.ls.coeff = 1.f;
  ta.ls.loss = loss;
  ta.ls.grad = grad;
  ms = NAN;
  s2 = st;
  if (s2 == DSA_SUCCESS) s2 = dsa_indexer_loss(b->ctx, &ta.ls, NULL, &ta.ws_bytes, b->timer.stream);
  if (s2 == DSA_SUCCESS) {
    ta.ws = bc_dmalloc(ta.ws_bytes ? ta.ws_bytes : 1);
    s2 = bc_time_op(&b->timer, bc_indexer_loss_run, &ta, &ms);
  }
  add_result_op(b, sh, "indexer KL loss", "default", note, s2, ms, 3.0 * tk * 4, 1, NULL);
  cudaFree(ta.ws);
  ta.ws = NULL;

  /* the indexer backward: dK = G q, dQ = G^T K, X = K q^T: 3 x 2 H 128 FLOP per valid slot */
  uint16_t *dq = bc_dmalloc((size_t)T * H * 128 * 2), *dk = bc_dmalloc((size_t)Tk * 128 * 2);
  float *dw = bc_dmalloc((size_t)T * H * 4);
  static const struct {
    const char *name;
    int det;
    int kernel; /* DSA_OPTION_TRAIN_KERNEL while the row runs */
  } passes[] = {{"det0", 0, DSA_TRAIN_KERNEL_AUTO}, {"det1", 1, DSA_TRAIN_KERNEL_AUTO},
                {"det1,portable", 1, DSA_TRAIN_KERNEL_PORTABLE}};
  dsa_indexer_bwd_params *p = &ta.bw;
  memset(p, 0, sizeof *p);
  p->num_tokens = T;
  p->num_keys = Tk;
  p->num_heads = H;
  p->topk = K;
  p->index_q = s.q;
  p->index_k = s.k;
  p->weights = s.w;
  p->weights_dtype = DSA_DTYPE_F32;
  p->indices = d_idx;
  p->lengths = d_len;
  p->grad = grad;
  p->d_index_q = dq;
  p->d_weights = dw;
  p->d_index_k = dk;
  for (int i = 0; i < (int)(sizeof passes / sizeof passes[0]); ++i) {
    progress(sh, passes[i].name);
    p->deterministic = passes[i].det;
    ms = NAN;
    s2 = st;
    set_option(b->ctx, DSA_OPTION_TRAIN_KERNEL, passes[i].kernel);
    if (s2 == DSA_SUCCESS) s2 = dsa_indexer_bwd(b->ctx, p, NULL, &ta.ws_bytes, b->timer.stream);
    if (s2 == DSA_SUCCESS) {
      ta.ws = bc_dmalloc(ta.ws_bytes);
      s2 = bc_time_op(&b->timer, bc_indexer_bwd_run, &ta, &ms);
      cudaFree(ta.ws);
      ta.ws = NULL;
    }
    set_option(b->ctx, DSA_OPTION_TRAIN_KERNEL, DSA_TRAIN_KERNEL_AUTO);
    add_result_op(b, sh, "indexer bwd", passes[i].name, note, s2, ms, 3.0 * 2.0 * H * 128 * slots, 0, NULL);
  }
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dw);
  cudaFree(scores);
  cudaFree(target);
  cudaFree(grad);
  cudaFree(loss);
  idx_setup_free(&s);
  cudaFree(d_idx);
  cudaFree(d_len);
}

/* ---------------------------------------------------------------------------------------------
 * Top-k alone (causal per-row lengths, and full rows as torch.topk was measured)
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  dsa_context *ctx;
  dsa_topk_params p;
  void *ws;
  size_t ws_bytes;
} topk_arg;
static dsa_status topk_run(void *arg, cudaStream_t stream) {
  topk_arg *a = arg;
  return dsa_topk(a->ctx, &a->p, a->ws, &a->ws_bytes, stream);
}

static void bench_topk(bench *b, const shape *sh) {
  int64_t rows = sh->tokens, cols = sh->keys;
  printf("[setup] %s: %.2f GB of scores ... ", sh->name, (double)rows * cols * 4 / 1e9);
  fflush(stdout);
  float *scores = bc_dmalloc((size_t)rows * cols * 4);
  bc_fill_f32_device(&b->rng, scores, (size_t)rows * cols, -1.0f, 1.0f);
  int32_t *d_idx = bc_dmalloc((size_t)rows * sh->k * 4), *d_len = bc_dmalloc((size_t)rows * 4);
  int32_t *h_len = bc_malloc((size_t)rows * 4);
  for (int64_t r = 0; r < rows; ++r) h_len[r] = (int32_t)(cols - rows + r + 1); /* last CP rank */
  BC_CUDA(cudaMemcpy(d_len, h_len, (size_t)rows * 4, cudaMemcpyHostToDevice));
  free(h_len);
  printf("done\n");
  for (int v = 0; v < 2; ++v) {
    char variant[32];
    snprintf(variant, sizeof variant, "%s", v == 0 ? "causal" : "full");
    if (topk_kernel_forced > 0)
      snprintf(variant + strlen(variant), sizeof variant - strlen(variant), "%s",
               topk_kernel_forced == DSA_TOPK_KERNEL_RADIX ? ",radix" : ",filter");
    progress(sh, variant);
    topk_arg a;
    memset(&a, 0, sizeof a);
    a.ctx = b->ctx;
    a.p.rows = rows;
    a.p.columns = cols;
    a.p.k = sh->k;
    a.p.scores = scores;
    a.p.lengths = v == 0 ? d_len : NULL;
    a.p.indices = d_idx;
    double ms = NAN;
    dsa_status st = dsa_topk(b->ctx, &a.p, NULL, &a.ws_bytes, b->timer.stream);
    if (st == DSA_SUCCESS) {
      a.ws = bc_dmalloc(a.ws_bytes);
      st = bc_time_op(&b->timer, topk_run, &a, &ms);
      cudaFree(a.ws);
    }
    add_result(b, sh, variant,
               v == 0 ? "random fp32 scores; row r has length columns - rows + r + 1; bytes = rows*columns*4"
                      : "random fp32 scores, every column valid (as torch.topk was measured)",
               st, ms, bc_bytes_topk((double)rows, (double)cols), 1, NULL);
  }
  cudaFree(scores);
  cudaFree(d_idx);
  cudaFree(d_len);
}

/* ---------------------------------------------------------------------------------------------
 * Driver
 * ------------------------------------------------------------------------------------------- */
static void usage(FILE *f) {
  fprintf(f,
          "usage: dsa_bench [--shapes a,b,c] [--reps N] [--out FILE] [--flashmla PATH] [--constructed-indices]\n"
          "                 [--fwd-variant N] [--fwd-handoff LIST] [--list]\n"
          "  --shapes   canonical shape names (see --list), comma separated; default: all\n"
          "  --reps     timed repetitions per row, median reported (default 20)\n"
          "  --out      JSON output (default bench/results/YYYY-MM-DD-<card>.json)\n"
          "  --flashmla PATH  libflashmla_sparse.so: every fwd row also runs FlashMLA on the same inputs\n"
          "                   (same run; also from DSA_BENCH_FLASHMLA=PATH)\n"
          "  --constructed-indices  GLM rows use host-constructed causal indices, not the indexer's (the bwd\n"
          "                   shapes then have no det0,indexer / det1,indexer rows)\n"
          "  --fwd-variant N  force the forward kernel: 1 portable, 2 sm_90a 64-head, 3 sm_90a small-H, 4 split\n"
          "                   (variant gets ,portable / ,sm90 / ,small / ,split)\n"
          "  --fwd-handoff LIST  the 64-head sm_90a forward's hand-offs between its consumer warpgroups, e.g.\n"
          "                   0,1 (0 named barriers, 1 mbarriers, the racecheck twin): one row per hand-off,\n"
          "                   variant gets ,ho<N>; also from DSA_FWD_HANDOFF=LIST (the option wins);\n"
          "                   default: the library's (0)\n"
          "  environment: DSA_BWD_VARIANT, DSA_FWD_KV_L2_HINT, DSA_FWD_SMALL_AUTO_MAX, DSA_TOPK_KERNEL set the\n"
          "                   matching option of include/dsa_tune.h (see the top of bench/dsa_bench.c)\n");
}

static void list_shapes(void) {
  for (int i = 0; i < NUM_SHAPES; ++i) printf("%-14s %-13s %s\n", shapes[i].name, op_names[shapes[i].op], shapes[i].desc);
}

static void print_table(const bench *b) {
  printf("\n%-14s %-13s %-12s %10s %10s %-7s %8s %9s %8s  %s\n", "shape", "op", "variant", "ms", "rate",
         "unit", "ceiling", "peer ms", "x peer", "status");
  for (int i = 0; i < b->num_rows; ++i) {
    const result *r = &b->rows[i];
    char ms[32] = "-", rate[32] = "-", ceil[32] = "-", pr[32] = "-", pms[32] = "-";
    if (isfinite(r->peer_ms)) snprintf(pms, sizeof pms, "%.3f", r->peer_ms);
    if (isfinite(r->ms)) snprintf(ms, sizeof ms, "%.3f", r->ms);
    if (isfinite(r->rate)) snprintf(rate, sizeof rate, "%.1f", r->rate);
    if (isfinite(r->ceiling_ratio)) snprintf(ceil, sizeof ceil, "%.0f%%", 100 * r->ceiling_ratio);
    if (isfinite(r->peer_ratio)) snprintf(pr, sizeof pr, "%.2fx", r->peer_ratio);
    printf("%-14s %-13s %-12s %10s %10s %-7s %8s %9s %8s  %.60s\n", r->shape, r->op, r->variant, ms, rate,
           r->is_bytes ? "GB/s" : "TFLOP/s", ceil, pms, pr, r->status);
  }
  printf("ceilings (same run): cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s, D2D copy %.1f GB/s; card %s, commit %s\n",
         b->ceil.gemm_tflops, b->ceil.copy_gbps, b->card, b->commit);
  printf("ceiling = rate / same-run ceiling; x peer = peer ms / libdsa ms, same process and inputs (>1: libdsa faster)\n");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress survives a crash when the output is a file */
  const char *shape_arg = NULL, *out_arg = NULL, *flashmla_arg = NULL;
  int reps = 20, fwd_handoff_set = 0;
  bench b;
  memset(&b, 0, sizeof b);
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--list")) {
      list_shapes();
      return 0;
    } else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
      shape_arg = argv[++i];
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1) {
        fprintf(stderr, "--reps must be >= 1\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
      out_arg = argv[++i];
    } else if (!strcmp(argv[i], "--flashmla") && i + 1 < argc) {
      flashmla_arg = argv[++i];
    } else if (!strcmp(argv[i], "--constructed-indices")) {
      b.constructed_indices = 1;
    } else if (!strcmp(argv[i], "--fwd-variant") && i + 1 < argc) {
      fwd_variant_forced = atoi(argv[++i]);
      if (fwd_variant_forced < 0 || fwd_variant_forced > 4) {
        fprintf(stderr, "--fwd-variant must be 0 (automatic), 1 (portable), 2 (sm_90a 64-head), 3 (sm_90a small-H) or 4 (sm_90a split)\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--fwd-handoff") && i + 1 < argc) {
      if (parse_handoff_list(argv[++i]) != 0) {
        fprintf(stderr, "--fwd-handoff takes a comma-separated list of 0, 1 (e.g. 0,1)\n");
        return 2;
      }
      fwd_handoff_set = 1;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }

  if (!fwd_handoff_set && getenv("DSA_FWD_HANDOFF") && *getenv("DSA_FWD_HANDOFF")) {
    if (parse_handoff_list(getenv("DSA_FWD_HANDOFF")) != 0) {
      fprintf(stderr, "DSA_FWD_HANDOFF takes a comma-separated list of 0, 1 (e.g. 0,1)\n");
      return 2;
    }
  }

  /* Selection, checked before anything touches the GPU. */
  int selected[NUM_SHAPES];
  int num_sel = 0;
  if (shape_arg) {
    char *copy = bc_malloc(strlen(shape_arg) + 1);
    strcpy(copy, shape_arg);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
      int found = -1;
      for (int i = 0; i < NUM_SHAPES; ++i)
        if (!strcmp(tok, shapes[i].name)) found = i;
      if (found < 0) {
        fprintf(stderr, "unknown shape \"%s\"; the canonical shapes are:\n", tok);
        list_shapes();
        return 2;
      }
      int dup = 0;
      for (int j = 0; j < num_sel; ++j) dup |= selected[j] == found;
      if (!dup) selected[num_sel++] = found;
    }
    free(copy);
  } else {
    for (int i = 0; i < NUM_SHAPES; ++i) selected[num_sel++] = i;
  }
  job_count = 0;
  for (int j = 0; j < num_sel; ++j)
    job_count += shapes[selected[j]].op == OP_FWD ? (fwd_handoff_count ? fwd_handoff_count : 1)
                 : shapes[selected[j]].op == OP_TRAIN ? 5 : 2;

  if (!flashmla_arg && getenv("DSA_BENCH_FLASHMLA") && *getenv("DSA_BENCH_FLASHMLA"))
    flashmla_arg = getenv("DSA_BENCH_FLASHMLA");
  static flashmla_peer flashmla;
  if (flashmla_arg) {
    if (flashmla_load(&flashmla, flashmla_arg) != 0) return 2;
    b.flashmla = &flashmla;
    printf("peer: %s from %s (same run, same inputs, its own loop of reps)\n", FLASHMLA_NAME, flashmla.path);
  }
  if (!tc_have_gpu()) {
    printf("no CUDA device: nothing to benchmark\n");
    return 0;
  }
  dsa_status st = dsa_context_create(&b.ctx, 0);
  if (st != DSA_SUCCESS) {
    fprintf(stderr, "dsa_context_create: %s: %s\n", dsa_status_string(st), dsa_last_error_message());
    return 1;
  }
  b.rng.s = 0x00d5a0be4c4ull;
  bc_card_name(b.card, sizeof b.card, 0);
  bc_card_name(b.card_file, sizeof b.card_file, 1);
  bc_commit(b.commit, sizeof b.commit);
  bc_date(b.date, sizeof b.date);
  char out_path[512];
  if (out_arg) {
    snprintf(out_path, sizeof out_path, "%s", out_arg);
  } else {
    if (bc_mkdir_p("bench/results") != 0) fprintf(stderr, "warning: cannot create bench/results\n");
    snprintf(out_path, sizeof out_path, "bench/results/%s-%s.json", b.date, b.card_file);
  }
  b.out_path = out_path;

  if (fwd_variant_forced) set_option(b.ctx, DSA_OPTION_FWD_KERNEL, fwd_variant_forced);
  bwd_variant_forced = env_option(b.ctx, "DSA_BWD_VARIANT", DSA_OPTION_BWD_KERNEL, "backward kernel");
  fwd_l2_hint_forced =
      env_option(b.ctx, "DSA_FWD_KV_L2_HINT", DSA_OPTION_FWD_KV_L2_HINT, "forward KV gather L2 policy (0 none, 1 evict_last, 2 if it fits)");
  fwd_small_max_forced = env_option(b.ctx, "DSA_FWD_SMALL_AUTO_MAX", DSA_OPTION_FWD_SMALL_AUTO_MAX,
                                    "automatic forward: largest H mod 64 on the small-H kernel");
  topk_kernel_forced = env_option(b.ctx, "DSA_TOPK_KERNEL", DSA_OPTION_TOPK_KERNEL, "top-k kernel (1 radix, 2 filter)");
  (void)env_option(b.ctx, "DSA_INDEXER_SCORES_BUDGET", DSA_OPTION_INDEXER_SCORES_BUDGET,
                   "indexer scores budget (bytes)");
  bc_timer_init(&b.timer, reps);
  printf("libdsa %s bench on %s, commit %s, %d reps (median), L2 flush %.0f MiB\n", dsa_version_string(),
         b.card, b.commit, reps, (double)b.timer.flush_bytes / (1 << 20));
  printf("ceilings: ");
  fflush(stdout);
  bc_measure_ceilings(&b.timer, &b.ceil);
  printf("cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s, D2D copy (read+write) %.1f GB/s\n", b.ceil.gemm_tflops,
         b.ceil.copy_gbps);

  double t0 = bc_now_s();
  for (int j = 0; j < num_sel; ++j) {
    const shape *sh = &shapes[selected[j]];
    switch (sh->op) {
      case OP_FWD: bench_fwd(&b, sh); break;
      case OP_BWD: bench_bwd(&b, sh); break;
      case OP_IDX: bench_idx(&b, sh); break;
      case OP_TOPK: bench_topk(&b, sh); break;
      case OP_TRAIN: bench_train(&b, sh); break;
    }
  }
  print_table(&b);
  printf("wrote %s (%d rows) in %.1f s\n", b.out_path, b.num_rows, bc_now_s() - t0);
  bc_timer_free(&b.timer);
  free(b.rows);
  dsa_context_destroy(b.ctx);
  return 0;
}
