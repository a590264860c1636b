// Quantization steps of the reference numerics (architecture.md §3.0, §5), on one block of a row.
// Shared by the CPU GEMM (activation quantization), the KV FP8 simulation and the indexer.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/formats.h"

namespace dsv4::cpu {

// ActQuantFP8 of one block: q[i] = e4m3(x[i] / 2^e) and returns e, the block's scale exponent.
inline int quantize_fp8_block(const float* x, int64_t n, float* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const int e = fp8_scale_exp(amax);
  for (int64_t i = 0; i < n; ++i) {
    float v = std::ldexp(x[i], -e);
    v = std::fmin(std::fmax(v, -kE4m3Max), kE4m3Max);
    q[i] = round_e4m3(v);
  }
  return e;
}

// The FP8 round trip in place: x ← bf16(e4m3(x / s) · s).
inline void fp8_sim_block(float* x, int64_t n) {
  const int e = quantize_fp8_block(x, n, x);
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(std::ldexp(x[i], e));
}

// FP4Sim in place: x ← bf16(e2m1(x / s) · s), block of 32 (§3.0).
inline void fp4_sim_block(float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const int e = fp4_scale_exp(amax);
  for (int64_t i = 0; i < n; ++i) {
    float v = std::ldexp(x[i], -e);
    v = std::fmin(std::fmax(v, -kE2m1Max), kE2m1Max);
    x[i] = round_bf16(std::ldexp(round_e2m1(v), e));
  }
}

// Unnormalised Walsh–Hadamard butterfly (strides 1, 2, 4, …), then × n^-½, output rounded to
// bf16 (§3.0 Hadamard128). n is a power of two.
inline void hadamard_bf16(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i] * s);
}

// Dot product with 8 independent accumulators: a fixed summation order (so results never depend on
// threads), which the compiler can vectorise without reassociating.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace dsv4::cpu
