// The compact state layout (core/row_format.h): V4 row sizes, and a lossless round trip for every
// row the deepseek numerics can produce, with the simulation's own quantizers as the source.
#include "core/row_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "simulated_rows.h"

namespace dsv4 {
namespace {

TEST(RowFormat, V4SizesMatchTheIssue) {
  const RowFormat row = RowFormat::attention(StateLayout::compact, 512, 448);
  const RowFormat key = RowFormat::index_key(StateLayout::compact, 128);
  EXPECT_EQ(row.bytes(), 584);  // 448 e4m3 + 7 E8M0 + 1 pad + 64 bf16
  EXPECT_EQ(key.bytes(), 68);   // 64 B of nibbles + 4 E8M0
  EXPECT_EQ(RowFormat::attention(StateLayout::f32, 512, 448).bytes(), 2048);
  EXPECT_EQ(RowFormat::index_key(StateLayout::f32, 128).bytes(), 512);
}

// Rows as the engine stores them: an FP8-simulated head and a bf16 tail (attention), or an
// FP4-simulated row (indexer keys). Each block gets its own magnitude, from far below the
// quantizers' amax floors to large, and some blocks hold a value exactly at a scale boundary.
std::vector<float> simulated_rows(const RowFormat& f, int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> magnitude(-40, 20);
  std::vector<float> x(size_t(rows) * size_t(f.width));
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + size_t(r) * size_t(f.width);
    for (int32_t b0 = 0; b0 < f.width; b0 += 32) {
      const float scale = std::ldexp(1.0f, magnitude(rng));
      for (int32_t i = b0; i < std::min(b0 + 32, f.width); ++i) row[i] = normal(rng) * scale;
      if (rng() % 4 == 0) row[b0] = (f.kind == RowFormat::fp4 ? 6.0f : 448.0f) * scale;
      if (rng() % 8 == 0)
        for (int32_t i = b0; i < std::min(b0 + 32, f.width); ++i) row[i] = 0.0f;
    }
  }
  test::simulate_rows(f, x.data(), rows);
  return x;
}

void expect_round_trip(const RowFormat& f, uint32_t seed) {
  const int rows = 200;
  const std::vector<float> x = simulated_rows(f, rows, seed);
  std::vector<float> stored(size_t(rows) * size_t(f.stride));
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + size_t(r) * size_t(f.width);
    ASSERT_TRUE(pack_row(f, row, stored.data() + size_t(r) * size_t(f.stride))) << "row " << r;
    for (int32_t i = 0; i < f.width; ++i)
      ASSERT_EQ(f32_bits(row_value(f, stored.data() + size_t(r) * size_t(f.stride), i)), f32_bits(row[i]))
          << "row " << r << " dim " << i << " value " << row[i];
  }
}

TEST(RowFormat, AttentionRowsRoundTripExactly) {
  expect_round_trip(RowFormat::attention(StateLayout::compact, 512, 448), 1);
  expect_round_trip(RowFormat::attention(StateLayout::compact, 96, 64), 2);  // a fixture-sized row
  expect_round_trip(RowFormat::attention(StateLayout::compact, 72, 40), 3);  // a partial block, odd exponents
}

TEST(RowFormat, IndexerKeysRoundTripExactly) {
  expect_round_trip(RowFormat::index_key(StateLayout::compact, 128), 4);
  expect_round_trip(RowFormat::index_key(StateLayout::compact, 32), 5);
}

TEST(RowFormat, PlainRowsAreCopied) {
  expect_round_trip(RowFormat::plain(64), 6);
}

TEST(RowFormat, AValueOffTheGridIsReported) {
  const RowFormat row = RowFormat::attention(StateLayout::compact, 96, 64);
  std::vector<float> x = simulated_rows(row, 1, 7), stored(size_t(row.stride));
  x[70] = 1.0f + 1.0f / 1024;  // not a bf16 value
  EXPECT_FALSE(pack_row(row, x.data(), stored.data()));
  x = simulated_rows(row, 1, 7);
  x[3] = std::nextafter(x[3] == 0.0f ? 1.0f : x[3], 1e30f);  // not an e4m3 · 2^e value
  EXPECT_FALSE(pack_row(row, x.data(), stored.data()));
  const RowFormat key = RowFormat::index_key(StateLayout::compact, 32);
  std::vector<float> k(32, 0.25f);
  k[5] = 0.3f;
  EXPECT_FALSE(pack_row(key, k.data(), stored.data()));
}

TEST(RowFormat, EqualRowsAreEqualBytes) {
  const RowFormat row = RowFormat::attention(StateLayout::compact, 72, 40);
  const std::vector<float> x = simulated_rows(row, 1, 8);
  std::vector<float> a(size_t(row.stride), 1.0f), b(size_t(row.stride), -3.0f);
  pack_row(row, x.data(), a.data());
  pack_row(row, x.data(), b.data());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(row.bytes())));
}

TEST(StateLayout, NamesParse) {
  EXPECT_EQ(parse_state_layout("compact"), StateLayout::compact);
  EXPECT_EQ(parse_state_layout("f32"), StateLayout::f32);
  EXPECT_STREQ(to_string(StateLayout::compact), "compact");
  EXPECT_THROW(parse_state_layout("bf16"), Error);
}

}  // namespace
}  // namespace dsv4
