/*
 * ring_probe.cu - `make dev`, then build/dev/ring_probe: can a deterministic backward's per-slot fp32
 * rows make their trip through L2 instead of DRAM (docs/bwd-sm90-v3.md part VII)? Standalone: CUDA
 * runtime only, no libdsa (only the device helpers of cuda/common/sm90_common.cuh: the L2 policies and
 * the dKV reduction the kernels issue). sm_90a machine code only.
 *
 *   ring_probe [--steps N] [--reps N] [--keys N] [--lags 1,2,3] [--ctas N] [--nogather]
 *
 * One CTA of 256 threads per SM (or --ctas N of them, fewer than the SMs: a ring that fits in L2), all
 * resident; each runs --steps "tile steps" (default 1024: about
 * bwd-glm-4k's 31 waves x 32 tiles). In a step a CTA handles one tile: 64 key rows drawn at random
 * from --keys (default 4096) and, unless --nogather, first gathers their bf16 rows (64 x 1152 B, as
 * the kernel's KV gather; L2 evict_first). Then, by variant:
 *   red    det0's reduction: red.global.add.v4.f32 of 64 x 576 fp32 (147,456 B) into acc[keys x 576]
 *          at the gathered rows (L2 evict_last, as the kernel). The time to beat.
 *   ring   part VII's round trip: st.global.v4 of the 64 x 576 fp32 rows into this CTA's ring slot
 *          (step mod S, S = 2 lag + 2 slots of 147,456 B per CTA), a publish (bar.sync, then one
 *          thread's fence.acq_rel.gpu + red.release.gpu on the step's counter), a wait for every CTA
 *          to have published step s - lag (one thread's ld.acquire.gpu spin, bar.sync), then a load of
 *          step s - lag's slot of another CTA ((c + 1 + 7 s) mod grid: an owner reading someone
 *          else's rows) with ld.global.cg (L2 only, evict_first), summed in registers. Slots are
 *          reused only after 2 lag + 2 steps, when every reader has passed them.
 *   ring128 the same with the loads by one warpgroup (threads 0..127), 8 float4 loads in flight per
 *          thread (16 KB per SM): what an owner in WG0 can keep in flight beside its live registers.
 *   ringd  ring, then discard.global.L2 of the loaded rows' lines once the CTA has read them: a
 *          consumed row leaves L2 without a write-back to DRAM (its slot is rewritten before any
 *          reader comes back to it).
 *   store  the ring's stores and publish without the wait and the loads: what writing alone costs.
 * The rows stored by CTA c at step s hold the value v(c, s) = (c * 131 + s) mod 1021 in every column;
 * each loaded value is compared with v(c', s - lag) of its writer and mismatches are counted: a
 * publish that does not order, or a slot overwritten early, shows as a nonzero count.
 * Printed per (variant, lag): ms (best of --reps launches), us per step, the ring's L2 bytes per step
 * over all CTAs, and the time over red's. Part VII's question: ring / red at lag 1-2 near 1 (the rows
 * stay in L2; det1 at 1.1-1.4x det0's time is possible) or near 2+ (they go to DRAM).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/common/sm90_common.cuh" /* the kernels' L2 policies and dKV reduction */
#include "probe_common.cuh"

constexpr int kD = 576;                       /* fp32 columns per row */
constexpr int kRows = 64;                     /* rows per tile */
constexpr int kThreads = 256;
constexpr int kF4 = kRows * kD / 4;           /* float4 per tile: 9216, 36 per thread */
constexpr int kG4 = kRows * kD * 2 / 16;      /* uint4 of the bf16 gather: 4608, 18 per thread */
constexpr size_t kTileBytes = (size_t)kRows * kD * 4;

enum Variant { RED = 0, RING, RING128, RINGD, STORE, NVAR };
static const char *kNames[NVAR] = {"red", "ring", "ring128", "ringd", "store"};
/* the variants that load other CTAs' rows back (and so check them) */
__host__ __device__ constexpr bool loads_ring(int v) { return v == RING || v == RING128 || v == RINGD; }

__device__ __forceinline__ float ring_value(uint32_t c, uint32_t s) { return (float)((c * 131u + s) % 1021u); }

__device__ __forceinline__ uint4 ld_gather(const uint4 *p, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ float4 ld_ring(const float4 *p, uint64_t pol) {
  float4 v;
  asm volatile("ld.global.cg.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p), "l"(pol)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_ring(float4 *p, float x) {
  asm volatile("st.global.v4.f32 [%0], {%1, %1, %1, %1};" ::"l"(p), "f"(x) : "memory");
}

struct Args {
  float *acc;          /* keys x 576 fp32 (red) */
  const uint4 *kv;     /* keys x 576 bf16 (the gather) */
  float4 *ring;        /* grid x slots tiles */
  unsigned *count;     /* steps: CTAs that published the step */
  unsigned *bad;       /* mismatching loaded values */
  float *sink;         /* grid: keeps the sums and the gathers live */
  int steps, keys, lag, slots, gather;
};

template <int V>
__global__ void __launch_bounds__(kThreads, 1) ring_kernel(Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int rows[kRows];
  const int tid = threadIdx.x, c = blockIdx.x, grid = gridDim.x;
  const uint64_t pf = sm90_l2_policy_evict_first(), pl = sm90_l2_policy(true);
  float keep = 0.f;
  unsigned bad = 0, gx = 0;
  for (int s = 0; s < a.steps; ++s) {
    if (tid < kRows) rows[tid] = (int)(hash32((uint32_t)c * 1000003u + (uint32_t)s * 64u + tid) % (uint32_t)a.keys);
    __syncthreads();
    if (a.gather) {
#pragma unroll 9
      for (int i = 0; i < kG4 / kThreads; ++i) {
        const int idx = i * kThreads + tid, r = idx / 72, col = idx % 72;
        const uint4 v = ld_gather(a.kv + (size_t)rows[r] * 72 + col, pf);
        gx ^= v.x ^ v.w;
      }
    }
    if (V == RED) {
#pragma unroll 6
      for (int i = 0; i < kF4 / kThreads; ++i) {
        const int idx = i * kThreads + tid, r = idx / 144, col = idx % 144;
        sm90_red4_hint<true>(a.acc + (size_t)rows[r] * kD + 4 * col, 1.f, 1.f, 1.f, 1.f, 0, pl);
      }
      __syncthreads(); /* rows[] is rewritten next step */
      continue;
    }
    float4 *mine = a.ring + ((size_t)c * a.slots + s % a.slots) * kF4;
    const float v = ring_value((uint32_t)c, (uint32_t)s);
#pragma unroll 6
    for (int i = 0; i < kF4 / kThreads; ++i) st_ring(mine + i * kThreads + tid, v);
    __syncthreads();
    if (tid == 0) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.count + s) : "memory");
    }
    if (loads_ring(V) && s >= a.lag) {
      const int ps = s - a.lag;
      if (tid == 0) {
        unsigned n;
        do {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(a.count + ps) : "memory");
        } while (n < (unsigned)grid);
      }
      __syncthreads();
      const int w = (c + 1 + 7 * s) % grid;
      const float4 *theirs = a.ring + ((size_t)w * a.slots + ps % a.slots) * kF4;
      const float want = ring_value((uint32_t)w, (uint32_t)ps);
      if (V == RING || V == RINGD) {
#pragma unroll 12
        for (int i = 0; i < kF4 / kThreads; ++i) {
          const float4 x = ld_ring(theirs + i * kThreads + tid, pf);
          bad += (x.x != want) + (x.y != want) + (x.z != want) + (x.w != want);
          keep += x.x + x.y + x.z + x.w;
        }
      } else if (tid < 128) { /* one warpgroup, 8 loads in flight per thread: an owner in WG0 */
#pragma unroll 8
        for (int i = 0; i < kF4 / 128; ++i) {
          const float4 x = ld_ring(theirs + i * 128 + tid, pf);
          bad += (x.x != want) + (x.y != want) + (x.z != want) + (x.w != want);
          keep += x.x + x.y + x.z + x.w;
        }
      }
      if (V == RINGD) { /* the rows are read once: drop their lines from L2 without a write-back */
        __syncthreads();
        for (int l = tid; l < (int)(kTileBytes / 128); l += kThreads)
          asm volatile("discard.global.L2 [%0], 128;" ::"l"((const char *)theirs + 128 * (size_t)l) : "memory");
      }
    }
    __syncthreads(); /* rows[] is rewritten next step */
  }
  if (bad) atomicAdd(a.bad, bad);
  if (keep == -1.f || gx == 0x12345678u) a.sink[c] = keep + (float)gx;
#else
  __trap();
#endif
}

typedef void (*ring_fn)(Args);
static const ring_fn kKernels[NVAR] = {ring_kernel<RED>, ring_kernel<RING>, ring_kernel<RING128>,
                                       ring_kernel<RINGD>, ring_kernel<STORE>};

int main(int argc, char **argv) {
  int steps = 1024, reps = 5, keys = 4096, gather = 1, ctas = 0;
  int lags[8] = {1, 2, 3}, nlags = 3;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--keys") && i + 1 < argc) keys = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ctas") && i + 1 < argc) ctas = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--nogather")) gather = 0;
    else if (!strcmp(argv[i], "--lags") && i + 1 < argc) {
      nlags = 0;
      for (char *t = strtok(argv[++i], ","); t && nlags < 8; t = strtok(NULL, ",")) lags[nlags++] = atoi(t);
    } else {
      fprintf(stderr, "usage: ring_probe [--steps N] [--reps N] [--keys N] [--lags 1,2,3] [--ctas N] [--nogather]\n");
      return 2;
    }
  }
  if (steps < 4 || reps < 1 || keys < kRows || nlags < 1) return 2;
  for (int l = 0; l < nlags; ++l)
    if (lags[l] < 1 || lags[l] >= steps) return 2;
  cudaDeviceProp prop;
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9 || prop.minor != 0) {
    fprintf(stderr, "ring_probe: built for sm_90a, device is cc %d.%d\n", prop.major, prop.minor);
    return 1;
  }
  if (ctas < 0 || ctas > prop.multiProcessorCount) return 2;
  const int grid = ctas ? ctas : prop.multiProcessorCount;
  int maxlag = 1;
  for (int l = 0; l < nlags; ++l) maxlag = lags[l] > maxlag ? lags[l] : maxlag;
  const int maxslots = 2 * maxlag + 2;
  printf("device %s, %d SMs, L2 %d MB; %d steps x %d CTAs, keys %d (acc %.1f MB, kv %.1f MB), gather %s\n",
         prop.name, grid, prop.l2CacheSize >> 20, steps, grid, keys, keys * kD * 4 / 1e6, keys * kD * 2 / 1e6,
         gather ? "on" : "off");
  printf("one step over all CTAs: %.1f MB of fp32 rows\n\n", grid * kTileBytes / 1e6);

  Args a;
  memset(&a, 0, sizeof a);
  CK(cudaMalloc(&a.acc, (size_t)keys * kD * 4));
  CK(cudaMalloc((void **)&a.kv, (size_t)keys * kD * 2));
  CK(cudaMalloc(&a.ring, (size_t)grid * maxslots * kTileBytes));
  CK(cudaMalloc(&a.count, (size_t)steps * sizeof(unsigned)));
  CK(cudaMalloc(&a.bad, sizeof(unsigned)));
  CK(cudaMalloc(&a.sink, grid * sizeof(float)));
  CK(cudaMemset(a.acc, 0, (size_t)keys * kD * 4));
  CK(cudaMemset((void *)a.kv, 0x3c, (size_t)keys * kD * 2));
  a.steps = steps;
  a.keys = keys;
  a.gather = gather;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  printf("%-6s %4s %5s %9s %9s %12s %9s  %s\n", "var", "lag", "slots", "ms", "us/step", "ring MB/step", "x red",
         "check");
  double red_ms = 0;
  int failures = 0;
  for (int v = 0; v < NVAR; ++v) {
    for (int l = 0; l < (v == RED ? 1 : nlags); ++l) {
      a.lag = lags[l];
      a.slots = 2 * a.lag + 2;
      float best = 1e30f;
      unsigned bad = 0;
      for (int r = 0; r < reps + 1; ++r) {
        CK(cudaMemset(a.count, 0, (size_t)steps * sizeof(unsigned)));
        CK(cudaMemset(a.bad, 0, sizeof(unsigned)));
        CK(cudaEventRecord(e0));
        kKernels[v]<<<grid, kThreads>>>(a);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0 && ms < best) best = ms;
        unsigned b;
        CK(cudaMemcpy(&b, a.bad, sizeof b, cudaMemcpyDeviceToHost));
        bad += b;
      }
      if (v == RED) red_ms = best;
      failures += bad != 0;
      const double ring_mb = v == RED ? 0 : (v == STORE ? 1.0 : 2.0) * grid * kTileBytes / 1e6;
      char chk[32], lagc[16];
      snprintf(lagc, sizeof lagc, v == RED ? "-" : "%d", a.lag);
      if (loads_ring(v)) snprintf(chk, sizeof chk, bad ? "FAIL %u" : "ok", bad);
      else snprintf(chk, sizeof chk, "-");
      printf("%-6s %4s %5d %9.3f %9.3f %12.1f %9.3f  %s\n", kNames[v], lagc,
             v == RED ? 0 : a.slots, best, best * 1e3 / steps, ring_mb, red_ms > 0 ? best / red_ms : 0.0, chk);
    }
  }
  printf("\nring MB/step: fp32 bytes stored + loaded per step over all CTAs (ring), stored (store). x red: the\n"
         "time over det0's reduction of the same rows in the same run.\n");
  if (failures) printf("%d CHECK FAILURES\n", failures);
  return failures ? 1 : 0;
}
