// The KV rows' last steps in one pass (the joined op kv_norm_rope_fp8; its definition, in
// backend.cpp, is rms_norm, rope and kv_fp8_sim in order): a decoded token's KV row is one vector
// of 512, and on an H100 the three launches took 12.4 µs under ncu, this one 5.5.
//
// Every value is computed as the separate kernels compute it: rms_norm_kernel's norm (its sum of
// squares in another order, a double sum: device_math.cuh), rope_kernel's rotation (cos/sin of
// fp32(p)·f_k, a rounded 2-term double dot product) and kv_fp8_sim_kernel's 64-blocks. A block per
// row, a thread per 4 consecutive dims, so a 64-block of the FP8 simulation is 16 lanes of a warp
// (its amax a shuffle reduction over them).
//
// (The query heads' norm and RoPE joined the same way, a warp per head with a RoPE pair in
// neighbouring lanes, took 9.3 µs at decode against 7.5 for head_norm and rope, and ≈ 40% longer
// at a 4K prefill: they stay two launches.)
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/rope.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kMaxHalf = 256;  // RoPE pairs per row

__global__ void kv_norm_rope_fp8_kernel(const float* x, const float* w, int64_t hd, float eps, const float* freqs,
                                        int64_t half, int64_t p0, int64_t pos_step, int64_t nope, bool deepseek,
                                        float* y) {
  __shared__ double scratch[32];
  __shared__ float trig[2 * kMaxHalf];
  const int64_t row = blockIdx.x, d0 = int64_t(threadIdx.x) * kRowGroup;
  rope_trig(float(p0 + row * pos_step), freqs, half, false, trig);  // (freqs: a weight, read before the wait)
  await_previous_kernel();
  float v[kRowGroup] = {};
  if (d0 < hd) load4(x + row * hd, d0, hd, true, v);  // (hd a multiple of 4, rows 16-byte aligned: the host checks)
  double sum = 0.0;
#pragma unroll
  for (int u = 0; u < kRowGroup; ++u) sum += double(v[u]) * double(v[u]);
  sum = block_sum(sum, scratch);
  const float inv = rms_inverse(sum, hd, eps);
#pragma unroll
  for (int u = 0; u < kRowGroup; ++u) v[u] = d0 + u < hd ? round_if(deepseek, w[d0 + u] * (v[u] * inv)) : 0.0f;
  const int64_t offset = hd - 2 * half;  // even: a thread's two pairs are (d0, d0 + 1) and (d0 + 2, d0 + 3)
#pragma unroll
  for (int u = 0; u < kRowGroup; u += 2) {
    if (d0 + u < offset || d0 + u >= hd) continue;
    const int64_t k = (d0 + u - offset) / 2;
    const float a = v[u], b = v[u + 1], c = trig[k], s = trig[half + k];
    v[u] = rotated(true, a, b, c, s, deepseek);
    v[u + 1] = rotated(false, a, b, c, s, deepseek);
  }
  if (deepseek) {  // dims below nope (at most offset: the host checks), 64-blocks of 16 lanes
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) amax = d0 + u < nope ? fmaxf(amax, fabsf(v[u])) : amax;
    for (int lanes = 8; lanes > 0; lanes /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, lanes));
    const int e = fp8_scale_exp(amax);
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u)
      if (d0 + u < nope) v[u] = fp8_sim(v[u], e);
  }
  if (d0 < hd) store4(y + row * hd, d0, hd, true, v);
}

}  // namespace

void CudaBackend::kv_norm_rope_fp8(const float* x, const float* w, int64_t rows, int64_t hd, double eps,
                                   const RopeFreqs& freqs, int64_t p0, int64_t pos_step, int64_t nope, float* y) {
  const int64_t half = int64_t(freqs.freqs.size());
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (hd % kRowGroup != 0 || hd > 1024 * kRowGroup || half > kMaxHalf || 2 * half > hd || nope > hd - 2 * half ||
      !aligned || w == nullptr || rows >= (int64_t(1) << 31))
    return Backend::kv_norm_rope_fp8(x, w, rows, hd, eps, freqs, p0, pos_step, nope, y);
  Timed timed(*this, "kv_norm_rope_fp8");
  if (rows == 0) return;
  // w is a model weight (host memory): its device copy, uploaded once.
  const float* dw = static_cast<const float*>(upload(w, size_t(hd) * sizeof(float)));
  const unsigned threads = unsigned(std::max<int64_t>(32, (hd / kRowGroup + 31) / 32 * 32));
  launch(kv_norm_rope_fp8_kernel, unsigned(rows), threads, 0, stream_, x, dw, hd, float(eps), device_floats(freqs.freqs),
         half, p0, pos_step, nope, deepseek(), y);
  DSV4_CUDA_LAUNCHED("kv_norm_rope_fp8");
}

}  // namespace dsv4::cuda
