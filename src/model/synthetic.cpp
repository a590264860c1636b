#include "model/synthetic.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sys/mman.h>

#include "core/error.h"
#include "core/formats.h"
#include "core/parallel.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsv4::model {

namespace {

using nlohmann::ordered_json;

// The official V4-Flash config.json (architecture.md §1.1) without its compress_ratios, as text:
// the same object as an initializer list took GCC 135 s to compile under the sanitizers.
constexpr const char* kFlashConfig = R"json({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "attention_bias": false,
  "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": 1e-6, "hc_mult": 4,
  "hc_sinkhorn_iters": 20, "head_dim": 512, "hidden_act": "silu", "hidden_size": 4096,
  "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512, "max_position_embeddings": 1048576,
  "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 64, "num_experts_per_tok": 6,
  "num_hidden_layers": 43, "num_hash_layers": 3, "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-6,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                   "beta_slow": 1},
  "rope_theta": 10000, "compress_rope_theta": 160000, "routed_scaling_factor": 1.5,
  "scoring_func": "sqrtsoftplus", "sliding_window": 128, "swiglu_limit": 10.0,
  "tie_word_embeddings": false, "topk_method": "noaux_tc", "vocab_size": 129280})json";

ordered_json flash_config() {
  ordered_json c = ordered_json::parse(kFlashConfig);
  std::vector<int> ratios = {0, 0};
  for (int il = 2; il < 43; ++il) ratios.push_back(il % 2 == 0 ? 4 : 128);
  ratios.push_back(0);  // MTP
  c["compress_ratios"] = ratios;
  return c;
}

ordered_json pro_config() {  // §1.3: Flash with these keys changed
  ordered_json c = flash_config();
  c["hidden_size"] = 7168;
  c["num_hidden_layers"] = 61;
  c["num_attention_heads"] = 128;
  c["q_lora_rank"] = 1536;
  c["o_groups"] = 16;
  c["moe_intermediate_size"] = 3072;
  c["n_routed_experts"] = 384;
  c["routed_scaling_factor"] = 2.5;
  c["index_topk"] = 1024;
  std::vector<int> ratios = {128, 128};
  for (int il = 2; il < 61; ++il) ratios.push_back(il % 2 == 0 ? 4 : 128);
  ratios.push_back(0);
  c["compress_ratios"] = ratios;
  return c;
}

ordered_json tiny_chat_config() {  // every layer kind at tiny widths, with the real vocabulary
  ordered_json c = flash_config();
  c["hidden_size"] = 128;
  c["num_hidden_layers"] = 4;
  c["compress_ratios"] = {0, 4, 128, 4, 0};
  c["head_dim"] = 128;
  c["num_attention_heads"] = 2;
  c["q_lora_rank"] = 128;
  c["o_groups"] = 1;
  c["o_lora_rank"] = 128;
  c["index_n_heads"] = 2;
  c["index_topk"] = 16;
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 128;
  c["num_hash_layers"] = 1;
  return c;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Stateless randomness: draw i of a tensor is mix(key + i), so any split of the work over threads
// gives the same bytes (splitmix64's finaliser).
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// N(0, 1) by table: entry u is the normal quantile at (u + ½) / 65536, so a uniform 16-bit draw
// indexes a normal sample. Quantiles by bisection on erfc: portable, unlike std::normal_distribution.
const std::vector<float>& normal_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (size_t u = 0; u < t.size(); ++u) {
      const double p = (double(u) + 0.5) / 65536.0;
      double lo = -10, hi = 10;
      for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      t[u] = float(0.5 * (lo + hi));
    }
    return t;
  }();
  return table;
}

// The e4m3 / e2m1 code of every entry of normal_table() times `spread`, clamped to the format.
std::vector<uint8_t> code_table(bool fp4, float spread) {
  std::vector<uint8_t> t(65536);
  for (size_t u = 0; u < t.size(); ++u) {
    const float v = normal_table()[u] * spread;
    t[u] = fp4 ? f32_to_e2m1(std::fmax(std::fmin(v, 6.0f), -6.0f)) : f32_to_e4m3(std::fmax(std::fmin(v, 448.0f), -448.0f));
  }
  return t;
}

// Fills one tensor with values of the right kind for its role. Quantized weights draw their
// codes and their block scales independently, with scales chosen so that W ≈ N(0, 1/in).
// Multithreaded over elements (each element's draw depends only on the seed, the name and its index).
void fill_tensor(const TensorSpec& spec, uint64_t seed, int64_t n_experts, uint8_t* dst, size_t nbytes) {
  static const std::vector<uint8_t> e4m3_codes = code_table(false, 16.0f);  // N(0, 16²) over the e4m3 range
  static const std::vector<uint8_t> e2m1_codes = code_table(true, 2.0f);    // N(0, 2²)
  const std::vector<float>& normal = normal_table();
  const uint64_t key = mix(seed ^ fnv1a(spec.name));
  const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
  const int64_t n = int64_t(nbytes / dtype_size(spec.dtype));
  const int64_t cols = n / std::max<int64_t>(rows, 1);
  const std::string& name = spec.name;
  constexpr int64_t kChunk = int64_t(1) << 16;
  auto each = [&](auto&& body) {  // body(i, r): element i with its random 64 bits r
    parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) body(i, mix(key + uint64_t(i)));
    });
  };
  switch (spec.dtype) {
    case DType::F8_E4M3:
      each([&](int64_t i, uint64_t r) { dst[i] = e4m3_codes[r & 0xffff]; });
      return;
    case DType::I8:  // packed e2m1 pairs, low nibble first
      each([&](int64_t i, uint64_t r) { dst[i] = uint8_t(e2m1_codes[r & 0xffff] | (e2m1_codes[(r >> 16) & 0xffff] << 4)); });
      return;
    case DType::F8_E8M0: {
      // The matching weight's K width: FP8 scale columns cover 128, FP4 scale columns 32.
      const bool fp4 = cols > 0 && spec.shape.size() == 2 && name.find("experts.") != std::string::npos &&
                       name.find("shared_experts") == std::string::npos;
      const double k = double(cols) * (fp4 ? 32.0 : 128.0);
      const double code_std = fp4 ? 2.0 : 16.0;
      const int base = int(std::lround(std::log2(1.0 / (code_std * std::sqrt(k)))));
      // Scales vary from block to block by a factor of two either way.
      each([&](int64_t i, uint64_t r) { dst[i] = uint8_t(127 + base + int(r % 3) - 1); });
      return;
    }
    case DType::BF16:
    case DType::F32: {
      float scale = 1.0f, mean = 0.0f;
      if (spec.shape.size() == 2 && name != "embed.weight") scale = 1.0f / std::sqrt(float(cols));
      if (spec.shape.size() == 1 && ends_with(name, "norm.weight")) scale = 0.1f, mean = 1.0f;
      if (ends_with(name, "_base")) scale = 0.5f;
      if (ends_with(name, "ape")) scale = 0.5f;
      if (ends_with(name, "gate.bias")) scale = 0.1f;
      const bool ones = ends_with(name, "_scale");
      const bool f32 = spec.dtype == DType::F32;
      each([&](int64_t i, uint64_t r) {
        const float v = ones ? 1.0f : mean + scale * normal[r & 0xffff];
        if (f32) {
          std::memcpy(dst + 4 * i, &v, 4);
        } else {
          const uint16_t h = f32_to_bf16(v);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      });
      return;
    }
    case DType::I64: {  // tid2eid: k distinct experts per token (a partial Fisher–Yates shuffle)
      const int64_t k = spec.shape[1];
      parallel_for(rows, [&](int64_t row) {
        std::vector<int64_t> perm(static_cast<size_t>(n_experts));
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t j = i + int64_t(mix(key + uint64_t(row * k + i)) % uint64_t(n_experts - i));
          std::swap(perm[size_t(i)], perm[size_t(j)]);
          std::memcpy(dst + 8 * (row * k + i), &perm[size_t(i)], 8);
        }
      });
      return;
    }
    default:
      fail(ErrorCode::internal, "synthetic: no generator for {} ({})", name, to_string(spec.dtype));
  }
}

size_t tensor_bytes(const TensorSpec& s) {
  size_t n = dtype_size(s.dtype);
  for (int64_t d : s.shape) n *= size_t(d);
  return n;
}

}  // namespace

std::string preset_config(const std::string& name) {
  if (name == "v4-flash") return flash_config().dump(2);
  if (name == "v4-pro") return pro_config().dump(2);
  if (name == "tiny-chat") return tiny_chat_config().dump(2);
  fail(ErrorCode::invalid_input, "preset '{}': expected v4-flash, v4-pro or tiny-chat", name);
}

std::string with_layers(const std::string& config_text, int64_t n_layers) {
  ordered_json c = ordered_json::parse(config_text);
  const int64_t old = c.at("num_hidden_layers").get<int64_t>();
  if (n_layers < 1 || n_layers > old) fail(ErrorCode::invalid_input, "--layers {}: expected 1..{}", n_layers, old);
  std::vector<int> ratios = c.at("compress_ratios").get<std::vector<int>>();
  std::vector<int> kept(ratios.begin(), ratios.begin() + n_layers);
  kept.insert(kept.end(), ratios.begin() + old, ratios.end());  // the MTP entries
  c["num_hidden_layers"] = n_layers;
  c["compress_ratios"] = kept;
  c["num_hash_layers"] = std::min<int64_t>(c.at("num_hash_layers").get<int64_t>(), n_layers);
  return c.dump(2);
}

void write_synthetic_checkpoint(const std::string& config_text, uint64_t seed, const std::string& dir,
                                int n_shards) {
  const ModelConfig config = parse_config(config_text, dir + "/config.json");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config_text << "\n";
  const std::vector<TensorSpec> specs = expected_tensors(config);
  const int64_t n_experts = config.n_routed_experts;

  size_t total = 0;
  std::vector<size_t> sizes;
  for (const TensorSpec& s : specs) {
    sizes.push_back(tensor_bytes(s));
    total += sizes.back();
  }
  n_shards = std::max(1, n_shards);
  ordered_json weight_map = ordered_json::object();
  size_t next = 0;
  for (int shard = 0; shard < n_shards; ++shard) {
    const std::string file = n_shards == 1 ? "model.safetensors"
                                           : fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, n_shards);
    std::vector<TensorToWrite> list;
    size_t bytes = 0;
    const size_t budget = total * size_t(shard + 1) / size_t(n_shards);
    size_t done_before = 0;
    for (size_t i = 0; i < next; ++i) done_before += sizes[i];
    while (next < specs.size() && (shard == n_shards - 1 || done_before + bytes < budget)) {
      const TensorSpec spec = specs[next];
      list.push_back({spec.name, spec.dtype, spec.shape, [spec, seed, n_experts](uint8_t* dst, size_t nbytes) {
                        fill_tensor(spec, seed, n_experts, dst, nbytes);
                      }});
      weight_map[spec.name] = file;
      bytes += sizes[next++];
    }
    write_safetensors(dir + "/" + file, list);
  }
  if (n_shards > 1) {
    ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump(1) << "\n";
  }
}

Checkpoint synthetic_checkpoint(const std::string& config_text, uint64_t seed) {
  const ModelConfig config = parse_config(config_text, "synthetic");
  const std::vector<TensorSpec> specs = expected_tensors(config);
  constexpr size_t kAlign = 256;  // every tensor starts aligned, as a device copy would
  size_t total = 0;
  for (const TensorSpec& s : specs) total += (tensor_bytes(s) + kAlign - 1) / kAlign * kAlign;
  // In 2 MiB pages where the kernel allows: the first touch of ~100 GB in 4 KiB pages (a fault and a
  // zeroed page each) was a large part of making the weights.
  constexpr size_t kHugePage = size_t(2) << 20;
  total = (total + kHugePage - 1) / kHugePage * kHugePage;
  std::shared_ptr<uint8_t[]> storage(new (std::align_val_t(kHugePage)) uint8_t[total],
                                     [](uint8_t* p) { ::operator delete[](p, std::align_val_t(kHugePage)); });
  (void)madvise(storage.get(), total, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
  std::vector<TensorInfo> tensors;
  size_t offset = 0;
  for (const TensorSpec& s : specs) {
    TensorInfo t;
    t.name = s.name, t.dtype = s.dtype, t.shape = s.shape, t.nbytes = tensor_bytes(s);
    t.data = storage.get() + offset, t.file = "synthetic";
    fill_tensor(s, seed, config.n_routed_experts, storage.get() + offset, t.nbytes);
    offset += (t.nbytes + kAlign - 1) / kAlign * kAlign;
    tensors.push_back(std::move(t));
  }
  return Checkpoint::from_memory("synthetic", std::move(tensors), std::move(storage));
}

}  // namespace dsv4::model
