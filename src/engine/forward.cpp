// The forward pass as a story (architecture.md §3.1–§3.2): embed into hc streams, then per layer an
// attention sublayer and a MoE sublayer, each wrapped in mHC pre/post (one sublayer's post and the
// next one's pre are one op); finally the HC head, the norm and the LM head. Layer-major: a chunk
// of tokens passes through one layer before the next.
// A batch is several sequences' chunks as one set of rows (forward_batch); forward() is a batch of one.
#include <cmath>

#include "core/error.h"
#include "engine/captured_step.h"
#include "engine/engine.h"

namespace dsv4::engine {

Engine::Engine(const Model& model, std::unique_ptr<Backend> backend, std::optional<StateLayout> layout)
    : model_(model),
      backend_(std::move(backend)),
      rope_main_(layer_rope_freqs(model.config(), model::AttnKind::swa)),
      rope_compress_(layer_rope_freqs(model.config(), model::AttnKind::csa)),
      layout_(layout.value_or(default_state_layout(backend_->numerics()))) {}

void Engine::trace(const Tracer* tracer, const std::string& name, const float* data, std::vector<int64_t> shape) {
  if (!tracer) return;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> host(static_cast<size_t>(n));
  backend_->to_host(host.data(), data, host.size());
  (*tracer)(name, shape, host.data());
}

std::vector<float> Engine::forward(SequenceState& seq, std::span<const int32_t> tokens, bool all_logits,
                                   const Tracer* tracer) {
  const Step step{&seq, tokens, all_logits ? LogitRows::all : LogitRows::last};
  return std::move(forward_batch(std::span<const Step>(&step, 1), tracer)[0]);
}

void Engine::validate(std::span<const Step> steps) const {
  const model::ModelConfig& c = config();
  if (steps.empty()) fail(ErrorCode::invalid_input, "forward: no steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const int64_t T = int64_t(s.tokens.size()), p0 = s.seq->n_past;
    if (T == 0) fail(ErrorCode::invalid_input, "forward: no tokens");
    for (int64_t t = 0; t < T; ++t)
      if (s.tokens[size_t(t)] < 0 || s.tokens[size_t(t)] >= c.vocab_size)
        fail(ErrorCode::invalid_input, "token {} at position {}: outside the vocabulary [0, {})",
             s.tokens[size_t(t)], p0 + t, c.vocab_size);
    if (p0 + T > c.max_position_embeddings)
      fail(ErrorCode::invalid_input, "positions up to {} exceed max_position_embeddings {}", p0 + T,
           c.max_position_embeddings);
    for (size_t j = 0; j < i; ++j)
      if (steps[j].seq == s.seq) fail(ErrorCode::invalid_input, "forward_batch: steps {} and {}: the same sequence", j, i);
  }
}

std::vector<std::vector<float>> Engine::forward_batch(std::span<const Step> steps, const Tracer* tracer) {
  validate(steps);
  const model::ModelConfig& c = config();
  const model::Weights& w = model_.weights();
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  Backend& b = *backend_;

  // The batch's rows: each step's tokens, concatenated in step order.
  std::vector<Segment> segments;
  std::vector<int32_t> all_tokens;
  for (const Step& s : steps) {
    segments.push_back({s.seq, int64_t(all_tokens.size()), int64_t(s.tokens.size()), s.seq->n_past});
    all_tokens.insert(all_tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  const int64_t T = int64_t(all_tokens.size());
  // The state grows here, outside the captured step: nothing allocated inside may outlive it.
  for (const Step& s : steps) s.seq->reserve(s.seq->n_past + int64_t(s.tokens.size()));

  CapturedStep captured(b, T, tracer == nullptr);
  IdBuffer ids(b, size_t(T));
  b.ids_from_host(ids.get(), all_tokens.data(), size_t(T));
  Buffer X(b, size_t(T * hc * D));
  b.embed(w.embed, ids.get(), T, hc, X.get());

  run_layers(w.layers, segments, ids.get(), T, X.get(), tracer, captured);
  std::vector<LogitRows> wants;
  for (const Step& s : steps) wants.push_back(s.logits);
  const DeviceLogits logits = segment_logits(segments, wants, X.get(), w.hc_head, w.norm, tracer, "final.y", "logits");
  captured.run();

  for (const Segment& s : segments)
    if (s.seq->draft)
      keep_for_draft(*s.seq, X.get() + s.row0 * hc * D, std::span<const int32_t>(all_tokens).subspan(size_t(s.row0), size_t(s.n)));
  for (const Step& s : steps) s.seq->n_past += int64_t(s.tokens.size());
  return read_logits(logits);
}

Engine::DeviceLogits Engine::segment_logits(std::span<const Segment> segments, std::span<const LogitRows> wants,
                                            const float* X, const model::HcParams& hc_head,
                                            const std::vector<float>& norm, const Tracer* tracer, const char* y_name,
                                            const char* logits_name) {
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  Backend& b = *backend_;
  // Only the rows asked for: the head is the largest matrix of the model. They are gathered first
  // so the head runs once.
  DeviceLogits out{Buffer(), std::vector<int64_t>(segments.size(), 0)};
  int64_t n_out = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    out.n_of[i] = wants[i] == LogitRows::all ? segments[i].n : wants[i] == LogitRows::last ? 1 : 0;
    n_out += out.n_of[i];
  }
  if (n_out == 0) return out;
  Buffer X_out(b, size_t(n_out * hc * D));
  for (size_t i = 0, row = 0; i < segments.size(); row += size_t(out.n_of[i]), ++i) {
    const int64_t first = segments[i].row0 + segments[i].n - out.n_of[i];
    b.copy(X_out.get() + int64_t(row) * hc * D, X + first * hc * D, size_t(out.n_of[i] * hc * D));
  }
  Buffer y(b, size_t(n_out * D)), z(b, size_t(n_out * D));
  out.rows = Buffer(b, size_t(n_out * V));
  b.hc_head(hc_head, X_out.get(), n_out, hc, D, c.hc_eps, c.rms_norm_eps, y.get());
  trace(tracer, y_name, y.get(), {n_out, D});
  b.rms_norm(y.get(), norm.data(), n_out, D, c.rms_norm_eps, z.get());
  b.linear(model_.weights().head, Compute::f32_bf16_in, z.get(), n_out, out.rows.get());
  trace(tracer, logits_name, out.rows.get(), {n_out, V});
  return out;
}

std::vector<std::vector<float>> Engine::read_logits(const DeviceLogits& logits) {
  const int64_t V = config().vocab_size;
  std::vector<std::vector<float>> out(logits.n_of.size());
  for (size_t i = 0, row = 0; i < out.size(); row += size_t(logits.n_of[i]), ++i) {
    out[i].resize(size_t(logits.n_of[i] * V));
    if (logits.n_of[i] > 0) backend_->to_host(out[i].data(), logits.rows.get() + int64_t(row) * V, out[i].size());
  }
  return out;
}

std::vector<float> Engine::prefill(SequenceState& seq, std::span<const int32_t> tokens, int64_t chunk,
                                   bool all_logits, const Progress& progress) {
  const int64_t T = int64_t(tokens.size());
  if (chunk <= 0) chunk = T;
  std::vector<float> out;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const bool last = t0 + n == T;
    const Step step{&seq, tokens.subspan(size_t(t0), size_t(n)),
                    all_logits ? LogitRows::all : last ? LogitRows::last : LogitRows::none};
    std::vector<float> part = std::move(forward_batch(std::span<const Step>(&step, 1))[0]);
    out.insert(out.end(), part.begin(), part.end());
    // A drafting sequence's MTP block follows chunk by chunk (it keeps the chunk's rows until
    // then), up to the prompt's last position, whose next token is not known yet.
    if (seq.draft && !last) draft(seq, tokens[size_t(t0 + n)], LogitRows::none);
    if (progress) progress(t0 + n, T);
  }
  return out;
}

void Engine::run_layers(std::span<const model::LayerWeights> layers, std::span<const Segment> segments,
                        const int32_t* tokens, int64_t T, float* X, const Tracer* tracer, CapturedStep& captured) {
  // Sublayer i is layer i/2's attention (i even) or MoE (i odd).
  auto wrap = [&](size_t i) {
    const model::LayerWeights& lw = layers[i / 2];
    const std::string l = "l" + std::to_string(lw.il);
    return i % 2 == 0 ? SublayerWrap{lw.hc_attn, lw.attn_norm, l + ".hc_attn", l + ".attn.x"}
                      : SublayerWrap{lw.hc_ffn, lw.ffn_norm, l + ".hc_ffn", l + ".ffn.x"};
  };
  const size_t n = 2 * layers.size();
  if (n == 0) return;
  SublayerInput in = enter_sublayer(wrap(0), X, T, tracer);
  for (size_t i = 0; i < n; ++i) {
    const model::LayerWeights& lw = layers[i / 2];
    const Buffer out = i % 2 == 0 ? attention_sublayer(lw, segments, T, in.x.get(), tracer)
                                  : moe_sublayer(lw, tokens, T, in.x.get(), tracer);
    if (i + 1 < n) in = pass_sublayer(in, out.get(), wrap(i), wrap(i + 1), X, T, tracer);
    else leave_sublayer(in, out.get(), wrap(i), X, T, tracer);
    captured.flush();
  }
}

Engine::SublayerInput Engine::new_sublayer_input(int64_t T) {
  const int64_t D = config().hidden_size, n_hc = config().hc_mult;
  Backend& b = *backend_;
  return {Buffer(b, size_t(T * D)), Buffer(b, size_t(T * n_hc)), Buffer(b, size_t(T * n_hc * n_hc)),
          Buffer(b, size_t(T * D))};
}

void Engine::trace_sublayer_input(const Tracer* tracer, const SublayerWrap& wrap, const SublayerInput& in, int64_t T) {
  const int64_t D = config().hidden_size, n_hc = config().hc_mult;
  trace(tracer, wrap.hc_name + ".u", in.u.get(), {T, D});
  trace(tracer, wrap.hc_name + ".post", in.post.get(), {T, n_hc});
  trace(tracer, wrap.hc_name + ".comb", in.comb.get(), {T, n_hc, n_hc});
  trace(tracer, wrap.x_name, in.x.get(), {T, D});
}

Engine::SublayerInput Engine::enter_sublayer(const SublayerWrap& wrap, const float* X, int64_t T,
                                             const Tracer* tracer) {
  const model::ModelConfig& c = config();
  SublayerInput in = new_sublayer_input(T);
  backend_->hc_pre_norm(wrap.hc, wrap.norm.data(), X, T, c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps,
                        c.rms_norm_eps, in.u.get(), in.post.get(), in.comb.get(), in.x.get());
  trace_sublayer_input(tracer, wrap, in, T);
  return in;
}

Engine::SublayerInput Engine::pass_sublayer(const SublayerInput& in, const float* out, const SublayerWrap& here,
                                            const SublayerWrap& next, float* X, int64_t T, const Tracer* tracer) {
  const model::ModelConfig& c = config();
  SublayerInput next_in = new_sublayer_input(T);
  backend_->hc_post_pre_norm(out, X, in.post.get(), in.comb.get(), next.hc, next.norm.data(), T, c.hc_mult,
                             c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, next_in.u.get(),
                             next_in.post.get(), next_in.comb.get(), next_in.x.get());
  trace(tracer, here.hc_name + ".X", X, {T, c.hc_mult, c.hidden_size});
  trace_sublayer_input(tracer, next, next_in, T);
  return next_in;
}

void Engine::leave_sublayer(const SublayerInput& in, const float* out, const SublayerWrap& here, float* X, int64_t T,
                            const Tracer* tracer) {
  const int64_t D = config().hidden_size, n_hc = config().hc_mult;
  backend_->hc_post(out, X, in.post.get(), in.comb.get(), T, n_hc, D, X);  // in place
  trace(tracer, here.hc_name + ".X", X, {T, n_hc, D});
}

// MoE sublayer (§3.6): routing, then the routed experts and the shared expert.
Buffer Engine::moe_sublayer(const model::LayerWeights& lw, const int32_t* tokens, int64_t T, const float* x,
                            const Tracer* tracer) {
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden_size, k = c.n_experts_per_tok;
  Backend& b = *backend_;
  Buffer out(b, size_t(T * D)), weights(b, size_t(T * k));
  IdBuffer sel(b, size_t(T * k));
  b.route(lw.ffn, x, tokens, T, D, k, c.routed_scaling_factor, sel.get(), weights.get());
  b.moe(lw.ffn, x, sel.get(), weights.get(), T, D, k, c.swiglu_limit, out.get());
  trace(tracer, "l" + std::to_string(lw.il) + ".ffn.out", out.get(), {T, D});
  return out;
}

}  // namespace dsv4::engine
