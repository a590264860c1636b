// The routed experts' FP4 weights made e5m2 for the FP8 tensor cores (gemm_experts_tc.cu), exact:
// an e2m1 value times 2^t is an e5m2 value for every t in [−kTopShift, kTopShift]. Byte permutes
// (prmt) turn eight e2m1 codes into eight e5m2 bytes by a table per 32-block. Host and device code
// (DSV4_HD), so that fp4_e5m2_test checks every code at every shift on the CPU; on the host,
// prmt is emulated as the PTX ISA defines it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/formats.h"

namespace dsv4::cuda {

// prmt.b32's generic form: result byte i is byte (selector nibble i) & 7 of {b, a} (a's bytes 0–3,
// b's 4–7), or, where the nibble's top bit is set, that byte's sign bit replicated over all 8 bits.
// Only the selector's low 16 bits count.
DSV4_HD inline uint32_t permute(uint32_t a, uint32_t b, uint32_t selector) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
#else
  const uint64_t bytes = uint64_t(b) << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = selector >> (4 * i) & 0xF, byte = uint32_t(bytes >> (8 * (nibble & 7))) & 0xFF;
    d |= (nibble & 8 ? (byte & 0x80 ? 0xFFu : 0u) : byte) << (8 * i);
  }
  return d;
#endif
}

constexpr int kTopShift = 13;  // 6 · 2^13 is below e5m2's largest, 57 344; 0.5 · 2^-13 its smallest normal

// A 32-block's entry in the weight scale table: u = 4 (t + kTopShift) for its shift t = scale − R
// in [−kTopShift, kTopShift] (R: its weight row's largest scale less kTopShift), kDropped for a
// block more than that below (its codes are copied as zeros).
constexpr uint32_t kDropped = 0xFF;
DSV4_HD inline uint32_t shift_entry(int scale, int R) {
  const int t = scale - R;
  return t < -kTopShift ? kDropped : uint32_t(4 * (t + kTopShift));
}

// The e5m2 codes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2^t, negated (the sign
// bit set: e2m1x8_e5m2 clears it for positive codes), by byte (codes 0–3, 4–7), from the entry u of
// byte q of `entries`: the exponent field moves by t, each byte's sum stays below 256; zero stays
// zero. For a dropped block only code 0 occurs, whose byte is right whatever u is.
template <int kQ>
DSV4_HD inline uint2 e5m2_table(uint32_t entries) {
  constexpr uint32_t q = kQ;
  const uint32_t u_high3 = permute(entries, 0, 0x4 | q << 4 | q << 8 | q << 12), u_all4 = permute(entries, 0, q * 0x1111);
  // 0x80 | 0x38, 0x3C, 0x3E and 0x40, 0x42, 0x44, 0x46 (2^-1 … 6 at t = 0) less 4 · kTopShift
  return make_uint2(u_high3 + 0x8A888480u, u_all4 + 0x92908E8Cu);
}

// Eight e2m1 codes (the first in the low nibble) as eight e5m2 bytes by `table`.
DSV4_HD inline uint2 e2m1x8_e5m2(uint32_t w, uint2 table) {
  const uint32_t magnitude = w & 0x77777777u;
  const uint32_t lo = permute(table.x, table.y, magnitude), hi = permute(table.x, table.y, magnitude >> 16);
  // 0x01 per positive code, 0x00 per negative one (its selector's top bit replicates 0x01's sign);
  // subtracting 0x80 per positive code clears that byte's sign bit, borrowing nothing.
  const uint32_t lo_pos = permute(0x01010101u, 0x01010101u, w), hi_pos = permute(0x01010101u, 0x01010101u, w >> 16);
  return make_uint2(lo - 0x80u * lo_pos, hi - 0x80u * hi_pos);
}

}  // namespace dsv4::cuda
