// `dsv4 tokenize`: text → ids with the model's tokenizer (issue 3 §5).
//   dsv4 tokenize --tokenizer FILE < text          prints the ids of all of stdin as a JSON array
//   dsv4 tokenize --model DIR --jsonl < lines      each line a JSON string → a JSON array of ids
// --plain encodes control-token strings as ordinary text (parse_special = false).
#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer_file, model_dir;
  bool jsonl = false, plain = false;
};

tokenizer::Tokenizer load_tokenizer(const std::string& file, const std::string& model_dir) {
  if (file.empty() && model_dir.empty()) fail(ErrorCode::invalid_input, "give --tokenizer FILE or --model DIR");
  return tokenizer::Tokenizer::load(file.empty() ? model_dir + "/tokenizer.json" : file);
}

int run_tokenize(const TokenizeOptions& o) {
  auto tok = load_tokenizer(o.tokenizer_file, o.model_dir);
  std::ios::sync_with_stdio(false);
  if (!o.jsonl) {
    std::string text(std::istreambuf_iterator<char>(std::cin), {});
    fmt::print("[{}]\n", fmt::join(tok.encode(text, !o.plain), ", "));
    return 0;
  }
  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    if (line.empty()) continue;
    auto value = nlohmann::json::parse(line, nullptr, false);
    if (!value.is_string()) fail(ErrorCode::invalid_input, "stdin line {}: expected a JSON string", n);
    std::string out = fmt::format("[{}]\n", fmt::join(tok.encode(value.get<std::string>(), !o.plain), ","));
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

const bool tokenize_registered = register_command({
    "tokenize", "Encode stdin to token ids",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<TokenizeOptions>();
      app.add_option("--tokenizer", o->tokenizer_file, "tokenizer.json to use");
      app.add_option("--model", o->model_dir, "model folder holding tokenizer.json");
      app.add_flag("--jsonl", o->jsonl, "each input line is a JSON string; print one JSON array per line");
      app.add_flag("--plain", o->plain, "control-token strings stay plain text (no added-token matching)");
      return [o] { return run_tokenize(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
