/*
 * cluster_push_probe.cu - `make dev`: the gate of the 128-head forward's cluster share
 * (docs/fwd-sm90-vs-flashmla.md, A6). Standalone: CUDA runtime only, no libdsa, sm_90a only.
 *
 *   cluster_push_probe [--tiles N] [--reps N]
 *
 * At H = 128 the forward runs a token's two 64-head blocks as two CTAs that gather the same 64 KV
 * rows of every tile. A6 lets each CTA of a 2-CTA cluster gather half the rows and push them to its
 * peer through distributed shared memory. This program runs that data path alone, without the
 * MMAs, so that one run says whether it can feed the consumers:
 *   - a ring of 2 stages of one 64 x 576 bf16 tile each, in the forward's K-major SW128 layout
 *     (row r, 64-column block b, 16-B chunk j at b 8192 + r 128 + (j ^ r % 8) 16);
 *   - WG0 (128 threads) gathers by 16-B cp.async from random rows of a [T_kv x 1152 B] buffer, as
 *     the forward's producer does (thread (g, j) = (tid / 8, tid % 8) takes chunk j of rows g + 16 i);
 *   - WG1 (128 threads) consumes: waits for the stage, optionally spins `delay` clocks (the MMAs'
 *     time), then one elected thread releases the stage;
 *   - mode "own": each CTA gathers all 64 rows (today's forward);
 *     mode "share": CTA rank r gathers rows 32 r .. 32 r + 31 (one contiguous 4 KB piece per block
 *     at b 8192 + r 4096); when they have landed (a `landed` mbarrier, 128 cp.async arrivals), warp 8
 *     pushes the nine pieces to the same place in the peer with
 *     cp.async.bulk.shared::cluster.shared::cta, completing on the peer's `full` barrier (128 local
 *     cp.async arrivals + one arrive.expect_tx of 36864 B). A stage is free when both CTAs' consumers
 *     released it (local arrive + remote arrive on the peer's `empty`).
 *     mode "share0": the same without the pusher warp: producer warp 0 pushes, as the kernel's
 *     -DDSA_FWD_CLUSTER_SHARE build does: before each empty wait and while it waits, every issued
 *     tile whose rows landed, in order; the rest at the end.
 * Both CTAs of a cluster read the same row indices (one token's tile); clusters read different ones.
 *
 * Printed per (mode, T_kv, delay): the best launch's ms, clocks per tile (per CTA, from its first
 * empty wait to its last full completion, mean over CTAs), tile bytes delivered into each SM per
 * clock (73728 per tile), bytes pulled from L2 per SM per clock, and in share mode the push rate and
 * the push latency: clocks from a CTA's own rows landing (share0: from its push's issue) to its stage
 * being full (the peer's half arrived), mean and 90th percentile over tiles 2.. of every CTA.
 * Gate (docs/fwd-sm90-vs-flashmla.md A6): go if at delay 0 share sustains >= 30 B/clk of push per
 * SM and the latency stays <= 1500 clk; then share must beat own in tiles per clock at the forward's
 * consumer time (delay ~3000 clk per tile) on T_kv = 32768 and 131072. share0 against share says
 * what the kernel's inline pusher costs against a dedicated warp.
 * Check (one untimed launch per mode): the consumers compare every 16-B chunk of every tile with
 * its source row; the mismatch count must be 0 (exit status 1 otherwise).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                          \
  do {                                                                                                 \
    cudaError_t e_ = (x);                                                                              \
    if (e_ != cudaSuccess) {                                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));              \
      exit(1);                                                                                         \
    }                                                                                                  \
  } while (0)

constexpr int kRows = 64;              /* rows per tile */
constexpr int kBlk = 9;                /* 64-column (128-B) blocks per row */
constexpr int kRowBytes = 1152;        /* one bf16 row of 576 columns */
constexpr int kBlkBytes = 8192;        /* one block of 64 rows */
constexpr int kTileBytes = kBlk * kBlkBytes;
constexpr int kHalfBytes = kTileBytes / 2; /* the rows one CTA gathers in share mode */
constexpr int kStages = 2;
constexpr int kThreads = 288;          /* producer WG, consumer WG, pusher warp */
constexpr int kSmem = kStages * kTileBytes + 64;

struct Args {
  const uint8_t *kv;
  const int *idx;       /* [clusters][tiles][64] */
  int tiles;
  int share;
  int delay;
  int check;
  long long *t_start;   /* [ctas] */
  long long *t_end;     /* [ctas] */
  long long *t_landed;  /* [ctas][tiles] */
  long long *t_full;    /* [ctas][tiles] */
  unsigned long long *bad;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t map_to(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "W%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra W%=;\n\t}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ bool bar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* the default .release.cta semantics, as the kernel's and CUTLASS's ClusterBarrier (.cluster scope
 * costs a MEMBAR.GPU per arrival) */
__device__ __forceinline__ void bar_arrive_remote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}
__device__ __forceinline__ void bar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void push_to_peer(uint32_t dst_cluster, uint32_t src, uint32_t bytes,
                                             uint32_t bar_cluster) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst_cluster),
      "r"(src), "r"(bytes), "r"(bar_cluster)
      : "memory");
}

/* this CTA's 32 rows of stage s's tile (one 4 KB piece per block) into the same place in the peer */
__device__ __forceinline__ void push_stage(uint32_t base, uint32_t bars, int s, uint32_t rank, uint32_t peer) {
  const uint32_t tile = base + s * kTileBytes, peer_full = map_to(bars + 8 * s, peer);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  for (int b = 0; b < kBlk; ++b) {
    const uint32_t src = tile + b * kBlkBytes + rank * (kBlkBytes / 2);
    push_to_peer(map_to(src, peer), src, kBlkBytes / 2, peer_full);
  }
}

/* mode 2, producer warp 0 (warp-uniform, lane 0 issues): pushes every issued tile whose rows landed,
 * in order; block: waits for each landing. t_landed gets the push's issue time (the landing itself
 * is not observed by anyone in this mode). */
__device__ __forceinline__ void push_landed(const Args &a, uint32_t base, uint32_t bars, uint32_t rank, uint32_t peer,
                                            int &npush, int issued, bool block, int lane, int cta) {
  while (npush < issued) {
    const int s = npush & 1;
    const uint32_t ph = (npush >> 1) & 1;
    if (block) bar_wait(bars + 32 + 8 * s, ph);
    else if (!__shfl_sync(0xffffffffu, (int)bar_test(bars + 32 + 8 * s, ph), 0)) return;
    if (lane == 0) {
      a.t_landed[(size_t)cta * a.tiles + npush] = clock64();
      push_stage(base, bars, s, rank, peer);
    }
    __syncwarp();
    ++npush;
  }
}

__global__ void __launch_bounds__(kThreads, 1) probe_kernel(Args a) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = smem_u32(sm);
  const uint32_t bars = base + kStages * kTileBytes;
  /* full[s] at bars + 8 s, empty[s] at bars + 16 + 8 s, landed[s] at bars + 32 + 8 s */
  const uint32_t rank = cluster_rank(), peer = rank ^ 1u;
  const int tid = threadIdx.x, cta = blockIdx.x;
  const int *idx = a.idx + (size_t)(cta >> 1) * a.tiles * kRows;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      bar_init(bars + 8 * s, a.share ? 129 : 128);
      bar_init(bars + 16 + 8 * s, a.share ? 2 : 1);
      bar_init(bars + 32 + 8 * s, 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();

  if (tid < 128) {
    /* producer: thread (g, j) copies chunk j of every block of rows r0 + g + 16 i */
    const int g = tid >> 3, j = tid & 7;
    const int nrows = a.share ? 2 : 4, r0 = a.share ? 32 * (int)rank : 0;
    const bool inline_push = a.share == 2 && tid < 32;
    int npush = 0;
    if (tid == 0) a.t_start[cta] = clock64();
    for (int k = 0; k < a.tiles; ++k) {
      const int s = k & 1;
      const uint32_t ph = (k >> 1) & 1, full = bars + 8 * s, tile = base + s * kTileBytes;
      if (inline_push) { /* the kernel's scheme: push what landed, then keep pushing while waiting */
        push_landed(a, base, bars, rank, peer, npush, k, false, tid & 31, cta);
        while (!__all_sync(0xffffffffu, bar_test(bars + 16 + 8 * s, ph ^ 1u)))
          push_landed(a, base, bars, rank, peer, npush, k, false, tid & 31, cta);
      } else {
        bar_wait(bars + 16 + 8 * s, ph ^ 1u);
      }
      if (a.share && tid == 0) bar_expect_tx(full, kHalfBytes);
      for (int i = 0; i < nrows; ++i) {
        const int r = r0 + g + 16 * i;
        const uint8_t *src = a.kv + (size_t)__ldg(idx + (size_t)k * kRows + r) * kRowBytes + j * 16;
        const uint32_t dst = tile + r * 128 + ((j ^ (r & 7)) << 4);
#pragma unroll
        for (int b = 0; b < kBlk; ++b) cp_async16(dst + b * kBlkBytes, src + b * 128);
      }
      cp_async_arrive(full);
      if (a.share) cp_async_arrive(bars + 32 + 8 * s);
    }
    if (inline_push) push_landed(a, base, bars, rank, peer, npush, a.tiles, true, tid & 31, cta);
  } else if (tid < 256) {
    /* consumer: wait, optionally check and spin, release locally and in the peer */
    const int c = tid - 128;
    for (int k = 0; k < a.tiles; ++k) {
      const int s = k & 1;
      const uint32_t ph = (k >> 1) & 1;
      bar_wait(bars + 8 * s, ph);
      if (c == 0) a.t_full[(size_t)cta * a.tiles + k] = clock64();
      if (a.check) {
        const uint8_t *tile = sm + s * kTileBytes;
        unsigned long long bad = 0;
        for (int q = c; q < kRows * (kRowBytes / 16); q += 128) {
          const int r = q / (kRowBytes / 16), ch = q % (kRowBytes / 16), b = ch >> 3, j = ch & 7;
          const uint4 got = *(const uint4 *)(tile + b * kBlkBytes + r * 128 + ((j ^ (r & 7)) << 4));
          const uint4 want =
              *(const uint4 *)(a.kv + (size_t)idx[(size_t)k * kRows + r] * kRowBytes + ch * 16);
          bad += got.x != want.x || got.y != want.y || got.z != want.z || got.w != want.w;
        }
        if (bad) atomicAdd(a.bad, bad);
      }
      if (a.delay) {
        const long long t0 = clock64();
        while (clock64() - t0 < a.delay) {
        }
      }
      asm volatile("bar.sync 1, 128;" ::: "memory");
      if (c == 0) {
        bar_arrive(bars + 16 + 8 * s);
        if (a.share) bar_arrive_remote(map_to(bars + 16 + 8 * s, peer));
      }
    }
    if (c == 0) a.t_end[cta] = clock64();
  } else if (a.share == 1) {
    /* mode 1, the pusher warp (lane 0 issues): each tile's own rows as soon as they landed */
    for (int k = 0; k < a.tiles; ++k) {
      const int s = k & 1;
      const uint32_t ph = (k >> 1) & 1;
      bar_wait(bars + 32 + 8 * s, ph);
      if (tid == 256) {
        a.t_landed[(size_t)cta * a.tiles + k] = clock64();
        push_stage(base, bars, s, rank, peer);
      }
      __syncwarp();
    }
  }
  __syncwarp();
  cluster_sync();
}

static const char *kModes[3] = {"own", "share", "share0"};

static int cmp_ll(const void *x, const void *y) {
  const long long a = *(const long long *)x, b = *(const long long *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  int tiles = 1024, reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--tiles") && i + 1 < argc) tiles = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--tiles N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  int dev = 0, ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("cluster_push_probe: no CUDA device; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9) {
    printf("cluster_push_probe: needs sm_90 (found sm_%d%d)\n", prop.major, prop.minor);
    return 0;
  }
  CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));

  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(2 * prop.multiProcessorCount);
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, probe_kernel, &cfg));
  const int ctas = 2 * clusters;
  cfg.gridDim = dim3(ctas);
  printf("cluster_push_probe: %s, %d SMs, %d co-resident 2-CTA clusters (%d CTAs), %d tiles per CTA\n",
         prop.name, prop.multiProcessorCount, clusters, ctas, tiles);

  const int tkvs[3] = {8192, 32768, 131072};
  const int delays[2] = {0, 3000};
  uint8_t *kv;
  int *idx;
  long long *t_start, *t_end, *t_landed, *t_full;
  unsigned long long *bad;
  const size_t nidx = (size_t)clusters * tiles * kRows;
  CK(cudaMalloc(&kv, (size_t)tkvs[2] * kRowBytes));
  CK(cudaMalloc(&idx, nidx * sizeof(int)));
  CK(cudaMalloc(&t_start, ctas * sizeof(long long)));
  CK(cudaMalloc(&t_end, ctas * sizeof(long long)));
  CK(cudaMalloc(&t_landed, (size_t)ctas * tiles * sizeof(long long)));
  CK(cudaMalloc(&t_full, (size_t)ctas * tiles * sizeof(long long)));
  CK(cudaMalloc(&bad, sizeof(unsigned long long)));
  {
    uint8_t *h = (uint8_t *)malloc((size_t)tkvs[2] * kRowBytes);
    uint32_t x = 12345u;
    for (size_t i = 0; i < (size_t)tkvs[2] * kRowBytes; ++i) {
      x = x * 1664525u + 1013904223u;
      h[i] = (uint8_t)(x >> 24);
    }
    CK(cudaMemcpy(kv, h, (size_t)tkvs[2] * kRowBytes, cudaMemcpyHostToDevice));
    free(h);
  }
  int *hidx = (int *)malloc(nidx * sizeof(int));
  long long *hs = (long long *)malloc(ctas * sizeof(long long));
  long long *he = (long long *)malloc(ctas * sizeof(long long));
  long long *hl = (long long *)malloc((size_t)ctas * tiles * sizeof(long long));
  long long *hf = (long long *)malloc((size_t)ctas * tiles * sizeof(long long));
  long long *lat = (long long *)malloc((size_t)ctas * tiles * sizeof(long long));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int failed = 0;

  printf("%-6s %7s %6s %9s %10s %14s %12s %11s %9s %9s\n", "mode", "T_kv", "delay", "ms", "clk/tile",
         "tile B/clk/SM", "L2 B/clk/SM", "push B/clk", "lat mean", "lat p90");
  for (int ti = 0; ti < 3; ++ti) {
    const int tkv = tkvs[ti];
    uint32_t x = 777u + ti;
    for (size_t i = 0; i < nidx; ++i) {
      x = x * 1664525u + 1013904223u;
      hidx[i] = (int)((x >> 8) % (uint32_t)tkv);
    }
    CK(cudaMemcpy(idx, hidx, nidx * sizeof(int), cudaMemcpyHostToDevice));
    for (int share = 0; share < 3; ++share) {
      Args a = {kv, idx, tiles, share, 0, 1, t_start, t_end, t_landed, t_full, bad};
      if (ti == 0) {
        CK(cudaMemset(bad, 0, sizeof(unsigned long long)));
        CK(cudaLaunchKernelEx(&cfg, probe_kernel, a));
        CK(cudaDeviceSynchronize());
        unsigned long long hb = 0;
        CK(cudaMemcpy(&hb, bad, sizeof(hb), cudaMemcpyDeviceToHost));
        printf("check %s: %llu mismatched 16-B chunks of %llu\n", kModes[share], hb,
               (unsigned long long)ctas * tiles * kRows * (kRowBytes / 16));
        failed |= hb != 0;
      }
      a.check = 0;
      for (int di = 0; di < 2; ++di) {
        a.delay = delays[di];
        float best = 1e30f;
        for (int r = 0; r < reps; ++r) {
          CK(cudaEventRecord(e0));
          CK(cudaLaunchKernelEx(&cfg, probe_kernel, a));
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms = 0.f;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (ms < best) {
            best = ms;
            CK(cudaMemcpy(hs, t_start, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(he, t_end, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hl, t_landed, (size_t)ctas * tiles * sizeof(long long), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hf, t_full, (size_t)ctas * tiles * sizeof(long long), cudaMemcpyDeviceToHost));
          }
        }
        double clk = 0.0;
        for (int c = 0; c < ctas; ++c) clk += (double)(he[c] - hs[c]);
        clk /= (double)ctas * tiles;
        const double tile_rate = kTileBytes / clk, l2_rate = (share ? kHalfBytes : kTileBytes) / clk;
        if (share) {
          size_t n = 0;
          for (int c = 0; c < ctas; ++c)
            for (int k = 2; k < tiles; ++k) lat[n++] = hf[(size_t)c * tiles + k] - hl[(size_t)c * tiles + k];
          qsort(lat, n, sizeof(long long), cmp_ll);
          double mean = 0.0;
          for (size_t i = 0; i < n; ++i) mean += (double)lat[i];
          mean /= (double)(n ? n : 1);
          printf("%-6s %7d %6d %9.3f %10.0f %14.1f %12.1f %11.1f %9.0f %9lld\n", kModes[share], tkv, a.delay, best,
                 clk, tile_rate, l2_rate, kHalfBytes / clk, mean, n ? lat[n * 9 / 10] : 0LL);
        } else {
          printf("%-6s %7d %6d %9.3f %10.0f %14.1f %12.1f %11s %9s %9s\n", "own", tkv, a.delay, best, clk,
                 tile_rate, l2_rate, "-", "-", "-");
        }
      }
    }
  }
  printf(failed ? "cluster_push_probe: MISMATCH\n" : "cluster_push_probe: contents check passed\n");
  return failed;
}
