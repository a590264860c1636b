// Twins of the hyper-connection ops (cpu/hc.cpp ↔ cuda/hc.cu): mHC pre with Sinkhorn, mHC post
// and the HC head, at sizes 1, odd and the tiny config.
#include "twin.h"

namespace dsv4::test {

struct HcWeights {
  std::unique_ptr<HostLinear> fn;
  model::HcParams p;
};

HcWeights random_hc(const std::string& name, int64_t mix, int64_t hc, int64_t D) {
  HcWeights w;
  w.fn = random_linear(name + ".fn", model::WeightFormat::f32, mix, hc * D, 0.3f);
  w.p.fn = w.fn->W;
  w.p.base = random_f32(name + ".base", size_t(mix), 0.5f);
  w.p.scale = random_uniform(name + ".scale", 3, 0.5f, 2.0f);
  return w;
}

// hc_pre, then hc_post out of place and in place, on random operands of T tokens; and hc_pre_norm
// (the CPU's is hc_pre then rms_norm, the CUDA one a launch of its own).
static void expect_hc_pre_post(int64_t T, int64_t hc, int64_t D) {
  const std::string name = "hc_pre/post T" + std::to_string(T) + " hc" + std::to_string(hc) + " D" + std::to_string(D);
  const int64_t mix = (2 + hc) * hc;
  const HcWeights w = random_hc(name, mix, hc, D);
  const std::vector<float> X = random_bf16(name + ".X", size_t(T * hc * D));
  const std::vector<float> a = random_bf16(name + ".a", size_t(T * D));
  const std::vector<float> norm_w = random_uniform(name + ".norm", size_t(D), 0.5f, 1.5f);
  expect_twins_both(name, [&](Side& s) {
    float* u = s.out(size_t(T * D));
    float* post = s.out(size_t(T * hc));
    float* comb = s.out(size_t(T * hc * hc));
    const float* Xd = s.in(X);
    s->hc_pre(w.p, Xd, T, hc, D, 20, 1e-6, 1e-6, u, post, comb);
    float* X_out = s.out(size_t(T * hc * D));
    s->hc_post(s.in(a), Xd, post, comb, T, hc, D, X_out);
    float* X_in_place = s.in(X);  // as the engine calls it
    s->hc_post(s.in(a), X_in_place, post, comb, T, hc, D, X_in_place);
    float* u_n = s.out(size_t(T * D));
    float* post_n = s.out(size_t(T * hc));
    float* comb_n = s.out(size_t(T * hc * hc));
    float* x_n = s.out(size_t(T * D));
    s->hc_pre_norm(w.p, norm_w.data(), Xd, T, hc, D, 20, 1e-6, 1e-6, u_n, post_n, comb_n, x_n);
    Outputs o;
    o.add("u", s.read(u, size_t(T * D)));
    o.add("norm's u", s.read(u_n, size_t(T * D)));
    o.add("norm's post", s.read(post_n, size_t(T * hc)));
    o.add("norm's comb", s.read(comb_n, size_t(T * hc * hc)));
    o.add("norm's x", s.read(x_n, size_t(T * D)));
    o.add("post", s.read(post, size_t(T * hc)));
    o.add("comb", s.read(comb, size_t(T * hc * hc)));
    o.add("X_out", s.read(X_out, size_t(T * hc * D)));
    o.add("X in place", s.read(X_in_place, size_t(T * hc * D)));
    return o;
  });
}

TEST(CudaTwin, HcPreAndPost) {
  DSV4_REQUIRE_GPU();
  // Decode-sized calls (slices of D beside the Sinkhorn's block), then prefill-sized ones (hc_pre:
  // one block per token once T is above half the SMs). The last one's inputs are large enough
  // (880 KB for a) that an upload outside the backend's stream was still landing when hc_post ran.
  for (auto [T, hc, D] : {std::tuple{1, 1, 1}, {1, 4, 256}, {31, 4, 17}, {9, 4, 256}, {3, 2, 100}, {2, 5, 64},
                          {100, 4, 300}, {300, 5, 64}, {200, 4, 1100}})
    expect_hc_pre_post(T, hc, D);
}

// hc_post of a sublayer's output, then hc_pre_norm of the next sublayer: at decode one launch on
// the GPU across grid barriers, the two ops on the CPU. `calls` times back to back, as sublayers
// follow one another in a step (each call's gates are the next one's, with the same output a):
// the barrier word goes on from where the launch before left it.
static void expect_hc_post_pre_norm(int64_t T, int64_t hc, int64_t D, int calls) {
  const std::string name = "hc_post_pre_norm T" + std::to_string(T) + " hc" + std::to_string(hc) + " D" +
                           std::to_string(D) + " ×" + std::to_string(calls);
  const int64_t mix = (2 + hc) * hc;
  const HcWeights w = random_hc(name, mix, hc, D);
  const std::vector<float> X = random_bf16(name + ".X", size_t(T * hc * D));
  const std::vector<float> a = random_bf16(name + ".a", size_t(T * D));
  const std::vector<float> post = random_uniform(name + ".post", size_t(T * hc), 0.0f, 2.0f);
  const std::vector<float> comb = random_uniform(name + ".comb", size_t(T * hc * hc), 0.0f, 1.0f);
  const std::vector<float> norm_w = random_uniform(name + ".norm", size_t(D), 0.5f, 1.5f);
  expect_twins_both(name, [&](Side& s) {
    float* Xd = s.in(X);
    const float* ad = s.in(a);
    float *post_in = s.in(post), *comb_in = s.in(comb), *u = nullptr, *post_out = nullptr, *comb_out = nullptr,
          *x = nullptr;
    for (int c = 0; c < calls; ++c) {
      u = s.out(size_t(T * D)), post_out = s.out(size_t(T * hc)), comb_out = s.out(size_t(T * hc * hc));
      x = s.out(size_t(T * D));
      s->hc_post_pre_norm(ad, Xd, post_in, comb_in, w.p, norm_w.data(), T, hc, D, 20, 1e-6, 1e-6, u, post_out,
                          comb_out, x);
      post_in = post_out, comb_in = comb_out;
    }
    Outputs o;
    o.add("X", s.read(Xd, size_t(T * hc * D)));
    o.add("u", s.read(u, size_t(T * D)));
    o.add("post", s.read(post_out, size_t(T * hc)));
    o.add("comb", s.read(comb_out, size_t(T * hc * hc)));
    o.add("x", s.read(x, size_t(T * D)));
    return o;
  });
}

TEST(CudaTwin, HcPostPreNorm) {
  DSV4_REQUIRE_GPU();
  // One launch: V4-Flash's D over 32 slices (also three in a row), uneven slices, one slice, hc 1
  // and 5; then above the joined launch's token count (the two ops).
  for (auto [T, hc, D, calls] : {std::tuple{1, 4, 4096, 1}, {1, 4, 4096, 3}, {3, 4, 1000, 2}, {8, 5, 64, 1},
                                 {1, 1, 1, 1}, {2, 2, 300, 1}, {9, 4, 256, 2}})
    expect_hc_post_pre_norm(T, hc, D, calls);
}

TEST(CudaTwin, HcHead) {
  DSV4_REQUIRE_GPU();
  for (auto [T, hc, D] : {std::tuple{1, 4, 256}, {31, 4, 17}, {5, 3, 64}}) {
    const std::string name = "hc_head T" + std::to_string(T) + " hc" + std::to_string(hc) + " D" + std::to_string(D);
    const HcWeights w = random_hc(name, hc, hc, D);
    const std::vector<float> X = random_bf16(name + ".X", size_t(T * hc * D));
    expect_twins_both(name, [&](Side& s) {
      float* y = s.out(size_t(T * D));
      s->hc_head(w.p, s.in(X), T, hc, D, 1e-6, 1e-6, y);
      Outputs o;
      o.add("y", s.read(y, size_t(T * D)));
      return o;
    });
  }
}

}  // namespace dsv4::test
