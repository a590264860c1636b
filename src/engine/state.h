// Per-sequence decode state, sized by what is kept, never by the maximum context (architecture.md §4.2).
//
//   every layer:      the sliding-window ring, window × head_dim (slot = position mod window)
//   CSA and HCA:      compressed KV rows (one per `ratio` tokens), grown as they are emitted,
//                     and the main compressor's fp32 carry
//   CSA:              the indexer's compressed keys and its compressor's fp32 carry
// Rows are stored after norm, rope and the FP8 (or Hadamard + FP4) simulation, so attention reads
// them as they are. Compressed rows and indexer keys are kept in the sequence's StateLayout
// (core/row_format.h): compact (584 B and 68 B per row at V4 shapes, exact in deepseek numerics)
// or f32; the ring and the carries are fp32 (fixed size).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsv4::engine {

// Rows appended over time, stored in one RowFormat; capacity doubles, so appends are amortised
// O(1).
class RowStore {
 public:
  RowStore() = default;
  RowStore(Backend& backend, RowFormat format) : backend_(&backend), format_(format) {}
  // Appends n fp32 rows (converted to the stored format).
  void append(const float* rows, int64_t n);
  // Appends n rows already in the stored format.
  void append_stored(const float* stored, int64_t n);
  // Makes room for `rows` rows, so that appends up to there allocate nothing.
  void reserve(int64_t rows) { grow_to(rows); }
  // Grows to n rows by repeating the rows held so far cyclically (at least one).
  void repeat_to(int64_t n);
  void clear() { n_ = 0; }
  // Drops the rows after the first n.
  void truncate(int64_t n) { n_ = n < n_ ? n : n_; }
  const float* data() const { return buffer_.get(); }
  int64_t rows() const { return n_; }
  const RowFormat& format() const { return format_; }
  size_t stored_floats() const { return size_t(n_ * format_.stride); }
  size_t bytes_reserved() const { return buffer_.size() * sizeof(float); }

 private:
  float* grow_to(int64_t rows);  // where row n_ goes, with room for `rows` rows
  Backend* backend_ = nullptr;
  RowFormat format_;
  int64_t n_ = 0;
  Buffer buffer_;
};

struct CompressorState {
  Buffer a, s;  // the fp32 carry (§4.2)
  CompressorCarry carry() const { return {a.get(), s.get()}; }
};

struct LayerState {
  Buffer ring;               // [window, head_dim]
  RowStore compressed;       // [n, head_dim]        (CSA, HCA)
  CompressorState compressor;  //                     (CSA, HCA)
  RowStore index_keys;       // [n, index_head_dim]  (CSA)
  CompressorState index_compressor;  //                (CSA)
};

// What the MTP block (architecture.md §3.8) keeps for a sequence that drafts (speculative decoding).
// The block runs position q with the token of q + 1, so it trails the sequence: positions wait here
// (the main model's final hc rows, and the tokens fed at them) until the token after the last one
// is known (Engine::draft). It only ever runs accepted tokens, so undo() leaves its ring alone.
struct DraftState {
  std::vector<LayerState> layers;  // one per MTP block: its sliding-window ring
  int64_t n_past = 0;              // positions the block has run
  RowStore hidden;                 // [pending, hc·D]: final hc rows of positions [n_past, seq.n_past)
  std::vector<int32_t> tokens;     // the tokens fed at those positions
  int64_t pending() const { return int64_t(tokens.size()); }
  void clear_pending() { hidden.clear(), tokens.clear(); }
};

// What undo() needs to take back one position (below).
struct UndoPoint {
  int64_t position = -1;
  std::vector<Buffer> previous_windows;  // each overlapping carry's previous window (a, then s), when needed
};

// A sequence's whole state at one position, kept for prefix reuse (the prefix cache): the ring,
// the compressed rows and indexer keys so far, and the fp32 compressor carries. The ring and the
// carries are overwritten as a sequence advances, so they are copied; compressed rows only depend
// on earlier tokens, so a copy of the rows up to the position is exact. State files
// (state_file.cpp) list these buffers: one added here goes there too, with the format version raised.
struct LayerSnapshot {
  Buffer ring;
  Buffer compressed, index_keys;
  int64_t n_compressed = 0, n_index_keys = 0;
  Buffer compressor_a, compressor_s, index_compressor_a, index_compressor_s;
  size_t bytes() const;
};

// A drafting sequence's DraftState in a snapshot: the MTP block's rings, its position and the
// positions waiting for it, so that drafts after a restore are those the sequence would have made.
struct DraftSnapshot {
  std::vector<Buffer> rings;    // one per MTP block
  int64_t n_past = 0;
  std::vector<int32_t> tokens;  // the waiting positions' tokens
  Buffer hidden;                // and their final hc rows, [tokens.size(), hc·D]
  size_t bytes() const;
};

struct StateSnapshot {
  int64_t n_past = 0;
  std::vector<LayerSnapshot> layers;
  std::optional<DraftSnapshot> draft;  // present when taken of a drafting sequence
  size_t bytes() const;                // of every buffer and token (prefix cache budgets, reports)
};

class SequenceState {
 public:
  // The compact layout needs deepseek numerics (plain rows are not quantized): refused otherwise.
  // With `drafts`, it also keeps the MTP block's state (DraftState).
  SequenceState(Backend& backend, const model::ModelConfig& config, const model::Weights& weights,
                StateLayout layout, bool drafts = false);
  // Back to an empty sequence (compressor carries to a = 0, s = −∞).
  void reset();
  // Makes room for the compressed rows and indexer keys of n_tokens positions, so that running up
  // to there allocates no state (a captured step may not: Backend::begin_capture).
  void reserve(int64_t n_tokens);
  StateSnapshot snapshot() const;
  // Sets the sequence to n_tokens positions by repeating its compressed rows and indexer keys
  // (the ring and the carries stay): a state of the right size with the model's own rows, to time
  // decode at long contexts without prefilling them (dsv4 bench --fill-state). Its logits are not
  // the model's at that context.
  void repeat_to(int64_t n_tokens);
  // Puts the sequence in the snapshot's state (continuing from there gives bit-identical results).
  // A snapshot that does not fit this sequence (layers, buffer sizes, row counts for its position)
  // is refused with invalid_input and the sequence is left as it was.
  // A drafting sequence takes the MTP block's state from the snapshot too. A snapshot of a sequence
  // that did not draft has none: the block then starts from there with its ring as it was, and its
  // drafts read stale window rows for a while (what is generated does not change, only how many
  // drafts are accepted).
  void restore(const StateSnapshot& snapshot);

  // Taking back the last position, a rejected draft token. undo_point(q), before the step that
  // runs position q, records what only q changes for good: when q completes a window, the
  // previous window of each ratio-4 compressor carry (completing a window moves the current one
  // there). undo(point), with the sequence just past q, puts it back at q: rows emitted at q are
  // dropped and those carries restored. The ring needs nothing: the slot q wrote held position
  // q − window, which no later position reads, and q's own row is written again when q runs again.
  UndoPoint undo_point(int64_t position) const;
  void undo(const UndoPoint& point);

  int64_t n_past = 0;  // positions already processed
  std::vector<LayerState> layers;
  std::unique_ptr<DraftState> draft;  // null: the sequence does not draft
  // Layer il's state: the main layers', then (il ≥ their count) the MTP blocks'.
  LayerState& layer(int64_t il);
  size_t bytes() const;
  StateLayout layout() const { return layout_; }

 private:
  Backend& backend_;
  const model::Weights& weights_;
  StateLayout layout_;
};

}  // namespace dsv4::engine
