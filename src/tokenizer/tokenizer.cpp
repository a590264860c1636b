// Loading tokenizer.json and the encode/decode entry points (tokenizer-and-chat.md §2).
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {

using nlohmann::json;

struct Tokenizer::Impl {
  BpeMerges merges;
  AddedTokenMatcher added;
  std::unordered_map<std::string, int32_t> ids;  // spelling → id (vocab and added tokens)
  std::vector<std::string> spellings;              // id → spelling
  std::vector<std::string> bytes;                  // id → decoded bytes
  std::vector<uint8_t> special, added_flag;
};

namespace {

// GPT-2's byte → code point alphabet: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100.. in byte order (§2.4).
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    map[b] = printable ? b : next++;
  }
  return map;
}

// The bytes a token spelling decodes to: HF's ByteLevel decoder maps every character back to its
// byte if all characters are in the alphabet, else keeps the spelling's own UTF-8.
std::string spelling_to_bytes(const std::string& spelling, const std::unordered_map<uint32_t, uint8_t>& inverse) {
  std::string out;
  std::string_view s = spelling;
  for (size_t i = 0; i < s.size();) {
    if (valid_sequence_length(s, i) == 0) return spelling;
    auto it = inverse.find(decode_code_point(s, i));
    if (it == inverse.end()) return spelling;
    out += char(it->second);
  }
  return out;
}

const json& field(const json& object, const char* name, const std::string& where) {
  if (!object.is_object() || !object.contains(name))
    fail(ErrorCode::invalid_input, "{}: missing field \"{}\"", where, name);
  return object[name];
}

std::string dump(const json& j) {
  std::string s = j.dump();
  return s.size() > 200 ? s.substr(0, 200) + "…" : s;
}

// The engine implements exactly DeepSeek's pipeline, so any other one is refused at load.
void check_pipeline(const json& root, const std::string& where) {
  const json& normalizer = root.value("normalizer", json());
  bool no_normalizer = normalizer.is_null() ||
                       (normalizer.value("type", "") == "Sequence" &&
                        normalizer.value("normalizers", json::array()).empty());
  if (!no_normalizer)
    fail(ErrorCode::unsupported, "{}: normalizer: got {}, expected none (§2.2)", where, dump(normalizer));

  const json& pre = field(root, "pre_tokenizer", where);
  const std::string_view patterns[] = {kSplitPatternNumbers, kSplitPatternCjk, kSplitPatternWords};
  bool ok = pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
            pre["pretokenizers"].size() == 4;
  for (size_t i = 0; ok && i < 3; ++i) {
    const json& split = pre["pretokenizers"][i];
    ok = split.value("type", "") == "Split" && split.value("behavior", "") == "Isolated" &&
         !split.value("invert", false) && split.contains("pattern") &&
         split["pattern"].value("Regex", "") == patterns[i];
  }
  if (ok) {
    const json& byte_level = pre["pretokenizers"][3];
    ok = byte_level.value("type", "") == "ByteLevel" && !byte_level.value("add_prefix_space", true) &&
         !byte_level.value("use_regex", true);
  }
  if (!ok)
    fail(ErrorCode::unsupported,
         "{}: pre_tokenizer: got {}, expected the DeepSeek V3/V4 three-split sequence (§2.2)", where,
         dump(pre));

  const json& model = field(root, "model", where);
  if (model.value("type", "") != "BPE" || model.value("byte_fallback", false) ||
      !model.value("continuing_subword_prefix", json()).is_null() ||
      !model.value("end_of_word_suffix", json()).is_null() || model.value("ignore_merges", false))
    fail(ErrorCode::unsupported, "{}: model: expected a plain byte-level BPE (§2.1)", where);
  const json& decoder = root.value("decoder", json());
  if (decoder.value("type", "") != "ByteLevel")
    fail(ErrorCode::unsupported, "{}: decoder: got {}, expected ByteLevel (§2.7)", where, dump(decoder));
}

std::pair<std::string, std::string> split_merge(const json& merge, const std::string& where) {
  if (merge.is_string()) {
    const std::string& s = merge.get_ref<const std::string&>();
    size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
      fail(ErrorCode::invalid_input, "{}: merge \"{}\" is not \"left right\"", where, s);
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  fail(ErrorCode::invalid_input, "{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", where, dump(merge));
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::not_found, "{}: cannot open tokenizer file", path);
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& where) {
  json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded()) fail(ErrorCode::invalid_input, "{}: not valid JSON", where);
  check_pipeline(root, where);
  auto impl = std::make_shared<Impl>();

  // Vocabulary.
  const json& model = root["model"];
  const json& vocab = field(model, "vocab", where + ": model");
  int32_t max_id = -1;
  for (auto& [spelling, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24))
      fail(ErrorCode::invalid_input, "{}: model.vocab[\"{}\"]: bad id {}", where, spelling, dump(id));
    impl->ids[spelling] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  const json& added = root.value("added_tokens", json::array());
  for (const json& token : added) {
    int64_t id = field(token, "id", where + ": added_tokens").get<int64_t>();
    if (id < 0 || id > (1 << 24)) fail(ErrorCode::invalid_input, "{}: added token id {}", where, id);
    max_id = std::max(max_id, int32_t(id));
  }
  impl->spellings.resize(max_id + 1);
  impl->special.assign(max_id + 1, 0);
  impl->added_flag.assign(max_id + 1, 0);
  for (auto& [spelling, id] : impl->ids) impl->spellings[id] = spelling;

  // Added tokens: they win over a vocab entry with the same id (HF keeps both spellings).
  for (const json& token : added) {
    std::string where_token = where + ": added_tokens[" + std::to_string(token.value("id", -1)) + "]";
    const std::string& content = field(token, "content", where_token).get_ref<const std::string&>();
    int32_t id = token["id"].get<int32_t>();
    if (content.empty() || !is_valid_utf8(content))
      fail(ErrorCode::invalid_input, "{}: content must be non-empty UTF-8", where_token);
    if (token.value("lstrip", false) || token.value("rstrip", false) || token.value("single_word", false))
      fail(ErrorCode::unsupported, "{}: lstrip/rstrip/single_word are not supported", where_token);
    impl->spellings[id] = content;
    impl->ids[content] = id;
    impl->special[id] = token.value("special", false);
    impl->added_flag[id] = 1;
    impl->added.add(content, id, token.value("normalized", false));
  }

  // Byte alphabet and merges.
  auto alphabet = byte_to_code_point();
  std::unordered_map<uint32_t, uint8_t> inverse;
  std::array<int32_t, 256> byte_ids{};
  for (uint32_t b = 0; b < 256; ++b) {
    std::string spelling;
    append_code_point(spelling, alphabet[b]);
    auto it = impl->ids.find(spelling);
    if (it == impl->ids.end())
      fail(ErrorCode::unsupported, "{}: model.vocab: byte 0x{:02X} (\"{}\") is missing; byte-level BPE "
           "needs all 256 (§2.4)", where, b, spelling);
    byte_ids[b] = it->second;
    inverse[alphabet[b]] = uint8_t(b);
  }
  impl->merges.set_byte_ids(byte_ids);
  const json& merges = field(model, "merges", where + ": model");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string where_merge = where + ": model.merges[" + std::to_string(rank) + "]";
    auto [left, right] = split_merge(merges[rank], where_merge);
    auto l = impl->ids.find(left), r = impl->ids.find(right), m = impl->ids.find(left + right);
    if (l == impl->ids.end() || r == impl->ids.end() || m == impl->ids.end())
      fail(ErrorCode::invalid_input, "{}: \"{} {}\": a part or the result is not in the vocab", where_merge,
           left, right);
    impl->merges.add(l->second, r->second, m->second);  // a repeated pair keeps its first rank, as HF
  }

  impl->bytes.resize(impl->spellings.size());
  for (size_t id = 0; id < impl->spellings.size(); ++id)
    impl->bytes[id] = spelling_to_bytes(impl->spellings[id], inverse);
  return Tokenizer(std::move(impl));
}

void Tokenizer::encode_text(std::string_view text, uint32_t begin, uint32_t end,
                            std::vector<int32_t>& out) const {
  thread_local std::vector<Piece> pieces;
  pieces.clear();
  std::string_view stretch = text.substr(begin, end - begin);
  pretokenize(stretch, pieces);
  for (Piece p : pieces) impl_->merges.encode(stretch.substr(p.begin, p.end - p.begin), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string replaced;
  if (!is_valid_utf8(text)) {
    replaced = to_valid_utf8(text);
    text = replaced;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (!parse_special || impl_->added.empty()) {
    encode_text(text, 0, uint32_t(text.size()), ids);
    return ids;
  }
  std::vector<Segment> segments;
  impl_->added.split(text, 0, uint32_t(text.size()), segments);
  for (const Segment& s : segments) {
    if (s.id >= 0)
      ids.push_back(s.id);
    else
      encode_text(text, s.begin, s.end, ids);
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_control_ranges(std::string_view text,
                                                           std::span<const TextRange> control_ranges) const {
  if (!is_valid_utf8(text))
    fail(ErrorCode::invalid_input, "encode_with_control_ranges: text is not valid UTF-8");
  std::vector<Segment> tokens;  // the recognised control tokens, in order
  size_t last_end = 0;
  for (TextRange r : control_ranges) {
    if (r.begin < last_end || r.end < r.begin || r.end > text.size())
      fail(ErrorCode::invalid_input, "encode_with_control_ranges: range [{}, {}) is out of order or "
           "past the text ({} bytes)", r.begin, r.end, text.size());
    last_end = r.end;
    std::vector<Segment> segments;
    impl_->added.split(text, uint32_t(r.begin), uint32_t(r.end), segments);
    for (const Segment& s : segments)
      if (s.id >= 0) tokens.push_back(s);
  }
  std::vector<int32_t> ids;
  uint32_t pos = 0;
  for (const Segment& t : tokens) {
    if (pos < t.begin) encode_text(text, pos, t.begin, ids);
    ids.push_back(t.id);
    pos = t.end;
  }
  if (pos < text.size()) encode_text(text, pos, uint32_t(text.size()), ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      fail(ErrorCode::invalid_input, "decode: id {} is outside the vocabulary [0, {})", id, vocab_size());
    if (skip_special && impl_->special[id]) continue;
    raw += impl_->bytes[id];
  }
  return is_valid_utf8(raw) ? raw : to_valid_utf8(raw);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return id >= 0 && id < vocab_size() ? std::string_view(impl_->bytes[id]) : std::string_view();
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  return id >= 0 && id < vocab_size() ? std::string_view(impl_->spellings[id]) : std::string_view();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->ids.find(std::string(token));
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->added_flag[id];
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->spellings.size()); }

std::string StreamDecoder::push(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size())
    fail(ErrorCode::invalid_input, "decode: id {} is outside the vocabulary [0, {})", id,
         tokenizer_->vocab_size());
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  // Everything but a tail that may still complete a character is final: invalid bytes become
  // U+FFFD now, exactly as decoding the whole sequence would replace them.
  size_t keep = incomplete_tail_length(pending_);
  std::string out = to_valid_utf8(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4::tokenizer
