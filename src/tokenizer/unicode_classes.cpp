// Expands the run-length class data of unicode_table.cpp into a flat table, once.
#include <memory>

#include "tokenizer/unicode_table.h"

namespace dsv4::tokenizer {

namespace {

constexpr uint32_t kCodePoints = 0x110000;

const uint8_t* flat_table() {
  // Built once (thread-safe static init); 1.1 MiB keeps the per-character lookup a single load.
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(kCodePoints);
    for (size_t i = 0; i < kCharClassRunCount; ++i) {
      uint32_t first = kCharClassRuns[i] >> 3;
      uint32_t end = i + 1 < kCharClassRunCount ? kCharClassRuns[i + 1] >> 3 : kCodePoints;
      uint8_t cls = kCharClassRuns[i] & 7;
      for (uint32_t cp = first; cp < end; ++cp) t[cp] = cls;
    }
    return t;
  }();
  return table.get();
}

}  // namespace

CharClass char_class(uint32_t cp) {
  static const uint8_t* table = flat_table();
  return cp < kCodePoints ? CharClass(table[cp]) : CharClass::other;
}

}  // namespace dsv4::tokenizer
