#include "cli/resumable_prefill.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/error.h"
#include "core/replace_file.h"

namespace dsv4::cli {
namespace {

// Pieces of this many chunks run between two looks at the clock: a few seconds each on a GPU.
constexpr int64_t kChunksPerPiece = 4;

std::filesystem::path progress_path(const std::filesystem::path& file) { return file.string() + ".progress"; }

struct Progress {
  double seconds = 0;
  int64_t runs = 0;
};

Progress read_progress(const std::filesystem::path& file) {
  const std::filesystem::path path = progress_path(file);
  std::ifstream in(path);
  if (!in) fail(ErrorCode::invalid_input, "{}: missing beside its state file {}", path.string(), file.string());
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    return {j.at("seconds").get<double>(), j.at("runs").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::invalid_input, "{}: not a prefill progress file ({})", path.string(), e.what());
  }
}

// Replaced whole, as the state file is: a crash leaves the old one.
void write_progress(const std::filesystem::path& file, const Progress& p) {
  const std::filesystem::path path = progress_path(file);
  replace_file(path, [&](const std::filesystem::path& tmp) {
    std::ofstream out(tmp);
    out << nlohmann::json{{"seconds", p.seconds}, {"runs", p.runs}}.dump() << "\n";
    if (!out.flush()) fail(ErrorCode::invalid_input, "{}: cannot write", tmp.string());
  });
}

}  // namespace

PrefillOutcome prefill_resumable(engine::Engine& eng, engine::SequenceState& seq, std::span<const int32_t> prompt,
                                 const ResumablePrefill& r) {
  Backend& backend = eng.backend();
  PrefillOutcome out;
  Progress before;
  if (std::filesystem::exists(r.file)) {
    const engine::PrefixRestore restored = engine::restore_prefix(r.file, r.fingerprint, prompt, seq, backend);
    if (!restored.restored)
      fail(ErrorCode::invalid_input,
           "{}: its {} tokens are not a strict prefix of this prompt of {} (another --seed or prompt length?)",
           r.file.string(), restored.file_tokens, prompt.size());
    before = read_progress(r.file);
    out.done = restored.file_tokens;
    fmt::print(stderr, "resume {}: {} of {} prompt tokens done in {} runs, {:.1f} s\n", r.file.string(), out.done,
               prompt.size(), before.runs, before.seconds);
  }
  out.runs = before.runs + 1;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t piece = std::max<int64_t>(1, r.chunk) * kChunksPerPiece, n = int64_t(prompt.size());
  std::vector<float> logits;
  while (out.done < n) {
    const int64_t m = std::min(piece, n - out.done);
    logits = eng.prefill(seq, prompt.subspan(size_t(out.done), size_t(m)), r.chunk, false);
    out.done += m;
    const double run_s = seconds_since(t0);
    fmt::print(stderr, "prefill {} / {} tokens, {:.1f} s\n", out.done, n, before.seconds + run_s);
    if (out.done < n && r.time_limit_s > 0 && run_s >= r.time_limit_s) {
      const double prefill_s = before.seconds + run_s;
      engine::save_state(r.file, r.fingerprint, prompt.first(size_t(out.done)), seq.snapshot(), backend);
      write_progress(r.file, {prefill_s, out.runs});
      fmt::print(stderr, "resume {}: paused after {} of {} tokens (the time limit); run again to go on\n",
                 r.file.string(), out.done, n);
      out.seconds = prefill_s;
      return out;
    }
  }
  out.seconds = before.seconds + seconds_since(t0);
  out.logits = std::move(logits);
  std::error_code ignored;  // the prompt is done: nothing is left to resume
  std::filesystem::remove(r.file, ignored);
  std::filesystem::remove(progress_path(r.file), ignored);
  return out;
}

}  // namespace dsv4::cli
