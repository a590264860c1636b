// dsv4 bench: prefill and decode speed on a checkpoint or on synthetic weights at real shapes
// (issue 4). Reports prefill tokens/s per prompt length, decode tokens/s per context length, the
// weight bytes a decoded token reads and the fraction of the memory bandwidth that makes, and
// the fraction of the FP8 tensor-core peak that prefill reaches; appends JSON lines on request.
//
// A context is reached by really prefilling it (in chunks of --chunk tokens): decode at context C
// starts from the state C prompt tokens left. With --fill-state a context beyond --fill-prefix
// tokens is reached by prefilling --fill-prefix tokens and repeating the compressed rows and
// indexer keys that left up to C (SequenceState::repeat_to): decode then reads a state of C's
// size, for timing decode at contexts whose prefill takes too long; those rows say so
// ("state": "filled") and report no prefill speed.
//
// Each decode row also reports the sequence's state bytes, and the state the whole model (all
// layers of the preset or checkpoint) would hold at that context in the same layout.
//
// --resume FILE prefills the longest prompt over several runs (cli/resumable_prefill.h): each run
// stops after --time-limit seconds of prefill and saves the state to FILE; the run that finishes
// reports the prefill speed over all runs, then decodes. For prompts whose prefill outlasts one
// command (a 1M-token prompt on a lent GPU).
//
// --speculative also times speculative decoding's step at each context (batch 1): the MTP block's
// draft, then the token and its draft in one forward. Random weights make the drafts wrong, so the
// figure is the step's cost; the tokens/s it would give at acceptance rates a trained model's MTP
// block reaches are printed beside the plain decode.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include <unistd.h>

#include "cli/common.h"
#include "cli/resumable_prefill.h"
#include "core/error.h"
#include "engine/decode.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/sampler.h"
#include "engine/state_file.h"
#include "model/synthetic.h"

#ifndef DSV4_COMMIT
#define DSV4_COMMIT "unknown"
#endif

namespace dsv4::cli {
namespace {

struct BenchOptions {
  std::string model, synthetic;
  int64_t layers = 0;
  uint64_t seed = 1;
  std::string device = "cpu";
  std::string numerics = "deepseek";
  std::string state_layout;  // empty: the numerics' default
  std::string prompt_lens = "512";
  std::string contexts = "4096";
  int64_t decode_tokens = 32;
  int64_t batch = 1;  // sequences decoding together at each context
  bool fill_state = false;
  int64_t fill_prefix = 4096;
  int64_t chunk = 0;  // 0: the device's default
  std::string json;
  bool profile = false;
  bool kernels = false;
  bool speculative = false;
  std::string resume;       // the longest prompt's prefill resumes from and pauses into this state file
  double time_limit_s = 0;  // with resume: seconds of prefill per run (0: no limit)
  // $DSV4_COMMIT first: the configure-time commit is stale after later commits, and a copy of the
  // tree on another machine may carry stale git metadata.
  std::string commit = std::getenv("DSV4_COMMIT") ? std::getenv("DSV4_COMMIT") : DSV4_COMMIT;
  double hbm_bytes_per_s = 4.8e12;  // H200 datasheet
  double fp8_flops = 1.979e15;      // H200 dense FP8 tensor-core datasheet peak
};

std::vector<int64_t> parse_lengths(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  if (text.empty() || text == "none") return out;
  for (int32_t v : parse_token_list(text)) {
    if (v < 1) fail(ErrorCode::invalid_input, "{}: lengths must be at least 1", what);
    out.push_back(v);
  }
  return out;
}

// What one decoded token reads of the weights: every dense matrix and vector of each layer, the
// shared expert, k routed experts (their mean size), the embedding row, the final mixing and the
// head. MTP layers are not run. Returns {bytes, weight elements} (elements: for FLOPs).
struct TokenCost {
  double bytes = 0, elements = 0;
  void add(const model::Linear& W) { bytes += double(W.bytes()), elements += double(W.out * W.in); }
  void add(const std::vector<float>& v) { bytes += double(v.size() * sizeof(float)); }
  void add(const model::HcParams& hc) { add(hc.fn), add(hc.base), add(hc.scale); }
  void add(const model::CompressorWeights& c) { add(c.wkv), add(c.wgate), add(c.ape), add(c.norm); }
};

TokenCost decode_cost(const model::ModelConfig& c, const model::Weights& w) {
  TokenCost cost;
  cost.bytes += double(w.embed.bytes()) / double(w.embed.out);  // one row
  cost.add(w.head), cost.add(w.norm), cost.add(w.hc_head);
  for (const model::LayerWeights& l : w.layers) {
    cost.add(l.hc_attn), cost.add(l.hc_ffn), cost.add(l.attn_norm), cost.add(l.ffn_norm);
    const model::AttentionWeights& a = l.attn;
    for (const model::Linear* W : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b}) cost.add(*W);
    cost.add(a.sink), cost.add(a.q_norm), cost.add(a.kv_norm);
    if (a.compressor) cost.add(*a.compressor);
    if (a.indexer) cost.add(a.indexer->wq_b), cost.add(a.indexer->weights_proj), cost.add(a.indexer->compressor);
    const model::MoeWeights& m = l.ffn;
    cost.add(m.gate), cost.add(m.bias);
    if (!m.tid2eid.empty()) cost.bytes += double(c.n_experts_per_tok * sizeof(int32_t));
    if (m.shared) cost.add(m.shared->w1), cost.add(m.shared->w2), cost.add(m.shared->w3);
    TokenCost experts;
    for (const model::ExpertWeights& e : m.experts) experts.add(e.w1), experts.add(e.w2), experts.add(e.w3);
    const double share = double(c.n_experts_per_tok) / double(std::max<size_t>(m.experts.size(), 1));
    cost.bytes += experts.bytes * share, cost.elements += experts.elements * share;
  }
  return cost;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(2, int32_t(vocab - 1));  // past BOS/EOS
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

// --kernels: the decode GEMV alone, on one large matrix per weight format (random codes), at
// T = 1: many products queued back to back, so the GPU never waits for the host, and the
// bytes of weights read per second against the memory bandwidth.
void bench_kernels(engine::Engine& eng, const model::Linear& embed, const BenchOptions& o,
                   std::vector<nlohmann::ordered_json>& rows) {
  Backend& b = eng.backend();
  const int64_t K = embed.in, reps = 50;
  std::mt19937_64 rng(o.seed);
  Buffer x(b, size_t(K)), y(b, size_t(65536));
  IdBuffer id(b, 1);
  const int32_t token = 7;
  b.ids_from_host(id.get(), &token, 1);
  b.embed(embed, id.get(), 1, 1, x.get());  // a realistic bf16 activation row
  struct Case {
    const char* what;
    model::WeightFormat format;
    Compute compute;
    int64_t out;
  };
  for (const Case& c : {Case{"fp8 quantized", model::WeightFormat::fp8, Compute::quantized, 32768},
                        Case{"fp4 quantized", model::WeightFormat::fp4, Compute::quantized, 65536},
                        Case{"bf16 f32", model::WeightFormat::bf16, Compute::f32, 32768}}) {
    model::Linear W;
    W.name = c.what, W.format = c.format, W.out = c.out, W.in = K;
    const bool fp4 = c.format == model::WeightFormat::fp4, quant = c.format != model::WeightFormat::bf16;
    std::vector<uint8_t> data(size_t(fp4 ? c.out * K / 2 : quant ? c.out * K : 2 * c.out * K));
    // Random codes; FP8 without the NaN code 0x7f, bf16 without huge exponents.
    const uint8_t mask = c.format == model::WeightFormat::fp8 ? 0xfe : fp4 ? 0xff : 0xbf;
    for (uint8_t& v : data) v = uint8_t(rng()) & mask;
    std::vector<uint8_t> scale;
    if (quant) {
      W.scale_cols = fp4 ? K / 32 : (K + 127) / 128;
      scale.assign(size_t((fp4 ? c.out : (c.out + 127) / 128) * W.scale_cols), uint8_t(120));
      W.scale = scale.data();
    }
    W.data = data.data();
    std::vector<float> sink(1);
    b.linear(W, c.compute, x.get(), 1, y.get());  // uploads the matrix
    b.to_host(sink.data(), y.get(), 1);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < reps; ++i) b.linear(W, c.compute, x.get(), 1, y.get());
    b.to_host(sink.data(), y.get(), 1);
    const double s = seconds_since(t0);
    const double bw = double(W.bytes()) * double(reps) / s;
    fmt::print("kernel {:<14} {:>6}x{:<5} {:>7.1f} MB  {:>7.1f} us/product  {:>6.0f} GB/s  HBM frac {:.3f}\n", c.what,
               c.out, K, double(W.bytes()) / 1e6, 1e6 * s / double(reps), bw / 1e9, bw / o.hbm_bytes_per_s);
    rows.push_back({{"phase", "kernel"}, {"kernel", c.what}, {"rows", c.out}, {"cols", K}, {"tokens", 1},
                    {"weight_bytes", W.bytes()}, {"seconds_per_product", s / double(reps)}, {"bytes_per_s", bw},
                    {"hbm_bytes_per_s", o.hbm_bytes_per_s}, {"hbm_fraction", bw / o.hbm_bytes_per_s}});
  }
}

// Speculative decoding's step, timed over `steps` steps from a drafting copy of `seq`'s state: the
// draft, and the forward of the chosen token with it (the draft taken back when it is not chosen).
struct SpeculativeTiming {
  double draft_s = 0, verify_s = 0;
  int64_t accepted = 0;
};

SpeculativeTiming time_speculative(engine::Engine& eng, const engine::SequenceState& seq, int32_t first,
                                   int64_t steps) {
  engine::SequenceState spec = eng.new_sequence(true);
  spec.restore(seq.snapshot());
  int32_t next = first;
  next = engine::argmax(eng.forward(spec, std::span<const int32_t>(&next, 1), false));  // a position to draft from
  SpeculativeTiming t;
  for (int64_t i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const int32_t draft = engine::argmax(eng.draft(spec, next));
    t.draft_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    const engine::UndoPoint undo = spec.undo_point(spec.n_past + 1);
    const int32_t fed[2] = {next, draft};
    const engine::DraftOutcome r =
        engine::settle_draft(spec, undo, draft, eng.forward(spec, fed, true), [&](std::span<const float> row) {
          next = engine::argmax(row);
          return std::pair{next, true};
        });
    t.accepted += r.accepted;
    t.verify_s += seconds_since(t0);
  }
  return t;
}

int run_bench(BenchOptions o) {
  if (o.model.empty() == o.synthetic.empty())
    fail(ErrorCode::invalid_input, "bench: give exactly one of --model DIR and --synthetic v4-flash|v4-pro");
  if (o.batch < 1) fail(ErrorCode::invalid_input, "bench: --batch {}: at least one sequence", o.batch);
  if (o.speculative && o.batch != 1) fail(ErrorCode::invalid_input, "bench: --speculative times batch 1 only");
  const std::vector<int64_t> prompt_lens = parse_lengths(o.prompt_lens, "--prompt-lens");
  if (!o.resume.empty() && prompt_lens.empty())
    fail(ErrorCode::invalid_input, "bench: --resume prefills the longest of --prompt-lens, and there is none");
  if (o.time_limit_s != 0 && o.resume.empty())
    fail(ErrorCode::invalid_input, "bench: --time-limit pauses a --resume prefill; give --resume FILE");
  if (o.time_limit_s < 0) fail(ErrorCode::invalid_input, "bench: --time-limit {}: seconds, at least 0", o.time_limit_s);
  const std::vector<int64_t> contexts = parse_lengths(o.contexts, "--contexts");

  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<engine::Model> model;
  model::ModelConfig full_config;  // all layers: for the whole model's state at each context
  std::string model_name = o.model;
  const Numerics numerics = parse_numerics(o.numerics);
  const StateLayout layout = state_layout_option(o.state_layout, numerics);
  std::unique_ptr<Backend> backend = engine::make_backend(o.device, numerics);
  // The plan is printed, and checked against the device, before any weight is made or uploaded.
  int64_t longest = 1;
  for (int64_t n : prompt_lens) longest = std::max(longest, n);
  for (int64_t n : contexts) longest = std::max(longest, n + o.decode_tokens);
  auto check_plan = [&](const model::ModelConfig& config, size_t stored_bytes) {
    if (o.chunk <= 0)
      o.chunk = engine::choose_chunk(config, layout, backend->device_memory_free(), 1, longest,
                                     default_chunk(o.device));
    const engine::MemoryPlan plan = engine::plan_memory(config, stored_bytes, o.chunk, layout, o.speculative);
    fmt::print(stderr, "{}", plan.describe(longest));
    // --speculative: a drafting copy of the sequence beside it
    engine::require_fits(plan, backend->device_memory_free(), backend->name(), o.batch + (o.speculative ? 1 : 0),
                         longest);
  };
  if (!o.synthetic.empty()) {
    std::string text = model::preset_config(o.synthetic);
    if (o.layers > 0) text = model::with_layers(text, o.layers);
    const model::ModelConfig config = model::parse_config(text, o.synthetic);
    full_config = model::parse_config(model::preset_config(o.synthetic), o.synthetic);
    const size_t stored = model::expected_bytes(config, true);
    check_plan(config, stored);
    // Synthetic weights are made in host memory: refuse clearly instead of failing an allocation.
    const size_t host_free = size_t(sysconf(_SC_AVPHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
    if (stored > host_free)
      fail(ErrorCode::out_of_memory,
           "synthetic {} ({} layers): {:.1f} GB of weights are made in host memory, which has {:.1f} GB free; "
           "use --layers N",
           o.synthetic, config.n_layers, double(stored) / 1e9, double(host_free) / 1e9);
    model = engine::Model::from_checkpoint(config, model::synthetic_checkpoint(text, o.seed));
    model_name = fmt::format("synthetic {} ({} layers, seed {})", o.synthetic, model->config().n_layers, o.seed);
  } else {
    model = engine::Model::load(o.model);
    check_plan(model->config(), model->checkpoint().total_bytes());
    full_config = model->config();
  }
  const model::ModelConfig& c = model->config();
  const TokenCost cost = decode_cost(c, model->weights());
  const std::string hardware = engine::device_name(o.device);
  fmt::print(stderr, "{}: {} layers, {:.2f} GB of weights, ready in {:.1f} s\n", model_name, c.n_layers,
             double(model->checkpoint().total_bytes()) / 1e9, seconds_since(t0));
  fmt::print(stderr, "device {} ({}), numerics {}, prefill chunk {}, decode batch {}\n", o.device, hardware,
             o.numerics, o.chunk, o.batch);
  fmt::print(stderr, "a decoded token reads {:.3f} GB of weights ({:.2f} G weights)\n", cost.bytes / 1e9,
             cost.elements / 1e9);

  engine::Engine eng(*model, std::move(backend), layout);
  {  // warm-up: a device backend uploads each weight on its first use (the MTP block's on its first
     // draft), loads a kernel on its first launch and plans a product per shape (cuBLASLt), so each
     // chunk size the timed prompts will use runs once first: their figures are not the setup's
     // (while a 4K prompt paid them, it spread over 37 000–47 000 tok/s in one H200 session)
    t0 = std::chrono::steady_clock::now();
    engine::SequenceState seq = eng.new_sequence(o.speculative);
    eng.prefill(seq, random_ids(2, c.vocab_size, o.seed), o.chunk, false);
    if (o.speculative) eng.draft(seq, 0);
    std::vector<int64_t> shapes;
    for (int64_t n : prompt_lens) {
      shapes.push_back(std::min(n, o.chunk));
      if (n > o.chunk && n % o.chunk) shapes.push_back(n % o.chunk);  // the last chunk
    }
    std::sort(shapes.begin(), shapes.end());
    shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
    for (int64_t n : shapes) {
      engine::SequenceState warm = eng.new_sequence();
      eng.prefill(warm, random_ids(n, c.vocab_size, o.seed + 1), o.chunk, false);
    }
    fmt::print(stderr, "warm-up (weights to the device, prefill chunks of {} tokens): {:.1f} s\n",
               fmt::join(shapes, ", "), seconds_since(t0));
    eng.backend().restart_profile();
  }

  nlohmann::ordered_json base = {{"command", "dsv4 bench"}, {"model", model_name}, {"layers", c.n_layers},
                                 {"device", o.device}, {"hardware", hardware}, {"numerics", o.numerics}, {"state_layout", to_string(layout)},
                                 {"commit", o.commit}, {"chunk", o.chunk}};
  std::vector<nlohmann::ordered_json> rows;
  auto report = [&](nlohmann::ordered_json row) {
    nlohmann::ordered_json full = base;
    full.update(row);
    rows.push_back(full);
  };

  if (o.kernels) {
    std::vector<nlohmann::ordered_json> kernel_rows;
    bench_kernels(eng, model->weights().embed, o, kernel_rows);
    for (auto& row : kernel_rows) report(row);
  }

  std::vector<int64_t> lengths = prompt_lens;
  lengths.insert(lengths.end(), contexts.begin(), contexts.end());
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  fmt::print("{:>9} {:>12} {:>10} {:>12} {:>10} {:>10} {:>11} {:>11}\n", "context", "prefill t/s", "fp8 frac",
             "decode t/s", "GB/s", "HBM frac", "state MiB", fmt::format("{}L GiB", full_config.n_layers));
  const engine::MemoryPlan full_plan = engine::plan_memory(full_config, 0, o.chunk, layout);
  const int64_t resumed_len = o.resume.empty() ? 0 : *std::max_element(prompt_lens.begin(), prompt_lens.end());
  for (int64_t n : lengths) {
    const bool is_prompt = std::find(prompt_lens.begin(), prompt_lens.end(), n) != prompt_lens.end();
    const bool filled = o.fill_state && !is_prompt && n > o.fill_prefix;
    engine::SequenceState seq = eng.new_sequence();
    const std::vector<int32_t> prompt = random_ids(filled ? o.fill_prefix : n, c.vocab_size, o.seed + uint64_t(n));
    std::vector<float> logits;
    double prefill_s = 0;
    int64_t prefill_runs = 1;  // runs the prefill took (--resume)
    if (n == resumed_len) {
      const ResumablePrefill r{o.resume, engine::state_fingerprint(c, model->weights(), numerics, layout), o.chunk,
                               o.time_limit_s};
      PrefillOutcome done = prefill_resumable(eng, seq, prompt, r);
      if (!done.logits) break;  // paused: the longer lengths wait for the prompt too
      logits = std::move(*done.logits);
      prefill_s = done.seconds;
      prefill_runs = done.runs;
    } else {
      t0 = std::chrono::steady_clock::now();
      logits = eng.prefill(seq, prompt, o.chunk, false);
      prefill_s = seconds_since(t0);
    }
    if (filled) seq.repeat_to(n);
    const double prefill_tps = filled ? 0.0 : double(n) / prefill_s;
    const double fp8_frac = 2.0 * cost.elements * prefill_tps / o.fp8_flops;
    if (is_prompt)
      report({{"phase", "prefill"}, {"prompt_tokens", n}, {"seconds", prefill_s}, {"tok_s", prefill_tps},
              {"weight_flops_per_token", 2.0 * cost.elements}, {"fp8_peak_flops", o.fp8_flops},
              {"fp8_peak_fraction", fp8_frac}, {"runs", prefill_runs}});
    double decode_tps = 0, bw = 0;
    if (std::find(contexts.begin(), contexts.end(), n) != contexts.end() && o.decode_tokens > 0) {
      // --batch B: B sequences at this context decode together, one forward_batch per step, so a
      // step reads the weights once for B tokens. The others start as copies of this one's state.
      std::vector<engine::SequenceState> copies;
      copies.reserve(size_t(o.batch - 1));
      if (o.batch > 1) {
        const engine::StateSnapshot snapshot = seq.snapshot();
        for (int64_t b = 1; b < o.batch; ++b) copies.push_back(eng.new_sequence()), copies.back().restore(snapshot);
      }
      std::vector<engine::SequenceState*> seqs = {&seq};
      for (engine::SequenceState& s : copies) seqs.push_back(&s);
      std::vector<int32_t> next(size_t(o.batch), engine::argmax(logits));
      const std::optional<engine::StateSnapshot> before =
          o.speculative ? std::optional(seq.snapshot()) : std::nullopt;  // where the speculative steps start
      // --profile: the CUDA backend's per-op table covers decode at the largest context only.
      if (o.profile && n == *std::max_element(contexts.begin(), contexts.end())) setenv("DSV4_CUDA_PROFILE", "1", 1);
      const double wait0 = eng.backend().host_wait_seconds();
      const Backend::CaptureStats graphs0 = eng.backend().capture_stats();
      t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < o.decode_tokens; ++i) {
        std::vector<engine::Step> steps;
        for (size_t b = 0; b < seqs.size(); ++b) steps.push_back({seqs[b], std::span<const int32_t>(&next[b], 1)});
        const std::vector<std::vector<float>> out = eng.forward_batch(steps);
        for (size_t b = 0; b < seqs.size(); ++b) next[b] = engine::argmax(out[b]);
      }
      const double decode_s = seconds_since(t0);
      const double wait_s = eng.backend().host_wait_seconds() - wait0;
      // Steps run as CUDA graphs, and the executable graphs made for them (the others were updated).
      const int64_t graph_steps = eng.backend().capture_stats().steps - graphs0.steps;
      const int64_t graph_instantiations = eng.backend().capture_stats().instantiated - graphs0.instantiated;
      const double steps_per_s = double(o.decode_tokens) / decode_s;
      decode_tps = double(o.batch) * steps_per_s;
      bw = cost.bytes * steps_per_s;  // the weights are read once per step
      report({{"phase", "decode"}, {"context_tokens", n}, {"state", filled ? "filled" : "prefilled"}, {"batch", o.batch},
              {"decode_tokens", o.decode_tokens}, {"seconds", decode_s}, {"tok_s", decode_tps},
              {"weight_bytes_per_token", cost.bytes}, {"bytes_per_s", bw}, {"hbm_bytes_per_s", o.hbm_bytes_per_s},
              {"hbm_fraction", bw / o.hbm_bytes_per_s}, {"state_bytes", seq.bytes()},
              {"state_bytes_all_layers", full_plan.state_bytes(n + o.decode_tokens)},
              {"all_layers", full_config.n_layers}, {"host_wait_s", wait_s}, {"graph_steps", graph_steps},
              {"graph_instantiations", graph_instantiations}});
      // A step takes the host's queueing, then what the device has left (the wait): with little
      // wait the host bounds the step, and faster kernels do not show.
      if (wait_s > 0)
        fmt::print(stderr,
                   "decode at {}: {:.2f} ms per step, the host busy {:.2f} ms and waiting for the device {:.2f}; {} of "
                   "{} steps as CUDA graphs, {} made\n",
                   n, 1e3 / steps_per_s, 1e3 * (decode_s - wait_s) / double(o.decode_tokens),
                   1e3 * wait_s / double(o.decode_tokens), graph_steps, o.decode_tokens, graph_instantiations);
      if (o.speculative) {
        engine::SequenceState start = eng.new_sequence();
        start.restore(*before);
        const SpeculativeTiming t = time_speculative(eng, start, engine::argmax(logits), o.decode_tokens);
        const double step_s = (t.draft_s + t.verify_s) / double(o.decode_tokens), plain_s = 1.0 / steps_per_s;
        nlohmann::ordered_json at;
        std::string line;
        for (double a : {0.7, 0.8, 0.9}) {
          at[fmt::format("{:.1f}", a)] = (1.0 + a) / step_s;
          line += fmt::format(", {:.0f}% accepted {:.1f} tok/s", 100 * a, (1.0 + a) / step_s);
        }
        fmt::print(stderr,
                   "speculative at {}: draft {:.2f} ms + two-token step {:.2f} ms (plain step {:.2f} ms){}; "
                   "{} of {} random-weight drafts accepted\n",
                   n, 1e3 * t.draft_s / double(o.decode_tokens), 1e3 * t.verify_s / double(o.decode_tokens),
                   1e3 * plain_s, line, t.accepted, o.decode_tokens);
        report({{"phase", "speculative"}, {"context_tokens", n}, {"state", filled ? "filled" : "prefilled"},
                {"steps", o.decode_tokens}, {"draft_s", t.draft_s}, {"verify_s", t.verify_s},
                {"plain_step_s", plain_s}, {"accepted", t.accepted}, {"tok_s_at_acceptance", at}});
      }
    }
    fmt::print("{:>9} {:>12} {:>10} {:>12} {:>10} {:>10} {:>11} {:>11}\n", n,
               filled ? "filled" : fmt::format("{:.1f}", prefill_tps), filled ? "-" : fmt::format("{:.4f}", fp8_frac),
               decode_tps > 0 ? fmt::format("{:.1f}", decode_tps) : "-", bw > 0 ? fmt::format("{:.0f}", bw / 1e9) : "-",
               bw > 0 ? fmt::format("{:.3f}", bw / o.hbm_bytes_per_s) : "-", fmt::format("{:.1f}", seq.bytes() / 1048576.0),
               fmt::format("{:.2f}", double(full_plan.state_bytes(n)) / 1073741824.0));
    std::fflush(stdout);
  }
  fmt::print(stderr, "fractions against {:.2f} TB/s HBM and {:.0f} TFLOP/s dense FP8 (H200 datasheet)\n",
             o.hbm_bytes_per_s / 1e12, o.fp8_flops / 1e12);
  if (!o.json.empty()) {
    std::ofstream f(o.json, std::ios::app);
    if (!f) fail(ErrorCode::invalid_input, "{}: cannot append", o.json);
    for (const auto& row : rows) f << row.dump() << "\n";
  }
  return 0;
}

const bool bench_registered = register_command({"bench", "Prefill and decode speed, bytes per token, bandwidth fraction",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<BenchOptions>();
      app.add_option("--model", o->model, "checkpoint folder");
      app.add_option("--synthetic", o->synthetic, "v4-flash | v4-pro: random weights at real shapes, in memory");
      app.add_option("--layers", o->layers, "synthetic: keep the first N layers");
      app.add_option("--seed", o->seed, "synthetic weights and prompt ids")->capture_default_str();
      app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
      app.add_option("--numerics", o->numerics, "deepseek | plain | deepseek-tc (GPU: FP8 tensor-core prefill products)")->capture_default_str();
      app.add_option("--state-layout", o->state_layout, kStateLayoutHelp);
      app.add_option("--prompt-lens", o->prompt_lens, "prompt lengths to time prefill on, e.g. 512,8192 (or none)")
          ->capture_default_str();
      app.add_option("--contexts,--context", o->contexts, "context lengths to decode at, e.g. 4096,131072 (or none)")
          ->capture_default_str();
      app.add_flag("--fill-state", o->fill_state,
                   "reach contexts beyond --fill-prefix by repeating the rows of a --fill-prefix prefill (times "
                   "decode only)");
      app.add_option("--fill-prefix", o->fill_prefix, "tokens really prefilled with --fill-state")->capture_default_str();
      app.add_option("--decode-tokens", o->decode_tokens, "tokens decoded at each context")->capture_default_str();
      app.add_option("--batch", o->batch,
                     "sequences decoding together at each context (decode t/s counts all of them; GB/s the weights "
                     "read per second)")
          ->capture_default_str();
      app.add_option("--chunk", o->chunk, chunk_help());
      app.add_option("--json", o->json, "append one JSON line per measurement to this file");
      app.add_flag("--profile", o->profile,
                   "cuda: GPU time per op class while decoding at the largest context, printed at the end (each "
                   "op is waited for: the tok/s of that context is then not a speed figure)");
      app.add_flag("--kernels", o->kernels, "also time the decode GEMV alone on one large FP8, FP4 and BF16 matrix");
      app.add_option("--resume", o->resume,
                     "prefill the longest --prompt-lens over several runs: its state is saved to and resumed from "
                     "this file");
      app.add_option("--time-limit", o->time_limit_s, "with --resume: pause after this many seconds of prefill");
      app.add_flag("--speculative", o->speculative,
                   "also time speculative decoding's step (MTP draft + two-token forward) at each context, batch 1");
      app.add_option("--commit", o->commit, "commit to record (default: $DSV4_COMMIT, else the build's)")->capture_default_str();
      app.add_option("--hbm-bytes-per-s", o->hbm_bytes_per_s, "memory bandwidth the fraction is taken of")
          ->capture_default_str();
      app.add_option("--fp8-flops", o->fp8_flops, "FP8 tensor-core peak the prefill fraction is taken of")
          ->capture_default_str();
      return [o] { return run_bench(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
