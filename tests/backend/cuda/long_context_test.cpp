// Long context on the GPU, on the tiny-flash fixture model (issues 4 and 6).
//  - To 131 072 tokens: a token decoded at 8K, 32K and 128K gets logits bit-identical to one-shot
//    prefill of the same tokens, and the sequence state grows only by the compressed rows (one per
//    4 or 128 tokens) and the indexer keys (one per 4): the ring and the carries stay their size.
//  - To 262 144 tokens in prefill chunks, against the CPU reference (the CPU cannot prefill that far
//    in a test's time: its indexer alone is hours at 256K): both backends prefill the first 16K
//    from scratch to bit-identical states and logits; then at 64K, 128K and 256K the CPU resumes
//    from the GPU's state (a state file) and its logits for the next tokens are bit-identical to the
//    GPU's, and the indexer's selections for those queries (the engine's own indexer queries, traced)
//    recomputed on the CPU over the state's 64K keys are the GPU's.
#include <filesystem>
#include <random>

#include "engine/engine.h"
#include "engine/state_file.h"
#include "../../engine/fixtures.h"
#include "twin.h"

namespace dsv4::test {

using engine::Engine;
using engine::LayerSnapshot;
using engine::LayerState;
using engine::Model;
using engine::SequenceState;

TEST(CudaLongContext, DecodeAt8K32K128KMatchesOneShotPrefill) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const model::ModelConfig& c = model->config();
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(131072);
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(c.vocab_size));

  Engine gpu(*model, make_cuda_backend(Numerics::deepseek));
  SequenceState seq = gpu.new_sequence();  // grows mark by mark: prefill to mark − 1, decode one
  size_t fixed_bytes = 0;
  for (int64_t mark : {8192, 32768, 131072}) {
    const std::span<const int32_t> prefix(tokens.data(), size_t(mark));
    SequenceState one = gpu.new_sequence();
    const std::vector<float> one_shot = gpu.forward(one, prefix, false);
    gpu.prefill(seq, prefix.subspan(size_t(seq.n_past), size_t(mark - 1 - seq.n_past)), 4096, false);
    const std::vector<float> decoded = gpu.forward(seq, prefix.subspan(size_t(mark - 1), 1), false);
    ASSERT_EQ(decoded.size(), one_shot.size());
    const int64_t same = identical(decoded, one_shot);
    float max_abs = 0.0f;
    for (size_t i = 0; i < decoded.size(); ++i) max_abs = std::max(max_abs, std::fabs(decoded[i] - one_shot[i]));
    std::printf("[ long     ] decode at %lld vs one-shot prefill: %lld/%zu logits bit-identical, max|d| %g\n",
                static_cast<long long>(mark), static_cast<long long>(same), decoded.size(), double(max_abs));
    EXPECT_EQ(same, int64_t(decoded.size())) << "at " << mark << " tokens";

    size_t fixed = 0;
    for (size_t il = 0; il < seq.layers.size(); ++il) {
      const LayerState& ls = seq.layers[il];
      const int ratio = c.ratio(int64_t(il));
      EXPECT_EQ(ls.compressed.rows(), ratio ? mark / ratio : 0) << "layer " << il << " at " << mark;
      EXPECT_EQ(ls.index_keys.rows(), ratio == 4 ? mark / 4 : 0) << "layer " << il << " at " << mark;
      fixed += (ls.ring.size() + ls.compressor.a.size() + ls.compressor.s.size() + ls.index_compressor.a.size() +
                ls.index_compressor.s.size()) * sizeof(float);
    }
    if (fixed_bytes == 0) fixed_bytes = fixed;
    EXPECT_EQ(fixed, fixed_bytes) << "the ring and the carries must not grow with the context";
    std::printf("[ long     ] state at %lld tokens: %zu bytes (fixed part %zu)\n", static_cast<long long>(mark),
                seq.bytes(), fixed);
  }
}

// The first buffer (layer and name) where two sequences' states differ in any bit, or "".
std::string state_difference(Engine& a, const SequenceState& sa, Engine& b, const SequenceState& sb) {
  const engine::StateSnapshot x = sa.snapshot(), y = sb.snapshot();
  if (x.n_past != y.n_past) return "positions";
  auto host = [](Engine& e, const Buffer& buf) {
    std::vector<float> v(buf.size());
    if (!v.empty()) e.backend().to_host(v.data(), buf.get(), v.size());
    return v;
  };
  for (size_t il = 0; il < x.layers.size(); ++il) {
    const LayerSnapshot &lx = x.layers[il], &ly = y.layers[il];
    if (lx.n_compressed != ly.n_compressed || lx.n_index_keys != ly.n_index_keys)
      return "layer " + std::to_string(il) + " row counts";
    const std::pair<const char*, Buffer LayerSnapshot::*> buffers[] = {
        {"ring", &LayerSnapshot::ring},
        {"compressed rows", &LayerSnapshot::compressed},
        {"indexer keys", &LayerSnapshot::index_keys},
        {"compressor carry a", &LayerSnapshot::compressor_a},
        {"compressor carry s", &LayerSnapshot::compressor_s},
        {"indexer compressor carry a", &LayerSnapshot::index_compressor_a},
        {"indexer compressor carry s", &LayerSnapshot::index_compressor_s}};
    for (const auto& [name, member] : buffers) {
      const std::vector<float> hx = host(a, lx.*member), hy = host(b, ly.*member);
      if (hx.size() != hy.size() || identical(hx, hy) != int64_t(hx.size()))
        return "layer " + std::to_string(il) + " " + name;
    }
  }
  return "";
}

TEST(CudaLongContext, ChunkedPrefillTo256KMatchesTheCpu) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const model::ModelConfig& c = model->config();
  constexpr int64_t kFromScratch = 16384, kNext = 16, kChunk = 2048;
  const std::vector<int64_t> marks = {65536, 131072, 262144};
  std::mt19937 rng(11);
  std::vector<int32_t> tokens(size_t(marks.back() + kNext));
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(c.vocab_size));
  const std::span<const int32_t> all(tokens);
  const engine::StateFingerprint fingerprint =
      engine::state_fingerprint(c, model->weights(), Numerics::deepseek, StateLayout::compact);
  const std::filesystem::path path = std::filesystem::path(testing::TempDir()) / "cuda_long_context_state.bin";

  Engine gpu(*model, make_cuda_backend(Numerics::deepseek));
  Engine cpu(*model, make_cpu_backend(Numerics::deepseek));
  SequenceState seq = gpu.new_sequence();
  {
    SequenceState ref = cpu.new_sequence();
    const std::vector<float> want = cpu.prefill(ref, all.first(kFromScratch), kChunk, false);
    const std::vector<float> got = gpu.prefill(seq, all.first(kFromScratch), kChunk, false);
    EXPECT_EQ(identical(got, want), int64_t(want.size())) << "logits at " << kFromScratch;
    EXPECT_EQ(state_difference(gpu, seq, cpu, ref), "") << "states at " << kFromScratch;
  }

  for (const int64_t mark : marks) {
    gpu.prefill(seq, all.subspan(size_t(seq.n_past), size_t(mark - seq.n_past)), kChunk, false);
    engine::save_state(path, fingerprint, all.first(size_t(mark)), seq.snapshot(), gpu.backend());
    // The GPU goes on, tracing the indexer's inputs of the next tokens.
    std::map<std::string, std::vector<float>> indexer_inputs;
    const engine::Tracer tracer = [&](const std::string& name, const std::vector<int64_t>&, const float* data) {
      if (name.find(".attn.indexer.") == std::string::npos) return;
      const size_t n = name.ends_with(".q") ? size_t(kNext * c.index_n_heads * c.index_head_dim)
                                            : size_t(kNext * c.index_n_heads);
      indexer_inputs[name].assign(data, data + n);
    };
    const std::vector<float> want = gpu.forward(seq, all.subspan(size_t(mark), size_t(kNext)), true, &tracer);
    SequenceState resumed = cpu.new_sequence();
    resumed.restore(engine::load_state(path, fingerprint, cpu.backend()).snapshot);
    const std::vector<float> got = cpu.forward(resumed, all.subspan(size_t(mark), size_t(kNext)), true);
    const int64_t same = identical(got, want);
    std::printf("[ long     ] %lld tokens, GPU chunks of %lld: the CPU resumed from the GPU state, %lld/%zu logits "
                "of the next %lld tokens bit-identical\n",
                static_cast<long long>(mark), static_cast<long long>(kChunk), static_cast<long long>(same),
                want.size(), static_cast<long long>(kNext));
    EXPECT_EQ(same, int64_t(want.size())) << "at " << mark;

    // The indexer's selections for those queries, over each CSA layer's keys as they were.
    for (size_t il = 0; il < seq.layers.size(); ++il) {
      if (c.ratio(int64_t(il)) != 4) continue;
      const std::string l = "l" + std::to_string(il);  // the engine's trace names
      const std::vector<float>&q = indexer_inputs.at(l + ".attn.indexer.q"),
                           &wts = indexer_inputs.at(l + ".attn.indexer.weights");
      // The keys as the engine's call saw them: the CPU's copy after the same kNext tokens.
      const engine::RowStore& keys = resumed.layers[il].index_keys;
      const int64_t n_keys = keys.rows();
      std::vector<float> host_keys(size_t(n_keys * keys.format().stride));
      cpu.backend().to_host(host_keys.data(), keys.data(), host_keys.size());
      expect_twins(l + " indexer selections at " + std::to_string(mark), Numerics::deepseek, [&](Side& s) {
        int32_t* idx = s.ids_out(size_t(kNext * c.index_topk));
        s->indexer_select(s.in(q), s.in(wts), kNext, c.index_n_heads, c.index_head_dim, s.in(host_keys),
                          keys.format(), n_keys, 4, mark, c.index_topk, idx);
        Outputs o;
        o.add("idx", s.read_ids(idx, size_t(kNext * c.index_topk)));
        return o;
      });
    }
  }
  std::filesystem::remove(path);
}

}  // namespace dsv4::test
