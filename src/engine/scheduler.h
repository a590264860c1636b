// The continuous-batching scheduler: one engine thread owns the Engine and runs every admitted
// request together. Each step takes every running decode (one token each) plus prefill chunks up
// to a token budget, as one forward_batch; finished and cancelled sequences free their state at
// once, and queued requests are admitted as soon as there is room. With speculative decoding a
// decode also feeds its draft token, and emits one or two tokens.
//
// Admission is by memory: each request reserves the state its prompt plus max_tokens can grow to
// (memory_plan.h), and the reservations of running requests plus the step's activations stay
// within the budget. The queue in front is bounded; a full queue refuses at once (unavailable).
//
// Preemption (optional): when the next request in line cannot be admitted, a sequence that has run
// long enough since it was admitted is parked: its state goes to a state file (state_file.h) and
// its memory is freed. Parked sequences resume, in the order they were parked, before any queued
// request is admitted, and continue bit-identically (a state file holds the state exactly). So
// one long request (a million-token context holds gigabytes of state) cannot hold the server
// for its whole length.
//
// Callers (the HTTP handlers) submit from any thread and read tokens from the request's
// RequestStream; cancel() from any thread stops the request at the next step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/state_file.h"

namespace dsv4::engine {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  int64_t top_logprobs = -1;  // < 0: no logprobs; else the chosen token's and this many alternatives
  // Test-only (serve --test-force-output): emit these tokens, then EOS, instead of sampling.
  std::vector<int32_t> forced_output;
};

struct TokenEvent {
  int32_t id = 0;
  Logprobs logprobs;  // filled when the request asked for logprobs
};

enum class FinishReason { stop, length, cancelled, error };

struct Finished {
  FinishReason reason = FinishReason::stop;
  std::string error;            // reason == error
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;    // prompt tokens restored from the prefix cache
  int64_t completion_tokens = 0;
};

// One request's channel from the engine thread to its reader.
class RequestStream {
 public:
  struct Update {
    std::vector<TokenEvent> tokens;
    std::optional<Finished> finished;  // set once, after the last token
  };
  // Returns what arrived since the last call, waiting up to `timeout` when nothing has.
  Update wait(std::chrono::milliseconds timeout);
  // Stops the request at the engine's next step and frees its state (the client left, or a stop
  // string matched). Safe from any thread, any number of times.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void push(TokenEvent event);
  void finish(Finished finished);

  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<TokenEvent> tokens_;
  std::optional<Finished> finished_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int64_t max_seqs = 8;         // sequences decoding at once
  int64_t max_queue = 128;      // requests waiting for admission
  int64_t prefill_chunk = 256;  // prompt tokens per step, over all prefilling sequences
  int64_t context = 0;          // tokens per sequence (prompt + output); 0: the model's limit
  size_t memory_budget_bytes = size_t(4) << 30;  // sequence state + one step's activations
  size_t prefix_cache_bytes = size_t(512) << 20;
  int64_t snapshot_interval = 256;  // prefill positions where the prefix cache keeps state
  int64_t preempt_after_steps = 0;  // steps a sequence runs before it may be parked; 0: never
  std::string swap_dir;             // where parked state goes; empty: the system's temporary directory
  // Speculative decoding (engine/decode.h): each decode step also feeds the MTP block's draft of
  // the token after and keeps it when sampling picks it. The tokens are those without it.
  bool speculative = false;
  // Test-only: the draft from what the sequence was fed (ending with the token the draft follows)
  // and the MTP block's logits, instead of their argmax.
  std::function<int32_t(std::span<const int32_t> fed, std::span<const float> draft_logits)> choose_draft;
};

struct SchedulerStats {
  int64_t running = 0, queued = 0;
  int64_t parked = 0;             // preempted, their state in files
  int64_t preemptions = 0;        // since start
  int64_t drafted = 0, accepted = 0;  // speculative draft tokens fed since start, and kept
  size_t state_bytes = 0;         // state of live sequences
  size_t reserved_bytes = 0;      // what admission reserved for them
  size_t prefix_cache_bytes = 0;
  int64_t prefix_cache_entries = 0;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const MemoryPlan& plan, SchedulerOptions options);
  ~Scheduler();  // cancels what is left and joins the engine thread

  // Queues a request. Throws dsv4::Error: invalid_input when it can never fit (longer than the
  // context, more state than the whole budget); unavailable when the queue is full or draining.
  std::shared_ptr<RequestStream> submit(GenerationRequest request);

  // Refuses new requests from now on and waits until every queued and running one has finished,
  // or cancels them once `grace` has passed.
  void drain(std::chrono::milliseconds grace);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Pending {
    std::shared_ptr<RequestStream> stream;
    GenerationRequest request;
    size_t reserve_bytes;
  };
  struct Sequence;

  using Running = std::vector<std::unique_ptr<Sequence>>;
  void run();
  void admit(Running& running);
  // Parks the fewest sequences (longest-running since admission first, each having run
  // preempt_after_steps) that leave room for `need` more reserved bytes and one more sequence;
  // false, parking none, when that is not possible.
  bool make_room(Running& running, size_t& reserved, size_t budget, size_t need);
  // The first parked sequence back into `running` (or finished with an error if its file fails).
  void resume(Running& running, size_t& reserved);
  // Finishes parked sequences whose client left (all of them when stopping), deleting their files.
  void drop_cancelled_parked();
  void step(Running& running);
  // Speculative: the MTP block's drafts for every decoding sequence with positions to draft from,
  // in one pass; each draft is appended to `fed` (the step feeds it after the next token).
  void draft_all(Running& running);
  // The first position after `at` where a prefill chunk stops for a snapshot: every
  // snapshot_interval tokens and one token before the prompt's end (capped at the prompt's end).
  int64_t next_snapshot(int64_t at, int64_t n_prompt) const;
  // Samples (or forces) the next token from `logits` and reports it; false when the sequence ends.
  bool emit_token(Sequence& seq, std::span<const float> logits);
  void finish(Sequence& seq, FinishReason reason, std::string error = {});
  size_t reserve_bytes(const GenerationRequest& request) const;

  Engine& engine_;
  MemoryPlan plan_;
  SchedulerOptions options_;
  int32_t eos_;
  size_t workspace_bytes_;
  PrefixCache prefix_cache_;  // engine thread only
  StateFingerprint fingerprint_;                 // of parked state files
  std::deque<std::unique_ptr<Sequence>> parked_;  // engine thread only, in parking order
  int64_t preemptions_ = 0;
  int64_t drafted_ = 0, accepted_ = 0;
  int64_t swap_files_ = 0;                       // names them

  mutable std::mutex mutex_;
  std::condition_variable wake_;      // the engine thread: new work or stopping
  std::condition_variable idle_;      // drain(): everything finished
  std::deque<Pending> queue_;
  bool accepting_ = true;
  std::atomic<bool> stopping_{false};  // read by the engine thread between steps
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace dsv4::engine
