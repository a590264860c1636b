// The deepseek-tc numerics' FP8 products (cuda/gemm_fp8_tc.cu) against the exact CPU reference.
// The tensor cores sum a K tile's products in fewer bits than the exact partial, so these are
// compared within bounds, not bit for bit: per element, one bf16 rounding of the result plus a
// part of Σ|x·w| (what a truncated accumulator can lose; a wrong scale or operand layout misses by
// the size of the result itself), and over the whole output a relative error of bf16 size. Below
// the tensor cores' row threshold the products stay on the exact kernels: bit for bit.
#include "backend/cuda/gemm_fp8_tc.h"
#include "twin.h"

namespace dsv4::test {

namespace {

struct TcCase {
  int64_t T, out, in;
  int64_t row0 = 0, rows = 0;  // rows 0: all of them
};

// Σ_k |x[t, k]| · |w[row, k]| for every output, the weights dequantized on the host.
std::vector<double> magnitudes(const HostLinear& h, const std::vector<float>& x, const TcCase& c, int64_t rows) {
  std::vector<double> m(size_t(c.T * rows), 0.0);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < c.in; ++k) {
      const int64_t o = c.row0 + n;
      const float scale = std::ldexp(1.0f, int(h.scale[size_t(o / 128 * h.W.scale_cols + k / 128)]) - 127);
      const double w = std::abs(double(e4m3_to_f32(h.data[size_t(o * c.in + k)])) * scale);
      for (int64_t t = 0; t < c.T; ++t) m[size_t(t * rows + n)] += w * std::abs(double(x[size_t(t * c.in + k)]));
    }
  return m;
}

}  // namespace

TEST(CudaTensorCores, Fp8ProductsWithinTheAccumulatorBound) {
  DSV4_REQUIRE_GPU();
  // K = 256: two K blocks, which the weights' scale copy pads to four. T = 77, 78: token counts
  // that are not multiples of 4 (cuBLASLt has no algorithm for them: the exact kernels run them),
  // with all rows and with rows from 128 on.
  for (const TcCase& c : {TcCase{32, 256, 1024}, TcCase{100, 384, 4096}, TcCase{512, 200, 512}, TcCase{64, 256, 256},
                          TcCase{76, 512, 1024, 128, 256}, TcCase{77, 512, 1024}, TcCase{78, 512, 1024, 128, 256}}) {
    const int64_t rows = c.rows ? c.rows : c.out;
    const std::string name = "tc linear T" + std::to_string(c.T) + " " + std::to_string(c.out) + "x" +
                             std::to_string(c.in) + " rows " + std::to_string(c.row0) + "+" + std::to_string(rows);
    auto W = random_linear(name + ".w", model::WeightFormat::fp8, c.out, c.in);
    const std::vector<float> x = random_bf16(name + ".x", size_t(c.T * c.in));
    auto run = [&](Backend& b) {
      Side s(b);
      float* y = s.out(size_t(c.T * rows));
      s->linear(W->W, Compute::quantized, s.in(x), c.in, c.T, y, rows, c.row0, rows);
      std::vector<float> v = s.read(y, size_t(c.T * rows));
      EXPECT_EQ(s.stray_writes(), 0) << name << " on " << b.name();
      return v;
    };
    const std::vector<float> ref = run(*make_cpu_backend(Numerics::deepseek));
    const std::vector<float> got = run(*make_cuda_backend(Numerics::deepseek_tc));
    const std::vector<double> mag = magnitudes(*W, x, c, rows);
    double err2 = 0, ref2 = 0, worst = 0;  // worst: |Δ| over its bound
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::abs(double(got[i]) - double(ref[i]));
      const double bound = std::ldexp(std::abs(double(ref[i])), -8) + std::ldexp(mag[i], -7);
      ASSERT_FALSE(std::isnan(got[i])) << name << ": output " << i << " unwritten";
      differ += !same_bits(got[i], ref[i]);
      err2 += d * d, ref2 += double(ref[i]) * double(ref[i]);
      worst = std::max(worst, d / bound);
    }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("[ tc       ] %-52s n=%-7zu differ=%-6lld rel=%.2e worst/bound=%.3f\n", name.c_str(), ref.size(),
                (long long)differ, rel, worst);
    EXPECT_LE(worst, 1.0) << name;
    EXPECT_LE(rel, 1e-2) << name;
    // The exact kernels would agree bit for bit: differences show that the tensor cores ran.
    if (c.T % 4 == 0)
      EXPECT_GT(differ, 0) << name << ": the product did not run on the tensor cores";
    else
      EXPECT_EQ(differ, 0) << name << ": a token count cuBLASLt cannot take is the exact kernels'";
  }
}

// Decode-sized products (fewer rows than the tensor cores take) keep the exact kernels.
TEST(CudaTensorCores, FewRowsStayExact) {
  DSV4_REQUIRE_GPU();
  const int64_t T = cuda::Fp8TensorCoreGemm::kMinRows - 1, out = 256, in = 1024;
  auto W = random_linear("tc few rows.w", model::WeightFormat::fp8, out, in);
  const std::vector<float> x = random_bf16("tc few rows.x", size_t(T * in));
  auto run = [&](Backend& b) {
    Side s(b);
    float* y = s.out(size_t(T * out));
    s->linear(W->W, Compute::quantized, s.in(x), T, y);
    return s.read(y, size_t(T * out));
  };
  const std::vector<float> ref = run(*make_cpu_backend(Numerics::deepseek));
  const std::vector<float> got = run(*make_cuda_backend(Numerics::deepseek_tc));
  EXPECT_EQ(identical(ref, got), int64_t(ref.size()));
}

}  // namespace dsv4::test
