// Rotary position embedding on the trailing dims of a row, interleaved pairs (twin of
// cpu/rope.cpp; architecture.md §3.0).
//
// Parallelisation: one block per group (token or compressed row), threads over (head, pair).
// angle = fp32(p)·f_k, computed afresh per pair (never accumulated); cos/sin in double, rounded
// once; the rotation is two 2-term dot products in double (exact products), rounded once.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"

namespace dsv4::cuda {

namespace {

__global__ void rope_kernel(float* x, int64_t group, int64_t row_stride, const float* freqs, int64_t half,
                            int64_t pos0, int64_t pos_step, bool inverse, bool bf16) {
  const int64_t i = blockIdx.x;
  const float p = float(pos0 + i * pos_step);
  const int64_t offset = row_stride - 2 * half;
  for (int64_t e = threadIdx.x; e < group * half; e += blockDim.x) {
    const int64_t h = e / half, k = e % half;
    const float angle = p * freqs[k];
    const float c = cos_f(angle);
    const float s = inverse ? -sin_f(angle) : sin_f(angle);
    float* v = x + (i * group + h) * row_stride + offset + 2 * k;
    const double a = v[0], b = v[1];
    v[0] = round_if(bf16, float(a * c - b * s));
    v[1] = round_if(bf16, float(a * s + b * c));
  }
}

}  // namespace

void CudaBackend::rope(float* x, int64_t n_groups, int64_t group, int64_t row_stride, const RopeFreqs& freqs,
                       int64_t pos0, int64_t pos_step, bool inverse) {
  Timed timed(*this, "rope");
  const int64_t half = int64_t(freqs.freqs.size());
  if (n_groups == 0 || group == 0 || half == 0) return;
  DSV4_CUDA_REQUIRE(2 * half <= row_stride, "rope: ", 2 * half, " rope dims in rows of ", row_stride);
  rope_kernel<<<unsigned(n_groups), 128, 0, stream_>>>(x, group, row_stride, device_floats(freqs.freqs), half, pos0,
                                                       pos_step, inverse, deepseek());
  DSV4_CUDA_LAUNCHED("rope");
}

}  // namespace dsv4::cuda
