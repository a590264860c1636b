// deepseek-tc's quantized FP8 products of a few token rows (decode) on the FP8 tensor cores
// (gemm_tc.h): mma.sync m16n8k32 with e4m3 operands, where the exact kernel (gemm.cu) spends integer
// work on every code and reaches 1–1.3 TB/s. (sm_90a has no FP8 mma.sync in hardware: ptxas makes
// each one two f16 HMMA.16816 after converting the codes to f16 pairs, 48 F2FP a lane a K block.)
//
// A warp takes a tile of 16 weight rows (the mma's A) against up to 8 token rows (its B: the
// activations' e4m3 codes from act_quant, QuantizedForm::codes) over a share of the K blocks of 128.
// Each lane loads 16 consecutive codes of its two rows (g = lane / 4 and g + 8) and of token g
// from every 64 codes of K, at 16 · (lane % 4): two mma steps, whose fragments the lane fills
// with those words in the same order for A and B. That permutes K inside the 64, and a sum over
// K does not depend on its order, while the loads are 16 bytes wide and a warp's cover 64 bytes
// of each row. A block of 128 K sums on the tensor cores (their reduced-precision fp32), then its
// partial is scaled by the two block scales and added to an fp32 accumulator (the official
// kernels' promotion, architecture.md §5), as the cuBLASLt path of many rows does. The 16 rows lie
// in one 128-row scale block (row0 and the tile start are multiples of 16). The S warps of a tile
// split its K blocks (warp s takes s, s + S, …), and their sums are added in warp order in shared
// memory, then rounded to bf16.
//
// The routed FP4 experts of a few rows (decode; each (token, slot) row through its own expert's
// matrix, GemmRequest.table) take the same split on the f16 tensor cores, where the exact kernel
// spends about 5 integer instructions on every code (ncu: 8.9 M per 27 MB launch, 23.6 µs). A
// lane's 16 bytes of a row are 32 codes, one 32-block under one scale. Eight codes become f16 in
// seven integer operations and four conversions: an e2m1 code's bits placed in an e4m3 are its
// value · 2^-6 exactly, and e4m3 pairs convert to f16 in hardware. The block's scale is folded in
// relative to the row's largest (× 2^(6 − k) for a block 2^k below it: exact in f16 down to
// k = 23; blocks further below, whose products are under 2^-24 of the row's largest, are dropped),
// so an mma's 16 K may mix four lanes' blocks and the loads stay 16 bytes wide. The activations
// are their e4m3 codes (exact in f16); each 128-block's partial is scaled by its activation scale,
// as above, and the row's largest weight scale multiplies the sum. One token per row: every lane
// loads it, so all 8 columns of the mma's B repeat it and column 0 is read.
//
// Both kernels also come in a form of two matrices (an FFN's gate and up, SwigluUp): each lane
// streams its rows of both against the one x it loads (and, FP4, converts) once, and the epilogue
// writes swiglu_f of the two bf16 sums, exactly what the separate launches and swiglu_kernel give.
//
// The bf16 products of a few token rows (Compute::bf16, and f32_bf16_in, whose x holds bf16 values)
// take the same tiles and split on the bf16 mma (m16n8k16, fp32 accumulation), as the cuBLASLt path
// of many rows does; on an H100 the exact kernel read wo_a at ≈ 1.1 TB/s (this one: 1.5) and the
// head at 2.75 (2.8). A lane's 16-byte word of a row is 16 FP8 codes, made bf16 exactly (e4m3 →
// f16 in hardware, then bf16), or 8 bf16 values: four a mma step, in the same K permutation as
// above. Its x is the fp32 row rounded to bf16 (no change to bf16 values). The ring holds units of
// 128 bytes of a row: an FP8 K block, whose partial is scaled by the weight's block scale (the
// exact kernel's dequantized weight), or 64 bf16 values, summed straight into the accumulator. With
// a table (the grouped output projection: row m of x through view view_of_row[m]) every row is its
// own group and column 0 is read, as for the FP4 experts.
#include <cuda_runtime.h>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kWarps = 8, kTileRows = 16, kTokens = 8;

struct TcGemvArgs {
  LinearView W;
  const uint8_t* x;   // [source rows][K] e4m3 codes
  const float* sx;    // [K / 128][source rows]
  int64_t n_src, x_div, K, T;
  float* y;
  int64_t y_stride, row0, rows;
  int split;          // S: warps per tile
  const LinearView* table;  // the routed experts: row m's matrix is table[view_of_row[m]]
  const int32_t* view_of_row;
  int64_t n_views;
  SwigluUp up;  // kernels of two matrices: the up half (W, table the gate's); y receives h
  const float* xf;    // the bf16 products' x: fp32 rows of x_stride
  int64_t x_stride;
  bool round_out;     // the bf16 products: y rounded to bf16 (Compute::bf16)
};

// With a table: row m's view, once the kernels before (which may write the views) are awaited; -1
// when it has none, after the block wrote zeros to its rows of y (as on the CPU, such a row
// contributes nothing).
__device__ inline int32_t view_or_zeros(const TcGemvArgs& a, int64_t m) {
  await_previous_kernel();
  const int32_t v = a.view_of_row[m];
  if (v >= 0 && v < a.n_views) return v;
  const int64_t per_block = int64_t(kWarps / a.split) * kTileRows, first = int64_t(blockIdx.x) * per_block;
  for (int64_t r = first + threadIdx.x; r < min(a.rows, first + per_block); r += blockDim.x)
    a.y[m * a.y_stride + r] = 0.0f;
  return -1;
}

// Matrix q of the lane's product: the gate (or the one matrix), then the up.
__device__ __forceinline__ const LinearView& matrix(const TcGemvArgs& a, int q) { return q == 0 ? a.W : a.up.W; }

// K blocks in flight per lane beyond the one it sums, in a ring of registers: two for the kernels of
// one matrix (a decoded token's products are latency-bound: ncu put wq_b's 33.5 MB at 1.86 TB/s with
// one), one for the SwiGLU's pair, whose registers would not leave room for two blocks per SM.
template <int kMats>
constexpr int kDepth = kMats == 1 ? 2 : 1;

// The lane's K blocks b = s, s + S, … < n in order, block b from ring slot d (the caller has loaded
// blocks s + d·S into slot d, d < kDepth): step(d, b, refill) takes slot d's block b, refills the slot
// with block `refill` if it is below n, then sums block b. Unrolled by kDepth, so the slots are
// registers.
template <int kD, class Step>
__device__ __forceinline__ void for_k_blocks(int64_t s, int64_t S, int64_t n, Step step) {
  for (int64_t b0 = s; b0 < n; b0 += kD * S)
#pragma unroll
    for (int d = 0; d < kD; ++d)
      if (b0 + d * S < n) step(d, b0 + d * S, b0 + (d + kD) * S);
}

// One K block of 128 for the lane: its two rows' 16-byte words of both 64s (A), and its token's (B).
struct WeightWords {
  uint4 lo[2], hi[2];
};
using TokenWords = uint4[2];

__device__ __forceinline__ void load_weights(WeightWords& w, const uint8_t* lo, const uint8_t* hi, int64_t at) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    w.lo[h] = __ldg(reinterpret_cast<const uint4*>(lo + at + 64 * h));
    w.hi[h] = __ldg(reinterpret_cast<const uint4*>(hi + at + 64 * h));
  }
}

__device__ __forceinline__ void load_x(TokenWords& x, const uint8_t* from, bool has_token, int64_t at) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    x[h] = has_token ? __ldg(reinterpret_cast<const uint4*>(from + at + 64 * h)) : make_uint4(0, 0, 0, 0);
}

// The block's four mma steps: words 0, 1 of each 64 are the first step's A[g][4i..], A[g][16+4i..]
// (and B's b0, b1), words 2, 3 the second's.
__device__ __forceinline__ void block_products(const WeightWords& w, const TokenWords& x, float (&c)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a0[4] = {w.lo[h].x, w.hi[h].x, w.lo[h].y, w.hi[h].y};
    mma_e4m3(c, a0, x[h].x, x[h].y);
    const uint32_t a1[4] = {w.lo[h].z, w.hi[h].z, w.lo[h].w, w.hi[h].w};
    mma_e4m3(c, a1, x[h].z, x[h].w);
  }
}

// Grid (tile groups of kWarps / S tiles, token groups of kTokens); see the top. kMats 2: the gate
// and up matrices against the same x, and y receives their SwiGLU.
template <int kMats>
__global__ void __launch_bounds__(kWarps * 32) tc_gemv_kernel(TcGemvArgs a) {
  __shared__ float sums[kWarps][32][4 * kMats];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, i = lane % 4;
  const int S = a.split, tile = blockIdx.x * (kWarps / S) + warp / S, s = warp % S;
  const int64_t r_base = int64_t(tile) * kTileRows, m0 = int64_t(blockIdx.y) * kTokens;
  const int nt = int(min(int64_t(kTokens), a.T - m0));
  const int64_t n_blocks = a.K / 128;
  // Rows past the end read the last row (their sums are not written).
  const int64_t last = a.row0 + a.rows - 1;
  const uint8_t* lo[kMats];
  const uint8_t* hi[kMats];
  const uint8_t* s_w[kMats];
#pragma unroll
  for (int q = 0; q < kMats; ++q) {
    const LinearView& W = matrix(a, q);
    lo[q] = W.data + min(a.row0 + r_base + g, last) * a.K + 16 * i;
    hi[q] = W.data + min(a.row0 + r_base + g + 8, last) * a.K + 16 * i;
    s_w[q] = scale_row<kFp8>(W, min(a.row0 + r_base, last));
  }
  const bool has_token = g < nt;
  const uint8_t* x = a.x + (m0 + min(g, nt - 1)) / a.x_div * a.K + 16 * i;
  int64_t src[2];  // the source rows of the lane's two output tokens, 2i and 2i + 1
#pragma unroll
  for (int e = 0; e < 2; ++e) src[e] = (m0 + min(2 * i + e, nt - 1)) / a.x_div;

  float acc[kMats][4] = {};
  constexpr int kD = kDepth<kMats>;
  WeightWords ahead[kD][kMats];
  TokenWords ahead_x[kD];
  // Weights are never written by a kernel: the first blocks' are in flight while the previous
  // kernel finishes.
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (s + d * S < n_blocks)
#pragma unroll
      for (int q = 0; q < kMats; ++q) load_weights(ahead[d][q], lo[q], hi[q], 128 * (s + d * S));
  await_previous_kernel();
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (s + d * S < n_blocks) load_x(ahead_x[d], x, has_token, 128 * (s + d * S));
  for_k_blocks<kD>(s, S, n_blocks, [&](int d, int64_t b, int64_t refill) {
    WeightWords now[kMats];
    TokenWords now_x = {ahead_x[d][0], ahead_x[d][1]};
#pragma unroll
    for (int q = 0; q < kMats; ++q) now[q] = ahead[d][q];
    if (refill < n_blocks) {
#pragma unroll
      for (int q = 0; q < kMats; ++q) load_weights(ahead[d][q], lo[q], hi[q], 128 * refill);
      load_x(ahead_x[d], x, has_token, 128 * refill);
    }
    const float sx[2] = {__ldg(a.sx + b * a.n_src + src[0]), __ldg(a.sx + b * a.n_src + src[1])};
#pragma unroll
    for (int q = 0; q < kMats; ++q) {
      float c[4] = {};
      block_products(now[q], now_x, c);
      const float sw = scale_at(s_w[q], b, matrix(a, q).scale_is_f32);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][e] += c[e] * (sx[e % 2] * sw);  // §5: partial · (s_x · s_w)
    }
  });
#pragma unroll
  for (int q = 0; q < kMats; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) sums[warp][lane][4 * q + e] = acc[q][e];
  __syncthreads();
  if (s != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v[kMats];
#pragma unroll
    for (int q = 0; q < kMats; ++q) {
      v[q] = 0.0f;
      for (int p = 0; p < S; ++p) v[q] += sums[warp + p][lane][4 * q + e];
      v[q] = round_bf16(v[q]);
    }
    const int64_t row = r_base + g + 8 * (e / 2);
    const int n = 2 * i + e % 2;
    if (row >= a.rows || n >= nt) continue;
    const int64_t m = m0 + n;
    a.y[m * a.y_stride + row] =
        kMats == 1 ? v[0] : swiglu_f(v[0], v[kMats - 1], a.up.row_weights ? a.up.row_weights + m : nullptr, a.up.limit, true);
  }
}

// The e4m3 bytes of the even (each byte's low nibble) or odd FP4 codes of a word of 8: the sign to
// bit 7, exponent and mantissa to bits 4…2, which makes each the code's value · 2^-6.
template <bool kOdd>
__device__ __forceinline__ uint32_t e2m1_as_e4m3(uint32_t w) {
  return kOdd ? (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu) : ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu);
}

// Two e4m3 codes of a word (bytes 0, 1, or 2, 3 when high) as f16x2, exactly. (The halves taken by
// a move to 16-bit registers, which the conversion reads in place; a shift cost an instruction.)
__device__ __forceinline__ uint32_t e4m3x2_as_f16x2(uint32_t w, bool high) {
  uint32_t d;
  if (high) asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, hi; }" : "=r"(d) : "r"(w));
  else asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(d) : "r"(w));
  return d;
}

__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));  // subnormals kept
  return d;
}

// f16x2 of 2^(6 − k), the factor of a block 2^k below its row's largest scale, applied to codes
// placed as value · 2^-6; 0 (the block dropped) below 2^-23, where value · 2^-k would not be exact.
__device__ __forceinline__ uint32_t block_factor(int k) {
  const int e = 6 - k;
  const uint32_t h = k > 23 ? 0u : e >= -14 ? uint32_t(e + 15) << 10 : 1u << (e + 24);
  return h | h << 16;
}

// The largest E8M0 exponent of a row's n 32-block scales (16-byte loads: n a multiple of 16), over
// the lane's quad (t = lane % 4), which must all call it.
__device__ __forceinline__ int row_top_exponent(const uint8_t* scales, int64_t n, int t) {
  uint32_t m = 0;
  for (int64_t j = 16 * t; j < n; j += 64) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(scales + j));
    m = __vmaxu4(m, __vmaxu4(__vmaxu4(v.x, v.y), __vmaxu4(v.z, v.w)));
  }
  m = largest_byte(m);
  m = max(m, __shfl_xor_sync(kFullMask, m, 1));
  return int(max(m, __shfl_xor_sync(kFullMask, m, 2)));
}

// One K block of 128 for the lane, of one matrix: 16 bytes (32 codes) of each of its rows g, g + 8
// and their 32-block scales.
struct Fp4Words {
  uint4 w[2];
  uint32_t scale[2];
};
// The same block's 32 activation codes of the lane and the block's activation scale.
struct Fp4TokenWords {
  uint4 x[2];
  float sx;
};

// Grid (tile groups of kWarps / S tiles, routed rows); see the top. kMats 2: each row's gate and up
// matrices against the same x, and y receives their SwiGLU.
template <int kMats>
__global__ void __launch_bounds__(kWarps * 32) tc_gemv_fp4_kernel(TcGemvArgs a) {
  __shared__ float sums[kWarps][32][2 * kMats];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int S = a.split, tiles_per_block = kWarps / S, tile = blockIdx.x * tiles_per_block + warp / S, s = warp % S;
  const int64_t r_base = int64_t(tile) * kTileRows, m = blockIdx.y;
  const int32_t v = view_or_zeros(a, m);  // the routing comes from the kernels before
  if (v < 0) return;  // no expert: h = swiglu(0, 0) = 0
  const int64_t K = a.K, n_blocks = K / 128, last = a.rows - 1, src = m / a.x_div;
  const int64_t rows[2] = {min(r_base + g, last), min(r_base + g + 8, last)};  // past the end: not written
  const uint8_t* w_at[kMats][2];
  const uint8_t* s_at[kMats][2];
  int top[kMats][2];
#pragma unroll
  for (int q = 0; q < kMats; ++q) {
    const LinearView W = (q == 0 ? a.table : a.up.table)[v];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w_at[q][h] = W.data + rows[h] * (K / 2) + 16 * t;
      s_at[q][h] = W.scale + rows[h] * W.scale_cols;  // E8M0 bytes (tc_gemv_handles)
      top[q][h] = row_top_exponent(s_at[q][h], K / 32, t);
    }
  }
  const uint8_t* x = a.x + src * K + 32 * t;
  auto load = [&](Fp4Words (&f)[kMats], Fp4TokenWords& fx, int64_t b) {
#pragma unroll
    for (int q = 0; q < kMats; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        f[q].w[h] = __ldg(reinterpret_cast<const uint4*>(w_at[q][h] + 64 * b));
        f[q].scale[h] = s_at[q][h][4 * b + t];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) fx.x[h] = __ldg(reinterpret_cast<const uint4*>(x + 128 * b + 16 * h));
    fx.sx = __ldg(a.sx + b * a.n_src + src);
  };

  float acc[kMats][2] = {};  // rows g, g + 8 (column 0; see the top)
  constexpr int kD = kDepth<kMats>;
  Fp4Words ahead[kD][kMats];
  Fp4TokenWords ahead_x[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (s + d * S < n_blocks) load(ahead[d], ahead_x[d], s + d * S);
  for_k_blocks<kD>(s, S, n_blocks, [&](int d, int64_t b, int64_t refill) {
    Fp4Words now[kMats];
#pragma unroll
    for (int q = 0; q < kMats; ++q) now[q] = ahead[d][q];
    const Fp4TokenWords now_x = ahead_x[d];
    if (refill < n_blocks) load(ahead[d], ahead_x[d], refill);
    uint32_t factor[kMats][2];
#pragma unroll
    for (int q = 0; q < kMats; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) factor[q][h] = block_factor(top[q][h] - int(now[q].scale[h]));
    float c[kMats][4] = {};
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // codes 8p … 8p + 7 of the lane's 32: the even ones, then the odd
      const uint32_t x_lo = word_of(now_x.x[p / 2], 2 * (p % 2)), x_hi = word_of(now_x.x[p / 2], 2 * (p % 2) + 1);
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        const uint32_t cx = __byte_perm(x_lo, x_hi, odd ? 0x7531 : 0x6420);  // the same codes of x
        const uint32_t b0 = e4m3x2_as_f16x2(cx, false), b1 = e4m3x2_as_f16x2(cx, true);
#pragma unroll
        for (int q = 0; q < kMats; ++q) {
          const uint32_t wg = word_of(now[q].w[0], p), wh = word_of(now[q].w[1], p);
          const uint32_t cg = odd ? e2m1_as_e4m3<true>(wg) : e2m1_as_e4m3<false>(wg);
          const uint32_t ch = odd ? e2m1_as_e4m3<true>(wh) : e2m1_as_e4m3<false>(wh);
          const uint32_t A[4] = {mul_f16x2(e4m3x2_as_f16x2(cg, false), factor[q][0]),
                                 mul_f16x2(e4m3x2_as_f16x2(ch, false), factor[q][1]),
                                 mul_f16x2(e4m3x2_as_f16x2(cg, true), factor[q][0]),
                                 mul_f16x2(e4m3x2_as_f16x2(ch, true), factor[q][1])};
          mma_f16(c[q], A, b0, b1);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kMats; ++q) {
      acc[q][0] += c[q][0] * now_x.sx;  // §5: the block's partial · s_x
      acc[q][1] += c[q][2] * now_x.sx;
    }
  });
#pragma unroll
  for (int q = 0; q < kMats; ++q) sums[warp][lane][2 * q] = acc[q][0], sums[warp][lane][2 * q + 1] = acc[q][1];
  __syncthreads();
  if (s != 0 || t != 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float out[kMats];
#pragma unroll
    for (int q = 0; q < kMats; ++q) {
      float sum = 0.0f;
      for (int p = 0; p < S; ++p) sum += sums[warp + p][lane][2 * q + h];
      out[q] = round_bf16(sum * e8m0_to_f32(uint8_t(top[q][h])));
    }
    const int64_t row = r_base + g + 8 * h;
    if (row < a.rows)
      a.y[m * a.y_stride + row] =
          kMats == 1 ? out[0] : swiglu_f(out[0], out[kMats - 1], a.up.row_weights ? a.up.row_weights + m : nullptr, a.up.limit, true);
  }
}

// Two e4m3 codes of a word (bytes 0, 1, or 2, 3 when high) as bf16x2, exactly: every e4m3 value is
// an f16 and a bf16.
__device__ __forceinline__ uint32_t e4m3x2_as_bf16x2(uint32_t w, bool high) {
  uint32_t d;
  asm("{ .reg .b16 lo, hi; .reg .f32 a, b; mov.b32 {lo, hi}, %1; cvt.f32.f16 a, lo; cvt.f32.f16 b, hi;"
      " cvt.rn.bf16x2.f32 %0, b, a; }"
      : "=r"(d)
      : "r"(e4m3x2_as_f16x2(w, high)));
  return d;
}

// The bf16 mma steps of one unit (128 bytes of each of the lane's rows, at 16·i and 64 + 16·i):
// step p of word h takes the lane's values 4p … 4p + 3 of it, and of x (fp32, from the lane's first
// value of the unit), as A[g][2i..], A[g][8 + 2i..] and b0, b1.
template <int kFmt>
__device__ __forceinline__ void unit_products(const WeightWords& w, const float* x, float (&c)[4]) {
  constexpr int V = kFmt == kFp8 ? 16 : 8;  // values in 16 bytes of a row
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int p = 0; p < V / 4; ++p) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(x + 4 * V * h + 4 * p));
      uint32_t A[4];
      if constexpr (kFmt == kFp8) {
        const uint32_t lo = word_of(w.lo[h], p), hi = word_of(w.hi[h], p);
        A[0] = e4m3x2_as_bf16x2(lo, false), A[1] = e4m3x2_as_bf16x2(hi, false);
        A[2] = e4m3x2_as_bf16x2(lo, true), A[3] = e4m3x2_as_bf16x2(hi, true);
      } else {
        A[0] = word_of(w.lo[h], 2 * p), A[1] = word_of(w.hi[h], 2 * p);
        A[2] = word_of(w.lo[h], 2 * p + 1), A[3] = word_of(w.hi[h], 2 * p + 1);
      }
      mma_bf16(c, A, bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
    }
}

// Grid (tile groups of kWarps / S tiles, token groups of kTokens, or with a table the rows of x);
// see the top.
template <int kFmt>
__global__ void __launch_bounds__(kWarps * 32) tc_gemv_bf16_kernel(TcGemvArgs a) {
  __shared__ float sums[kWarps][32][4];
  constexpr int V = kFmt == kFp8 ? 16 : 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, i = lane % 4;
  const int S = a.split, tiles_per_block = kWarps / S, tile = blockIdx.x * tiles_per_block + warp / S, s = warp % S;
  const int64_t r_base = int64_t(tile) * kTileRows, m0 = int64_t(blockIdx.y) * (a.table ? 1 : kTokens);
  LinearView W = a.W;
  if (a.table) {
    const int32_t v = view_or_zeros(a, m0);
    if (v < 0) return;
    W = a.table[v];
  }
  const int nt = a.table ? 1 : int(min(int64_t(kTokens), a.T - m0));
  const int64_t n_units = a.K / (8 * V), nb = row_bytes(kFmt, a.K), last = a.row0 + a.rows - 1;
  const uint8_t* lo = W.data + min(a.row0 + r_base + g, last) * nb + 16 * i;  // past the end: not written
  const uint8_t* hi = W.data + min(a.row0 + r_base + g + 8, last) * nb + 16 * i;
  const uint8_t* s_w = kFmt == kFp8 ? scale_row<kFp8>(W, min(a.row0 + r_base, last)) : nullptr;
  // Lane g's token (columns past nt repeat the last one and are not written).
  const float* x = a.xf + (m0 + min(g, nt - 1)) / a.x_div * a.x_stride + V * i;

  float acc[4] = {};
  constexpr int kD = kDepth<1>;
  WeightWords ahead[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (s + d * S < n_units) load_weights(ahead[d], lo, hi, 128 * (s + d * S));
  if (!a.table) await_previous_kernel();  // (weights are never written by a kernel)
  for_k_blocks<kD>(s, S, n_units, [&](int d, int64_t u, int64_t refill) {
    const WeightWords now = ahead[d];
    if (refill < n_units) load_weights(ahead[d], lo, hi, 128 * refill);
    if constexpr (kFmt == kFp8) {
      float c[4] = {};
      unit_products<kFmt>(now, x + 8 * V * u, c);
      const float sw = scale_at(s_w, u, W.scale_is_f32);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += c[e] * sw;
    } else {
      unit_products<kFmt>(now, x + 8 * V * u, acc);
    }
  });
#pragma unroll
  for (int e = 0; e < 4; ++e) sums[warp][lane][e] = acc[e];
  __syncthreads();
  if (s != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int64_t row = r_base + g + 8 * (e / 2);
    const int n = 2 * i + e % 2;
    if (row >= a.rows || n >= nt) continue;
    float v = 0.0f;
    for (int p = 0; p < S; ++p) v += sums[warp + p][lane][e];
    a.y[(m0 + n) * a.y_stride + row] = a.round_out ? round_bf16(v) : v;
  }
}

}  // namespace

bool tc_gemv_handles(const GemmRequest& r) {
  if (r.table)  // routed FP4 experts: E8M0 scales, rows of whole 16-byte scale loads (K % 512)
    return r.W.format == kFp4 && !r.W.scale_is_f32 && r.W.in % 512 == 0 && r.row0 == 0 && r.rows > 0;
  return r.W.format == kFp8 && r.T < TensorCoreGemm::kMinRows && r.W.in % 128 == 0 &&
         r.row0 % kTileRows == 0 && r.rows > 0;
}

bool tc_gemv_bf16_handles(const GemmRequest& r) {
  const bool bf16_operands = r.compute == Compute::bf16 || r.compute == Compute::f32_bf16_in;
  const bool x_vec = reinterpret_cast<uintptr_t>(r.x) % 16 == 0 && r.x_stride % 4 == 0;
  const bool fp8 = r.W.format == kFp8 && r.W.in % 128 == 0 && r.row0 % kTileRows == 0;
  const bool bf16 = r.W.format == kBf16 && r.W.in % 64 == 0;
  return bf16_operands && (fp8 || bf16) && x_vec && r.T < TensorCoreGemm::kMinRows && r.rows > 0;
}

namespace {

// The arguments and grid of a decode product on mma.sync: tiles of kTileRows rows, token groups of
// kTokens (with a table, every row its own group), and S, the fewest warps per tile that give every
// SM 16 warps' products while each keeps a unit of the ring (a warp of the SwiGLU's kernels makes
// two products; their 120–128 registers leave room for two blocks per SM, so a split counted in
// warps would take two waves).
TcGemvArgs gemv_args(const GemmRequest& r, int64_t n_units, int mats, int sm_count, dim3& grid) {
  const int64_t tiles = (r.rows + kTileRows - 1) / kTileRows, groups = r.table ? r.T : (r.T + kTokens - 1) / kTokens;
  const int64_t products = tiles * groups * mats;
  int split = 1;
  while (split < kWarps && 2 * split <= n_units && products * split < 16 * int64_t(sm_count)) split *= 2;
  const int64_t tile_groups = (tiles + kWarps / split - 1) / (kWarps / split);
  DSV4_CUDA_REQUIRE(groups < 65536 && tile_groups < (int64_t(1) << 31), "tc_gemv: ", r.T, " tokens × ", r.rows,
                    " rows exceed the launch limits");
  grid = dim3{unsigned(tile_groups), unsigned(groups)};
  TcGemvArgs a{};
  a.W = r.W, a.n_src = r.source_rows(), a.x_div = r.x_div, a.K = r.W.in, a.T = r.T;
  a.y = r.y, a.y_stride = r.y_stride, a.row0 = r.row0, a.rows = r.rows, a.split = split;
  a.table = r.table, a.view_of_row = r.view_of_row, a.n_views = r.n_views;
  return a;
}

}  // namespace

void tc_gemv(const GemmRequest& r, const SwigluUp* swiglu, const uint8_t* x_codes, const float* x_scales, int sm_count,
             cudaStream_t stream) {
  dim3 grid;
  TcGemvArgs a = gemv_args(r, r.W.in / 128, swiglu ? 2 : 1, sm_count, grid);
  a.x = x_codes, a.sx = x_scales;
  if (swiglu) {
    DSV4_CUDA_REQUIRE(r.table ? swiglu->table != nullptr
                              : swiglu->W.format == r.W.format && swiglu->W.in == r.W.in &&
                                    swiglu->W.out >= r.row0 + r.rows && swiglu->W.scale_is_f32 == r.W.scale_is_f32,
                      "tc_gemv: the SwiGLU's up matrix does not match its gate");
    a.up = *swiglu;
  }
  void (*kernel)(TcGemvArgs) = r.table ? (swiglu ? tc_gemv_fp4_kernel<2> : tc_gemv_fp4_kernel<1>)
                                       : (swiglu ? tc_gemv_kernel<2> : tc_gemv_kernel<1>);
  launch(kernel, grid, kWarps * 32, 0, stream, a);
  DSV4_CUDA_LAUNCHED("tc_gemv");
}

void tc_gemv_bf16(const GemmRequest& r, bool round_out, int sm_count, cudaStream_t stream) {
  const bool fp8 = r.W.format == kFp8;
  dim3 grid;
  TcGemvArgs a = gemv_args(r, r.W.in / (fp8 ? 128 : 64), 1, sm_count, grid);
  a.xf = r.x, a.x_stride = r.x_stride, a.round_out = round_out;
  launch(fp8 ? tc_gemv_bf16_kernel<kFp8> : tc_gemv_bf16_kernel<kBf16>, grid, kWarps * 32, 0, stream, a);
  DSV4_CUDA_LAUNCHED("tc_gemv_bf16");
}

}  // namespace dsv4::cuda
