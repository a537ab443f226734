/*
 * sm90_common.cuh - inline-PTX wrappers for the Hopper (sm_90a) instructions the tensor-core kernels
 * share: shared-memory matrix descriptors, wgmma (SS and RS), wgmma fence/commit/wait, mbarrier,
 * cp.async into 128B-swizzled tiles, proxy fences, setmaxnreg, and the KV gather both forward kernels
 * use. Every field and rule is taken from docs/hopper.md (sections cited as "notes 1".."notes 8").
 *
 * Only visible to the sm_90a device pass (and the host pass, which never calls them): the compute_90
 * PTX pass rejects wgmma / setmaxnreg, so kernels guard their bodies with
 * #if defined(__CUDA_ARCH_FEAT_SM90_ALL).
 */
#ifndef DSA_SM90_COMMON_CUH
#define DSA_SM90_COMMON_CUH

#include <math.h> /* INFINITY */
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)

/* Shared-window address of a generic pointer to shared memory. */
__device__ __forceinline__ uint32_t sm90_smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- matrix descriptors (notes 1) ---------------------------------------------------------------
 * bits 13-0 start >> 4, 29-16 LBO >> 4, 45-32 SBO >> 4, 51-49 base offset (0: tiles 1024-B aligned),
 * 63-62 swizzle (1 = 128B). */
__device__ __forceinline__ uint64_t sm90_desc_enc(uint32_t x) { return (uint64_t)((x & 0x3FFFF) >> 4); }
/* The SW128 descriptor of the tile at byte offset `off` from a 16-B aligned shared-memory base whose
 * address >> 4 is base4. Shared-window addresses are below 256 KB, so the 14-bit start field never
 * carries into LBO and no mask is needed: the start is one add. With off, lbo and sbo compile-time
 * constants every descriptor of a tile is an add on one register (building it from the tile's
 * address instead costs a mask, a shift and an or per operand on the uniform datapath before each
 * wgmma), and a kernel short of registers keeps a single base live. Tiles start on 1024-B boundaries
 * (base offset 0). */
__device__ __forceinline__ uint64_t sm90_desc_at(uint32_t base4, uint32_t off, uint32_t lbo, uint32_t sbo) {
  return ((uint64_t)((uint32_t)sm90_desc_enc(sbo) | (1u << 30)) << 32) |
         (uint32_t)(base4 + (off >> 4) + ((uint32_t)sm90_desc_enc(lbo) << 16));
}
/* Byte offset of element column c (bf16) of row r inside a 64-column SW128 K-major block. Rows are 128 B
 * apart; the 16-B chunk index (c / 8) is XORed with r % 8. */
__device__ __forceinline__ uint32_t sm90_sw128_chunk_off(int r, int chunk) {
  return (uint32_t)(r * 128 + (((chunk ^ r) & 7) << 4));
}

/* ---- wgmma ordering (notes 3) -------------------------------------------------------------------- */
__device__ __forceinline__ void sm90_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void sm90_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void sm90_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps nvcc from moving ordinary uses of an accumulator / A register across the async window
 * (CUTLASS warpgroup_fence_operand). */
__device__ __forceinline__ void sm90_fence_operand(float &x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void sm90_fence_operand_u32(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }
/* Generic-proxy writes (st.shared, non-bulk cp.async) -> visible to the async proxy (wgmma, TMA). */
__device__ __forceinline__ void sm90_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- mbarrier (notes 4) -------------------------------------------------------------------------- */
__device__ __forceinline__ void sm90_mbar_init(uint64_t *bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm90_smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void sm90_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* Plain arrive: release semantics at CTA scope (orders this thread's earlier shared-memory writes). */
__device__ __forceinline__ void sm90_mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm90_smem_addr(bar)) : "memory");
}
/* Arrives when every cp.async this thread issued so far has landed; not pre-counted (.noinc), so the
 * barrier's expected count includes one arrival per calling thread. */
__device__ __forceinline__ void sm90_cp_async_mbar_arrive_noinc(uint64_t *bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(sm90_smem_addr(bar)) : "memory");
}
/* Spins until the phase with the given parity has completed (acquire). try_wait may time out: loop. */
__device__ __forceinline__ void sm90_mbar_wait(uint64_t *bar, uint32_t parity) {
  uint32_t addr = sm90_smem_addr(bar);
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

/* ---- cp.async (notes 5) -------------------------------------------------------------------------- */
/* 16-byte global -> shared copy; src_bytes = 0 zero-fills the destination (src must still be a valid
 * address: callers clamp it). */
__device__ __forceinline__ void sm90_cp_async16(uint32_t dst, const void *src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void sm90_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* ---- setmaxnreg (notes 6) ------------------------------------------------------------------------ */
template <int N>
__device__ __forceinline__ void sm90_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void sm90_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads, a multiple of 32. bar.sync is
 * barrier.sync.aligned: every participating warp must reach it at the same instruction. */
__device__ __forceinline__ void sm90_named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* The same barrier returning the OR of `pred` over the `count` threads that reach it. */
__device__ __forceinline__ bool sm90_named_bar_or(int id, int count, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 q, %1, 0;\n bar.red.or.pred p, %2, %3, q;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(r)
      : "r"((uint32_t)pred), "r"(id), "r"(count)
      : "memory");
  return r != 0;
}
/* The same barrier for warps that reach it from different code (e.g. two warpgroups running two
 * template instantiations): the non-.aligned form, which the PTX ISA allows at different
 * instructions per warp (compute-sanitizer synccheck flags the .aligned form there as "divergent
 * thread(s) in block"). */
__device__ __forceinline__ void sm90_named_bar_sync_any(int id, int count) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* The 1024-B aligned start of the dynamic shared memory (SW128 atoms; the launch adds 1 KB of slack),
 * derived by pointer arithmetic on the __shared__ array itself so that nvcc keeps the shared state
 * space: the usual integer round trip ((uintptr_t)raw + 1023) & ~1023 turns every later access into
 * a generic LD / ST (with it the forward kernels had no ld.shared at all: ncu showed generic
 * loads of the mask bytes and row maxima on the softmax path). */
__device__ __forceinline__ uint8_t *sm90_smem_align1024(uint8_t *raw) {
  return raw + ((1024u - (sm90_smem_addr(raw) & 1023u)) & 1023u);
}
/* 16 bytes to global memory: one 16-B store when the destination is 16-B aligned (vec16), else four
 * 4-B stores (rows whose strides keep only 4-B alignment). */
__device__ __forceinline__ void sm90_store_16b(void *dst, uint4 v, bool vec16) {
  if (vec16) {
    *(uint4 *)dst = v;
  } else {
    uint32_t *d4 = (uint32_t *)dst;
    d4[0] = v.x;
    d4[1] = v.y;
    d4[2] = v.z;
    d4[3] = v.w;
  }
}
/* stmatrix m8n8.x4 (sm_90): lane l gives the row address of matrix l / 8; register m = this thread's
 * pair of matrix m (docs/hopper.md section 2). */
__device__ __forceinline__ void sm90_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

/* 2^x as one MUFU.EX2 (ex2.approx.ftz): a result below 2^-126 flushes to 0, which no softmax term
 * misses; exp2f compiles to ex2.approx.f32 with the subnormal scaling around it (3 more instructions
 * per call in the SASS). For the P exponentials only: the rescale factors keep exp2f, whose 2^0 = 1
 * the lazy frames test for. */
__device__ __forceinline__ float sm90_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* Two fp32 -> one bf16x2 register, round to nearest even; lo goes to the low 16 bits. */
__device__ __forceinline__ uint32_t sm90_pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/* ---- wgmma (notes 2), operand lists written out by a small script ------------------------------- */
/* D(64xN, f32) (+)= A(64x16) * B(Nx16)^T, both from shared memory; B K-major; A K-major (TA = 0) or
 * M-major (TA = 1). scale_d = 0 overwrites D. N = 8, 16, 24, 32: the small-H forward's column
 * blocks (cuda/attn_fwd/fwd_sm90_small.cu); N = 40..64: the forward small-H kernel's
 * whole-N S^T and P V when two consumer WGs split the value dims. */
template <int N, int TA>
__device__ __forceinline__ void sm90_wgmma_ss_nN(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (N == 8)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 16)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 24)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1, %15, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 32)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 40)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %22, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}, %20, %21, p, 1, 1, %23, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 48)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, %27, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 56)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %30, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27}, %28, %29, p, 1, 1, %31, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
  if constexpr (N == 64)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA));
}

/* D(64x64, f32) (+)= A(64x16) * B(64x16)^T from shared memory; scale_d = 0 overwrites D. A K-major
 * (TA = 0) or M-major (TA = 1), B K-major (TB = 0) or N-major (TB = 1): the transpose bits. */
template <int TA, int TB>
__device__ __forceinline__ void sm90_wgmma_ss_m64n64k16(float *d, uint64_t desc_a, uint64_t desc_b,
                                                        int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
}

/* D(64x256, f32) (+)= A(64x16, registers, the accumulator-pair map) * B(16x256, smem MN-major, tB = 1). */
__device__ __forceinline__ void sm90_wgmma_rs_m64n256k16_tb1(float *d, const uint32_t *a, uint64_t desc_b,
                                                            int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* D(64x32, f32) (+)= A(64x16, smem K-major) * B(32x16, smem K-major)^T; scale_d = 0 overwrites D. */
__device__ __forceinline__ void sm90_wgmma_ss_m64n32k16(float *d, uint64_t desc_a, uint64_t desc_b,
                                                        int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* D(64x256, f32) (+)= A(64x16, smem K-major) * B from shared memory, K-major (TB = 0: [256][16]) or
 * N-major (TB = 1: [16][256]); scale_d = 0 overwrites D. */
template <int TB>
__device__ __forceinline__ void sm90_wgmma_ss_m64n256k16(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, %131;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TB));
}

/* D(64x128, f32) (+)= A(64x16) * B(16x128) from shared memory; A K-major (TA = 0) or M-major (TA = 1),
 * B K-major (TB = 0) or N-major (TB = 1); scale_d = 0 overwrites D. */
template <int TA, int TB>
__device__ __forceinline__ void sm90_wgmma_ss_m64n128k16(float *d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
}

/* D(64x128, f32) (+)= A(64x16, registers, the accumulator-pair map) * B(16x128, smem; TB = 1: N-major). */
template <int TB>
__device__ __forceinline__ void sm90_wgmma_rs_m64n128k16(float *d, const uint32_t *a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}

/* D(64x64, f32) (+)= A(64x16, registers, the accumulator-pair map) * B(64x16, smem K-major)^T (TB = 1:
 * B 16x64 MN-major). */
template <int TB = 0>
__device__ __forceinline__ void sm90_wgmma_rs_m64n64k16(float *d, const uint32_t *a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}

/* ldmatrix m8n8.x4 (b16): lane l gives the row address of matrix l / 8; register m = this thread's
 * pair of matrix m. With lanes 0..15 on rows 0..15 of a 16-column slice and lanes 16..31 on its
 * second 8 columns, the four registers are the warp's wgmma / mma A fragment of that k16 slice. */
__device__ __forceinline__ void sm90_ldmatrix_x4(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/* ---- fp32 row reductions into a permuted accumulator ("layout 1", src/kernels.h dsa_bwd_dkv_slot:
 * the backward's dKV and the indexer backward's d_index_k), 128-B row segments per warp instruction --- */
/* One red.global.add.v4.f32 of four fp32 where the row is valid (row >= 0), with the L2 policy `pol`
 * (evict_last: the accumulator's lines stay while gathers and other operands stream past them). (A predicate set inside the asm instead of
 * the branch costs D = 576 12-28 bytes of spills at 255 registers.) */
template <bool kAllValid = false>
__device__ __forceinline__ void sm90_red4_hint(float *dst, float a, float b, float c, float d, int32_t row, uint64_t pol) {
  if (!kAllValid && row < 0) return;
  asm volatile("red.relaxed.gpu.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d), "l"(pol)
               : "memory");
}

/* One st.global.v4.f32 of four fp32 with the L2 policy `pol` (the deterministic mode's per-slot rows:
 * evict_first, they stream to HBM and are read back only after the chunk). */
__device__ __forceinline__ void sm90_st4_hint(float *dst, float a, float b, float c, float d, uint64_t pol) {
  asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d), "l"(pol)
               : "memory");
}

/* The reductions of one completed 64-column block b (an m64n64 accumulator, keys on M; row stride kD)
 * into the permuted accumulator: the memory order of bwd_sm90_dkv_red (cuda/attn_bwd/bwd_sm90_shared.cuh: per
 * 32-column pair G the even quad writes group 2G, the odd quad group 2G + 1, each warp instruction 4 rows
 * x 128 contiguous bytes), with fewer instructions: per value one select picks what the peer (lane ^ 4)
 * needs, one shfl.xor 4 moves it, and one select each assembles the even quad's row (`lo` of the even
 * lane, the received `hi` on the odd one) and the odd quad's row (the received `lo`, the own `hi`).
 * rowp: this lane's base in the accumulator (+ 16 odd + 4 (lane % 4) columns); ka / kb [hr]: the even /
 * the odd quad's kv row of key row r0 + 8 hr (-1: invalid, predicated off; kAllValid: every row is a
 * valid kv row, no test and no branch per reduction). kStore: plain stores instead of reductions, in
 * the same order (rows that only this thread writes; kAllValid). */
template <int kD, bool kAllValid = false, bool kStore = false>
__device__ __forceinline__ void sm90_red_block_lay1(float *rowp, const float *acc, int b, int odd, const int32_t ka[2],
                                           const int32_t kb[2], uint64_t pol) {
  static_assert(!kStore || kAllValid, "stores go to every row");
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float *const pa = rowp + (int64_t)(kAllValid ? ka[hr] : max(ka[hr], 0)) * kD + 64 * b;
    float *const pb = rowp + (int64_t)(kAllValid ? kb[hr] : max(kb[hr], 0)) * kD + 64 * b;
#pragma unroll
    for (int G = 0; G < 2; ++G) {
      float va[4], vb[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ri = (e & 1) + 4 * (e >> 1) + 2 * hr; /* {0, 1, 4, 5} (+ 2 for row r0 + 8) */
        const float lo = acc[16 * G + ri], hi = acc[16 * G + 8 + ri]; /* groups 2G, 2G + 1 */
        const float r = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 4);
        va[e] = odd ? r : lo;
        vb[e] = odd ? hi : r;
      }
      if constexpr (kStore) {
        sm90_st4_hint(pa + 32 * G, va[0], va[1], va[2], va[3], pol);
        sm90_st4_hint(pb + 32 * G, vb[0], vb[1], vb[2], vb[3], pol);
      } else {
        sm90_red4_hint<kAllValid>(pa + 32 * G, va[0], va[1], va[2], va[3], ka[hr], pol);
        sm90_red4_hint<kAllValid>(pb + 32 * G, vb[0], vb[1], vb[2], vb[3], kb[hr], pol);
      }
    }
  }
}

/* The accumulator rows kr0, kr1 of this thread's two key rows (r0, r0 + 8), arranged for
 * sm90_red_block_lay1: ka = the even quad's rows, kb = the odd quad's (lane ^ 4 pairs the quads). */
__device__ __forceinline__ void sm90_lay1_pair_rows(int32_t kr0, int32_t kr1, int odd, int32_t ka[2], int32_t kb[2]) {
  const int32_t kp0 = __shfl_xor_sync(0xffffffffu, kr0, 4), kp1 = __shfl_xor_sync(0xffffffffu, kr1, 4);
  ka[0] = odd ? kp0 : kr0;
  ka[1] = odd ? kp1 : kr1;
  kb[0] = odd ? kr0 : kp0;
  kb[1] = odd ? kr1 : kp1;
}
/* The same for the rows idx[r0], idx[r0 + 8] of a tile's index list. */
__device__ __forceinline__ void sm90_lay1_key_rows(const int32_t *idx, int r0, int odd, int32_t ka[2], int32_t kb[2]) {
  sm90_lay1_pair_rows(idx[r0], idx[r0 + 8], odd, ka, kb);
}

/* ---- the KV gather of one 64-row tile (notes 5), shared by the forward kernels ------------------- *
 * A producer warpgroup of 128 threads: thread (g = t / 8, j = t % 8) owns rows g, g + 16, g + 32,
 * g + 48 of the tile and 16-B chunk j of each of its NB 64-column SW128 blocks (rows 16 apart keep the
 * XOR constant, and each 8-thread phase fills one 128-B piece: no bank conflicts). */
/* Reads the tile's four indices of this thread (-1 past the row's valid prefix klen). Issued before
 * the producer waits for a free stage, so the latency overlaps the consumers' work. */
__device__ __forceinline__ void sm90_gather_read_indices(const int32_t *irow, int tile, int g, int klen,
                                                         int32_t idxs[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int slot = tile * 64 + g + 16 * i;
    idxs[i] = slot < klen ? __ldg(irow + slot) : -1;
  }
}
/* The gathers' source of one row for thread chunk j: kv row idx when it is a valid slot (0 <= idx <
 * num_kv: *ok), else `harmless` (a readable address: kv may be NULL when num_kv = 0), copied with 0
 * bytes (zero fill). */
__device__ __forceinline__ const uint16_t *sm90_gather_src(int32_t idx, int j, const uint16_t *kv, int64_t kv_stride,
                                                           int64_t num_kv, const uint16_t *harmless, bool *ok) {
  *ok = idx >= 0 && (int64_t)idx < num_kv;
  return *ok ? kv + (int64_t)idx * kv_stride + j * 8 : harmless + j * 8;
}
/* The gather of one 64-row tile with its kv indices: thread (g, j) as above issues 16-B chunk j of
 * each of the NB 64-column blocks of rows g, g + 16, g + 32, g + 48 into the SW128 tile at skv (4 NB
 * cp.async); an invalid slot (idx < 0 or >= num_kv) copies 0 bytes (zero fill) from `harmless`, a
 * readable address; thread j == 0 of each row writes the row's kv index (or -1) to tidx (the
 * backward's and the slot target's tiles, whose consumers read the index itself). kSpread: an invalid
 * slot's entry is ~f instead of -1, f = spread_base + (spread + r) % spread_mod (spread_mod >= 1, f <=
 * INT32_MAX): still negative for every validity test, and a row to send the slot's zero contributions
 * to. */
template <int NB, bool kSpread = false>
__device__ __forceinline__ void sm90_gather_tile_idx(uint32_t skv, int32_t *tidx, const int32_t idxs[4], int g, int j,
                                                     const uint16_t *kv, int64_t kv_stride, int64_t num_kv,
                                                     const uint16_t *harmless, uint32_t spread = 0,
                                                     uint32_t spread_mod = 1, uint32_t spread_base = 0) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = g + 16 * i;
    bool ok;
    const uint16_t *src = sm90_gather_src(idxs[i], j, kv, kv_stride, num_kv, harmless, &ok);
#pragma unroll
    for (int b = 0; b < NB; ++b) sm90_cp_async16(skv + b * 8192 + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u);
    if (j == 0) tidx[r] = ok ? idxs[i] : kSpread ? ~(int32_t)(spread_base + (spread + (uint32_t)r) % spread_mod) : -1;
  }
}

/* Column sums of an m64n64 accumulator over a warp's 16 rows. v[2 cc + e] holds this thread's two
 * rows already added for column 8 cc + 2 (lane % 4) + e (the accumulator map, docs/hopper.md
 * section 2); a reduce-scatter over the 8 lanes that hold the same columns (lane bits 4, 3, 2: 8 + 4 +
 * 2 shuffles) leaves lane l with the sums of columns 2l and 2l + 1 in z[0], z[1]. Fixed order:
 * bitwise reproducible. */
__device__ __forceinline__ void sm90_warp_colsum64(const float v[16], int lane, float z[2]) {
  float u[8], x[4];
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
  for (int k = 0; k < 8; ++k) u[k] = (b4 ? v[k + 8] : v[k]) + __shfl_xor_sync(0xffffffffu, b4 ? v[k] : v[k + 8], 16);
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = (b3 ? u[k + 4] : u[k]) + __shfl_xor_sync(0xffffffffu, b3 ? u[k] : u[k + 4], 8);
#pragma unroll
  for (int k = 0; k < 2; ++k) z[k] = (b2 ? x[k + 2] : x[k]) + __shfl_xor_sync(0xffffffffu, b2 ? x[k] : x[k + 2], 4);
}

/* Masks a completed m64nSNk16 S accumulator into log2-domain logits: x[i] = sacc[i] * scale_log2
 * where its key slot is valid, -inf where not. Register i holds column 8 (i >> 2) + 2 (lane % 4) +
 * (i & 1) (docs/hopper.md section 2); the pair (i, i + 1), i even, covers two adjacent columns: one 2-byte read
 * of the tile's validity bytes vs (one byte per key, 1 = valid). */
template <int SN>
__device__ __forceinline__ void sm90_mask_logits(const float *sacc, const uint8_t *vs, float scale_log2, int lane,
                                                 float *x) {
#pragma unroll
  for (int cc = 0; cc < SN / 8; ++cc) {
    const uint32_t pair = *(const uint16_t *)(vs + 8 * cc + 2 * (lane & 3));
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * cc + 2 * hr + e;
        x[i] = ((pair >> (8 * e)) & 0xff) ? sacc[i] * scale_log2 : -INFINITY;
      }
  }
}

/* The lazily moved softmax frame of the forward kernels (FlashAttention-4's conditional rescale): P =
 * exp2(logit - frame) with a per-row (per-head) frame that moves only when a logit exceeds it by more
 * than this many log2 units, so P <= 2^8 otherwise and the O / sum rescale (alpha = 1) is skipped.
 * lse = (frame + log2 l) ln 2 is exact in any frame; max_logits needs the true running max, kept
 * apart. The first finite logit always moves a frame of -inf. */
constexpr float kSm90RescaleSlack = 8.f;
/* Whether a logit (or a tile's max) moves the frame: it exceeds it by more than the slack (always for a
 * finite logit against a frame of -inf; never for NaN). */
__device__ __forceinline__ bool sm90_frame_moves(float frame, float logit) { return logit > frame + kSm90RescaleSlack; }
/* Whether any of this thread's N rescale factors, in any lane of the warp, differs from 1: the
 * warp-uniform test before an O rescale (a factor of exactly 1 changes nothing, so skipping is exact). */
template <int N>
__device__ __forceinline__ bool sm90_warp_any_factor(const float *f) {
  bool any = false;
#pragma unroll
  for (int i = 0; i < N; ++i) any |= f[i] != 1.f;
  return __any_sync(0xffffffffu, any);
}

/* One token's q rows of heads [h0, h0 + 64) into the SW128 tile at sq (NB 64-column blocks of 8192 B),
 * by thread (g, j) of a 128-thread producer WG (g = t / 8, j = t % 8): 16-B chunk j of every block of
 * rows g, g + 16, g + 32, g + 48. Rows 16 apart share r % 8, so 8 consecutive threads fill one 128-B
 * swizzled row piece: conflict free. Heads h >= h_end (past the range) are zero rows (src-size 0,
 * read from head h0), never written out. */
template <int NB>
__device__ __forceinline__ void sm90_load_q_heads64(uint32_t sq, const uint16_t *q, int64_t tok, int64_t q_stride_token,
                                                    int64_t q_stride_head, int h0, int h_end, int g, int j) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = g + 16 * i, h = h0 + r;
    const bool ok = h < h_end;
    const uint16_t *src = q + tok * q_stride_token + (int64_t)(ok ? h : h0) * q_stride_head + j * 8;
#pragma unroll
    for (int b = 0; b < NB; ++b) sm90_cp_async16(sq + b * 8192 + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u);
  }
}

/* An L2 cache policy for cp.async's .L2::cache_hint (hopper: createpolicy): evict_last keeps the
 * gathered KV rows in L2 ahead of the streamed operands (indices, q, out); evict_normal is the
 * default behaviour. */
__device__ __forceinline__ uint64_t sm90_l2_policy(bool evict_last) {
  uint64_t pol;
  if (evict_last)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
/* evict_first: data written once and read back much later (it should not displace what is reused) */
__device__ __forceinline__ uint64_t sm90_l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void sm90_cp_async16_hint(uint32_t dst, const void *src, uint32_t src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(pol)
               : "memory");
}

/* Issues the cp.asyncs of this thread's rows, all NB 64-column blocks, into the SW128 tile at skv
 * (block b at + b * 8192) and writes the validity byte of each row (thread j == 0). An invalid slot
 * (idx < 0 or >= num_kv) copies 0 bytes (zero fill) from `harmless`, a readable address, since kv may
 * be NULL when num_kv = 0. */
template <int NB>
__device__ __forceinline__ void sm90_gather_kv_rows(uint32_t skv, uint8_t *valid, const int32_t idxs[4],
                                                    int g, int j, const uint16_t *kv, int64_t kv_stride,
                                                    int64_t num_kv, const uint16_t *harmless, uint64_t pol) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = g + 16 * i;
    bool ok;
    const uint16_t *src = sm90_gather_src(idxs[i], j, kv, kv_stride, num_kv, harmless, &ok);
#pragma unroll
    for (int b = 0; b < NB; ++b)
      sm90_cp_async16_hint(skv + b * 8192 + sm90_sw128_chunk_off(r, j), src + b * 64, ok ? 16u : 0u, pol);
    if (j == 0) valid[r] = ok ? 1 : 0;
  }
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL || !__CUDA_ARCH__ */
#endif /* DSA_SM90_COMMON_CUH */
