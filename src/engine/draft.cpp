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
#include "engine/engine.h"

namespace dsv4::engine {

void Engine::keep_for_draft(SequenceState& seq, const float* X, std::span<const int32_t> tokens) {
  seq.draft->hidden.append_stored(X, int64_t(tokens.size()));
  seq.draft->tokens.insert(seq.draft->tokens.end(), tokens.begin(), tokens.end());
}

std::vector<float> Engine::draft(SequenceState& seq, int32_t next, LogitRows logits) {
  const model::ModelConfig& c = config();
  if (!seq.draft) fail(ErrorCode::invalid_input, "draft: the sequence was made without drafts");
  DraftState& d = *seq.draft;
  const int64_t n = d.pending();
  if (n == 0) fail(ErrorCode::invalid_input, "draft: no position ran since the last draft");
  if (next < 0 || next >= c.vocab_size)
    fail(ErrorCode::invalid_input, "draft: token {} outside the vocabulary [0, {})", next, c.vocab_size);
  const model::MtpWeights& mtp = model_.weights().mtp[0];
  const int64_t D = c.hidden_size, hc = c.hc_mult, rows = n * hc;
  Backend& b = *backend_;

  // Each position's next token: the one fed after it, and `next` after the last.
  std::vector<int32_t> after(d.tokens.begin() + 1, d.tokens.end());
  after.push_back(next);
  IdBuffer ids(b, size_t(n));
  b.ids_from_host(ids.get(), after.data(), size_t(n));

  Buffer e(b, size_t(rows * D)), en(b, size_t(rows * D)), hn(b, size_t(rows * D));
  b.embed(model_.weights().embed, ids.get(), n, hc, e.get());
  b.rms_norm(e.get(), mtp.enorm.data(), rows, D, c.rms_norm_eps, en.get());
  b.rms_norm(d.hidden.data(), mtp.hnorm.data(), rows, D, c.rms_norm_eps, hn.get());
  Buffer pe(b, size_t(rows * D)), ph(b, size_t(rows * D)), X(b, size_t(rows * D));
  b.linear(mtp.e_proj, Compute::quantized, en.get(), rows, pe.get());
  b.linear(mtp.h_proj, Compute::quantized, hn.get(), rows, ph.get());
  b.add(pe.get(), ph.get(), rows * D, X.get());

  const Segment segment{&seq, 0, n, d.n_past};
  attention_sublayer(mtp.block, std::span<const Segment>(&segment, 1), n, X.get(), nullptr);
  moe_sublayer(mtp.block, ids.get(), n, X.get(), nullptr);
  d.n_past += n;
  d.clear_pending();
  if (logits == LogitRows::none) return {};

  const int64_t first = logits == LogitRows::all ? 0 : n - 1, n_out = n - first;
  Buffer out(b, size_t(n_out * c.vocab_size));
  head(mtp.hc_head, mtp.norm, X.get() + first * hc * D, n_out, out.get(), nullptr, "mtp.y", "mtp.logits");
  std::vector<float> host(size_t(n_out * c.vocab_size));
  b.to_host(host.data(), out.get(), host.size());
  return host;
}

}  // namespace dsv4::engine
