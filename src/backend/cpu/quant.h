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
// (In double, so the butterfly is exact; rounded once to fp32, then to bf16.)
inline void hadamard_bf16(float* x, int64_t n) {
  double v[1024];
  for (int64_t i = 0; i < n; ++i) v[i] = x[i];
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const double s = 1.0 / std::sqrt(double(n));
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(float(v[i] * s));
}

// ---- Canonical arithmetic of the CPU reference ---------------------------------------------------
// Every sum accumulates in double and is rounded once to fp32, and exp, log1p, sin, cos, sqrt,
// rsqrt and the sigmoid are evaluated in double and rounded once. The results are then (but for rare double
// rounding ties) the correctly rounded values whatever the summation order, so an independent
// implementation that follows the same definition (tools/oracle/port.py) agrees bit for bit instead
// of depending on a library's reduction order. That matters here: a last-bit difference in the bf16
// residual stream can flip a later FP8 quantization decision, and random test models amplify it.

inline float dot(const float* a, const float* b, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) acc[j] += double(a[i + j]) * double(b[i + j]);
  double s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) s += double(a[i]) * double(b[i]);
  return float(s);
}

inline float exp_f(float x) { return float(std::exp(double(x))); }
inline float sqrt_f(float x) { return float(std::sqrt(double(x))); }
inline float rsqrt_f(float x) { return float(1.0 / std::sqrt(double(x))); }
inline float sigmoid_f(float x) { return float(1.0 / (1.0 + std::exp(-double(x)))); }
inline float silu_f(float x) { return float(double(x) / (1.0 + std::exp(-double(x)))); }
inline float sin_f(float x) { return float(std::sin(double(x))); }
inline float cos_f(float x) { return float(std::cos(double(x))); }
// PyTorch's softplus: the identity above its threshold of 20.
inline float softplus_f(float x) { return x > 20.0f ? x : float(std::log1p(std::exp(double(x)))); }

}  // namespace dsv4::cpu
