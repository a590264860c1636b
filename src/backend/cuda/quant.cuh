// Device twins of the per-element quantization steps of cpu/quant.h (architecture.md §3.0). The
// block's absolute maximum comes from the caller's reduction (fmax: exact in any order).
#pragma once

#include <cuda_runtime.h>

#include "core/formats.h"

namespace dsv4::cuda {

// ActQuantFP8 of one element given its block's scale exponent e: e4m3(clamp(x / 2^e, ±448)).
__device__ inline float fp8_quantize(float x, int e) {
  const float v = fminf(fmaxf(ldexpf(x, -e), -kE4m3Max), kE4m3Max);
  return round_e4m3(v);
}

// The FP8 round trip of one element: bf16(e4m3(x / 2^e) · 2^e).
__device__ inline float fp8_sim(float x, int e) { return round_bf16(ldexpf(fp8_quantize(x, e), e)); }

// FP4Sim of one element given its 32-block's exponent: bf16(e2m1(clamp(x / 2^e, ±6)) · 2^e).
__device__ inline float fp4_sim(float x, int e) {
  const float v = fminf(fmaxf(ldexpf(x, -e), -kE2m1Max), kE2m1Max);
  return round_bf16(ldexpf(round_e2m1(v), e));
}

}  // namespace dsv4::cuda
