// Shared by the fuzz targets: the V4 tokenizer from DSV4_TOKENIZER_JSON (fuzz/run.sh sets it),
// and a crash helper that names the broken property.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "tokenizer/tokenizer.h"

namespace dsv4::fuzz {

inline const tokenizer::Tokenizer* v4_tokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = []() -> std::unique_ptr<tokenizer::Tokenizer> {
    const char* path = std::getenv("DSV4_TOKENIZER_JSON");
    if (!path || !*path) return nullptr;
    return std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(path));
  }();
  return tok.get();
}

// A fuzz target reports a broken property by aborting, which libFuzzer records as a crash.
[[noreturn]] inline void broken(const char* property) {
  std::fprintf(stderr, "property broken: %s\n", property);
  std::abort();
}

}  // namespace dsv4::fuzz
