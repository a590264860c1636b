// The experts kernel's FP4 → e5m2 conversion (backend/cuda/fp4_e5m2.cuh) on the host, where prmt is
// emulated: every e2m1 code at every shift becomes the e5m2 byte of exactly its value times 2^t,
// and a dropped block's codes become zeros. Needs no GPU; the kernel's results are checked against
// the CPU reference by moe_tc_test on one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/fp4_e5m2.cuh"
#include "core/formats.h"

namespace dsv4::cuda {
namespace {

// An e5m2 byte's value (1 sign, 5 exponent bits of bias 15, 2 mantissa bits), written from the
// format's definition rather than from the conversion under test.
double e5m2_value(uint8_t b) {
  const int e = b >> 2 & 31, m = b & 3;
  const double magnitude = e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1.0 + m / 4.0, e - 15);
  return b & 0x80 ? -magnitude : magnitude;
}

TEST(Fp4E5m2, PermuteIsPtxPrmt) {
  const uint32_t a = 0x33221100u, b = 0xF7665544u;
  EXPECT_EQ(permute(a, b, 0x3210), a);
  EXPECT_EQ(permute(a, b, 0x7654), b);
  EXPECT_EQ(permute(a, b, 0x0527), 0x005522F7u);
  EXPECT_EQ(permute(a, b, 0xFFFF7654), b);       // only the low 16 bits select
  EXPECT_EQ(permute(a, b, 0x8F07), 0x00FF00F7u);  // top bit: byte 7's sign (set), byte 0's (clear)
}

TEST(Fp4E5m2, ShiftEntries) {
  const int R = 120;
  EXPECT_EQ(shift_entry(R - kTopShift, R), 0u);
  EXPECT_EQ(shift_entry(R, R), uint32_t(4 * kTopShift));
  EXPECT_EQ(shift_entry(R + kTopShift, R), uint32_t(8 * kTopShift));
  EXPECT_EQ(shift_entry(R - kTopShift - 1, R), kDropped);
  EXPECT_EQ(shift_entry(0, R), kDropped);
}

// e5m2_table<kQ> from byte kQ of a word of four blocks' entries.
uint2 table_of(int q, uint32_t entries) {
  switch (q) {
    case 0: return e5m2_table<0>(entries);
    case 1: return e5m2_table<1>(entries);
    case 2: return e5m2_table<2>(entries);
    default: return e5m2_table<3>(entries);
  }
}

TEST(Fp4E5m2, EveryCodeAtEveryShiftIsExact) {
  const int R = 110;
  for (int q = 0; q < 4; ++q)
    for (int t = -kTopShift; t <= kTopShift; ++t) {
      // Byte q holds the block's entry, the other bytes other blocks' (other shifts, a dropped one).
      uint32_t entries = 0;
      for (int b = 0; b < 4; ++b)
        entries |= (b == q ? shift_entry(R + t, R) : b == (q + 1) % 4 ? kDropped : shift_entry(R - t + b, R)) << (8 * b);
      const uint2 table = table_of(q, entries);
      for (uint32_t first = 0; first < 16; ++first) {  // nibble i holds code first + i: every code at every place
        uint32_t w = 0;
        for (uint32_t i = 0; i < 8; ++i) w |= (first + i) % 16 << (4 * i);
        const uint2 bytes = e2m1x8_e5m2(w, table);
        for (int i = 0; i < 8; ++i) {
          const uint8_t code = w >> (4 * i) & 0xF, e5m2 = (i < 4 ? bytes.x : bytes.y) >> (8 * (i % 4)) & 0xFF;
          ASSERT_EQ(e5m2_value(e5m2), std::ldexp(double(e2m1_to_f32(code)), t))
              << "code " << int(code) << " at nibble " << i << ", shift " << t << ", entry byte " << q;
        }
      }
    }
}

TEST(Fp4E5m2, DroppedBlocksBecomeZeros) {
  // The kernel copies a dropped block's codes as zeros; its table's sums carry across bytes, but
  // code 0 reads byte 0, which no carry reaches.
  for (int q = 0; q < 4; ++q) {
    const uint2 bytes = e2m1x8_e5m2(0u, table_of(q, kDropped << (8 * q)));
    EXPECT_EQ(bytes.x, 0u) << "entry byte " << q;
    EXPECT_EQ(bytes.y, 0u) << "entry byte " << q;
  }
}

}  // namespace
}  // namespace dsv4::cuda
