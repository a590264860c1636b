#include "engine/decode.h"

#include "core/error.h"

namespace dsv4::engine {

DraftOutcome settle_draft(SequenceState& seq, const UndoPoint& undo, int32_t draft, std::span<const float> logits,
                          const std::function<std::pair<int32_t, bool>(std::span<const float>)>& choose) {
  const size_t V = logits.size() / 2;
  DraftOutcome r;
  const auto [chosen, more] = choose(logits.first(V));
  r.accepted = chosen == draft;
  if (!r.accepted || !more) {
    seq.undo(undo);
    r.undone = true;
    r.more = more;
    return r;
  }
  r.more = choose(logits.subspan(V)).second;
  return r;
}

std::vector<int32_t> decode(Engine& engine, SequenceState& seq, std::vector<float> logits, Sampler& sampler,
                            const DecodeOptions& o, const std::function<void(int32_t)>& on_token, DecodeStats* stats) {
  if (o.speculative && !seq.draft) fail(ErrorCode::invalid_input, "speculative decoding needs a sequence with drafts");
  DecodeStats local;
  DecodeStats& st = stats ? *stats : local;
  std::vector<int32_t> out;
  // Takes `token` as the next output; false when generation ends with it.
  auto emit = [&](int32_t token) {
    out.push_back(token);
    if (on_token) on_token(token);
    return token != o.eos && int64_t(out.size()) < o.max_tokens;
  };
  if (o.max_tokens <= 0) return out;
  int32_t next = sampler.sample(logits);
  if (!emit(next)) return out;
  const int64_t max_position = engine.config().max_position_embeddings;
  while (seq.n_past + 1 <= max_position) {  // else the last token chosen has no position to run at
    // A plain step without speculation, without room for a draft, or with no position to draft
    // from (a state just restored from a snapshot).
    if (!o.speculative || seq.n_past + 2 > max_position || seq.draft->pending() == 0) {
      logits = engine.forward(seq, std::span<const int32_t>(&next, 1), false);
      ++st.steps;
      next = sampler.sample(logits);
      if (!emit(next)) return out;
      continue;
    }
    const std::vector<float> draft_logits = engine.draft(seq, next);
    const int32_t draft = o.choose_draft ? o.choose_draft(draft_logits) : argmax(draft_logits);
    const UndoPoint undo = seq.undo_point(seq.n_past + 1);
    const int32_t fed[2] = {next, draft};
    logits = engine.forward(seq, fed, true);  // [2, V]: after `next`, after the draft
    ++st.steps, ++st.drafted;
    const DraftOutcome r = settle_draft(seq, undo, draft, logits, [&](std::span<const float> row) {
      const int32_t token = sampler.sample(row);
      return std::pair{token, emit(token)};
    });
    st.accepted += r.accepted;
    if (!r.more) return out;
    next = out.back();
  }
  return out;
}

}  // namespace dsv4::engine
