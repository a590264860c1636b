#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "core/error.h"
#include "core/formats.h"

namespace dsv4::model {

const char* to_string(WeightFormat format) {
  switch (format) {
    case WeightFormat::fp8: return "fp8";
    case WeightFormat::fp4: return "fp4";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::f32: return "f32";
  }
  return "?";
}

float Linear::block_scale(int64_t o, int64_t i) const {
  const int64_t r = format == WeightFormat::fp8 ? o / 128 : o;
  const int64_t c = format == WeightFormat::fp8 ? i / 128 : i / 32;
  if (scale_is_f32) {
    float s;
    std::memcpy(&s, scale + 4 * (r * scale_cols + c), 4);
    return s;
  }
  return e8m0_to_f32(scale[r * scale_cols + c]);
}

size_t Linear::bytes() const {
  const int64_t rows = format == WeightFormat::fp8 ? (out + 127) / 128 : out;
  const size_t scale_bytes = scale ? size_t(rows * scale_cols) * (scale_is_f32 ? 4 : 1) : 0;
  switch (format) {
    case WeightFormat::fp8: return size_t(out * in) + scale_bytes;
    case WeightFormat::fp4: return size_t(out * in / 2) + scale_bytes;
    case WeightFormat::bf16: return size_t(out * in) * 2;
    case WeightFormat::f32: return size_t(out * in) * 4;
  }
  return 0;
}

namespace {

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Hands out tensors by name, checking dtype and shape, and records every problem instead of
// stopping at the first, so one run reports the whole list. Without a checkpoint it only lists
// what it is asked for (expected_tensors): the same walk is the table for both uses.
class Binder {
 public:
  Binder(const Checkpoint* ck, const ModelConfig& config) : ck_(ck), config_(config) {}

  const TensorInfo* take(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape) {
    if (!ck_) {
      listed_.push_back({name, *dtypes.begin(), shape});
      return nullptr;
    }
    const TensorInfo* t = ck_->find(name);
    if (!t) {
      errors_.push_back(fmt::format("{}: missing tensor (expected {} {})", name, to_string(*dtypes.begin()),
                                    shape_string(shape)));
      return nullptr;
    }
    used_.insert(name);
    bool dtype_ok = false;
    for (DType d : dtypes) dtype_ok |= t->dtype == d;
    if (!dtype_ok) {
      errors_.push_back(fmt::format("{}: {}: dtype {}, expected {}", t->file, name, to_string(t->dtype),
                                    to_string(*dtypes.begin())));
      return nullptr;
    }
    if (t->shape != shape) {
      errors_.push_back(fmt::format("{}: {}: shape {}, expected {}", t->file, name, t->shape_string(),
                                    shape_string(shape)));
      return nullptr;
    }
    return t;
  }

  // An FP8 matrix: NAME.weight e4m3 [out, in] + NAME.scale [ceil(out/128), ceil(in/128)].
  Linear fp8(const std::string& prefix, int64_t out, int64_t in) {
    Linear l = named(prefix + ".weight", WeightFormat::fp8, out, in);
    const TensorInfo* w = take(prefix + ".weight", {DType::F8_E4M3}, {out, in});
    const int64_t sc = (in + 127) / 128;
    const TensorInfo* s = take(prefix + ".scale", {DType::F8_E8M0, DType::F32}, {(out + 127) / 128, sc});
    if (w) l.data = w->data;
    if (s) l.scale = s->data, l.scale_is_f32 = s->dtype == DType::F32;
    l.scale_cols = sc;
    return l;
  }

  // An FP4 matrix: NAME.weight I8 [out, in/2] (two e2m1 per byte) + NAME.scale [out, in/32].
  Linear fp4(const std::string& prefix, int64_t out, int64_t in) {
    Linear l = named(prefix + ".weight", WeightFormat::fp4, out, in);
    const TensorInfo* w = take(prefix + ".weight", {DType::I8, DType::U8}, {out, in / 2});
    const TensorInfo* s = take(prefix + ".scale", {DType::F8_E8M0, DType::F32}, {out, in / 32});
    if (w) l.data = w->data;
    if (s) l.scale = s->data, l.scale_is_f32 = s->dtype == DType::F32;
    l.scale_cols = in / 32;
    return l;
  }

  Linear expert(const std::string& prefix, int64_t out, int64_t in) {
    return config_.expert_dtype == ExpertDtype::fp4 ? fp4(prefix, out, in) : fp8(prefix, out, in);
  }

  // A plain matrix stored as BF16 (or F32).
  Linear plain(const std::string& name, int64_t out, int64_t in) {
    Linear l = named(name, WeightFormat::bf16, out, in);
    if (const TensorInfo* t = take(name, {DType::BF16, DType::F32}, {out, in})) {
      l.data = t->data;
      l.format = t->dtype == DType::BF16 ? WeightFormat::bf16 : WeightFormat::f32;
    }
    return l;
  }

  // A small vector or table, copied to aligned floats (BF16 or F32 in the file).
  std::vector<float> floats(const std::string& name, const Shape& shape) {
    const TensorInfo* t = take(name, {DType::F32, DType::BF16}, shape);
    if (!t) return {};
    std::vector<float> v(size_t(t->numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t->dtype == DType::F32) {
        std::memcpy(&v[i], t->data + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, t->data + 2 * i, 2);
        v[i] = bf16_to_f32(h);
      }
    }
    return v;
  }

  std::vector<int32_t> hash_table(const std::string& name, int64_t rows, int64_t cols, int64_t n_experts) {
    const TensorInfo* t = take(name, {DType::I64, DType::I32}, {rows, cols});
    if (!t) return {};
    std::vector<int32_t> v(size_t(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t e;
      if (t->dtype == DType::I64) {
        std::memcpy(&e, t->data + 8 * i, 8);
      } else {
        int32_t e32;
        std::memcpy(&e32, t->data + 4 * i, 4);
        e = e32;
      }
      if (e < 0 || e >= n_experts) {
        errors_.push_back(fmt::format("{}: {}: entry [{}, {}] = {} is not an expert id in [0, {})", t->file, name,
                                      int64_t(i) / cols, int64_t(i) % cols, e, n_experts));
        return {};
      }
      v[i] = int32_t(e);
    }
    return v;
  }

  HcParams hc(const std::string& prefix, int64_t mix) {
    const int64_t width = config_.hc_mult * config_.hidden_size;
    HcParams p;
    p.fn = named(prefix + "fn", WeightFormat::f32, mix, width);
    if (const TensorInfo* t = take(prefix + "fn", {DType::F32}, {mix, width})) p.fn.data = t->data;
    p.base = floats(prefix + "base", {mix});
    p.scale = floats(prefix + "scale", {mix == config_.hc_mult ? 1 : 3});
    return p;
  }

  CompressorWeights compressor(const std::string& prefix, int ratio, int64_t dim) {
    CompressorWeights c;
    c.ratio = ratio;
    c.dim = dim;
    const int64_t D = config_.hidden_size;
    c.wkv = plain(prefix + "wkv.weight", c.width(), D);
    c.wgate = plain(prefix + "wgate.weight", c.width(), D);
    c.ape = floats(prefix + "ape", {ratio, c.width()});
    c.norm = floats(prefix + "norm.weight", {dim});
    return c;
  }

  LayerWeights layer(const std::string& p, int64_t il, bool hash) {
    const ModelConfig& c = config_;
    const int64_t D = c.hidden_size, H = c.n_heads, hd = c.head_dim;
    LayerWeights l;
    l.il = il;
    l.kind = c.attn_kind(il);
    l.hash = hash;
    const int64_t mix = (2 + c.hc_mult) * c.hc_mult;
    l.hc_attn = hc(p + "hc_attn_", mix);
    l.hc_ffn = hc(p + "hc_ffn_", mix);
    l.attn_norm = floats(p + "attn_norm.weight", {D});
    l.ffn_norm = floats(p + "ffn_norm.weight", {D});

    AttentionWeights& a = l.attn;
    a.sink = floats(p + "attn.attn_sink", {H});
    a.wq_a = fp8(p + "attn.wq_a", c.q_lora_rank, D);
    a.q_norm = floats(p + "attn.q_norm.weight", {c.q_lora_rank});
    a.wq_b = fp8(p + "attn.wq_b", H * hd, c.q_lora_rank);
    a.wkv = fp8(p + "attn.wkv", hd, D);
    a.kv_norm = floats(p + "attn.kv_norm.weight", {hd});
    a.wo_a = fp8(p + "attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
    a.wo_b = fp8(p + "attn.wo_b", D, c.o_groups * c.o_lora_rank);
    if (l.kind != AttnKind::swa) a.compressor = compressor(p + "attn.compressor.", c.ratio(il), hd);
    if (l.kind == AttnKind::csa) {
      IndexerWeights ix;
      ix.wq_b = fp8(p + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      ix.weights_proj = plain(p + "attn.indexer.weights_proj.weight", c.index_n_heads, D);
      ix.compressor = compressor(p + "attn.indexer.compressor.", 4, c.index_head_dim);
      a.indexer = std::move(ix);
    }

    MoeWeights& m = l.ffn;
    const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size;
    m.gate = plain(p + "ffn.gate.weight", E, D);
    if (hash)
      m.tid2eid = hash_table(p + "ffn.gate.tid2eid", c.vocab_size, c.n_experts_per_tok, E);
    else
      m.bias = floats(p + "ffn.gate.bias", {E});
    if (c.n_shared_experts > 0)
      m.shared = ExpertWeights{fp8(p + "ffn.shared_experts.w1", F, D), fp8(p + "ffn.shared_experts.w2", D, F),
                               fp8(p + "ffn.shared_experts.w3", F, D)};
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e);
      m.experts.push_back({expert(ep + ".w1", F, D), expert(ep + ".w2", D, F), expert(ep + ".w3", F, D)});
    }
    return l;
  }

  void report_leftovers() {
    for (auto& [name, t] : ck_->tensors())
      if (!used_.count(name)) errors_.push_back(fmt::format("{}: {}: unexpected tensor (not in the model for this config)", t.file, name));
  }

  void throw_if_errors() const {
    if (errors_.empty()) return;
    std::string msg = fmt::format("{}: {} problem(s) with the checkpoint tensors:", ck_->dir(), errors_.size());
    const size_t shown = std::min<size_t>(errors_.size(), 40);
    for (size_t i = 0; i < shown; ++i) msg += "\n  " + errors_[i];
    if (shown < errors_.size()) msg += fmt::format("\n  ... and {} more", errors_.size() - shown);
    throw Error(ErrorCode::invalid_input, msg);
  }

  std::vector<TensorSpec> listed() const { return listed_; }

 private:
  static Linear named(const std::string& name, WeightFormat format, int64_t out, int64_t in) {
    Linear l;
    l.name = name;
    l.format = format;
    l.out = out;
    l.in = in;
    return l;
  }

  const Checkpoint* ck_;
  const ModelConfig& config_;
  std::vector<TensorSpec> listed_;
  std::vector<std::string> errors_;
  std::set<std::string> used_;
};

// The model in spec order: every tensor it asks the binder for.
Weights walk(Binder& b, const ModelConfig& c) {
  Weights w;
  const int64_t D = c.hidden_size;
  w.embed = b.plain("embed.weight", c.vocab_size, D);
  w.head = b.plain("head.weight", c.vocab_size, D);
  w.norm = b.floats("norm.weight", {D});
  w.hc_head = b.hc("hc_head_", c.hc_mult);
  for (int64_t il = 0; il < c.n_layers; ++il)
    w.layers.push_back(b.layer("layers." + std::to_string(il) + ".", il, c.is_hash_layer(il)));
  for (int64_t m = 0; m < c.n_mtp_layers; ++m) {
    const std::string p = "mtp." + std::to_string(m) + ".";
    MtpWeights mtp;
    mtp.block = b.layer(p, c.mtp_layer_index(m), false);
    mtp.e_proj = b.fp8(p + "e_proj", D, D);
    mtp.h_proj = b.fp8(p + "h_proj", D, D);
    mtp.enorm = b.floats(p + "enorm.weight", {D});
    mtp.hnorm = b.floats(p + "hnorm.weight", {D});
    mtp.norm = b.floats(p + "norm.weight", {D});
    mtp.hc_head = b.hc(p + "hc_head_", c.hc_mult);
    w.mtp.push_back(std::move(mtp));
  }
  return w;
}

}  // namespace

Weights bind_weights(const Checkpoint& ck, const ModelConfig& c) {
  Binder b(&ck, c);
  Weights w = walk(b, c);
  b.report_leftovers();
  b.throw_if_errors();
  return w;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  Binder b(nullptr, c);
  walk(b, c);
  return b.listed();
}

size_t expected_bytes(const ModelConfig& c, bool with_mtp) {
  size_t total = 0;
  for (const TensorSpec& t : expected_tensors(c)) {
    if (!with_mtp && t.name.starts_with("mtp.")) continue;
    size_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= size_t(d);
    total += n;
  }
  return total;
}

}  // namespace dsv4::model
