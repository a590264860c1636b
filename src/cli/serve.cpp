// dsv4 serve: the OpenAI-compatible server (src/server/http.h) over the continuous-batching
// scheduler (src/engine/scheduler.h). The weights load and a warm-up step runs before the port
// opens; SIGTERM or SIGINT stops new requests, lets the in-flight ones finish (or fails them after
// --shutdown-grace), and exits 0.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/common.h"
#include "core/error.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/scheduler.h"
#include "server/http.h"

namespace dsv4::cli {
namespace {

namespace tk = dsv4::tokenizer;

struct ServeOptions {
  std::string model = default_chat_model_dir();
  std::string tokenizer;
  std::string served_name;
  std::string numerics = "deepseek";
  std::string state_layout;  // empty: the numerics' default
  std::string device = "cpu";
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int64_t max_seqs = 8;
  int64_t max_queue = 128;
  int64_t ctx = 65536;
  int64_t prefill_chunk = 256;
  int64_t memory_mb = 0;
  int64_t prefix_cache_mb = 512;
  int64_t preempt_after_steps = 0;
  std::string swap_dir;
  bool speculative = false;
  int64_t max_body_mb = 8;
  double shutdown_grace_s = 30;
  std::string test_force_output;
};

std::string folder_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorCode::not_found, "{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run_serve(const ServeOptions& o) {
  // Signals go to one waiting thread: block them before any other thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not end the process

  auto model = engine::Model::load(o.model);
  const model::ModelConfig& c = model->config();
  const tk::Tokenizer tok = tk::Tokenizer::load(find_tokenizer(o.model, o.tokenizer));
  if (tok.vocab_size() > c.vocab_size)
    fail(ErrorCode::invalid_input, "{}: vocabulary of {} tokens, the tokenizer has {}: not a chat model", o.model,
         c.vocab_size, tok.vocab_size());
  const Numerics numerics = parse_numerics(o.numerics);
  const StateLayout layout = state_layout_option(o.state_layout, numerics);
  const engine::MemoryPlan plan =
      engine::plan_memory(c, model->checkpoint().total_bytes(), o.prefill_chunk, layout, o.speculative);
  std::unique_ptr<Backend> backend = engine::make_backend(o.device, numerics);
  const size_t device_free = backend->device_memory_free();  // 0: host memory, not checked
  const int64_t context = std::min(o.ctx, c.max_position_embeddings);
  engine::require_fits(plan, device_free, backend->name(), 1, context);  // one full-context sequence
  // The admission budget: what the device has left after the weights, unless given.
  size_t memory_budget = size_t(o.memory_mb) << 20;
  if (o.memory_mb == 0) memory_budget = device_free > 0 ? device_free - plan.running_weight_bytes : size_t(4) << 30;
  engine::Engine eng(*model, std::move(backend), layout);
  {  // warm-up: one short step, so the first request does not pay for first-use setup
    engine::SequenceState seq = eng.new_sequence();
    const int32_t ids[] = {int32_t(c.bos_token_id), 0};
    eng.forward(seq, ids, false);
  }

  engine::SchedulerOptions so;
  so.max_seqs = o.max_seqs;
  so.max_queue = o.max_queue;
  so.context = context;
  so.prefill_chunk = o.prefill_chunk;
  so.memory_budget_bytes = memory_budget;
  so.prefix_cache_bytes = size_t(o.prefix_cache_mb) << 20;
  so.preempt_after_steps = o.preempt_after_steps;
  so.swap_dir = o.swap_dir;
  so.speculative = o.speculative;
  engine::Scheduler scheduler(eng, plan, so);

  server::ServerOptions sv;
  sv.host = o.host;
  sv.port = o.port;
  sv.api_key = o.api_key;
  sv.model_id = o.served_name.empty() ? folder_name(o.model) : o.served_name;
  sv.max_body_bytes = size_t(o.max_body_mb) << 20;
  sv.http_threads = int(o.max_seqs + o.max_queue + 8);
  if (!o.test_force_output.empty()) sv.forced_output = tok.encode(read_file(o.test_force_output), true);
  server::Server server(scheduler, tok, tk::detect_chat_variant(o.model), c, sv);
  if (!server.bind()) fail(ErrorCode::unavailable, "cannot listen on {}:{}", o.host, o.port);
  fmt::print(stderr, "dsv4 serve: {} ({} layers, vocab {}, context {}), max {} sequences\n", sv.model_id, c.n_layers,
             c.vocab_size, scheduler.options().context, o.max_seqs);
  fmt::print(stderr, "dsv4 serve: listening on http://{}:{}\n", o.host, server.port());

  std::atomic<bool> served{false};
  std::thread on_signal([&] {
    const timespec poll{0, 200'000'000};
    while (!served) {
      siginfo_t info;
      if (sigtimedwait(&stop_signals, &info, &poll) < 0) continue;
      fmt::print(stderr, "dsv4 serve: {}: finishing in-flight requests\n", info.si_signo == SIGTERM ? "SIGTERM" : "SIGINT");
      server.begin_drain();
      scheduler.drain(std::chrono::milliseconds(int64_t(o.shutdown_grace_s * 1000)));
      server.stop();
      return;
    }
  });
  server.serve();
  served = true;
  on_signal.join();
  fmt::print(stderr, "dsv4 serve: stopped\n");
  return 0;
}

const bool serve_registered = register_command({"serve", "OpenAI-compatible HTTP server with continuous batching",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<ServeOptions>();
      app.add_option("--model", o->model, "checkpoint folder (default: the demo chat model, random weights)")
          ->capture_default_str();
      app.add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: MODEL/tokenizer.json)");
      app.add_option("--served-model-name", o->served_name, "the model id clients use (default: the folder name)");
      app.add_option("--host", o->host)->capture_default_str();
      app.add_option("--port", o->port, "0: any free port (printed)")->capture_default_str();
      app.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
      app.add_option("--max-seqs", o->max_seqs, "sequences decoding at once")->capture_default_str();
      app.add_option("--max-queue", o->max_queue, "requests waiting for admission")->capture_default_str();
      app.add_option("--ctx", o->ctx, "tokens per sequence, prompt + output (capped at the model's limit)")
          ->capture_default_str();
      app.add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per step")->capture_default_str();
      app.add_option("--memory-mb", o->memory_mb,
                     "budget for sequence state + a step's activations (0: the GPU's free memory after the "
                     "weights, 4096 on the CPU)")
          ->capture_default_str();
      app.add_option("--prefix-cache-mb", o->prefix_cache_mb, "budget for prefix-reuse snapshots")
          ->capture_default_str();
      app.add_flag("--speculative", o->speculative,
                   "speculative decoding with the MTP block's drafts: the same tokens in fewer steps");
      app.add_option("--preempt-after-steps", o->preempt_after_steps,
                     "when a request waits for room, park sequences that have run this many steps: their state "
                     "goes to a file in --swap-dir and they resume, bit-identically, before the queue (0: never)")
          ->capture_default_str();
      app.add_option("--swap-dir", o->swap_dir, "where parked sequences' state goes (default: the temporary directory)");
      app.add_option("--max-body-mb", o->max_body_mb, "largest request body")->capture_default_str();
      app.add_option("--shutdown-grace", o->shutdown_grace_s, "seconds in-flight requests get after SIGTERM")
          ->capture_default_str();
      app.add_option("--numerics", o->numerics, "deepseek | plain | deepseek-tc (GPU: FP8 tensor-core prefill products)")->capture_default_str();
      app.add_option("--state-layout", o->state_layout, kStateLayoutHelp);
      app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
      // Test-only: every generation emits the tokens of FILE's text, then EOS (the tool-call
      // round-trip test forces DSML through the real parser this way). Hidden from --help.
      app.add_option("--test-force-output", o->test_force_output)->group("");
      return [o] { return run_serve(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
