// The deepseek-tc numerics' FP8 products on the FP8 tensor cores (gemm_fp8_tc.h).
//
// In cuBLASLt's column-major terms y[T, N]ᵀ = W[N, K] · x[T, K]ᵀ: A is the weight matrix stored
// K-major (op T), B the activation codes (op N), D y's rows (ld = y_stride). Hopper's FP8 matmul
// takes exactly this "TN" form. The scale tensors hold one fp32 per block (cuBLAS's "scaling factors
// layouts"): the activations' 1×128 scales with the token rows innermost, [K/128][T], which
// act_quant writes for this path; the weights' 128×128 scales with the K blocks innermost and
// their count rounded up to a multiple of 4, [N/128][L4], copied once from the checkpoint's
// [N/128][K/128]. cuBLASLt writes fp32, which a second kernel rounds to bf16 like every quantized
// product's output.
#include <cuda_fp8.h>

#include <cstdio>

#include "backend/cuda/gemm_fp8_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/weight_access.cuh"
#include "core/formats.h"

namespace dsv4::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's scratch (its split-K sums)

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail_check(__FILE__, __LINE__, what, cat("cuBLASLt: ", cublasLtGetStatusName(status), " (",
                                             cublasLtGetStatusString(status), ")"));
}

template <class T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check_lt(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

// The weights' block scales [rows / 128][cols] (E8M0 bytes, or f32) as fp32 [rows / 128][L4], L4
// = cols rounded up to a multiple of 4, the padding zero.
__global__ void weight_scales_kernel(const uint8_t* scale, bool is_f32, int64_t cols, int64_t l4, int64_t n,
                                     float* out) {
  await_previous_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t row = i / l4, col = i % l4, at = row * cols + col;
  out[i] = col >= cols ? 0.0f
           : is_f32    ? reinterpret_cast<const float*>(scale)[at]
                       : ldexpf(1.0f, int(scale[at]) - 127);
}

// y[t, 0 : rows) = bf16(y[t, 0 : rows)) for t < T, rows of y_stride.
__global__ void round_rows_bf16_kernel(float* y, int64_t y_stride, int64_t rows, int64_t T) {
  await_previous_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * T) return;
  float& v = y[i / rows * y_stride + i % rows];
  v = round_bf16(v);
}

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

Fp8TensorCoreGemm::~Fp8TensorCoreGemm() {  // at teardown: errors are dropped
  for (auto& [shape, p] : plans_) {
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  for (auto& [e8m0, f32] : scales_) cudaFree(f32);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

bool Fp8TensorCoreGemm::handles(const GemmRequest& r) {
  const LinearView& W = r.W;
  const int64_t K = W.in;
  // cuBLASLt (13, H200) has no block-scaled algorithm for a token count that is not a multiple of
  // 4 (CUBLAS_STATUS_NOT_SUPPORTED for 77 and 78; 76 runs): such a chunk takes the exact kernels.
  if (W.format != kFp8 || r.table || r.x_div != 1 || r.T < kMinRows || r.T % 4 != 0 || K % 128 != 0 ||
      r.row0 % 128 != 0 ||
      W.scale_cols != K / 128 || r.y_stride % 4 != 0 || reinterpret_cast<uintptr_t>(r.y) % 16 != 0)
    return false;
  // cuBLASLt's dimensions are 32-bit.
  if (r.rows > INT32_MAX || r.T > INT32_MAX || K > INT32_MAX || r.y_stride > INT32_MAX) return false;
  return plan_for(r.rows, r.T, K, r.y_stride).found;
}

Fp8TensorCoreGemm::Plan& Fp8TensorCoreGemm::plan_for(int64_t N, int64_t T, int64_t K, int64_t ldd) {
  const auto key = std::make_tuple(N, T, K, ldd);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  if (!handle_) check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
  if (!workspace_) DSV4_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  Plan& p = plans_[key];
  check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  // The heuristic wants scale pointers to exist; run() sets the real ones.
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(workspace_));
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(workspace_));
  check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(T), K), "layout B");

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = kWorkspaceBytes;
  const uint32_t align = 16;  // weight row slices, scratch and y rows are 16-byte aligned, no more
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attribute, &align, sizeof(align));
  check_lt(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, uint64_t(N), uint64_t(T), ldd), "layout D");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  p.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.found) p.algo = result.algo;
  cublasLtMatmulPreferenceDestroy(pref);
  // A slower answer, not a wrong one: said for the first few shapes (a server meets many).
  static int untold = 3;
  if (!p.found && untold > 0)
    std::fprintf(stderr, "deepseek-tc: cuBLASLt has no FP8 block-scaled algorithm for %lld rows x %lld tokens x K "
                 "%lld (%s); the exact kernels run it%s\n", (long long)N, (long long)T, (long long)K,
                 cublasLtGetStatusName(status), --untold ? "" : " (further shapes are not reported)");
  return p;
}

const float* Fp8TensorCoreGemm::weight_scales(const LinearView& W, cudaStream_t stream) {
  float*& f32 = scales_[W.scale];
  if (!f32) {
    const int64_t n = (W.out + 127) / 128 * scale_stride(W);
    DSV4_CUDA_CHECK(cudaMalloc(&f32, size_t(n) * sizeof(float)));
    launch(weight_scales_kernel, blocks_for(n, 256), 256, 0, stream, W.scale, bool(W.scale_is_f32), W.scale_cols,
           scale_stride(W), n, f32);
    DSV4_CUDA_LAUNCHED("linear (FP8 tensor cores: weight scales)");
  }
  return f32;
}

void Fp8TensorCoreGemm::run(const GemmRequest& r, const uint8_t* x_codes, const float* x_scales,
                            cudaStream_t stream) {
  const LinearView& W = r.W;
  const int64_t K = W.in;
  Plan& p = plan_for(r.rows, r.T, K, r.y_stride);
  DSV4_CUDA_REQUIRE(p.found, "linear: no cuBLASLt FP8 algorithm for ", r.rows, " rows × ", r.T, " tokens × K ", K);
  const float* w_scales = weight_scales(W, stream) + r.row0 / 128 * scale_stride(W);
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scales));
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scales));
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(handle_, p.desc, &one, W.data + r.row0 * K, p.a, x_codes, p.b, &zero, r.y, p.d, r.y, p.d,
                          &p.algo, workspace_, kWorkspaceBytes, stream),
           "cublasLtMatmul (FP8 block-scaled)");
  launch(round_rows_bf16_kernel, blocks_for(r.rows * r.T, 256), 256, 0, stream, r.y, r.y_stride, r.rows, r.T);
  DSV4_CUDA_LAUNCHED("linear (FP8 tensor cores: bf16 rounding)");
}

}  // namespace dsv4::cuda
