#include "backend/backend.h"

#include "core/error.h"
#include "model/weights.h"

namespace dsv4 {

const char* to_string(Numerics numerics) {
  switch (numerics) {
    case Numerics::deepseek: return "deepseek";
    case Numerics::plain: return "plain";
    case Numerics::deepseek_tc: return "deepseek-tc";
  }
  return "?";
}

Numerics parse_numerics(const std::string& name) {
  for (Numerics n : {Numerics::deepseek, Numerics::plain, Numerics::deepseek_tc})
    if (name == to_string(n)) return n;
  fail(ErrorCode::invalid_input, "numerics '{}': expected 'deepseek', 'plain' or 'deepseek-tc'", name);
}

void Backend::hc_pre_norm(const model::HcParams& p, const float* w, const float* X, int64_t T, int64_t hc,
                          int64_t D, int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post,
                          float* comb, float* x) {
  hc_pre(p, X, T, hc, D, sinkhorn_iters, hc_eps, norm_eps, u, post, comb);
  rms_norm(u, w, T, D, norm_eps, x);
}

void Backend::kv_norm_rope_fp8(const float* x, const float* w, int64_t rows, int64_t hd, double eps,
                               const RopeFreqs& freqs, int64_t p0, int64_t pos_step, int64_t nope, float* y) {
  rms_norm(x, w, rows, hd, eps, y);
  rope(y, rows, 1, hd, freqs, p0, pos_step, false);
  kv_fp8_sim(y, rows, hd, nope);
}

void Backend::hc_post_pre_norm(const float* a, float* X, const float* post, const float* comb,
                               const model::HcParams& p, const float* w, int64_t T, int64_t hc, int64_t D,
                               int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post_out,
                               float* comb_out, float* x) {
  hc_post(a, X, post, comb, T, hc, D, X);
  hc_pre_norm(p, w, X, T, hc, D, sinkhorn_iters, hc_eps, norm_eps, u, post_out, comb_out, x);
}

void Backend::grouped_linear(const model::Linear& W, Compute compute, const float* x, int64_t T, int64_t groups,
                             float* y) {
  DSV4_CHECK(groups > 0 && W.out % groups == 0, "{}: {} rows do not split into {} groups", W.name, W.out, groups);
  const int64_t R = W.out / groups;
  for (int64_t g = 0; g < groups; ++g) linear(W, compute, x + g * W.in, groups * W.in, T, y + g * R, W.out, g * R, R);
}

}  // namespace dsv4
