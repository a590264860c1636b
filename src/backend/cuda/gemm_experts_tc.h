// deepseek-tc's routed FP4 experts on the FP8 tensor cores (Hopper's wgmma): the prefill's grouped
// product over the rows routed to each expert (the exact one is gemm_dmma.cu's integer kernel), run
// by CudaBackend::tensor_core_experts from the activations in QuantizedForm::fragment_codes.
#pragma once

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

// Whether r (a table of FP4 experts, quantized compute) fits the kernel: K whole FP4 blocks, E8M0
// scales, a device of compute capability 9.0 (elsewhere the exact kernel runs).
bool fits_tensor_core_experts(const GemmRequest& r);

}  // namespace dsv4::cuda
