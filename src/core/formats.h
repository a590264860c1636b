// Number formats of the checkpoint and of the reference numerics (architecture.md §2.2, §3.0, §5).
//
// Decoders and round-to-nearest-even encoders for BF16, FP8 E4M3 (e4m3fn), E8M0 and FP4 E2M1,
// plus the power-of-two "ceil log2" scale rule of the reference quantizers. These are the only
// functions the CPU and CUDA twins share, so they are constexpr-free plain inline code usable on
// both sides (DSV4_HD).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define DSV4_HD __host__ __device__
#else
#define DSV4_HD
#endif

namespace dsv4 {

DSV4_HD inline uint32_t f32_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
DSV4_HD inline float f32_from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// ---- BF16 --------------------------------------------------------------------------------------
DSV4_HD inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

DSV4_HD inline uint16_t f32_to_bf16(float x) {
  uint32_t b = f32_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40);  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);                                          // round to nearest even
  return uint16_t(b >> 16);
}

// The value of x rounded to bf16, kept as a float.
DSV4_HD inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// ---- E8M0 (ue8m0): value 2^(b-127); 255 is NaN; 0 is 2^-127 (a float subnormal) -----------------
DSV4_HD inline float e8m0_to_f32(uint8_t b) {
  if (b == 255) return NAN;
  if (b == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(uint32_t(b) << 23);
}

// ---- FP8 E4M3 (e4m3fn): bias 7, no inf, 0x7f/0xff NaN, max 448 ---------------------------------
// By bit placement (a hot path on the GPU: no ldexp): a normal code's exponent and mantissa move
// into the float's fields; a subnormal one is m · 2^-9, exact.
DSV4_HD inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24, e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) return f32_from_bits(sign | f32_bits(float(m) * 0.001953125f));
  return f32_from_bits(sign | ((e + 120) << 23) | (m << 20));
}

// Rounds x (already clamped to [-448, 448]) to the nearest e4m3 value, ties to even.
DSV4_HD inline float round_e4m3(float x) {
  const float a = std::fabs(x);
  if (a == 0.0f) return x;
  const int exp_field = int((f32_bits(a) >> 23) & 0xff);
  const int e = exp_field - 127;
  const int quantum_exp = e < -6 ? -9 : e - 3;  // 3 mantissa bits; subnormal spacing 2^-9
  const float q = std::ldexp(std::nearbyint(std::ldexp(a, -quantum_exp)), quantum_exp);
  return std::copysign(q > 448.0f ? 448.0f : q, x);
}

// Encodes x (clamped to [-448, 448]) as an e4m3 byte, ties to even.
DSV4_HD inline uint8_t f32_to_e4m3(float x) {
  const float r = round_e4m3(x);
  const uint8_t sign = std::signbit(r) ? 0x80 : 0;
  const float a = std::fabs(r);
  if (a == 0.0f) return sign;
  int e = int((f32_bits(a) >> 23) & 0xff) - 127;
  if (e < -6) return uint8_t(sign | uint8_t(std::ldexp(a, 9)));  // subnormal: m * 2^-9
  const int m = int(std::ldexp(a, -e) * 8.0f) - 8;
  return uint8_t(sign | uint8_t((e + 7) << 3) | uint8_t(m));
}

// ---- FP4 E2M1: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; bit 3 is the sign ------------------------
// By bit placement (no table: a local array would live in slow local memory on the GPU): code 1
// is 0.5; codes 2..7 are (1 + m/2) · 2^(e−1) with e = code >> 1, m = code & 1.
DSV4_HD inline float e2m1_to_f32(uint8_t nibble) {
  const uint32_t sign = uint32_t(nibble & 8) << 28, c = nibble & 7;
  if (c < 2) return f32_from_bits(sign | (c ? 126u << 23 : 0u));
  return f32_from_bits(sign | (((c >> 1) + 126) << 23) | ((c & 1) << 22));
}

// Rounds x (already clamped to [-6, 6]) to the nearest e2m1 value, ties to even.
DSV4_HD inline float round_e2m1(float x) {
  const float a = std::fabs(x);
  const float quantum = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
  const float q = std::nearbyint(a / quantum) * quantum;
  return std::copysign(q > 6.0f ? 6.0f : q, x);
}

DSV4_HD inline uint8_t f32_to_e2m1(float x) {
  const float r = round_e2m1(x);
  const float a = std::fabs(r);
  uint8_t code = 0;
  for (uint8_t c = 0; c < 8; ++c)
    if (e2m1_to_f32(c) == a) code = c;
  return uint8_t(code | (std::signbit(r) ? 8 : 0));
}

// ---- Power-of-two block scales (architecture.md §3.0 ActQuantFP8 / FP4Sim) --------------------
// ceil(log2(t)) for t > 0, read off the float's bits exactly as the reference kernels do: the
// unbiased exponent, plus one when any mantissa bit is set.
DSV4_HD inline int ceil_log2(float t) {
  const uint32_t b = f32_bits(t);
  int exp_field = int((b >> 23) & 0xff);
  uint32_t mant = b & 0x7fffffu;
  if (exp_field == 0) {  // subnormal: normalise
    int e;
    const float fr = std::frexp(t, &e);  // t = fr * 2^e, fr in [0.5, 1)
    return fr == 0.5f ? e - 1 : e;
  }
  return exp_field - 127 + (mant != 0 ? 1 : 0);
}

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;

// The scale exponent the reference picks for a block whose absolute maximum is amax:
// 2^ceil(log2(max(amax, floor) * fp32(1/max_value))). The product with the rounded reciprocal
// (not a division) is what makes the decision match the reference bit for bit.
DSV4_HD inline int fp8_scale_exp(float amax) {
  const float t = (amax > 1e-4f ? amax : 1e-4f) * (1.0f / kE4m3Max);
  return ceil_log2(t);
}
DSV4_HD inline int fp4_scale_exp(float amax) {
  const float floor = 6.0f * 1.1754943508222875e-38f;  // 6 * 2^-126
  const float t = (amax > floor ? amax : floor) * (1.0f / kE2m1Max);
  return ceil_log2(t);
}

}  // namespace dsv4
