// How a sequence stores its compressed attention rows and indexer keys (issue 6: the compact
// state layout), and the exact conversions between the stored and the fp32 form.
//
// In deepseek numerics every stored value is already a low-precision number kept in a float:
//   attention rows: dims [0, quant_dims) are e4m3 · 2^e with one e per 64-block (the KV FP8
//     simulation), the rope dims after them are bf16;
//   indexer keys: every dim is e2m1 · 2^e with one e per 32-block (Hadamard + FP4 simulation).
// The compact layout keeps exactly those numbers: for V4, 448 e4m3 bytes + 7 E8M0 exponents + a
// pad byte + 64 bf16 = 584 B per attention row (2 048 B as fp32) and 64 B of nibbles + 4 E8M0
// = 68 B per indexer key (512 B as fp32). Stored rows live in float buffers (a row is padded to
// whole floats), so state memory, copies and snapshots stay float-typed.
//
// Packing recomputes each block's exponent with the simulation's own rule from the simulated
// values. Their block maximum is at most the one the simulation saw (rounded to the grid), so the
// exponent found is the same or smaller, and a smaller one only shifts every code up by a power
// of two, which e4m3/e2m1 represent exactly. pack_row reports whether the round trip is exact, so
// a row that was not simulated (plain numerics, a bug) is an error, never a silently changed value.
#pragma once

#include <cstdint>
#include <string>

#include "core/formats.h"

namespace dsv4 {

enum class StateLayout { f32, compact };
const char* to_string(StateLayout layout);
StateLayout parse_state_layout(const std::string& name);  // "f32" | "compact"

struct RowFormat {
  enum Kind : int32_t {
    f32,       // width floats
    fp8_bf16,  // attention row: quant_dims e4m3 codes, their 64-block E8M0 exponents, a pad byte
               // to an even offset, then width − quant_dims bf16 values
    fp4,       // indexer key: width e2m1 nibbles (element 2i in the low nibble), 32-block E8M0
  };
  static constexpr int kFp8Block = 64, kFp4Block = 32;

  Kind kind = f32;
  int32_t width = 0;       // values per row
  int32_t quant_dims = 0;  // the leading dims held as codes with block exponents
  int32_t stride = 0;      // floats per stored row

  DSV4_HD static RowFormat plain(int32_t width) { return {f32, width, 0, width}; }
  static RowFormat attention(StateLayout layout, int32_t width, int32_t quant_dims) {
    if (layout == StateLayout::f32) return plain(width);
    RowFormat f{fp8_bf16, width, quant_dims, 0};
    f.stride = whole_floats(f.tail_offset() + 2 * (width - quant_dims));
    return f;
  }
  static RowFormat index_key(StateLayout layout, int32_t width) {
    if (layout == StateLayout::f32) return plain(width);
    RowFormat f{fp4, width, width, 0};
    f.stride = whole_floats(f.scale_offset() + blocks(width, kFp4Block));
    return f;
  }
  DSV4_HD int32_t block() const { return kind == fp4 ? kFp4Block : kFp8Block; }
  // Byte offsets of the block exponents and (fp8_bf16) of the bf16 tail.
  DSV4_HD int32_t scale_offset() const { return kind == fp4 ? (width + 1) / 2 : quant_dims; }
  DSV4_HD int32_t tail_offset() const { return even(quant_dims + blocks(quant_dims, kFp8Block)); }
  int64_t bytes() const { return int64_t(stride) * 4; }

  DSV4_HD static constexpr int32_t blocks(int32_t n, int32_t block) { return (n + block - 1) / block; }
  DSV4_HD static constexpr int32_t even(int32_t n) { return n + (n & 1); }
  DSV4_HD static constexpr int32_t whole_floats(int32_t bytes) { return (bytes + 3) / 4; }
};

// Value i of a stored row of kind K: the kernels' inner loop, so K is a compile-time constant,
// the index 32-bit and the block divisions shifts.
template <RowFormat::Kind K>
DSV4_HD inline float row_value_of(const RowFormat& f, const float* row, int32_t i) {
  static_assert(RowFormat::kFp8Block == 64 && RowFormat::kFp4Block == 32);
  if constexpr (K == RowFormat::f32) {
    return row[i];
  } else {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row);
    if constexpr (K == RowFormat::fp4) {
      const uint8_t code = uint8_t((bytes[i >> 1] >> ((i & 1) * 4)) & 0xf);
      return e2m1_to_f32(code) * e8m0_to_f32(bytes[f.scale_offset() + (i >> 5)]);
    } else {
      if (i >= f.quant_dims)  // the bf16 tail starts at an even offset
        return bf16_to_f32(reinterpret_cast<const uint16_t*>(bytes + f.tail_offset())[i - f.quant_dims]);
      return e4m3_to_f32(bytes[i]) * e8m0_to_f32(bytes[f.quant_dims + (i >> 6)]);
    }
  }
}

// Values d0 .. d0+3 of a stored row of kind K (d0 and quant_dims multiples of 4: a group never
// straddles the e4m3/bf16 boundary or a block). One 4-byte load of e4m3 codes, one 2-byte load
// of e2m1 nibbles, or one 16-byte load of floats (on the GPU; rows 16-byte aligned).
template <RowFormat::Kind K>
DSV4_HD inline void row_values4(const RowFormat& f, const float* row, int32_t d0, float out[4]) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row);
  if constexpr (K == RowFormat::f32) {
#ifdef __CUDA_ARCH__
    const float4 v = *reinterpret_cast<const float4*>(row + d0);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
#else
    for (int c = 0; c < 4; ++c) out[c] = row[d0 + c];
#endif
  } else if constexpr (K == RowFormat::fp4) {
    const uint32_t codes = *reinterpret_cast<const uint16_t*>(bytes + (d0 >> 1));
    const float scale = e8m0_to_f32(bytes[f.scale_offset() + (d0 >> 5)]);
    for (int c = 0; c < 4; ++c) out[c] = e2m1_to_f32(uint8_t((codes >> (4 * c)) & 0xf)) * scale;
  } else if (d0 >= f.quant_dims) {
    const uint16_t* tail = reinterpret_cast<const uint16_t*>(bytes + f.tail_offset()) + (d0 - f.quant_dims);
    for (int c = 0; c < 4; ++c) out[c] = bf16_to_f32(tail[c]);
  } else {
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(bytes + d0);
    const float scale = e8m0_to_f32(bytes[f.quant_dims + (d0 >> 6)]);
    for (int c = 0; c < 4; ++c) out[c] = e4m3_to_f32(uint8_t(codes >> (8 * c))) * scale;
  }
}

// Value i of a stored row of any kind.
DSV4_HD inline float row_value(const RowFormat& f, const float* row, int64_t i) {
  switch (f.kind) {
    case RowFormat::fp8_bf16: return row_value_of<RowFormat::fp8_bf16>(f, row, int32_t(i));
    case RowFormat::fp4: return row_value_of<RowFormat::fp4>(f, row, int32_t(i));
    default: return row_value_of<RowFormat::f32>(f, row, int32_t(i));
  }
}

// pack_row in independent parts (a GPU thread each): one per quantized block (its codes and
// exponent), and a last one for the bf16 tail and the padding bytes.
DSV4_HD inline int32_t pack_parts(const RowFormat& f) {
  return f.kind == RowFormat::f32 ? 1 : RowFormat::blocks(f.quant_dims, f.block()) + 1;
}

// Part p of pack_row; returns whether its values come back bit for bit. Each value is checked as
// it is encoded, from its code (what row_value would read back): reading the stored bytes again
// made each GPU thread wait on its own global stores, 32 times in a row.
DSV4_HD inline bool pack_row_part(const RowFormat& f, const float* x, float* stored, int32_t p) {
  if (f.kind == RowFormat::f32) {
    for (int32_t i = 0; i < f.width; ++i) stored[i] = x[i];
    return true;
  }
  uint8_t* bytes = reinterpret_cast<uint8_t*>(stored);
  const bool fp4 = f.kind == RowFormat::fp4;
  const int32_t b0 = p * f.block();
  bool exact = true;
  if (b0 < f.quant_dims) {  // a quantized block
    const int32_t end = b0 + f.block() < f.quant_dims ? b0 + f.block() : f.quant_dims;
    float amax = 0.0f;
    for (int32_t i = b0; i < end; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const int e = fp4 ? fp4_scale_exp(amax) : fp8_scale_exp(amax);
    bytes[f.scale_offset() + p] = uint8_t(e + 127);
    const float scale = e8m0_to_f32(uint8_t(e + 127));
    auto code = [&](int32_t i) {
      const float v = std::ldexp(x[i], -e);
      const uint8_t c = fp4 ? f32_to_e2m1(std::fmin(std::fmax(v, -kE2m1Max), kE2m1Max))
                            : f32_to_e4m3(std::fmin(std::fmax(v, -kE4m3Max), kE4m3Max));
      exact &= f32_bits((fp4 ? e2m1_to_f32(c) : e4m3_to_f32(c)) * scale) == f32_bits(x[i]);
      return c;
    };
    for (int32_t i = b0; i < end; i += fp4 ? 2 : 1)  // an FP4 block covers whole bytes (block 32 is even)
      bytes[fp4 ? i / 2 : i] = fp4 ? uint8_t(code(i) | (i + 1 < end ? code(i + 1) << 4 : 0)) : code(i);
  } else {  // the bf16 tail, then zero padding so equal rows are equal byte strings
    for (int32_t i = f.quant_dims; i < f.width; ++i) {
      const uint16_t h = f32_to_bf16(x[i]);
      exact &= f32_bits(bf16_to_f32(h)) == f32_bits(x[i]);
      bytes[f.tail_offset() + 2 * (i - f.quant_dims)] = uint8_t(h & 0xff);
      bytes[f.tail_offset() + 2 * (i - f.quant_dims) + 1] = uint8_t(h >> 8);
    }
    const int32_t scales_end = f.scale_offset() + RowFormat::blocks(f.quant_dims, f.block());
    const int32_t used = fp4 ? scales_end : f.tail_offset() + 2 * (f.width - f.quant_dims);
    if (!fp4 && f.tail_offset() > scales_end) bytes[scales_end] = 0;
    for (int32_t i = used; i < f.stride * 4; ++i) bytes[i] = 0;
  }
  return exact;
}

// Writes the stored form of the fp32 row x to `stored` (f.stride floats). Returns false when some
// value does not come back bit for bit.
DSV4_HD inline bool pack_row(const RowFormat& f, const float* x, float* stored) {
  bool exact = true;
  for (int32_t p = 0; p < pack_parts(f); ++p) exact &= pack_row_part(f, x, stored, p);
  return exact;
}

}  // namespace dsv4
