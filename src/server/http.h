// The OpenAI-compatible HTTP server (cpp-httplib): the route table, API-key check, the one error
// wrapper that turns every failure into an OpenAI error body, and the streaming (SSE) and
// non-streaming drivers that move a request's tokens from the scheduler to the client.
//
//   POST /v1/chat/completions   chat, tools, thinking (openai_request.h), streaming or not
//   POST /v1/completions        text or token-id prompts
//   GET  /v1/models[/{id}]      the one model served (its folder name)
//   GET  /health                200 while serving, 503 while draining
//   GET  /metrics               Prometheus text (metrics.h)
//
// A streaming client that goes away is noticed at the next write (tokens, or a keep-alive comment
// while waiting) and its request is cancelled, which frees its sequence state at the next step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "server/metrics.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace dsv4::server {

namespace tk = dsv4::tokenizer;
struct GenerationOptions;
class Transcript;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                      // empty: no authentication
  std::string model_id;                     // the name clients use (the checkpoint folder's name)
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies get 413
  int http_threads = 64;                    // a streaming request holds one for its whole duration
  // Test-only (serve --test-force-output): every generation emits these tokens, then EOS.
  std::vector<int32_t> forced_output;
};

class Server {
 public:
  Server(engine::Scheduler& scheduler, const tk::Tokenizer& tokenizer, tk::ChatVariant variant,
         const model::ModelConfig& config, ServerOptions options);
  ~Server();

  // Binds the address; false when it cannot (the port is taken).
  bool bind();
  int port() const { return port_; }
  // Serves until stop(); returns after the in-flight handlers have returned.
  void serve();
  // Stops taking requests: /health turns 503, new generations get 503, in-flight ones go on.
  void begin_drain() { draining_ = true; }
  // Waits until every response in flight has been written out (their generations must have ended:
  // drain the scheduler first), then stops listening. Stopping the listener earlier would cut a
  // streamed response short of its last chunk.
  void stop();

 private:
  void route();
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  // Submits the prompt and answers with the transcript's choices, streamed or whole.
  void generate(const httplib::Request& req, httplib::Response& res, const std::string& object,
                std::vector<int32_t> prompt, const GenerationOptions& options, std::unique_ptr<Transcript> transcript);
  // Counts a response as open until the returned handle is released.
  std::shared_ptr<void> hold_response();

  engine::Scheduler& scheduler_;
  const tk::Tokenizer& tokenizer_;
  tk::ChatVariant variant_;
  const model::ModelConfig& config_;
  ServerOptions options_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::mutex responses_mutex_;
  std::condition_variable responses_closed_;
  int64_t open_responses_ = 0;
  int64_t started_ = 0;  // unix time, for /v1/models
};

}  // namespace dsv4::server
