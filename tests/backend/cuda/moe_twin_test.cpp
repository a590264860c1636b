// Twins of the MoE ops (cpu/moe.cpp ↔ cuda/moe.cu): score and hash routing, and the routed
// (FP4) plus shared (FP8) SwiGLU experts with the clamp.
#include "twin.h"

namespace dsv4::test {

using model::WeightFormat;

struct MoeHost {
  std::unique_ptr<HostLinear> gate;
  std::vector<std::unique_ptr<HostLinear>> store;
  model::MoeWeights m;
};

MoeHost random_moe(const std::string& name, int64_t E, int64_t D, int64_t F, int64_t k, int64_t vocab, bool hash,
                   bool shared) {
  MoeHost h;
  h.gate = random_linear(name + ".gate", WeightFormat::bf16, E, D, 0.1f);
  h.m.gate = h.gate->W;
  if (hash) {
    std::mt19937 rng(seed_of(name + ".tid2eid"));
    for (int64_t i = 0; i < vocab * k; ++i) h.m.tid2eid.push_back(int32_t(rng() % uint32_t(E)));
  } else {
    h.m.bias = random_f32(name + ".bias", size_t(E), 0.05f);
  }
  auto expert = [&](const std::string& en, WeightFormat f) {
    model::ExpertWeights e;
    for (auto [w, out, in, tag] : {std::tuple{&e.w1, F, D, ".w1"}, {&e.w3, F, D, ".w3"}, {&e.w2, D, F, ".w2"}}) {
      h.store.push_back(random_linear(en + tag, f, out, in, 0.05f));
      *w = h.store.back()->W;
    }
    return e;
  };
  for (int64_t e = 0; e < E; ++e) h.m.experts.push_back(expert(name + ".e" + std::to_string(e), WeightFormat::fp4));
  if (shared) h.m.shared = expert(name + ".shared", WeightFormat::fp8);
  return h;
}

struct MoeCase {
  int64_t T, E, D, F, k;
  bool hash, shared;
  double limit;
};

TEST(CudaTwin, RouteAndMoe) {
  DSV4_REQUIRE_GPU();
  const int64_t vocab = 64;
  const std::vector<MoeCase> cases = {
      {1, 8, 256, 128, 2, false, true, 10.0},   // tiny config, decode
      {1, 8, 256, 128, 2, true, true, 10.0},    // hash layer
      {31, 8, 256, 128, 2, false, true, 10.0},  // tiny config, prefill
      {17, 33, 96, 64, 3, false, false, 0.0},   // odd expert count, no shared expert, no clamp
      {9, 33, 96, 64, 3, true, true, 0.5},      // hash, tight clamp
      {5, 256, 128, 64, 6, false, true, 10.0},  // V4-Flash expert count and k
      {90, 8, 256, 128, 2, false, true, 10.0},  // prefill on the tensor cores: rows grouped by expert
      {70, 33, 96, 64, 3, true, false, 0.5},    // … with a hash layer and partial expert tiles
  };
  for (const MoeCase& c : cases) {
    const std::string name = "route/moe T" + std::to_string(c.T) + " E" + std::to_string(c.E) + " D" +
                             std::to_string(c.D) + " F" + std::to_string(c.F) + " k" + std::to_string(c.k) +
                             (c.hash ? " hash" : "") + (c.shared ? " shared" : "") + " L" + std::to_string(c.limit);
    const MoeHost h = random_moe(name, c.E, c.D, c.F, c.k, vocab, c.hash, c.shared);
    const std::vector<float> x = random_bf16(name + ".x", size_t(c.T * c.D));
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < c.T; ++t) tokens.push_back(int32_t((t * 29 + 3) % vocab));
    expect_twins_both(name, [&](Side& s) {
      int32_t* sel = s.ids_out(size_t(c.T * c.k));
      float* weights = s.out(size_t(c.T * c.k));
      float* out = s.out(size_t(c.T * c.D));
      const float* xd = s.in(x);
      s->route(h.m, xd, s.ids(tokens), c.T, c.D, c.k, 1.5, sel, weights);
      s->moe(h.m, xd, sel, weights, c.T, c.D, c.k, c.limit, out);
      Outputs o;
      o.add("sel", s.read_ids(sel, size_t(c.T * c.k)));
      o.add("weights", s.read(weights, size_t(c.T * c.k)));
      o.add("out", s.read(out, size_t(c.T * c.D)));
      return o;
    });
  }
}

}  // namespace dsv4::test
