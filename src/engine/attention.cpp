// The attention sublayer (architecture.md §3.3–§3.5, §4.3) for a chunk of T tokens at positions
// [p0, p0 + T): query path, KV path, the compressors and the Lightning Indexer, sparse attention
// over the sliding window plus compressed rows, and the grouped output projection.
//
// Order matters for causality: compressed rows completed inside the chunk are appended before
// attention runs, and the visibility rule w < ⌊(t+1)/ratio⌋ hides those a query may not see yet.
// The ring is written after attention, since a chunk's queries read older rows from it.
#include <cmath>

#include "engine/engine.h"

namespace dsv4::engine {

namespace {

// Projects x into a compressor, pushes the tokens through its carry, and finishes every completed
// window: RMSNorm, RoPE at the window start (ratio·w), then `quantize` (the FP8 or FP4 simulation).
// Appends the finished rows to `store`.
template <class Quantize>
void run_compressor(Backend& b, const model::CompressorWeights& cw, CompressorState& state, RowStore& store,
                    const float* x, int64_t p0, int64_t T, double eps, const RopeFreqs& rope, Quantize quantize) {
  const int64_t width = cw.width(), d = cw.dim;
  Buffer a(b, size_t(T * width)), s(b, size_t(T * width));
  b.linear(cw.wkv, Compute::f32, x, T, a.get());
  b.linear(cw.wgate, Compute::f32, x, T, s.get());
  const int64_t max_new = T / cw.ratio + 1;
  Buffer pooled(b, size_t(max_new * d)), rows(b, size_t(max_new * d));
  const int64_t n_new = b.compressor_push(cw, state.carry(), a.get(), s.get(), p0, T, pooled.get());
  if (n_new == 0) return;
  b.rms_norm(pooled.get(), cw.norm.data(), n_new, d, eps, rows.get());
  b.rope(rows.get(), n_new, 1, d, rope, store.rows() * cw.ratio, cw.ratio, false);
  quantize(rows.get(), n_new);
  store.append(rows.get(), n_new);
}

}  // namespace

void Engine::attention_sublayer(const model::LayerWeights& lw, LayerState& ls, int64_t p0, int64_t T, float* X,
                                const Tracer* tracer) {
  const model::ModelConfig& c = config();
  const model::AttentionWeights& aw = lw.attn;
  const int64_t D = c.hidden_size, H = c.n_heads, hd = c.head_dim;
  const double eps = c.rms_norm_eps;
  const RopeFreqs& rope = lw.kind == model::AttnKind::swa ? rope_main_ : rope_compress_;
  const std::string l = "l" + std::to_string(lw.il);
  Backend& b = *backend_;

  const SublayerInput in = enter_sublayer(lw.hc_attn, lw.attn_norm, X, T, tracer, l + ".hc_attn", l + ".attn.x");
  const float* x = in.x.get();

  // Query path: low rank, q_norm, per-head weightless norm, RoPE on the last dims.
  Buffer qa(b, size_t(T * c.q_lora_rank)), qr(b, size_t(T * c.q_lora_rank)), q(b, size_t(T * H * hd));
  b.linear(aw.wq_a, Compute::quantized, x, T, qa.get());
  b.rms_norm(qa.get(), aw.q_norm.data(), T, c.q_lora_rank, eps, qr.get());
  trace(tracer, l + ".attn.qr", qr.get(), {T, c.q_lora_rank});
  b.linear(aw.wq_b, Compute::quantized, qr.get(), T, q.get());
  b.head_norm(q.get(), T * H, hd, eps);
  b.rope(q.get(), T, H, hd, rope, p0, 1, false);
  trace(tracer, l + ".attn.q", q.get(), {T, H, hd});

  // KV path: one shared K = V head; the non-rope dims go through the FP8 simulation.
  Buffer kv_raw(b, size_t(T * hd)), kv(b, size_t(T * hd));
  b.linear(aw.wkv, Compute::quantized, x, T, kv_raw.get());
  b.rms_norm(kv_raw.get(), aw.kv_norm.data(), T, hd, eps, kv.get());
  b.rope(kv.get(), T, 1, hd, rope, p0, 1, false);
  b.kv_fp8_sim(kv.get(), T, hd, c.nope_head_dim());
  trace(tracer, l + ".attn.kv", kv.get(), {T, hd});

  // CSA: the indexer's keys, its queries and weights, and the top-k selection.
  CompressedRows comp;
  IdBuffer selected;
  if (aw.indexer) {
    const model::IndexerWeights& ix = *aw.indexer;
    const int64_t Hi = c.index_n_heads, di = c.index_head_dim;
    run_compressor(b, ix.compressor, ls.index_compressor, ls.index_keys, x, p0, T, eps, rope,
                   [&](float* rows, int64_t n) { b.indexer_fp4_sim(rows, n, di); });
    Buffer qi(b, size_t(T * Hi * di)), wts(b, size_t(T * Hi));
    b.linear(ix.wq_b, Compute::quantized, qr.get(), T, qi.get());
    b.rope(qi.get(), T, Hi, di, rope, p0, 1, false);
    b.indexer_fp4_sim(qi.get(), T * Hi, di);
    b.linear(ix.weights_proj, Compute::bf16, x, T, wts.get());
    b.scale(wts.get(), T * Hi, float(std::pow(double(di), -0.5) * std::pow(double(Hi), -0.5)));
    selected = IdBuffer(b, size_t(T * c.index_topk));
    b.indexer_select(qi.get(), wts.get(), T, Hi, di, ls.index_keys.data(), ls.index_keys.rows(), 4, p0,
                     c.index_topk, selected.get());
    comp.idx = selected.get();
    comp.k = c.index_topk;
  }
  // CSA and HCA: the compressed KV rows.
  if (aw.compressor) {
    run_compressor(b, *aw.compressor, ls.compressor, ls.compressed, x, p0, T, eps, rope,
                   [&](float* rows, int64_t n) { b.kv_fp8_sim(rows, n, hd, c.nope_head_dim()); });
    comp.kv = ls.compressed.data();
    comp.n = ls.compressed.rows();
    comp.ratio = aw.compressor->ratio;
  }

  // The window: older rows from the ring, then this chunk's rows.
  const int64_t W = c.sliding_window, first_pos = std::max<int64_t>(0, p0 - (W - 1));
  Buffer window(b, size_t((p0 - first_pos + T) * hd));
  b.swa_gather(ls.ring.get(), W, hd, first_pos, p0, window.get());
  b.copy(window.get() + (p0 - first_pos) * hd, kv.get(), size_t(T * hd));
  SwaRows swa{window.get(), first_pos, p0 - first_pos + T, W};

  Buffer o(b, size_t(T * H * hd));
  b.attention(q.get(), T, H, hd, p0, swa, comp, aw.sink.data(), float(1.0 / std::sqrt(double(hd))), o.get());
  b.swa_store(ls.ring.get(), W, hd, kv.get(), p0, T);
  // V = K carries rope on its last dims: rotate the output back at the query position.
  b.rope(o.get(), T, H, hd, rope, p0, 1, true);
  trace(tracer, l + ".attn.o", o.get(), {T, H, hd});

  // Grouped output projection: group g maps its heads' concatenated outputs through rows
  // [g·o_lora, (g+1)·o_lora) of wo_a (a bf16 product in the reference), then wo_b mixes the groups.
  const int64_t G = c.o_groups, R = c.o_lora_rank, in_g = H * hd / G;
  Buffer z(b, size_t(T * G * R)), out(b, size_t(T * D));
  for (int64_t g = 0; g < G; ++g)
    b.linear(aw.wo_a, Compute::bf16, o.get() + g * in_g, H * hd, T, z.get() + g * R, G * R, g * R, R);
  b.linear(aw.wo_b, Compute::quantized, z.get(), T, out.get());
  trace(tracer, l + ".attn.out", out.get(), {T, D});

  leave_sublayer(in, out.get(), X, T, tracer, l + ".hc_attn");
}

}  // namespace dsv4::engine
