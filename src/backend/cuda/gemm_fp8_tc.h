// Dense FP8 products of many token rows on the FP8 tensor cores, through cuBLASLt's block-scaled
// FP8 matmul (1×128 activation scales, 128×128 weight scales, fp32 accumulation between K
// tiles): the deepseek-tc numerics (backend.h). The operands are what the exact path has too, the
// activations' e4m3 codes with their power-of-two scales and the checkpoint's FP8 weights, so the
// only change is how a K tile's products are summed: by the tensor core, which keeps fewer bits of
// the partial than the exact sum (tools/oracle/NOTES.md §5), instead of in doubles.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

class Fp8TensorCoreGemm {
 public:
  Fp8TensorCoreGemm() = default;
  ~Fp8TensorCoreGemm();
  Fp8TensorCoreGemm(const Fp8TensorCoreGemm&) = delete;
  Fp8TensorCoreGemm& operator=(const Fp8TensorCoreGemm&) = delete;

  // Whether r can run here: FP8 weights with 128×128 block scales, one matrix (no expert table),
  // one activation row per token row, at least kMinRows of them and a multiple of 4, whole
  // 128-row scale blocks from row0, K a multiple of 128, y rows 16-byte aligned, and a cuBLASLt
  // algorithm for the shape.
  bool handles(const GemmRequest& r);
  // y[t, row0 : row0+rows] = bf16(x_codes[t] · W[row0 : row0+rows]ᵀ), each K tile's product
  // scaled by x_scales[t, tile] (the activations' [T, K/128] scales) and the weight block's scale.
  // x_codes: [T, K] e4m3 bytes. Requires handles(r).
  void run(const GemmRequest& r, const uint8_t* x_codes, const float* x_scales, cudaStream_t stream);

  // Plans and scale copies made so far (the profiler leaves calls that made one out).
  size_t setups() const { return plans_.size() + scales_.size(); }

  // From this many token rows: fewer leave most of a tensor-core tile empty, where the exact
  // decode kernels stream the weights as fast.
  static constexpr int64_t kMinRows = 32;

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // false: cuBLASLt has no algorithm for the shape (the exact path runs)
  };
  // The K blocks per 128 weight rows in the fp32 scale copy: cuBLASLt reads them in fours.
  static int64_t scale_stride(const LinearView& W) { return (W.scale_cols + 3) / 4 * 4; }
  // The plan of a shape (rows N, tokens T, depth K, y's row stride), made on first use and kept.
  Plan& plan_for(int64_t N, int64_t T, int64_t K, int64_t ldd);
  // W's 128×128 block scales as fp32 [W.out / 128][scale_stride(W)], cuBLASLt's type and layout:
  // converted once per weight on the device and kept.
  const float* weight_scales(const LinearView& W, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
  std::unordered_map<const void*, float*> scales_;  // device E8M0 scales → their fp32 copy
};

}  // namespace dsv4::cuda
