// Matrix products y = x·Wᵀ for every weight format, and the embedding lookup (twin of
// cpu/gemm.cpp; architecture.md §3.0 "Linear kinds", §5).
//
// quantized (deepseek numerics): phase 1 quantizes each activation row to e4m3 per 128-block with
// a power-of-two scale; phase 2 sums, per K tile (128 for FP8 weights, 32 for FP4), the exact
// e4m3×e4m3 (or e4m3×e2m1) products, rounds the tile partial to fp32, multiplies it by the two
// scales and adds it to an fp32 accumulator in increasing K order; the result is rounded to bf16.
// Everything else takes double dot products with the dequantized weight, rounded once.
//
// Phase 2 is one kernel for every T, built for decode (a few token rows), where it must stream
// the weights at memory bandwidth: each lane loads 16-byte chunks of 4 weight rows at once
// (coalesced across the warp), converts its slice of x once for the four rows, and up to 8
// token rows share each weight load (larger T runs in groups of 8 tokens). S warps split one
// row's K range, so a block is 8/S groups of 4 rows; S is the fewest that still give every SM
// two blocks, so that each lane streams many steps. The chunks go through a ring in shared memory
// per lane (cp.async), a few steps ahead of the sums: loads in flight cost no registers, where
// loading the next chunk into registers cost occupancy (and measured slower).
//
// Why it is bit-identical to the CPU in the quantized path: a tile partial is a sum of at most
// 128 products of two e4m3 (or e4m3 and e2m1) values, exact in any order, so the rounded fp32
// partial is the CPU's. FP8 weights: each product and every partial sum is exact in a double (the
// span is under 43 bits); the weight is turned into a double by placing its bits in the double's
// exponent and mantissa fields, which yields value · 2^-1016 exactly (e4m3 subnormals land on
// double subnormals); x is pre-scaled by 2^1000 so no product is subnormal, and the exact partial
// is scaled back by a power of two. (The e4m3 NaN codes 0x7f/0xff, absent from checkpoints,
// decode as 480 here instead of NaN.) FP4 weights: integers. Every e4m3 value is k · 2^-9 with
// |k| ≤ 448 · 2^9 (18 bits) and every e2m1 value w2 / 2 with w2 in −12 … 12, so a 32-product
// tile is 2^-10 · Σ k·w2 with |Σ| < 2^27: phase 1 writes k as three byte planes (k = b0 + 2^8 b1
// + 2^16 b2, b2 signed), phase 2 turns 8 nibbles into int8 with three byte permutes per four and
// sums with four-way int8 dot products (dp4a), and float() of the int32 sum rounds it like the
// CPU's double (about 2 integer operations per weight instead of about 7 for bit placement and a
// DFMA). The fp32 tile accumulation, the only order-dependent step, runs in increasing K order
// per output: lanes write each tile's scaled partial to shared memory and one thread per output
// folds them.
// In the double paths any summation order is allowed (device_math.cuh): each lane's double
// partial is reduced across the warp and the S warps. A product with few rows (hc_pre's mix: 24
// rows over K = 16 384, 6 blocks, 34 µs per call on an H200) also splits K across blocks: grid z
// holds P parts of the chunks, each block writes its double sums to scratch, and the block that
// finishes last (an arrival count per output block) adds the P parts in part order and rounds:
// the same sum whichever block that is. (A second kernel for the fold cost a launch per product.)
//
// deepseek-tc leaves these kernels for the tensor cores where it can: many rows through cuBLASLt
// (gemm_tc.cu), the routed FP4 experts of many rows on the FP8 mma (gemm_experts_tc.cu), and the
// quantized FP8 products, the routed FP4 experts and the bf16 products of a few rows (decode) on
// mma.sync (gemv_tc.cu), with little or no per-code integer work.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/gemm_dmma.h"
#include "backend/cuda/gemm_experts_tc.h"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kWarps = 8;      // per block
constexpr int kRows = 4;       // weight rows per warp: one conversion of x serves all four
constexpr int kMaxTokens = 8;  // token rows per group: each weight load serves all of them
// Weight chunks reach a lane through its own ring of kSlots slots in shared memory (cp.async):
// while it sums one step's chunks, the next kSlots - 1 steps' are in flight, held by no register.
constexpr int kSlots = 3;
constexpr size_t kRingBytes = size_t(kSlots) * kRows * kWarps * 32 * sizeof(uint4);
// Products of many rows run on the tensor cores (gemm_dmma.cu), which read the weights once
// per 64 rows: from 32 token rows, or for routed experts from 4 rows per expert on average.
constexpr int64_t kDmmaMinRows = 32, kDmmaMinRowsPerExpert = 4;
// Weight elements in a 16-byte chunk of a row.
__host__ __device__ constexpr int chunk_elems(int format) {
  return format == kFp8 ? 16 : format == kFp4 ? 32 : format == kBf16 ? 8 : 4;
}

// Phase 1: ActQuantFP8 of each 128-block of each source row: one warp per block, 4 consecutive
// elements per lane (one 16-byte load when the rows allow), the block's amax by a warp fmax; grid
// (rows, K blocks / kQuantWarps). The e4m3 values go to `out` in `form` (QuantizedForm): as floats;
// as e4m3 bytes (the FP8 tensor cores' operand, deepseek-tc), in K order or with each 32-block's
// groups of 4 reordered for the experts' kernel (gemm_experts_tc.cu); for FP4 weights as the integers
// k = x · 2^9 in three byte planes per group of 4 (see the top; plane_words per row, K padded with
// zeros to whole 32-tiles). The scales go to sx: per row, [rows][K/128]; for cuBLASLt's FP8
// products per K block, [K/128][rows] (their layout).
constexpr int kQuantWarps = 8;
__global__ void act_quant_kernel(const float* x, int64_t x_stride, int64_t K, int64_t n_k128, QuantizedForm form,
                                 void* out, int64_t plane_words, float* sx) {
  await_previous_kernel();
  const int64_t m = blockIdx.x, b = int64_t(blockIdx.y) * kQuantWarps + threadIdx.x / 32;
  if (b >= n_k128) return;
  const int lane = threadIdx.x % 32;
  const int64_t k = b * 128 + 4 * lane;
  const float* xr = x + m * x_stride;
  float v[4];
  if (k + 4 <= K && reinterpret_cast<uintptr_t>(xr + k) % 16 == 0) {
    const float4 f = *reinterpret_cast<const float4*>(xr + k);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = k + e < K ? xr[k + e] : 0.0f;
  }
  const int e = fp8_scale_exp(warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])))));
  float q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = fp8_quantize(v[i], e);  // zero past K
  if (lane == 0) sx[form == QuantizedForm::codes ? b * gridDim.x + m : m * n_k128 + b] = ldexpf(1.0f, e);
  const bool whole = k + 4 <= K && K % 4 == 0;  // the lane's 4 outputs one aligned store
  switch (form) {
    case QuantizedForm::codes:
    case QuantizedForm::fragment_codes: {  // each value is on the e4m3 grid: the conversions are exact
      // Group g = lane % 8 of its 32-block (K is then a multiple of 32) goes to place 4 (g % 2) + g / 2.
      const int64_t at = form == QuantizedForm::codes ? k : k - 4 * (lane % 8) + 4 * (4 * (lane % 2) + lane % 8 / 2);
      uint8_t* o = static_cast<uint8_t*>(out) + m * K + at;
      uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) word |= uint32_t(__nv_cvt_float_to_fp8(q[i], __NV_SATFINITE, __NV_E4M3)) << (8 * i);
      if (whole) *reinterpret_cast<uint32_t*>(o) = word;
      else
        for (int i = 0; i < 4 && k + i < K; ++i) o[i] = uint8_t(word >> (8 * i));
      return;
    }
    case QuantizedForm::values: {
      float* o = static_cast<float*>(out) + m * K + k;
      if (whole) *reinterpret_cast<float4*>(o) = make_float4(q[0], q[1], q[2], q[3]);
      else
        for (int i = 0; i < 4 && k + i < K; ++i) o[i] = q[i];
      return;
    }
    case QuantizedForm::planes: {  // the lane's 4 values are one group: byte p of each, in plane p
      const int64_t group = k / 4;
      if (3 * group >= plane_words) return;
      uint32_t* planes = static_cast<uint32_t*>(out) + m * plane_words + 3 * group;
      uint32_t ints[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) ints[i] = uint32_t(int32_t(q[i] * 512.0f));  // exact
      for (uint32_t p = 0; p < 3; ++p) {
        const uint32_t pick = p | (4 + p) << 4;
        planes[p] = __byte_perm(__byte_perm(ints[0], ints[1], pick), __byte_perm(ints[2], ints[3], pick), 0x5410);
      }
      return;
    }
  }
}

struct GemmArgs {
  LinearView W;
  const LinearView* table;
  const int32_t* view_of_row;
  int64_t n_views;
  // fp32 activations (double paths), their e4m3 values (quantized, FP8 weights) or their byte
  // planes (quantized, FP4 weights: uint32 words), rows of x_stride elements
  const float* x;
  int64_t x_stride, x_div;
  const float* sx;  // quantized: the activation scales [src rows, K/128]
  int64_t n_k128;
  int64_t K, T;
  float* y;
  int64_t y_stride, row0, rows;
  bool round_out;
  bool w_vec, x_vec;  // rows of W / of x allow 16-byte loads (else bytewise, bounds-checked)
  int split;          // S: warps per group of 4 rows
  int64_t n_chunks;   // 16-byte chunks per weight row (the last may be partial)
  int64_t part_chunks;  // chunks per K part (grid z); all of them when K is not split
  double* parts;        // K split: the parts' double sums [part][T][rows], instead of y
  unsigned* arrivals;   // K split: parts finished per (row block, token group); back to 0 by the last
  int64_t n_tiles;    // quantized: K tiles per row
};

// The E elements of x (one activation row) that chunk c of a weight row meets: 16-byte loads when
// they lie inside the row, else one by one with zeros past K or for an absent chunk. (One branch
// per chunk: a branch and 64-bit address arithmetic per 4 elements were a tenth of the FP8 loop.)
template <int E>
__device__ inline void load_x_chunk(const GemmArgs& a, const float* xr, int64_t c, bool valid, float (&v)[E]) {
  const int64_t k0 = c * E;
  if (valid && a.x_vec && k0 + E <= a.K) {
    const float4* p = reinterpret_cast<const float4*>(xr + k0);
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
      const float4 f = __ldg(p + q);
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) v[i] = valid && k0 + i < a.K ? xr[k0 + i] : 0.0f;
}

// A bf16 (the high half of h) or an f32 as a double by bit placement: its 8-bit exponent lands in
// the low bits of the double's 11-bit field, which makes the double value · 2^-896 exactly
// (subnormals included), from integer operations only: a conversion to double issues at 16 per
// clock per SM on an H200, on a unit the products' x conversions share. Inf and NaN, absent from
// checkpoints, become finite values.
constexpr double kWidePlacedXScale = 0x1p896;  // x's scale against bf16 / f32 weights so placed
__device__ __forceinline__ double bf16_high_placed(uint32_t h) {
  return __hiloint2double(int((h & 0x80000000u) | ((h >> 3) & 0x0fffe000u)), 0);
}
__device__ __forceinline__ double f32_placed(uint32_t b) {
  return __hiloint2double(int((b & 0x80000000u) | ((b >> 3) & 0x0fffffffu)), int(b << 29));
}

// The scale of x against weights4_at's values: 2^1000 against quantized FP8 codes (see the top),
// 2^896 against bf16 / f32 weights, else 1. (The double paths' placed FP8 codes take
// kPlacedXScale, below.)
template <int kFmt, bool kTiled>
constexpr double kXScaleFor = kTiled ? 0x1p1000 : kFmt == kBf16 || kFmt == kF32 ? kWidePlacedXScale : 1.0;

// Elements 4q … 4q+3 of a chunk as doubles. FP8 with kPlaced: the unscaled e4m3 values times
// 2^-1016 by bit placement (see the top); bf16 and f32: their values times 2^-896 by bit placement;
// otherwise the CPU's fp32 dequantized values.
template <int kFmt, bool kPlaced>
__device__ inline void weights4_at(const uint4& w, int q, float scale, double (&v)[4]) {
  static_assert(!(kFmt == kFp4 && kPlaced), "quantized FP4 products take the integer path (fp4_tile_partials)");
  if constexpr (kFmt == kFp8 && kPlaced) {
    e4m3x4_placed(word_of(w, q), v);
  } else if constexpr (kFmt == kFp8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = double(e4m3_to_f32(uint8_t(word_of(w, q) >> (8 * i))) * scale);
  } else if constexpr (kFmt == kFp4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = 4 * q + i;
      const uint32_t n = (word_of(w, e / 8) >> (4 * (e % 8))) & 0xf;  // low nibble first (§2.2)
      v[i] = double(e2m1_to_f32(uint8_t(n)) * scale);
    }
  } else if constexpr (kFmt == kBf16) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // elements 2j, 2j + 1 in the low and high half of a word
      const uint32_t word = word_of(w, 2 * q + j);
      v[2 * j] = bf16_high_placed(word << 16);
      v[2 * j + 1] = bf16_high_placed(word);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = f32_placed(word_of(w, 4 * q + i));
  }
}

__device__ inline int dp4a_signed_unsigned(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// FP4 weights, quantized: the partials of chunk c (one 32-element tile) of kRows weight rows, from
// x's byte planes (`planes`: one activation row), as exact int32 sums (see the top).
template <int kRowsT>
__device__ inline void fp4_tile_partials(const uint32_t* planes, int64_t c, bool valid, const uint4 (&w)[kRowsT],
                                         float (&partial)[kRowsT]) {
  uint32_t xp[24] = {};  // [group of 4 elements][plane]
  if (valid) {  // one branch: loads predicated one by one each recomputed their address
    const uint4* src = reinterpret_cast<const uint4*>(planes) + 6 * c;
#pragma unroll
    for (int i = 0; i < 6; ++i) {
      const uint4 v = __ldg(src + i);
      xp[4 * i] = v.x, xp[4 * i + 1] = v.y, xp[4 * i + 2] = v.z, xp[4 * i + 3] = v.w;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsT; ++r) {
    int s0 = 0, s1 = 0, s2 = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t w8[2];
      fp4_to_int8x8(word_of(w[r], j), w8[0], w8[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* g = xp + 3 * (2 * j + h);
        s0 = dp4a_signed_unsigned(w8[h], g[0], s0);
        s1 = dp4a_signed_unsigned(w8[h], g[1], s1);
        s2 = __dp4a(int(w8[h]), int(g[2]), s2);
      }
    }
    partial[r] = float(s0 + 256 * s1 + 65536 * s2) * 0x1p-10f;
  }
}

// The products of chunk c of kRows weight rows with x (one activation row), summed into each
// row's part in element order: fma, as each product is exact in double (see the top). x is scaled
// by kXScale first; kPlaced: FP8 weights are their codes by bit placement (weights4_at).
template <int kFmt, bool kPlaced, double kXScale>
__device__ inline void chunk_products(const GemmArgs& a, const float* xr, int64_t c, bool cv, const uint4 (&w)[kRows],
                                      const float (&scale)[kRows], double (&part)[kRows]) {
  constexpr int E = chunk_elems(kFmt);
  float xv[E];
  load_x_chunk(a, xr, c, cv, xv);
  for (int q = 0; q < E / 4; ++q) {
    double xd[4];
    for (int i = 0; i < 4; ++i) xd[i] = double(xv[4 * q + i]) * kXScale;
    for (int r = 0; r < kRows; ++r) {
      double wd[4];
      weights4_at<kFmt, kPlaced>(w[r], q, scale[r], wd);
      for (int i = 0; i < 4; ++i) part[r] = fma(xd[i], wd[i], part[r]);
    }
  }
}

// The exact sums of one 128-tile of the 4 rows, over the tile's 8 lanes (any order: see the top),
// transposed as they are added: each exchange sends half of the rows a lane still holds, so lane l
// ends with row l % 4's sum (as do l ± 4). Three exchanges of 4, 2 and 1 doubles instead of three
// of 1 per row; then one lane per row writes, all four rows at once.
__device__ inline double tile_row_sums(const double (&part)[kRows], int lane) {
  static_assert(kRows == 4, "two halvings, then the plain exchange");
  const bool b0 = lane & 1, b1 = lane & 2;
  // Rows b0 and b0 + 2 stay, the other two go to the partner, which keeps them.
  const double keep0 = b0 ? part[1] : part[0], keep1 = b0 ? part[3] : part[2];
  const double send0 = b0 ? part[0] : part[1], send1 = b0 ? part[2] : part[3];
  const double row_lo = keep0 + __shfl_xor_sync(kFullMask, send0, 1);  // row b0
  const double row_hi = keep1 + __shfl_xor_sync(kFullMask, send1, 1);  // row b0 + 2
  double sum = (b1 ? row_hi : row_lo) + __shfl_xor_sync(kFullMask, b1 ? row_lo : row_hi, 2);  // row lane % 4
  return sum + __shfl_xor_sync(kFullMask, sum, 4);
}

// FP8 weights in the double paths (wo_a's bf16 product) take the bit placement too when every
// row's block scale is a power of two 2^e, e in [-126, 119], or zero (a row past the end): then
// the CPU's dequantized weight w·2^e is exact in fp32, x·2^890 · w·2^-1016 = x·w·2^-126 is exact
// and never subnormal for any fp32 x, and every fma of the chunk's sum is the one over the
// dequantized weights scaled by 2^(-126-e) (rounding commutes with a power of two away from the
// subnormals), so part · 2^(e+126) is bit for bit that sum. (As in the quantized path, the e4m3
// NaN codes, absent from checkpoints, decode as 480 here.)
// (Converting each code to a float and multiplying by its scale held wo_a to 0.66 TB/s.)
constexpr double kPlacedXScale = 0x1p890;
__device__ inline bool placeable(const float (&scale)[kRows]) {
  bool ok = true;
  for (int r = 0; r < kRows; ++r) {
    const uint32_t b = __float_as_uint(scale[r]), e = b >> 23;
    ok &= b == 0 || ((b & 0x7fffff) == 0 && e >= 1 && e <= 127 + 119);
  }
  return ok;
}

// The lane's ring slot for row r of the step that uses `slot`: [slot][row][thread], so a warp's
// accesses to one slot and row are 512 contiguous bytes. Each lane reads back only what it staged
// itself, which await_async_copies makes visible to it: no barrier.
__device__ __forceinline__ uint4* ring_slot(unsigned char* smem, int slot, int r) {
  return reinterpret_cast<uint4*>(smem) + (slot * kRows + r) * (kWarps * 32) + threadIdx.x;
}

// Chunk c of a stored row of nb bytes at `row` (zeros unless ok) into the lane's slot: a cp.async
// of 16 bytes (a source size of 0 writes zeros) when the rows allow 16-byte loads (vec), else byte
// by byte with zeros past the row (odd shapes in tests; a rolled loop keeps its code and registers
// out of the streaming loop). `fallback` is any readable address, named when nothing is read.
__device__ __forceinline__ void stage_chunk(uint4* slot, const uint8_t* row, const uint8_t* fallback, int c,
                                            int nb, bool vec, bool ok) {
  if (!vec) {
    uint8_t* to = reinterpret_cast<uint8_t*>(slot);
#pragma unroll 1
    for (int b = 0; b < 16; ++b) to[b] = ok && c * 16 + b < nb ? row[c * 16 + b] : 0;
    return;
  }
  copy_async_16(slot, ok ? row + c * 16 : fallback, ok);
}

// Phase 2. Grid (row blocks, token groups of kNT); see the top for the work split. With a table,
// every token row is its own group (kNT = 1) with its own matrix.
template <int kFmt, bool kTiled, int kNT>
__global__ void __launch_bounds__(kWarps * 32, kNT == 1 ? 3 : 0) linear_kernel(GemmArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int E = chunk_elems(kFmt);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int S = a.split, G = kWarps / S, gi = warp / S, s = warp % S;
  const int n_seq = G * kRows * kNT;  // outputs of the block: (group, row, token)
  const int64_t block_row = int64_t(blockIdx.x) * G * kRows;
  const int64_t r_base = block_row + int64_t(gi) * kRows;
  const int64_t m0 = int64_t(blockIdx.y) * kNT;
  const int nt = int(min(int64_t(kNT), a.T - m0));

  // Weights are never written by a kernel, so without a table (whose row → matrix map a kernel
  // before this one may write) the first steps' chunks are staged before the previous kernel is
  // awaited: they are in flight while it finishes. Everything else waits.
  LinearView W = a.W;
  if (a.table) {
    await_previous_kernel();
    const int32_t v = a.view_of_row[m0];
    if (v < 0 || v >= a.n_views) {  // no expert: contributes nothing (as on the CPU)
      for (int64_t r = threadIdx.x; r < G * kRows; r += blockDim.x)
        if (block_row + r < a.rows) a.y[m0 * a.y_stride + block_row + r] = 0.0f;
      return;
    }
    W = a.table[v];
  }
  // Everything per row or per token row that the chunk loop needs, worked out once: the rows'
  // addresses and scale rows (a row past the end reads as zeros), the activation rows and their
  // scales. (Inside the loop, the 64-bit index arithmetic and the division by x_div were most of an
  // FP4 expert product's instructions.)
  const float* xrow[kNT];
  const float* sx_row[kNT];  // quantized: the token row's activation scales
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    const int64_t src = (m0 + min(n, nt - 1)) / a.x_div;
    xrow[n] = a.x + src * a.x_stride;
    sx_row[n] = kTiled ? a.sx + src * a.n_k128 : nullptr;
  }
  constexpr bool kScaled = kFmt == kFp8 || kFmt == kFp4;
  // Row r of the warp's four at w_first + r·nb, its scales at s_first + r·s_step (FP8: the four share
  // a 128-row scale block, as r_base is a multiple of 4).
  const int64_t nb = row_bytes(kFmt, a.K), o_first = a.row0 + min(r_base, a.rows - 1);
  const uint8_t* w_first = W.data + o_first * nb;
  const uint8_t* s_first = kScaled ? scale_row<kFmt>(W, o_first) : nullptr;
  const int64_t s_step = kFmt == kFp4 ? W.scale_cols * (W.scale_is_f32 ? 4 : 1) : 0;
  const int rows_in = int(min(int64_t(kRows), a.rows - r_base));  // rows of the four that exist

  float* contrib = reinterpret_cast<float*>(smem + kRingBytes);  // quantized: [tile][n_seq]
  double dacc[kRows][kNT] = {};                                    // double paths: this lane's partial sums

  // Step j of the warp sums chunk c_begin + (j·S + s)·32 + lane of the four rows; one commit group
  // per step (empty past the warp's last) so that a wait counts steps.
  // (Chunk indices in 32 bits: the host checks that a row's bytes and elements fit.)
  const int c_begin = int(blockIdx.z * a.part_chunks), c_end = int(min(a.n_chunks, c_begin + a.part_chunks));
  const int first = c_begin + s * 32;
  const int n_steps = first < c_end ? (c_end - first + 32 * S - 1) / (32 * S) : 0;
  auto chunk_of = [&](int j) { return first + j * 32 * S + lane; };
  auto stage = [&](int j) {
    if (j < n_steps) {
      const int c = chunk_of(j);
      const bool cv = c < c_end;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        stage_chunk(ring_slot(smem, j % kSlots, r), w_first + r * nb, w_first, c, int(nb), a.w_vec, cv && r < rows_in);
    }
    commit_async_copies();
  };
  for (int j = 0; j < kSlots - 1; ++j) stage(j);
  if (!a.table) await_previous_kernel();

  for (int j = 0; j < n_steps; ++j) {
    stage(j + kSlots - 1);
    await_async_copies<kSlots - 1>();
    const int c = chunk_of(j);
    const bool cv = c < c_end;
    uint4 w[kRows];
    float scale[kRows];
    for (int r = 0; r < kRows; ++r) {
      const bool ok = cv && r < rows_in;
      w[r] = *ring_slot(smem, j % kSlots, r);
      scale[r] = !kTiled && kScaled && ok
                     ? scale_at(s_first + r * s_step, c * E / (kFmt == kFp8 ? 128 : 32), W.scale_is_f32)
                     : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      if (n >= nt) continue;
      double part[kRows] = {};
      float int_partial[kRows];  // FP4 tiled: the tile partials from integer sums
      if constexpr (kFmt == kFp4 && kTiled) {
        fp4_tile_partials(reinterpret_cast<const uint32_t*>(xrow[n]), c, cv, w, int_partial);
      } else {
        bool placed = false;
        if constexpr (kFmt == kFp8 && !kTiled) placed = placeable(scale);
        if (placed) {
          chunk_products<kFp8, true, kPlacedXScale>(a, xrow[n], c, cv, w, scale, part);
          for (int r = 0; r < kRows; ++r) part[r] *= double(scale[r]) * 0x1p126;
        } else {
          chunk_products<kFmt, kTiled, kXScaleFor<kFmt, kTiled>>(a, xrow[n], c, cv, w, scale, part);
        }
      }
      if constexpr (kTiled && kFmt == kFp8) {
        // A 128-tile spans 8 lanes (chunks 8t … 8t+7); its first chunk decides whether it exists.
        const double p = tile_row_sums(part, lane);
        const int r = lane % kRows;
        if (lane % 8 < kRows && (c & ~int64_t(7)) < c_end && r < rows_in) {
          const int64_t t = c / 8;  // the tile, and the column of its weight scale
          const float s_x = sx_row[n][t], s_w = scale_at(s_first, t, W.scale_is_f32);  // the 4 rows' block
          contrib[t * n_seq + (gi * kRows + r) * kNT + n] = float(p * 0x1p16) * (s_x * s_w);  // §5: partial · (s_x · s_w)
        }
      } else if constexpr (kTiled) {
        for (int r = 0; r < kRows; ++r) {
          if (cv && r < rows_in) {
            const float s_x = sx_row[n][c / 4], s_w = scale_at(s_first + r * s_step, c, W.scale_is_f32);
            contrib[c * n_seq + (gi * kRows + r) * kNT + n] = (int_partial[r] * s_x) * s_w;  // §5: (partial · s_x) · s_w
          }
        }
      } else {
        for (int r = 0; r < kRows; ++r) dacc[r][n] += part[r];
      }
    }
  }

  if constexpr (!kTiled) {
    double* dpart = reinterpret_cast<double*>(smem + kRingBytes);  // [S][n_seq]
    for (int r = 0; r < kRows; ++r)
      for (int n = 0; n < kNT; ++n) {
        const double v = warp_sum(dacc[r][n]);
        if (lane == 0) dpart[s * n_seq + (gi * kRows + r) * kNT + n] = v;
      }
  }
  __syncthreads();
  for (int q = threadIdx.x; q < n_seq; q += blockDim.x) {
    const int n = q % kNT;
    const int64_t row = block_row + q / kNT;
    if (n >= nt || row >= a.rows) continue;
    float* y = a.y + (m0 + n) * a.y_stride + row;
    if constexpr (kTiled) {
      // Increasing K, a chain of dependent adds: unrolled so the shared-memory loads run ahead of
      // it (one load then one add per tile left 128 tiles of an FP4 expert row at ~35 cycles each).
      float acc = 0.0f;
#pragma unroll 8
      for (int64_t t = 0; t < a.n_tiles; ++t) acc += contrib[t * n_seq + q];
      *y = round_bf16(acc);
    } else {
      const double* dpart = reinterpret_cast<const double*>(smem + kRingBytes);
      double v = 0.0;
      for (int i = 0; i < S; ++i) v += dpart[i * n_seq + q];
      if (a.parts) a.parts[(int64_t(blockIdx.z) * a.T + m0 + n) * a.rows + row] = v;
      else *y = a.round_out ? round_bf16(float(v)) : float(v);
    }
  }
  if (!a.parts) return;
  // K split: the last part of this output block to arrive folds all of them.
  __shared__ bool last;
  __threadfence();  // this part's sums are visible before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* arrived = a.arrivals + blockIdx.y * gridDim.x + blockIdx.x;
    last = atomicAdd(arrived, 1u) == gridDim.z - 1;
    if (last) *arrived = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int q = threadIdx.x; q < n_seq; q += blockDim.x) {
    const int n = q % kNT;
    const int64_t row = block_row + q / kNT;
    if (n >= nt || row >= a.rows) continue;
    double v = 0.0;
#pragma unroll 4
    for (int64_t p = 0; p < gridDim.z; ++p) v += __ldcg(a.parts + (p * a.T + m0 + n) * a.rows + row);
    a.y[(m0 + n) * a.y_stride + row] = a.round_out ? round_bf16(float(v)) : float(v);
  }
}

// embed: grid (token, slice of kEmbedThreads of D), one element per thread, copied to every
// stream. (One block per token striding over D took 11 µs per decoded token on an H200.)
constexpr int kEmbedThreads = 256;
// An id outside the table raises kBadToken (reported at the next to_host) and embeds zeros.
__global__ void embed_kernel(LinearView table, const int32_t* tokens, int64_t hc, float* X, DeviceFlags* flags) {
  await_previous_kernel();
  const int64_t t = blockIdx.x, D = table.in, d = int64_t(blockIdx.y) * kEmbedThreads + threadIdx.x;
  if (d >= D) return;
  const int32_t id = tokens[t];
  const bool known = id >= 0 && id < table.out;
  if (!known && d == 0) {
    flags->bad_token = id;
    atomicOr(&flags->raised, kBadToken);
  }
  const float v = known ? dequantized(table, id, d) : 0.0f;
  for (int64_t h = 0; h < hc; ++h) X[(t * hc + h) * D + d] = v;
}

using LinearKernel = void (*)(GemmArgs);

template <int kFmt, bool kTiled>
LinearKernel linear_kernel_for_tokens(int nt) {
  switch (nt) {
    case 1: return linear_kernel<kFmt, kTiled, 1>;
    case 2: return linear_kernel<kFmt, kTiled, 2>;
    case 4: return linear_kernel<kFmt, kTiled, 4>;
    default: return linear_kernel<kFmt, kTiled, kMaxTokens>;
  }
}

// The phase-2 kernel for a weight format, the quantized path or not, and nt token rows per group.
LinearKernel linear_kernel_for(int format, bool tiled, int nt) {
  switch (format) {
    case kFp8: return tiled ? linear_kernel_for_tokens<kFp8, true>(nt) : linear_kernel_for_tokens<kFp8, false>(nt);
    case kFp4: return tiled ? linear_kernel_for_tokens<kFp4, true>(nt) : linear_kernel_for_tokens<kFp4, false>(nt);
    case kBf16: return linear_kernel_for_tokens<kBf16, false>(nt);
    default: return linear_kernel_for_tokens<kF32, false>(nt);
  }
}

// Whether r takes the FP64 tensor-core kernels (gemm_dmma.cu) rather than the decode kernel: many
// rows (per expert with a table), or FP8 rows that do not start at a multiple of 4, which the decode
// kernel reads 4 at a time under one 128-row scale block (every product of the model starts at one;
// the tensor-core kernel reads each row's scale).
bool needs_dmma(const GemmRequest& r) {
  return (r.table ? r.T >= kDmmaMinRowsPerExpert * r.n_views : r.T >= kDmmaMinRows) ||
         (r.W.format == kFp8 && r.row0 % 4 != 0);
}

}  // namespace

bool CudaBackend::on_tc_gemv(const GemmRequest& r) {
  const bool tiled = deepseek() && r.compute == Compute::quantized;
  return numerics() == Numerics::deepseek_tc && tiled && !(tensor_cores_ && tensor_cores_->handles(r)) &&
         !needs_dmma(r) && tc_gemv_handles(r);
}

void CudaBackend::gemm(const GemmRequest& r, const SwigluUp* swiglu) {
  if (r.T == 0 || r.rows == 0) return;
  const LinearView& W = r.W;
  const int64_t K = W.in;
  const bool tiled = deepseek() && r.compute == Compute::quantized;
  DSV4_CUDA_REQUIRE(!tiled || W.format == kFp8 || W.format == kFp4, "linear: quantized compute needs FP8/FP4 weights");

  const bool dmma = needs_dmma(r);
  // deepseek-tc: the dense FP8 and bf16 products of many rows go to the tensor cores instead.
  const bool tensor_cores = tensor_cores_ && tensor_cores_->handles(r);
  if (tensor_cores && !tiled) {
    quantized_x_ = {};  // as after every product without quantization (below)
    tensor_cores_->run_unquantized(r, memory_);
    return;
  }
  // deepseek-tc: the bf16 products of fewer rows on the bf16 mma.sync (gemv_tc.cu).
  if (numerics() == Numerics::deepseek_tc && !tiled && tc_gemv_bf16_handles(r)) {
    quantized_x_ = {};
    tc_gemv_bf16(r, rounds_output(r.compute), sm_count_, stream_);
    return;
  }
  // deepseek-tc: the routed FP4 experts of many rows on the FP8 tensor cores, from the activations'
  // e4m3 codes (gemm_experts_tc.cu).
  const bool tc_experts = numerics() == Numerics::deepseek_tc && tiled && dmma && fits_tensor_core_experts(r);
  // deepseek-tc: the FP8 products of a few token rows, and the routed FP4 experts of a few rows, on
  // the tensor cores' mma.sync (gemv_tc.cu).
  const bool tc_few = on_tc_gemv(r);
  DSV4_CUDA_REQUIRE(!swiglu || tc_few, "linear: a SwiGLU joined to a product that tc_gemv does not take");
  const bool round_out = deepseek() && rounds_output(r.compute);
  const int64_t n_src = r.source_rows(), n_k128 = (K + 127) / 128;
  // One scratch buffer, in parts that are live together: the quantized activations, their scales
  // (written in every form; the bf16 one has them folded in) and the grouping of rows by expert of
  // the tensor-core kernels (int32, as wide as a float). FP4 weights on the exact paths read the
  // activations as integer byte planes (see the top), on either kernel.
  const bool planes = tiled && W.format == kFp4 && !tc_experts && !tc_few;
  const QuantizedForm form = planes                       ? QuantizedForm::planes
                             : tc_experts   ? QuantizedForm::fragment_codes
                             : tensor_cores || tc_few ? QuantizedForm::codes
                                            : QuantizedForm::values;
  const int64_t plane_words = planes ? (K + 31) / 32 * 24 : 0;
  const int64_t row_floats = planes ? plane_words
                             : form != QuantizedForm::values ? (K + 3) / 4  // 4 bytes a float
                                                            : K;
  const size_t n_qx = tiled ? (size_t(n_src * row_floats) + 3) / 4 * 4 : 0;  // scales 16-byte aligned
  const size_t n_sx = tiled ? size_t(n_src * n_k128) : 0;
  const size_t n_grouping = dmma && !tensor_cores ? size_t(dmma_scratch_ints(r, tiled, sm_count_)) : 0;

  // The decode kernel's shape (see the top): nt token rows per group (one with a table: each row
  // has its own matrix); S warps per group of 4 rows, the fewest that still give every SM two
  // blocks (each lane then streams as many steps through its ring as it can) and no more than a
  // row's chunks fill; and P parts of K when that is the only way to fill the GPU (double paths
  // without a table; each lane keeps at least one chunk).
  const int64_t nb = row_bytes(W.format, K), n_chunks = (nb + 15) / 16;
  const int nt = r.table ? 1 : r.T <= 1 ? 1 : r.T <= 2 ? 2 : r.T <= 4 ? 4 : kMaxTokens;
  const int64_t groups = (r.T + nt - 1) / nt;
  auto row_blocks_for = [&](int s) {
    const int64_t per_block = int64_t(kWarps / s) * kRows;
    return (r.rows + per_block - 1) / per_block;
  };
  int split = 1;
  while (split < kWarps && int64_t(split) * 32 < n_chunks && groups * row_blocks_for(split) < 2 * sm_count_) split *= 2;
  const int64_t rows_per_block = int64_t(kWarps / split) * kRows, row_blocks = row_blocks_for(split);
  int64_t P = 1;
  if (!dmma && !tiled && !r.table)
    P = std::clamp<int64_t>(2 * sm_count_ / (groups * row_blocks), 1, std::max<int64_t>(1, n_chunks / (32 * split)));
  const size_t n_parts = P > 1 ? size_t(2 * P * r.T * r.rows) : 0;  // doubles
  float* scratch =
      static_cast<float*>(gemm_scratch_.get(memory_, (n_qx + n_sx + std::max(n_grouping, n_parts)) * sizeof(float)));
  GemmRequest prepared = r;  // quantized: x becomes the e4m3 activations in scratch
  const float* sx = nullptr;
  const QuantizedX quantized = tiled ? QuantizedX{r.x, r.x_stride, n_src, K, form, scratch} : QuantizedX{};
  const bool reuse = tiled && r.x_as_before && quantized == quantized_x_;
  quantized_x_ = quantized;  // a GEMM without quantization may overwrite the scratch (K parts)
  if (tiled && !reuse) {
    launch(act_quant_kernel, dim3(unsigned(n_src), unsigned((n_k128 + kQuantWarps - 1) / kQuantWarps)), kQuantWarps * 32,
           0, stream_, r.x, r.x_stride, K, n_k128, form, static_cast<void*>(scratch), plane_words, scratch + n_qx);
    DSV4_CUDA_LAUNCHED("linear (activation quantization)");
  }
  if (tensor_cores) {
    if (uses_tensor_core_fp8(r)) tensor_core_fp8(r, reinterpret_cast<const uint8_t*>(scratch), scratch + n_qx);
    else tensor_cores_->run_quantized(r, reinterpret_cast<const uint8_t*>(scratch), scratch + n_qx, stream_);
    return;
  }
  if (tc_few) {
    tc_gemv(r, swiglu, reinterpret_cast<const uint8_t*>(scratch), scratch + n_qx, sm_count_, stream_);
    return;
  }
  if (tc_experts) {
    tensor_core_experts(r, reinterpret_cast<const uint8_t*>(scratch), scratch + n_qx,
                        reinterpret_cast<int32_t*>(scratch + n_qx + n_sx));
    return;
  }
  if (tiled) prepared.x = scratch, prepared.x_stride = planes ? plane_words : K, sx = scratch + n_qx;
  if (dmma) {
    dmma_gemm(prepared, sx, round_out, reinterpret_cast<int32_t*>(scratch + n_qx + n_sx), sm_count_, stream_);
    return;
  }

  GemmArgs a{};
  a.W = W, a.table = r.table, a.view_of_row = r.view_of_row, a.n_views = r.n_views;
  a.x = prepared.x, a.x_stride = prepared.x_stride, a.x_div = r.x_div, a.sx = sx, a.n_k128 = n_k128, a.K = K, a.T = r.T;
  a.y = r.y, a.y_stride = r.y_stride, a.row0 = r.row0, a.rows = r.rows;
  a.round_out = round_out;
  a.w_vec = nb % 16 == 0;  // device weights start 256-byte aligned (cudaMalloc)
  a.n_chunks = n_chunks;
  a.n_tiles = tiled ? (K + (W.format == kFp4 ? 31 : 127)) / (W.format == kFp4 ? 32 : 128) : 0;
  a.split = split;
  a.x_vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % 4 == 0;
  a.part_chunks = (n_chunks + P - 1) / P;
  a.parts = P > 1 ? reinterpret_cast<double*>(scratch + n_qx + n_sx) : nullptr;
  a.arrivals = part_arrivals_;

  const int64_t n_seq = rows_per_block * nt;
  const size_t smem =
      kRingBytes + (tiled ? size_t(a.n_tiles * n_seq) * sizeof(float) : size_t(split * n_seq) * sizeof(double));
  // (The kernel indexes a row's chunks, bytes and elements in 32 bits.)
  DSV4_CUDA_REQUIRE(groups < 65536 && row_blocks < (int64_t(1) << 31) && nb < (int64_t(1) << 30) &&
                        K < (int64_t(1) << 30),
                    "linear: ", r.T, " tokens × ", r.rows, " rows × K ", K, " exceed the launch limits");
  const LinearKernel kernel = linear_kernel_for(W.format, tiled, nt);
  allow_shared_memory(reinterpret_cast<const void*>(kernel), smem, "linear");
  launch(kernel, dim3(unsigned(row_blocks), unsigned(groups), unsigned(P)), kWarps * 32, smem, stream_, a);
  DSV4_CUDA_LAUNCHED("linear");
}

void CudaBackend::require_quantizable(const model::Linear& W, Compute compute) const {
  DSV4_CUDA_REQUIRE(!(deepseek() && compute == Compute::quantized) || W.format == model::WeightFormat::fp8 ||
                        W.format == model::WeightFormat::fp4,
                    W.name, ": quantized compute needs FP8/FP4 weights, got ", to_string(W.format));
}

void CudaBackend::linear(const model::Linear& W, Compute compute, const float* x, int64_t x_stride, int64_t T,
                         float* y, int64_t y_stride, int64_t row0, int64_t rows) {
  Timed timed(*this, "linear", W.name, double(W.bytes()) * double(rows) / double(W.out),
              2.0 * double(T) * double(rows) * double(W.in));
  DSV4_CUDA_REQUIRE(row0 >= 0 && row0 + rows <= W.out, W.name, ": rows [", row0, ", ", row0 + rows, ") of ", W.out);
  require_quantizable(W, compute);
  GemmRequest r;
  r.W = device_linear(W);
  r.x = x, r.x_stride = x_stride, r.T = T;
  r.y = y, r.y_stride = y_stride, r.row0 = row0, r.rows = rows;
  r.compute = compute;
  gemm(r);
}

// The grouped output projection in one launch of the decode kernel: x read as T·groups rows of
// W.in (row t·groups + g is token t's slice for group g), row m taking view m mod groups of W (its
// rows [g·R, (g+1)·R)), so the T·groups output rows of R are exactly y's [T, W.out]. (Eight
// launches of 4 MB each took 10 µs apiece at V4-Flash shapes on an H200.) With 4 or more tokens
// the products go to the FP64 tensor cores, one group at a time (the definition), as do FP8
// groups that would split a 128-row scale block.
void CudaBackend::grouped_linear(const model::Linear& W, Compute compute, const float* x, int64_t T, int64_t groups,
                                 float* y) {
  DSV4_CUDA_REQUIRE(groups > 0 && W.out % groups == 0, W.name, ": ", W.out, " rows do not split into ", groups,
                    " groups");
  const int64_t R = W.out / groups;
  if (T >= kDmmaMinRowsPerExpert || (W.format == model::WeightFormat::fp8 && R % 128 != 0))
    return Backend::grouped_linear(W, compute, x, T, groups, y);
  Timed timed(*this, "linear", W.name, double(W.bytes()), 2.0 * double(T) * double(W.out) * double(W.in));
  require_quantizable(W, compute);
  GemmRequest r;
  r.W = device_linear(W);
  r.table = device_group_table(W, groups), r.view_of_row = cyclic_ids(groups, T * groups), r.n_views = groups;
  r.x = x, r.x_stride = W.in, r.T = T * groups;
  r.y = y, r.y_stride = R, r.rows = R;
  r.compute = compute;
  gemm(r);
}

// Token ids are checked on the device, without a wait: an id outside the vocabulary is the error
// of the next to_host (the CPU backend raises it at once; the engine checks ids before a step).
void CudaBackend::embed(const model::Linear& table, const int32_t* tokens, int64_t T, int64_t hc, float* X) {
  Timed timed(*this, "embed");
  if (T == 0) return;
  DSV4_CUDA_REQUIRE(T < (int64_t(1) << 31) && table.in / kEmbedThreads < 65535, "embed: ", T, " tokens of ", table.in);
  launch(embed_kernel, dim3(unsigned(T), unsigned((table.in + kEmbedThreads - 1) / kEmbedThreads)), kEmbedThreads,
         0, stream_, device_linear(table), tokens, hc, X, flags_);
  DSV4_CUDA_LAUNCHED("embed");
}

}  // namespace dsv4::cuda
