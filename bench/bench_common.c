/*
 * bench_common.c - shared benchmark harness: PRNG fills, causal indices, L2-flushed event timing,
 * same-run ceilings (cuBLAS GEMM, D2D copy), and environment helpers. See bench_common.h.
 */
#include "bench_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <cublas_v2.h>

void bc_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fatal: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

void *bc_malloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) bc_die("host allocation of %zu bytes failed", bytes);
  return p;
}

void *bc_dmalloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) bc_die("cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
  return p;
}

/* ---- fills ---- */
/* Round-to-nearest-even fp32 -> bf16 (inputs here are finite). */
static inline uint16_t bc_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

void bc_fill_bf16_host(tc_rng *r, uint16_t *x, size_t n, float lo, float hi) {
  /* Four 16-bit draws per 64-bit output: the tensors here reach 600 MB. */
  const float step = (hi - lo) / 65536.0f;
  size_t i = 0;
  while (i < n) {
    uint64_t z = tc_next(r);
    for (int j = 0; j < 4 && i < n; ++j, ++i) {
      float v = lo + step * ((float)(z & 0xFFFFu) + 0.5f); /* +0.5: never exactly lo, never 0 at lo=-hi */
      x[i] = bc_bf16(v);
      z >>= 16;
    }
  }
}

void bc_fill_f32_host(tc_rng *r, float *x, size_t n, float lo, float hi) {
  const double step = ((double)hi - lo) / 4294967296.0;
  size_t i = 0;
  while (i < n) {
    uint64_t z = tc_next(r);
    x[i++] = (float)(lo + step * ((double)(z & 0xFFFFFFFFu) + 0.5));
    if (i < n) x[i++] = (float)(lo + step * ((double)(z >> 32) + 0.5));
  }
}

#define BC_CHUNK_BYTES ((size_t)32 << 20)

void bc_fill_bf16_device(tc_rng *r, uint16_t *d, size_t n, float lo, float hi) {
  size_t chunk = BC_CHUNK_BYTES / sizeof(uint16_t);
  uint16_t *h = bc_malloc((n < chunk ? n : chunk) * sizeof(uint16_t));
  for (size_t off = 0; off < n; off += chunk) {
    size_t m = n - off < chunk ? n - off : chunk;
    bc_fill_bf16_host(r, h, m, lo, hi);
    BC_CUDA(cudaMemcpy(d + off, h, m * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
  free(h);
}

void bc_fill_f32_device(tc_rng *r, float *d, size_t n, float lo, float hi) {
  size_t chunk = BC_CHUNK_BYTES / sizeof(float);
  float *h = bc_malloc((n < chunk ? n : chunk) * sizeof(float));
  for (size_t off = 0; off < n; off += chunk) {
    size_t m = n - off < chunk ? n - off : chunk;
    bc_fill_f32_host(r, h, m, lo, hi);
    BC_CUDA(cudaMemcpy(d + off, h, m * sizeof(float), cudaMemcpyHostToDevice));
  }
  free(h);
}

/* ---- indices ---- */
void bc_random_distinct_indices(tc_rng *r, int32_t *idx, int64_t rows, int32_t k, int64_t range) {
  /* Partial Fisher-Yates on a persistent permutation: each row costs O(k), and the array stays a
   * permutation, so nothing needs resetting between rows. */
  int32_t *perm = bc_malloc((size_t)range * sizeof(int32_t));
  for (int64_t i = 0; i < range; ++i) perm[i] = (int32_t)i;
  for (int64_t t = 0; t < rows; ++t) {
    for (int32_t j = 0; j < k; ++j) {
      int64_t s = j + tc_below(r, range - j);
      int32_t tmp = perm[j];
      perm[j] = perm[s];
      perm[s] = tmp;
      idx[t * k + j] = perm[j];
    }
  }
  free(perm);
}

void bc_causal_row(tc_rng *r, int32_t *row, int32_t k, int64_t doc_start, int64_t causal_len) {
  int32_t j = 0;
  if (causal_len <= k) {
    for (; j < causal_len; ++j) row[j] = (int32_t)(doc_start + j);
  } else {
    /* Selection sampling (Knuth's algorithm S): an ascending uniform k-subset in one pass. */
    int64_t need = k;
    for (int64_t c = 0; c < causal_len && need > 0; ++c) {
      if (tc_below(r, causal_len - c) < need) {
        row[j++] = (int32_t)(doc_start + c);
        --need;
      }
    }
  }
  for (; j < k; ++j) row[j] = -1;
}

void bc_causal_indices(tc_rng *r, int32_t *idx, int32_t *lengths, int64_t rows, int64_t query_start,
                       int32_t k) {
  for (int64_t t = 0; t < rows; ++t) {
    int64_t c = query_start + t + 1;
    bc_causal_row(r, idx + t * k, k, 0, c);
    if (lengths) lengths[t] = (int32_t)(c < k ? c : k);
  }
}

/* ---- timing ---- */
double bc_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bc_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bc_median(double *v, int n) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof(double), bc_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bc_timer_init(bc_timer *t, int reps) {
  int dev = 0, l2 = 0;
  BC_CUDA(cudaGetDevice(&dev));
  BC_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  t->reps = reps > 0 ? reps : 1;
  t->flush_bytes = 2 * (size_t)(l2 > 0 ? l2 : (64 << 20));
  t->flush = bc_dmalloc(t->flush_bytes);
  /* A blocking stream: the harness's synchronous cudaMemcpy / cudaMemset calls on the legacy
   * default stream then order themselves with the ops, so no setup copy can race a kernel. */
  BC_CUDA(cudaStreamCreate(&t->stream));
}

void bc_timer_free(bc_timer *t) {
  if (t->flush) cudaFree(t->flush);
  if (t->stream) cudaStreamDestroy(t->stream);
  t->flush = NULL;
  t->stream = NULL;
}

/* Holds the stream for BC_HOLD_US microseconds from a host callback (it calls no CUDA API), so that
 * the host work of the next call (validation, descriptor setup, several launches) is queued while
 * the GPU waits and the events around the call time the GPU work alone. */
#define BC_HOLD_US 1000
static void CUDART_CB bc_hold(void *arg) {
  (void)arg;
  struct timespec ts = {0, BC_HOLD_US * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

dsa_status bc_time_op(bc_timer *t, bc_op_fn fn, void *arg, double *median_ms) {
  *median_ms = NAN;
  BC_CUDA(cudaDeviceSynchronize()); /* every input written before the first call */
  dsa_status s = fn(arg, t->stream); /* warm-up: first-use costs (cuBLAS handle, module load) */
  if (s != DSA_SUCCESS) return s;
  BC_CUDA(cudaStreamSynchronize(t->stream));
  int n = t->reps;
  cudaEvent_t *ev = bc_malloc(2 * (size_t)n * sizeof(cudaEvent_t));
  double *ms = bc_malloc((size_t)n * sizeof(double));
  for (int i = 0; i < 2 * n; ++i) BC_CUDA(cudaEventCreate(&ev[i]));
  for (int i = 0; i < n && s == DSA_SUCCESS; ++i) {
    BC_CUDA(cudaMemsetAsync(t->flush, i & 0xFF, t->flush_bytes, t->stream));
    BC_CUDA(cudaLaunchHostFunc(t->stream, bc_hold, NULL));
    BC_CUDA(cudaEventRecord(ev[2 * i], t->stream));
    s = fn(arg, t->stream);
    BC_CUDA(cudaEventRecord(ev[2 * i + 1], t->stream));
  }
  BC_CUDA(cudaStreamSynchronize(t->stream));
  if (s == DSA_SUCCESS) {
    for (int i = 0; i < n; ++i) {
      float f = 0;
      BC_CUDA(cudaEventElapsedTime(&f, ev[2 * i], ev[2 * i + 1]));
      ms[i] = f;
    }
    *median_ms = bc_median(ms, n);
  }
  for (int i = 0; i < 2 * n; ++i) cudaEventDestroy(ev[i]);
  free(ev);
  free(ms);
  return s;
}

/* ---- ceilings ---- */
typedef struct {
  cublasHandle_t h;
  int n;
  void *a, *b, *c;
} bc_gemm_arg;

static dsa_status bc_gemm_run(void *arg, cudaStream_t stream) {
  bc_gemm_arg *g = arg;
  const float alpha = 1.0f, beta = 0.0f;
  cublasSetStream(g->h, stream);
  cublasStatus_t st = cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &alpha, g->a,
                                   CUDA_R_16BF, g->n, g->b, CUDA_R_16BF, g->n, &beta, g->c,
                                   CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? DSA_SUCCESS : DSA_ERROR_CUBLAS;
}

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
} bc_copy_arg;

static dsa_status bc_copy_run(void *arg, cudaStream_t stream) {
  bc_copy_arg *c = arg;
  return cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess
             ? DSA_SUCCESS
             : DSA_ERROR_CUDA;
}

void bc_measure_ceilings(bc_timer *t, bc_ceilings *c) {
  tc_rng r = {0x5eed0001ull};
  double ms;
  c->gemm_tflops = NAN;
  c->copy_gbps = NAN;

  bc_gemm_arg g;
  g.n = 8192;
  size_t elems = (size_t)g.n * g.n;
  g.a = bc_dmalloc(elems * 2);
  g.b = bc_dmalloc(elems * 2);
  g.c = bc_dmalloc(elems * 2);
  bc_fill_bf16_device(&r, g.a, elems, -1.0f, 1.0f);
  bc_fill_bf16_device(&r, g.b, elems, -1.0f, 1.0f);
  if (cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "warning: cublasCreate failed: no GEMM ceiling\n");
  } else {
    if (bc_time_op(t, bc_gemm_run, &g, &ms) == DSA_SUCCESS)
      c->gemm_tflops = 2.0 * g.n * (double)g.n * g.n / (ms * 1e-3) / 1e12;
    else
      fprintf(stderr, "warning: cublasGemmEx failed: no GEMM ceiling\n");
    cublasDestroy(g.h);
  }
  cudaFree(g.a);
  cudaFree(g.b);
  cudaFree(g.c);

  bc_copy_arg cp;
  cp.bytes = (size_t)1 << 30;
  void *src = bc_dmalloc(cp.bytes);
  cp.dst = bc_dmalloc(cp.bytes);
  cp.src = src;
  BC_CUDA(cudaMemset(src, 0x3C, cp.bytes));
  if (bc_time_op(t, bc_copy_run, &cp, &ms) == DSA_SUCCESS)
    c->copy_gbps = 2.0 * (double)cp.bytes / (ms * 1e-3) / 1e9;
  cudaFree(src);
  cudaFree(cp.dst);
}

/* ---- environment ---- */
void bc_card_name(char *buf, size_t n, int spaces_to_dashes) {
  struct cudaDeviceProp prop;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    snprintf(buf, n, "unknown-card");
    return;
  }
  snprintf(buf, n, "%s", prop.name);
  if (spaces_to_dashes)
    for (char *p = buf; *p; ++p)
      if (*p == ' ' || *p == '/') *p = '-';
}

void bc_commit(char *buf, size_t n) {
  const char *env = getenv("DSA_COMMIT");
  if (env && *env) {
    snprintf(buf, n, "%s", env);
    return;
  }
  snprintf(buf, n, "unknown");
  FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (!p) return;
  char line[64];
  if (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\r\n")] = 0;
    if (line[0]) snprintf(buf, n, "%s", line);
  }
  pclose(p);
}

void bc_date(char *buf, size_t n) {
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(buf, n, "%Y-%m-%d", &tm);
}

void bc_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; ++s) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch == '\n') fputs("\\n", f);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

void bc_json_number(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.6g", v);
  else fputs("null", f);
}

int bc_mkdir_p(const char *dir) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; ++p) {
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0775) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  }
  if (mkdir(tmp, 0775) != 0 && errno != EEXIST) return -1;
  return 0;
}

dsa_status bc_slot_target_run(void *arg, cudaStream_t stream) {
  bc_train_arg *t = arg;
  return dsa_attn_slot_target(t->ctx, &t->st, stream);
}
dsa_status bc_slot_scores_run(void *arg, cudaStream_t stream) {
  bc_train_arg *t = arg;
  return dsa_indexer_slot_scores(t->ctx, &t->sc, stream);
}
dsa_status bc_indexer_loss_run(void *arg, cudaStream_t stream) {
  bc_train_arg *t = arg;
  return dsa_indexer_loss(t->ctx, &t->ls, t->ws, &t->ws_bytes, stream);
}
dsa_status bc_indexer_bwd_run(void *arg, cudaStream_t stream) {
  bc_train_arg *t = arg;
  return dsa_indexer_bwd(t->ctx, &t->bw, t->ws, &t->ws_bytes, stream);
}
