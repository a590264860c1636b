// The engine's narrow boundary: a loaded Model, an Engine that runs it on a backend, and
// per-sequence state. The CLI, the tests and (later) the server see only this header.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/rope_freqs.h"
#include "engine/state.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dsv4::engine {

class CapturedStep;

// A checkpoint folder opened, validated and bound: config, mapped tensors, weights.
class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& dir);
  static std::unique_ptr<Model> from_checkpoint(model::ModelConfig config, model::Checkpoint checkpoint);
  const model::ModelConfig& config() const { return config_; }
  const model::Checkpoint& checkpoint() const { return checkpoint_; }
  const model::Weights& weights() const { return weights_; }

 private:
  model::ModelConfig config_;
  model::Checkpoint checkpoint_;
  model::Weights weights_;
};

// Receives named intermediates (`l{il}.attn.q`, …; shapes outermost first) for diffing against
// the oracle's dumps.
using Tracer = std::function<void(const std::string& name, const std::vector<int64_t>& shape, const float* data)>;

// Compact in the deepseek numerics (exact there), f32 in plain (its rows are not quantized).
inline StateLayout default_state_layout(Numerics numerics) {
  return quantizes(numerics) ? StateLayout::compact : StateLayout::f32;
}

// Which logits a step of forward_batch returns.
enum class LogitRows {
  none,  // a prefill chunk that is not the prompt's last
  last,  // [vocab] for the step's last token (generation)
  all,   // [T, vocab]
};

// One sequence's share of a batched forward: its state, the tokens to run at positions
// [seq->n_past, seq->n_past + tokens.size()), and the logits wanted back.
struct Step {
  SequenceState* seq = nullptr;
  std::span<const int32_t> tokens;
  LogitRows logits = LogitRows::last;
};

class Engine {
 public:
  // Sequences keep their compressed rows in `layout`; by default compact in deepseek numerics
  // (exact there) and f32 in plain.
  Engine(const Model& model, std::unique_ptr<Backend> backend, std::optional<StateLayout> layout = {});

  // With `drafts`, the sequence also keeps the MTP block's state, for draft().
  SequenceState new_sequence(bool drafts = false) {
    return SequenceState(*backend_, model_.config(), model_.weights(), layout_, drafts);
  }
  StateLayout state_layout() const { return layout_; }

  // Runs `tokens` at positions [seq.n_past, seq.n_past + T) in one layer-major pass and advances
  // the sequence. Returns logits for every token ([T, vocab]) or, with all_logits false, for the
  // last one ([vocab]). Token ids outside the vocabulary are rejected before anything runs.
  std::vector<float> forward(SequenceState& seq, std::span<const int32_t> tokens, bool all_logits,
                             const Tracer* tracer = nullptr);

  // Runs several sequences' steps in one layer-major pass (continuous batching): every row-wise
  // op (embed, mHC, norms, linears, routing, MoE, head) runs once over the concatenated rows; the
  // attention core (compressors, indexer, window, attention) runs per sequence on its rows. Every
  // op is row-independent, so each sequence's logits and state are bit-identical to running its
  // step alone. Returns one logits vector per step (empty for LogitRows::none). A sequence may
  // appear only once; all steps are validated before anything runs. forward() is the one-step case.
  std::vector<std::vector<float>> forward_batch(std::span<const Step> steps, const Tracer* tracer = nullptr);

  // forward() in chunks of at most `chunk` tokens (0: one chunk); same results as one pass.
  // `progress(done, total)` is called after each chunk.
  using Progress = std::function<void(int64_t done, int64_t total)>;
  std::vector<float> prefill(SequenceState& seq, std::span<const int32_t> tokens, int64_t chunk, bool all_logits,
                             const Progress& progress = {});

  // Speculative decoding's draft (architecture.md §3.8): the MTP block runs each position the
  // sequence ran since its last draft with the token after it, `next` for the last one (the token
  // just chosen from the main logits), and its logits there guess the token after `next`. Returns
  // those logits ([vocab]; all: every position's, [positions, vocab]; none: nothing, the block
  // only keeps up, as between prefill chunks). The block only runs tokens known to be right: after
  // a rejected draft, undo() the sequence first. Needs a sequence made with drafts, with a
  // position run since its last draft (DraftState::pending).
  std::vector<float> draft(SequenceState& seq, int32_t next, LogitRows logits = LogitRows::last);
  // Several sequences' drafts in one pass of the block, as forward_batch: each sequence's logits
  // are bit-identical to its draft alone. draft() is the batch of one.
  struct DraftStep {
    SequenceState* seq = nullptr;
    int32_t next = 0;
    LogitRows logits = LogitRows::last;
  };
  std::vector<std::vector<float>> draft_batch(std::span<const DraftStep> steps);

  const model::ModelConfig& config() const { return model_.config(); }
  const model::Weights& weights() const { return model_.weights(); }
  Backend& backend() { return *backend_; }

 private:
  // A step's rows inside the concatenated batch: rows [row0, row0 + n) at positions [p0, p0 + n).
  struct Segment {
    SequenceState* seq;
    int64_t row0, n, p0;
  };
  // The layers' sublayers in order (each layer's attention, then its MoE) over the batch's hc
  // streams X ([T, hc, D]); tokens are the rows' ids (hash routing). captured.flush() follows every
  // sublayer (the device runs it while the host records the next, or the head).
  void run_layers(std::span<const model::LayerWeights> layers, std::span<const Segment> segments,
                  const int32_t* tokens, int64_t T, float* X, const Tracer* tracer, CapturedStep& captured);
  // A sublayer's output [T, D] from its input x [T, D].
  Buffer attention_sublayer(const model::LayerWeights& lw, std::span<const Segment> segments, int64_t T,
                            const float* x, const Tracer* tracer);
  Buffer moe_sublayer(const model::LayerWeights& lw, const int32_t* tokens, int64_t T, const float* x,
                      const Tracer* tracer);
  // Rejects bad tokens, positions past the model's limit and a sequence given twice.
  void validate(std::span<const Step> steps) const;
  // Keeps a drafting sequence's final hc rows of a step ([tokens, hc, D]) and its tokens for draft().
  void keep_for_draft(SequenceState& seq, const float* X, std::span<const int32_t> tokens);
  // The logits each segment asks for (none, its last row, all its rows) from the batch's final hc
  // rows X ([T, hc, D]): HC head, norm and LM head, with the model's HC head and norm or the MTP
  // block's, run once over the rows wanted; traced under the two names given. They stay on the
  // device (a captured step ends before they are read) until read_logits.
  struct DeviceLogits {
    Buffer rows;                // [Σ n_of, vocab]
    std::vector<int64_t> n_of;  // rows of each segment
  };
  DeviceLogits segment_logits(std::span<const Segment> segments, std::span<const LogitRows> wants, const float* X,
                              const model::HcParams& hc_head, const std::vector<float>& norm, const Tracer* tracer,
                              const char* y_name, const char* logits_name);
  std::vector<std::vector<float>> read_logits(const DeviceLogits& logits);

  // Every sublayer is wrapped the same way (§3.2): mHC pre collapses the hc streams into the
  // normalised sublayer input x; mHC post mixes the sublayer output back into the streams. A
  // sublayer's wrapping is its mHC parameters, its input norm and its names in traces.
  struct SublayerWrap {
    const model::HcParams& hc;
    const std::vector<float>& norm;
    std::string hc_name, x_name;
  };
  struct SublayerInput {
    Buffer u, post, comb, x;  // (u, the collapsed streams before the norm, only for traces)
  };
  // The first sublayer's input from X.
  SublayerInput enter_sublayer(const SublayerWrap& wrap, const float* X, int64_t T, const Tracer* tracer);
  // The output of the sublayer that ran on `in` (wrapped as `here`) joins X; then the input of the
  // sublayer `next`, from the new X: one backend op.
  SublayerInput pass_sublayer(const SublayerInput& in, const float* out, const SublayerWrap& here,
                              const SublayerWrap& next, float* X, int64_t T, const Tracer* tracer);
  // The last sublayer's output joins X.
  void leave_sublayer(const SublayerInput& in, const float* out, const SublayerWrap& here, float* X, int64_t T,
                      const Tracer* tracer);
  SublayerInput new_sublayer_input(int64_t T);
  void trace_sublayer_input(const Tracer* tracer, const SublayerWrap& wrap, const SublayerInput& in, int64_t T);
  // Writes a backend buffer to the tracer (no-op without one).
  void trace(const Tracer* tracer, const std::string& name, const float* data, std::vector<int64_t> shape);

  const Model& model_;
  std::unique_ptr<Backend> backend_;
  RopeFreqs rope_main_, rope_compress_;
  StateLayout layout_;
};

}  // namespace dsv4::engine
