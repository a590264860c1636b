// The op set: what the engine's forward pass asks of a backend (architecture.md §3–§5).
//
// The engine never touches activation or state memory itself; it allocates through the backend
// and composes these ops, so the same forward pass runs on the CPU reference and on the GPU.
// Activations are float arrays, row-major, outermost dimension first. In `deepseek` numerics a
// backend reproduces the official reference (FP8/FP4 activation quantization, KV FP8 and indexer
// FP4 simulation, the bf16 roundings of §5), and values between ops are bf16-representable; in
// `plain` numerics everything is fp32 on the dequantized weights and no quantization step runs.
//
// Memory: activation, state and id buffers come from the backend (alloc, alloc_ids) and only ops
// touch them. Weights (Linear data and scales, the small float vectors of norms, sinks, ape, hc
// parameters, router bias and tid2eid, RoPE frequencies) are host memory owned by the model; a
// device backend uploads each on first use and keeps it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/row_format.h"
#include "model/weights.h"

namespace dsv4 {

// deepseek_tc is deepseek with one change, on the GPU only: the dense products of many token rows
// (prefill) run on the tensor cores (cuBLASLt), as DeepSeek's own kernels do, instead of exactly:
// the FP8 ones sum their K tiles on the FP8 tensor cores (1×128 activation and 128×128 weight block
// scales), the bf16 ones accumulate in fp32. Those sums keep fewer bits than the exact ones, and
// these numerics are chaotic (tools/oracle/NOTES.md §2, §5), so it matches deepseek statistically,
// not bit for bit.
enum class Numerics { deepseek, plain, deepseek_tc };
const char* to_string(Numerics numerics);
Numerics parse_numerics(const std::string& name);  // "deepseek" | "plain" | "deepseek-tc"
// Whether the numerics run the official quantization steps (deepseek and deepseek_tc).
inline bool quantizes(Numerics numerics) { return numerics != Numerics::plain; }

// How a matrix product is computed (§3.0 "Linear kinds"). In plain numerics all are fp32.
enum class Compute {
  quantized,  // FP8/FP4 weights: per-128 FP8 activation quantization, scaled K-tile sums, bf16 out
  bf16,       // bf16 operands (weights dequantized exactly), fp32 accumulate, bf16 out
  f32,        // fp32 in, fp32 accumulate, fp32 out
  // f32 of an x whose values are bf16 in deepseek numerics (a bf16-rounded output: an RMSNorm's,
  // the HC state). Its products by BF16 weights are exact in bf16, by F32 ones in three TF32 parts
  // of the weight, so the reference's fp32 GEMM differs from the exact sum only in its order of
  // summation, and deepseek-tc may sum the products on the tensor cores (fp32 accumulation).
  // Elsewhere it is f32.
  f32_bf16_in,
};
// Whether deepseek numerics round the product's output to bf16 (fp32 kinds keep fp32).
inline bool rounds_output(Compute compute) { return compute == Compute::quantized || compute == Compute::bf16; }

// RoPE frequencies of one layer kind (§3.0): rope_head_dim/2 fp32 values.
struct RopeFreqs {
  std::vector<float> freqs;
  int64_t dims() const { return int64_t(freqs.size()) * 2; }
};

// A window of raw KV rows for attention: rows of consecutive positions [first_pos, first_pos+n).
struct SwaRows {
  const float* kv = nullptr;
  int64_t first_pos = 0;
  int64_t n = 0;
  int64_t window = 0;  // query t sees positions (t - window, t]
};

// Compressed rows for attention, stored in `format` (row w at kv + w * format.stride).
// idx == nullptr: query t sees rows w < floor((t+1)/ratio) (HCA). Otherwise idx[t*k .. t*k+k)
// lists the rows query t uses, -1 for none (CSA, from the indexer).
struct CompressedRows {
  const float* kv = nullptr;
  RowFormat format;
  int64_t n = 0;
  int64_t ratio = 0;
  const int32_t* idx = nullptr;
  int64_t k = 0;
};

// Per-sequence fp32 carry of one compressor (§4.2): the not-yet-pooled projections.
// ratio 4: 8 rows (previous window, then current) of width 2d; ratio 128: 128 rows of width d.
struct CompressorCarry {
  float* a = nullptr;
  float* s = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  Numerics numerics() const { return numerics_; }
  // Device memory still free for weights, state and activations, in bytes. 0 for a backend that
  // works in host memory and maps the weights in place (the CPU: the OS pages them in).
  virtual size_t device_memory_free() const { return 0; }
  // Seconds the host has spent waiting for the device to finish queued work (in the synchronizing
  // copies) since the backend was made: a decode step's time less this is the host's own, which
  // bounds the step when the device is faster than the host can queue work (dsv4 bench). Zero for
  // a backend that computes on the host.
  virtual double host_wait_seconds() const { return 0.0; }
  // A device backend's per-op profile (DSV4_CUDA_PROFILE=1) starts afresh from here: dsv4 bench
  // calls it after its warm-up, so the table counts the timed prompts' calls alone. Nothing elsewhere.
  virtual void restart_profile() {}

  // ---- memory ----------------------------------------------------------------------------------
  virtual float* alloc(size_t n_floats) = 0;
  virtual void release(float* p) = 0;
  virtual void copy(float* dst, const float* src, size_t n_floats) = 0;
  virtual void fill(float* dst, float value, size_t n_floats) = 0;
  virtual void to_host(float* host_dst, const float* src, size_t n_floats) = 0;
  // Synchronous, like to_host: the caller may free host_src as soon as this returns.
  virtual void from_host(float* dst, const float* host_src, size_t n_floats) = 0;
  // Like from_host, in stream order with the ops: the caller may free host_src on return.
  virtual void ids_from_host(int32_t* dst, const int32_t* host_src, size_t n) = 0;

  // ---- captured steps -------------------------------------------------------------------------
  // A device backend may record the ops of a step of `rows` token rows and launch them at once
  // (CUDA graphs: launching a decode step's few hundred kernels one by one costs the host more
  // than the GPU takes to run them). Between begin_capture and end_capture(true), which runs what
  // was recorded, ops queue work as usual but nothing may be read back (to_host) and nothing
  // allocated may outlive the step but its results; end_capture(false), for an error inside the
  // step, drops what was recorded since the last flush and never throws. flush_capture launches
  // what was recorded so far and records on, so the device runs one part of the step while the
  // host records the next. begin_capture returns whether it records; the CPU backend never does.
  virtual bool begin_capture(int64_t rows) {
    (void)rows;
    return false;
  }
  virtual void flush_capture() {}
  virtual void end_capture(bool run) { (void)run; }
  struct CaptureStats {
    int64_t steps = 0;         // steps run as graphs
    int64_t launched = 0;      // graphs launched for them: one per part
    int64_t instantiated = 0;  // executable graphs made (the other launches updated a kept one)
  };
  virtual CaptureStats capture_stats() const { return {}; }

  // ---- ops --------------------------------------------------------------------------------------
  // X[t, h, :] = embed[tokens[t]] for every stream h (§3.1).
  virtual void embed(const model::Linear& table, const int32_t* tokens, int64_t T, int64_t hc, float* X) = 0;

  // y[t] = x[t] · W[row0 : row0+rows]ᵀ, x rows of stride x_stride, y rows of stride y_stride.
  virtual void linear(const model::Linear& W, Compute compute, const float* x, int64_t x_stride, int64_t T,
                      float* y, int64_t y_stride, int64_t row0, int64_t rows) = 0;
  void linear(const model::Linear& W, Compute compute, const float* x, int64_t T, float* y) {
    linear(W, compute, x, W.in, T, y, W.out, 0, W.out);
  }
  // The grouped output projection (§3.3): for each g < groups, rows [g·R, (g+1)·R) of W (R =
  // W.out / groups) take columns [g·W.in, (g+1)·W.in) of x (rows groups·W.in wide) to columns
  // [g·R, (g+1)·R) of y (rows W.out wide). By definition `groups` linear calls (the default); a
  // device backend may run them as one.
  virtual void grouped_linear(const model::Linear& W, Compute compute, const float* x, int64_t T, int64_t groups,
                              float* y);

  // y = w ⊙ x · rsqrt(mean(x²) + eps) per row of n (w may be null: weightless).
  virtual void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, double eps, float* y) = 0;
  // The weightless per-head q norm; in deepseek numerics done in bf16 arithmetic (§3.3).
  virtual void head_norm(float* q, int64_t rows, int64_t n, double eps) = 0;
  // y = round(x · s) elementwise.
  virtual void scale(float* x, int64_t n, float s) = 0;
  // y = round(a + b) elementwise.
  virtual void add(const float* a, const float* b, int64_t n, float* y) = 0;

  // Rotates the last freqs.dims() entries of each row (interleaved pairs, §3.0). Rows come in
  // groups of `group` (heads); group i is at position pos0 + i * pos_step. inverse: rotate by −θ.
  virtual void rope(float* x, int64_t n_groups, int64_t group, int64_t row_stride, const RopeFreqs& freqs,
                    int64_t pos0, int64_t pos_step, bool inverse) = 0;

  // KV FP8 simulation of dims [0, n_dims) of each row, 64-blocks (§3.0); no-op in plain.
  virtual void kv_fp8_sim(float* x, int64_t rows, int64_t row_stride, int64_t n_dims) = 0;

  // A joined step, by definition its ops in order (the default); a device backend may run it in
  // one pass (a decoded token's KV row is one vector, and each op a launch).
  // KV rows (§3.3, §3.4.3): y = RMSNorm(x) with weight w, RoPE at position p0 + i·pos_step of row i,
  // then the KV FP8 simulation of dims [0, nope).
  virtual void kv_norm_rope_fp8(const float* x, const float* w, int64_t rows, int64_t hd, double eps,
                                const RopeFreqs& freqs, int64_t p0, int64_t pos_step, int64_t nope, float* y);
  // Indexer quantization: Hadamard then FP4 simulation of each row (§3.5); no-op in plain.
  virtual void indexer_fp4_sim(float* x, int64_t rows, int64_t n) = 0;

  // ---- mHC (§3.2) --------------------------------------------------------------------------------
  virtual void hc_pre(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D,
                      int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post,
                      float* comb) = 0;
  // hc_pre, then x = RMSNorm(u) with the sublayer's norm weight w (as rms_norm): one op so a device
  // backend can do both in one pass. By definition the two calls (the default).
  virtual void hc_pre_norm(const model::HcParams& p, const float* w, const float* X, int64_t T, int64_t hc,
                           int64_t D, int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post,
                           float* comb, float* x);
  // X_out may be X (updated in place).
  virtual void hc_post(const float* a, const float* X, const float* post, const float* comb, int64_t T,
                       int64_t hc, int64_t D, float* X_out) = 0;
  // From one sublayer to the next: hc_post of the sublayer's output a into X (in place, with its
  // post and comb), then hc_pre_norm of the next sublayer (p, w) on the new X, into u, post_out,
  // comb_out and x. By definition the two calls (the default); a device backend may do both in one
  // launch (at decode they are four kernels, mostly waiting on one another).
  virtual void hc_post_pre_norm(const float* a, float* X, const float* post, const float* comb,
                                const model::HcParams& p, const float* w, int64_t T, int64_t hc, int64_t D,
                                int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post_out,
                                float* comb_out, float* x);
  virtual void hc_head(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D, double hc_eps,
                       double norm_eps, float* y) = 0;

  // ---- attention state and attention (§3.3–§3.5, §4) ----------------------------------------------
  // dst = rows of positions [pos_begin, pos_end) read from the ring (slot = pos mod window).
  virtual void swa_gather(const float* ring, int64_t window, int64_t width, int64_t pos_begin, int64_t pos_end,
                          float* dst) = 0;
  // Writes rows of positions [pos0, pos0+n) into the ring (only the last `window` matter).
  virtual void swa_store(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0,
                         int64_t n) = 0;

  // Pushes T tokens' projections (a, s: [T, width]; ape is added to s here) at positions
  // [p0, p0+T) into the carry, and writes the pooled value of every window completed by them to
  // `pooled` ([n_emitted, dim], rounded to bf16 in deepseek numerics). Returns n_emitted.
  virtual int64_t compressor_push(const model::CompressorWeights& cw, CompressorCarry carry, const float* a,
                                  const float* s, int64_t p0, int64_t T, float* pooled) = 0;
  virtual void compressor_reset(const model::CompressorWeights& cw, CompressorCarry carry) = 0;

  // Stores n fp32 rows in format f (f.stride floats each) at `stored`. Exact: in deepseek
  // numerics the state's rows are already values of the compact formats (core/row_format.h).
  virtual void pack_rows(const RowFormat& f, const float* rows, int64_t n, float* stored) = 0;

  // Lightning Indexer selection (§3.5) for queries at [p0, p0+T): q [T, heads, dim], wts [T, heads],
  // n_keys keys of width dim stored in key_format; writes, per query, the top-k visible rows by
  // score (descending, ties to the lower row), -1 padded, into idx [T, k].
  virtual void indexer_select(const float* q, const float* wts, int64_t T, int64_t heads, int64_t dim,
                              const float* keys, const RowFormat& key_format, int64_t n_keys, int64_t ratio,
                              int64_t p0, int64_t k, int32_t* idx) = 0;

  // Sparse attention with sinks (§3.3) for queries at [p0, p0+T): q [T, H, hd] → out [T, H, hd].
  virtual void attention(const float* q, int64_t T, int64_t H, int64_t hd, int64_t p0, const SwaRows& swa,
                         const CompressedRows& comp, const float* sinks, float softmax_scale, float* out) = 0;

  // ---- MoE (§3.6) ---------------------------------------------------------------------------------
  // Picks k experts per token (by tid2eid when hash, else top-k of score + bias) and their weights.
  virtual void route(const model::MoeWeights& m, const float* x, const int32_t* tokens, int64_t T, int64_t D,
                     int64_t k, double routed_scale, int32_t* sel, float* weights) = 0;
  // out = Σ_{e∈sel} expert_e(x)·w_e (ascending e) + shared(x), clamped SwiGLU with `limit`.
  // A backend passes at most kMaxMoeTokenChunk tokens through the experts at once (the memory
  // plan counts their [tokens, k, F] intermediates).
  static constexpr int64_t kMaxMoeTokenChunk = 8192;
  virtual void moe(const model::MoeWeights& m, const float* x, const int32_t* sel, const float* weights,
                   int64_t T, int64_t D, int64_t k, double limit, float* out) = 0;

  // Integer buffers for routing and indexer selections.
  virtual int32_t* alloc_ids(size_t n) = 0;
  virtual void release_ids(int32_t* p) = 0;

 protected:
  explicit Backend(Numerics numerics) : numerics_(numerics) {}

 private:
  Numerics numerics_;
};

std::unique_ptr<Backend> make_cpu_backend(Numerics numerics);

// A float buffer owned through a backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, size_t n) : backend_(&backend), n_(n), p_(n ? backend.alloc(n) : nullptr) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    reset();
    backend_ = o.backend_, n_ = o.n_, p_ = o.p_;
    o.p_ = nullptr, o.n_ = 0;
    return *this;
  }
  ~Buffer() { reset(); }
  float* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void reset() {
    if (p_) backend_->release(p_);
    p_ = nullptr;
  }
  Backend* backend_ = nullptr;
  size_t n_ = 0;
  float* p_ = nullptr;
};

class IdBuffer {
 public:
  IdBuffer() = default;
  IdBuffer(Backend& backend, size_t n) : backend_(&backend), p_(n ? backend.alloc_ids(n) : nullptr) {}
  IdBuffer(IdBuffer&& o) noexcept { *this = std::move(o); }
  IdBuffer& operator=(IdBuffer&& o) noexcept {
    if (p_) backend_->release_ids(p_);
    backend_ = o.backend_, p_ = o.p_;
    o.p_ = nullptr;
    return *this;
  }
  ~IdBuffer() {
    if (p_) backend_->release_ids(p_);
  }
  int32_t* get() const { return p_; }

 private:
  Backend* backend_ = nullptr;
  int32_t* p_ = nullptr;
};

}  // namespace dsv4
