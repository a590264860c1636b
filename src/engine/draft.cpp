// The MTP block (architecture.md §3.8) as speculative decoding's draft model. Position q of the
// sequence pairs the main model's final hc rows X_q (before the HC head) with the token of q + 1:
//   e  = RMSNorm(embed[token]; enorm)          hn = RMSNorm(X_q; hnorm), each hc stream on its own
//   X0 = e_proj(e) on every stream + h_proj(hn)     (FP8 products, their sum rounded as one add)
//   X1 = the block's own layer (sliding-window attention, score-routed MoE) at position q
//   logits = LM head(RMSNorm(HCHead(X1; the block's HC head); the block's norm))
// guess the token of q + 2. The embedding is broadcast to the hc streams before its norm and
// e_proj, so every op runs on [positions · hc] rows; equal rows give equal results, so this is the
// reference's single row broadcast after e_proj.
#include "core/error.h"
#include "engine/captured_step.h"
#include "engine/engine.h"

namespace dsv4::engine {

void Engine::keep_for_draft(SequenceState& seq, const float* X, std::span<const int32_t> tokens) {
  seq.draft->hidden.append_stored(X, int64_t(tokens.size()));
  seq.draft->tokens.insert(seq.draft->tokens.end(), tokens.begin(), tokens.end());
}

std::vector<float> Engine::draft(SequenceState& seq, int32_t next, LogitRows logits) {
  const DraftStep step{&seq, next, logits};
  return std::move(draft_batch(std::span<const DraftStep>(&step, 1))[0]);
}

std::vector<std::vector<float>> Engine::draft_batch(std::span<const DraftStep> steps) {
  const model::ModelConfig& c = config();
  for (size_t i = 0; i < steps.size(); ++i) {
    const DraftStep& s = steps[i];
    if (!s.seq->draft) fail(ErrorCode::invalid_input, "draft: the sequence was made without drafts");
    if (s.seq->draft->pending() == 0) fail(ErrorCode::invalid_input, "draft: no position ran since the last draft");
    if (s.next < 0 || s.next >= c.vocab_size)
      fail(ErrorCode::invalid_input, "draft: token {} outside the vocabulary [0, {})", s.next, c.vocab_size);
    for (size_t j = 0; j < i; ++j)
      if (steps[j].seq == s.seq) fail(ErrorCode::invalid_input, "draft_batch: steps {} and {}: the same sequence", j, i);
  }
  const model::MtpWeights& mtp = model_.weights().mtp[0];
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  Backend& b = *backend_;

  // The batch's rows: each sequence's waiting positions, in step order, and the token after each:
  // the one fed after it, and `next` after the last.
  std::vector<Segment> segments;
  std::vector<int32_t> after;
  for (const DraftStep& s : steps) {
    const DraftState& d = *s.seq->draft;
    segments.push_back({s.seq, int64_t(after.size()), d.pending(), d.n_past});
    after.insert(after.end(), d.tokens.begin() + 1, d.tokens.end());
    after.push_back(s.next);
  }
  const int64_t T = int64_t(after.size()), rows = T * hc;
  CapturedStep captured(b, rows, true);
  IdBuffer ids(b, size_t(T));
  b.ids_from_host(ids.get(), after.data(), size_t(T));
  Buffer hidden(b, steps.size() > 1 ? size_t(rows * D) : 0);  // one sequence's rows are used in place
  for (size_t i = 0; i < steps.size() && steps.size() > 1; ++i)
    b.copy(hidden.get() + segments[i].row0 * hc * D, steps[i].seq->draft->hidden.data(), size_t(segments[i].n * hc * D));
  const float* H = steps.size() > 1 ? hidden.get() : steps[0].seq->draft->hidden.data();

  Buffer e(b, size_t(rows * D)), en(b, size_t(rows * D)), hn(b, size_t(rows * D));
  b.embed(model_.weights().embed, ids.get(), T, hc, e.get());
  b.rms_norm(e.get(), mtp.enorm.data(), rows, D, c.rms_norm_eps, en.get());
  b.rms_norm(H, mtp.hnorm.data(), rows, D, c.rms_norm_eps, hn.get());
  Buffer pe(b, size_t(rows * D)), ph(b, size_t(rows * D)), X(b, size_t(rows * D));
  b.linear(mtp.e_proj, Compute::quantized, en.get(), rows, pe.get());
  b.linear(mtp.h_proj, Compute::quantized, hn.get(), rows, ph.get());
  b.add(pe.get(), ph.get(), rows * D, X.get());

  run_layers(std::span<const model::LayerWeights>(&mtp.block, 1), segments, ids.get(), T, X.get(), nullptr, captured);
  std::vector<LogitRows> wants;
  for (const DraftStep& s : steps) wants.push_back(s.logits);
  const DeviceLogits logits = segment_logits(segments, wants, X.get(), mtp.hc_head, mtp.norm, nullptr, "mtp.y",
                                             "mtp.logits");
  captured.run();
  for (const DraftStep& s : steps) s.seq->draft->n_past += s.seq->draft->pending(), s.seq->draft->clear_pending();
  return read_logits(logits);
}

}  // namespace dsv4::engine
