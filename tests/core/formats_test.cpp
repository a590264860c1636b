// Number formats (architecture.md §2.2, §3.0): decoders against the definitions, and the
// round-to-nearest-even encoders on every boundary that matters.
#include <gtest/gtest.h>

#include <cmath>

#include "core/formats.h"

namespace dsv4 {

TEST(Formats, E4m3DecodesEveryCode) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float v = e4m3_to_f32(uint8_t(b));
    EXPECT_EQ(round_e4m3(v), v) << b;  // every code is a fixed point of the rounding
    if (b != 0x80) {
      EXPECT_EQ(f32_to_e4m3(v), b) << b;
    }
  }
}

// The decoders place bits; the definitions (§2.2) multiply. Every code, both signs (−0 included).
TEST(Formats, DecodersMatchTheirDefinitions) {
  for (int b = 0; b < 256; ++b) {
    const int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    if (e == 15 && m == 7) continue;
    const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
    EXPECT_EQ(f32_bits(e4m3_to_f32(uint8_t(b))), f32_bits(s ? -mag : mag)) << b;
  }
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int n = 0; n < 16; ++n)
    EXPECT_EQ(f32_bits(e2m1_to_f32(uint8_t(n))), f32_bits((n & 8) ? -e2m1[n & 7] : e2m1[n & 7])) << n;
}

TEST(Formats, E4m3RoundsToNearestEven) {
  EXPECT_EQ(round_e4m3(1.0625f), 1.0f);    // halfway 1 and 1.125: even mantissa
  EXPECT_EQ(round_e4m3(1.1875f), 1.25f);   // halfway 1.125 and 1.25
  EXPECT_EQ(round_e4m3(1.07f), 1.125f);
  EXPECT_EQ(round_e4m3(-3.3f), -3.25f);
  EXPECT_EQ(round_e4m3(std::ldexp(1.5f, -10)), std::ldexp(1.0f, -9));  // subnormal tie to even (2·2^-10)
  EXPECT_EQ(round_e4m3(440.0f), 448.0f);
  EXPECT_EQ(round_e4m3(416.0f), 416.0f);
}

TEST(Formats, E2m1) {
  const float values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(uint8_t(c)), values[c]);
    EXPECT_EQ(e2m1_to_f32(uint8_t(c | 8)), -values[c]);
    EXPECT_EQ(f32_to_e2m1(values[c]), c);
  }
  EXPECT_EQ(round_e2m1(0.25f), 0.0f);
  EXPECT_EQ(round_e2m1(0.75f), 1.0f);
  EXPECT_EQ(round_e2m1(1.75f), 2.0f);
  EXPECT_EQ(round_e2m1(2.5f), 2.0f);
  EXPECT_EQ(round_e2m1(3.5f), 4.0f);
  EXPECT_EQ(round_e2m1(5.0f), 4.0f);
  EXPECT_EQ(round_e2m1(-5.5f), -6.0f);
}

TEST(Formats, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);  // tie, even
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
}

TEST(Formats, E8m0) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(Formats, ScaleExponentIsCeilLog2OfTheRoundedProduct) {
  EXPECT_EQ(ceil_log2(1.0f), 0);
  EXPECT_EQ(ceil_log2(1.0000001f), 1);
  EXPECT_EQ(ceil_log2(0.75f), 0);
  EXPECT_EQ(ceil_log2(std::ldexp(1.0f, -140)), -140);  // subnormal
  EXPECT_EQ(fp8_scale_exp(448.0f), 0);                 // 448 · fp32(1/448) rounds to 1
  EXPECT_EQ(fp8_scale_exp(449.0f), 1);
  EXPECT_EQ(fp8_scale_exp(0.0f), ceil_log2(1e-4f * (1.0f / 448.0f)));  // the amax floor
  EXPECT_EQ(fp4_scale_exp(6.0f), 0);
  EXPECT_EQ(fp4_scale_exp(12.0f), 1);
}

}  // namespace dsv4
