// deepseek-tc's routed FP4 experts on the bf16 tensor cores: the prefill's grouped product over
// the rows routed to each expert (the exact one is gemm_dmma.cu's integer kernel).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

// Whether r (a table of FP4 experts, quantized compute) fits the kernel: K whole FP4 blocks.
bool fits_tensor_core_experts(const GemmRequest& r);

// Int32 elements of scratch that tensor_core_experts(r, ...) needs (the grouping of rows by expert).
int64_t tensor_core_experts_scratch_ints(const GemmRequest& r);

// Enqueues r on `stream`: r.x holds the activations' e4m3 values as floats (act_quant's values
// form, rows of r.x_stride) and sx their per-128 scales [n_src, K/128]; the outputs are rounded to
// bf16, as the exact products' are.
void tensor_core_experts(const GemmRequest& r, const float* sx, int32_t* scratch, cudaStream_t stream);

}  // namespace dsv4::cuda
