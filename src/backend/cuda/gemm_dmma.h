// Many-row matrix products on the tensor cores, exact to the canonical arithmetic: the prefill
// path of every linear and of the routed experts (a grouped GEMM over the rows routed to each
// expert). FP8 weights and the double paths run on the FP64 tensor cores (DMMA), quantized FP4
// products on the integer ones (IMMA: an FP4 tile's partial is an integer sum; gemm.cu's top).
//
// Why not the FP8 tensor cores: in the quantized path each K-tile partial is a sum of ≤ 128
// exact e4m3×e4m3 (or e4m3×e2m1) products whose bits span at most 43 places, so a double
// accumulator holds it exactly in any order, and rounded once to fp32 it equals the CPU's partial
// bit for bit. Hopper's FP8 tensor cores keep only part of such a sum (on an H200, 1.3 % of K = 128
// partials of normal data came out exact), and these numerics are chaotic: with partials
// truncated to 14 bits the fixtures' logits agree on 89 % of argmaxes, max|Δ| 11–25
// (tools/oracle/NOTES.md §5); the opt-in deepseek-tc numerics take them (gemm_tc.h). The
// plain and bf16/f32 paths take double dot products of fp32 values (exact products), rounded once,
// like the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

// Int32 elements of scratch that dmma_gemm(r, ...) needs (as do the tensor-core experts): the
// grouping of rows by expert with a table; without one, the double sums of K's parts when the
// double paths split K (few tiles for the device's sm_count multiprocessors).
int64_t dmma_scratch_ints(const GemmRequest& r, bool quantized, int sm_count);

// Enqueues the product r on `stream`. A quantized (tiled) product passes the e4m3 activation
// values as r.x (rows of r.x_stride; for FP4 weights their byte planes, as gemm.cu's
// act_quant_kernel writes them) and their per-128 scales in sx [n_src, K/128]; the double paths
// pass the fp32 activations and sx = nullptr, and round_out rounds their results to bf16.
// scratch holds dmma_scratch_ints(r, sx != nullptr, sm_count) elements, 8-byte aligned and free for
// this product's duration (stream order).
void dmma_gemm(const GemmRequest& r, const float* sx, bool round_out, int32_t* scratch, int sm_count,
               cudaStream_t stream);

}  // namespace dsv4::cuda
