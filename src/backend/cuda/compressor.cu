// The KV compressors' pooling step (twin of cpu/compressor.cpp; architecture.md §3.4.3,
// §4.2–§4.4).
//
// ape is added to the gate scores, each token's pair is pushed into the per-sequence fp32 carry,
// and each window that completes is pooled with an independent softmax per channel over its rows.
//   ratio 4 (overlapping, width 2d): carry rows 0–3 are the previous window, 4–7 the current one;
//     output channel c pools column c of rows 0–3 and column d + c of rows 4–7.
//   ratio 128 (width d): 128 rows, slot = position mod 128.
//
// Parallelisation: every completed window pools on its own, one thread per (window, output
// channel), reading each of its rows from the chunk's input or, for positions before the chunk,
// from the carry as it was; then one thread per carry column leaves the carry as the CPU's token
// loop does (each slot's last position, and for ratio 4 rows 0–3 the last completed window). The
// values, their order and every sum are the loop's, so the result is bit for bit the CPU's.
// (Before: one thread per channel walking the chunk's tokens in order, 4 blocks for d = 512:
// 4.1 ms per 2 048-token push on an H200.)
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

// Row `row` of window w's pooling, output channel c: (a, s + ape) of the position it holds, from
// the input when the position is in the chunk, else from the carry as the chunk found it. Ratio 4:
// rows 0–3 are window w − 1 (column c), rows 4–7 window w (column d + c); a position before the
// chunk is in the window straddling p0 (carry rows 4–7) or in the one before (rows 0–3).
__device__ inline void window_row(const PushArgs& k, int64_t w, int64_t row, int64_t c, float& a, float& s) {
  const bool overlap = k.ratio == 4;
  const int64_t window = overlap && row < 4 ? w - 1 : w, q = overlap ? row % 4 : row;
  const int64_t col = overlap && row >= 4 ? k.d + c : c, pos = window * k.ratio + q;
  if (pos >= k.p0) {
    const int64_t i = pos - k.p0;
    a = k.a[i * k.width + col];
    s = k.s[i * k.width + col] + k.ape[q * k.width + col];
  } else {
    const int64_t slot = overlap ? (window == k.p0 / 4 ? 4 + q : q) : q;
    a = k.carry_a[slot * k.width + col];
    s = k.carry_s[slot * k.width + col];
  }
}

// Block (channels, e): the e-th window completed in the chunk; softmax over its rows per channel,
// then the weighted sum.
__global__ void compressor_pool_kernel(PushArgs k) {
  await_previous_kernel();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= k.d) return;
  const int64_t e = blockIdx.y, w = k.p0 / k.ratio + e;  // window w ends at ratio·w + ratio − 1
  const int64_t n_rows = k.ratio == 4 ? 8 : k.ratio;
  float mx = -INFINITY;
  for (int64_t row = 0; row < n_rows; ++row) {
    float a, s;
    window_row(k, w, row, c, a, s);
    mx = fmaxf(mx, s);
  }
  double sum = 0.0;
  for (int64_t row = 0; row < n_rows; ++row) {
    float a, s;
    window_row(k, w, row, c, a, s);
    sum += exp_f(s - mx);
  }
  double acc = 0.0;
  for (int64_t row = 0; row < n_rows; ++row) {
    float a, s;
    window_row(k, w, row, c, a, s);
    acc += double(exp_f(s - mx) / float(sum)) * double(a);
  }
  k.pooled[e * k.d + c] = round_if(k.bf16, float(acc));  // rounded before its RMSNorm (§3.4.3)
}

// Thread (slot q < ratio or < 4, column): the carry after the chunk. A slot holds the last position
// with its residue (unchanged when the chunk has none); ratio 4's rows 0–3 the last completed
// window, copied from rows 4–7 at its completion (so one thread writes rows q and 4 + q, having
// read the old row 4 + q first).
__global__ void compressor_carry_kernel(PushArgs k) {
  await_previous_kernel();
  const bool overlap = k.ratio == 4;
  const int64_t slots = overlap ? 4 : k.ratio;
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= slots * k.width) return;
  const int64_t q = e / k.width, col = e % k.width, last = k.p0 + k.T - 1;
  const int64_t current = overlap ? 4 + q : q;  // the slot positions ≡ q (mod ratio) go to
  auto input = [&](int64_t pos, int64_t slot) {
    const int64_t i = pos - k.p0;
    k.carry_a[slot * k.width + col] = k.a[i * k.width + col];
    k.carry_s[slot * k.width + col] = k.s[i * k.width + col] + k.ape[q * k.width + col];
  };
  if (overlap && (last + 1) / 4 > k.p0 / 4) {  // a window completed: rows 0–3 take the last one
    const int64_t pos = ((last + 1) / 4 - 1) * 4 + q;
    if (pos >= k.p0) {
      input(pos, q);
    } else {
      k.carry_a[q * k.width + col] = k.carry_a[current * k.width + col];
      k.carry_s[q * k.width + col] = k.carry_s[current * k.width + col];
    }
  }
  const int64_t pos = last - ((last % k.ratio - q + k.ratio) % k.ratio);  // the last position ≡ q
  if (pos >= k.p0) input(pos, current);
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
  const unsigned channel_blocks = unsigned((cw.dim + kChannelThreads - 1) / kChannelThreads);
  if (n_emitted > 0) {
    launch(compressor_pool_kernel, dim3(channel_blocks, unsigned(n_emitted)), kChannelThreads, 0, stream_, args);
    DSV4_CUDA_LAUNCHED("compressor_push (pool)");
  }
  const int64_t carry_elements = (r == 4 ? 4 : r) * cw.width();
  launch(compressor_carry_kernel, unsigned((carry_elements + kChannelThreads - 1) / kChannelThreads), kChannelThreads,
         0, stream_, args);
  DSV4_CUDA_LAUNCHED("compressor_push (carry)");
  return n_emitted;
}

}  // namespace dsv4::cuda
