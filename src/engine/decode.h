// Decoding after a prefill: sample, feed, repeat; optionally speculative, with the MTP block's draft
// of the token after each one checked in the same step (Engine::draft).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace dsv4::engine {

struct DecodeOptions {
  int64_t max_tokens = 16;
  int32_t eos = -1;  // stop after it (-1: none)
  bool speculative = false;
  // The draft token from the MTP block's logits (default: their argmax); tests script it.
  std::function<int32_t(std::span<const float> draft_logits)> choose_draft;
};

struct DecodeStats {
  int64_t steps = 0;     // forward passes
  int64_t drafted = 0;   // draft tokens fed
  int64_t accepted = 0;  // of them, the ones the sampler then chose
};

// The end of a speculative step that fed [token, draft] and got their logits ([2, vocab]): `choose`
// picks (and reports) a token from a row of logits and says whether generation goes on. The token
// chosen on the first row is emitted; when it is the draft and generation goes on, so is the one
// chosen on the second row. Otherwise the sequence takes the draft back (SequenceState::undo), so
// it holds every token emitted but the last, as after a plain step.
struct DraftOutcome {
  bool accepted = false;  // the first choice was the draft
  bool undone = false;    // the draft was taken back
  bool more = false;      // generation goes on
};
DraftOutcome settle_draft(SequenceState& seq, const UndoPoint& undo, int32_t draft, std::span<const float> logits,
                          const std::function<std::pair<int32_t, bool>(std::span<const float>)>& choose);

// Generates from the logits of the sequence's last position: up to max_tokens tokens, stopping after
// eos, each passed to on_token as it is chosen. Speculative steps feed the chosen token and its
// draft together and keep the draft when the sampler, on the chosen token's logits, picks it; else
// the sequence takes the draft back (SequenceState::undo). The sampler sees the same logits in the
// same order as without speculation (the engine's logits do not depend on how tokens are grouped
// into steps), so the tokens are the same, bit for bit, in fewer steps. Either way the sequence
// ends up holding every token emitted but the last (whose logits were not needed), and generation
// stops early at the model's last position. Speculative decoding needs a sequence made with drafts.
std::vector<int32_t> decode(Engine& engine, SequenceState& seq, std::vector<float> logits, Sampler& sampler,
                            const DecodeOptions& options, const std::function<void(int32_t)>& on_token = {},
                            DecodeStats* stats = nullptr);

}  // namespace dsv4::engine
