// ModelConfig: config.json of an official DeepSeek V4 checkpoint (architecture.md §1).
//
// Every size the engine uses comes from here; nothing about V4-Flash is hard-coded, so a tiny test
// checkpoint runs the same code as Flash or Pro. Parsing is strict: a missing or ill-typed field is
// an error naming the file and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::model {

// Attention type of a layer, from compress_ratios (§1.1): 0 = sliding window only, 4 = compressed
// sparse attention (overlapping ratio-4 compressor + Lightning Indexer), 128 = heavily compressed.
enum class AttnKind { swa, csa, hca };
const char* to_string(AttnKind kind);

enum class ExpertDtype { fp4, fp8 };

struct YarnScaling {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  std::string path;  // the config.json read, for messages

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;  // D
  int64_t n_layers = 0;
  int64_t n_mtp_layers = 0;  // num_nextn_predict_layers

  // attention (§3.3)
  int64_t n_heads = 0;
  int64_t head_dim = 0;       // q/k/v head width; K = V, one KV head
  int64_t rope_head_dim = 0;  // rotary on the LAST rope_head_dim dims of each head
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t sliding_window = 0;
  std::vector<int> compress_ratios;  // n_layers + n_mtp_layers entries

  // Lightning Indexer (§3.5)
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  // MoE (§3.6)
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t n_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_hash_layers = 0;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;
  bool norm_topk_prob = true;
  ExpertDtype expert_dtype = ExpertDtype::fp4;

  // mHC (§3.2.1)
  int64_t hc_mult = 0;
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;           // SWA layers and MTP
  double compress_rope_theta = 160000.0;  // CSA and HCA layers (with YaRN)
  YarnScaling yarn;
  int64_t max_position_embeddings = 0;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  // Derived.
  int ratio(int64_t il) const { return compress_ratios.at(size_t(il)); }
  AttnKind attn_kind(int64_t il) const;
  bool is_hash_layer(int64_t il) const { return il < n_hash_layers; }
  int64_t nope_head_dim() const { return head_dim - rope_head_dim; }
  int64_t heads_per_group() const { return n_heads / o_groups; }
  // Layer index of MTP block m inside compress_ratios.
  int64_t mtp_layer_index(int64_t m) const { return n_layers + m; }
};

// Reads and validates DIR/config.json (or the file itself when given a file).
ModelConfig load_config(const std::string& path);
// Parses config text; `path` only names the source in messages.
ModelConfig parse_config(const std::string& text, const std::string& path);

}  // namespace dsv4::model
