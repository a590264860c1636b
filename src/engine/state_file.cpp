#include "engine/state_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/replace_file.h"
#include "model/safetensors.h"

namespace dsv4::engine {
namespace {

static_assert(std::endian::native == std::endian::little, "state files are little-endian; add byte swaps");

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'S', 'T', 'A', 'T'};

// The buffers of a LayerSnapshot in file order. A buffer added to LayerSnapshot goes here too,
// with kStateFileVersion raised.
struct LayerBuffer {
  Buffer LayerSnapshot::*member;
  const char* name;
};
constexpr LayerBuffer kLayerBuffers[] = {
    {&LayerSnapshot::ring, "ring"},
    {&LayerSnapshot::compressed, "compressed rows"},
    {&LayerSnapshot::index_keys, "indexer keys"},
    {&LayerSnapshot::compressor_a, "compressor carry a"},
    {&LayerSnapshot::compressor_s, "compressor carry s"},
    {&LayerSnapshot::index_compressor_a, "indexer compressor carry a"},
    {&LayerSnapshot::index_compressor_s, "indexer compressor carry s"},
};

// FNV-1a's step over 8-byte words (a last partial word zero-padded), fed in any pieces: not the
// standard byte-wise FNV-1a, but several times faster on the gigabytes of a long context's state.
class Checksum {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      if (n_tail_ == 0 && n >= 8) {  // the bulk: whole words straight from the input
        h_ = step(h_, p);
        p += 8, n -= 8;
        continue;
      }
      const size_t k = std::min(n, sizeof(tail_) - n_tail_);
      std::memcpy(tail_ + n_tail_, p, k);
      n_tail_ += k, p += k, n -= k;
      if (n_tail_ == sizeof(tail_)) h_ = step(h_, tail_), n_tail_ = 0;
    }
  }
  uint64_t value() const {
    if (n_tail_ == 0) return h_;
    uint8_t last[8] = {};
    std::memcpy(last, tail_, n_tail_);
    return step(h_, last);
  }

 private:
  static uint64_t step(uint64_t h, const uint8_t* word) {
    uint64_t w;
    std::memcpy(&w, word, 8);
    return (h ^ w) * 1099511628211ull;
  }
  uint64_t h_ = 14695981039346656037ull;
  uint8_t tail_[8] = {};
  size_t n_tail_ = 0;
};

uint64_t weights_sample_digest(const model::Weights& w) {
  Checksum digest;
  constexpr size_t kSampleBytes = 4096;
  for (const model::Linear* table : {&w.embed, &w.head})
    digest.add(table->data, std::min(kSampleBytes, table->bytes()));
  auto add_floats = [&](const std::vector<float>& v) { digest.add(v.data(), v.size() * sizeof(float)); };
  add_floats(w.norm);
  for (const model::LayerWeights& lw : w.layers)
    for (const std::vector<float>* v : {&lw.attn_norm, &lw.ffn_norm, &lw.attn.q_norm, &lw.attn.kv_norm, &lw.attn.sink})
      add_floats(*v);
  return digest.value();
}

// Buffered writes to a temporary file that also feed the checksum.
class Writer {
 public:
  explicit Writer(std::filesystem::path path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "wb")) {
    if (!f_) fail(ErrorCode::invalid_input, "{}: cannot create: {}", path_.string(), std::strerror(errno));
  }
  ~Writer() {
    if (f_) std::fclose(f_);
  }
  void bytes(const void* data, size_t n) {
    if (n > 0 && std::fwrite(data, 1, n, f_) != n)
      fail(ErrorCode::invalid_input, "{}: write failed: {}", path_.string(), std::strerror(errno));
    checksum_.add(data, n);
  }
  template <class T>
  void value(T v) {
    bytes(&v, sizeof(T));
  }
  void text(const std::string& s) {
    value(uint32_t(s.size()));
    bytes(s.data(), s.size());
  }
  // Appends the checksum and makes the bytes durable before the caller renames the file.
  void finish() {
    const uint64_t sum = checksum_.value();
    bytes(&sum, sizeof(sum));
    const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok || !closed) fail(ErrorCode::invalid_input, "{}: write failed: {}", path_.string(), std::strerror(errno));
  }

 private:
  std::filesystem::path path_;
  std::FILE* f_;
  Checksum checksum_;
};

// Bounds-checked reads from the mapped file; errors say what was being read (the caller adds the path).
class Reader {
 public:
  explicit Reader(const model::MappedFile& file) : file_(file) {}
  const uint8_t* take(size_t count, size_t elem_bytes, const std::string& what) {
    const size_t left = file_.size() - at_;
    if (count > left / elem_bytes)
      fail(ErrorCode::invalid_input, "truncated: {} ({} x {} bytes) at byte {}, the file has {} bytes", what, count,
           elem_bytes, at_, file_.size());
    const uint8_t* p = file_.data() + at_;
    at_ += count * elem_bytes;
    return p;
  }
  template <class T>
  T value(const std::string& what) {
    T v;
    std::memcpy(&v, take(1, sizeof(T), what), sizeof(T));
    return v;
  }
  std::string text(const std::string& what) {
    const uint32_t n = value<uint32_t>(what);
    const auto* p = reinterpret_cast<const char*>(take(n, 1, what));
    return std::string(p, n);
  }
  size_t at() const { return at_; }

 private:
  const model::MappedFile& file_;
  size_t at_ = 0;
};

// A buffer as u64 n_floats, f32 data[n_floats], through host memory.
void write_buffer(Writer& out, const Buffer& buf, Backend& backend) {
  out.value(uint64_t(buf.size()));
  if (buf.size() == 0) return;
  std::vector<float> host(buf.size());
  backend.to_host(host.data(), buf.get(), buf.size());
  out.bytes(host.data(), host.size() * sizeof(float));
}

Buffer read_buffer(Reader& in, Backend& backend, const std::string& what) {
  const uint64_t n = in.value<uint64_t>(what);
  const uint8_t* data = in.take(n, sizeof(float), what);
  if (n == 0) return Buffer();
  std::vector<float> host(n);
  std::memcpy(host.data(), data, n * sizeof(float));  // the mapping need not be float-aligned
  Buffer buf(backend, n);
  backend.from_host(buf.get(), host.data(), n);
  return buf;
}

// Token ids as u64 count, i32 ids[count].
void write_tokens(Writer& out, std::span<const int32_t> tokens) {
  out.value(uint64_t(tokens.size()));
  out.bytes(tokens.data(), tokens.size_bytes());
}

std::vector<int32_t> read_tokens(Reader& in, const std::string& what) {
  const uint64_t n = in.value<uint64_t>(what + " count");
  const uint8_t* data = in.take(n, sizeof(int32_t), what);
  std::vector<int32_t> tokens(n);
  if (n > 0) std::memcpy(tokens.data(), data, n * sizeof(int32_t));
  return tokens;
}

void write_fingerprint(Writer& out, const StateFingerprint& fp) {
  out.value(uint32_t(fp.fields.size()));
  for (const auto& [name, value] : fp.fields) out.text(name), out.text(value);
}

// Refuses a file made for another model, numerics or state layout, listing every field that differs.
void check_fingerprint(Reader& in, const StateFingerprint& expected) {
  const uint32_t n = in.value<uint32_t>("fingerprint");
  StateFingerprint got;
  for (uint32_t i = 0; i < n; ++i) {
    std::string name = in.text("fingerprint field name");
    got.fields.emplace_back(std::move(name), in.text("fingerprint field value"));
  }
  auto find = [](const StateFingerprint& fp, const std::string& name) -> const std::string* {
    for (const auto& [k, v] : fp.fields)
      if (k == name) return &v;
    return nullptr;
  };
  std::string diffs;
  auto note = [&](const std::string& name, const std::string* file_value, const std::string* our_value) {
    diffs += fmt::format("{}{} {} in the file, {} here", diffs.empty() ? "" : "; ", name,
                         file_value ? *file_value : "absent", our_value ? *our_value : "absent");
  };
  for (const auto& [name, value] : expected.fields)
    if (const std::string* v = find(got, name); !v || *v != value) note(name, v, &value);
  for (const auto& [name, value] : got.fields)
    if (!find(expected, name)) note(name, &value, nullptr);
  if (!diffs.empty()) fail(ErrorCode::invalid_input, "saved for another model, numerics or state layout: {}", diffs);
}

LayerSnapshot read_layer(Reader& in, Backend& backend) {
  LayerSnapshot l;
  l.n_compressed = in.value<int64_t>("compressed row count");
  l.n_index_keys = in.value<int64_t>("indexer key count");
  if (l.n_compressed < 0 || l.n_index_keys < 0)
    fail(ErrorCode::invalid_input, "{} compressed rows and {} indexer keys", l.n_compressed, l.n_index_keys);
  for (const LayerBuffer& b : kLayerBuffers) (l.*b.member) = read_buffer(in, backend, b.name);
  return l;
}

// The MTP block's part (version 2 on): u8 present, then u32 n_rings and each ring, i64 n_past,
// the waiting tokens, and their rows.
void write_draft(Writer& out, const std::optional<DraftSnapshot>& draft, Backend& backend) {
  out.value(uint8_t(draft ? 1 : 0));
  if (!draft) return;
  out.value(uint32_t(draft->rings.size()));
  for (const Buffer& ring : draft->rings) write_buffer(out, ring, backend);
  out.value(int64_t(draft->n_past));
  write_tokens(out, draft->tokens);
  write_buffer(out, draft->hidden, backend);
}

std::optional<DraftSnapshot> read_draft(Reader& in, Backend& backend) {
  const uint8_t present = in.value<uint8_t>("MTP block flag");
  if (present > 1) fail(ErrorCode::invalid_input, "MTP block flag {}, expected 0 or 1", present);
  if (!present) return std::nullopt;
  DraftSnapshot d;
  const uint32_t n_rings = in.value<uint32_t>("MTP block count");
  for (uint32_t i = 0; i < n_rings; ++i) d.rings.push_back(read_buffer(in, backend, "MTP block ring"));
  d.n_past = in.value<int64_t>("MTP block position");
  d.tokens = read_tokens(in, "MTP block waiting tokens");
  d.hidden = read_buffer(in, backend, "MTP block waiting rows");
  return d;
}

SavedState read_state(const model::MappedFile& file, const StateFingerprint& expected, Backend& backend) {
  Reader in(file);
  if (file.size() < sizeof(kMagic) || std::memcmp(in.take(sizeof(kMagic), 1, "magic"), kMagic, sizeof(kMagic)) != 0)
    fail(ErrorCode::invalid_input, "not a dsv4 state file (no DSV4STAT magic)");
  const uint32_t version = in.value<uint32_t>("version");
  if (version < kOldestStateFileVersion || version > kStateFileVersion)
    fail(ErrorCode::invalid_input, "state file format version {}, this dsv4 reads versions {} to {}", version,
         kOldestStateFileVersion, kStateFileVersion);
  check_fingerprint(in, expected);

  SavedState saved;
  saved.tokens = read_tokens(in, "token");
  StateSnapshot& snap = saved.snapshot;
  snap.n_past = in.value<int64_t>("n_past");
  if (snap.n_past < 0 || uint64_t(snap.n_past) != saved.tokens.size())
    fail(ErrorCode::invalid_input, "the state is at position {} but covers {} tokens", snap.n_past,
         saved.tokens.size());

  const uint32_t n_layers = in.value<uint32_t>("layer count");
  for (uint32_t il = 0; il < n_layers; ++il) {
    try {
      snap.layers.push_back(read_layer(in, backend));
    } catch (const Error& e) {
      throw e.within(fmt::format("layer {}", il));
    }
  }
  if (version >= 2) snap.draft = read_draft(in, backend);  // version 1 files have no MTP block part

  Checksum checksum;
  checksum.add(file.data(), in.at());
  if (in.value<uint64_t>("checksum") != checksum.value())
    fail(ErrorCode::invalid_input, "checksum mismatch: the file is damaged");
  if (in.at() != file.size())
    fail(ErrorCode::invalid_input, "{} unexpected bytes after the state", file.size() - in.at());
  return saved;
}

}  // namespace

StateFingerprint state_fingerprint(const model::ModelConfig& c, const model::Weights& weights, Numerics numerics,
                                   StateLayout layout) {
  std::string ratios;
  for (int r : c.compress_ratios) ratios += fmt::format("{}{}", ratios.empty() ? "" : ",", r);
  const std::string yarn =
      c.yarn.enabled ? fmt::format("factor {}, original {}", c.yarn.factor, c.yarn.original_max_position) : "off";
  return {{
      {"numerics", to_string(numerics)},
      {"state layout", to_string(layout)},
      {"vocab_size", std::to_string(c.vocab_size)},
      {"hidden_size", std::to_string(c.hidden_size)},
      {"n_layers", std::to_string(c.n_layers)},
      {"n_heads", std::to_string(c.n_heads)},
      {"head_dim", std::to_string(c.head_dim)},
      {"rope_head_dim", std::to_string(c.rope_head_dim)},
      {"sliding_window", std::to_string(c.sliding_window)},
      {"compress_ratios", ratios},
      {"index_n_heads", std::to_string(c.index_n_heads)},
      {"index_head_dim", std::to_string(c.index_head_dim)},
      {"index_topk", std::to_string(c.index_topk)},
      {"hc_mult", std::to_string(c.hc_mult)},
      {"n_routed_experts", std::to_string(c.n_routed_experts)},
      {"rope_theta", fmt::format("{}", c.rope_theta)},
      {"compress_rope_theta", fmt::format("{}", c.compress_rope_theta)},
      {"yarn", yarn},
      {"weights sample", fmt::format("{:016x}", weights_sample_digest(weights))},
  }};
}

void save_state(const std::filesystem::path& path, const StateFingerprint& fingerprint, std::span<const int32_t> tokens,
                const StateSnapshot& snapshot, Backend& backend) {
  DSV4_CHECK(tokens.size() == size_t(snapshot.n_past), "{} tokens for a state at position {}", tokens.size(),
             snapshot.n_past);
  replace_file(path, [&](const std::filesystem::path& tmp) {
    Writer out(tmp);
    out.bytes(kMagic, sizeof(kMagic));
    out.value(kStateFileVersion);
    write_fingerprint(out, fingerprint);
    write_tokens(out, tokens);
    out.value(int64_t(snapshot.n_past));
    out.value(uint32_t(snapshot.layers.size()));
    for (const LayerSnapshot& l : snapshot.layers) {
      out.value(int64_t(l.n_compressed));
      out.value(int64_t(l.n_index_keys));
      for (const LayerBuffer& b : kLayerBuffers) write_buffer(out, l.*b.member, backend);
    }
    write_draft(out, snapshot.draft, backend);
    out.finish();
  });
}

SavedState load_state(const std::filesystem::path& path, const StateFingerprint& expected, Backend& backend) {
  const model::MappedFile file(path.string());  // its errors already name the file
  try {
    return read_state(file, expected, backend);
  } catch (const Error& e) {
    throw e.within(path.string());
  }
}

PrefixRestore restore_prefix(const std::filesystem::path& path, const StateFingerprint& fingerprint,
                             std::span<const int32_t> prompt, SequenceState& seq, Backend& backend) {
  const SavedState saved = load_state(path, fingerprint, backend);
  PrefixRestore r{int64_t(saved.tokens.size()), false};
  if (saved.tokens.size() >= prompt.size() || !std::equal(saved.tokens.begin(), saved.tokens.end(), prompt.begin()))
    return r;
  try {
    seq.restore(saved.snapshot);
  } catch (const Error& e) {
    throw e.within(path.string());
  }
  r.restored = true;
  return r;
}

}  // namespace dsv4::engine
