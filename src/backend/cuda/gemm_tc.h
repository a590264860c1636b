// The deepseek-tc numerics' products of many token rows on the tensor cores, through cuBLASLt
// (backend.h):
//   - quantized FP8 products on the FP8 tensor cores, block-scaled (1×128 activation scales,
//     128×128 weight scales, fp32 between K tiles). The operands are the exact path's, the
//     activations' e4m3 codes with their power-of-two scales and the checkpoint's FP8 weights;
//     only the sum of a K tile changes, which the tensor core keeps in fewer bits than the exact
//     partial (tools/oracle/NOTES.md §5);
//   - bf16 products (wo_a, the indexer's weights_proj) on the bf16 tensor cores with fp32
//     accumulation, as the reference's bf16 GEMM: the weights dequantized into bf16 (exact for
//     FP8 with E8M0 scales) in scratch for the product's duration, x in bf16 (its values are);
//   - fp32 products of a bf16 input (Compute::f32_bf16_in: the compressors' and the head's of
//     normed rows, mHC's of the HC state), whose products can be made exact: by BF16 weights on
//     the bf16 tensor cores as above; by F32 weights (mHC's fn) split into three TF32 parts,
//     w = w₁ + w₂ + w₃ (11, 11 and 2 significant bits), on the TF32 tensor cores, x read in place
//     (its bf16 values are TF32 ones), the three partial products then added. So only the order
//     of the fp32 sum differs from the reference's fp32 GEMM.
// The quantized and bf16 products round their fp32 output to bf16, like every such product; the
// fp32 ones keep it. On a Hopper (sm_90a) some quantized FP8 products run on our own kernel instead
// (gemm_fp8_tc.cu, uses_tensor_core_fp8): those with short K, where it measured faster, and token
// counts cuBLASLt cannot take.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

// Whether r's quantized FP8 product runs on gemm_fp8_tc.cu's kernel (CudaBackend::tensor_core_fp8)
// rather than cuBLASLt: FP8 weights with E8M0 or f32 128×128 scales, K whole 128-blocks, rows from a
// scale block's first, a device that runs sm_90a code, and K short or a token count that is not a
// multiple of 4 (see the kernel's kShortK).
bool uses_tensor_core_fp8(const GemmRequest& r);

class TensorCoreGemm {
 public:
  TensorCoreGemm() = default;
  ~TensorCoreGemm();
  TensorCoreGemm(const TensorCoreGemm&) = delete;
  TensorCoreGemm& operator=(const TensorCoreGemm&) = delete;

  // Whether r (quantized, bf16 or f32_bf16_in compute) can run on the tensor cores: one matrix
  // (no expert table), one activation row per token row, at least kMinRows of them, y rows 16-byte
  // aligned, and then for quantized compute uses_tensor_core_fp8(r) or, elsewhere, a cuBLASLt
  // algorithm for the shape. Quantized on cuBLASLt: FP8 weights with 128×128 block scales, whole
  // scale blocks from row0, K a multiple of 128, and a multiple of 4 token rows (cuBLASLt 13 has
  // no block-scaled algorithm for others). bf16: FP8 or BF16 weights, K a multiple of 8;
  // f32_bf16_in: BF16 weights, K a multiple of 8, or F32 weights, K a multiple of 4 and x rows of
  // K floats from a 16-byte boundary.
  bool handles(const GemmRequest& r);
  // Quantized, on cuBLASLt: y[t, 0 : rows) = bf16(x_codes[t] · W[row0 : row0+rows]ᵀ), each K
  // tile's product scaled by x_scales[tile, t] (act_quant's per-K-block layout for this path) and
  // the weight block's scale. x_codes: [T, K] e4m3 bytes. Requires handles(r) and not
  // uses_tensor_core_fp8(r).
  void run_quantized(const GemmRequest& r, const uint8_t* x_codes, const float* x_scales, cudaStream_t stream);
  // bf16 and f32_bf16_in: y[t, 0 : rows) = bf16(bf16(x[t]) · bf16(W[row0 : row0+rows])ᵀ), not
  // rounded for f32_bf16_in; F32 weights by their TF32 parts. Requires handles(r).
  void run_unquantized(const GemmRequest& r, StreamMemory& memory);

  // Plans and scale copies made so far (the profiler leaves calls that made one out).
  size_t setups() const { return plans_.size() + scales_.size(); }

  // From this many token rows: fewer leave most of a tensor-core tile empty, where the exact
  // decode kernels stream the weights as fast.
  static constexpr int64_t kMinRows = 32;

 private:
  enum class Operands { fp8, bf16, tf32 };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // false: cuBLASLt has no algorithm for the shape (the exact path runs)
  };
  // The plan of a product (FP8 block-scaled, bf16 or TF32 operands; rows N, tokens T, depth K, y's
  // row stride), made on first use and kept.
  Plan& plan_for(Operands operands, int64_t N, int64_t T, int64_t K, int64_t ldd);
  // The K blocks per 128 weight rows in the fp32 scale copy: cuBLASLt reads them in fours.
  static int64_t scale_stride(const LinearView& W) { return (W.scale_cols + 3) / 4 * 4; }
  // W's 128×128 block scales as fp32 [W.out / 128][scale_stride(W)], cuBLASLt's type and layout:
  // converted once per weight on the device and kept.
  const float* weight_scales(const LinearView& W, cudaStream_t stream);
  // cuBLASLt's product into y (fp32, the plan's ld), then, where r's compute rounds, y's first
  // r.rows columns of r.T rows rounded to bf16.
  void multiply(const GemmRequest& r, const Plan& p, const void* w, const void* x, float* y, cudaStream_t stream);
  // run_unquantized's F32 weights: their TF32 parts' products, added.
  void run_tf32_parts(const GemmRequest& r, StreamMemory& memory);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  GrownBuffer operands_;  // run_unquantized's weights and activations in the product's type
  std::map<std::tuple<Operands, int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
  std::unordered_map<const void*, float*> scales_;  // device weight scales → their fp32 copy
};

// deepseek-tc's quantized products of a few token rows (decode) on the tensor cores' mma.sync
// (gemv_tc.cu), with the per-128 promotion of the cuBLASLt path: FP8 products of fewer than
// TensorCoreGemm::kMinRows rows on the FP8 mma, and the routed FP4 experts of rows too few for the
// grouped kernel on the f16 mma. Whether it takes r: one FP8 matrix, K a multiple of 128, row0 a
// multiple of 16; or an FP4 expert table with E8M0 scales, K a multiple of 512, row0 0.
bool tc_gemv_handles(const GemmRequest& r);
// y[t, 0 : rows) = bf16(x_codes[t / x_div] · W_tᵀ[row0 : row0+rows]) with W_t = W or the table's view,
// x_scales in act_quant's per-K-block layout [K/128][source rows]. Requires tc_gemv_handles(r). With
// `swiglu` (r the gate of an FFN), the up matrix's product u is formed beside it over the same x, in
// the same launch, and y receives swiglu_f(g, u) of the two bf16 products (a decoded token's MoE:
// two launches fewer per FFN, and twice the weight bytes in flight per lane).
void tc_gemv(const GemmRequest& r, const SwigluUp* swiglu, const uint8_t* x_codes, const float* x_scales, int sm_count,
             cudaStream_t stream);

// deepseek-tc's bf16 products (Compute::bf16, and f32_bf16_in: x holds bf16 values) of fewer than
// TensorCoreGemm::kMinRows token rows on the bf16 mma.sync, fp32 accumulation (gemv_tc.cu). Whether
// it takes r: FP8 weights with K a multiple of 128 and row0 of 16, or BF16 ones with K a multiple of
// 64; x 16-byte aligned rows. A table gives row m of x its own view (the grouped output projection).
bool tc_gemv_bf16_handles(const GemmRequest& r);
// y[t, 0 : rows) = x[t / x_div] · W_tᵀ[row0 : row0+rows] with x rounded to bf16 and the weights
// dequantized; y rounded to bf16 when round_out. Requires tc_gemv_bf16_handles(r).
void tc_gemv_bf16(const GemmRequest& r, bool round_out, int sm_count, cudaStream_t stream);

}  // namespace dsv4::cuda
