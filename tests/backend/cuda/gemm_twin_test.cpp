// Twins of the matrix products and the embedding (cpu/gemm.cpp ↔ cuda/gemm.cu): every weight
// format and compute kind, sizes 1, odd and tiny-config, sub-ranges of rows and strided operands.
#include "twin.h"

namespace dsv4::test {

using model::WeightFormat;

struct LinearCase {
  WeightFormat format;
  Compute compute;
  int64_t T, out, in;
  bool f32_scales = false;
};

std::string describe(const LinearCase& c) {
  const char* compute = c.compute == Compute::quantized ? "quantized" : c.compute == Compute::bf16 ? "bf16" : "f32";
  return std::string("linear ") + model::to_string(c.format) + "/" + compute + " T" + std::to_string(c.T) + " " +
         std::to_string(c.out) + "x" + std::to_string(c.in) + (c.f32_scales ? " f32-scales" : "");
}

TEST(CudaTwin, LinearAllFormatsAndSizes) {
  DSV4_REQUIRE_GPU();
  std::vector<LinearCase> cases;
  for (auto [T, out, in] : {std::tuple{1, 1, 128}, {31, 17, 224}, {7, 256, 256}, {3, 128, 4096}, {2, 33, 96},
                              // many rows: the FP64 tensor-core path, with tails in all three dimensions
                              {97, 200, 320}, {70, 65, 4096}, {64, 64, 128},
                              // many rows, few tiles: the tensor-core double paths split K (hc_pre's
                              // mix shape; a K that the parts do not divide)
                              {200, 24, 16384}, {40, 24, 3008},
                              // few rows over a long K: the double paths split K across blocks
                              {1, 24, 16384}, {2, 5, 3008}}) {
    for (WeightFormat f : {WeightFormat::fp8, WeightFormat::fp4}) {
      cases.push_back({f, Compute::quantized, T, out, in});
      cases.push_back({f, Compute::f32, T, out, in});
    }
    cases.push_back({WeightFormat::bf16, Compute::bf16, T, out, in});
    cases.push_back({WeightFormat::bf16, Compute::f32, T, out, in});
    cases.push_back({WeightFormat::f32, Compute::f32, T, out, in});
  }
  cases.push_back({WeightFormat::fp8, Compute::quantized, 5, 200, 300});  // K tail of 44, two scale rows
  cases.push_back({WeightFormat::fp8, Compute::quantized, 4, 130, 256, true});
  cases.push_back({WeightFormat::fp4, Compute::quantized, 4, 9, 256, true});
  // FP8 in the double paths: f32 scales that are not all powers of two take the per-code decode
  // in some chunks and the bit placement in others (gemm.cu: placeable).
  cases.push_back({WeightFormat::fp8, Compute::f32, 3, 130, 256, true});
  cases.push_back({WeightFormat::fp8, Compute::bf16, 1, 256, 640, true});
  for (const LinearCase& c : cases) {
    const std::string name = describe(c);
    auto W = random_linear(name + ".w", c.format, c.out, c.in);
    if (c.f32_scales) W = random_linear(name + ".w", c.format, c.out, c.in, 0.05f, true);
    const std::vector<float> x = random_bf16(name + ".x", size_t(c.T * c.in));
    expect_twins_both(name, [&](Side& s) {
      float* y = s.out(size_t(c.T * c.out));
      s->linear(W->W, c.compute, s.in(x), c.T, y);
      Outputs o;
      o.add("y", s.read(y, size_t(c.T * c.out)));
      return o;
    });
  }
}

// The grouped wo_a product (Backend::grouped_linear): rows [g·R, (g+1)·R) of W against a column
// slice of x, written into a column slice of y. The CPU runs one linear per group (the
// definition); the GPU one launch of the decode kernel with a view of W per group (T < 4), or one
// product per group (T ≥ 4, and FP8 groups that split a 128-row scale block: R = 24, 32; R = 6
// starts groups at rows that are not multiples of 4, one of them straddling rows 126–129).
TEST(CudaTwin, GroupedLinear) {
  DSV4_REQUIRE_GPU();
  for (auto [G, R, in_g] : {std::tuple{2, 24, 64}, {8, 32, 96}, {4, 128, 256}, {22, 6, 32}}) {
    for (int64_t T : {1, 3, 5, 77}) {
      for (auto [f, compute] : {std::pair{WeightFormat::bf16, Compute::bf16}, {WeightFormat::fp8, Compute::bf16},
                                {WeightFormat::fp8, Compute::quantized}}) {
        const std::string name = "grouped linear G" + std::to_string(G) + " " + model::to_string(f) +
                                 (compute == Compute::quantized ? " quantized" : " bf16") + " T" + std::to_string(T);
        auto W = random_linear(name + ".w", f, G * R, in_g);
        const std::vector<float> x = random_bf16(name + ".x", size_t(T * G * in_g));
        expect_twins_both(name, [&](Side& s) {
          float* y = s.out(size_t(T * G * R));
          s->grouped_linear(W->W, compute, s.in(x), T, G, y);
          Outputs o;
          o.add("y", s.read(y, size_t(T * G * R)));
          return o;
        });
      }
    }
  }
}

TEST(CudaTwin, EmbedCopiesTheRowToEveryStream) {
  DSV4_REQUIRE_GPU();
  for (auto [T, hc, D] : {std::tuple{1, 1, 8}, {13, 4, 256}, {3, 2, 33}}) {
    const std::string name = "embed T" + std::to_string(T) + " hc" + std::to_string(hc) + " D" + std::to_string(D);
    auto table = random_linear(name + ".table", WeightFormat::bf16, 50, D);
    std::vector<int32_t> tokens;
    for (int t = 0; t < T; ++t) tokens.push_back(int32_t((t * 37 + 11) % 50));
    expect_twins_both(name, [&](Side& s) {
      float* X = s.out(size_t(T * hc * D));
      s->embed(table->W, s.ids(tokens), T, hc, X);
      Outputs o;
      o.add("X", s.read(X, size_t(T * hc * D)));
      return o;
    });
  }
}

TEST(CudaTwin, EmbedRejectsIdsOutsideTheVocabulary) {
  DSV4_REQUIRE_GPU();
  auto gpu = make_cuda_backend(Numerics::deepseek);
  auto table = random_linear("embed bad id", WeightFormat::bf16, 10, 16);
  Side s(*gpu);
  float* X = s.out(16);
  // Checked on the device, without a wait: the error comes with the next read.
  s->embed(table->W, s.ids({10}), 1, 1, X);
  try {
    s.read(X, 16);
    FAIL() << "an id outside the vocabulary was embedded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 10 outside the vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace dsv4::test
