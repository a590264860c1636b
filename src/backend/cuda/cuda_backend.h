// The CUDA backend: every op of backend.h as straightforward GPU kernels that twin the CPU
// reference (src/backend/cpu) bit for bit (issue 4, first step: correct before fast).
//
// One .cu per op family, mirroring the CPU file names (gemm, norm, rope, quant, hc, attention,
// compressor, indexer, moe, memory). All work runs in order on one stream owned by the backend
// (stream_memory.h); the host waits only in to_host and in one-time work (weights uploaded on
// first use, view tables). Kernels report bad input (an id outside the vocabulary, a row its
// state format cannot hold) through mapped flags, raised as errors at the next to_host.
//
// Numerics follow the CPU's canonical arithmetic (cpu/quant.h): every sum accumulates in double
// and is rounded once, exp/sqrt/rsqrt/sin/cos/sigmoid/silu/softplus are evaluated in double, and
// nothing is contracted into an FMA (--fmad=false). A parallel double reduction sums in another
// order than the CPU, which changes the float result only on rare double-rounding ties.
//
// Weights are host memory owned by the model (backend.h); each array is uploaded on first use
// and kept, keyed by its host address and size, until the backend is destroyed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "backend/cuda/step_graphs.h"
#include "backend/cuda/stream_memory.h"

namespace dsv4::cuda {

// A weight matrix in device memory, as stored in the checkpoint (no up-cast copies). Passed to
// kernels by value; `format` is model::WeightFormat as an int.
struct LinearView {
  int32_t format = 0;
  int32_t scale_is_f32 = 0;
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  int64_t scale_cols = 0;
};

// Raised by kernels in mapped host memory (CudaBackend::flags_): `raised` is a set of the bits below.
struct DeviceFlags {
  int raised = 0;
  int bad_token = 0;  // with kBadToken: one of the ids embed rejected
};
constexpr int kInexactRow = 1, kBadToken = 2;

struct AttnArgs;  // one attention call's operands (attention_rows.cuh)
class TensorCoreGemm;  // deepseek-tc's tensor-core products (gemm_tc.h)

// The layouts in which a quantized product's activations are prepared (gemm.cu's act_quant): the
// e4m3 values as floats; e4m3 bytes (deepseek-tc's FP8 tensor cores); the same bytes with K
// reordered within each 32-block as the FP4 experts' tensor-core kernel pairs them with its
// weights (gemm_experts_tc.cu); integer byte planes (FP4 weights on the exact path).
enum class QuantizedForm { values, codes, fragment_codes, planes };

// One matrix product for the GEMM kernels: y[m] = x[m / x_div] · W_mᵀ over rows [row0, row0+rows)
// for token rows m in [0, T). W_m is `W`, or table[view_of_row[m]] when a table is given (the
// routed experts: one matrix per (token, slot) row; an out-of-range index yields 0).
struct GemmRequest {
  LinearView W;
  const LinearView* table = nullptr;
  const int32_t* view_of_row = nullptr;
  int64_t n_views = 0;
  const float* x = nullptr;
  int64_t x_stride = 0, x_div = 1, T = 0;
  float* y = nullptr;
  int64_t y_stride = 0, row0 = 0, rows = 0;
  Compute compute = Compute::f32;
  // Quantized compute: x is the x of the GEMM just before this one (gate then up of an FFN), so
  // its activation quantization, still in the scratch, is reused when that GEMM quantized the
  // same rows of the same pointer for the same format (gemm checks; otherwise it quantizes).
  bool x_as_before = false;

  // The rows of x the product reads: ⌈T / x_div⌉.
  int64_t source_rows() const { return (T + x_div - 1) / x_div; }
};

// The up half of a clamped SwiGLU FFN joined to its gate's product (GemmRequest: the gate), so that
// one launch reads both matrices and writes h = swiglu_f(g, u, w_m) instead of g (§3.6).
struct SwigluUp {
  LinearView W;                       // the up matrix of a dense FFN (the shared expert), or
  const LinearView* table = nullptr;  // the routed experts' up matrices, indexed as the gate's table
  const float* row_weights = nullptr; // w_m of token row m (the routing weights); none: 1
  float limit = 0.0f;                 // L; 0: no clamp
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Numerics numerics);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  size_t device_memory_free() const override;
  double host_wait_seconds() const override { return memory_.host_wait_seconds(); }
  void restart_profile() override { profile_stats_.clear(); }  // (each timed op has been waited for)

  // With DSV4_CUDA_GRAPHS=1, decode steps of at most kMaxCapturedRows rows run as CUDA graphs
  // (capture.cpp), unless the ops are being profiled (each op is then waited for).
  static constexpr int64_t kMaxCapturedRows = 16;
  bool begin_capture(int64_t rows) override;
  void flush_capture() override;
  void end_capture(bool run) override;
  CaptureStats capture_stats() const override {
    return {captured_steps_, graphs_.launched(), graphs_.instantiated()};
  }

  float* alloc(size_t n_floats) override;
  void release(float* p) override;
  void copy(float* dst, const float* src, size_t n_floats) override;
  void fill(float* dst, float value, size_t n_floats) override;
  void to_host(float* host_dst, const float* src, size_t n_floats) override;
  void from_host(float* dst, const float* host_src, size_t n_floats) override;
  void ids_from_host(int32_t* dst, const int32_t* host_src, size_t n) override;
  int32_t* alloc_ids(size_t n) override;
  void release_ids(int32_t* p) override;

  void embed(const model::Linear& table, const int32_t* tokens, int64_t T, int64_t hc, float* X) override;
  void linear(const model::Linear& W, Compute compute, const float* x, int64_t x_stride, int64_t T, float* y,
              int64_t y_stride, int64_t row0, int64_t rows) override;
  using Backend::linear;
  void grouped_linear(const model::Linear& W, Compute compute, const float* x, int64_t T, int64_t groups,
                      float* y) override;
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, double eps, float* y) override;
  void head_norm(float* q, int64_t rows, int64_t n, double eps) override;
  void scale(float* x, int64_t n, float s) override;
  void add(const float* a, const float* b, int64_t n, float* y) override;
  void rope(float* x, int64_t n_groups, int64_t group, int64_t row_stride, const RopeFreqs& freqs, int64_t pos0,
            int64_t pos_step, bool inverse) override;
  void kv_fp8_sim(float* x, int64_t rows, int64_t row_stride, int64_t n_dims) override;
  void kv_norm_rope_fp8(const float* x, const float* w, int64_t rows, int64_t hd, double eps, const RopeFreqs& freqs,
                        int64_t p0, int64_t pos_step, int64_t nope, float* y) override;
  void indexer_fp4_sim(float* x, int64_t rows, int64_t n) override;

  void hc_pre(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D, int64_t sinkhorn_iters,
              double hc_eps, double norm_eps, float* u, float* post, float* comb) override;
  void hc_pre_norm(const model::HcParams& p, const float* w, const float* X, int64_t T, int64_t hc, int64_t D,
                   int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post, float* comb,
                   float* x) override;
  void hc_post_pre_norm(const float* a, float* X, const float* post, const float* comb, const model::HcParams& p,
                        const float* w, int64_t T, int64_t hc, int64_t D, int64_t sinkhorn_iters, double hc_eps,
                        double norm_eps, float* u, float* post_out, float* comb_out, float* x) override;
  void hc_post(const float* a, const float* X, const float* post, const float* comb, int64_t T, int64_t hc,
               int64_t D, float* X_out) override;
  void hc_head(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D, double hc_eps,
               double norm_eps, float* y) override;

  void swa_gather(const float* ring, int64_t window, int64_t width, int64_t pos_begin, int64_t pos_end,
                  float* dst) override;
  void swa_store(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0, int64_t n) override;
  int64_t compressor_push(const model::CompressorWeights& cw, CompressorCarry carry, const float* a, const float* s,
                          int64_t p0, int64_t T, float* pooled) override;
  void compressor_reset(const model::CompressorWeights& cw, CompressorCarry carry) override;
  void pack_rows(const RowFormat& f, const float* rows, int64_t n, float* stored) override;
  void indexer_select(const float* q, const float* wts, int64_t T, int64_t heads, int64_t dim, const float* keys,
                      const RowFormat& key_format, int64_t n_keys, int64_t ratio, int64_t p0, int64_t k,
                      int32_t* idx) override;
  void attention(const float* q, int64_t T, int64_t H, int64_t hd, int64_t p0, const SwaRows& swa,
                 const CompressedRows& comp, const float* sinks, float softmax_scale, float* out) override;

  void route(const model::MoeWeights& m, const float* x, const int32_t* tokens, int64_t T, int64_t D, int64_t k,
             double routed_scale, int32_t* sel, float* weights) override;
  void moe(const model::MoeWeights& m, const float* x, const int32_t* sel, const float* weights, int64_t T,
           int64_t D, int64_t k, double limit, float* out) override;

 private:
  // First: the stream outlives every member that queues work or frees memory on it.
  StreamMemory memory_;
  cudaStream_t stream_ = memory_.stream();
  StepGraphs graphs_;
  bool graphs_enabled_ = true;
  size_t part_ = 0;             // of the step being captured
  int64_t captured_steps_ = 0;  // run as graphs
  void launch_part();           // the part recorded so far, as the part_'th graph of the step

  bool deepseek() const { return quantizes(numerics()); }

  // ---- per-op GPU time (profile.cpp) ----
  // With DSV4_CUDA_PROFILE=1 every public op is fenced by two events and waited for, and its GPU
  // time is summed per op class (linear: per weight name without the layer index, with the
  // bytes of weights it read); the table goes to stderr when the backend is destroyed. Waiting
  // slows the run, so time with it off. Nested ops (route's linear) count in the outer one only;
  // calls that uploaded weights (first use) are left out. The variable is read again at every
  // to_host, so a caller can profile only the passes it wants (dsv4 bench: decode).
  class Timed {
   public:
    // bytes: the weights it reads; flops: its matrix products' multiply-adds × 2.
    Timed(CudaBackend& b, const char* op, const std::string& detail = {}, double bytes = 0, double flops = 0);
    ~Timed();
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    CudaBackend& b_;
    std::string name_;
    double bytes_, flops_;
    bool active_;
    size_t setups_before_;
  };
  struct OpStat {
    double ms = 0, bytes = 0, flops = 0;
    int64_t calls = 0;
  };
  static bool profile_requested();
  // One-time work done so far (weights uploaded, tables and cuBLASLt plans made): an op that did
  // some is left out of the profile, which times the steady state.
  size_t setups() const;
  void print_profile() const;
  bool profile_ = false;
  int profile_depth_ = 0;
  cudaEvent_t profile_events_[2] = {};
  std::map<std::string, OpStat> profile_stats_;

  // ---- weights on the device (memory.cu) ----
  // The device copy of `bytes` bytes of host memory at `host`, uploaded on first use.
  const void* upload(const void* host, size_t bytes);
  const float* device_floats(const std::vector<float>& v);
  const int32_t* device_ints(const std::vector<int32_t>& v);
  LinearView device_linear(const model::Linear& W);
  // A device array of views, one per routed expert, of w1, w3 or w2 (`which` = 1, 3, 2).
  const LinearView* device_expert_table(const model::MoeWeights& m, int which);
  // A device array of `groups` views of W, view g its rows [g·R, (g+1)·R) (R = W.out / groups).
  const LinearView* device_group_table(const model::Linear& W, int64_t groups);
  // The device copy of `views`, made once per key and kept (tables_).
  const LinearView* device_views(std::pair<const void*, int64_t> key, const std::vector<LinearView>& views);
  // n ids cycling through 0 … period − 1 (the grouped product's view of each row), kept and grown.
  const int32_t* cyclic_ids(int64_t period, int64_t n);
  GrownBuffer cyclic_ids_;
  int64_t cyclic_period_ = 0, cyclic_n_ = 0;

  // Attention of T ≤ kFewQueries queries on the FP64 tensor cores (attention.cu): logits, softmax,
  // values and combine, the launch shapes chosen to fill the GPU.
  void few_query_attention(const AttnArgs& a, int64_t T);
  // deepseek-tc, many queries: the bf16 tensor cores (attention_tc.cu).
  void tensor_core_attention(const AttnArgs& a, int64_t T);
  // deepseek-tc, routed FP4 experts of many rows: the FP8 tensor cores (gemm_experts_tc.cu), from
  // the activations in QuantizedForm::fragment_codes (rows of r.W.in bytes, scales sx [rows][K/128]);
  // scratch holds the grouping.
  void tensor_core_experts(const GemmRequest& r, const uint8_t* x, const float* sx, int32_t* scratch);
  // deepseek-tc, dense FP8 products of many rows where uses_tensor_core_fp8(r): the FP8 tensor cores
  // (gemm_fp8_tc.cu), from the activations in QuantizedForm::codes (scales sx [K/128][rows]).
  void tensor_core_fp8(const GemmRequest& r, const uint8_t* x, const float* sx);

  // ---- shared GEMM entry (gemm.cu), used by linear, hc and moe ----
  // With `swiglu`, r is an FFN's gate product and its up product and SwiGLU join the launch; only
  // where on_tc_gemv(r).
  void gemm(const GemmRequest& r, const SwigluUp* swiglu = nullptr);
  // Whether r runs on tc_gemv (deepseek-tc, a few rows on mma.sync), whose epilogue can be the SwiGLU.
  bool on_tc_gemv(const GemmRequest& r);
  // linear and grouped_linear: quantized compute (deepseek numerics) needs FP8 or FP4 weights; an
  // error naming W otherwise.
  void require_quantizable(const model::Linear& W, Compute compute) const;
  // The scratch of the GEMM in flight (its quantized activations and the FP64 path's grouping of
  // rows by expert, in disjoint parts): one buffer reused by every GEMM (they run in stream
  // order), instead of allocations and frees per product.
  GrownBuffer gemm_scratch_;
  // What the scratch's quantized activations are of (GemmRequest.x_as_before): the source rows,
  // K, the format's layout and the scratch itself; all zero when the last GEMM left none.
  struct QuantizedX {
    const float* x = nullptr;
    int64_t x_stride = 0, rows = 0, K = 0;
    QuantizedForm form = QuantizedForm::values;
    const void* scratch = nullptr;
    bool operator==(const QuantizedX&) const = default;
  };
  QuantizedX quantized_x_;
  // deepseek-tc only: the dense FP8 and bf16 products of many rows on the tensor cores (gemm_tc.cu).
  std::unique_ptr<TensorCoreGemm> tensor_cores_;
  // The clamped SwiGLU FFN's hidden rows (moe.cu): h = silu(min(g, L))·clamp(u, ±L)·w with g, u from
  // w1, w3 (§3.6), into h [gate.T, gate.rows]; gate and up carry x and the weights (up reuses gate's
  // quantized x). The down product (w2) is the caller's.
  void swiglu_hidden(GemmRequest gate, GemmRequest up, const float* row_weights, double limit, float* h);

  // hc_pre and hc_pre_norm (hc.cu): with w (a device copy), x = RMSNorm(u) in the same launch.
  void launch_hc_pre(const model::HcParams& p, const float* w, const float* X, int64_t T, int64_t hc, int64_t D,
                     int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post, float* comb,
                     float* x);

  // Lets `kernel` take up to the device's opt-in shared memory per block (set once per kernel),
  // or fails, naming `what`, when `bytes` is more than that.
  void allow_shared_memory(const void* kernel, size_t bytes, const char* what);
  int shared_memory_optin_ = 0;
  int sm_count_ = 0;  // multiprocessors of the device: a kernel with fewer blocks leaves some idle
  // The GEMV's arrival counts when it splits K (gemm.cu): one per output block of a grid of fewer
  // than 2·sm_count_ of them, zero between products.
  unsigned* part_arrivals_ = nullptr;
  // The word of the grid barriers of kernels whose blocks all run at once (grid_barrier.cuh).
  unsigned* grid_barrier_ = nullptr;
  // The indexer top-k's threshold path (indexer.cu), kept between selections: per query of a
  // decode step its key counts (zero between selections: each clears what it counted), its
  // threshold and its listed keys. At most 127 queries take that path: 37 MiB.
  GrownBuffer topk_scratch_;
  std::unordered_map<const void*, int> shared_memory_kernels_;  // kernel → dynamic bytes allowed

  // What kernels report to the host without a wait (mapped host memory), read at the next to_host:
  // pack_rows met a value its format cannot hold; embed met a token id outside the vocabulary.
  DeviceFlags* flags_ = nullptr;
  std::unordered_map<const void*, std::pair<void*, size_t>> uploads_;  // host address → (device copy, bytes)
  std::map<std::pair<const void*, int64_t>, LinearView*> tables_;  // (&experts[0].w? or &W, groups) → views
};

}  // namespace dsv4::cuda
