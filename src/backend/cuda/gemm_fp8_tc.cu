// The deepseek-tc numerics' FP8 products on the FP8 tensor cores (gemm_fp8_tc.h).
//
// In cuBLASLt's column-major terms y[T, N]ᵀ = W[N, K] · x[T, K]ᵀ: A is the weight matrix stored
// K-major (op T), B the activation codes (op N), D y's rows (ld = y_stride). Hopper's FP8 matmul
// takes exactly this "TN" form. The scale tensors hold one fp32 per block with the K blocks
// innermost: the activations' [T, K/128] as act_quant writes them, the weights' [N/128, K/128] as
// the checkpoint stores them. cuBLASLt writes fp32, which a second kernel rounds to bf16 like
// every quantized product's output.
#include <cuda_fp8.h>

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

__global__ void e8m0_to_f32_kernel(const uint8_t* e, int64_t n, float* out) {
  await_previous_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ldexpf(1.0f, int(e[i]) - 127);
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
  if (W.format != kFp8 || r.table || r.x_div != 1 || r.T < kMinRows || K % 128 != 0 || r.row0 % 128 != 0 ||
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
  Plan& p = plans_[key];
  check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(T), K), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, uint64_t(N), uint64_t(T), ldd), "layout D");

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = kWorkspaceBytes;
  const uint32_t align = 16;  // weight row slices, scratch and y rows are 16-byte aligned, no more
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attribute, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.found) p.algo = result.algo;
  return p;
}

const float* Fp8TensorCoreGemm::weight_scales(const LinearView& W, cudaStream_t stream) {
  if (W.scale_is_f32) return reinterpret_cast<const float*>(W.scale);
  float*& f32 = scales_[W.scale];
  if (!f32) {
    const int64_t n = (W.out + 127) / 128 * W.scale_cols;
    DSV4_CUDA_CHECK(cudaMalloc(&f32, size_t(n) * sizeof(float)));
    launch(e8m0_to_f32_kernel, blocks_for(n, 256), 256, 0, stream, W.scale, n, f32);
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
  if (!workspace_) DSV4_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  const float* w_scales = weight_scales(W, stream) + r.row0 / 128 * W.scale_cols;
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
