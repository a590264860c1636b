#include "server/http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <random>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/transcript.h"

namespace dsv4::server {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds a read or a write may block: generation can take long between a request and its first
// byte, and a slow reader must not hold a thread (or shutdown) for ever.
constexpr int kReadTimeoutS = 30, kWriteTimeoutS = 30;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string new_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}", prefix, rng());
}

// Model output is valid UTF-8 by construction (StreamDecoder); replace, never throw, regardless.
std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const ordered_json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status(), e.body()); }

std::string sse(const ordered_json& event) { return "data: " + dump(event) + "\n\n"; }

// The prompt must leave room for the answer; worded as OpenAI words it.
ApiError context_exceeded(int64_t context, int64_t prompt, int64_t max_tokens) {
  return ApiError(400,
                  fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                              "({} in the prompt, {} for the completion).",
                              context, prompt + max_tokens, prompt, max_tokens),
                  "messages", "context_length_exceeded");
}

}  // namespace

Server::Server(engine::Scheduler& scheduler, const tk::Tokenizer& tokenizer, tk::ChatVariant variant,
               const model::ModelConfig& config, ServerOptions options)
    : scheduler_(scheduler),
      tokenizer_(tokenizer),
      variant_(variant),
      config_(config),
      options_(std::move(options)),
      http_(std::make_unique<httplib::Server>()),
      started_(unix_now()) {
  route();
}

Server::~Server() = default;

bool Server::bind() {
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of clients (64 connecting at once)
  // overflows it and the kernel resets some connections. Listen again with the system's maximum.
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  port_ = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                             : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ > 0 && listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  return port_ > 0;
}

void Server::serve() { http_->listen_after_bind(); }

void Server::stop() {
  // Each remaining write ends within the write timeout, so this wait is bounded by it.
  std::unique_lock lock(responses_mutex_);
  responses_closed_.wait_for(lock, std::chrono::seconds(kWriteTimeoutS), [&] { return open_responses_ == 0; });
  lock.unlock();
  http_->stop();
}

std::shared_ptr<void> Server::hold_response() {
  std::lock_guard lock(responses_mutex_);
  ++open_responses_;
  return std::shared_ptr<void>(nullptr, [this](void*) {
    std::lock_guard lock(responses_mutex_);
    if (--open_responses_ == 0) responses_closed_.notify_all();
  });
}

void Server::route() {
  httplib::Server& h = *http_;
  const int threads = options_.http_threads;
  h.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  h.set_payload_max_length(options_.max_body_bytes);
  h.set_read_timeout(kReadTimeoutS, 0);
  h.set_write_timeout(kWriteTimeoutS, 0);

  // Every handler runs inside the same wrapper: API key, error mapping, request counting.
  auto handle = [this](std::string endpoint, bool needs_key,
                       std::function<void(const httplib::Request&, httplib::Response&)> f) {
    return [this, endpoint, needs_key, f](const httplib::Request& req, httplib::Response& res) {
      try {
        if (needs_key && !options_.api_key.empty() &&
            req.get_header_value("Authorization") != "Bearer " + options_.api_key)
          throw ApiError(401, "Incorrect API key provided.", {}, "invalid_api_key");
        f(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, ApiError::from_error(e));
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
      }
      metrics_.count_request(endpoint, res.status);
    };
  };

  h.Post("/v1/chat/completions", handle("/v1/chat/completions", true, [this](const auto& req, auto& res) {
    chat_completions(req, res);
  }));
  h.Post("/v1/completions", handle("/v1/completions", true, [this](const auto& req, auto& res) {
    completions(req, res);
  }));
  auto model_card = [this] {
    return ordered_json{{"id", options_.model_id}, {"object", "model"}, {"created", started_}, {"owned_by", "dsv4"},
                        {"max_model_len", scheduler_.options().context}};
  };
  h.Get("/v1/models", handle("/v1/models", true, [model_card](const auto&, auto& res) {
    send_json(res, 200, {{"object", "list"}, {"data", ordered_json::array({model_card()})}});
  }));
  h.Get(R"(/v1/models/(.+))", handle("/v1/models", true, [this, model_card](const auto& req, auto& res) {
    if (req.matches[1] != options_.model_id)
      throw ApiError(404, "The model `" + std::string(req.matches[1]) + "` does not exist", "model", "model_not_found");
    send_json(res, 200, model_card());
  }));
  h.Get("/health", handle("/health", false, [this](const auto&, auto& res) {
    if (draining_) throw ApiError(503, "shutting down");
    send_json(res, 200, {{"status", "ok"}});
  }));
  h.Get("/metrics", handle("/metrics", false, [this](const auto&, auto& res) {
    res.set_content(metrics_.render(scheduler_.stats()), "text/plain; version=0.0.4");
  }));

  // What no handler answered (unknown routes, bodies over the limit, bad requests that httplib
  // itself refused) still gets an OpenAI error body.
  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = res.status == 404   ? "Unknown endpoint: " + req.method + " " + req.path
                          : res.status == 413 ? "The request body is over the size limit"
                                              : std::string("HTTP ") + std::to_string(res.status);
    send_error(res, ApiError(res.status, message));
  });
}

void Server::chat_completions(const httplib::Request& req, httplib::Response& res) {
  ChatRequest r = parse_chat_request(parse_body(req.body), options_.model_id, variant_);
  tk::ChatOptions chat;
  chat.thinking = r.thinking;
  chat.reasoning_effort = r.reasoning_effort;
  chat.variant = variant_;
  const bool tools_on = r.tool_choice.mode != ToolChoice::Mode::none;
  std::vector<int32_t> prompt;
  try {
    prompt = tk::render_prompt(std::move(r.messages), tools_on ? r.tools : ordered_json(nullptr), chat).encode(tokenizer_);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages");
  }

  // tool_choice required / named: the answer starts inside a tool-call block, written here and
  // parsed as if the model had written it (no constrained decoding needed for the opening).
  ChatTranscriptOptions t{r.thinking, {}, r.options.stop, r.options.top_logprobs >= 0};
  if (r.tool_choice.mode == ToolChoice::Mode::required || r.tool_choice.mode == ToolChoice::Mode::named) {
    const std::string open = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
    const std::string name = r.tool_choice.mode == ToolChoice::Mode::named ? r.tool_choice.name : "";
    const std::string close = r.tool_choice.mode == ToolChoice::Mode::named ? "\">\n" : "";
    t.forced_prefix = open + name + close;
    // The markup may become control tokens, the tool's name may not.
    const tk::TextRange markup[] = {{0, open.size()}, {open.size() + name.size(), t.forced_prefix.size()}};
    const std::vector<int32_t> ids = tokenizer_.encode_with_control_ranges(t.forced_prefix, markup);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  generate(req, res, "chat.completion", std::move(prompt), r.options, make_chat_transcript(tokenizer_, std::move(t)));
}

void Server::completions(const httplib::Request& req, httplib::Response& res) {
  CompletionRequest r = parse_completion_request(parse_body(req.body), options_.model_id);
  std::vector<int32_t> prompt = r.prompt_text ? tokenizer_.encode(*r.prompt_text, false) : r.prompt_ids;
  generate(req, res, "text_completion", std::move(prompt), r.options,
           make_completion_transcript(tokenizer_, r.options.stop, r.options.top_logprobs >= 0, r.tokens_as_ids));
}

void Server::generate(const httplib::Request& req, httplib::Response& res, const std::string& object,
                      std::vector<int32_t> prompt, const GenerationOptions& options,
                      std::unique_ptr<Transcript> transcript) {
  const Clock::time_point arrived = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= config_.vocab_size)
      throw ApiError(400, fmt::format("prompt[{}] = {}: outside the vocabulary [0, {})", i, prompt[i], config_.vocab_size),
                     "prompt");
  if (prompt.empty()) throw ApiError(400, "the prompt is empty", "prompt");
  const int64_t context = scheduler_.options().context, n_prompt = int64_t(prompt.size());
  const int64_t max_tokens = options.max_tokens.value_or(std::max<int64_t>(context - n_prompt, 1));
  if (n_prompt + max_tokens > context) throw context_exceeded(context, n_prompt, max_tokens);

  engine::GenerationRequest g;
  g.prompt = std::move(prompt);
  g.sampling = options.sampling;
  if (!options.seeded) g.sampling.seed = std::random_device{}() * 0x9e3779b97f4a7c15ull + std::random_device{}();
  g.max_tokens = max_tokens;
  g.top_logprobs = options.top_logprobs;
  g.forced_output = options_.forced_output;
  std::shared_ptr<engine::RequestStream> stream = scheduler_.submit(std::move(g));

  // The state one response's tokens go through, shared by the stream callbacks.
  struct Exchange {
    // Keeps stop() waiting. A streamed response holds it until its last chunk is written (the
    // chunk loop ends when the listener stops); a whole body is written regardless of stop().
    std::shared_ptr<void> open;
    std::shared_ptr<engine::RequestStream> stream;
    std::unique_ptr<Transcript> transcript;
    ordered_json envelope;
    Clock::time_point arrived, first_token, last_token, last_write;
    int64_t n_tokens = 0;
    bool opened = false, finished = false;

    // Feeds the update's tokens to the transcript; returns the streamed choices.
    std::vector<ordered_json> take(const engine::RequestStream::Update& update) {
      std::vector<ordered_json> choices;
      for (const engine::TokenEvent& e : update.tokens) {
        last_token = Clock::now();
        if (n_tokens++ == 0) first_token = last_token;
        ordered_json c = transcript->on_token(e);
        if (!c.is_null()) choices.push_back(std::move(c));
        if (transcript->stopped()) stream->cancel();
      }
      return choices;
    }
    // A stop string cancels the request: that is a normal end. Any other cancel is the shutdown.
    std::optional<ApiError> failure(const engine::Finished& f) const {
      if (f.reason == engine::FinishReason::error) return ApiError(500, "generation failed: " + f.error);
      if (f.reason == engine::FinishReason::cancelled && !transcript->stopped())
        return ApiError(503, "the request was cancelled: the server is shutting down");
      return std::nullopt;
    }
  };
  auto ex = std::make_shared<Exchange>();
  ex->open = hold_response();
  ex->stream = stream;
  ex->transcript = std::move(transcript);
  ex->envelope = {{"id", new_id(object == "text_completion" ? "cmpl-" : "chatcmpl-")},
                  {"object", object},
                  {"created", unix_now()},
                  {"model", options_.model_id}};
  ex->arrived = arrived;
  auto record = [this](const Exchange& e, const engine::Finished& f) {
    metrics_.count_tokens(f.prompt_tokens, f.cached_tokens, f.completion_tokens);
    if (e.n_tokens > 0) metrics_.observe_ttft(std::chrono::duration<double>(e.first_token - e.arrived).count());
    if (e.n_tokens > 1)
      metrics_.observe_tpot(std::chrono::duration<double>(e.last_token - e.first_token).count() / double(e.n_tokens - 1));
  };

  if (!options.stream) {
    std::optional<engine::Finished> finished;
    while (!finished) {
      engine::RequestStream::Update update = stream->wait(std::chrono::milliseconds(1000));
      ex->take(update);
      finished = update.finished;
    }
    record(*ex, *finished);
    if (auto error = ex->failure(*finished)) throw *error;
    ex->transcript->on_finish(*finished);
    ordered_json body = ex->envelope;
    body["choices"] = ordered_json::array({ex->transcript->final_choice()});
    body["usage"] = ex->transcript->usage(*finished);
    send_json(res, 200, body);
    return;
  }

  const bool include_usage = options.include_usage;
  res.status = 200;  // the headers go out before the first token
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [ex, include_usage, record](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto write = [&](const std::string& text) {
          ok = ok && sink.write(text.data(), text.size());
          ex->last_write = Clock::now();
        };
        auto chunk = [&](ordered_json choice) {
          ordered_json c = ex->envelope;
          c["object"] = c["object"].get<std::string>() == "chat.completion" ? "chat.completion.chunk" : "text_completion";
          c["choices"] = choice.is_null() ? ordered_json::array() : ordered_json::array({std::move(choice)});
          if (include_usage) c["usage"] = nullptr;
          return c;
        };
        if (!ex->opened) {
          ex->opened = true;
          if (ordered_json opening = ex->transcript->opening(); !opening.is_null()) write(sse(chunk(opening)));
        }
        const engine::RequestStream::Update update = ex->stream->wait(std::chrono::milliseconds(250));
        for (ordered_json& choice : ex->take(update)) write(sse(chunk(std::move(choice))));
        if (update.finished) {
          ex->finished = true;
          const engine::Finished& f = *update.finished;
          record(*ex, f);
          if (auto error = ex->failure(f)) {
            write(sse(error->body()));
          } else {
            write(sse(chunk(ex->transcript->on_finish(f))));
            if (include_usage) {
              ordered_json last = chunk(nullptr);
              last["usage"] = ex->transcript->usage(f);
              write(sse(last));
            }
          }
          write("data: [DONE]\n\n");
          if (ok) sink.done();
        } else if (Clock::now() - ex->last_write > std::chrono::milliseconds(500)) {
          write(": keep-alive\n\n");  // finds a client that has gone while nothing was sent
        }
        return ok;
      },
      [ex](bool) {
        if (!ex->finished) ex->stream->cancel();
      });
}

}  // namespace dsv4::server
