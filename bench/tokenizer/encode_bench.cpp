// Single-thread encode throughput of dsv4::tokenizer on a corpus (one JSON string, or a
// [text, ...] row, per line). Prints one JSON object: bytes, tokens, best and median seconds
// over the repetitions, MB/s. run.py compares it with HF `tokenizers` on the same corpus.
//   bench_tokenizer TOKENIZER_JSON CORPUS_JSONL [repetitions=7]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: bench_tokenizer TOKENIZER_JSON CORPUS_JSONL [repetitions]\n");
    return 2;
  }
  auto tok = dsv4::tokenizer::Tokenizer::load(argv[1]);
  int repetitions = argc > 3 ? std::atoi(argv[3]) : 7;
  std::vector<std::string> texts;
  std::ifstream in(argv[2]);
  std::string line;
  size_t bytes = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto row = nlohmann::json::parse(line);
    texts.push_back(row.is_array() ? row[0].get<std::string>() : row.get<std::string>());
    bytes += texts.back().size();
  }
  size_t tokens = 0;
  for (const auto& t : texts) tokens += tok.encode(t).size();  // warm-up (and the token count)
  std::vector<double> seconds;
  for (int r = 0; r < repetitions; ++r) {
    auto start = std::chrono::steady_clock::now();
    size_t n = 0;
    for (const auto& t : texts) n += tok.encode(t).size();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (n != tokens) return 1;
  }
  std::sort(seconds.begin(), seconds.end());
  fmt::print("{{\"strings\": {}, \"bytes\": {}, \"tokens\": {}, \"best_s\": {:.4f}, \"median_s\": {:.4f}, "
             "\"mb_per_s\": {:.2f}}}\n",
             texts.size(), bytes, tokens, seconds.front(), seconds[seconds.size() / 2],
             bytes / seconds[seconds.size() / 2] / 1e6);
}
