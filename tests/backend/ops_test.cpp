// Properties of the CPU reference ops that hold whatever the weights (architecture.md §3):
// each is small enough to serve later as the CPU side of a GPU twin test.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/formats.h"

namespace dsv4 {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(dist(rng));
  return v;
}

TEST(Ops, NumericsNamesRoundTripAndTheCpuRefusesTensorCoreNumerics) {
  for (Numerics n : {Numerics::deepseek, Numerics::plain, Numerics::deepseek_tc})
    EXPECT_EQ(parse_numerics(to_string(n)), n);
  EXPECT_TRUE(quantizes(Numerics::deepseek_tc));
  EXPECT_FALSE(quantizes(Numerics::plain));
  try {
    make_cpu_backend(Numerics::deepseek_tc);
    FAIL() << "the CPU backend accepted deepseek-tc";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_input);
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_numerics("fast"), Error);
}

TEST(Ops, KvFp8SimulationLandsOnTheGridAndIsIdempotent) {
  auto b = make_cpu_backend(Numerics::deepseek);
  std::vector<float> x = random_vector(2 * 192, 1, 3.0f);
  b->kv_fp8_sim(x.data(), 2, 192, 128);
  const std::vector<float> once = x;
  b->kv_fp8_sim(x.data(), 2, 192, 128);
  EXPECT_EQ(x, once);
  // dims [128, 192) (the rope part) are untouched; the others are e4m3 × 2^e per 64-block
  const std::vector<float> orig = random_vector(2 * 192, 1, 3.0f);
  for (int r = 0; r < 2; ++r)
    for (int i = 128; i < 192; ++i) EXPECT_EQ(once[size_t(r * 192 + i)], orig[size_t(r * 192 + i)]);
  for (int blk = 0; blk < 2; ++blk) {
    float amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::fmax(amax, std::fabs(orig[size_t(blk * 64 + i)]));
    const int e = fp8_scale_exp(amax);
    for (int i = 0; i < 64; ++i) {
      const float q = std::ldexp(once[size_t(blk * 64 + i)], -e);
      EXPECT_EQ(round_e4m3(q), q);
    }
  }
}

TEST(Ops, PlainNumericsSkipsTheQuantizationSteps) {
  auto b = make_cpu_backend(Numerics::plain);
  std::vector<float> x = random_vector(256, 2);
  const std::vector<float> orig = x;
  b->kv_fp8_sim(x.data(), 2, 128, 64);
  b->indexer_fp4_sim(x.data(), 2, 128);
  EXPECT_EQ(x, orig);
}

TEST(Ops, IndexerQuantizationIsHadamardThenFp4) {
  auto b = make_cpu_backend(Numerics::deepseek);
  std::vector<float> x = random_vector(128, 3);
  const std::vector<float> orig = x;
  b->indexer_fp4_sim(x.data(), 1, 128);
  // H is orthonormal: dot(H a, H b) = dot(a, b); FP4 error keeps it close.
  double self_orig = 0, self_quant = 0;
  for (int i = 0; i < 128; ++i) self_orig += orig[size_t(i)] * orig[size_t(i)], self_quant += x[size_t(i)] * x[size_t(i)];
  EXPECT_NEAR(self_quant / self_orig, 1.0, 0.15);
  for (int blk = 0; blk < 4; ++blk) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[size_t(blk * 32 + i)]));
    const int e = fp4_scale_exp(amax);
    for (int i = 0; i < 32; ++i) {
      const float q = std::ldexp(x[size_t(blk * 32 + i)], -e);
      EXPECT_EQ(round_e2m1(q), q) << "block " << blk << " element " << i;
    }
  }
}

TEST(Ops, RopeInverseUndoesRope) {
  auto b = make_cpu_backend(Numerics::plain);
  RopeFreqs f;
  for (int i = 0; i < 32; ++i) f.freqs.push_back(1.0f / std::pow(10000.0f, float(2 * i) / 64.0f));
  std::vector<float> x = random_vector(3 * 2 * 128, 4);
  const std::vector<float> orig = x;
  b->rope(x.data(), 3, 2, 128, f, 1000, 1, false);
  EXPECT_NE(x, orig);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(x[size_t(i)], orig[size_t(i)]);  // only the last 64 dims rotate
  b->rope(x.data(), 3, 2, 128, f, 1000, 1, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], orig[i], 1e-4);
}

TEST(Ops, AttentionWithOneRowIsTheRowScaledByTheSink) {
  auto b = make_cpu_backend(Numerics::plain);
  const int64_t H = 2, hd = 64;
  std::vector<float> q = random_vector(size_t(H * hd), 5), kv = random_vector(size_t(hd), 6), out(size_t(H * hd));
  const std::vector<float> sinks = {0.5f, -1.0f};
  SwaRows swa{kv.data(), 0, 1, 128};
  b->attention(q.data(), 1, H, hd, 0, swa, CompressedRows{}, sinks.data(), 0.125f, out.data());
  for (int64_t h = 0; h < H; ++h) {
    double l = 0;
    for (int64_t d = 0; d < hd; ++d) l += double(q[size_t(h * hd + d)]) * kv[size_t(d)];
    l *= 0.125;
    const double w = 1.0 / (1.0 + std::exp(double(sinks[size_t(h)]) - l));  // e^l / (e^l + e^sink)
    for (int64_t d = 0; d < hd; ++d) EXPECT_NEAR(out[size_t(h * hd + d)], w * kv[size_t(d)], 1e-5);
  }
}

TEST(Ops, AttentionSeesOnlyTheWindowAndVisibleCompressedRows) {
  auto b = make_cpu_backend(Numerics::plain);
  const int64_t hd = 64, n = 10, window = 3;
  std::vector<float> kv = random_vector(size_t(n * hd), 7), q = random_vector(size_t(n * hd), 8);
  std::vector<float> comp = random_vector(size_t(2 * hd), 9), out(size_t(n * hd)), ref(size_t(n * hd));
  const float sink = 0.0f;
  // HCA-style rows with ratio 4: query t sees rows w < (t+1)/4.
  b->attention(q.data(), n, 1, hd, 0, SwaRows{kv.data(), 0, n, window}, CompressedRows{comp.data(), RowFormat::plain(int32_t(hd)), 2, 4, nullptr, 0},
               &sink, 0.125f, out.data());
  for (int64_t t = 0; t < n; ++t) {
    // The same query alone, given exactly the rows it may see.
    std::vector<float> rows;
    for (int64_t j = std::max<int64_t>(0, t - window + 1); j <= t; ++j)
      rows.insert(rows.end(), kv.begin() + j * hd, kv.begin() + (j + 1) * hd);
    const int64_t n_window = int64_t(rows.size()) / hd;
    const int64_t visible = std::min<int64_t>(2, (t + 1) / 4);
    rows.insert(rows.end(), comp.begin(), comp.begin() + visible * hd);
    std::vector<float> idx_rows(rows.begin() + n_window * hd, rows.end());
    std::vector<int32_t> idx;
    for (int64_t w = 0; w < visible; ++w) idx.push_back(int32_t(w));
    b->attention(q.data() + t * hd, 1, 1, hd, t, SwaRows{rows.data(), t - n_window + 1, n_window, window},
                 CompressedRows{comp.data(), RowFormat::plain(int32_t(hd)), 2, 4, idx.empty() ? nullptr : idx.data(), int64_t(idx.size())}, &sink,
                 0.125f, ref.data() + t * hd);
    for (int64_t d = 0; d < hd; ++d) EXPECT_NEAR(out[size_t(t * hd + d)], ref[size_t(t * hd + d)], 1e-6) << t;
  }
}

TEST(Ops, CompressorEmitsOneRowPerCompletedWindow) {
  auto b = make_cpu_backend(Numerics::plain);
  model::CompressorWeights cw;
  cw.ratio = 4;
  cw.dim = 8;
  cw.ape.assign(size_t(4 * 16), 0.0f);
  std::vector<float> a(size_t(16 * 16), 1.0f), s(size_t(16 * 16), 0.0f), carry_a(size_t(8 * 16)),
      carry_s(size_t(8 * 16)), pooled(size_t(5 * 8));
  CompressorCarry carry{carry_a.data(), carry_s.data()};
  b->compressor_reset(cw, carry);
  EXPECT_EQ(b->compressor_push(cw, carry, a.data(), s.data(), 0, 3, pooled.data()), 0);   // positions 0..2
  EXPECT_EQ(b->compressor_push(cw, carry, a.data(), s.data(), 3, 6, pooled.data()), 2);   // 3..8: windows 0, 1
  EXPECT_EQ(b->compressor_push(cw, carry, a.data(), s.data(), 9, 7, pooled.data()), 2);   // 9..15: windows 2, 3
  for (float v : std::vector<float>(pooled.begin(), pooled.begin() + 16)) EXPECT_FLOAT_EQ(v, 1.0f);  // convex mix of ones
}

TEST(Ops, SinkhornMakesCombDoublyStochastic) {
  auto b = make_cpu_backend(Numerics::plain);
  const int64_t hc = 4, D = 128, mix = (2 + hc) * hc;
  std::vector<float> fn = random_vector(size_t(mix * hc * D), 10, 0.05f), X = random_vector(size_t(hc * D), 11);
  model::HcParams p;
  p.fn.format = model::WeightFormat::f32;
  p.fn.out = mix;
  p.fn.in = hc * D;
  p.fn.data = reinterpret_cast<const uint8_t*>(fn.data());
  p.base = random_vector(size_t(mix), 12);
  p.scale = {1.0f, 1.0f, 1.0f};
  std::vector<float> u(static_cast<size_t>(D)), post(static_cast<size_t>(hc)), comb(static_cast<size_t>(hc * hc));
  b->hc_pre(p, X.data(), 1, hc, D, 20, 1e-6, 1e-6, u.data(), post.data(), comb.data());
  for (int64_t i = 0; i < hc; ++i) {
    double row = 0, col = 0;
    for (int64_t j = 0; j < hc; ++j) row += comb[size_t(i * hc + j)], col += comb[size_t(j * hc + i)];
    EXPECT_NEAR(col, 1.0, 1e-5);
    EXPECT_NEAR(row, 1.0, 1e-3);
    EXPECT_GT(post[size_t(i)], 0.0f);
    EXPECT_LT(post[size_t(i)], 2.0f);
  }
}

}  // namespace dsv4
