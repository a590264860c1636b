// The KV compressors' pooling step (twin of cpu/compressor.cpp; architecture.md §3.4.3,
// §4.2–§4.4).
//
// ape is added to the gate scores, each token's pair is pushed into the per-sequence fp32 carry,
// and each window that completes is pooled with an independent softmax per channel over its rows.
//   ratio 4 (overlapping, width 2d): carry rows 0–3 are the previous window, 4–7 the current one;
//     output channel c pools column c of rows 0–3 and column d + c of rows 4–7.
//   ratio 128 (width d): 128 rows, slot = position mod 128.
//
// Parallelisation: channels are independent through the whole push (output channel c only ever
// reads and writes carry columns c and, for ratio 4, d + c), so one thread owns one output
// channel and walks the T tokens in order, exactly the CPU's loop restricted to its columns. The
// number of completed windows is known on the host from the positions alone.
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kChannelThreads = 128;

struct PushArgs {
  const float* ape;  // [ratio, width]
  int64_t ratio, d, width, p0, T;
  const float* a;  // [T, width]
  const float* s;
  float* carry_a;
  float* carry_s;
  bool bf16;
  float* pooled;  // [n_emitted, d]
};

__global__ void compressor_push_kernel(PushArgs k) {
  await_previous_kernel();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= k.d) return;
  const int64_t r = k.ratio, width = k.width;
  const bool overlap = r == 4;
  const int n_cols = overlap ? 2 : 1;
  const int64_t cols[2] = {c, k.d + c};
  int64_t n_emitted = 0;
  for (int64_t i = 0; i < k.T; ++i) {
    const int64_t j = k.p0 + i;
    const int64_t slot = overlap ? 4 + j % 4 : j % r;
    const float* ape = k.ape + (j % r) * width;
    for (int q = 0; q < n_cols; ++q) {
      const int64_t col = cols[q];
      k.carry_a[slot * width + col] = k.a[i * width + col];
      k.carry_s[slot * width + col] = k.s[i * width + col] + ape[col];
    }
    if ((j + 1) % r != 0) continue;

    // Window complete: softmax over its rows of this channel, then the weighted sum.
    const int64_t n_rows = overlap ? 2 * r : r;
    auto column = [&](int64_t row) { return overlap && row >= 4 ? k.d + c : c; };
    float mx = -INFINITY;
    for (int64_t row = 0; row < n_rows; ++row) mx = fmaxf(mx, k.carry_s[row * width + column(row)]);
    double sum = 0.0;
    for (int64_t row = 0; row < n_rows; ++row) sum += exp_f(k.carry_s[row * width + column(row)] - mx);
    double acc = 0.0;
    for (int64_t row = 0; row < n_rows; ++row) {
      const float e = exp_f(k.carry_s[row * width + column(row)] - mx);
      acc += double(e / float(sum)) * double(k.carry_a[row * width + column(row)]);
    }
    k.pooled[n_emitted * k.d + c] = round_if(k.bf16, float(acc));  // rounded before its RMSNorm (§3.4.3)
    ++n_emitted;
    if (overlap)  // the current window becomes the previous one
      for (int64_t row = 0; row < 4; ++row)
        for (int q = 0; q < n_cols; ++q) {
          const int64_t col = cols[q];
          k.carry_a[row * width + col] = k.carry_a[(row + 4) * width + col];
          k.carry_s[row * width + col] = k.carry_s[(row + 4) * width + col];
        }
  }
}

}  // namespace

void CudaBackend::compressor_reset(const model::CompressorWeights& cw, CompressorCarry carry) {
  Timed timed(*this, "compressor_reset");
  const size_t n = size_t(cw.carry_rows() * cw.width());
  fill(carry.a, 0.0f, n);
  fill(carry.s, -INFINITY, n);
}

int64_t CudaBackend::compressor_push(const model::CompressorWeights& cw, CompressorCarry carry, const float* a,
                                     const float* s, int64_t p0, int64_t T, float* pooled) {
  Timed timed(*this, "compressor_push");
  const int64_t r = cw.ratio;
  DSV4_CUDA_REQUIRE(r > 0 && int64_t(cw.ape.size()) == r * cw.width(), "compressor_push: ratio ", r, ", ape ",
                    cw.ape.size(), ", width ", cw.width());
  // Windows w with r·w + r − 1 in [p0, p0 + T).
  const int64_t n_emitted = (p0 + T) / r - p0 / r;
  if (T == 0) return 0;
  const PushArgs args{device_floats(cw.ape), r, cw.dim, cw.width(), p0, T, a, s, carry.a, carry.s, deepseek(),
                      pooled};
  launch(compressor_push_kernel, unsigned((cw.dim + kChannelThreads - 1) / kChannelThreads), kChannelThreads, 0,
         stream_, args);
  DSV4_CUDA_LAUNCHED("compressor_push");
  return n_emitted;
}

}  // namespace dsv4::cuda
