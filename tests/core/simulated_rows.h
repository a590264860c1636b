// Rows as the deepseek numerics store them, for tests of the compact state layout
// (core/row_format.h): the quantized dims through the simulation's own FP8 (attention) or FP4
// (indexer keys) quantizers, the rest rounded to bf16. Shared by the round-trip tests and the
// CUDA twins that read packed rows.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cpu/quant.h"
#include "core/formats.h"
#include "core/row_format.h"

namespace dsv4::test {

// Makes `rows` rows of f.width values at x storable in f, in place.
inline void simulate_rows(const RowFormat& f, float* x, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * f.width;
    for (int32_t b0 = 0; b0 < f.quant_dims; b0 += f.block()) {
      const int64_t n = std::min(f.block(), f.quant_dims - b0);
      if (f.kind == RowFormat::fp4)
        cpu::fp4_sim_block(row + b0, n);
      else
        cpu::fp8_sim_block(row + b0, n);
    }
    for (int32_t i = f.quant_dims; i < f.width; ++i) row[i] = round_bf16(row[i]);
  }
}

}  // namespace dsv4::test
