// Twins of the row-wise and elementwise ops: RMSNorm, the per-head q norm, scale, add
// (cpu/norm.cpp ↔ cuda/norm.cu), RoPE (rope.cpp ↔ rope.cu), the quantization simulations
// (cpu/norm.cpp ↔ cuda/quant.cu) and the joined KV step (backend.cpp ↔ cuda/kv_finish.cu).
#include "twin.h"

namespace dsv4::test {

TEST(CudaTwin, RmsNorm) {
  DSV4_REQUIRE_GPU();
  for (auto [rows, n] : {std::pair{1, 1}, {17, 31}, {7, 256}, {3, 4096}, {2, 1000}, {1, 16384}})
    for (bool weighted : {true, false}) {
      const std::string name = "rms_norm " + std::to_string(rows) + "x" + std::to_string(n) + (weighted ? "" : " bare");
      const std::vector<float> x = random_bf16(name + ".x", size_t(rows * n), 3.0f);
      const std::vector<float> w = random_uniform(name + ".w", size_t(n), 0.5f, 1.5f);
      expect_twins_both(name, [&](Side& s) {
        float* y = s.out(size_t(rows * n));
        s->rms_norm(s.in(x), weighted ? w.data() : nullptr, rows, n, 1e-6, y);
        Outputs o;
        o.add("y", s.read(y, size_t(rows * n)));
        return o;
      });
    }
}

TEST(CudaTwin, HeadNormScaleAdd) {
  DSV4_REQUIRE_GPU();
  for (auto [rows, n] : {std::pair{1, 1}, {31, 17}, {16, 128}, {4, 512}}) {
    const std::string name = "head_norm/scale/add " + std::to_string(rows) + "x" + std::to_string(n);
    const std::vector<float> q = random_bf16(name + ".q", size_t(rows * n), 2.0f);
    const std::vector<float> a = random_bf16(name + ".a", size_t(rows * n));
    expect_twins_both(name, [&](Side& s) {
      float* qd = s.in(q);
      s->head_norm(qd, rows, n, 1e-6);
      float* sd = s.in(q);
      s->scale(sd, rows * n, 0.0883883476f);
      float* y = s.out(size_t(rows * n));
      s->add(s.in(q), s.in(a), rows * n, y);
      Outputs o;
      o.add("q", s.read(qd, size_t(rows * n)));
      o.add("scaled", s.read(sd, size_t(rows * n)));
      o.add("sum", s.read(y, size_t(rows * n)));
      return o;
    });
  }
}

// Real frequency tables of 32 pairs (plain and YaRN-blended) and a tiny one of 2.
struct TestFreqs {
  RopeFreqs plain, yarn, tiny;
};
static TestFreqs test_freqs() {
  TestFreqs t;
  for (int i = 0; i < 32; ++i) {
    const float f = 1.0f / std::pow(10000.0f, float(2 * i) / 64.0f);
    t.plain.freqs.push_back(f);
    const float g = 1.0f / std::pow(160000.0f, float(2 * i) / 64.0f);
    t.yarn.freqs.push_back(i < 16 ? g : i > 24 ? g / 16.0f : (g / 16.0f) * 0.5f + g * 0.5f);
  }
  t.tiny.freqs = {1.0f, 0.01f};
  return t;
}

// Large positions, groups of heads, strided positions (compressed rows) and the inverse rotation.
TEST(CudaTwin, Rope) {
  DSV4_REQUIRE_GPU();
  const auto [plain, yarn, tiny] = test_freqs();
  struct C {
    const RopeFreqs* f;
    int64_t n_groups, group, row_stride, pos0, pos_step;
  };
  for (const C& c : {C{&plain, 1, 1, 64, 0, 1}, C{&plain, 31, 4, 128, 5, 1}, C{&yarn, 7, 1, 512, 1000, 4},
                     C{&yarn, 9, 4, 128, 1048000, 1}, C{&tiny, 5, 3, 7, 123456, 128},
                     // many heads per group: blocks of 8 heads, the last one partial
                     C{&yarn, 1, 64, 512, 4095, 1}, C{&plain, 2, 19, 64, 77, 1}})
    for (bool inverse : {false, true}) {
      const std::string name = "rope " + std::to_string(c.n_groups) + "x" + std::to_string(c.group) + "x" +
                               std::to_string(c.row_stride) + " p" + std::to_string(c.pos0) + "+" +
                               std::to_string(c.pos_step) + (inverse ? " inverse" : "");
      const std::vector<float> x = random_bf16(name + ".x", size_t(c.n_groups * c.group * c.row_stride));
      expect_twins_both(name, [&](Side& s) {
        float* xd = s.in(x);
        s->rope(xd, c.n_groups, c.group, c.row_stride, *c.f, c.pos0, c.pos_step, inverse);
        Outputs o;
        o.add("x", s.read(xd, x.size()));
        return o;
      });
    }
}

TEST(CudaTwin, KvFp8Simulation) {
  DSV4_REQUIRE_GPU();
  for (auto [rows, stride, n_dims] : {std::tuple{1, 64, 64}, {7, 192, 128}, {13, 130, 100}, {4, 512, 448}}) {
    const std::string name = "kv_fp8_sim " + std::to_string(rows) + "x" + std::to_string(stride) + " dims " +
                             std::to_string(n_dims);
    // wide dynamic range, so blocks get different scales and some values underflow to subnormal e4m3
    std::vector<float> x = random_bf16(name + ".x", size_t(rows * stride), 4.0f);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = round_bf16(x[i] * 1e-3f);
    expect_twins_both(name, [&](Side& s) {
      float* xd = s.in(x);
      s->kv_fp8_sim(xd, rows, stride, n_dims);
      Outputs o;
      o.add("x", s.read(xd, x.size()));
      return o;
    });
  }
}

// The joined KV step (one pass on the GPU, the ops in order on the CPU): V4's KV rows (512 dims,
// 64 of RoPE) at decode and at compressed rows' strided positions, a partial 64-block, and a shape
// the joined kernel leaves to the ops (rows not a multiple of 4).
TEST(CudaTwin, KvNormRopeFp8) {
  DSV4_REQUIRE_GPU();
  const auto [plain, yarn, tiny] = test_freqs();
  struct K {
    const RopeFreqs* f;
    int64_t rows, hd, p0, pos_step, nope;
  };
  for (const K& c : {K{&yarn, 1, 512, 4095, 1, 448}, K{&yarn, 5, 512, 384, 128, 448}, K{&plain, 3, 128, 5, 4, 64},
                     K{&tiny, 2, 100, 9, 1, 96}, K{&tiny, 2, 30, 3, 1, 20}}) {
    const std::string name = "kv_norm_rope_fp8 " + std::to_string(c.rows) + "x" + std::to_string(c.hd) + " p" +
                             std::to_string(c.p0) + "+" + std::to_string(c.pos_step) + " nope " + std::to_string(c.nope);
    // wide dynamic range, so 64-blocks get different scales
    std::vector<float> x = random_bf16(name + ".x", size_t(c.rows * c.hd), 4.0f);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = round_bf16(x[i] * 1e-3f);
    const std::vector<float> w = random_uniform(name + ".w", size_t(c.hd), 0.5f, 1.5f);
    expect_twins_both(name, [&](Side& s) {
      float* y = s.out(x.size());
      s->kv_norm_rope_fp8(s.in(x), w.data(), c.rows, c.hd, 1e-6, *c.f, c.p0, c.pos_step, c.nope, y);
      Outputs o;
      o.add("y", s.read(y, x.size()));
      return o;
    });
  }
}

TEST(CudaTwin, IndexerFp4Simulation) {
  DSV4_REQUIRE_GPU();
  for (auto [rows, n] : {std::pair{1, 32}, {17, 128}, {3, 1024}}) {
    const std::string name = "indexer_fp4_sim " + std::to_string(rows) + "x" + std::to_string(n);
    const std::vector<float> x = random_bf16(name + ".x", size_t(rows * n), 2.0f);
    expect_twins_both(name, [&](Side& s) {
      float* xd = s.in(x);
      s->indexer_fp4_sim(xd, rows, n);
      Outputs o;
      o.add("x", s.read(xd, x.size()));
      return o;
    });
  }
}

}  // namespace dsv4::test
