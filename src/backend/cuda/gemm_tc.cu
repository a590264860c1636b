// The deepseek-tc numerics' products on the tensor cores (gemm_tc.h).
//
// In cuBLASLt's column-major terms y[T, N]ᵀ = W[N, K] · x[T, K]ᵀ: A is the weight matrix stored
// K-major (op T), B the activations (op N), D y's rows (ld = y_stride). Hopper's FP8 matmul takes
// exactly this "TN" form. Its scale tensors hold one fp32 per block (cuBLAS's "scaling factors
// layouts"): the activations' 1×128 scales with the token rows innermost, [K/128][T], which
// act_quant writes for this path; the weights' 128×128 scales with the K blocks innermost and
// their count rounded up to a multiple of 4, [N/128][L4], copied once from the checkpoint's
// [N/128][K/128]. cuBLASLt writes fp32, which a second kernel rounds to bf16 where the product's
// kind rounds.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/device_math.cuh"
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

// W's block scales [W.out / 128][W.scale_cols] as fp32 [W.out / 128][l4], the padding zero.
__global__ void weight_scales_kernel(LinearView W, int64_t l4, int64_t n, float* out) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t block_row = i / l4, col = i % l4;
    out[i] = col < W.scale_cols ? scale_at(scale_row<kFp8>(W, block_row * 128), col, W.scale_is_f32) : 0.0f;
  }
}

// The bf16 operands of a bf16 product: rows [row0, row0 + rows) of W dequantized (w: [rows, K])
// and the T rows of x (xb: [T, K]), whose values are bf16 already. Block i takes row i of both
// (grid max(rows, T)), its threads the row's elements.
__global__ void bf16_operands_kernel(LinearView W, int64_t row0, int64_t rows, const float* x, int64_t x_stride,
                                     int64_t T, uint16_t* w, uint16_t* xb) {
  await_previous_kernel();
  const int64_t i = blockIdx.x, K = W.in;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    if (i < rows) w[i * K + k] = f32_to_bf16(dequantized(W, row0 + i, k));
    if (i < T) xb[i * K + k] = f32_to_bf16(x[i * x_stride + k]);
  }
}

// The TF32 parts of rows [row0, row0 + rows) of F32 weights: parts[j·rows + i] = w_j of row
// row0 + i, with w₁ = w's top 11 significant bits (its float bits with the low 13 cleared, the
// TF32 tensor cores' reading of a float), w₂ the same of w − w₁, w₃ = w − w₁ − w₂ (at most 2
// bits). Both differences are exact in fp32, so w = w₁ + w₂ + w₃, and each part times a bf16 value
// (8 significant bits) is exact in the tensor cores' fp32 products.
__global__ void tf32_parts_kernel(LinearView W, int64_t row0, int64_t rows, float* parts) {
  await_previous_kernel();
  const int64_t K = W.in, n = rows * K;
  const float* w = reinterpret_cast<const float*>(W.data) + row0 * K;
  auto tf32 = [](float v) { return __uint_as_float(__float_as_uint(v) & 0xffffe000u); };
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float w1 = tf32(w[i]), rest = w[i] - w1, w2 = tf32(rest);
    parts[i] = w1, parts[n + i] = w2, parts[2 * n + i] = rest - w2;
  }
}

// y[t, j] = (p[t, j] + p[t, rows + j]) + p[t, 2·rows + j] for t < T, j < rows: the three parts'
// products (p: [T, 3·rows]), y rows of y_stride.
__global__ void add_parts_kernel(const float* p, int64_t T, int64_t rows, float* y, int64_t y_stride) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * rows; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / rows, j = i % rows;
    const float* pt = p + t * 3 * rows;
    y[t * y_stride + j] = (pt[j] + pt[rows + j]) + pt[2 * rows + j];
  }
}

// y[t, 0 : rows) = bf16(y[t, 0 : rows)) for t < T, rows of y_stride: block t takes row t.
__global__ void round_rows_bf16_kernel(float* y, int64_t y_stride, int64_t rows) {
  await_previous_kernel();
  float* row = y + int64_t(blockIdx.x) * y_stride;
  for (int64_t c = threadIdx.x; c < rows; c += blockDim.x) row[c] = round_bf16(row[c]);
}

}  // namespace

TensorCoreGemm::~TensorCoreGemm() {  // at teardown: errors are dropped
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

bool TensorCoreGemm::handles(const GemmRequest& r) {
  const LinearView& W = r.W;
  const int64_t K = W.in;
  const bool fp8 = r.compute == Compute::quantized;
  // fp32 products of a bf16 input by BF16 weights, or by F32 ones in TF32 parts (run_tf32_parts).
  const bool bf16_in = r.compute == Compute::f32_bf16_in;
  const bool tf32 = bf16_in && W.format == kF32;
  if ((!fp8 && r.compute != Compute::bf16 && !bf16_in) || r.table || r.x_div != 1 || r.T < kMinRows ||
      r.y_stride % 4 != 0 || reinterpret_cast<uintptr_t>(r.y) % 16 != 0)
    return false;
  if (tf32 && (K % 4 != 0 || r.x_stride != K || reinterpret_cast<uintptr_t>(r.x) % 16 != 0)) return false;
  if (fp8 && uses_tensor_core_fp8(r)) return true;
  // cuBLASLt (13, H200) has no block-scaled algorithm for a token count that is not a multiple of
  // 4 (CUBLAS_STATUS_NOT_SUPPORTED for 77 and 78; 76 runs): such a chunk takes the exact kernels.
  if (fp8 && (W.format != kFp8 || r.T % 4 != 0 || K % 128 != 0 || r.row0 % 128 != 0 || W.scale_cols != K / 128))
    return false;
  if (r.compute == Compute::bf16 && !((W.format == kFp8 || W.format == kBf16) && K % 8 == 0)) return false;
  if (bf16_in && !tf32 && !(W.format == kBf16 && K % 8 == 0)) return false;
  // cuBLASLt's dimensions are 32-bit.
  if (r.rows > INT32_MAX || r.T > INT32_MAX || K > INT32_MAX || r.y_stride > INT32_MAX) return false;
  return tf32 ? plan_for(Operands::tf32, 3 * r.rows, r.T, K, 3 * r.rows).found
              : plan_for(fp8 ? Operands::fp8 : Operands::bf16, r.rows, r.T, K, r.y_stride).found;
}

TensorCoreGemm::Plan& TensorCoreGemm::plan_for(Operands operands, int64_t N, int64_t T, int64_t K, int64_t ldd) {
  const auto key = std::make_tuple(operands, N, T, K, ldd);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  if (!handle_) check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
  if (!workspace_) DSV4_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  Plan& p = plans_[key];
  const bool fp8 = operands == Operands::fp8;
  const cublasComputeType_t compute = operands == Operands::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_lt(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (fp8) {
    set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
    set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
    // The heuristic wants scale pointers to exist; run_quantized() sets the real ones.
    set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(workspace_));
    set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(workspace_));
  }
  const cudaDataType operand = fp8 ? CUDA_R_8F_E4M3 : operands == Operands::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  check_lt(cublasLtMatrixLayoutCreate(&p.a, operand, uint64_t(K), uint64_t(N), K), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, operand, uint64_t(K), uint64_t(T), K), "layout B");
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
  // A slower answer, not a wrong one: said for the first few shapes (a server meets many).
  static int untold = 3;
  if (!p.found && untold > 0)
    std::fprintf(stderr, "deepseek-tc: cuBLASLt has no %s algorithm for %lld rows x %lld tokens x K %lld (%s); the "
                 "exact kernels run it%s\n", fp8 ? "FP8 block-scaled" : operands == Operands::bf16 ? "bf16" : "TF32",
                 (long long)N, (long long)T, (long long)K, cublasLtGetStatusName(status),
                 --untold ? "" : " (further shapes are not reported)");
  return p;
}

const float* TensorCoreGemm::weight_scales(const LinearView& W, cudaStream_t stream) {
  float*& f32 = scales_[W.scale];
  if (!f32) {
    const int64_t n = (W.out + 127) / 128 * scale_stride(W);
    DSV4_CUDA_CHECK(cudaMalloc(&f32, size_t(n) * sizeof(float)));
    launch(weight_scales_kernel, grid_for(n, 256), 256, 0, stream, W, scale_stride(W), n, f32);
    DSV4_CUDA_LAUNCHED("linear (tensor cores: weight scales)");
  }
  return f32;
}

void TensorCoreGemm::multiply(const GemmRequest& r, const Plan& p, const void* w, const void* x, float* y,
                              cudaStream_t stream) {
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(handle_, p.desc, &one, w, p.a, x, p.b, &zero, y, p.d, y, p.d, &p.algo, workspace_,
                          kWorkspaceBytes, stream),
           "cublasLtMatmul");
  if (!rounds_output(r.compute)) return;
  launch(round_rows_bf16_kernel, unsigned(r.T), 256, 0, stream, r.y, r.y_stride, r.rows);
  DSV4_CUDA_LAUNCHED("linear (tensor cores: bf16 rounding)");
}

void TensorCoreGemm::run_quantized(const GemmRequest& r, const uint8_t* x_codes, const float* x_scales,
                                   cudaStream_t stream) {
  const LinearView& W = r.W;
  const int64_t K = W.in;
  Plan& p = plan_for(Operands::fp8, r.rows, r.T, K, r.y_stride);
  DSV4_CUDA_REQUIRE(p.found, "linear: no cuBLASLt FP8 algorithm for ", r.rows, " rows × ", r.T, " tokens × K ", K);
  const float* w_scales = weight_scales(W, stream) + r.row0 / 128 * scale_stride(W);
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scales));
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scales));
  multiply(r, p, W.data + r.row0 * K, x_codes, r.y, stream);
}

void TensorCoreGemm::run_unquantized(const GemmRequest& r, StreamMemory& memory) {
  const LinearView& W = r.W;
  if (W.format == kF32) {
    run_tf32_parts(r, memory);
    return;
  }
  const cudaStream_t stream = memory.stream();
  const int64_t K = W.in;
  Plan& p = plan_for(Operands::bf16, r.rows, r.T, K, r.y_stride);
  DSV4_CUDA_REQUIRE(p.found, "linear: no cuBLASLt bf16 algorithm for ", r.rows, " rows × ", r.T, " tokens × K ", K);
  // BF16 weights are read in place; FP8 ones are dequantized into the scratch with x.
  const bool copy_w = W.format != kBf16;
  const size_t w_elems = copy_w ? size_t(r.rows * K + 7) / 8 * 8 : 0;  // x stays 16-byte aligned
  auto* scratch = static_cast<uint16_t*>(operands_.get(memory, (w_elems + size_t(r.T * K)) * sizeof(uint16_t)));
  const int64_t w_rows = copy_w ? r.rows : 0;
  launch(bf16_operands_kernel, unsigned(std::max(w_rows, r.T)), 256, 0, stream, W, r.row0, w_rows, r.x, r.x_stride,
         r.T, scratch, scratch + w_elems);
  DSV4_CUDA_LAUNCHED("linear (tensor cores: bf16 operands)");
  const void* w = copy_w ? static_cast<const void*>(scratch) : static_cast<const void*>(W.data + r.row0 * K * 2);
  multiply(r, p, w, scratch + w_elems, r.y, stream);
}

void TensorCoreGemm::run_tf32_parts(const GemmRequest& r, StreamMemory& memory) {
  const cudaStream_t stream = memory.stream();
  const int64_t K = r.W.in, n_parts = 3 * r.rows;
  Plan& p = plan_for(Operands::tf32, n_parts, r.T, K, n_parts);
  DSV4_CUDA_REQUIRE(p.found, "linear: no cuBLASLt TF32 algorithm for ", n_parts, " rows × ", r.T, " tokens × K ", K);
  // The parts [3·rows, K] (16-byte aligned: K is a multiple of 4), then their products [T, 3·rows].
  // The parts are made again per call (mHC's fn: 4.7 MB written, a few µs) rather than kept: kept
  // copies would be device memory beside the weights that the memory plan does not count.
  auto* parts = static_cast<float*>(operands_.get(memory, size_t(n_parts * K + r.T * n_parts) * sizeof(float)));
  float* products = parts + n_parts * K;
  launch(tf32_parts_kernel, grid_for(r.rows * K, 256), 256, 0, stream, r.W, r.row0, r.rows, parts);
  DSV4_CUDA_LAUNCHED("linear (tensor cores: TF32 parts)");
  multiply(r, p, parts, r.x, products, stream);
  launch(add_parts_kernel, grid_for(r.T * r.rows, 256), 256, 0, stream, products, r.T, r.rows, r.y, r.y_stride);
  DSV4_CUDA_LAUNCHED("linear (tensor cores: the parts' sum)");
}

}  // namespace dsv4::cuda
