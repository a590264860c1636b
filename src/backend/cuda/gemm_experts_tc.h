// deepseek-tc's routed FP4 experts on the bf16 tensor cores: the prefill's grouped product over
// the rows routed to each expert (the exact one is gemm_dmma.cu's integer kernel), run by
// CudaBackend::tensor_core_experts from the activations in QuantizedForm::scaled_bf16.
#pragma once

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

// Whether r (a table of FP4 experts, quantized compute) fits the kernel: K whole FP4 blocks, E8M0
// scales.
bool fits_tensor_core_experts(const GemmRequest& r);

}  // namespace dsv4::cuda
