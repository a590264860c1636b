#include "cli/common.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

#ifndef DSV4_CHAT_MODEL
#define DSV4_CHAT_MODEL "build/models/tiny-chat"
#endif
#ifndef DSV4_SOURCE_DIR
#define DSV4_SOURCE_DIR "."
#endif
#ifndef DSV4_DEFAULT_MODEL
#define DSV4_DEFAULT_MODEL "tests/fixtures/models/tiny-flash"
#endif

namespace dsv4::cli {

std::string default_model_dir() { return DSV4_DEFAULT_MODEL; }

StateLayout state_layout_option(const std::string& option, Numerics numerics) {
  if (option.empty()) return quantizes(numerics) ? StateLayout::compact : StateLayout::f32;
  return parse_state_layout(option);
}

// On an H200 (4 synthetic V4-Flash layers, deepseek-tc) 8192-token chunks against 2048: 4K prompt
// 27 672 → 33 467 tok/s, 8K 52 607 → 54 652, 1M 27 076 → 28 835 (larger products, fewer launches).
int64_t default_chunk(const std::string& device) { return device == "cuda" ? 8192 : 512; }

std::string chunk_help() {
  return "prefill chunk in tokens (default: the largest the memory plan allows, at most " +
         std::to_string(default_chunk("cuda")) + " on cuda, " + std::to_string(default_chunk("cpu")) + " on cpu)";
}

std::string default_chat_model_dir() { return DSV4_CHAT_MODEL; }

std::string find_tokenizer(const std::string& model_dir, const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  for (const std::string& p : {model_dir + "/tokenizer.json",
                               std::string(DSV4_SOURCE_DIR) + "/tests/fixtures/tokenizer/deepseek-v4-tokenizer.json"})
    if (std::filesystem::exists(p)) return p;
  fail(ErrorCode::not_found, "{}: no tokenizer.json; pass --tokenizer FILE (scripts/setup fetches the V4 one)", model_dir);
}

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::string cleaned = text;
  for (char& ch : cleaned)
    if (ch == ',' || ch == '[' || ch == ']') ch = ' ';
  std::istringstream in(cleaned);
  std::string item;
  while (in >> item) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      fail(ErrorCode::invalid_input, "token list: '{}' is not a token id", item);
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) fail(ErrorCode::invalid_input, "token list: no token ids");
  return ids;
}

std::vector<int32_t> read_tokens_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorCode::not_found, "{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorCode::invalid_input, "{}: malformed JSON: {}", path, e.what());
  }
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    fail(ErrorCode::invalid_input, "{}: expected {{\"tokens\": [...]}}", path);
  std::vector<int32_t> ids;
  for (const auto& v : j["tokens"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(ErrorCode::invalid_input, "{}: tokens[{}] = {} is not a token id", path, ids.size(), v.dump());
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  if (ids.empty()) fail(ErrorCode::invalid_input, "{}: no tokens", path);
  return ids;
}

}  // namespace dsv4::cli
