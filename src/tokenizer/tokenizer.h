// dsv4::tokenizer::Tokenizer: text ↔ ids for DeepSeek V4, identical to HF `tokenizers` loading
// the model's tokenizer.json (tokenizer-and-chat.md §2).
//
// encode: added-token split (added_tokens.h) → pre-tokenizer (pretokenize.h) → byte-level BPE
// (bpe.h). No BOS/EOS is ever added: BOS is part of the rendered prompt. decode: each id's bytes
// (the byte-level alphabet mapped back; added tokens as their UTF-8 text), then UTF-8 with U+FFFD
// for invalid sequences (utf8.h), like HF's ByteLevel decoder.
//
// Invalid UTF-8 input to encode is defined as: every invalid subpart is replaced by U+FFFD
// first (the maximal-subpart rule of Python's bytes.decode("utf-8", "replace")), so the ids are
// those of the replaced text and decode(encode(x)) == to_valid_utf8(x).
//
// A Tokenizer is immutable after load; all const methods are safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::tokenizer {

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin, end;
};

class Tokenizer {
 public:
  // Reads an HF tokenizer.json; throws dsv4::Error (not_found, invalid_input, unsupported) that
  // names the file and the field when the file is not a DeepSeek V3/V4 byte-level BPE.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json_text(std::string_view json_text, const std::string& source_name);

  // parse_special: whether added-token strings in text become their ids (HF behaviour) or stay
  // plain text encoded by BPE (for untrusted text: "<think>" is then just characters).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Encodes text in which added-token strings are recognised only inside `control_ranges`
  // (sorted, disjoint); elsewhere they are plain text. Text between two recognised tokens is
  // encoded in one pass, as HF would, so the result equals encode(text) whenever the text outside
  // the ranges holds no added-token string. Used by the prompt renderer (chat_format.h).
  std::vector<int32_t> encode_with_control_ranges(std::string_view text,
                                                  std::span<const TextRange> control_ranges) const;

  // skip_special drops tokens flagged "special" in tokenizer.json (BOS, EOS, pad, …), as HF's
  // skip_special_tokens does. Throws invalid_input for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes of one id (may be part of a UTF-8 sequence); empty for an unknown id.
  std::string_view token_bytes(int32_t id) const;
  // The token's spelling in tokenizer.json (byte-level alphabet for BPE tokens).
  std::string_view id_to_token(int32_t id) const;
  // Id of a token spelling (vocab or added token), as in tokenizer.json.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  bool is_special(int32_t id) const;  // flagged special (skipped by skip_special)
  bool is_added(int32_t id) const;    // an added token (control token or placeholder)
  // One past the largest id: 129,280 for V4.
  int32_t vocab_size() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  void encode_text(std::string_view text, uint32_t begin, uint32_t end,
                   std::vector<int32_t>& out) const;
  std::shared_ptr<const Impl> impl_;
};

// Incremental decoding for streaming output: push ids one at a time and get back only complete
// UTF-8 characters, never a broken sequence. Bytes that may still become a character are held
// until the next id or finish(). The concatenation of all returned strings equals
// tokenizer.decode(all ids, skip_special).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  // Flushes held bytes (an unfinished sequence becomes U+FFFD) and resets the decoder.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4::tokenizer
