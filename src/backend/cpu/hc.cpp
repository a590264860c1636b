// Manifold-constrained hyper-connections: mHC pre with Sinkhorn, mHC post, and the HC head
// (architecture.md §3.2.1–§3.2.3). All fp32; only the collapsed sublayer input u, the head output
// y and the new HC state are rounded (to bf16 in deepseek numerics).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/parallel.h"

namespace dsv4::cpu {

namespace {

// rsqrt(mean(x²) + eps) over the flattened hc·D state of one token.
float stream_rms_inverse(const float* x, int64_t n, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * double(x[i]);
  return rsqrt_f(float(sum / double(n)) + float(eps));
}

// Sinkhorn projection of the hc×hc comb logits (in place): row softmax + eps, a column
// normalisation, then (iters − 1) row/column normalisation pairs; the last op is a column one.
void sinkhorn(float* M, int64_t hc, int64_t iters, float eps) {
  for (int64_t j = 0; j < hc; ++j) {
    float* row = M + j * hc;
    float mx = row[0];
    for (int64_t k = 1; k < hc; ++k) mx = std::fmax(mx, row[k]);
    double sum = 0.0;
    for (int64_t k = 0; k < hc; ++k) sum += (row[k] = exp_f(row[k] - mx));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / float(sum) + eps;
  }
  auto normalise_columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      double sum = 0.0;
      for (int64_t j = 0; j < hc; ++j) sum += M[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) M[j * hc + k] /= float(sum) + eps;
    }
  };
  normalise_columns();
  for (int64_t it = 1; it < iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < hc; ++k) sum += M[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) M[j * hc + k] /= float(sum) + eps;
    }
    normalise_columns();
  }
}

}  // namespace

void CpuBackend::hc_pre(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D,
                        int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post, float* comb) {
  const int64_t mix_n = p.fn.out;  // (2 + hc)·hc
  std::vector<float> mix(static_cast<size_t>(T * mix_n));
  // x·fnᵀ first, then the rms scale (§3.2.1); the HC state holds bf16 values (§3.2.2)
  linear(p.fn, Compute::f32_bf16_in, X, T, mix.data());
  const float eps = float(hc_eps);
  parallel_for(T, [&](int64_t t) {
    const float* x = X + t * hc * D;
    float* m = mix.data() + t * mix_n;
    const float rs = stream_rms_inverse(x, hc * D, norm_eps);
    for (int64_t i = 0; i < mix_n; ++i) m[i] *= rs;
    std::vector<float> pre(static_cast<size_t>(hc));
    for (int64_t h = 0; h < hc; ++h) {
      pre[size_t(h)] = sigmoid_f(m[h] * p.scale[0] + p.base[size_t(h)]) + eps;
      post[t * hc + h] = 2.0f * sigmoid_f(m[hc + h] * p.scale[1] + p.base[size_t(hc + h)]);
    }
    float* M = comb + t * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) M[i] = m[2 * hc + i] * p.scale[2] + p.base[size_t(2 * hc + i)];
    sinkhorn(M, hc, sinkhorn_iters, eps);
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0.0;
      for (int64_t h = 0; h < hc; ++h) acc += double(pre[size_t(h)]) * double(x[h * D + d]);
      u[t * D + d] = round(float(acc));
    }
  });
}

// X'[k, d] = post_k · a[d] + Σ_j comb[j, k] · X[j, d]: output stream k takes column k of comb.
void CpuBackend::hc_post(const float* a, const float* X, const float* post, const float* comb, int64_t T,
                         int64_t hc, int64_t D, float* X_out) {
  parallel_for(T, [&](int64_t t) {
    const float* x = X + t * hc * D;
    const float* M = comb + t * hc * hc;
    std::vector<float> in(static_cast<size_t>(hc));  // X[t, ·, d], read before X_out (may be X) is written
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t j = 0; j < hc; ++j) in[size_t(j)] = x[j * D + d];
      for (int64_t k = 0; k < hc; ++k) {
        double acc = double(post[t * hc + k]) * double(a[t * D + d]);
        for (int64_t j = 0; j < hc; ++j) acc += double(M[j * hc + k]) * double(in[size_t(j)]);
        X_out[(t * hc + k) * D + d] = round(float(acc));
      }
    }
  });
}

void CpuBackend::hc_head(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D,
                         double hc_eps, double norm_eps, float* y) {
  std::vector<float> mix(static_cast<size_t>(T * hc));
  linear(p.fn, Compute::f32_bf16_in, X, T, mix.data());
  parallel_for(T, [&](int64_t t) {
    const float* x = X + t * hc * D;
    const float rs = stream_rms_inverse(x, hc * D, norm_eps);
    std::vector<float> pre(static_cast<size_t>(hc));
    for (int64_t h = 0; h < hc; ++h)
      pre[size_t(h)] = sigmoid_f(mix[size_t(t * hc + h)] * rs * p.scale[0] + p.base[size_t(h)]) + float(hc_eps);
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0.0;
      for (int64_t h = 0; h < hc; ++h) acc += double(pre[size_t(h)]) * double(x[h * D + d]);
      y[t * D + d] = round(float(acc));
    }
  });
}

}  // namespace dsv4::cpu
