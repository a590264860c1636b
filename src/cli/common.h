// Helpers shared by the CLI subcommands: model options, token lists, timing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/command.h"

namespace dsv4::cli {

// The folder of the bundled default model (tiny random weights; see README).
std::string default_model_dir();

// The demo chat model made at build time (the real vocabulary, random weights; see README).
std::string default_chat_model_dir();

// `explicit_path` if given, else MODEL_DIR/tokenizer.json, else the V4 tokenizer that
// scripts/setup fetches for the tests.
std::string find_tokenizer(const std::string& model_dir, const std::string& explicit_path);

// The --state-layout option: "compact" or "f32", or empty for the numerics' default.
StateLayout state_layout_option(const std::string& option, Numerics numerics);

// The largest prefill chunk a device takes by default (the memory plan may choose less): on CUDA,
// chunks of many rows run their products on the FP64 tensor cores (gemm_dmma.cu).
int64_t default_chunk(const std::string& device);
// The --chunk option's help, with default_chunk's figures.
std::string chunk_help();
inline const char* kStateLayoutHelp = "compact | f32 (default: compact in deepseek numerics, f32 in plain)";

// Parses "1, 2 3" or a JSON array "[1,2,3]" into token ids; errors name the bad entry.
std::vector<int32_t> parse_token_list(const std::string& text);
// Reads {"tokens": [...]} from a JSON file.
std::vector<int32_t> read_tokens_json(const std::string& path);

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dsv4::cli
