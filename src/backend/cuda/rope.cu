// Rotary position embedding on the trailing dims of a row, interleaved pairs (twin of
// cpu/rope.cpp; architecture.md §3.0).
//
// Parallelisation: grid (group, chunk of kHeadsPerBlock rows of the group); the block first puts
// the cos/sin of its position's `half` angles in shared memory (one thread each), then threads
// rotate the (row, pair)s. angle = fp32(p)·f_k, computed afresh per position (never accumulated);
// cos/sin in double, rounded once; the rotation is two 2-term dot products in double (exact
// products), rounded once. (One block per group, each thread evaluating cos/sin for every head,
// took 12 µs for the 64 query heads of a decoded token on an H200.)
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/rope.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kRopeThreads = 128;
constexpr int64_t kHeadsPerBlock = 8;

__global__ void rope_kernel(float* x, int64_t group, int64_t row_stride, const float* freqs, int64_t half,
                            int64_t pos0, int64_t pos_step, bool inverse, bool bf16) {
  await_previous_kernel();
  extern __shared__ float trig[];  // [half] cos, then [half] sin (negated for the inverse)
  const int64_t i = blockIdx.x, h0 = int64_t(blockIdx.y) * kHeadsPerBlock;
  rope_trig(float(pos0 + i * pos_step), freqs, half, inverse, trig);
  const int64_t heads = min(kHeadsPerBlock, group - h0), offset = row_stride - 2 * half;
  for (int64_t e = threadIdx.x; e < heads * half; e += blockDim.x) {
    const int64_t h = h0 + e / half, k = e % half;
    const float c = trig[k], s = trig[half + k];
    float* v = x + (i * group + h) * row_stride + offset + 2 * k;
    const float a = v[0], b = v[1];
    v[0] = rotated(true, a, b, c, s, bf16);
    v[1] = rotated(false, a, b, c, s, bf16);
  }
}

}  // namespace

void CudaBackend::rope(float* x, int64_t n_groups, int64_t group, int64_t row_stride, const RopeFreqs& freqs,
                       int64_t pos0, int64_t pos_step, bool inverse) {
  Timed timed(*this, "rope");
  const int64_t half = int64_t(freqs.freqs.size());
  if (n_groups == 0 || group == 0 || half == 0) return;
  DSV4_CUDA_REQUIRE(2 * half <= row_stride, "rope: ", 2 * half, " rope dims in rows of ", row_stride);
  const int64_t chunks = (group + kHeadsPerBlock - 1) / kHeadsPerBlock;
  DSV4_CUDA_REQUIRE(n_groups < (int64_t(1) << 31) && chunks < 65536 && 2 * half * sizeof(float) <= 48 * 1024,
                    "rope: ", n_groups, " groups of ", group, " rows with ", half, " pairs exceed the launch limits");
  launch(rope_kernel, dim3(unsigned(n_groups), unsigned(chunks)), kRopeThreads, size_t(2 * half) * sizeof(float),
         stream_, x, group, row_stride, device_floats(freqs.freqs), half, pos0, pos_step, inverse, deepseek());
  DSV4_CUDA_LAUNCHED("rope");
}

}  // namespace dsv4::cuda
