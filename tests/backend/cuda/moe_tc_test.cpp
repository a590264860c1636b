// deepseek-tc's routed FP4 experts on the FP8 tensor cores (cuda/gemm_experts_tc.cu), through the
// MoE op, against the exact CPU reference. The routing is exact in both numerics: the selections and
// weights agree bit for bit. The experts' products sum on the tensor cores (in their reduced-precision
// fp32 over each 128-block of K, then in fp32), so gate and up
// move by bf16-sized amounts, and where that flips the FP8 quantization of the swiglu output before
// the down product, that element moves by one e4m3 step (up to 1/8 of it). So over the whole output
// the relative error stays below 1e-2, and no element is off by more than its own bf16 rounding
// plus a quarter of the output's RMS (a wrong operand layout, scale or row misses by about the RMS
// everywhere it reaches). Small K often sums exactly in fp32 as well; the cases without a shared
// expert and with K = 512 must differ somewhere, which shows the tensor cores ran. Too few rows
// per expert take the decode kernels: with K a multiple of 512 the f16 mma (gemv_tc.cu, the same
// bound; gate, up and the SwiGLU in one launch), else the exact kernel, bit for bit.
#include <algorithm>

#include "moe_case.h"

namespace dsv4::test {

// Weight rows whose 32-block scales span more than the kernel's one exponent per row holds: in
// every third row of each routed matrix one block far below the row's largest (dropped, its
// products below 2^-26 of the row's others), in the next row one exactly 2^26 below (the
// smallest shift kept).
void widen_scales(MoeHost& h) {
  for (auto& l : h.store) {
    if (l->W.format != WeightFormat::fp4) continue;
    const int64_t cols = l->W.scale_cols;
    for (int64_t r = 0; r < l->W.out; ++r) {
      uint8_t* row = l->scale.data() + r * cols;
      const uint8_t top = *std::max_element(row, row + cols);
      const int64_t j = r * 7 % cols;
      if (r % 3 == 0) row[j] = uint8_t(top - 40);
      if (r % 3 == 1 && row[j] != top) row[j] = uint8_t(top - 26);
    }
  }
}

TEST(CudaTensorCores, RoutedExpertsWithinTheRoundingBound) {
  DSV4_REQUIRE_GPU();
  const int64_t vocab = 64;
  enum Path { exact, tensor_cores, tensor_cores_differ };
  struct Case {
    MoeCase c;
    Path path;
    bool wide_scales = false;
  };
  const std::vector<Case> cases = {
      {{90, 8, 256, 128, 2, false, true, 10.0}, tensor_cores},  // rows grouped by expert, a shared expert
      {{70, 33, 96, 64, 3, true, false, 0.5}, tensor_cores},    // a hash layer, partial tiles, K of 3 blocks
      {{300, 16, 512, 384, 6, false, false, 10.0}, tensor_cores_differ},  // output rows past one 128-tile
      {{300, 16, 512, 384, 6, false, false, 10.0}, tensor_cores, true},   // blocks dropped and at the edge
      // hundreds of rows per expert: whole tiles of 256 token rows (four quarters), then a partial one
      {{1200, 4, 512, 128, 2, false, false, 10.0}, tensor_cores_differ},
      {{500, 8, 256, 192, 3, false, true, 10.0}, tensor_cores},  // 130–250 rows per expert: three or four quarters
      // 30 rows for 256 experts (decode-like) with K below the f16 mma path's 512: the exact kernel;
      // no shared expert: its FP8 products of 5 rows run on mma.sync (gemv_tc.cu, tested in gemm_tc_test)
      {{5, 256, 128, 64, 6, false, false, 10.0}, exact},
      // decode-like with K of 512 and 1024: the routed experts of few rows on the f16 mma (gemv_tc.cu)
      {{5, 64, 512, 512, 6, false, false, 10.0}, tensor_cores_differ},
      {{5, 64, 512, 512, 6, false, false, 10.0}, tensor_cores, true},  // blocks 2^-26 and 2^-40 below: dropped
      {{2, 40, 1024, 512, 4, true, true, 0.5}, tensor_cores},          // a hash layer and a shared expert
      // gate and up in one launch with the SwiGLU (both mma kernels) over F = 224, 14 tiles of 16
      // rows: the last block's tiles past F write nothing; the down products of K 224 are exact
      {{3, 48, 512, 224, 6, false, true, 0.5}, tensor_cores},
  };
  for (const auto& [c, path, wide_scales] : cases) {
    MoeInputs in(c, vocab);
    if (wide_scales) widen_scales(in.h), in.name += " wide scales";
    auto cpu = make_cpu_backend(Numerics::deepseek), gpu = make_cuda_backend(Numerics::deepseek_tc);
    Side cs(*cpu), gs(*gpu);
    const MoeOutputs ref = in.run(cs, c), got = in.run(gs, c);
    EXPECT_EQ(gs.stray_writes(), 0) << in.name;
    ASSERT_EQ(ref.sel, got.sel) << in.name << ": routing is exact in both numerics";
    EXPECT_EQ(identical(ref.weights, got.weights), int64_t(ref.weights.size())) << in.name;
    if (path == exact) {
      EXPECT_EQ(identical(ref.out, got.out), int64_t(ref.out.size())) << in.name << ": the exact kernels'";
      continue;
    }
    double err2 = 0, ref2 = 0, worst = 0;
    for (float v : ref.out) ref2 += double(v) * double(v);
    const double rms = std::sqrt(ref2 / double(ref.out.size()));
    int64_t differ = 0;
    for (size_t i = 0; i < ref.out.size(); ++i) {
      ASSERT_FALSE(std::isnan(got.out[i])) << in.name << ": output " << i << " unwritten";
      const double d = std::abs(double(got.out[i]) - double(ref.out[i]));
      const double bound = std::ldexp(std::abs(double(ref.out[i])), -8) + rms / 4;
      differ += !same_bits(got.out[i], ref.out[i]);
      err2 += d * d;
      worst = std::max(worst, d / bound);
    }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("[ tc       ] %-62s n=%-8zu differ=%-7lld rel=%.2e worst/bound=%.3f\n", in.name.c_str(),
                ref.out.size(), (long long)differ, rel, worst);
    EXPECT_LE(worst, 1.0) << in.name;
    EXPECT_LE(rel, 1e-2) << in.name;
    if (path == tensor_cores_differ) {
      EXPECT_GT(differ, 0) << in.name << ": the experts did not run on the tensor cores";
    }
  }
}

}  // namespace dsv4::test
