// `dsv4 detokenize`: ids → text (issue 3 §5).
//   dsv4 detokenize --tokenizer FILE < ids          ids as a JSON array or separated by spaces/commas;
//                                                   prints the text as is
//   dsv4 detokenize --model DIR --jsonl < arrays    each line a JSON array → a JSON string per line
// --skip-special drops tokens flagged special (BOS, EOS, …). Invalid UTF-8 becomes U+FFFD.
#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {
namespace {

struct DetokenizeOptions {
  std::string tokenizer_file, model_dir;
  bool jsonl = false, skip_special = false;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string number;
  auto flush = [&] {
    if (number.empty()) return;
    if (number.size() > 9) fail(ErrorCode::invalid_input, "id {} is too large", number);
    ids.push_back(std::stoi(number));
    number.clear();
  };
  for (char c : text) {
    if (c >= '0' && c <= '9')
      number += c;
    else if (c == '-' && number.empty())
      fail(ErrorCode::invalid_input, "negative ids are not valid");
    else if (c == ' ' || c == ',' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']')
      flush();
    else
      fail(ErrorCode::invalid_input, "unexpected character '{}' in the id list", c);
  }
  flush();
  return ids;
}

int run_detokenize(const DetokenizeOptions& o) {
  if (o.tokenizer_file.empty() && o.model_dir.empty())
    fail(ErrorCode::invalid_input, "give --tokenizer FILE or --model DIR");
  auto tok = tokenizer::Tokenizer::load(o.tokenizer_file.empty() ? o.model_dir + "/tokenizer.json"
                                                                   : o.tokenizer_file);
  std::ios::sync_with_stdio(false);
  if (!o.jsonl) {
    std::string text = tok.decode(parse_ids(std::string(std::istreambuf_iterator<char>(std::cin), {})),
                                  o.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    if (line.empty()) continue;
    auto value = nlohmann::json::parse(line, nullptr, false);
    if (!value.is_array()) fail(ErrorCode::invalid_input, "stdin line {}: expected a JSON array of ids", n);
    std::vector<int32_t> ids;
    for (const auto& id : value) {
      if (!id.is_number_integer()) fail(ErrorCode::invalid_input, "stdin line {}: ids must be integers", n);
      ids.push_back(id.get<int32_t>());
    }
    std::string out = nlohmann::json(tok.decode(ids, o.skip_special)).dump() + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

const bool detokenize_registered = register_command({
    "detokenize", "Decode token ids from stdin to text",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<DetokenizeOptions>();
      app.add_option("--tokenizer", o->tokenizer_file, "tokenizer.json to use");
      app.add_option("--model", o->model_dir, "model folder holding tokenizer.json");
      app.add_flag("--jsonl", o->jsonl, "each input line is a JSON array of ids; print one JSON string per line");
      app.add_flag("--skip-special", o->skip_special, "drop tokens flagged special (BOS, EOS, pad)");
      return [o] { return run_detokenize(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
