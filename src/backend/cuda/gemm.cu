// Matrix products y = x·Wᵀ for every weight format, and the embedding lookup (twin of
// cpu/gemm.cpp; architecture.md §3.0 "Linear kinds", §5).
//
// quantized (deepseek numerics): phase 1 quantizes each activation row to e4m3 per 128-block with
// a power-of-two scale; phase 2 sums, per K tile (128 for FP8 weights, 32 for FP4), the exact
// e4m3×e4m3 (or e4m3×e2m1) products in double, rounds the tile partial to fp32, multiplies it by
// the two scales and adds it to an fp32 accumulator in increasing K order; the result is rounded
// to bf16. Everything else takes double dot products with the dequantized weight, rounded once.
//
// Parallelisation (correct first; no tensor cores yet): one block per token row and 8 output
// rows, one warp per output. Lanes stride over K (coalesced reads of x and the weight row) and the
// warp reduces in double with shuffles; the quantized path reduces once per K tile, so the fp32
// tile accumulation runs in the CPU's order. Weights stay in their stored format and are decoded
// in registers.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_dmma.h"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kGemmWarps = 8;
// From this many rows on, products run on the FP64 tensor cores (gemm_dmma.cu): their weights are
// then read once per 64 rows instead of once per row.
constexpr int64_t kDmmaMinRows = 32;

// Phase 1: ActQuantFP8 of each 128-block of each source row. Grid (rows, K blocks), 128 threads,
// one element each; the block's amax by a block-wide fmax.
__global__ void act_quant_kernel(const float* x, int64_t x_stride, int64_t K, float* qx, float* sx) {
  __shared__ float scratch[32];
  const int64_t m = blockIdx.x, b = blockIdx.y, k = b * 128 + threadIdx.x;
  const float v = k < K ? x[m * x_stride + k] : 0.0f;
  const float amax = block_max(fabsf(v), scratch);
  const int e = fp8_scale_exp(amax);
  if (k < K) qx[m * K + k] = fp8_quantize(v, e);
  if (threadIdx.x == 0) sx[m * gridDim.y + b] = ldexpf(1.0f, e);
}

struct GemmArgs {
  LinearView W;
  const LinearView* table;
  const int32_t* view_of_row;
  int64_t n_views;
  const float* x;  // fp32 activations (plain path) ...
  int64_t x_stride, x_div;
  const float* qx;  // ... or their e4m3 values [src rows, K] and scales [src rows, K/128]
  const float* sx;
  int64_t K, n_k128;
  float* y;
  int64_t y_stride, row0, rows;
  bool tiled, round_out;
};

// Phase 2. Grid (T, rows / 8), 8 warps; warp w of block (m, j) computes y[m, 8j + w].
__global__ void __launch_bounds__(kGemmWarps * 32) linear_kernel(GemmArgs a) {
  const int64_t m = blockIdx.x;
  const int64_t r = int64_t(blockIdx.y) * kGemmWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= a.rows) return;
  float* y = a.y + m * a.y_stride + r;
  LinearView W = a.W;
  if (a.table) {
    const int32_t v = a.view_of_row[m];
    if (v < 0 || v >= a.n_views) {  // no expert: contributes nothing (as on the CPU)
      if (lane == 0) *y = 0.0f;
      return;
    }
    W = a.table[v];
  }
  const int64_t o = a.row0 + r, K = a.K, src = m / a.x_div;
  if (!a.tiled) {
    const float* x = a.x + src * a.x_stride;
    double acc = 0.0;
    for (int64_t i = lane; i < K; i += 32) acc += double(x[i]) * double(dequantized(W, o, i));
    const float s = float(warp_sum(acc));
    if (lane == 0) *y = a.round_out ? round_bf16(s) : s;
    return;
  }
  const float* q = a.qx + src * K;
  const float* sx = a.sx + src * a.n_k128;
  const int64_t tile = W.format == kFp4 ? 32 : 128;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += tile) {
    const int64_t n = K - k0 < tile ? K - k0 : tile;
    double part = 0.0;
    for (int64_t i = lane; i < n; i += 32) part += double(q[k0 + i]) * double(stored_value(W, o, k0 + i));
    const float partial = float(warp_sum(part));
    const float s_x = sx[k0 / 128], s_w = block_scale(W, o, k0);
    // FP8 kernel: partial · (s_x · s_w); FP4 kernel: (partial · s_x) · s_w (§5).
    acc += tile == 128 ? partial * (s_x * s_w) : (partial * s_x) * s_w;
  }
  if (lane == 0) *y = round_bf16(acc);
}

// embed: one block per token; threads over D (grid-stride), the row copied to every stream.
__global__ void embed_kernel(LinearView table, const int32_t* tokens, int64_t hc, float* X) {
  const int64_t t = blockIdx.x, D = table.in;
  const int64_t id = tokens[t];
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float v = dequantized(table, id, d);
    for (int64_t h = 0; h < hc; ++h) X[(t * hc + h) * D + d] = v;
  }
}

}  // namespace

void CudaBackend::gemm(const GemmRequest& r) {
  if (r.T == 0 || r.rows == 0) return;
  const LinearView& W = r.W;
  const int64_t K = W.in;
  const bool tiled = deepseek() && r.compute == Compute::quantized;
  DSV4_CUDA_REQUIRE(!tiled || W.format == kFp8 || W.format == kFp4, "linear: quantized compute needs FP8/FP4 weights");
  DSV4_CUDA_REQUIRE(r.T < (int64_t(1) << 31) && (r.rows + kGemmWarps - 1) / kGemmWarps < 65536,
                    "linear: ", r.T, " tokens × ", r.rows, " rows exceed the launch grid");

  GemmArgs a{W, r.table, r.view_of_row, r.n_views, r.x, r.x_stride, r.x_div, nullptr, nullptr, K, (K + 127) / 128,
             r.y, r.y_stride, r.row0, r.rows, tiled, deepseek() && r.compute != Compute::f32};
  const int64_t n_src = (r.T + r.x_div - 1) / r.x_div;
  DeviceArray<float> qx(stream_, tiled ? size_t(n_src * K) : 0), sx(stream_, tiled ? size_t(n_src * a.n_k128) : 0);
  if (tiled) {
    act_quant_kernel<<<dim3(unsigned(n_src), unsigned(a.n_k128)), 128, 0, stream_>>>(r.x, r.x_stride, K, qx.get(),
                                                                                      sx.get());
    DSV4_CUDA_LAUNCHED("linear (activation quantization)");
    a.qx = qx.get();
    a.sx = sx.get();
  }
  if (r.T >= kDmmaMinRows) {
    DmmaProblem p{W, r.table, r.view_of_row, r.n_views, r.x, r.x_stride, r.x_div, a.qx, a.sx, K, r.T,
                  r.y, r.y_stride, r.row0, r.rows, tiled, a.round_out};
    dmma_gemm(p, stream_);
    return;
  }
  const dim3 grid(unsigned(r.T), unsigned((r.rows + kGemmWarps - 1) / kGemmWarps));
  linear_kernel<<<grid, kGemmWarps * 32, 0, stream_>>>(a);
  DSV4_CUDA_LAUNCHED("linear");
}

void CudaBackend::linear(const model::Linear& W, Compute compute, const float* x, int64_t x_stride, int64_t T,
                         float* y, int64_t y_stride, int64_t row0, int64_t rows) {
  DSV4_CUDA_REQUIRE(row0 >= 0 && row0 + rows <= W.out, W.name, ": rows [", row0, ", ", row0 + rows, ") of ", W.out);
  const bool tiled = deepseek() && compute == Compute::quantized;
  DSV4_CUDA_REQUIRE(!tiled || W.format == model::WeightFormat::fp8 || W.format == model::WeightFormat::fp4, W.name,
                    ": quantized compute needs FP8/FP4 weights, got ", to_string(W.format));
  GemmRequest r;
  r.W = device_linear(W);
  r.x = x, r.x_stride = x_stride, r.T = T;
  r.y = y, r.y_stride = y_stride, r.row0 = row0, r.rows = rows;
  r.compute = compute;
  gemm(r);
}

// Token ids are checked on the host (a copy of T ids): a kernel cannot raise the error the CPU
// backend raises for an id outside the vocabulary.
void CudaBackend::embed(const model::Linear& table, const int32_t* tokens, int64_t T, int64_t hc, float* X) {
  if (T == 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(ids.data(), tokens, size_t(T) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (int32_t id : ids)
    if (id < 0 || id >= table.out)
      fail_check(__FILE__, __LINE__, "tokens[t] in [0, vocab)",
                 cat("token id ", id, " outside the vocabulary [0, ", table.out, ")"));
  embed_kernel<<<unsigned(T), 256, 0, stream_>>>(device_linear(table), tokens, hc, X);
  DSV4_CUDA_LAUNCHED("embed");
}

}  // namespace dsv4::cuda
