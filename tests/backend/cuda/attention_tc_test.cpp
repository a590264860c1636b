// deepseek-tc's prefill attention on the bf16 tensor cores (cuda/attention_tc.cu) against the exact
// CPU reference. Both round each probability to bf16, but at different bases (the tensor-core
// kernel's running max, rescaled later, against the final max), and each output to bf16; the
// tensor cores accumulate in fp32. So per element |Δ| stays within one bf16 rounding of the output
// plus 2^-7 of Σ_j p_j·|v_j| / den (what the probabilities' roundings can move it by; a wrong
// fragment layout, row or scale misses by the size of the output itself), and over the whole
// output the relative error is of bf16 size. Decode-sized calls and operands the kernel does not
// take stay on the exact kernels: bit for bit.
#include "attention_case.h"

namespace dsv4::test {

namespace {

struct TcAttnCase {
  AttnCase c;
  bool tensor_cores;  // false: the exact kernels, bit for bit
};

// Σ_j p_j·|v_jd| / den per (query, head, dim), in double, over the rows each query attends.
std::vector<double> probability_spread(const AttnCase& c, const AttnInputs& in) {
  const RowFormat& f = in.comp_format;
  std::vector<double> spread(size_t(c.T * c.H * c.hd));
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t pos = c.p0 + t, lo = std::max<int64_t>(0, pos - c.window + 1);
    std::vector<std::vector<double>> rows;  // the query's rows, decoded
    for (int64_t p = lo; p <= pos; ++p)
      rows.emplace_back(in.kv.begin() + (p - in.first_pos) * c.hd, in.kv.begin() + (p - in.first_pos + 1) * c.hd);
    std::vector<int64_t> comp;
    if (c.k)
      for (int64_t w = 0; w < c.k; ++w) {
        if (const int32_t sel = in.idx[size_t(t * c.k + w)]; sel >= 0 && sel < c.n_comp) comp.push_back(sel);
      }
    else if (c.ratio)
      for (int64_t w = 0; w < std::min(c.n_comp, (pos + 1) / c.ratio); ++w) comp.push_back(w);
    for (int64_t w : comp) {
      std::vector<double> row(size_t(c.hd));
      for (int64_t d = 0; d < c.hd; ++d) row[size_t(d)] = row_value(f, in.comp.data() + w * f.stride, d);
      rows.push_back(std::move(row));
    }
    for (int64_t h = 0; h < c.H; ++h) {
      const float* q = in.q.data() + (t * c.H + h) * c.hd;
      std::vector<double> e(rows.size());
      double mx = -INFINITY;
      for (size_t j = 0; j < rows.size(); ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < c.hd; ++d) dot += double(q[d]) * rows[j][size_t(d)];
        e[j] = dot * in.softmax_scale(c);
        mx = std::max(mx, e[j]);
      }
      double den = std::exp(double(in.sinks[size_t(h)]) - mx);
      for (double& x : e) den += (x = std::exp(x - mx));
      double* out = spread.data() + (t * c.H + h) * c.hd;
      for (size_t j = 0; j < rows.size(); ++j)
        for (int64_t d = 0; d < c.hd; ++d) out[d] += e[j] * std::abs(rows[j][size_t(d)]) / den;
    }
  }
  return spread;
}

}  // namespace

TEST(CudaTensorCores, AttentionWithinTheRoundingBound) {
  DSV4_REQUIRE_GPU();
  const std::vector<TcAttnCase> cases = {
      {{20, 64, 512, 40000, 128, 10000, 4, 512, 448}, true},  // V4-Flash CSA prefill: window + top-k 512
      {{17, 64, 512, 262000, 128, 2047, 128, 0, 448}, true},  // V4-Flash HCA prefill at 256K context
      {{31, 64, 512, 200, 128}, true},                        // the sliding window alone, full
      {{40, 64, 512, 0, 128}, true},                          // a prompt's start: 1 … 40 rows
      {{33, 4, 128, 500, 128, 127, 4, 32, 64}, true},         // few heads; compact rows of an odd float count
      {{12, 70, 128, 3000, 128, 23, 128, 0, 64}, true},       // two head blocks, the second partial
      {{8, 64, 512, 40000, 128, 10000, 4, 512, 448}, false},  // decode-sized: exact
      {{19, 8, 128, 3000, 128, 754, 4}, false},               // fp32 compressed rows: exact
      {{19, 8, 72, 3000, 128, 754, 4, 0, 40}, false},         // head dims no multiple of 16: exact
  };
  for (const TcAttnCase& tc : cases) {
    const AttnCase& c = tc.c;
    const AttnInputs in(c);
    auto cpu = make_cpu_backend(Numerics::deepseek), gpu = make_cuda_backend(Numerics::deepseek_tc);
    Side cs(*cpu), gs(*gpu);
    const std::vector<float> ref = in.run(cs, c), got = in.run(gs, c);
    EXPECT_EQ(gs.stray_writes(), 0) << in.name;
    if (!tc.tensor_cores) {
      EXPECT_EQ(identical(ref, got), int64_t(ref.size())) << in.name << ": the exact kernels'";
      continue;
    }
    const std::vector<double> spread = probability_spread(c, in);
    double err2 = 0, ref2 = 0, worst = 0;  // worst: |Δ| over its bound
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << in.name << ": output " << i << " unwritten";
      const double d = std::abs(double(got[i]) - double(ref[i]));
      const double bound = std::ldexp(std::abs(double(ref[i])), -8) + std::ldexp(spread[i], -7);
      differ += !same_bits(got[i], ref[i]);
      err2 += d * d, ref2 += double(ref[i]) * double(ref[i]);
      worst = std::max(worst, d / bound);
    }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("[ tc       ] %-62s n=%-8zu differ=%-7lld rel=%.2e worst/bound=%.3f\n", in.name.c_str(), ref.size(),
                (long long)differ, rel, worst);
    EXPECT_LE(worst, 1.0) << in.name;
    EXPECT_LE(rel, 1e-2) << in.name;
    EXPECT_GT(differ, 0) << in.name << ": the attention did not run on the tensor cores";
  }
}

}  // namespace dsv4::test
