// Normalisations and elementwise ops (architecture.md §3.0 RMSNorm, §3.3 per-head q norm).
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/parallel.h"

namespace dsv4::cpu {

// RMSNorm: in fp32, v = mean(x²); y = w · (x · rsqrt(v + eps)), weight applied before the bf16
// rounding (§3.0).
void CpuBackend::rms_norm(const float* x, const float* w, int64_t rows, int64_t n, double eps, float* y) {
  parallel_for(rows, [&](int64_t r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i]) * double(xr[i]);
    const float inv = rsqrt_f(float(sum / double(n)) + float(eps));
    for (int64_t i = 0; i < n; ++i) {
      const float v = xr[i] * inv;
      yr[i] = round(w ? w[i] * v : v);
    }
  });
}

// Weightless per-head RMSNorm of q. The reference runs it on bf16 tensors, so in deepseek
// numerics every intermediate is rounded to bf16: q², the mean (fp32 accumulation), mean + eps,
// the rsqrt and the product (§5).
void CpuBackend::head_norm(float* q, int64_t rows, int64_t n, double eps) {
  parallel_for(rows, [&](int64_t r) {
    float* qr = q + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(round(qr[i] * qr[i]));
    const float mean = round(float(sum / double(n)));
    const float inv = round(rsqrt_f(round(mean + float(eps))));
    for (int64_t i = 0; i < n; ++i) qr[i] = round(qr[i] * inv);
  });
}

void CpuBackend::scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] = round(x[i] * s);
}

void CpuBackend::add(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = round(a[i] + b[i]);
}

// KV FP8 simulation: dims [0, n_dims) of each row in 64-blocks (§3.3); rope dims untouched.
void CpuBackend::kv_fp8_sim(float* x, int64_t rows, int64_t row_stride, int64_t n_dims) {
  if (!deepseek()) return;
  parallel_for(rows, [&](int64_t r) {
    for (int64_t k0 = 0; k0 < n_dims; k0 += 64) fp8_sim_block(x + r * row_stride + k0, std::min<int64_t>(64, n_dims - k0));
  });
}

// Indexer quantization-aware step: Hadamard over the row, then FP4 simulation in 32-blocks (§3.5).
void CpuBackend::indexer_fp4_sim(float* x, int64_t rows, int64_t n) {
  if (!deepseek()) return;
  parallel_for(rows, [&](int64_t r) {
    float* xr = x + r * n;
    hadamard_bf16(xr, n);
    for (int64_t k0 = 0; k0 < n; k0 += 32) fp4_sim_block(xr + k0, 32);
  });
}

}  // namespace dsv4::cpu
