// The model's weights bound to checkpoint tensors, validated against the config (architecture.md §2).
//
// bind_weights() is the declarative tensor table: it walks the model in spec order, asks for each
// tensor by its official name with the dtype(s) and shape the config implies, and collects every
// mismatch (missing, wrong dtype, wrong shape, out-of-range hash table entry) and every tensor left
// unused, then reports them all at once. Large matrices stay in the file mapping as stored (FP8,
// packed FP4, BF16); small vectors (norms, biases, sinks, ape) are copied to aligned floats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace dsv4::model {

// How a matrix is stored. FP8: e4m3 bytes with one scale per 128x128 block; FP4: two e2m1 values
// per byte (low nibble first along K) with one scale per 1x32 block; BF16 / F32: plain.
enum class WeightFormat { fp8, fp4, bf16, f32 };
const char* to_string(WeightFormat format);

// A matrix W[out, in] used as y = x·Wᵀ. Pointers are into the checkpoint mapping (CPU) or into
// device memory (CUDA); neither is necessarily aligned.
struct Linear {
  std::string name;
  WeightFormat format = WeightFormat::f32;
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;  // fp8/fp4 only
  bool scale_is_f32 = false;       // -Base checkpoints store F32 scales instead of E8M0
  int64_t scale_cols = 0;          // scale row stride (blocks along K)

  // The scale factor of block (row o, column i), as a float.
  float block_scale(int64_t o, int64_t i) const;
  size_t bytes() const;  // weight + scale bytes
};

struct HcParams {  // mHC pre (§3.2.1) or HC head (§3.2.3)
  Linear fn;       // F32 [mix, hc*D]
  std::vector<float> base, scale;
};

struct CompressorWeights {  // §3.4.3
  int ratio = 0;
  int64_t dim = 0;  // d: head_dim (attention) or index_head_dim (indexer)
  int64_t width() const { return ratio == 4 ? 2 * dim : dim; }  // c·d
  // Rows of the per-sequence fp32 carry (§4.2): the previous and the current window for the
  // overlapping ratio 4, one window otherwise.
  int64_t carry_rows() const { return ratio == 4 ? 8 : ratio; }
  Linear wkv, wgate;      // [c·d, D], computed in fp32
  std::vector<float> ape;  // [ratio, c·d]
  std::vector<float> norm;  // [d]
};

struct IndexerWeights {  // §3.5
  Linear wq_b;          // FP8 [index_n_heads·index_head_dim, q_lora]
  Linear weights_proj;  // BF16 [index_n_heads, D]
  CompressorWeights compressor;
};

struct AttentionWeights {  // §3.3
  std::vector<float> sink, q_norm, kv_norm;
  Linear wq_a, wq_b, wkv, wo_a, wo_b;
  std::optional<CompressorWeights> compressor;  // CSA and HCA
  std::optional<IndexerWeights> indexer;        // CSA
};

struct ExpertWeights {
  Linear w1, w2, w3;  // gate, down, up
};

struct MoeWeights {  // §3.6
  Linear gate;                  // BF16 router [E, D], computed in fp32
  std::vector<float> bias;      // selection bias (score-routed layers)
  std::vector<int32_t> tid2eid;  // [vocab, k] (hash layers)
  std::optional<ExpertWeights> shared;
  std::vector<ExpertWeights> experts;
};

struct LayerWeights {
  int64_t il = 0;
  AttnKind kind = AttnKind::swa;
  bool hash = false;
  HcParams hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm;
  AttentionWeights attn;
  MoeWeights ffn;
};

struct MtpWeights {  // §3.8
  LayerWeights block;
  Linear e_proj, h_proj;
  std::vector<float> enorm, hnorm, norm;
  HcParams hc_head;
};

struct Weights {
  Linear embed;  // BF16 [vocab, D]
  Linear head;   // BF16 [vocab, D], computed in fp32
  std::vector<float> norm;
  HcParams hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;
};

// Binds and validates every tensor of `ck` against `config`; throws one dsv4::Error listing all
// problems found.
Weights bind_weights(const Checkpoint& ck, const ModelConfig& config);

// The tensors a checkpoint for `config` holds, in spec order, with their (first accepted) dtype
// and shape: the same table bind_weights checks against.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);
// Their bytes, with or without the MTP block (which the engine loads but does not run).
size_t expected_bytes(const ModelConfig& config, bool with_mtp);

}  // namespace dsv4::model
