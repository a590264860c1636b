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

// Value i of a stored row.
DSV4_HD inline float row_value(const RowFormat& f, const float* row, int64_t i) {
  if (f.kind == RowFormat::f32) return row[i];
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row);
  if (i >= f.quant_dims) {
    const uint8_t* tail = bytes + f.tail_offset() + 2 * (i - f.quant_dims);
    return bf16_to_f32(uint16_t(tail[0] | (tail[1] << 8)));
  }
  const float scale = e8m0_to_f32(bytes[f.scale_offset() + i / f.block()]);
  if (f.kind == RowFormat::fp4) return e2m1_to_f32(uint8_t((bytes[i / 2] >> (4 * (i % 2))) & 0xf)) * scale;
  return e4m3_to_f32(bytes[i]) * scale;
}

// Writes the stored form of the fp32 row x to `stored` (f.stride floats; padding zero, so equal
// rows are equal byte strings). Returns false when some value does not come back bit for bit.
DSV4_HD inline bool pack_row(const RowFormat& f, const float* x, float* stored) {
  if (f.kind == RowFormat::f32) {
    for (int64_t i = 0; i < f.width; ++i) stored[i] = x[i];
    return true;
  }
  uint8_t* bytes = reinterpret_cast<uint8_t*>(stored);
  for (int64_t i = 0; i < int64_t(f.stride) * 4; ++i) bytes[i] = 0;
  const bool fp4 = f.kind == RowFormat::fp4;
  for (int64_t b0 = 0; b0 < f.quant_dims; b0 += f.block()) {
    const int64_t n = f.quant_dims - b0 < f.block() ? f.quant_dims - b0 : f.block();
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[b0 + i]));
    const int e = fp4 ? fp4_scale_exp(amax) : fp8_scale_exp(amax);
    bytes[f.scale_offset() + b0 / f.block()] = uint8_t(e + 127);
    for (int64_t i = b0; i < b0 + n; ++i) {
      const float v = std::ldexp(x[i], -e);
      if (fp4)
        bytes[i / 2] = uint8_t(bytes[i / 2] | (f32_to_e2m1(std::fmin(std::fmax(v, -kE2m1Max), kE2m1Max)) << (4 * (i % 2))));
      else
        bytes[i] = f32_to_e4m3(std::fmin(std::fmax(v, -kE4m3Max), kE4m3Max));
    }
  }
  for (int64_t i = f.quant_dims; i < f.width; ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    bytes[f.tail_offset() + 2 * (i - f.quant_dims)] = uint8_t(h & 0xff);
    bytes[f.tail_offset() + 2 * (i - f.quant_dims) + 1] = uint8_t(h >> 8);
  }
  bool exact = true;
  for (int64_t i = 0; i < f.width; ++i) exact &= f32_bits(row_value(f, stored, i)) == f32_bits(x[i]);
  return exact;
}

}  // namespace dsv4
