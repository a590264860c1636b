// A prefill spread over several runs of a program, for prompts whose prefill takes longer than
// one run may last (dsv4 bench --resume: a 1M-token prompt on a device lent by the command).
//
// The state after the tokens done so far lives in a state file (engine/state_file.h) and the
// prefill seconds spent on them in a small JSON file beside it (FILE.progress). A run restores
// both, prefills in pieces, and once it has prefilled for its time limit saves both and stops;
// the run that finishes the prompt removes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/state_file.h"

namespace dsv4::cli {

struct ResumablePrefill {
  std::filesystem::path file;
  engine::StateFingerprint fingerprint;
  int64_t chunk = 0;          // the engine's prefill chunk
  double time_limit_s = 0;    // pause after this many seconds of this run (0: never)
};

struct PrefillOutcome {
  std::optional<std::vector<float>> logits;  // the last token's; none when the run paused
  double seconds = 0;                        // prefill time of every run so far
  int64_t runs = 0;                          // runs so far, this one included
  int64_t done = 0;                          // prompt tokens prefilled so far
};

// Prefills `prompt` into `seq` (a new sequence), resuming from r.file when it is there. A file
// that does not hold a prefix of `prompt`, for this model and numerics, is an error naming it.
PrefillOutcome prefill_resumable(engine::Engine& eng, engine::SequenceState& seq, std::span<const int32_t> prompt,
                                 const ResumablePrefill& r);

}  // namespace dsv4::cli
