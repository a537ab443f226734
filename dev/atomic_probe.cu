/*
 * atomic_probe.cu - `make atomic-probe`: throughput of fp32 reductions into a [rows x 576] fp32
 * buffer with the access patterns of the sm_90a backward's dKV scatter (docs/bwd-sm90-next.md
 * section 5, P0). Standalone: CUDA runtime only, no libdsa. sm_90a machine code only.
 *
 *   atomic_probe [--tiles N] [--reps N] [--only a,b,...]
 *
 * Work: N "tiles" (default 8192, 1.2 GB of fp32 payload), each 64 random rows x 576 fp32 columns
 * added once (every element += 1.0f). Rows of a tile are distinct: row(t, r) = (hash(t) + r *
 * 0x9E3779B1) mod R, R a power of two. A CTA of 256 threads (8 warps) does one tile at a time: warp
 * w takes rows [16 (w % 4), +16) and the 64-column blocks b = w / 4, w / 4 + 2, ... (5 + 4 of 9 per
 * tile, like the kernel's 4 + 5 split). Per (warp, 16 rows x 64 columns) the variants issue:
 *   v2     red.global.add.v2.f32, the wgmma accumulator fragment order of today's 64-head kernel:
 *          lane l holds row l / 4 (+ 8), cols 8 cc + 2 (l % 4) + {0, 1}: a quad writes 32 contiguous
 *          bytes of one row; 16 instructions per thread, each 8 rows x 32 B.
 *   v4q    red.global.add.v4.f32, quad = 64 contiguous bytes of one row (the permuted "fake-column"
 *          layout of P1); 8 instructions, each 8 rows x 64 B.
 *   v4o    red.global.add.v4.f32, 8 lanes = 128 contiguous bytes of one row (P1b); 8 instructions,
 *          each 4 rows x 128 B.
 *   f32    scalar red.global.add.f32 in fragment order (col 8 cc + 2 (l % 4) + e): 32 instructions,
 *          each 8 rows x 4 lanes x 4 B inside one 32-B sector.
 *   f32w   scalar red.global.add.f32, 32 lanes = 128 contiguous bytes of one row: 32 instructions,
 *          each 1 row x 128 B (the classic smem-staged pattern).
 *   bulk   cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 of 256 B (one row of one
 *          64-column block) from a shared-memory staging row filled with 1.0f once: lanes 0..15 each
 *          issue one per (warp, block), i.e. 16 x 256 B.
 *   bulkr  the same with a whole 2304-B row per operation (lanes 0..15 of warps 0..3, one per row).
 *   st4    plain st.global.v4.f32 with the v4q pattern: the store upper bound (no reduction; the
 *          content check is skipped for it).
 * The warp-specialised backward's split (cuda/attn_bwd/bwd_sm90_ws.cu: WG1 reduces, WG0 gathers):
 *   ws     v4o from warps 4..7 only, each warp all 9 blocks of its 16 rows (72 instructions per thread
 *          and tile, WG1's count); warps 0..3 only meet them at the tile's barrier.
 *   wsg    ws, and warps 0..3 gather the tile's 64 key rows (1152 B of bf16 each, another hash of the
 *          tile) from a second buffer of R rows by cp.async.cg 16 B into shared memory, WG0's pattern
 *          (thread g = t / 8, j = t % 8: rows g, g + 16, g + 32, g + 48, chunk j of each 128-B block:
 *          36 copies per thread, 73,728 B per tile, by the kernels' sm90_cp_async16 into the SW128
 *          tile layout [9 blocks of 8 KB][64 rows]), one group per tile, tile t's reads waited after tile t + 1's are issued; a
 *          256-thread named barrier per tile couples the two halves, as the kernel's hand-offs do.
 *          Its TB/s is the reductions' payload, "read TB/s" the gather's bytes. Whether the
 *          reductions keep ws's rate with the reads beside them is the question H_sep / H_add of
 *          docs/bwd-sm90-v3.md part I (its step 0b).
 *   gth    wsg's gather alone (warps 4..7 idle; no check).
 * Each variant runs at 1 CTA per SM (the kernel's occupancy: 8 warps) and 4 CTAs per SM (wsg / gth:
 * 73,728 B of shared memory each, so 3 are resident), on R = 4096
 * rows (9.4 MB, fits the 50 MB L2) and R = 32768 rows (75 MB, does not). The buffer is zeroed before
 * each timed launch (not timed); the time is the best of --reps launches (cudaEvent).
 * Printed per run: ms, payload TB/s (fp32 bytes added), G lane-ops/s, G "segments"/s (a segment =
 * the contiguous bytes of one row written by one warp instruction: 32 B v2 / f32, 64 B v4q, 128 B
 * v4o / f32w, 256 B = 2 x 128-B lines bulk, counted as 2; hypothesis H1 of the analysis: the L2
 * counts one request per (instruction, row segment within a 128-B line)), G 32-B sectors/s
 * (hypothesis H0), and payload / the same run's device-to-device copy rate (cudaMemcpy of 1 GiB,
 * counted as read + write bytes).
 * Check (every atomic variant, after its last launch): with the buffer zeroed before one launch,
 * every row must hold one value in all 576 columns (its visit count) and the buffer total must be
 * tiles x 64 x 576: a wrong lane map would leave columns unequal or the total off.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/common/sm90_common.cuh" /* the kernels' cp.async, SW128 chunk map, named barrier */
#include "probe_common.cuh"

constexpr int kD = 576;     /* fp32 columns per row */
constexpr int kRows = 64;   /* rows per tile */
constexpr int kNBlk = 9;    /* 64-column blocks per row */
constexpr int kThreads = 256;

enum Variant { V2 = 0, V4Q, V4O, F32, F32W, BULK, BULKR, ST4, WS, WSG, GTH, NVAR };
static const char *kNames[NVAR] = {"v2", "v4q", "v4o", "f32", "f32w", "bulk", "bulkr", "st4", "ws", "wsg", "gth"};
/* contiguous bytes of one row per warp instruction (per bulk op: 128-B lines) */
static const int kSegBytes[NVAR] = {32, 64, 128, 32, 128, 128, 128, 64, 128, 128, 128};
constexpr int kKvRow = 1152;                 /* bf16 key row of D = 576: wsg / gth's gather */
constexpr int kGatherSmem = kRows * kKvRow;  /* 73,728 B: one gathered tile */
static bool has_reductions(int v) { return v != ST4 && v != GTH; }
static bool has_gather(int v) { return v == WSG || v == GTH; }

__device__ __forceinline__ uint32_t tile_row(uint32_t t, int r, uint32_t rmask) {
  return (hash32(t * 2654435761U + 12345U) + (uint32_t)r * 0x9E3779B1U) & rmask;
}

__device__ __forceinline__ void red_v2(float *a, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void red_v4(float *a, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(x), "f"(y), "f"(z), "f"(w)
               : "memory");
}
/* v4o: the 16 rows from wr x 64 columns from c of tile t, as 32 (row, 128-B half) pairs, 4 per
 * instruction (octet o = lane / 8) */
__device__ __forceinline__ void red_v4o_block(float *buf, uint32_t t, int wr, int c, int lane, uint32_t rmask) {
  const int o = lane >> 3, p8 = lane & 7;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int pr = 4 * k + o, r = pr >> 1, half = pr & 1;
    float *row = buf + (size_t)tile_row(t, wr + r, rmask) * kD;
    red_v4(row + c + 32 * half + 4 * p8, 1.f, 1.f, 1.f, 1.f);
  }
}
__device__ __forceinline__ void red_f32(float *a, float x) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(a), "f"(x) : "memory");
}
__device__ __forceinline__ void st_v4(float *a, float x, float y, float z, float w) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
__device__ __forceinline__ void bulk_reduce_add_f32(float *gdst, uint32_t ssrc, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gdst), "r"(ssrc),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

/* ws / wsg / gth: warps 0..3 gather (wsg, gth), warps 4..7 reduce (ws, wsg), a barrier per tile */
template <int V>
__device__ __forceinline__ void probe_ws(float *buf, const uint8_t *kv, int tiles, uint32_t rmask) {
  extern __shared__ __align__(128) uint8_t gsm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t sg = (uint32_t)__cvta_generic_to_shared(gsm);
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    if (warp < 4) {
      if (V != WS) {
        const int g = threadIdx.x >> 3, j = threadIdx.x & 7;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = g + 16 * i;
          const uint8_t *src = kv + (size_t)tile_row(t ^ 0x5bd1e995U, r, rmask) * kKvRow + 16 * j;
#pragma unroll
          for (int b = 0; b < kNBlk; ++b) sm90_cp_async16(sg + b * 8192 + sm90_sw128_chunk_off(r, j), src + 128 * b, 16u);
        }
        cp_async_commit();
        cp_async_wait1();
      }
    } else if (V != GTH) {
#pragma unroll 1
      for (int b = 0; b < kNBlk; ++b) red_v4o_block(buf, t, 16 * (warp & 3), 64 * b, lane, rmask);
    }
    sm90_named_bar_sync(1, kThreads);
  }
  if (V != WS) cp_async_wait0();
}

template <int V>
__global__ void __launch_bounds__(kThreads) probe_kernel(float *buf, const uint8_t *kv, int tiles, uint32_t rmask) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (V == WS || V == WSG || V == GTH) {
    probe_ws<V>(buf, kv, tiles, rmask);
    return;
  }
  __shared__ __align__(128) float stage[kD]; /* bulk variants: one row of 1.0f */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wr = 16 * (warp & 3); /* this warp's 16 rows of the tile */
  if (V == BULK || V == BULKR) {
    for (int i = threadIdx.x; i < kD; i += kThreads) stage[i] = 1.f;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* generic writes -> async proxy reads */
    __syncthreads();
  }
  const uint32_t sstage = (uint32_t)__cvta_generic_to_shared(stage);
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    if (V == BULKR) {
      if (warp < 4 && lane < 16) {
        float *row = buf + (size_t)tile_row(t, wr + lane, rmask) * kD;
        bulk_reduce_add_f32(row, sstage, kD * 4);
        bulk_commit();
        bulk_wait_read<4>();
      }
      continue;
    }
    if (V == BULK) {
      if (lane < 16) {
        float *row = buf + (size_t)tile_row(t, wr + lane, rmask) * kD;
        for (int b = warp >> 2; b < kNBlk; b += 2) {
          bulk_reduce_add_f32(row + 64 * b, sstage + 256 * b, 256);
          bulk_commit();
          bulk_wait_read<4>();
        }
      }
      continue;
    }
    /* the fragment rows of this lane: wr + l / 4 and + 8 (v2, v4q, f32) */
    const int q = lane & 3;
    float *fr0 = buf + (size_t)tile_row(t, wr + (lane >> 2), rmask) * kD;
    float *fr1 = buf + (size_t)tile_row(t, wr + (lane >> 2) + 8, rmask) * kD;
    for (int b = warp >> 2; b < kNBlk; b += 2) {
      const int c = 64 * b;
      if (V == V2) {
#pragma unroll
        for (int cc = 0; cc < 8; ++cc) red_v2(fr0 + c + 8 * cc + 2 * q, 1.f, 1.f);
#pragma unroll
        for (int cc = 0; cc < 8; ++cc) red_v2(fr1 + c + 8 * cc + 2 * q, 1.f, 1.f);
      } else if (V == V4Q || V == ST4) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          if (V == V4Q) red_v4(fr0 + c + 16 * g + 4 * q, 1.f, 1.f, 1.f, 1.f);
          else st_v4(fr0 + c + 16 * g + 4 * q, 1.f, 1.f, 1.f, 1.f);
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          if (V == V4Q) red_v4(fr1 + c + 16 * g + 4 * q, 1.f, 1.f, 1.f, 1.f);
          else st_v4(fr1 + c + 16 * g + 4 * q, 1.f, 1.f, 1.f, 1.f);
        }
      } else if (V == V4O) {
        red_v4o_block(buf, t, wr, c, lane, rmask);
      } else if (V == F32) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          float *row = ((i >> 1) & 1) ? fr1 : fr0;
          red_f32(row + c + 8 * (i >> 2) + 2 * q + (i & 1), 1.f);
        }
      } else if (V == F32W) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          float *row = buf + (size_t)tile_row(t, wr + r, rmask) * kD;
          red_f32(row + c + lane, 1.f);
          red_f32(row + c + 32 + lane, 1.f);
        }
      }
    }
  }
  if (V == BULK || V == BULKR) bulk_wait_all(); /* the bulk ops have read smem (and finished) */
#else
  __trap();
#endif
}

typedef void (*probe_fn)(float *, const uint8_t *, int, uint32_t);
static const probe_fn kKernels[NVAR] = {probe_kernel<V2>,   probe_kernel<V4Q>,  probe_kernel<V4O>,
                                        probe_kernel<F32>,  probe_kernel<F32W>, probe_kernel<BULK>,
                                        probe_kernel<BULKR>, probe_kernel<ST4>, probe_kernel<WS>,
                                        probe_kernel<WSG>,  probe_kernel<GTH>};

/* every row's 576 columns equal, and the total = tiles * 64 * 576 */
static int check(const float *h, size_t rows, int tiles, const char *what) {
  double total = 0;
  size_t bad = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float v = h[r * kD];
    for (int c = 0; c < kD; ++c) {
      if (h[r * kD + c] != v) ++bad;
      total += h[r * kD + c];
    }
  }
  const double want = (double)tiles * kRows * kD;
  if (bad || total != want) {
    printf("  CHECK FAILED %s: %zu unequal columns, total %.0f, expected %.0f\n", what, bad, total, want);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int tiles = 8192, reps = 5;
  const char *only = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--tiles") && i + 1 < argc) tiles = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: atomic_probe [--tiles N] [--reps N] "
                      "[--only v2,v4q,v4o,f32,f32w,bulk,bulkr,st4,ws,wsg,gth]\n");
      return 2;
    }
  }
  if (tiles < 1 || reps < 1) return 2;
  int dev = 0;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9 || prop.minor != 0) {
    fprintf(stderr, "atomic_probe: built for sm_90a, device is cc %d.%d\n", prop.major, prop.minor);
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  printf("device %s, %d SMs, L2 %d MB; %d tiles x 64 rows x 576 fp32 = %.3f GB payload per launch\n", prop.name,
         sms, prop.l2CacheSize >> 20, tiles, (double)tiles * kRows * kD * 4 / 1e9);

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  /* same-run ceiling: 1 GiB device-to-device copy, read + write bytes */
  const size_t cbytes = (size_t)1 << 30;
  void *ca, *cb;
  CK(cudaMalloc(&ca, cbytes));
  CK(cudaMalloc(&cb, cbytes));
  CK(cudaMemset(ca, 0, cbytes));
  float copy_best = 1e30f;
  for (int r = 0; r < reps + 1; ++r) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0 && ms < copy_best) copy_best = ms;
  }
  CK(cudaFree(ca));
  CK(cudaFree(cb));
  const double copy_bps = 2.0 * cbytes / (copy_best * 1e-3);
  printf("d2d copy 1 GiB: %.3f ms, %.3f TB/s (read + write)\n\n", copy_best, copy_bps / 1e12);

  for (int v = 0; v < NVAR; ++v)
    if (has_gather(v)) CK(cudaFuncSetAttribute(kKernels[v], cudaFuncAttributeMaxDynamicSharedMemorySize, kGatherSmem));
  printf("%-6s %-8s %-5s %9s %9s %10s %10s %10s %8s %9s  %s\n", "var", "buffer", "cta/sm", "ms", "TB/s", "G lane-op/s",
         "G seg/s", "G sect/s", "x copy", "read TB/s", "check");
  const int row_counts[2] = {4096, 32768};
  int failures = 0;
  for (int si = 0; si < 2; ++si) {
    const size_t rows = (size_t)row_counts[si], bytes = rows * kD * 4;
    float *buf;
    uint8_t *kv;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&kv, rows * kKvRow));
    CK(cudaMemset(kv, 0, rows * kKvRow));
    float *host = (float *)malloc(bytes);
    if (!host) return 1;
    for (int v = 0; v < NVAR; ++v) {
      if (only) {
        char key[16];
        snprintf(key, sizeof key, ",%s,", kNames[v]);
        char list[256];
        snprintf(list, sizeof list, ",%s,", only);
        if (!strstr(list, key)) continue;
      }
      for (int occ = 1; occ <= 4; occ *= 4) {
        const int grid = sms * occ;
        float best = 1e30f;
        for (int r = 0; r < reps + 1; ++r) {
          CK(cudaMemset(buf, 0, bytes));
          CK(cudaEventRecord(e0));
          kKernels[v]<<<grid, kThreads, has_gather(v) ? kGatherSmem : 0>>>(buf, kv, tiles, (uint32_t)(rows - 1));
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          CK(cudaGetLastError());
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (r > 0 && ms < best) best = ms;
        }
        const char *chk = "-";
        if (has_reductions(v)) {
          CK(cudaMemcpy(host, buf, bytes, cudaMemcpyDeviceToHost));
          char what[64];
          snprintf(what, sizeof what, "%s R=%zu occ %d", kNames[v], rows, occ);
          const int bad = check(host, rows, tiles, what);
          failures += bad;
          chk = bad ? "FAIL" : "ok";
        }
        const double payload = (double)tiles * kRows * kD * 4, s = best * 1e-3;
        const double lane_ops = payload / (v == V2 ? 8 : (v == F32 || v == F32W) ? 4 : v == BULK ? 256
                                                                               : v == BULKR ? 2304 : 16);
        const double read = has_gather(v) ? (double)tiles * kGatherSmem : 0, red = has_reductions(v) ? payload : 0;
        printf("%-6s %5.1f MB %-5d %9.3f %9.3f %10.2f %10.2f %10.2f %8.3f %9.3f  %s\n", kNames[v], bytes / 1e6, occ,
               best, red / s / 1e12, lane_ops / s / 1e9 * (red > 0), red / kSegBytes[v] / s / 1e9,
               red / 32 / s / 1e9, red / s / copy_bps, read / s / 1e12, chk);
      }
    }
    free(host);
    CK(cudaFree(buf));
    CK(cudaFree(kv));
  }
  printf("\nseg = contiguous bytes of one row per warp instruction (v2/f32 32 B, v4q/st4 64 B, v4o/f32w 128 B, bulk:\n"
         "128-B lines); H1 predicts equal G seg/s across variants, H0 equal G sect/s. x copy = payload bytes/s over\n"
         "the d2d copy's read+write bytes/s. read TB/s: wsg / gth's gather bytes (73,728 per tile).\n");
  if (failures) printf("%d CHECK FAILURES\n", failures);
  return failures ? 1 : 0;
}
