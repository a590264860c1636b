// Device twins of the per-element quantization steps of cpu/quant.h (architecture.md §3.0). The
// block's absolute maximum comes from the caller's reduction (fmax: exact in any order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// Four e4m3 codes of a word (the first in the low byte), each as its value times 2^-1016 in a
// double, by placing its bits in the double's fields: a normal code's exponent and mantissa land
// in the double's (exponent field 1–15), a subnormal code on a double subnormal, so it is exact
// (no conversion instruction). The high word is (magnitude << 17) | (sign << 31): the magnitudes
// are shifted once for all four (each byte's low bit, the next code's sign, masked off), the signs
// masked in two halves that keep two zero bytes each, then one byte permute per code assembles
// zero, zero, magnitude, sign: two integer operations per code. The NaN codes 0x7f/0xff, which
// our quantization never writes, decode as 480 · 2^-1016.
__device__ __forceinline__ void e4m3x4_placed(uint32_t word, double (&v)[4]) {
  const uint32_t magnitudes = (word << 1) & 0xfefefefeu;
  const uint32_t signs01 = word & 0x00008080u, signs23 = word & 0x80800000u;
  v[0] = __hiloint2double(int(__byte_perm(magnitudes, signs01, 0x4076)), 0);
  v[1] = __hiloint2double(int(__byte_perm(magnitudes, signs01, 0x5176)), 0);
  v[2] = __hiloint2double(int(__byte_perm(magnitudes, signs23, 0x6254)), 0);
  v[3] = __hiloint2double(int(__byte_perm(magnitudes, signs23, 0x7354)), 0);
}

// The high word of the double 2^(e + bias) (its low word is zero); high words of two powers of two
// add to that of their product when one bias is 1023 and the other 0.
__device__ __forceinline__ uint32_t pow2_high(int e, int bias) { return uint32_t(e + bias) << 20; }

// 2^(e − 127 + 1016) for an E8M0 byte e (2^(e−127)), as a double: what turns e4m3x4_placed values
// into the values of a block with that exponent, exactly.
__device__ __forceinline__ double e8m0_placed_scale(uint32_t e) {
  return __hiloint2double(int(pow2_high(int(e) - 127, 1016 + 1023)), 0);
}

// The 2·e2m1 integers (−12 … 12) of 8 nibbles (one 32-bit word of codes, the first in the low
// nibble), times 2^shift (shift ≤ 3, so they stay int8), as two words of four int8 (codes 0–3,
// 4–7): each code's magnitude picked, positive and negated, from byte tables, then one of the two
// by its sign bit (three byte permutes per four).
__device__ inline void fp4_to_int8x8(uint32_t nibbles, uint32_t& lo, uint32_t& hi, int shift = 0) {
  // codes 0–3, 4–7: 0 1 2 3 | 4 6 8 12, and their negatives, each times 2^shift: no positive byte
  // overflows into the next (12 · 8 < 256); the negatives' carries into the next byte are masked off.
  const uint32_t low_bits = 0x01010101u * ((0xffu << shift) & 0xffu);
  const uint32_t pos0 = 0x03020100u << shift, pos1 = 0x0C080604u << shift;
  const uint32_t neg0 = (0xFDFEFF00u << shift) & low_bits, neg1 = (0xF4F8FAFCu << shift) & low_bits;
  auto four = [&](uint32_t n) {  // four codes in the low 16 bits
    const uint32_t magnitude = n & 0x7777u;
    const uint32_t pos = __byte_perm(pos0, pos1, magnitude), neg = __byte_perm(neg0, neg1, magnitude);
    return __byte_perm(pos, neg, 0x3210u | ((n >> 1) & 0x4444u));  // byte k from neg where code k is negative
  };
  lo = four(nibbles & 0xffffu);
  hi = four(nibbles >> 16);
}

}  // namespace dsv4::cuda
