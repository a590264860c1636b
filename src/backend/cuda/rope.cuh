// RoPE's device steps (architecture.md §3.0), shared by the rope kernel (rope.cu) and the joined KV
// step (kv_finish.cu), so both rotate with the same arithmetic.
#pragma once

#include "backend/cuda/device_math.cuh"

namespace dsv4::cuda {

// cos and sin (negated for the inverse rotation) of position p's `half` angles fp32(p)·f_k, each
// computed afresh, into trig ([half] cos, then [half] sin), by the block's threads; ends with a
// barrier.
__device__ inline void rope_trig(float p, const float* freqs, int64_t half, bool inverse, float* trig) {
  for (int64_t k = threadIdx.x; k < half; k += blockDim.x) {
    const float angle = p * freqs[k];
    trig[k] = cos_f(angle);
    trig[half + k] = inverse ? -sin_f(angle) : sin_f(angle);
  }
  __syncthreads();
}

// The first (a·c − b·s) or second (a·s + b·c) element of pair (a, b) rotated by (c, s): a 2-term
// dot product in double (the products exact), rounded once.
__device__ inline float rotated(bool first, float a, float b, float c, float s, bool bf16) {
  const double da = a, db = b;
  return round_if(bf16, float(first ? da * c - db * s : da * s + db * c));
}

}  // namespace dsv4::cuda
