// Mixture of experts: routing and the expert FFNs (architecture.md §3.6).
//
// Routing is fp32: s_e = sqrt(softplus(x·gateᵀ)); hash layers take tid2eid[token], the others the
// top-k of s + bias (ties to the lower id). Weights are s_sel / Σ s_sel · routed_scale.
// Experts: g = min(x·w1ᵀ, L), u = clamp(x·w3ᵀ, ±L), h = round(silu(g)·u·w) (the routing weight is
// applied before w2), y = h·w2ᵀ. The token's output sums its experts in ascending id order and
// then the shared expert in fp32, rounded once.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/parallel.h"

namespace dsv4::cpu {

namespace {

// Tokens per pass through the experts: bounds the [tokens, k, D] expert-output buffer.
constexpr int64_t kMoeTokenChunk = 256;
static_assert(kMoeTokenChunk <= Backend::kMaxMoeTokenChunk);

}  // namespace

void CpuBackend::route(const model::MoeWeights& m, const float* x, const int32_t* tokens, int64_t T, int64_t D,
                       int64_t k, double routed_scale, int32_t* sel, float* weights) {
  const int64_t E = m.gate.out;
  std::vector<float> logits(static_cast<size_t>(T * E));
  linear(m.gate, Compute::f32, x, T, logits.data());
  parallel_for(T, [&](int64_t t) {
    std::vector<float> score(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) score[size_t(e)] = sqrt_f(softplus_f(logits[size_t(t * E + e)]));
    int32_t* st = sel + t * k;
    if (!m.tid2eid.empty()) {
      for (int64_t i = 0; i < k; ++i) st[i] = m.tid2eid[size_t(int64_t(tokens[t]) * k + i)];
    } else {
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        const float va = score[size_t(a)] + m.bias[size_t(a)], vb = score[size_t(b)] + m.bias[size_t(b)];
        return va > vb || (va == vb && a < b);
      });
      std::copy(order.begin(), order.begin() + k, st);
    }
    double sum = 0.0;
    for (int64_t i = 0; i < k; ++i) sum += score[size_t(st[i])];
    for (int64_t i = 0; i < k; ++i) weights[t * k + i] = score[size_t(st[i])] / float(sum) * float(routed_scale);
  });
}

void CpuBackend::expert_ffn(const model::ExpertWeights& e, const float* x, int64_t T, int64_t D, const float* w,
                            double limit, float* y) {
  const int64_t F = e.w1.out;
  std::vector<float> g(static_cast<size_t>(T * F)), u(size_t(T * F));
  linear(e.w1, Compute::quantized, x, T, g.data());
  linear(e.w3, Compute::quantized, x, T, u.data());
  const float L = float(limit);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t f = 0; f < F; ++f) {
      float gv = g[size_t(t * F + f)], uv = u[size_t(t * F + f)];
      if (L > 0) {
        gv = std::fmin(gv, L);
        uv = std::fmin(std::fmax(uv, -L), L);
      }
      const float h = silu_f(gv) * uv;
      g[size_t(t * F + f)] = round(w ? h * w[t] : h);
    }
  linear(e.w2, Compute::quantized, g.data(), T, y);
}

void CpuBackend::moe(const model::MoeWeights& m, const float* x, const int32_t* sel, const float* weights,
                     int64_t T, int64_t D, int64_t k, double limit, float* out) {
  const int64_t E = int64_t(m.experts.size());
  for (int64_t c0 = 0; c0 < T; c0 += kMoeTokenChunk) {
    const int64_t nt = std::min(kMoeTokenChunk, T - c0);
    std::vector<float> expert_out(static_cast<size_t>(nt * k * D));  // [token, slot, D]
    // Each expert gathers its tokens, runs once over all of them, and scatters its outputs.
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int64_t> slots;  // t·k + i
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t i = 0; i < k; ++i)
          if (sel[(c0 + t) * k + i] == e) slots.push_back(t * k + i);
      if (slots.empty()) continue;
      const int64_t n = int64_t(slots.size());
      std::vector<float> xe(static_cast<size_t>(n * D)), we(static_cast<size_t>(n)), ye(static_cast<size_t>(n * D));
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = slots[size_t(r)] / k;
        std::copy(x + (c0 + t) * D, x + (c0 + t + 1) * D, xe.begin() + r * D);
        we[size_t(r)] = weights[c0 * k + slots[size_t(r)]];
      }
      expert_ffn(m.experts[size_t(e)], xe.data(), n, D, we.data(), limit, ye.data());
      for (int64_t r = 0; r < n; ++r)
        std::copy(ye.begin() + r * D, ye.begin() + (r + 1) * D, expert_out.begin() + slots[size_t(r)] * D);
    }
    std::vector<float> shared;
    if (m.shared) {
      shared.resize(size_t(nt * D));
      expert_ffn(*m.shared, x + c0 * D, nt, D, nullptr, limit, shared.data());
    }
    parallel_for(nt, [&](int64_t t) {
      std::vector<int64_t> order(static_cast<size_t>(k));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int64_t a, int64_t b) { return sel[(c0 + t) * k + a] < sel[(c0 + t) * k + b]; });
      for (int64_t dd = 0; dd < D; ++dd) {
        double acc = 0.0;
        for (int64_t i : order) acc += expert_out[size_t((t * k + i) * D + dd)];
        if (m.shared) acc += shared[size_t(t * D + dd)];
        out[(c0 + t) * D + dd] = round(float(acc));
      }
    });
  }
}

}  // namespace dsv4::cpu
