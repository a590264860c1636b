// One element of a weight matrix on the device, read in its checkpoint format (architecture.md
// §2.2): the stored value, its block scale, and the dequantized product the CPU's decode_row
// computes. Shared by every GEMM kernel. kFormat (a model::WeightFormat as int) lets a kernel
// templated on the format drop the switch; the default reads W.format at run time.
#pragma once

#include "backend/cuda/cuda_backend.h"
#include "core/formats.h"

namespace dsv4::cuda {

constexpr int kFp8 = int(model::WeightFormat::fp8), kFp4 = int(model::WeightFormat::fp4),
              kBf16 = int(model::WeightFormat::bf16), kF32 = int(model::WeightFormat::f32);
constexpr int kRuntimeFormat = -1;

// Bytes of one stored row of K weights.
__host__ __device__ inline int64_t row_bytes(int format, int64_t K) {
  return format == kFp8 ? K : format == kFp4 ? K / 2 : format == kBf16 ? 2 * K : 4 * K;
}

// The stored value of W[o, i] without its block scale (e4m3 / e2m1 / bf16 / f32).
template <int kFormat = kRuntimeFormat>
__device__ __forceinline__ float stored_value(const LinearView& W, int64_t o, int64_t i) {
  switch (kFormat == kRuntimeFormat ? W.format : kFormat) {
    case kFp8: return e4m3_to_f32(W.data[o * W.in + i]);
    case kFp4: {
      const uint8_t byte = W.data[o * (W.in / 2) + i / 2];
      return e2m1_to_f32((i & 1) ? byte >> 4 : byte & 0xf);  // low nibble = even element (§2.2)
    }
    case kBf16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(W.data)[o * W.in + i]);
    default: return reinterpret_cast<const float*>(W.data)[o * W.in + i];
  }
}

// The block scales of stored row o of W: for FP8 the scale row of its 128-row block, for FP4 its own
// (f32 values when W.scale_is_f32, else E8M0 bytes). A kernel that reads a row chunk by chunk works
// this out once.
template <int kFormat = kRuntimeFormat>
__device__ __forceinline__ const uint8_t* scale_row(const LinearView& W, int64_t o) {
  const bool fp8 = (kFormat == kRuntimeFormat ? W.format : kFormat) == kFp8;
  return W.scale + (fp8 ? o / 128 : o) * W.scale_cols * (W.scale_is_f32 ? 4 : 1);
}

// Scale `col` of a scale row (FP8: of elements [128·col, 128·col + 128); FP4: [32·col, 32·col + 32)).
__device__ __forceinline__ float scale_at(const uint8_t* row, int64_t col, bool f32) {
  return f32 ? reinterpret_cast<const float*>(row)[col] : e8m0_to_f32(row[col]);
}

// The scale of the block holding W[o, i] (FP8: 128×128 blocks; FP4: 1×32).
template <int kFormat = kRuntimeFormat>
__device__ __forceinline__ float block_scale(const LinearView& W, int64_t o, int64_t i) {
  const bool fp8 = (kFormat == kRuntimeFormat ? W.format : kFormat) == kFp8;
  return scale_at(scale_row<kFormat>(W, o), fp8 ? i / 128 : i / 32, W.scale_is_f32);
}

// The dequantized weight, as the CPU's decode_row(scaled = true): value · scale in fp32.
template <int kFormat = kRuntimeFormat>
__device__ __forceinline__ float dequantized(const LinearView& W, int64_t o, int64_t i) {
  const int format = kFormat == kRuntimeFormat ? W.format : kFormat;
  const float v = stored_value<kFormat>(W, o, i);
  return (format == kFp8 || format == kFp4) ? v * block_scale<kFormat>(W, o, i) : v;
}

// kWords 32-bit words of a stored row from byte `first` on: 16-byte loads (one 8-byte load for two
// words) when vec (the row's bytes a multiple of 16, the data 16-byte aligned, the words inside the
// row), else byte by byte with zeros from byte `end` on (the row's bytes; 0 for an absent row).
template <int kWords>
__device__ __forceinline__ void row_words(const uint8_t* row, int64_t first, int64_t end, bool vec,
                                          uint32_t (&w)[kWords]) {
  static_assert(kWords == 2 || kWords % 4 == 0, "whole 8- or 16-byte loads");
  const uint8_t* p = row + first;
  if (vec) {
    if constexpr (kWords == 2) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = v.x, w[1] = v.y;
    } else {
#pragma unroll
      for (int q = 0; q < kWords / 4; ++q) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + q);
        w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
      }
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < kWords; ++q) w[q] = 0;
#pragma unroll
  for (int b = 0; b < 4 * kWords; ++b)
    if (first + b < end) w[b / 4] |= uint32_t(p[b]) << (8 * (b % 4));
}

// Chunk c (16 bytes) of a stored row of nb bytes at `row` (see row_words; vec: the rows allow
// 16-byte loads).
__device__ __forceinline__ uint4 row_chunk(const uint8_t* row, int64_t c, int64_t nb, bool vec) {
  uint32_t w[4];
  row_words(row, c * 16, nb, vec, w);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Chunk c of stored row o of W, whose rows hold K elements.
__device__ inline uint4 row_chunk(const LinearView& W, int64_t o, int64_t c, int64_t K, bool vec) {
  const int64_t nb = row_bytes(W.format, K);
  return row_chunk(W.data + o * nb, c, nb, vec);
}

}  // namespace dsv4::cuda
