/*
 * fwd_portable.cu - sparse MLA attention forward, the portable kernel (dsa_fwd_launch_portable,
 * cuda/attn_fwd/fwd_launch.cuh).
 *
 * What it computes (dsa.h dsa_attn_fwd_params, docs/contract.md section 9.2): for every token t and head h,
 * over the valid top-k slots j (j < clamp(topk_length[t], 0, K) and 0 <= idx < T_kv; duplicates
 * count twice), s_j = scale * q[t,h,:D] . kv[idx_j,:D], lse = ln sum exp(s_j), max_logits =
 * max s_j, out = sum exp(s_j - lse) kv[idx_j,:512] / (1 + exp(sink[h] - lse)). Rows with no valid
 * slot get out = 0, lse = +inf, max_logits = -inf.
 *
 * Why it exists: it runs every configuration the API accepts (H 1..128, D 512 or 576, any K, any
 * strides and any 2-byte alignment) with CUDA cores only, so it is the fallback of the sm_90a
 * tensor-core kernel and the second, independent GPU implementation the tests hold against the
 * CPU reference. fp32 products and accumulation throughout; out rounded once (nearest even).
 *
 * How the work is laid out:
 *  - One CTA per (token, group of up to 16 heads); blockIdx.x = token * groups + group, so the
 *    CTAs of one token run side by side and find its kv rows in L2 (never T in gridDim.y/z).
 *  - The CTA compacts the token's valid slots (stable, ballot + per-chunk counts) into shared
 *    memory once, then walks them in tiles of 32 kv rows gathered with 16-byte cp.async into a
 *    double buffer. Every gathered row is used by all heads of the CTA: that is why heads are
 *    grouped (up to 8 warps x 2 heads).
 *  - Each warp owns HPW heads. Lane l owns the bf16 pairs at words l + 32w of a row (dims
 *    2l + 64w, +1), so a warp reading one row touches 32 consecutive words (no bank conflicts)
 *    and q lives in registers (D/32 floats per head per lane). The 32 per-row partial dot
 *    products of a tile are summed across lanes by a transpose-reduce (31 shuffles) that leaves
 *    lane r holding the logit of tile row r; the online softmax (running max, running sum) then
 *    needs one warp max per tile, and the P.V update broadcasts p_r with one shuffle per row.
 *  - out stays in fp32 registers (512 dims / 32 lanes = 16 per lane per head) until the end.
 */
#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "internal.h"
#include "attn_fwd/fwd_launch.cuh"

/* kv rows per tile: one per lane, so the transpose-reduce ends with lane r owning row r. */
#define FWD_TILE 32
/* Up to 8 warps x 2 heads: 16 heads share each gathered row, 256 threads keep the gather fed. */
#define FWD_MAX_WARPS 8
#define FWD_MAX_HPW 2
/* Per-chunk (32 slots) valid counts used by the compaction: K <= 4096 -> 128 chunks. */
#define FWD_MAX_CHUNKS (DSA_MAX_ATTN_TOPK / 32)
#define FWD_LOG2E 1.4426950408889634f

typedef struct fwd_args {
  dsa_attn_fwd_params p; /* validated, strides resolved */
  int64_t token_begin;   /* first token of this launch */
  int groups;            /* CTAs per token */
  int heads_per_cta;     /* heads of group g: [g * heads_per_cta, min(H, (g + 1) * heads_per_cta)) */
  int kv_vec;            /* kv 16-B aligned with a row stride multiple of 8: 16-B cp.async gathers */
  int out_vec;           /* out 4-B aligned with even strides: 32-bit stores */
} fwd_args;

static __device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
static __device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xFFFF0000u); }
static __device__ __forceinline__ float bf16_to_f32(uint16_t x) {
  return __uint_as_float((uint32_t)x << 16);
}
static __device__ __forceinline__ uint16_t f32_to_bf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x)); /* round to nearest even */
}

static __device__ __forceinline__ void cp_async16(void *smem_dst, const void *gsrc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gsrc) : "memory");
#else
  *(uint4 *)smem_dst = *(const uint4 *)gsrc;
#endif
}
static __device__ __forceinline__ void cp_async_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
static __device__ __forceinline__ void cp_async_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
/* Butterfly sum: every lane ends with the same bits (each step adds the same two values). */
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
static __device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

/* One step of the transpose-reduce: lanes that differ in bit O swap halves, so each keeps O
 * partial sums (of the rows whose bit O matches its own) where it had 2 * O. */
template <int O>
static __device__ __forceinline__ void xreduce_step(float *v, int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = upper ? v[i] : v[i + O];
    const float keep = upper ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
  }
}

/* Gathers tile rows [base, base + 32) of the compacted list into dst ([32][D] bf16). Rows at or
 * beyond n are not loaded: the compute loops never read them. */
template <int D>
static __device__ __forceinline__ void load_tile(uint16_t *dst, const int32_t *rows, int base,
                                                 int n, const uint16_t *kv, int64_t kv_stride,
                                                 int vec) {
  const int CH = D / 8; /* 16-byte chunks per row */
  const int nr = min(FWD_TILE, n - base);
  if (vec) {
    for (int e = threadIdx.x; e < nr * CH; e += blockDim.x) {
      const int r = e / CH, c = e - r * CH;
      cp_async16(dst + r * D + c * 8, kv + (int64_t)rows[base + r] * kv_stride + c * 8);
    }
  } else {
    /* Misaligned kv: plain 2-byte loads, written to shared memory as 16-byte vectors. */
    for (int e = threadIdx.x; e < nr * CH; e += blockDim.x) {
      const int r = e / CH, c = e - r * CH;
      const uint16_t *src = kv + (int64_t)rows[base + r] * kv_stride + c * 8;
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = (uint32_t)src[2 * k] | ((uint32_t)src[2 * k + 1] << 16);
      *(uint4 *)(dst + r * D + c * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  cp_async_commit();
}

template <int D, int HPW>
static __global__ void __launch_bounds__(FWD_MAX_WARPS * 32)
    attn_fwd_simple_kernel(const fwd_args a) {
  const int DW = D / 64; /* 32-bit words of a row per lane: 9 (D = 576) or 8 (D = 512) */
  const int VW = DSA_VALUE_DIM / 64;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t *tiles = (uint16_t *)smem;                                          /* [2][32][D] */
  int32_t *rows = (int32_t *)(smem + 2 * FWD_TILE * D * sizeof(uint16_t));     /* [K] */
  int32_t *chunk_count = rows + a.p.topk;                                      /* [K / 32] */

  const dsa_attn_fwd_params &p = a.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t t = a.token_begin + blockIdx.x / a.groups;
  const int group = blockIdx.x % a.groups;
  const int H = p.num_heads, K = p.topk;

  /* ---- compact the valid slots of row t into rows[0, n), keeping slot order ---- */
  int len = K;
  if (p.topk_length != NULL) {
    const int l = p.topk_length[t];
    len = l < 0 ? 0 : (l > K ? K : l);
  }
  const int32_t *idx_row = p.indices + t * p.indices_stride;
  const int nchunks = (len + 31) >> 5;
  for (int c = warp; c < nchunks; c += nwarps) {
    const int j = c * 32 + lane;
    int v = 0;
    if (j < len) {
      const int32_t i = idx_row[j];
      v = i >= 0 && (int64_t)i < p.num_kv;
    }
    const unsigned b = __ballot_sync(0xFFFFFFFFu, v);
    if (lane == 0) chunk_count[c] = __popc(b);
  }
  __syncthreads();
  for (int c = warp; c < nchunks; c += nwarps) {
    int before = 0; /* valid slots of the chunks before c */
    for (int q = lane; q < c; q += 32) before += chunk_count[q];
    before = warp_sum_int(before);
    const int j = c * 32 + lane;
    int32_t i = -1;
    int v = 0;
    if (j < len) {
      i = idx_row[j];
      v = i >= 0 && (int64_t)i < p.num_kv;
    }
    const unsigned b = __ballot_sync(0xFFFFFFFFu, v);
    if (v) rows[before + __popc(b & ((1u << lane) - 1u))] = i;
  }
  int n = 0;
  for (int q = lane; q < nchunks; q += 32) n += chunk_count[q];
  n = warp_sum_int(n);
  __syncthreads();

  /* ---- this warp's heads ---- */
  const int head_end = min(H, (group + 1) * a.heads_per_cta);
  const int head0 = group * a.heads_per_cta + warp * HPW;

  if (n == 0) { /* no valid slot: out = 0, lse = +inf, max_logits = -inf */
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      const int h = head0 + hh;
      if (h >= head_end) continue;
      uint16_t *o = p.out + t * p.out_stride_token + (int64_t)h * p.out_stride_head;
      for (int d = lane; d < DSA_VALUE_DIM; d += 32) o[d] = 0;
      if (lane == 0) {
        p.lse[t * H + h] = INFINITY;
        if (p.max_logits != NULL) p.max_logits[t * H + h] = -INFINITY;
      }
    }
    return;
  }

  float q[HPW][2 * DW];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    const int h = head0 + hh;
    const uint16_t *qp = p.q + t * p.q_stride_token + (int64_t)(h < head_end ? h : 0) * p.q_stride_head;
#pragma unroll
    for (int w = 0; w < DW; ++w) {
      const int d = 2 * lane + 64 * w;
      q[hh][2 * w] = h < head_end ? bf16_to_f32(qp[d]) : 0.f;
      q[hh][2 * w + 1] = h < head_end ? bf16_to_f32(qp[d + 1]) : 0.f;
    }
  }

  float m[HPW], l[HPW], acc[HPW][2 * VW];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.f;
#pragma unroll
    for (int k = 0; k < 2 * VW; ++k) acc[hh][k] = 0.f;
  }

  const int ntiles = (n + FWD_TILE - 1) / FWD_TILE;
  load_tile<D>(tiles, rows, 0, n, p.kv, p.kv_stride, a.kv_vec);
  for (int it = 0; it < ntiles; ++it) {
    if (it + 1 < ntiles) {
      load_tile<D>(tiles + ((it + 1) & 1) * FWD_TILE * D, rows, (it + 1) * FWD_TILE, n, p.kv,
                   p.kv_stride, a.kv_vec);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t *tile = tiles + (it & 1) * FWD_TILE * D;
    const int base = it * FWD_TILE;
    const int nr = min(FWD_TILE, n - base);

    /* logits: per-lane partial dot products of the 32 rows, then the transpose-reduce */
    float part[HPW][FWD_TILE];
#pragma unroll
    for (int r = 0; r < FWD_TILE; ++r) {
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) part[hh][r] = 0.f;
      if (r < nr) {
        const uint32_t *row = (const uint32_t *)(tile + r * D);
#pragma unroll
        for (int w = 0; w < DW; ++w) {
          const uint32_t x = row[lane + 32 * w];
          const float lo = bf16_lo(x), hi = bf16_hi(x);
#pragma unroll
          for (int hh = 0; hh < HPW; ++hh) {
            part[hh][r] = fmaf(q[hh][2 * w], lo, part[hh][r]);
            part[hh][r] = fmaf(q[hh][2 * w + 1], hi, part[hh][r]);
          }
        }
      }
    }
    /* After the step with offset o, part[hh][i] (i < o) is the partial sum of tile row
     * i + (lane's bits >= o); after o = 1 lane r holds the full dot product of row r. */
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      xreduce_step<16>(part[hh], lane);
      xreduce_step<8>(part[hh], lane);
      xreduce_step<4>(part[hh], lane);
      xreduce_step<2>(part[hh], lane);
      xreduce_step<1>(part[hh], lane);
    }

    /* online softmax: lane r owns row r of the tile */
    float pr[HPW];
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      const float s = lane < nr ? part[hh][0] * p.softmax_scale : -INFINITY;
      const float mnew = fmaxf(m[hh], warp_max(s)); /* finite: row 0 of every tile is valid */
      const float alpha = exp2f((m[hh] - mnew) * FWD_LOG2E);
      pr[hh] = exp2f((s - mnew) * FWD_LOG2E);
      l[hh] = l[hh] * alpha + pr[hh];
#pragma unroll
      for (int k = 0; k < 2 * VW; ++k) acc[hh][k] *= alpha;
      m[hh] = mnew;
    }

    /* out += p . V over the tile's valid rows */
#pragma unroll
    for (int r = 0; r < FWD_TILE; ++r) {
      if (r < nr) {
        float pb[HPW];
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) pb[hh] = __shfl_sync(0xFFFFFFFFu, pr[hh], r);
        const uint32_t *row = (const uint32_t *)(tile + r * D);
#pragma unroll
        for (int w = 0; w < VW; ++w) {
          const uint32_t x = row[lane + 32 * w];
          const float lo = bf16_lo(x), hi = bf16_hi(x);
#pragma unroll
          for (int hh = 0; hh < HPW; ++hh) {
            acc[hh][2 * w] = fmaf(pb[hh], lo, acc[hh][2 * w]);
            acc[hh][2 * w + 1] = fmaf(pb[hh], hi, acc[hh][2 * w + 1]);
          }
        }
      }
    }
    __syncthreads(); /* the next iteration refills this buffer */
  }

  /* ---- epilogue: lse, sink factor, bf16 out ---- */
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    const int h = head0 + hh;
    const float lsum = warp_sum(l[hh]); /* every lane gets the same bits */
    if (h >= head_end) continue;
    const float lse = m[hh] + logf(lsum);
    float factor = 1.f;
    if (p.sink != NULL) factor = 1.f / (1.f + expf(p.sink[h] - lse)); /* +inf -> 0, -inf -> 1 */
    const float inv = factor / lsum;
    uint16_t *o = p.out + t * p.out_stride_token + (int64_t)h * p.out_stride_head;
#pragma unroll
    for (int w = 0; w < VW; ++w) {
      const int d = 2 * lane + 64 * w;
      const uint16_t b0 = f32_to_bf16(acc[hh][2 * w] * inv);
      const uint16_t b1 = f32_to_bf16(acc[hh][2 * w + 1] * inv);
      if (a.out_vec) {
        *(uint32_t *)(o + d) = (uint32_t)b0 | ((uint32_t)b1 << 16);
      } else {
        o[d] = b0;
        o[d + 1] = b1;
      }
    }
    if (lane == 0) {
      p.lse[t * H + h] = lse;
      if (p.max_logits != NULL) p.max_logits[t * H + h] = m[hh];
    }
  }
}

/* Dynamic shared memory of a launch: the kv double buffer, the compacted list, chunk counts. */
static size_t fwd_smem_bytes(int D, int K) {
  return (size_t)2 * FWD_TILE * D * sizeof(uint16_t) + (size_t)K * sizeof(int32_t) +
         FWD_MAX_CHUNKS * sizeof(int32_t);
}

typedef void (*fwd_kernel_fn)(const fwd_args);

extern "C" dsa_status dsa_fwd_launch_portable(const dsa_context *ctx, const dsa_attn_fwd_params *p,
                                              cudaStream_t stream) {
  static int prepared[2][2][DSA_TRACKED_DEVICES]; /* [D == 576][HPW == 2][device]: smem limit set */
  const int H = p->num_heads, D = p->head_dim;
  if (D != 512 && D != 576)
    return dsa_fail(DSA_ERROR_UNSUPPORTED, "dsa_sparse_attn_fwd: head_dim = %d is not 512 or 576", D);
  if (p->num_tokens <= 0) return DSA_SUCCESS;
  const size_t smem = fwd_smem_bytes(D, p->topk);
  if (ctx != NULL && ctx->max_smem_optin > 0 && smem > (size_t)ctx->max_smem_optin)
    return dsa_fail(DSA_ERROR_UNSUPPORTED,
                    "dsa_sparse_attn_fwd: the portable kernel needs %zu bytes of shared memory, "
                    "the device allows %d", smem, ctx->max_smem_optin);

  fwd_args a;
  a.p = *p;
  a.groups = (H + FWD_MAX_WARPS * FWD_MAX_HPW - 1) / (FWD_MAX_WARPS * FWD_MAX_HPW);
  a.heads_per_cta = (H + a.groups - 1) / a.groups;
  const int hpw = a.heads_per_cta == 1 ? 1 : 2;
  const int warps = (a.heads_per_cta + hpw - 1) / hpw;
  a.kv_vec = ((uintptr_t)p->kv % 16 == 0) && (p->kv_stride % 8 == 0);
  a.out_vec = ((uintptr_t)p->out % 4 == 0) && (p->out_stride_token % 2 == 0) &&
              (p->out_stride_head % 2 == 0);

  fwd_kernel_fn fn;
  if (D == 576)
    fn = hpw == 2 ? attn_fwd_simple_kernel<576, 2> : attn_fwd_simple_kernel<576, 1>;
  else
    fn = hpw == 2 ? attn_fwd_simple_kernel<512, 2> : attn_fwd_simple_kernel<512, 1>;
  DSA_TRY(dsa_kernel_smem_once((const void *)fn, (int)fwd_smem_bytes(D, DSA_MAX_ATTN_TOPK), 0,
                               ctx != NULL ? ctx->device : -1, prepared[D == 576][hpw == 2],
                               "dsa_sparse_attn_fwd: cudaFuncSetAttribute"));

  /* gridDim.x holds token * groups; split huge batches so it stays below 2^31. */
  const int64_t max_tokens = (int64_t)0x7FFFFFFF / a.groups;
  for (int64_t t0 = 0; t0 < p->num_tokens; t0 += max_tokens) {
    const int64_t nt = p->num_tokens - t0 < max_tokens ? p->num_tokens - t0 : max_tokens;
    a.token_begin = t0;
    fn<<<(unsigned)(nt * a.groups), warps * 32, smem, stream>>>(a);
    DSA_TRY(dsa_cuda_status(cudaGetLastError(), "dsa_sparse_attn_fwd: portable kernel launch"));
  }
  return DSA_SUCCESS;
}
