// The CPU backend: the readable reference implementation of every op in backend.h.
//
// Plain loops with shape comments, threaded with parallel_for over independent rows/heads/experts
// so results never depend on the thread count. One file per op family (gemm, norm, rope, quant,
// hc, attention, compressor, indexer, moe).
#pragma once

#include "backend/backend.h"
#include "core/formats.h"

namespace dsv4::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Numerics numerics) : Backend(numerics) {}
  std::string name() const override { return "cpu"; }

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
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, double eps, float* y) override;
  void head_norm(float* q, int64_t rows, int64_t n, double eps) override;
  void scale(float* x, int64_t n, float s) override;
  void add(const float* a, const float* b, int64_t n, float* y) override;
  void rope(float* x, int64_t n_groups, int64_t group, int64_t row_stride, const RopeFreqs& freqs, int64_t pos0,
            int64_t pos_step, bool inverse) override;
  void kv_fp8_sim(float* x, int64_t rows, int64_t row_stride, int64_t n_dims) override;
  void indexer_fp4_sim(float* x, int64_t rows, int64_t n) override;

  void hc_pre(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D, int64_t sinkhorn_iters,
              double hc_eps, double norm_eps, float* u, float* post, float* comb) override;
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
  bool deepseek() const { return numerics() == Numerics::deepseek; }
  // Rounds to bf16 where the reference does (§5); identity in plain numerics.
  float round(float x) const { return deepseek() ? round_bf16(x) : x; }
  // The clamped SwiGLU of one expert (§3.6): out += expert(x) for T rows, w per row (null = 1).
  void expert_ffn(const model::ExpertWeights& e, const float* x, int64_t T, int64_t D, const float* w, double limit,
                  float* y);
};

}  // namespace dsv4::cpu
