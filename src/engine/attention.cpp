// The attention sublayer (architecture.md §3.3–§3.5, §4.3) for a batch of sequences' rows: query
// path, KV path, the compressors and the Lightning Indexer, sparse attention over the sliding
// window plus compressed rows, and the grouped output projection.
//
// Row-wise work (projections, norms, quantization) runs once over all rows of the batch; what
// depends on a sequence's position or state (RoPE, compressor carries, the indexer's keys, the
// window and attention) runs per sequence on its segment of rows [row0, row0 + n) at positions
// [p0, p0 + n).
//
// Order matters for causality: compressed rows completed inside the chunk are appended before
// attention runs, and the visibility rule w < ⌊(t+1)/ratio⌋ hides those a query may not see yet.
// The ring is written after attention, since a chunk's queries read older rows from it.
#include <cmath>

#include "engine/engine.h"

namespace dsv4::engine {

namespace {

// A compressor's projections of every row of the batch: a = x·wkvᵀ, s = x·wgateᵀ ([T, width]), fp32
// products of the sublayer's normed x and BF16 weights.
struct CompressorInput {
  Buffer a, s;
  int64_t width = 0;
};

CompressorInput project_compressor(Backend& b, const model::CompressorWeights& cw, const float* x, int64_t T) {
  CompressorInput in{Buffer(b, size_t(T * cw.width())), Buffer(b, size_t(T * cw.width())), cw.width()};
  b.linear(cw.wkv, Compute::f32_bf16_in, x, T, in.a.get());
  b.linear(cw.wgate, Compute::f32_bf16_in, x, T, in.s.get());
  return in;
}

// Pushes one sequence's rows through its compressor carry and finishes every completed window:
// finish(pooled, m, pos0, rows) makes the m finished rows (RMSNorm, RoPE at the window start ratio·w
// from pos0 in steps of ratio, then the FP8 or FP4 simulation) out of the m pooled ones. Appends
// them to `store`.
template <class Finish>
void push_compressor(Backend& b, const model::CompressorWeights& cw, const CompressorInput& in, int64_t row0,
                     int64_t n, int64_t p0, CompressorState& state, RowStore& store, Finish finish) {
  const int64_t d = cw.dim, max_new = n / cw.ratio + 1;
  Buffer pooled(b, size_t(max_new * d)), rows(b, size_t(max_new * d));
  const int64_t n_new = b.compressor_push(cw, state.carry(), in.a.get() + row0 * in.width,
                                          in.s.get() + row0 * in.width, p0, n, pooled.get());
  if (n_new == 0) return;
  finish(pooled.get(), n_new, store.rows() * cw.ratio, rows.get());
  store.append(rows.get(), n_new);
}

}  // namespace

Buffer Engine::attention_sublayer(const model::LayerWeights& lw, std::span<const Segment> segments, int64_t T,
                                  const float* x, const Tracer* tracer) {
  const model::ModelConfig& c = config();
  const model::AttentionWeights& aw = lw.attn;
  const int64_t D = c.hidden_size, H = c.n_heads, hd = c.head_dim;
  const double eps = c.rms_norm_eps;
  const RopeFreqs& rope = lw.kind == model::AttnKind::swa ? rope_main_ : rope_compress_;
  const std::string l = "l" + std::to_string(lw.il);
  Backend& b = *backend_;
  // RoPE at each sequence's own positions, on its rows of a [T, group, stride] buffer.
  auto rope_rows = [&](float* x, int64_t group, int64_t stride, bool inverse) {
    for (const Segment& s : segments)
      b.rope(x + s.row0 * group * stride, s.n, group, stride, rope, s.p0, 1, inverse);
  };

  // Query path: low rank, q_norm, per-head weightless norm, RoPE on the last dims.
  Buffer qa(b, size_t(T * c.q_lora_rank)), qr(b, size_t(T * c.q_lora_rank)), q(b, size_t(T * H * hd));
  b.linear(aw.wq_a, Compute::quantized, x, T, qa.get());
  b.rms_norm(qa.get(), aw.q_norm.data(), T, c.q_lora_rank, eps, qr.get());
  trace(tracer, l + ".attn.qr", qr.get(), {T, c.q_lora_rank});
  b.linear(aw.wq_b, Compute::quantized, qr.get(), T, q.get());
  b.head_norm(q.get(), T * H, hd, eps);
  rope_rows(q.get(), H, hd, false);
  trace(tracer, l + ".attn.q", q.get(), {T, H, hd});

  // KV path: one shared K = V head, normed and rotated; the non-rope dims go through the FP8
  // simulation.
  Buffer kv_raw(b, size_t(T * hd)), kv(b, size_t(T * hd));
  b.linear(aw.wkv, Compute::quantized, x, T, kv_raw.get());
  for (const Segment& s : segments)
    b.kv_norm_rope_fp8(kv_raw.get() + s.row0 * hd, aw.kv_norm.data(), s.n, hd, eps, rope, s.p0, 1,
                       c.nope_head_dim(), kv.get() + s.row0 * hd);
  trace(tracer, l + ".attn.kv", kv.get(), {T, hd});

  // CSA: the indexer's queries and weights, and its compressor's projections.
  const int64_t Hi = c.index_n_heads, di = c.index_head_dim;
  Buffer qi, wts;
  CompressorInput index_in;
  if (aw.indexer) {
    const model::IndexerWeights& ix = *aw.indexer;
    index_in = project_compressor(b, ix.compressor, x, T);
    qi = Buffer(b, size_t(T * Hi * di));
    wts = Buffer(b, size_t(T * Hi));
    b.linear(ix.wq_b, Compute::quantized, qr.get(), T, qi.get());
    rope_rows(qi.get(), Hi, di, false);
    b.indexer_fp4_sim(qi.get(), T * Hi, di);
    b.linear(ix.weights_proj, Compute::bf16, x, T, wts.get());
    b.scale(wts.get(), T * Hi, float(std::pow(double(di), -0.5) * std::pow(double(Hi), -0.5)));
    trace(tracer, l + ".attn.indexer.q", qi.get(), {T, Hi, di});
    trace(tracer, l + ".attn.indexer.weights", wts.get(), {T, Hi});
  }
  // CSA and HCA: the main compressor's projections.
  CompressorInput comp_in;
  if (aw.compressor) comp_in = project_compressor(b, *aw.compressor, x, T);

  Buffer o(b, size_t(T * H * hd));
  for (const Segment& s : segments) {
    LayerState& ls = s.seq->layer(lw.il);
    const int64_t n = s.n, p0 = s.p0;
    CompressedRows comp;
    IdBuffer selected;
    if (aw.indexer) {
      const model::CompressorWeights& icw = aw.indexer->compressor;
      push_compressor(b, icw, index_in, s.row0, n, p0, ls.index_compressor, ls.index_keys,
                      [&](const float* pooled, int64_t m, int64_t pos0, float* rows) {
                        b.rms_norm(pooled, icw.norm.data(), m, di, eps, rows);
                        b.rope(rows, m, 1, di, rope, pos0, icw.ratio, false);
                        b.indexer_fp4_sim(rows, m, di);
                      });
      selected = IdBuffer(b, size_t(n * c.index_topk));
      b.indexer_select(qi.get() + s.row0 * Hi * di, wts.get() + s.row0 * Hi, n, Hi, di, ls.index_keys.data(),
                       ls.index_keys.format(), ls.index_keys.rows(), 4, p0, c.index_topk, selected.get());
      comp.idx = selected.get();
      comp.k = c.index_topk;
    }
    if (aw.compressor) {
      const model::CompressorWeights& cw = *aw.compressor;
      push_compressor(b, cw, comp_in, s.row0, n, p0, ls.compressor, ls.compressed,
                      [&](const float* pooled, int64_t m, int64_t pos0, float* rows) {
                        b.kv_norm_rope_fp8(pooled, cw.norm.data(), m, hd, eps, rope, pos0, cw.ratio,
                                           c.nope_head_dim(), rows);
                      });
      comp.kv = ls.compressed.data();
      comp.format = ls.compressed.format();
      comp.n = ls.compressed.rows();
      comp.ratio = aw.compressor->ratio;
    }

    // The window: older rows from the ring, then this segment's rows.
    const int64_t W = c.sliding_window, first_pos = std::max<int64_t>(0, p0 - (W - 1));
    const float* kv_seg = kv.get() + s.row0 * hd;
    Buffer window(b, size_t((p0 - first_pos + n) * hd));
    b.swa_gather(ls.ring.get(), W, hd, first_pos, p0, window.get());
    b.copy(window.get() + (p0 - first_pos) * hd, kv_seg, size_t(n * hd));
    SwaRows swa{window.get(), first_pos, p0 - first_pos + n, W};

    b.attention(q.get() + s.row0 * H * hd, n, H, hd, p0, swa, comp, aw.sink.data(),
                float(1.0 / std::sqrt(double(hd))), o.get() + s.row0 * H * hd);
    b.swa_store(ls.ring.get(), W, hd, kv_seg, p0, n);
  }
  // V = K carries rope on its last dims: rotate the output back at the query position.
  rope_rows(o.get(), H, hd, true);
  trace(tracer, l + ".attn.o", o.get(), {T, H, hd});

  // Grouped output projection: group g maps its heads' concatenated outputs through rows
  // [g·o_lora, (g+1)·o_lora) of wo_a (a bf16 product in the reference), then wo_b mixes the groups.
  const int64_t G = c.o_groups, R = c.o_lora_rank;
  Buffer z(b, size_t(T * G * R)), out(b, size_t(T * D));
  b.grouped_linear(aw.wo_a, Compute::bf16, o.get(), T, G, z.get());
  b.linear(aw.wo_b, Compute::quantized, z.get(), T, out.get());
  trace(tracer, l + ".attn.out", out.get(), {T, D});
  return out;
}

}  // namespace dsv4::engine
