// The deepseek-tc numerics' tensor-core products (cuda/gemm_tc.cu) against the exact CPU
// reference. The tensor cores sum in fewer bits than the exact sums (FP8: a K tile's partial;
// bf16: fp32 accumulation), so these are compared within bounds, not bit for bit: per element, one
// bf16 rounding of the result plus a part of Σ|x·w| (what a truncated accumulator can lose; a wrong
// scale or operand layout misses by the size of the result itself), and over the whole output a
// relative error of bf16 size. The fp32 products of bf16 values (the compressors') run on the bf16
// tensor cores too: their products are exact, so only the order of the fp32 sum differs. The
// quantized FP8 products run on cuBLASLt, or on a Hopper on our own kernel (gemm_fp8_tc.cu) where K
// is short or the token count one cuBLASLt cannot take; off a Hopper such token counts stay on the
// exact kernels, bit for bit. Below the row threshold the quantized FP8 products and the bf16 ones
// run on mma.sync (gemv_tc.cu), the grouped output projection's among them; FP8 rows from a row0
// that is no multiple of 16, and bf16 products of a K no multiple of 64, stay exact.
#include "backend/cuda/gemm_tc.h"
#include "twin.h"

namespace dsv4::test {

namespace {

using model::WeightFormat;

struct TcCase {
  WeightFormat format;
  Compute compute;
  int64_t T, out, in;
  int64_t row0 = 0, rows = 0;  // rows 0: all of them
  int64_t groups = 0;           // > 0: Backend::grouped_linear over x of groups · in columns (rows: all)
};

// W with every weight's sign cleared (FP8: bit 7 of each code; BF16: bit 15, F32: bit 31 of each value).
std::unique_ptr<HostLinear> magnitude_of(const HostLinear& h) {
  auto m = std::make_unique<HostLinear>(h);
  const size_t step = h.W.format == WeightFormat::bf16 ? 2 : h.W.format == WeightFormat::f32 ? 4 : 1;
  for (size_t i = step - 1; i < m->data.size(); i += step) m->data[i] &= 0x7f;
  m->W.data = m->data.data(), m->W.scale = m->scale.data();
  return m;
}

// Runs the case's product on backend b: y [T, rows] for rows [row0, row0 + rows) of W.
std::vector<float> product(Backend& b, const model::Linear& W, Compute compute, const std::vector<float>& x,
                           const TcCase& c, int64_t rows, const std::string& name) {
  Side s(b);
  float* y = s.out(size_t(c.T * rows));
  if (c.groups > 0) s->grouped_linear(W, compute, s.in(x), c.T, c.groups, y);
  else s->linear(W, compute, s.in(x), c.in, c.T, y, rows, c.row0, rows);
  std::vector<float> v = s.read(y, size_t(c.T * rows));
  EXPECT_EQ(s.stray_writes(), 0) << name << " on " << b.name();
  return v;
}

}  // namespace

TEST(CudaTensorCores, ProductsWithinTheAccumulatorBound) {
  DSV4_REQUIRE_GPU();
  const Compute q = Compute::quantized, bf16 = Compute::bf16, f32_bf16 = Compute::f32_bf16_in;
  const WeightFormat fp8 = WeightFormat::fp8, wbf16 = WeightFormat::bf16, wf32 = WeightFormat::f32;
  // FP8 quantized: K = 256 has two K blocks, which cuBLASLt's scale copy pads to four; T = 77,
  // 78 are token counts that are not multiples of 4 (cuBLASLt has no algorithm for them), with all
  // rows and with rows from 128 on; T = 1030 (not a multiple of 4: our kernel on a Hopper) makes 144
  // tiles of our kernel, more than an H100's or H200's blocks, so some blocks take two, and K = 2048
  // wraps its ring of stages. bf16: FP8 weights dequantized, BF16 ones read in place, rows from a
  // row0 that is no multiple of 128.
  for (const TcCase& c : {TcCase{fp8, q, 32, 256, 1024}, TcCase{fp8, q, 100, 384, 4096}, TcCase{fp8, q, 512, 200, 512},
                          TcCase{fp8, q, 64, 256, 256}, TcCase{fp8, q, 76, 512, 1024, 128, 256},
                          TcCase{fp8, q, 77, 512, 1024}, TcCase{fp8, q, 78, 512, 1024, 128, 256},
                          TcCase{fp8, q, 1030, 2048, 2048},
                          TcCase{fp8, bf16, 64, 256, 1024}, TcCase{fp8, bf16, 77, 384, 512, 64, 200},
                          TcCase{wbf16, bf16, 96, 256, 640}, TcCase{wbf16, bf16, 33, 300, 256, 8, 96},
                          // a compressor's projection (K 4 096), and rows from a row0 no multiple of 8;
                          // mHC's mix and its head's (F32 weights in TF32 parts)
                          TcCase{wbf16, f32_bf16, 80, 1024, 4096}, TcCase{wbf16, f32_bf16, 40, 96, 512, 3, 88},
                          TcCase{wf32, f32_bf16, 64, 24, 16384}, TcCase{wf32, f32_bf16, 40, 4, 16384},
                          // decode-sized (mma.sync): one token, a partial tile from row0 16, two
                          // token groups, the largest count below cuBLASLt's
                          TcCase{fp8, q, 1, 512, 1024}, TcCase{fp8, q, 5, 400, 2048, 16, 272}, TcCase{fp8, q, 9, 256, 512},
                          TcCase{fp8, q, 31, 128, 1024},
                          // decode-sized bf16 products: FP8 weights dequantized (a partial tile from
                          // row0 16), BF16 ones (rows from a row0 no multiple of 8), the compressor's
                          // and the head's fp32 products of bf16 values, two token groups, and the
                          // grouped output projection (a view of W per row of x; T 3: 24 views)
                          TcCase{fp8, bf16, 1, 512, 1024}, TcCase{fp8, bf16, 5, 400, 2048, 16, 272},
                          TcCase{wbf16, bf16, 1, 64, 4096}, TcCase{wbf16, bf16, 9, 300, 256, 8, 96},
                          TcCase{wbf16, f32_bf16, 1, 1024, 4096}, TcCase{wbf16, f32_bf16, 31, 96, 512, 3, 88},
                          TcCase{fp8, bf16, 1, 8 * 256, 512, 0, 0, 8}, TcCase{fp8, bf16, 3, 8 * 128, 256, 0, 0, 8},
                          TcCase{wbf16, bf16, 2, 4 * 64, 128, 0, 0, 4}}) {
    const int64_t rows = c.rows ? c.rows : c.out;
    const std::string kind = c.compute == q ? "/quantized" : c.compute == bf16 ? "/bf16" : "/f32 of bf16";
    const std::string name = std::string("tc ") + model::to_string(c.format) + kind + " T" + std::to_string(c.T) +
                             " " + std::to_string(c.out) + "x" + std::to_string(c.in) + " rows " +
                             std::to_string(c.row0) + "+" + std::to_string(rows) +
                             (c.groups ? " G" + std::to_string(c.groups) : "");
    auto W = random_linear(name + ".w", c.format, c.out, c.in);
    const std::vector<float> x = random_bf16(name + ".x", size_t(c.T * c.in * std::max<int64_t>(c.groups, 1)));
    std::vector<float> abs_x = x;
    for (float& v : abs_x) v = std::abs(v);
    const std::vector<float> ref = product(*make_cpu_backend(Numerics::deepseek), W->W, c.compute, x, c, rows, name);
    const std::vector<float> got = product(*make_cuda_backend(Numerics::deepseek_tc), W->W, c.compute, x, c, rows, name);
    // Σ|x·w| per output: the CPU's exact f32 product of |x| and |W|.
    const std::vector<float> mag =
        product(*make_cpu_backend(Numerics::plain), magnitude_of(*W)->W, Compute::f32, abs_x, c, rows, name);
    double err2 = 0, ref2 = 0, worst = 0;  // worst: |Δ| over its bound
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::abs(double(got[i]) - double(ref[i]));
      const double bound = std::ldexp(std::abs(double(ref[i])), -8) + std::ldexp(double(mag[i]), -7);
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
    if (c.compute == f32_bf16) {
      // Exact products summed in fp32 (F32 weights: three partial sums, then added): within fp32's
      // accumulation bound (K + 2)·2^-24·Σ|x·w| of the exact sum, not rounded to bf16, and summed
      // in another order than the CPU's somewhere.
      int64_t unrounded = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_LE(std::abs(double(got[i]) - double(ref[i])), std::ldexp(double(c.in + 2) * double(mag[i]), -24))
            << name << ": output " << i;
        unrounded += got[i] != round_bf16(got[i]);
      }
      EXPECT_GT(unrounded, 0) << name << ": the output was rounded to bf16";
      EXPECT_GT(differ, 0) << name << ": the product did not run on the tensor cores";
    }
    // The exact kernels agree bit for bit: FP8 tile partials on the tensor cores differ somewhere.
    const bool few = c.T < cuda::TensorCoreGemm::kMinRows;  // mma.sync: FewRowsSumOnTheTensorCores
    cuda::GemmRequest request;  // the product's shape, as uses_tensor_core_fp8 reads it
    request.W.format = int32_t(c.format), request.W.in = c.in, request.W.scale_cols = c.in / 128;
    request.row0 = c.row0, request.T = c.T;
    const bool any_token_count = cuda::uses_tensor_core_fp8(request);  // our kernel, not cuBLASLt
    if (c.compute == q && (c.T % 4 == 0 || any_token_count) && !few) {
      EXPECT_GT(differ, 0) << name << ": the product did not run on the tensor cores";
    } else if (c.compute == q && !few) {
      EXPECT_EQ(differ, 0) << name << ": a token count cuBLASLt cannot take is the exact kernels'";
    }
  }
}

// A product whose partial sums the exact kernels and mma.sync round differently, which shows that
// the decode-sized products ran on the tensor cores (their random cases above round to the same
// bf16: mma.sync's fp32 steps lose less than a bf16 rounding hides). Every row holds 448 at k = 0,
// 2^-6 at k = 8 and -448 at k = U, and x the same with +448 at U: exactly 2^-12, while the mma
// steps add 448², then 2^-12 (lost below the ulp of 448², 2^-6), then -448²: 0. Quantized FP8: U = 64,
// inside one K block's partial; bf16 products: U is the next unit of the kernel's ring (an FP8 K
// block of 128, 64 bf16 values), summed after the first unit's fp32 partial (by the same warp or
// the next).
TEST(CudaTensorCores, FewRowsSumOnTheTensorCores) {
  DSV4_REQUIRE_GPU();
  struct Cancel {
    WeightFormat format;
    Compute compute;
    int64_t at, in;  // U; K
  };
  const int64_t out = 16;
  for (const Cancel& k : {Cancel{WeightFormat::fp8, Compute::quantized, 64, 128},
                          Cancel{WeightFormat::fp8, Compute::bf16, 128, 256},
                          Cancel{WeightFormat::bf16, Compute::bf16, 64, 128},
                          Cancel{WeightFormat::bf16, Compute::f32_bf16_in, 64, 128}}) {
    const std::string name = std::string("cancel ") + model::to_string(k.format) +
                             (k.compute == Compute::quantized ? " quantized" : k.compute == Compute::bf16 ? " bf16" : " f32 of bf16");
    auto W = random_linear(name + ".w", k.format, out, k.in);
    std::fill(W->data.begin(), W->data.end(), uint8_t(0));
    std::fill(W->scale.begin(), W->scale.end(), uint8_t(127));  // E8M0 1.0
    // The weight at column i of row r: an e4m3 code, or bf16 bits (little-endian).
    auto set = [&](int64_t r, int64_t i, uint8_t e4m3, uint16_t bf16) {
      if (k.format == WeightFormat::fp8) W->data[size_t(r * k.in + i)] = e4m3;
      else W->data[size_t(2 * (r * k.in + i))] = uint8_t(bf16), W->data[size_t(2 * (r * k.in + i) + 1)] = uint8_t(bf16 >> 8);
    };
    for (int64_t r = 0; r < out; ++r) {
      set(r, 0, 0x7e, 0x43e0);     // 448
      set(r, 8, 0x08, 0x3c80);     // 2^-6
      set(r, k.at, 0xfe, 0xc3e0);  // -448
    }
    for (int64_t T : {1, 9}) {
      const TcCase c{k.format, k.compute, T, out, k.in};
      std::vector<float> x(size_t(T * k.in), 0.0f);
      for (int64_t t = 0; t < T; ++t)
        x[size_t(t * k.in)] = x[size_t(t * k.in + k.at)] = 448.0f, x[size_t(t * k.in + 8)] = 0x1p-6f;
      const std::vector<float> ref = product(*make_cpu_backend(Numerics::deepseek), W->W, c.compute, x, c, out, name);
      const std::vector<float> got = product(*make_cuda_backend(Numerics::deepseek_tc), W->W, c.compute, x, c, out, name);
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_EQ(ref[i], 0x1p-12f) << name << " T" << T << " output " << i << ": the exact sum";
        ASSERT_EQ(got[i], 0.0f) << name << " T" << T << " output " << i << ": the mma steps' sum";
      }
    }
  }
}

// Decode-sized quantized FP8 rows from a row0 that is no multiple of 16 (which would split a tile of
// 16 over two scale blocks), and bf16 products of a K no multiple of 64, keep the exact kernels.
TEST(CudaTensorCores, FewRowsOffTheTensorCoresStayExact) {
  DSV4_REQUIRE_GPU();
  const int64_t T = cuda::TensorCoreGemm::kMinRows - 1, out = 256;
  for (const TcCase& c : {TcCase{WeightFormat::fp8, Compute::quantized, T, out, 1024, 8, 128},
                          TcCase{WeightFormat::bf16, Compute::bf16, T, out, 96}}) {
    const int64_t rows = c.rows ? c.rows : c.out;
    auto W = random_linear("tc few rows.w", c.format, out, c.in);
    const std::vector<float> x = random_bf16("tc few rows.x", size_t(T * c.in));
    const std::vector<float> ref = product(*make_cpu_backend(Numerics::deepseek), W->W, c.compute, x, c, rows, "few");
    const std::vector<float> got = product(*make_cuda_backend(Numerics::deepseek_tc), W->W, c.compute, x, c, rows, "few");
    EXPECT_EQ(identical(ref, got), int64_t(ref.size()));
  }
}

}  // namespace dsv4::test
