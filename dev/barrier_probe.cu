/*
 * barrier_probe.cu - `make barrier-probe`: does compute-sanitizer racecheck follow the ordering that
 * named-barrier arrive / sync pairs give? Schedule 3 of the forward (cuda/attn_fwd_sm90_v2.cu) hands
 * its chained row max between two warpgroups with barrier.arrive on one side and barrier.sync on the
 * other (docs/fwd-sm90-next.md); racecheck reported hazards on exactly that exchange. This program
 * runs the same exchange without anything else of the kernel, in four modes, so one racecheck run
 * per mode says whether the tool or the protocol is at fault. Standalone: CUDA runtime only.
 *
 *   barrier_probe MODE      (run it under compute-sanitizer --tool racecheck, one mode per process)
 *
 * 256 threads = WG0 (threads 0..127) + WG1 (128..255), float m[64] in shared memory, ITERS rounds:
 *   mode 0 "arrive" (schedule 3's protocol; barrier ids as kBarM0 = 1, kBarM1 = 2, kBarS0 = 3, kBarS1 = 4):
 *     WG0: lanes 4k write m[r] = v0(i);  arrive 1;  sync 2;  all lanes read m[r] (expect v1(i));  arrive 3;  sync 4
 *     WG1: sync 1;  all lanes read m[r] (expect v0(i));  __syncwarp;  lanes 4k write m[r] = v1(i);  arrive 2;
 *          sync 3;  arrive 4
 *   mode 1 "sync": the same accesses, every barrier a barrier.sync of both WGs (no arrive anywhere).
 *   mode 2 "raw": only the WG0 -> WG1 hand-off of mode 0 (write, arrive 1 / sync 1, read), then a full
 *     barrier.sync 5 of both WGs before the next round.
 *   mode 3 "war": WG1 reads m[r], arrive 2; WG0 sync 2, writes m[r]; then barrier.sync 5 of both.
 *   mode 4 "mbarrier": mode 0 with each hand-off an mbarrier (128 arrivals of the posting WG, the other
 *     WG waits for phase i & 1): schedule 4 of the forward.
 * Every read is checked against the value the protocol promises; the mismatch count is printed (the
 * hardware's answer: 0 when the ordering holds). Racecheck's answer is its hazard summary.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define ITERS 64

__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ void mb_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t *b, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"((unsigned)__cvta_generic_to_shared(b)), "r"(parity) : "memory");
  } while (!done);
}

__global__ void __launch_bounds__(256, 1) probe_kernel(int mode, unsigned *bad) {
  __shared__ float m[64];
  __shared__ uint64_t mb[4];
  if (threadIdx.x < 4)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" ::"r"((unsigned)__cvta_generic_to_shared(&mb[threadIdx.x])) : "memory");
  __syncthreads();
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, lane = t & 31, warp = t >> 5;
  const int r = 16 * warp + (lane >> 2); /* rows r and r + 8 as the kernel's accumulator fragment */
  const bool writer = (lane & 3) == 0;
  unsigned nbad = 0;
  for (int i = 0; i < ITERS; ++i) {
    const float v0 = (float)(blockIdx.x * 1000 + 2 * i), v1 = v0 + 1.f;
    if (mode == 0 || mode == 1) {
      if (wg == 0) {
        if (writer) { m[r] = v0; m[r + 8] = v0; }
        if (mode == 0) bar_arrive(1, 256); else bar_sync(1, 256);
        bar_sync(2, 256);
        nbad += (m[r] != v1) + (m[r + 8] != v1);
        if (mode == 0) bar_arrive(3, 256); else bar_sync(3, 256);
        bar_sync(4, 256);
      } else {
        bar_sync(1, 256);
        nbad += (m[r] != v0) + (m[r + 8] != v0);
        __syncwarp();
        if (writer) { m[r] = v1; m[r + 8] = v1; }
        if (mode == 0) bar_arrive(2, 256); else bar_sync(2, 256);
        bar_sync(3, 256);
        if (mode == 0) bar_arrive(4, 256); else bar_sync(4, 256);
      }
    } else if (mode == 4) {
      const unsigned par = (unsigned)i & 1;
      if (wg == 0) {
        if (writer) { m[r] = v0; m[r + 8] = v0; }
        mb_arrive(&mb[0]);
        mb_wait(&mb[1], par);
        nbad += (m[r] != v1) + (m[r + 8] != v1);
        mb_arrive(&mb[2]);
        mb_wait(&mb[3], par);
      } else {
        mb_wait(&mb[0], par);
        nbad += (m[r] != v0) + (m[r + 8] != v0);
        __syncwarp();
        if (writer) { m[r] = v1; m[r + 8] = v1; }
        mb_arrive(&mb[1]);
        mb_wait(&mb[2], par);
        mb_arrive(&mb[3]);
      }
    } else if (mode == 2) {
      if (wg == 0) {
        if (writer) { m[r] = v0; m[r + 8] = v0; }
        bar_arrive(1, 256);
      } else {
        bar_sync(1, 256);
        nbad += (m[r] != v0) + (m[r + 8] != v0);
      }
      bar_sync(5, 256);
    } else {
      if (wg == 1) {
        if (i > 0) nbad += (m[r] != v0 - 2.f) + (m[r + 8] != v0 - 2.f);
        bar_arrive(2, 256);
      } else {
        bar_sync(2, 256);
        if (writer) { m[r] = v0; m[r + 8] = v0; }
      }
      bar_sync(5, 256);
    }
  }
  if (nbad) atomicAdd(bad, nbad);
}

int main(int argc, char **argv) {
  static const char *names[] = {"arrive (schedule 3)", "sync", "raw via arrive", "war via arrive", "mbarrier (schedule 4)"};
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  if (mode < 0 || mode > 4) {
    fprintf(stderr, "usage: barrier_probe MODE (0 arrive, 1 sync, 2 raw, 3 war, 4 mbarrier)\n");
    return 2;
  }
  unsigned *bad, h = 0;
  if (cudaMalloc(&bad, sizeof(unsigned)) != cudaSuccess) return 1;
  cudaMemset(bad, 0, sizeof(unsigned));
  probe_kernel<<<264, 256>>>(mode, bad);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(&h, bad, sizeof(unsigned), cudaMemcpyDeviceToHost);
  printf("mode %d (%s): %s, %u wrong reads of %d\n", mode, names[mode], cudaGetErrorString(e), h,
         264 * 256 * 2 * ITERS);
  cudaFree(bad);
  return e != cudaSuccess || h != 0;
}
