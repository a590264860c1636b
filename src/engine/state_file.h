// State files: a sequence's state (a StateSnapshot) saved to disk and loaded back, for prefix
// reuse across runs (`dsv4 generate --prompt-cache`) and for preemption (issue 6).
//
// Format (little-endian), version kStateFileVersion:
//   "DSV4STAT"  u32 version
//   u32 n_fields, then per field: str name, str value         the fingerprint (StateFingerprint)
//   u64 n_tokens, i32 tokens[n_tokens]                        the tokens the state covers
//   i64 n_past (= n_tokens)
//   u32 n_layers, then per layer: i64 n_compressed, i64 n_index_keys, and each buffer of
//       LayerSnapshot in a fixed order as u64 n_floats, f32 data[n_floats]
//   (version 2 on) u8 has_draft; when 1, the MTP block's DraftSnapshot: u32 n_rings and each ring
//       (as a buffer above), i64 n_past, u64 n_waiting, i32 tokens[n_waiting], the waiting rows
//   u64 checksum of every byte before it
// (str: u32 length, bytes.) Buffers are stored with their float counts, not a row width, so the
// format does not depend on how a row is laid out; SequenceState::restore checks that they fit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/state.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsv4::engine {

constexpr uint32_t kStateFileVersion = 2;        // written
constexpr uint32_t kOldestStateFileVersion = 1;  // still read: version 1 has no MTP block part

// What a state file must match to be loaded: the numerics, the state layout (how compressed rows
// are stored), the config fields that shape the model and its state, and a digest of a sample of
// the weights (embedding and head rows, every norm and sink), which tells apart two checkpoints of
// the same shapes. Each field is a name and its value as text, so a refusal can say which differs.
struct StateFingerprint {
  std::vector<std::pair<std::string, std::string>> fields;
};
StateFingerprint state_fingerprint(const model::ModelConfig& config, const model::Weights& weights, Numerics numerics,
                                   StateLayout layout);

// A state as saved: the tokens that produced it (tokens.size() == snapshot.n_past), so a caller
// can check that a new prompt extends them.
struct SavedState {
  std::vector<int32_t> tokens;
  StateSnapshot snapshot;
};

// Writes `snapshot` (backend memory) reached by running exactly `tokens`. The file is written
// next to `path` under a temporary name, flushed to disk, then renamed over `path`: a crash
// leaves either the old file or the new one, never half of one.
void save_state(const std::filesystem::path& path, const StateFingerprint& fingerprint, std::span<const int32_t> tokens,
                const StateSnapshot& snapshot, Backend& backend);

// Reads a state file into backend memory. Every error names the file and what is wrong: not a
// state file, another format version, another model, numerics or state layout (each differing field),
// truncated, damaged (checksum), or inconsistent counts.
SavedState load_state(const std::filesystem::path& path, const StateFingerprint& expected, Backend& backend);

// What restore_prefix found in a state file: how many tokens it covers, and whether they were a
// strict prefix of the prompt, in which case the sequence now holds that state.
struct PrefixRestore {
  int64_t file_tokens = 0;
  bool restored = false;
};

// Restores `seq` from the state file at `path` when its tokens are a strict prefix of `prompt` (at
// least the prompt's last token is left to run); a file holding anything else is left alone for
// the caller to judge. Errors (a damaged file, another model, a state that does not fit `seq`)
// name the file.
PrefixRestore restore_prefix(const std::filesystem::path& path, const StateFingerprint& fingerprint,
                             std::span<const int32_t> prompt, SequenceState& seq, Backend& backend);

}  // namespace dsv4::engine
