// A seeded MoE layer (router, FP4 routed experts, an FP8 shared expert), shared by the exact twins
// (moe_twin_test.cpp) and deepseek-tc's tensor-core bound test (moe_tc_test.cpp).
#pragma once

#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "twin.h"

namespace dsv4::test {

using model::WeightFormat;

struct MoeHost {
  std::unique_ptr<HostLinear> gate;
  std::vector<std::unique_ptr<HostLinear>> store;
  model::MoeWeights m;
};

inline MoeHost random_moe(const std::string& name, int64_t E, int64_t D, int64_t F, int64_t k, int64_t vocab, bool hash,
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

struct MoeOutputs {
  std::vector<int32_t> sel;
  std::vector<float> weights, out;
};

// The case's name, layer and inputs (tokens cycling through the vocabulary), and the call.
struct MoeInputs {
  std::string name;
  MoeHost h;
  std::vector<float> x;
  std::vector<int32_t> tokens;

  MoeInputs(const MoeCase& c, int64_t vocab)
      : name("route/moe T" + std::to_string(c.T) + " E" + std::to_string(c.E) + " D" + std::to_string(c.D) + " F" +
             std::to_string(c.F) + " k" + std::to_string(c.k) + (c.hash ? " hash" : "") +
             (c.shared ? " shared" : "") + " L" + std::to_string(c.limit)),
        h(random_moe(name, c.E, c.D, c.F, c.k, vocab, c.hash, c.shared)),
        x(random_bf16(name + ".x", size_t(c.T * c.D))) {
    for (int64_t t = 0; t < c.T; ++t) tokens.push_back(int32_t((t * 29 + 3) % vocab));
  }

  // route, then moe, on side s (routed scale 1.5).
  MoeOutputs run(Side& s, const MoeCase& c) const {
    int32_t* sel = s.ids_out(size_t(c.T * c.k));
    float* weights = s.out(size_t(c.T * c.k));
    float* out = s.out(size_t(c.T * c.D));
    const float* xd = s.in(x);
    s->route(h.m, xd, s.ids(tokens), c.T, c.D, c.k, 1.5, sel, weights);
    s->moe(h.m, xd, sel, weights, c.T, c.D, c.k, c.limit, out);
    return {s.read_ids(sel, size_t(c.T * c.k)), s.read(weights, size_t(c.T * c.k)), s.read(out, size_t(c.T * c.D))};
  }
};

}  // namespace dsv4::test
