#include "engine/scheduler.h"

#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"
#include "engine/decode.h"

namespace dsv4::engine {

// ---- RequestStream ---------------------------------------------------------------------------------

RequestStream::Update RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !tokens_.empty() || finished_; });
  Update update;
  update.tokens.swap(tokens_);
  if (finished_) update.finished = std::move(finished_);
  finished_.reset();
  return update;
}

void RequestStream::push(TokenEvent event) {
  std::lock_guard lock(mutex_);
  tokens_.push_back(std::move(event));
  ready_.notify_all();
}

void RequestStream::finish(Finished finished) {
  std::lock_guard lock(mutex_);
  finished_ = std::move(finished);
  ready_.notify_all();
}

// ---- Scheduler -------------------------------------------------------------------------------------

// A running request: its state, what it has been fed, and where it stands.
struct Scheduler::Sequence {
  Sequence(Pending pending, SequenceState fresh)
      : stream(std::move(pending.stream)),
        request(std::move(pending.request)),
        reserve_bytes(pending.reserve_bytes),
        state(std::move(fresh)),
        sampler(request.sampling) {}

  std::shared_ptr<RequestStream> stream;
  GenerationRequest request;
  size_t reserve_bytes;
  std::optional<SequenceState> state;  // none while parked
  Sampler sampler;
  std::vector<int32_t> fed;  // exactly the tokens `state` holds
  int64_t cached_tokens = 0;
  int64_t n_generated = 0;
  int32_t next_token = -1;  // sampled, to be fed at the next step
  int32_t draft = -1;       // speculative: fed after next_token this step, kept if it is chosen
  std::optional<UndoPoint> undo;  // taking the draft back
  int64_t steps_since_admission = 0;  // steps run since it was admitted or resumed
  std::filesystem::path swap_file;    // parked: the state is here
  bool done = false;

  bool prefilling() const { return int64_t(fed.size()) < int64_t(request.prompt.size()); }
};

Scheduler::Scheduler(Engine& engine, const MemoryPlan& plan, SchedulerOptions options)
    : engine_(engine),
      plan_(plan),
      options_(options),
      eos_(int32_t(engine.config().eos_token_id)),
      prefix_cache_(options.prefix_cache_bytes) {
  const model::ModelConfig& c = engine.config();
  if (options_.preempt_after_steps > 0) {
    fingerprint_ = state_fingerprint(c, engine.weights(), engine.backend().numerics(), engine.state_layout());
    if (options_.swap_dir.empty()) options_.swap_dir = std::filesystem::temp_directory_path().string();
    std::error_code error;
    std::filesystem::create_directories(options_.swap_dir, error);
    if (error || !std::filesystem::is_directory(options_.swap_dir))
      fail(ErrorCode::invalid_input, "swap directory {}: cannot be created ({})", options_.swap_dir, error.message());
  }
  if (options_.context <= 0 || options_.context > c.max_position_embeddings) options_.context = c.max_position_embeddings;
  options_.max_seqs = std::max<int64_t>(options_.max_seqs, 1);
  options_.prefill_chunk = std::max<int64_t>(options_.prefill_chunk, 1);
  // A step's rows: every decode plus the prefill budget.
  const MemoryPlan step_plan = plan_memory(c, plan.weight_bytes, options_.prefill_chunk + options_.max_seqs, plan.layout);
  workspace_bytes_ = step_plan.activation_bytes;
  if (workspace_bytes_ >= options_.memory_budget_bytes)
    fail(ErrorCode::invalid_input, "memory budget of {} bytes: one step's activations alone take {}",
         options_.memory_budget_bytes, workspace_bytes_);
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
    stopping_ = true;
    for (Pending& p : queue_) p.stream->cancel();
  }
  wake_.notify_all();
  thread_.join();
}

size_t Scheduler::reserve_bytes(const GenerationRequest& r) const {
  const int64_t n = std::min<int64_t>(options_.context, int64_t(r.prompt.size()) + r.max_tokens);
  return plan_.state_bytes(n);
}

std::shared_ptr<RequestStream> Scheduler::submit(GenerationRequest request) {
  const int64_t n_prompt = int64_t(request.prompt.size());
  if (n_prompt == 0) fail(ErrorCode::invalid_input, "the prompt is empty");
  if (n_prompt >= options_.context)
    fail(ErrorCode::invalid_input, "the prompt has {} tokens; this server's context is {} (prompt plus at least "
         "one generated token)", n_prompt, options_.context);
  if (request.max_tokens < 1) fail(ErrorCode::invalid_input, "max_tokens must be at least 1");
  const size_t reserve = reserve_bytes(request);
  if (reserve > options_.memory_budget_bytes - workspace_bytes_)
    fail(ErrorCode::invalid_input, "the request needs {} bytes of sequence state; the server's budget is {}",
         reserve, options_.memory_budget_bytes - workspace_bytes_);
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) fail(ErrorCode::unavailable, "the server is shutting down");
    if (int64_t(queue_.size()) >= options_.max_queue)
      fail(ErrorCode::unavailable, "the queue is full ({} requests waiting); retry later", queue_.size());
    queue_.push_back({stream, std::move(request), reserve});
    stats_.queued = int64_t(queue_.size());
  }
  wake_.notify_all();
  return stream;
}

void Scheduler::drain(std::chrono::milliseconds grace) {
  std::unique_lock lock(mutex_);
  accepting_ = false;
  auto idle = [&] { return queue_.empty() && stats_.running == 0; };
  if (idle_.wait_for(lock, grace, idle)) return;
  for (Pending& p : queue_) p.stream->cancel();
  stopping_ = true;  // the engine thread cancels the running ones
  wake_.notify_all();
  idle_.wait(lock, idle);
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Scheduler::run() {
  Running running;
  while (true) {
    admit(running);
    if (running.empty()) {
      std::unique_lock lock(mutex_);
      stats_.running = 0;
      stats_.state_bytes = stats_.reserved_bytes = 0;
      if (stopping_ && queue_.empty()) break;
      if (queue_.empty()) {
        // Freed sequence state sits in malloc's arenas (one per HTTP thread that touched it);
        // hand it back, so an idle server's footprint returns to its baseline.
        malloc_trim(0);
        idle_.notify_all();
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      }
      continue;
    }
    step(running);
  }
  idle_.notify_all();
}

void Scheduler::admit(Running& running) {
  const size_t budget = options_.memory_budget_bytes - workspace_bytes_;
  size_t reserved = 0;
  for (const auto& s : running) reserved += s->reserve_bytes;
  drop_cancelled_parked();
  auto fits = [&](size_t reserve) {
    return int64_t(running.size()) < options_.max_seqs && reserved + reserve <= budget;
  };
  while (true) {
    if (!parked_.empty()) {  // parked sequences come back before any queued request
      const size_t need = parked_.front()->reserve_bytes;
      if (!fits(need) && !make_room(running, reserved, budget, need)) break;
      resume(running, reserved);
      continue;
    }
    bool head_fits = false;
    size_t need = 0;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) break;
      const Pending& front = queue_.front();
      need = front.reserve_bytes;
      head_fits = front.stream->cancelled() || stopping_ || fits(need);
    }
    // First come, first served: no overtaking by smaller requests; the head may make room by
    // parking sequences that have run long enough.
    if (!head_fits && !make_room(running, reserved, budget, need)) break;
    Pending next;
    {
      std::lock_guard lock(mutex_);
      next = std::move(queue_.front());  // still the head: only this thread pops
      queue_.pop_front();
      stats_.queued = int64_t(queue_.size());
      stats_.running = int64_t(running.size() + parked_.size()) + 1;  // drain() must see it somewhere
    }
    if (next.stream->cancelled() || stopping_) {
      next.stream->finish({FinishReason::cancelled, {}, int64_t(next.request.prompt.size()), 0, 0});
      continue;
    }
    auto seq = std::make_unique<Sequence>(std::move(next), engine_.new_sequence(options_.speculative));
    seq->cached_tokens = prefix_cache_.restore_longest_prefix(seq->request.prompt, *seq->state);
    seq->fed.assign(seq->request.prompt.begin(), seq->request.prompt.begin() + seq->cached_tokens);
    reserved += seq->reserve_bytes;
    running.push_back(std::move(seq));
  }
}

bool Scheduler::make_room(Running& running, size_t& reserved, size_t budget, size_t need) {
  if (options_.preempt_after_steps <= 0) return false;
  std::vector<Sequence*> eligible;
  for (const auto& s : running)
    if (s->steps_since_admission >= options_.preempt_after_steps) eligible.push_back(s.get());
  std::stable_sort(eligible.begin(), eligible.end(), [](const Sequence* a, const Sequence* b) {
    return a->steps_since_admission > b->steps_since_admission;
  });
  // The fewest, longest-running first, that leave room; none if even all of them would not.
  int64_t count = int64_t(running.size());
  size_t left = reserved;
  size_t n_park = 0;
  while (n_park < eligible.size() && (count >= options_.max_seqs || left + need > budget)) {
    left -= eligible[n_park++]->reserve_bytes;
    --count;
  }
  if (count >= options_.max_seqs || left + need > budget) return false;
  for (size_t i = 0; i < n_park; ++i) {
    Sequence* s = eligible[i];
    s->swap_file = std::filesystem::path(options_.swap_dir) /
                   fmt::format("dsv4-parked-{}-{}.state", int64_t(getpid()), ++swap_files_);
    try {
      save_state(s->swap_file, fingerprint_, s->fed, s->state->snapshot(), engine_.backend());
    } catch (const std::exception& e) {  // a full disk: it keeps running, and the head waits
      std::filesystem::remove(s->swap_file);
      fmt::print(stderr, "scheduler: could not park a sequence: {}\n", e.what());
      return false;
    }
    s->state.reset();  // frees its memory
    reserved -= s->reserve_bytes;
    ++preemptions_;
    auto it = std::find_if(running.begin(), running.end(), [&](const auto& r) { return r.get() == s; });
    parked_.push_back(std::move(*it));
    running.erase(it);
  }
  return true;
}

void Scheduler::resume(Running& running, size_t& reserved) {
  std::unique_ptr<Sequence> s = std::move(parked_.front());
  parked_.pop_front();
  try {
    SavedState saved = load_state(s->swap_file, fingerprint_, engine_.backend());
    if (saved.tokens != s->fed) fail(ErrorCode::internal, "{} holds other tokens", s->swap_file.string());
    s->state.emplace(engine_.new_sequence(options_.speculative));
    s->state->restore(saved.snapshot);
  } catch (const std::exception& e) {
    std::filesystem::remove(s->swap_file);
    finish(*s, FinishReason::error, fmt::format("resuming a preempted sequence: {}", e.what()));
    return;
  }
  std::filesystem::remove(s->swap_file);
  s->swap_file.clear();
  s->steps_since_admission = 0;
  reserved += s->reserve_bytes;
  running.push_back(std::move(s));
}

void Scheduler::drop_cancelled_parked() {
  std::erase_if(parked_, [&](const std::unique_ptr<Sequence>& s) {
    if (!s->stream->cancelled() && !stopping_) return false;
    std::filesystem::remove(s->swap_file);
    finish(*s, FinishReason::cancelled);
    return true;
  });
}

int64_t Scheduler::next_snapshot(int64_t at, int64_t n_prompt) const {
  const int64_t interval = options_.snapshot_interval, next = (at / interval + 1) * interval;
  // Just before the prompt's end: the same prompt again resumes there (a restore must leave a
  // token to run), and the next chat turn, which extends this prompt, too.
  if (at < n_prompt - 1 && n_prompt - 1 < next) return n_prompt - 1;
  return std::min(next, n_prompt);
}

void Scheduler::step(Running& running) {
  for (auto& s : running)
    if (s->stream->cancelled() || stopping_) finish(*s, FinishReason::cancelled);
  std::erase_if(running, [](const auto& s) { return s->done; });

  // Every decode gets its token; prefills share the chunk budget in admission order. A prefill
  // chunk ends at the next snapshot position (next_snapshot) so the prefix cache can keep the
  // state there.
  std::vector<Step> steps;
  std::vector<Sequence*> stepped;
  std::vector<bool> was_prefill;
  int64_t prefill_budget = options_.prefill_chunk;
  for (auto& s : running)
    if (!s->prefilling()) s->fed.push_back(s->next_token), s->draft = -1;
  if (options_.speculative) draft_all(running);
  for (auto& s : running) {
    if (s->done) continue;  // its draft failed
    if (!s->prefilling()) {
      const size_t n = s->draft >= 0 ? 2 : 1;
      steps.push_back({&*s->state, std::span<const int32_t>(s->fed).last(n), n == 2 ? LogitRows::all : LogitRows::last});
      stepped.push_back(s.get());
      was_prefill.push_back(false);
    } else if (prefill_budget > 0) {
      const int64_t at = int64_t(s->fed.size()), n_prompt = int64_t(s->request.prompt.size()), left = n_prompt - at;
      const int64_t n = std::min({prefill_budget, left, next_snapshot(at, n_prompt) - at});
      prefill_budget -= n;
      const std::span<const int32_t> chunk(s->request.prompt.data() + at, size_t(n));
      s->fed.insert(s->fed.end(), chunk.begin(), chunk.end());
      steps.push_back({&*s->state, chunk, n == left ? LogitRows::last : LogitRows::none});
      stepped.push_back(s.get());
      was_prefill.push_back(true);
    }
  }

  std::vector<std::vector<float>> logits;
  try {
    logits = engine_.forward_batch(steps);
  } catch (const std::exception& e) {
    for (Sequence* s : stepped) finish(*s, FinishReason::error, e.what());
    std::erase_if(running, [](const auto& s) { return s->done; });
    return;
  }

  for (size_t i = 0; i < stepped.size(); ++i) {
    Sequence& s = *stepped[i];
    const int64_t n_fed = int64_t(s.fed.size()), n_prompt = int64_t(s.request.prompt.size());
    if (was_prefill[i] && n_fed < n_prompt && next_snapshot(n_fed - 1, n_prompt) == n_fed)
      prefix_cache_.insert(s.fed, *s.state);
    auto end = [&] { finish(s, s.next_token == eos_ ? FinishReason::stop : FinishReason::length); };
    if (steps[i].logits == LogitRows::none) {
      // A drafting sequence's MTP block keeps up with its prefill (Engine::prefill does the same).
      if (s.state->draft) try {
          engine_.draft(*s.state, s.request.prompt[size_t(n_fed)], LogitRows::none);
        } catch (const std::exception& e) {
          finish(s, FinishReason::error, e.what());
        }
      continue;
    }
    if (s.draft < 0) {
      if (!emit_token(s, logits[i])) end();
      continue;
    }
    const DraftOutcome r = settle_draft(*s.state, *s.undo, s.draft, logits[i], [&](std::span<const float> row) {
      const bool more = emit_token(s, row);
      return std::pair{s.next_token, more};
    });
    accepted_ += r.accepted;
    if (r.undone) s.fed.pop_back();  // fed stays what the state holds
    if (!r.more) end();
  }
  std::erase_if(running, [](const auto& s) { return s->done; });
  for (auto& s : running) ++s->steps_since_admission;

  SchedulerStats st;
  for (const auto& s : running) st.state_bytes += s->state->bytes(), st.reserved_bytes += s->reserve_bytes;
  std::lock_guard lock(mutex_);
  st.running = int64_t(running.size() + parked_.size());
  st.parked = int64_t(parked_.size());
  st.preemptions = preemptions_;
  st.drafted = drafted_, st.accepted = accepted_;
  st.queued = int64_t(queue_.size());
  st.prefix_cache_bytes = prefix_cache_.bytes();
  st.prefix_cache_entries = int64_t(prefix_cache_.entries());
  stats_ = st;
}

void Scheduler::draft_all(Running& running) {
  std::vector<Engine::DraftStep> steps;
  std::vector<Sequence*> drafting;
  for (auto& s : running)
    if (!s->prefilling() && s->state->draft->pending() > 0) {  // none right after a resume
      steps.push_back({&*s->state, s->next_token, LogitRows::last});
      drafting.push_back(s.get());
    }
  if (steps.empty()) return;
  std::vector<std::vector<float>> logits;
  try {
    logits = engine_.draft_batch(steps);
  } catch (const std::exception& e) {
    for (Sequence* s : drafting) finish(*s, FinishReason::error, e.what());
    return;
  }
  // The draft's position is within the request's reservation and the context: a running sequence
  // has generated fewer than max_tokens, and prompt + generated < context.
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& s = *drafting[i];
    s.draft = options_.choose_draft ? options_.choose_draft(s.fed, logits[i]) : argmax(logits[i]);
    s.undo = s.state->undo_point(s.state->n_past + 1);
    s.fed.push_back(s.draft);
    ++drafted_;
  }
}

bool Scheduler::emit_token(Sequence& s, std::span<const float> logits) {
  const std::vector<int32_t>& forced = s.request.forced_output;
  int32_t token;
  if (!forced.empty())
    token = s.n_generated < int64_t(forced.size()) ? forced[size_t(s.n_generated)] : eos_;
  else
    token = s.sampler.sample(logits);
  TokenEvent event{token, {}};
  if (s.request.top_logprobs >= 0) event.logprobs = logprobs_of(logits, token, s.request.top_logprobs);
  s.stream->push(std::move(event));
  s.next_token = token;
  ++s.n_generated;
  const int64_t total = int64_t(s.request.prompt.size()) + s.n_generated;
  return token != eos_ && s.n_generated < s.request.max_tokens && total < options_.context;
}

void Scheduler::finish(Sequence& s, FinishReason reason, std::string error) {
  // The state after the answer: the next chat turn (without thinking) extends exactly this.
  if (reason == FinishReason::stop || reason == FinishReason::length)
    if (s.state && !s.fed.empty() && int64_t(s.fed.size()) == s.state->n_past) prefix_cache_.insert(s.fed, *s.state);
  s.stream->finish({reason, std::move(error), int64_t(s.request.prompt.size()), s.cached_tokens, s.n_generated});
  s.done = true;
}

}  // namespace dsv4::engine
