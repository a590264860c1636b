// Device twins of the CPU reference's canonical arithmetic (cpu/quant.h) and the reductions the
// kernels share. Included by .cu files only.
//
// Every transcendental is evaluated in double and rounded once to float, as on the CPU. Sums are
// double; a reduction spread over threads adds in a different order than the CPU's loop, which
// can change the float result only when the double sums straddle a float rounding tie.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/formats.h"

namespace dsv4::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ inline float exp_f(float x) { return float(exp(double(x))); }
__device__ inline float sqrt_f(float x) { return float(sqrt(double(x))); }
__device__ inline float rsqrt_f(float x) { return float(1.0 / sqrt(double(x))); }
__device__ inline float sigmoid_f(float x) { return float(1.0 / (1.0 + exp(-double(x)))); }
__device__ inline float silu_f(float x) { return float(double(x) / (1.0 + exp(-double(x)))); }
__device__ inline float sin_f(float x) { return float(sin(double(x))); }
__device__ inline float cos_f(float x) { return float(cos(double(x))); }
__device__ inline float softplus_f(float x) { return x > 20.0f ? x : float(log1p(exp(double(x)))); }

// RMSNorm's 1/RMS of a row of n from its sum of squares in double (§3.0): rsqrt(fp32(mean) + eps).
__device__ inline float rms_inverse(double sum_squares, int64_t n, float eps) {
  return rsqrt_f(float(sum_squares / double(n)) + eps);
}

// Rounds to bf16 where the reference does (deepseek numerics); identity in plain.
__device__ inline float round_if(bool bf16, float x) { return bf16 ? round_bf16(x) : x; }

// The clamped SwiGLU of one element (§3.6): round(silu(min(g, L)) · clamp(u, ±L) · w), with no
// clamp when L ≤ 0 and w = 1 when none is given (the shared expert's).
__device__ inline float swiglu_f(float g, float u, const float* w, float limit, bool bf16) {
  if (limit > 0) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  const float h = silu_f(g) * u;
  return round_if(bf16, w ? h * *w : h);
}

// Row-parallel kernels (hc_post, the MoE's combine and swiglu): grid (rows, groups of D), a thread
// per kRowGroup consecutive elements of a row. Elements d0 … d0 + 3 of a row of D floats: one
// 16-byte access when `whole` (D a multiple of kRowGroup and the row 16-byte aligned), else one by
// one, zeros past D when loading.
constexpr int kRowGroup = 4;
__device__ inline void load4(const float* row, int64_t d0, int64_t D, bool whole, float (&v)[kRowGroup]) {
  if (whole) {
    const float4 q = *reinterpret_cast<const float4*>(row + d0);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) v[u] = d0 + u < D ? row[d0 + u] : 0.0f;
  }
}
__device__ inline void store4(float* row, int64_t d0, int64_t D, bool whole, const float (&v)[kRowGroup]) {
  if (whole) {
    *reinterpret_cast<float4*>(row + d0) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u)
      if (d0 + u < D) row[d0 + u] = v[u];
  }
}

// Word k (0…3) of a 16-byte load.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// The largest of a word's four bytes (unsigned): of four E8M0 exponents, say.
__device__ __forceinline__ uint32_t largest_byte(uint32_t w) {
  w = __vmaxu4(w, w >> 16);
  return __vmaxu4(w, w >> 8) & 0xffu;
}

// ---- warp and block reductions (every lane / thread gets the result) -------------------------

__device__ inline double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 doubles in
// shared memory; the call ends with a barrier, so it may be reused right away.
__device__ inline double block_sum(double v, double* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < n_warps; ++w) total += scratch[w];  // same order in every thread
  __syncthreads();
  return total;
}

// Maximum over the block (fmax is order-independent: exact whatever the order).
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = scratch[0];
  for (int w = 1; w < n_warps; ++w) total = fmaxf(total, scratch[w]);
  __syncthreads();
  return total;
}

// f(a[i], i) for every i < n, spread over the block, each thread loading 8 elements before using
// them: a loop with one load in flight per thread waits on memory at every element when one
// block reads a long array (a query's scores, a token's HC state).
template <class T, class F>
__device__ inline void for_each_element(const T* a, int64_t n, F f) {
  constexpr int kUnroll = 8;
  for (int64_t base = threadIdx.x; base < n; base += int64_t(blockDim.x) * kUnroll) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = base + u * blockDim.x < n ? a[base + u * blockDim.x] : T{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * blockDim.x < n) f(v[u], base + u * blockDim.x);
  }
}

// d0 += a0·b and d1 += a1·b on the FP64 tensor cores: one 16 × 8 × 4 step of a warp
// (mma.m16n8k4.f64), i.e. two 8 × 8 × 4 steps sharing B. Lane 4·g + i holds a0 = A[g][i],
// a1 = A[g + 8][i], b = B[i][g], d0 = D[g][2i], D[g][2i + 1] and d1 = D[g + 8][2i], D[g + 8][2i + 1].
// Products of fp32 values (or narrower) are exact in double, so the result is a double sum in
// another order. (On Hopper the 16 × 8 × 4 shape runs at twice the rate of mma.m8n8k4, which
// reaches only half the FP64 tensor-core peak: 33 against 67 TFLOP/s on an H200,
// bench/cuda/dmma_rate.cu.)
// Before sm_90 (no f64 m16n8k4) it is the two 8 × 8 × 4 steps.
__device__ __forceinline__ void dmma(double (&d0)[2], double (&d1)[2], double a0, double a1, double b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
               : "+d"(d0[0]), "+d"(d0[1]), "+d"(d1[0]), "+d"(d1[1])
               : "d"(a0), "d"(a1), "d"(b));
#else
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(d0[0]), "+d"(d0[1])
               : "d"(a0), "d"(b));
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(d1[0]), "+d"(d1[1])
               : "d"(a1), "d"(b));
#endif
}

// c = a·b, one 16 × 8 × 32 step of a warp on the integer tensor cores (mma.m16n8k32, exact int32
// sums of int8 products), b signed and a signed or unsigned (kUnsignedA). With g = lane / 4 and
// i = lane % 4, a lane holds a = A[g][4i..4i+3], A[g+8][4i..], A[g][16+4i..], A[g+8][16+4i..] (four
// bytes per word, the lowest first), b0 = B[4i..4i+3][g], b1 = B[16+4i..][g], and receives
// c = C[g][2i], C[g][2i+1], C[g+8][2i], C[g+8][2i+1].
template <bool kUnsignedA>
__device__ __forceinline__ void mma_i8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kUnsignedA)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
  else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// c += a·b: mma_i8 with b and a signed, accumulating into c (exact while the sums fit int32).
__device__ __forceinline__ void mma_i8_add(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a·b, one 16 × 8 × 16 step of a warp on the bf16 tensor cores (mma.m16n8k16, fp32
// accumulation): deepseek-tc's attention. With g = lane / 4 and i = lane % 4, a lane holds a = two
// bf16 of A[g][2i..], A[g+8][2i..], A[g][8+2i..], A[g+8][8+2i..], b0 = B[2i..2i+1][g],
// b1 = B[8+2i..][g], and c = C[g][2i], C[g][2i+1], C[g+8][2i], C[g+8][2i+1].
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a·b, mma_bf16's step with f16 operands: deepseek-tc's routed FP4 experts at decode.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a·b, one 16 × 8 × 32 step of a warp on the FP8 tensor cores (mma.m16n8k32, e4m3 operands,
// fp32 accumulation in the tensor core's reduced precision): deepseek-tc's decode products. The
// fragments are mma_i8's, four e4m3 codes per word.
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The bits of two bf16 (the first in the low half), the tensor cores' operand word; from two
// floats, each rounded to nearest.
__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }
__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) { return bf16x2_bits(__floats2bfloat162_rn(a, b)); }
// The two bf16 of such a word, for the bf16x2 arithmetic.
__device__ __forceinline__ __nv_bfloat162 bf16x2_pair(uint32_t bits) {
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}

// The 32-bit shared-window address of a generic pointer into shared memory, as the shared::cta
// operands of ldmatrix, cp.async, mbarrier and wgmma's descriptors take it.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 × 8 matrices of 16-bit values from shared memory (ldmatrix): lanes 8m … 8m + 7 give the
// addresses of matrix m's rows (16 bytes each), and lane 4·r + c receives r[m] = row r's elements
// 2c, 2c + 1 of matrix m; transposed (kTrans), column r's instead.
template <bool kTrans>
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
  const uint32_t at = shared_address(row);
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

// The grid of a row-parallel kernel (see load4) over `rows` rows of D, `threads` threads a block.
inline dim3 row_group_grid(int64_t rows, int64_t D, int threads) {
  return dim3(unsigned(rows), unsigned((D + int64_t(kRowGroup) * threads - 1) / (int64_t(kRowGroup) * threads)));
}

// Blocks of a 1-D grid-stride launch over n elements.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 65536 * 16 ? (blocks > 0 ? blocks : 1) : 65536 * 16);
}

}  // namespace dsv4::cuda
